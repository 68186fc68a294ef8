"""What both benchmarks share: where results go, the machine they came from, and writing them out."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
MACHINE = f"{platform.processor() or platform.machine()}, {CORES} cores, Python {platform.python_version()}"


def save(stem: str, lines: list[str], data: dict):
    """Writes results/{stem}.md and .json, prints the table; returns matplotlib.pyplot for the plot, or None."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{stem}.md").write_text("\n".join(lines) + "\n")
    (RESULTS / f"{stem}.json").write_text(json.dumps({"machine": MACHINE, **data}, indent=1))
    print("\n".join(lines))
    return pyplot()


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
    """The python of a peer's own venv, and its pip command when the venv was just made (torch first: the CPU build
    on this disk, so that no pin pulls a CUDA build), with each list of `installs` installed in order; (python, None)
    when it was there already."""
    python = venv / "bin" / "python"
    if python.exists():
        return str(python), None
    print(f"making {venv} (once)", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(python), "-m", "pip", "install", "-q"]
    for packages in (["torch==2.13.0"], *installs):
        subprocess.run([*pip, *packages], check=True)
    return str(python), pip
