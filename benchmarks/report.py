"""What both benchmarks share: where results go, the machine they came from, and writing them out."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"
CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
MACHINE = f"{platform.processor() or platform.machine()}, {CORES} cores, Python {platform.python_version()}"


def commit(checkout: Path) -> str:
    """The short hash of `checkout`'s HEAD, the commit a report's figures were measured at."""
    git = ["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"]
    return subprocess.run(git, capture_output=True, text=True).stdout.strip()


def save(stem: str, lines: list[str], data: dict):
    """Writes results/{stem}.md and .json (compact: one line), prints the table; returns
    matplotlib.pyplot for the plot, or None."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{stem}.md").write_text("\n".join(lines) + "\n")
    (RESULTS / f"{stem}.json").write_text(json.dumps({"machine": MACHINE, **data}, separators=(",", ":")) + "\n")
    print("\n".join(lines))
    return pyplot()


def smoothed(steps, values, window: int, points: int = 300) -> tuple[list[int], list[float]]:
    """The `window`-point running mean of values against steps, at most `points` of it evenly spread
    (the last kept), values to 4 significant digits: what a plot draws, and what results/*.json keep
    of a curve."""
    values = np.asarray(values, dtype=np.float64)
    if len(values) >= window:
        values = np.convolve(values, np.ones(window) / window, mode="valid")
    steps = np.asarray(steps)[len(steps) - len(values) :]
    keep = np.unique(np.linspace(0, len(values) - 1, min(points, len(values))).round().astype(int))
    return steps[keep].tolist(), [float(f"{v:.4g}") for v in values[keep]]


def save_png(fig_or_path, path: Path | None = None) -> Path:
    """Saves a matplotlib figure as path (or takes the PNG already at path) and keeps it small: 64
    colours, optimized (a third of the size, the same look), as results/ should be."""
    from PIL import Image

    if path is None:
        path = Path(fig_or_path)
    else:
        fig_or_path.savefig(path, dpi=100)
    Image.open(path).convert("RGB").quantize(colors=64, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)
    return path


def pyplot():
    """matplotlib.pyplot drawing to files, or None (with a hint) when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot (pip install -e '.[bench]')")
        return None
    return plt


def venv_python(venv: Path, *installs: list[str]) -> tuple[str, list[str] | None]:
    """The python of a peer's own venv, and its pip command when the venv was just made (torch
    first: the CPU build on this disk, so that no pin pulls a CUDA build), with each list of
    `installs` installed in order; (python, None) when it was there already."""
    python = venv / "bin" / "python"
    if python.exists():
        return str(python), None
    print(f"making {venv} (once)", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(python), "-m", "pip", "install", "-q"]
    for packages in (["torch==2.13.0"], *installs):
        subprocess.run([*pip, *packages], check=True)
    return str(python), pip
