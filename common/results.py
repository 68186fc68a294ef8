"""What a run leaves in its folder besides the TensorBoard events, and reading runs back.

runs/<run>/
    events.out.tfevents.*   TensorBoard scalars (CleanRL's tags)
    args.json               the flags the run was started (or last resumed) with
    summary.json            how it ended: status, steps, wall time, SPS, last-20 return; updated at each checkpoint
    checkpoint.pt           the last checkpoint: periodic, final, or written by a stop or an env failure
    curve.png               episodic return against global step (matplotlib)
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Writes data as JSON, atomically: a reader sees the old file or the new one, never a part."""
    tmp = path.with_name(f"{path.name}.tmp")
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, default=str)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON file's contents, or None if it is missing or unreadable."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def read_scalars(run_dir: Path | str, wall_time: bool = False) -> dict[str, list[tuple]]:
    """Every scalar TensorBoard logged under `run_dir`: tag -> [(step, value), ...], or (step, value, wall time)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    events.Reload()
    return {
        tag: [(e.step, e.value, e.wall_time) if wall_time else (e.step, e.value) for e in events.Scalars(tag)]
        for tag in events.Tags()["scalars"]
    }


def plot_curve(run_dir: Path, title: str) -> Path | None:
    """curve.png in run_dir: every episode's raw return against global step, and the mean of the last 20 (None if no
    episode ended)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    points = read_scalars(run_dir).get("charts/episodic_return", [])
    if not points:
        return None
    steps, returns = (np.array(values) for values in zip(*points, strict=True))
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, returns, ".", ms=2, alpha=0.3, label="episode")
    if len(returns) >= 20:
        mean = np.convolve(returns, np.ones(20) / 20, mode="valid")
        ax.plot(steps[19:], mean, lw=1.5, label="mean of the last 20")
    ax.set(title=title, xlabel="global step", ylabel="episodic return (raw)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = run_dir / "curve.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
