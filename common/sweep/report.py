"""A sweep's report: per env, the runs that finished with the flags asked, their figures over seeds
(mean +- std, IQM with a bootstrap interval) and curves; the runs not averaged, named with why."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from ..run import records
from ..run.flags import TOLERATED, flag
from .runs import Run, asked_of, ends_at, lock_holder, number, read_args


def judge(run: Run) -> tuple[Path | None, str | None]:
    """The run's folder, and why it cannot be averaged (None if it can): missing, running,
    unfinished, unreadable, or without a finished episode."""
    folder, made = run.folder(), run.folders()
    sweep = lock_holder(Path(run.cwd, "runs", "sweep", f"{run.key}.lock"))
    if sweep is not None and sweep != os.getpid():
        return folder, f"being run by another sweep (process {sweep})"
    if folder is None:
        return None, f"missing; {run.unlike(made[-1])}" if made else "missing"
    if lock_holder(folder / records.LOCK) is not None:
        return folder, f"still running ({folder.name})"
    summary = records.read_json(folder / "summary.json") or {}
    step, saved = number(summary.get("global_step")), read_args(folder / "args.json") or {}
    last = ends_at(number(run.asked(saved).get("total_timesteps")), saved) or math.inf
    if summary.get("status") != "done" or step < last:
        status = summary.get("status", "no summary")
        return folder, f"unfinished: {status} at {100 * step / last:.0f}% ({folder.name})"
    try:
        logged = max((s for s, _ in read_scalars(folder).get("losses/value_loss", [])), default=0)
        finished = math.isfinite(final_return(folder))
    except Exception as exc:  # noqa: BLE001 - a damaged events file, whatever its damage
        return folder, f"unreadable: {type(exc).__name__} ({folder.name})"
    if logged < step:
        return folder, f"unreadable: its events end at step {logged}, its summary at {step} ({folder.name})"
    return folder, None if finished else f"no episode finished ({folder.name})"


def report(runs: list[Run], out: Path, reference: dict[str, str] | None = None) -> list[str]:
    """DIR/report.md and DIR/<env>.png for the runs that finished with the flags asked (`judge` says
    which); the others are named, not averaged."""
    out.mkdir(parents=True, exist_ok=True)
    rows, columns, notes, averaged = {}, {}, [], {}
    for env_id in dict.fromkeys(run.env_id for run in runs):
        judged = [(run, *judge(run)) for run in runs if run.env_id == env_id]
        notes += [f"- {run.label}: {why}" for run, _, why in judged if why is not None]
        finished = [(run, folder) for run, folder, why in judged if why is None]
        if not finished:
            continue
        averaged[env_id] = [folder for _, folder in finished]
        saved = records.read_json(finished[0][1] / "args.json") or {}
        summaries = [records.read_json(folder / "summary.json") or {} for folder in averaged[env_id]]
        steps = sorted({summary["global_step"] for summary in summaries})
        flags = {
            name: value
            for name, value in asked_of(saved).items()
            if name not in ("env_id", "seed", "exp_name", *TOLERATED) and value != saved.get("defaults", {}).get(name)
        }
        seeds_run = ", ".join(str(run.seed) for run, _ in finished)
        columns[env_id] = (
            f" {seeds_run} | {'-'.join(map(str, dict.fromkeys([steps[0], steps[-1]])))} | "
            + (" ".join(f"{flag(name)} {value}" for name, value in flags.items()) or "defaults")
            + " |"
        )
        rows[env_id] = aggregate([final_return(folder) for folder in averaged[env_id]])
    lines = [
        f"Runs of {Path(runs[0].script).name} (--exp-name {runs[0].exp_name}), last-20 raw return "
        "of each run; "
        "mean +- std over seeds, IQM with a 95% percentile bootstrap interval. Only runs "
        "that finished "
        "with the flags asked are averaged.",
        "",
    ]
    head, rule, *body = markdown_table(rows, reference)
    lines += [head + " seeds | steps | flags (the others: the script's defaults) |", rule + "---|---|---|"]
    lines += [row + columns[env_id] for env_id, row in zip(rows, body, strict=True)]
    if notes:
        lines += ["", "Not averaged:", *notes]
    for env_id, folders in averaged.items():
        png = plot_groups({env_id: folders}, out / f"{env_id.replace('/', '-').replace(':', '-')}.png", env_id)
        lines += ["", f"![{env_id}]({png.name})"]
    (out / "report.md").write_text("\n".join(lines) + "\n")
    return lines


def read_scalars(run_dir: Path | str, wall_time: bool = False) -> dict[str, list[tuple]]:
    """Every scalar TensorBoard logged under `run_dir`: tag -> [(step, value), ...], or (step,
    value, wall time)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    events.Reload()
    return {
        tag: [(e.step, e.value, e.wall_time) if wall_time else (e.step, e.value) for e in events.Scalars(tag)]
        for tag in events.Tags()["scalars"]
    }


