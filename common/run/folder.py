"""The run folder and what a run says while it trains: runs/<env>__<exp_name>__<seed>__<time>/, made and held by one
writer, its args.json, the TensorBoard writer, the start-up line and the progress line."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import fcntl
import os
import sys
import time
from pathlib import Path
from typing import Any

from common.run import records
from common.run.errors import FlagError, RunError
from common.run.flags import given_fields


def make_run_dir(args: Any, root: str = "runs", steps_per_iteration: int | None = None) -> Path:
    """Creates runs/{env_id}__{exp_name}__{seed}__{unix time}, with -2, -3, ... appended if that exists already, holds
    it (`hold`) and writes the flags into it (args.json); RunError in one line if the folder cannot be made here."""
    base = f"{args.env_id.replace('/', '-').replace(':', '-')}__{args.exp_name}__{args.seed}__{int(time.time())}"
    try:
        Path(root).mkdir(exist_ok=True)
        for k in range(1, 1_000_000):
            path = Path(root) / (base if k == 1 else f"{base}-{k}")
            with contextlib.suppress(FileExistsError):
                path.mkdir()  # atomic: two runs starting in the same second never share a folder
                hold(path)
                write_args(path, args, steps_per_iteration=steps_per_iteration)
                return path
    except OSError as exc:  # read-only, full, or `runs` is a file
        why = "a file of that name is in the way" if os.path.isfile(root) else exc.strerror
        raise RunError(f"cannot make the run folder in {os.path.abspath(root)} ({why}); run from a folder you can "
                       "write to") from None  # fmt: skip
    raise RunError(f"no free run folder name under {root}/{base}")


_held: list[int] = []  # the lock of the run folder this process writes: held until the process ends, however


def hold(run_dir: Path) -> None:
    """Makes this process the one writer of run_dir: an exclusive lock on run_dir/.lock, which the kernel releases
    however the process ends. FlagError naming the process that holds it already (nothing is started)."""
    fd = os.open(run_dir / records.LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise FlagError(f"{run_dir} is being written by process {records.writer(run_dir)}: a run has one writer at "
                        "a time; wait for it to end, or stop it") from None  # fmt: skip
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    _held.append(fd)


def run_folder(args: Any, checkpoint: dict | None = None, steps_per_iteration: int | None = None) -> Path:
    """The run's folder: a new one (make_run_dir), or with --resume the checkpoint's, held (`hold`), its args.json
    rewritten with this resume recorded."""
    if args.resume is None:
        return make_run_dir(args, steps_per_iteration=steps_per_iteration)
    run_dir = Path(args.resume).parent
    hold(run_dir)
    try:
        write_args(run_dir, args, checkpoint, steps_per_iteration)
    except OSError as exc:
        raise RunError(f"cannot write into {run_dir} ({exc.strerror}): a resumed run goes on in its folder") from None
    return run_dir


def write_args(run_dir: Path, args: Any, resumed: dict | None = None, steps_per_iteration: int | None = None) -> None:
    """args.json: the flags the run is trained with (the same on every resume but TOLERATED ones and
    --total-timesteps; as they took effect: ppo_vec.py's norm_obs is false for Discrete actions), the script's
    defaults, the fields its first command line gave (with the defaults, what the run was asked for: its identity,
    records.asked), the steps of one iteration (all ranks'), and each resume: when, from which iteration and step, and
    which flags it changed."""
    path = run_dir / "args.json"
    flags = dataclasses.asdict(args)
    record = {"script": Path(sys.argv[0]).name, **flags, "defaults": dataclasses.asdict(type(args)()),
              "given": sorted(given_fields(type(args))), "steps_per_iteration": steps_per_iteration,
              "resumes": []}  # fmt: skip
    if resumed is not None:
        earlier = records.read_json(path) or {}
        record["given"] = earlier.get("given", record["given"])  # what the run was started with
        changed = {name: [earlier.get(name), value] for name, value in flags.items()
                   if name != "resume" and name in earlier and earlier[name] != value}  # fmt: skip
        record["resumes"] = [*earlier.get("resumes", []), {
            "at": time.strftime("%Y-%m-%d %H:%M:%S"), "from_iteration": resumed["iteration"],
            "from_step": resumed["global_step"], "changed": changed}]  # fmt: skip
    records.write_json(path, record)


class _NoWriter:
    """What ranks other than 0 log to: nothing."""

    def add_scalar(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __enter__(self) -> _NoWriter:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        pass


def open_writer(run_dir: Path | None, args: Any, first_step: int = 0) -> Any:
    """TensorBoard writer for run_dir with the hyperparameter table (mirrored to wandb with --track); a writer of
    nothing for run_dir None (ranks other than 0). A resumed run's curve continues from `first_step`, without the
    points its stopped part logged after its checkpoint."""
    purge_step = first_step + 1 if args.resume else None
    if run_dir is None:
        return _NoWriter()
    if args.track:
        import wandb

        config = dataclasses.asdict(args)
        wandb.init(project=args.wandb_project_name, entity=args.wandb_entity, sync_tensorboard=True, config=config,
                   name=run_dir.name, monitor_gym=True, save_code=True)  # fmt: skip
    from torch.utils.tensorboard import SummaryWriter

    # max_queue: with the default of 10 pending events, add_scalar waits for the writer thread whenever it fills
    writer = SummaryWriter(str(run_dir), max_queue=1000, purge_step=purge_step)
    table = "\n".join(f"|{key}|{value}|" for key, value in vars(args).items())
    writer.add_text("hyperparameters", f"|param|value|\n|-|-|\n{table}")
    return writer


def announce(what: str, run_dir: Path, resumed: dict | None = None) -> None:
    """The start-up line, after the script's name: what runs where, where its results go, and where a resumed
    run goes on from."""
    if resumed is not None:
        what += f"; resuming from iteration {resumed['iteration']} (step {resumed['global_step']})"
    print(f"{Path(sys.argv[0]).name}: {what}; results in {run_dir}", flush=True)


def hms(seconds: float) -> str:
    """Seconds as h:mm:ss."""
    seconds = int(max(seconds, 0))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class Progress:
    """Steps per second since the first step, the console progress line (at most every `every` seconds, and always
    for the last iteration), and the figures a run's summary and closing line give. `last_step`: the global step the
    run ends at (whole iterations: --total-timesteps rounded down to a multiple of the batch)."""

    def __init__(self, last_step: int, first_step: int = 0, every: float = 2.0, speaks: bool = True,
                 resumed: dict | None = None, earlier: dict | None = None):  # fmt: skip
        self.last_step, self.first_step, self.every, self.speaks = last_step, first_step, every, speaks
        self.global_step = first_step
        self.recent_returns = collections.deque((resumed or {}).get("recent_returns", []), maxlen=20)  # a checkpoint's
        self.start = self.last_print = time.time()
        # the run's earlier segments (a resumed run: its summary.json), for figures over the whole run
        self.earlier_seconds = (earlier or {}).get("seconds", 0.0)
        self.segments = earlier.get("segments", 1) + 1 if earlier else 1

    def sps(self, global_step: int) -> int:
        """Env steps per second since the first step of this process."""
        return int((global_step - self.first_step) / max(time.time() - self.start, 1e-9))

    def mean_return(self) -> float | None:
        return sum(self.recent_returns) / len(self.recent_returns) if self.recent_returns else None

    def line(self, global_step: int, timings: dict[str, float]) -> str:
        """global_step, SPS, mean recent return, elapsed time and ETA (h:mm:ss), where the iteration's time went."""
        sps, mean_return = self.sps(global_step), self.mean_return()
        shown = "n/a" if mean_return is None else f"{mean_return:.1f}"
        eta = (self.last_step - global_step) / max(sps, 1)
        split = ", ".join(f"{name} {seconds:.2f}s" for name, seconds in timings.items())
        return (
            f"global_step={global_step}/{self.last_step} SPS={sps} episodic_return={shown} "
            f"(last {len(self.recent_returns)}) elapsed={hms(time.time() - self.start)} ETA={hms(eta)} [{split}]"
        )

    def log(self, writer: Any, global_step: int, episodes: list, timings: dict[str, float], restarts: int) -> None:
        """Logs charts/episodic_return and charts/episodic_length of each finished episode (global step, return,
        length), charts/SPS, perf/{part}_seconds and charts/worker_restarts (every rank's), and prints the progress
        line (mean of the last 20 returns) if `every` seconds have passed since the last one, or at the last step."""
        self.global_step = global_step
        for step, episodic_return, episodic_length in episodes:
            self.recent_returns.append(float(episodic_return))
            writer.add_scalar("charts/episodic_return", episodic_return, step)
            writer.add_scalar("charts/episodic_length", episodic_length, step)
        writer.add_scalar("charts/SPS", self.sps(global_step), global_step)
        for name, seconds in timings.items():
            writer.add_scalar(f"perf/{name}_seconds", seconds, global_step)
        writer.add_scalar("charts/worker_restarts", restarts, global_step)
        if self.speaks and (time.time() - self.last_print >= self.every or global_step >= self.last_step):
            self.last_print = time.time()
            print(self.line(global_step, timings), flush=True)

    def figures(self) -> dict[str, Any]:
        """What a summary and the closing line say, over all the run's segments (it was resumed segments - 1 times):
        steps, wall time, SPS, the last-20 return."""
        seconds = self.earlier_seconds + time.time() - self.start
        done = self.global_step - (0 if self.earlier_seconds else self.first_step)  # steps of the time counted
        return {
            "global_step": self.global_step,
            "last_step": self.last_step,
            "seconds": round(seconds, 1),
            "sps": int(done / max(seconds, 1e-9)),
            "segments": self.segments,
            "episodic_return_last_20": self.mean_return(),
            "episodes_in_that_mean": len(self.recent_returns),
        }
