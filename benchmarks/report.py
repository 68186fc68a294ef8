"""What both benchmarks share: where results go, the machine they came from, and writing them out."""

from __future__ import annotations

import json
import os
import platform
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