# -------------------------------------------------------------------------------------------
# several runs, compared
def episodes(run_dir: Path | str) -> tuple[Any, Any, Any]:
    """A run's episodes as arrays: global step, raw return, and seconds since the run's first logged
    point."""
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
    """Mean, standard deviation and interquartile mean (IQM: the mean of the middle half) over runs,
    with a percentile bootstrap confidence interval of the IQM over the runs (a fixed generator)."""
    import numpy as np

    x = np.asarray(values, dtype=np.float64)
    x = x[np.isfinite(x)]
    out = {"runs": len(x), "mean": float(np.mean(x)), "std": float(np.std(x, ddof=1)) if len(x) > 1 else 0.0}
    out["iqm"] = float(iqm(x))
    low, high = bootstrap(x, iqm, resamples, confidence)  # (one run, or all alike: the IQM itself)
    out["iqm_low"], out["iqm_high"] = float(low), float(high)
    return out


def iqm(x: Any, axis: int = 0) -> Any:
    """The interquartile mean along `axis`: the mean of what is left once a quarter is cut at
    each end."""
    import numpy as np

    n = x.shape[axis]
    return np.take(np.sort(x, axis=axis), range(n // 4, n - n // 4), axis=axis).mean(axis=axis)


def bootstrap(x: Any, statistic: Any, resamples: int, confidence: float = 0.95) -> tuple[Any, Any]:
    """The percentile bootstrap interval of statistic(sample, axis=0), samples drawn from the
    rows of x."""
    import numpy as np

    draws = statistic(x[np.random.default_rng(0).integers(0, len(x), (resamples, len(x)))], axis=1)
    return np.quantile(draws, (1 - confidence) / 2, axis=0), np.quantile(draws, (1 + confidence) / 2, axis=0)


def markdown_table(rows: dict[str, dict[str, float]], reference: dict[str, str] | None = None) -> list[str]:
    """A markdown table of `aggregate` figures, one row per label (and a column of reference
    figures, if given)."""
    head = "| case | runs | mean +- std | IQM [95% CI] |" + (" reference |" if reference else "")
    lines = [head, "|---" * (head.count("|") - 1) + "|"]
    for label, a in rows.items():
        iqm = f"{a['iqm']:.1f} [{a['iqm_low']:.1f}, {a['iqm_high']:.1f}]"
        row = f"| {label} | {a['runs']} | {a['mean']:.1f} +- {a['std']:.1f} | {iqm} |"
        lines.append(row + (f" {reference.get(label, '-')} |" if reference else ""))
    return lines


def curve_band(runs: list[Path | str], x: str = "step", points: int = 100, window: int = 20):
    """The runs' learning curves on one grid: each run's mean return of its last `window` episodes
    at each grid point (global step, or wall-clock seconds with x="wall"), then the mean over runs
    and its 95% bootstrap interval."""
    import numpy as np

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
    low, high = bootstrap(values, np.mean, 2000)
    return grid, mean, low, high


def plot_groups(groups: dict[str, list[Path | str]], path: Path, title: str) -> Path:
    """One PNG with two panels, return against global step and against wall-clock time: per group,
    the mean over its runs and the 95% bootstrap band (curve_band)."""
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
