"""How a run starts and ends, written once for both scripts: the run it is (new, or the one --resume names), the
stop request's safe points, and the one place a run ends, however it ends (saving on a stop or an env failure, then
its summary, curve and closing line), and `run`, which parses the flags and turns the outcome into an exit status.

    def main(args):
        ...                                                    # flags checked: FlagError, exit 2, nothing started
        checkpoint, start_iteration, run_dir, progress = lifecycle.begin(...)
        with SubprocVecEnv(...) as envs, lifecycle.ending(...) as run, folder.open_writer(run_dir, args) as writer:
            ...                                                # run.stop_if_asked() at safe points, run.snapshot()
                                                               # each iteration, run.save() to save
    if __name__ == "__main__":
        lifecycle.run(main, Args, __doc__)

Exit statuses of `run`: 0 done; 1 a failure during the run (one message, no traceback; every failing rank says its
own); 2 a bad flag, before anything started; 128 + signal (130 SIGINT, 143 SIGTERM) when stopped, after saving.
Anything else is a bug, and keeps its traceback. Every run that started training ends with one closing line: how it
ended, steps, wall time, SPS, last-20 return, and where its results are.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from common.multiprocessing_env import WorkerError
from common.run import guardian, records, stops
from common.run.errors import Finished, FlagError, RunError
from common.run.flags import check_bool_values
from common.run.folder import Progress, hms, run_folder
from common.run.ranks import lost_rank, max_over_ranks
from common.run.stops import Stopped


def begin(checkpoints: Any, args: Any, num_iterations: int, is_main: bool = True) -> tuple:
    """A new run, or the one --resume names (its flags: checkpointing.trained_flags): (the checkpoint resumed from,
    its modules loaded, or None; the first iteration to do; the run folder, None on ranks other than 0; the Progress
    counter)."""
    checkpoint = checkpoints.resume(args.resume, num_iterations) if args.resume else None
    start_iteration = checkpoint["iteration"] + 1 if checkpoint else 1
    steps = checkpoints.steps_per_iteration
    if checkpoint and is_main:
        _say_if_the_schedule_changes(args, checkpoint["args"], start_iteration, num_iterations, steps)
    run_dir = run_folder(args, checkpoint, steps) if is_main else None
    earlier = (records.read_json(run_dir / "summary.json") or {}) if checkpoint and run_dir else {}
    progress = Progress(num_iterations * steps, (start_iteration - 1) * steps, speaks=is_main, resumed=checkpoint,
                        earlier=earlier)  # fmt: skip
    return checkpoint, start_iteration, run_dir, progress


def _say_if_the_schedule_changes(args: Any, before: dict, start_iteration: int, num_iterations: int,
                                 steps: int) -> None:  # fmt: skip
    """A line when a resume's --total-timesteps moves the end of a schedule that spans the run (--anneal-lr): the run
    goes on, but it is no longer the run a fresh start of either length makes (a sweep reuses it for neither).
    `before`: the flags of the checkpoint resumed from; `steps`: the steps of one iteration."""
    planned = before.get("total_timesteps", args.total_timesteps) // steps
    if planned == num_iterations or not records.scheduled(vars(args)):
        return
    share = 1.0 - (start_iteration - 1.0) / num_iterations
    print(
        f"{Path(sys.argv[0]).name}: --total-timesteps {args.total_timesteps} moves the end of --anneal-lr's schedule "
        f"(made for {before['total_timesteps']} steps): the learning rate goes on from {share:.2f} x "
        f"--learning-rate down to 0 at step {num_iterations * steps}",
        flush=True,
    )


_closing: list[tuple[str, bool]] = []  # the closing line `ending` composed, and whether it goes to stderr


class Run:
    """What `ending` gives the loop: snapshots of its state after each iteration, saving the last one as checkpoint.pt
    with summary.json (rank 0 alone writes; other ranks' calls do nothing), and the stop request's safe points."""

    def __init__(self, script: str, run_dir: Path | None, checkpoints: Any, progress: Progress):
        self.script, self.run_dir, self.checkpoints, self.progress = script, run_dir, checkpoints, progress
        self.checkpoint = None if run_dir is None else run_dir / "checkpoint.pt"
        self.layout: str | None = None  # where the envs step, and why (SubprocVecEnv.layout): in summary.json

    def stop_requested(self) -> bool:
        """True once this process was asked to stop (SIGINT or SIGTERM): the rollout ends early."""
        return stops.request.signum is not None

    def stop_if_asked(self) -> None:
        """Stopped if this process was asked to stop, or, under torchrun, any rank was (one small all-reduce: every
        rank calls it at the same point, so every rank stops there and none waits in a collective for one that
        left)."""
        signum = max_over_ranks(stops.request.signum or 0)
        if signum:
            raise Stopped(signum)

    @staticmethod
    def periodic(iteration: int, interval: int) -> bool:
        """True for an iteration --checkpoint-interval `interval` saves after (0: none)."""
        return bool(interval) and iteration % interval == 0

    def snapshot(self, done: int, rng: list, **extras: Any) -> None:
        """The state after `done` iterations, kept for any save until the next snapshot (Checkpoints.snapshot)."""
        self.checkpoints.snapshot(done, rng, recent_returns=list(self.progress.recent_returns), **extras)

    def save(self, status: str = "running", **state: Any) -> Path | None:
        """Writes the last snapshot to checkpoint.pt (with `state`, e.g. env_states) and summary.json."""
        if self.checkpoint is None:
            return None
        self.checkpoints.save(self.checkpoint, **state)
        self.summarize(status)
        return self.checkpoint

    def save_model(self, exp_name: str) -> str:
        """--save-model: the last snapshot as runs/<run>/<exp_name>.cleanrl_model (CleanRL's name); its path."""
        path = self.checkpoints.save(self.run_dir / f"{exp_name}.cleanrl_model")
        print(f"model saved to {path}", flush=True)
        return str(path)

    def summarize(self, status: str) -> dict[str, Any]:
        on_disk = self.checkpoint.exists()
        summary = {"script": self.script, "status": status, **self.progress.figures(),
                   "checkpoint": str(self.checkpoint) if on_disk else None,
                   "checkpoint_iteration": self.checkpoints.iteration_in(self.checkpoint) if on_disk else None,
                   "layout": self.layout}  # fmt: skip
        records.write_json(self.run_dir / "summary.json", summary)
        return summary


@contextlib.contextmanager
def ending(script: str, run_dir: Path | None, checkpoints: Any, progress: Progress, layout: str | None = None
           ) -> Iterator[Run]:  # fmt: skip
    """The one place a run ends, however it ends. Stopped (at a safe point, after SIGINT/SIGTERM), an env failure or a
    lost rank: the last snapshot is saved, unless checkpoint.pt holds it already (an env failure first waits up to a
    second for a stop: a scheduler signals every process of a job, and the env's helper it killed may make the env
    fail a moment before the trainer's own signal arrives). Then, on rank 0 (run_dir not None): summary.json,
    curve.png and the closing line, which `run` prints last. Put it before the writer in the `with`, so the events are
    flushed when the curve is drawn. Saving waits on no env worker. `layout`: where the envs step (summary.json)."""
    run, status = Run(script, run_dir, checkpoints, progress), "failed"
    run.layout = layout
    try:
        yield run
        status = "done"
    except Stopped as exc:
        status = f"stopped by {exc}"
        _save_on_the_way_out(run)
        raise
    except (WorkerError, TimeoutError, RuntimeError) as exc:
        if isinstance(exc, RuntimeError) and not isinstance(exc, WorkerError) and not lost_rank(exc):
            raise  # a bug, or a RunError of the script's own (NaN weights): nothing to save
        stopped = stops.request.wait(1.0)
        status = f"stopped by {signal.Signals(stops.request.signum).name}" if stopped else "failed"
        _save_on_the_way_out(run)
        if stopped:
            raise Stopped(stops.request.signum) from None
        raise
    finally:
        if run_dir is not None:
            _close_run(run, status)


def _save_on_the_way_out(run: Run) -> None:
    if run.checkpoints.last is None or run.checkpoint is None or run.checkpoints.written(run.checkpoint):
        return
    try:
        run.save("saving")
    except RunError as exc:  # a full disk: said in one line, the previous checkpoint kept
        print(f"{run.script}: error: {exc}", file=sys.stderr, flush=True)


def _close_run(run: Run, status: str) -> None:
    """summary.json, curve.png, and the closing line for `run` to print."""
    summary = run.summarize(status)
    try:
        records.plot_curve(run.run_dir, f"{run.script}: {run.run_dir.name}")
    except Exception as exc:  # noqa: BLE001 - a plot must never hide how the run ended
        print(f"{run.script}: no curve.png ({type(exc).__name__}: {exc})", file=sys.stderr, flush=True)
    steps = f"{summary['global_step']} of {summary['last_step']} steps"
    mean = summary["episodic_return_last_20"]
    figures = (f"{steps} in {hms(summary['seconds'])} ({summary['sps']} SPS), last-20 return "
               f"{'n/a' if mean is None else f'{mean:.1f}'}")  # fmt: skip
    where = f"results in {run.run_dir} (tensorboard --logdir {run.run_dir.parent})"
    if summary["checkpoint"] and status != "done":
        where += f"; continue with: {command(resume=True)} --resume {summary['checkpoint']}"
    elif summary["checkpoint"]:
        where += f"; evaluate with: {command()} --eval-checkpoint {summary['checkpoint']}"
    _closing.append((f"{run.script}: {status}: {figures}; {where}", status != "done"))


def command(resume: bool = False) -> str:
    """How to run this script again from here: its path as it was typed (a copied script, another folder), under
    torchrun for a job of several ranks that goes on (`resume`)."""
    path = sys.argv[0]
    if resume and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return f"torchrun <the same torchrun options> {path}"
    return f"python {path}"


def _end_with_launcher() -> None:
    """Under torchrun, or a launcher that sets END_WITH_PARENT (a sweep): SIGTERM to this run when its launcher dies
    (SIGKILL included), so the run stops through the normal path (and saves) instead of training on alone. Linux
    only."""
    launched = "TORCHELASTIC_RUN_ID" in os.environ or os.environ.get(records.END_WITH_PARENT) == "1"
    if not launched or not sys.platform.startswith("linux"):
        return
    import ctypes

    PR_SET_PDEATHSIG = 1
    parent = os.getppid()
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:  # it died before we asked
        os.kill(os.getpid(), signal.SIGTERM)


def _runtime_dir_for_video() -> None:
    """A private XDG_RUNTIME_DIR where none is set, before any worker starts: the video stack (SDL) otherwise prints
    "error: XDG_RUNTIME_DIR is invalid" at every env, though nothing is wrong. Removed at exit."""
    current = os.environ.get("XDG_RUNTIME_DIR", "")
    if current and os.path.isdir(current) and os.access(current, os.W_OK):
        return
    import atexit
    import shutil
    import tempfile

    os.environ["XDG_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="ppo-vec-runtime-")  # mode 0700, as SDL asks
    atexit.register(shutil.rmtree, os.environ["XDG_RUNTIME_DIR"], ignore_errors=True)


def run(main: Callable[[Any], None], args_type: type, doc: str) -> None:
    """Parses args_type from the command line (--help opens with the first two paragraphs of `doc`: description and
    commands), runs main(args) with SIGINT and SIGTERM as stop requests (common/run/stops.py), and exits with the status
    the outcome calls for, after the closing line. Under torchrun every rank exits so; every rank that fails prints
    its own reason, with its rank; a stop is said by rank 0 alone."""
    import tyro

    script = Path(sys.argv[0]).name
    rank, world_size = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    me = f"{script}: rank {rank}" if world_size > 1 else script

    def fail(status: int, message: str) -> None:
        print(f"{me}: {message}", file=sys.stderr, flush=True)
        close(status)

    def close(status: int) -> None:
        for line, to_stderr in _closing:
            print(line, file=sys.stderr if to_stderr else sys.stdout, flush=True)
        guardian.look_now()
        stops.request.ignore()  # the run is over: a launcher's forwarded signal must not end the exit itself
        sys.exit(status)

    stops.request.install()
    _end_with_launcher()
    guardian.watch_this_process()
    try:
        check_bool_values(args_type, sys.argv[1:])
        args = tyro.cli(args_type, description="\n\n".join(doc.split("\n\n")[:2]))
        if getattr(args, "capture_video", False):
            _runtime_dir_for_video()
        main(args)
    except Finished as exc:
        if rank == 0:
            print(f"{script}: {exc}", flush=True)
    except FlagError as exc:
        fail(2, f"error: {exc}")
    except Stopped as exc:
        if rank == 0 and not _closing:  # stopped before training started: nothing else to say
            print(f"{script}: stopped by {exc}", file=sys.stderr, flush=True)
        close(128 + exc.signum)
    except (RunError, WorkerError, TimeoutError, FloatingPointError) as exc:
        fail(1, f"error: {exc}")
    except Exception as exc:  # noqa: BLE001 - a lost rank is one line; anything else is a bug, with its traceback
        if not lost_rank(exc):
            traceback.print_exc()
            close(1)
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        fail(1, f"error: lost contact with another rank ({reason}); that rank's own message says why")
    close(0)
