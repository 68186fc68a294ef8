"""What a run leaves in its folder besides the TensorBoard events, read and written without torch (a sweep reads
runs with this alone), and what a run is: the flags it was asked for.

runs/<run>/
    events.out.tfevents.*   TensorBoard scalars (CleanRL's tags)
    args.json               the flags the run is trained with, the script's defaults, what its command line gave, each
                            resume
    .lock                   held by the process that writes the run, while it lives
    summary.json            how it ended: status, steps, wall time, SPS (over every segment), last-20 return, layout
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
# run made with other values of them; every other flag is part of what the run's results are of, --total-timesteps
# included where a schedule spans the run (SCHEDULED; see `other_length`).
TOLERATED = frozenset({"checkpoint_interval", "num_workers", "step_timeout", "max_restarts", "num_threads", "cuda",
                       "backend", "device_ids", "track", "wandb_project_name", "wandb_entity", "capture_video",
                       "save_model", "eval_episodes", "eval_checkpoint", "resume"})  # fmt: skip


def flag(name: str) -> str:
    """The command-line spelling of an Args field: num_envs -> --num-envs."""
    return "--" + name.replace("_", "-")


def differing(flags: dict[str, Any], other: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """{field: (its value in flags, in other)} for each flag of `flags` that changes results (neither TOLERATED nor
    total_timesteps) and has another value in `other`."""
    return {name: (value, other.get(name)) for name, value in flags.items()
            if name not in TOLERATED and name != "total_timesteps" and other.get(name) != value}  # fmt: skip


# Flags that make a run learn by a schedule over its --total-timesteps: with one on, a run of another length is
# another run (--anneal-lr: the learning rate falls to 0 at the run's last step).
SCHEDULED = ("anneal_lr",)


def scheduled(flags: dict[str, Any]) -> bool:
    """Whether a run of these flags learns by a schedule over its --total-timesteps (a SCHEDULED flag is on)."""
    return any(flags.get(name) for name in SCHEDULED)


def ends_at(total: int, saved: dict[str, Any]) -> int:
    """The step a run of args.json `saved`'s iteration size ends at when asked for `total` steps (whole iterations;
    `total` itself for a record that does not give the size)."""
    steps = saved.get("steps_per_iteration")
    return total // steps * steps if steps else total


def other_length(total: int, saved: dict[str, Any], reached: int) -> str | None:
    """Why the run of args.json `saved`, at step `reached`, is not the run of `total` steps that its other flags make
    it (None: it is, once resumed to `total`), said as its --total-timesteps: with a SCHEDULED flag on, it was made for
    another number of iterations, or a resume changed that number; else it is past the steps asked."""
    trained = saved.get("total_timesteps")
    if trained is None:
        return "not recorded"
    if scheduled(saved):
        stretched = [change for resume in saved.get("resumes", [])
                     if (change := resume.get("changed", {}).get("total_timesteps"))
                     and ends_at(change[0], saved) != ends_at(change[1], saved)]  # fmt: skip
        if stretched:
            return f"{stretched[0][0]} made {stretched[0][1]} by a resume (--anneal-lr's schedule changed midway)"
        if ends_at(trained, saved) == ends_at(total, saved):
            return None
        return f"{trained} (--anneal-lr: the learning rate falls over all of them)"
    return f"{trained} (at step {reached})" if reached > ends_at(total, saved) else None


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


def write_atomically(path: Path, data: bytes | memoryview) -> None:
    """Writes data to path so that a reader sees the old file or the new one, never a part: a temp file beside it,
    flushed to disk, renamed over it. On failure the temp file is removed and path is as it was (OSError raised)."""
    tmp = path.with_name(f"{path.name}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Writes data as JSON, atomically (write_atomically)."""
    write_atomically(Path(path), (json.dumps(data, indent=1, default=str) + "\n").encode())


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
