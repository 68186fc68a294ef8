"""Processes around a SubprocVecEnv: the start method and what its forkserver preloads, the lifeline workers watch,
ending a worker with the helpers its envs started, and saying how a process ended."""

from __future__ import annotations

import ast
import contextlib
import multiprocessing as mp
import os
import signal
import socket
import sys
import time
from collections.abc import Iterator
from typing import Any

STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}

# Imported once in the forkserver when the trainer has them, so that workers fork with them loaded. Workers re-run
# the main script on start (spawn semantics), and CPython's forkserver never preloads it (it looks for a
# "main_path" key that get_preparation_data does not set): a script importing torch cost every worker seconds.
FORKSERVER_PRELOAD = ("torch", "torch.utils.tensorboard", "tyro", "gymnasium", "ale_py", "cv2", "numpy", "cloudpickle")


def default_context() -> str:
    # forkserver: fast starts without fork's hazards (threads, CUDA or locks held by the parent).
    return "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"


def get_context(context: str) -> Any:
    """multiprocessing's context for `context`; a forkserver preloads the main script and the heavy modules the
    trainer has loaded (only takes effect before this process's forkserver first starts)."""
    ctx = mp.get_context(context)
    if context == "forkserver":
        ctx.set_forkserver_preload(["__main__", *(m for m in FORKSERVER_PRELOAD if m in sys.modules)])
    return ctx


def start_helpers(context: str) -> None:
    """Starts what multiprocessing needs to start workers, before the first one: its resource tracker (which ignores
    SIGINT and SIGTERM itself) and, for forkserver, the forkserver, with both signals held back for good (it never
    lets them through; the workers it forks ignore them): a scheduler signals every process of a job, and a forkserver
    it killed would fail the next worker restart."""
    from multiprocessing import forkserver, resource_tracker

    resource_tracker.ensure_running()  # (it unblocks both signals in the calling thread once it has started)
    if context == "forkserver":
        with stop_signals_blocked():
            forkserver.ensure_running()


@contextlib.contextmanager
def stop_signals_blocked() -> Iterator[None]:
    """SIGINT and SIGTERM held back in this thread for the block, and in any process it starts until that process
    ignores them (`ignore_stop_signals`): a scheduler signals every process of a job, and stopping is the trainer's."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def ignore_stop_signals() -> None:
    """What a process the vec env starts does first: SIGINT and SIGTERM ignored (and no longer held back)."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def check_main_guard(context: str, depth: int = 2) -> None:
    """RuntimeError, before any worker starts, when the top-level code of the main script builds a SubprocVecEnv
    outside `if __name__ == "__main__":` under a start method whose workers import the main script again (spawn,
    forkserver): each worker would run that code too and fail in a tangle of tracebacks. `depth`: frames up to the
    caller."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if context == "fork" or path is None or getattr(mp.current_process(), "_inheriting", False):
        return
    frame = sys._getframe(depth)
    while frame is not None and not (frame.f_code.co_name == "<module>" and frame.f_globals is vars(main)):
        frame = frame.f_back
    if frame is None:  # not the main script's top-level code
        return
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return
    line = frame.f_lineno
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_main_test(node.test):
            if node.body[0].lineno <= line <= node.body[-1].end_lineno:
                return
    raise RuntimeError(
        f"{os.path.basename(path)}, line {line}: this top-level code builds a SubprocVecEnv, and every worker process "
        f"imports {os.path.basename(path)} again under the {context!r} start method, so each would build one too. Put "
        f'that code under `if __name__ == "__main__":` (or pass context="fork")'
    )


def _is_main_test(test: ast.expr) -> bool:
    """True for `__name__ == "__main__"` (either way round)."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    return any(isinstance(x, ast.Name) and x.id == "__name__" for x in sides) and any(
        isinstance(x, ast.Constant) and x.value == "__main__" for x in sides
    )


def cores() -> int:
    """The CPU cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


_lifelines: dict[int, tuple[socket.socket, socket.socket]] = {}


def lifeline() -> tuple[socket.socket, socket.socket]:
    """This process's lifeline, made once: it keeps the first end open until it dies; workers watch the second."""
    if os.getpid() not in _lifelines:
        _lifelines.clear()  # a forked child's copy belongs to its parent
        _lifelines[os.getpid()] = socket.socketpair()
    return _lifelines[os.getpid()]


def kill_group(pid: int) -> None:
    """SIGKILL to the process group `pid` leads: the helper processes a worker's envs started."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, OSError):
        pass


def end_processes(procs: list, grace: float) -> None:
    """Waits up to `grace` seconds for each process to exit, SIGKILLs what is left, then the process group each one
    leads (the helpers its envs started). Returns once they are gone (each join bounded)."""
    deadline = time.monotonic() + grace
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))
    for proc in procs:
        if proc.exitcode is None:
            proc.kill()
    for proc in procs:
        proc.join(2.0)
        kill_group(proc.pid)


def describe_exit(exitcode: int | None) -> str:
    if exitcode is None:
        return "closed its pipe without exiting"
    if exitcode < 0:
        try:
            return f"was killed by {signal.Signals(-exitcode).name} (exit code {exitcode})"
        except ValueError:
            return f"was killed by signal {-exitcode} (exit code {exitcode})"
    return f"exited with code {exitcode}"


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}es" if noun.endswith("s") else f"{count} {noun}s"
