"""What a run leaves in its folder besides the TensorBoard events, and reading runs back.

runs/<run>/
    events.out.tfevents.*   TensorBoard scalars (CleanRL's tags)
    args.json               the flags the run is trained with, the script's defaults, and each resume
    .lock                   held by the process that writes the run, while it lives
    summary.json            how it ended: status, steps, wall time, SPS, last-20 return; updated at each checkpoint
    checkpoint.pt           the last checkpoint: periodic, final, or written by a stop or an env failure
    curve.png               episodic return against global step (matplotlib)
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path
from typing import Any

LOCK = ".lock"  # in a run folder: locked by the one process that writes the run, its pid inside
END_WITH_PARENT = "PPO_VEC_END_WITH_PARENT"  # "1": the run stops (and saves) when the process that started it dies

# Flags that change nothing a run learns. A run may go on with other values of them (--resume), and a sweep reuses a
# run made with other values of them; every other flag is part of what the run's results are of, except
# --total-timesteps, which may grow (a resumed or re-swept run is extended in its folder).
TOLERATED = frozenset({"checkpoint_interval", "num_workers", "step_timeout", "max_restarts", "num_threads", "cuda",
                       "backend", "device_ids", "track", "wandb_project_name", "wandb_entity", "capture_video",
                       "save_model", "eval_episodes", "eval_checkpoint", "resume"})  # fmt: skip


def differing(flags: dict[str, Any], other: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """{field: (its value in flags, in other)} for each flag of `flags` that changes results (neither TOLERATED nor
    total_timesteps) and has another value in `other`."""
    return {name: (value, other.get(name)) for name, value in flags.items()
            if name not in TOLERATED and name != "total_timesteps" and other.get(name) != value}  # fmt: skip


def asked(saved: dict[str, Any]) -> dict[str, Any]:
    """What a run was asked for, from its args.json: the script's defaults and the flags its command line gave (a
    flag's effect, such as norm_obs off for Discrete actions, is not what was asked)."""
    return {**saved.get("defaults", {}), **{name: saved[name] for name in saved.get("given", []) if name in saved}}


