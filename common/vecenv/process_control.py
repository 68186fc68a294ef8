"""Processes around a SubprocVecEnv: the start method and what its forkserver preloads, the lifeline
workers watch, ending a worker with the helpers its envs started, and saying how a process ended."""

import contextlib
import multiprocessing as mp
import os
import re
import signal
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# What ends a job: Ctrl-C, a scheduler's SIGTERM and warnings (Slurm's --signal, submitit's USR2), a
# closed terminal, a CPU-time limit: each a stop request for the trainer, ignored by what we start.
STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGXCPU}

# Loaded once in the forkserver when the trainer has them, so that workers fork with them instead of
# importing them anew (CPython's forkserver never preloads the main script by itself)
FORKSERVER_PRELOAD = ("torch", "torch.utils.tensorboard", "tyro", "gymnasium", "ale_py", "cv2", "numpy", "cloudpickle")


def default_context() -> str:
    # forkserver: fast starts without fork's hazards (threads, CUDA or locks held by the parent)
    return "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"


def start_context(context: str) -> Any:
    """The multiprocessing context, its helper processes started with the stop signals held back:
    a scheduler signals every process of a job, and a forkserver it killed would fail a restart."""
    from multiprocessing import forkserver, resource_tracker

    ctx = mp.get_context(context)
    with stop_signals_blocked():
        resource_tracker.ensure_running()  # it unblocks SIGINT and SIGTERM here once it has started
    if context == "forkserver":
        ctx.set_forkserver_preload(["__main__", *(m for m in FORKSERVER_PRELOAD if m in sys.modules)])
        with stop_signals_blocked():
            forkserver.ensure_running()
    return ctx


@contextlib.contextmanager
def stop_signals_blocked() -> Iterator[None]:
    """Stop signals held back in this thread and the processes it starts, until they ignore them."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def ignore_stop_signals() -> None:
    """Stop signals ignored from now on: in a process the vec env starts (stopping is the trainer's), or at exit."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def cores() -> int:
    """The CPU cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


_lifelines: dict[int, tuple[socket.socket, socket.socket]] = {}


def lifeline() -> tuple[socket.socket, socket.socket]:
    """This process's lifeline: it holds one end open until it dies; workers watch the other."""
    if os.getpid() not in _lifelines:
        _lifelines.clear()  # a forked child's copy belongs to its parent
        _lifelines[os.getpid()] = socket.socketpair()
    return _lifelines[os.getpid()]


def end_processes(procs: list, grace: float) -> None:
    """Waits up to `grace` s for the processes to exit, then SIGKILLs them and their groups."""
    deadline = time.monotonic() + grace
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))
    for proc in procs:
        if proc.exitcode is None:
            proc.kill()
    for proc in procs:
        proc.join(2.0)
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)


def describe_exit(exitcode: int | None) -> str:
    if exitcode is None:
        return "closed its pipe without exiting"
    if exitcode < 0:
        name = signal.Signals(-exitcode).name if -exitcode in signal.valid_signals() else f"signal {-exitcode}"
        return f"was killed by {name} (exit code {exitcode})"
    return f"exited with code {exitcode}"


def unguarded_main() -> str:
    """Why workers started by forkserver or spawn would fail: a main script without `if __name__ == "__main__":`
    ('' if it has one, or there is no script)."""
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    try:
        guarded = re.search(r"^\s*if\b.*(__name__.*__main__|__main__.*__name__)", Path(path).read_text(), re.M)
    except (OSError, TypeError):
        return ""
    if guarded:
        return ""
    return (
        f'{path} has no `if __name__ == "__main__":` and worker processes start by importing it: put the code '
        "that builds the envs under that line, or give context='fork' (docs/vecenv.md)"
    )


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}es" if noun.endswith("s") else f"{count} {noun}s"