def writer(run_dir: Path) -> int | None:
    """The pid of the live process that writes run_dir (it holds run_dir/.lock), or None: how a run still running
    is told from one that ended, whatever its summary.json says."""
    try:
        fd = os.open(Path(run_dir) / LOCK, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return None
    except BlockingIOError:
        return int(os.read(fd, 32).split()[0] or 0) or -1
    finally:
        os.close(fd)


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
    # Nothing to draw is found before importing tensorboard and matplotlib (a second): a run stopped early ends sooner
    points = read_scalars(run_dir).get("charts/episodic_return", []) if any(run_dir.glob("events.*")) else []
    if not points:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

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


# ------------------------------------------------------------------------------------------- several runs, compared
def episodes(run_dir: Path | str) -> tuple[Any, Any, Any]:
    """A run's episodes as arrays: global step, raw return, and seconds since the run's first logged point."""
    import numpy as np

    scalars = read_scalars(run_dir, wall_time=True)
    points = scalars.get("charts/episodic_return", [])
    start = min((p[2] for values in scalars.values() for p in values), default=0.0)
    steps, returns, wall = (np.array(v, dtype=np.float64) for v in zip(*points, strict=True)) if points else ([],) * 3
    return np.asarray(steps), np.asarray(returns), np.asarray(wall) - start


def final_return(run_dir: Path | str, last: int = 20) -> float:
    """The mean raw return of a run's last `last` episodes (NaN if it has none)."""
    import numpy as np

    returns = episodes(run_dir)[1]
    return float(np.mean(returns[-last:])) if len(returns) else float("nan")


def aggregate(values: list[float], confidence: float = 0.95, resamples: int = 10_000) -> dict[str, float]:
    """Mean, standard deviation and interquartile mean (IQM: the mean of the middle half) over runs, with a percentile
    bootstrap confidence interval of the IQM over the runs (scipy.stats.bootstrap, a fixed random generator)."""
    import numpy as np
    from scipy import stats

    x = np.asarray(values, dtype=np.float64)
    x = x[np.isfinite(x)]
    out = {"runs": len(x), "mean": float(np.mean(x)), "std": float(np.std(x, ddof=1)) if len(x) > 1 else 0.0}
    out["iqm"] = float(stats.trim_mean(x, 0.25))
    if len(x) > 1 and np.ptp(x) > 0:
        result = stats.bootstrap(
            (x,),
            lambda a, axis: stats.trim_mean(a, 0.25, axis=axis),
            n_resamples=resamples,
            confidence_level=confidence,
            method="percentile",
            rng=np.random.default_rng(0),
        )
        out["iqm_low"], out["iqm_high"] = float(result.confidence_interval.low), float(result.confidence_interval.high)
    else:  # one run, or all alike: nothing to resample
        out["iqm_low"] = out["iqm_high"] = out["iqm"]
    return out


def markdown_table(rows: dict[str, dict[str, float]], reference: dict[str, str] | None = None) -> list[str]:
    """A markdown table of `aggregate` figures, one row per label (and a column of reference figures, if given)."""
    head = "| case | runs | mean +- std | IQM [95% CI] |" + (" reference |" if reference else "")
    lines = [head, "|---" * (head.count("|") - 1) + "|"]
    for label, a in rows.items():
        iqm = f"{a['iqm']:.1f} [{a['iqm_low']:.1f}, {a['iqm_high']:.1f}]"
        row = f"| {label} | {a['runs']} | {a['mean']:.1f} +- {a['std']:.1f} | {iqm} |"
        lines.append(row + (f" {reference.get(label, '-')} |" if reference else ""))
    return lines


def curve_band(runs: list[Path | str], x: str = "step", points: int = 100, window: int = 20):
    """The runs' learning curves on one grid: each run's mean return of its last `window` episodes at each grid point
    (global step, or wall-clock seconds with x="wall"), then the mean over runs and its 95% bootstrap interval."""
    import numpy as np
    from scipy import stats

    curves = []
    for run in runs:
        steps, returns, wall = episodes(run)
        where = steps if x == "step" else wall
        if len(returns) >= window:
            smooth = np.convolve(returns, np.ones(window) / window, mode="valid")
            curves.append((where[window - 1 :], smooth))
    if not curves:
        return None
    end = min(where[-1] for where, _ in curves)
    grid = np.linspace(max(where[0] for where, _ in curves), end, points)
    values = np.stack([np.interp(grid, where, smooth) for where, smooth in curves])
    mean = values.mean(0)
    if len(values) > 1:
        ci = stats.bootstrap((values,), np.mean, axis=0, confidence_level=0.95, n_resamples=2000, method="percentile",
                             rng=np.random.default_rng(0)).confidence_interval  # fmt: skip
        low, high = np.where(np.isfinite(ci.low), ci.low, mean), np.where(np.isfinite(ci.high), ci.high, mean)
    else:
        low = high = mean
    return grid, mean, low, high


def plot_groups(groups: dict[str, list[Path | str]], path: Path, title: str) -> Path:
    """One PNG with two panels, return against global step and against wall-clock time: per group, the mean over its
    runs and the 95% bootstrap band (curve_band)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    for ax, x, label in zip(axes, ("step", "wall"), ("global step", "wall-clock seconds"), strict=True):
        for name, runs in groups.items():
            band = curve_band(runs, x)
            if band is None:
                continue
            grid, mean, low, high = band
            (line,) = ax.plot(grid, mean, lw=1.5, label=f"{name}: mean of {len(runs)} runs, 95% bootstrap band")
            ax.fill_between(grid, low, high, color=line.get_color(), alpha=0.2)
        ax.set(xlabel=label, ylabel="episodic return (mean of the last 20)", title=title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
