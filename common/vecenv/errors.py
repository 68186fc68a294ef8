"""What a SubprocVecEnv raises when its envs fail: WorkerError (an env raised, or a worker died) and
WorkerTimeout (workers silent past the bound), each naming the envs, the command and why; and the
rule that picks the one to raise when several fail at once."""

from __future__ import annotations

import multiprocessing as mp
import traceback
from collections.abc import Sequence


class WorkerError(RuntimeError):
    """An env in a worker process raised, or a worker process died. The message says which, where
    and why."""

    def __init__(self, message: str, env_indices: Sequence[int], command: str, exitcode: int | None = None):
        super().__init__(message)
        self.env_indices, self.command, self.exitcode = tuple(env_indices), command, exitcode


class WorkerTimeout(TimeoutError, mp.TimeoutError):
    """Workers did not answer within the bound (both TimeoutErrors, as gymnasium's vector envs
    raise). The call stays pending: waiting again takes the answer, if it comes."""

    def __init__(self, message: str, env_indices: Sequence[int], command: str):
        super().__init__(message)
        self.env_indices, self.command = tuple(env_indices), command


def first_failure(failures: dict[int, Exception]) -> Exception:
    """The failure of the lowest env index, naming the envs that failed too: what is raised does not
    depend on who answered first."""
    ordered = sorted(failures.values(), key=lambda error: error.env_indices)
    error = ordered[0]
    if len(ordered) > 1:
        error.args = (f"{error.args[0]}\n(envs {[i for e in ordered[1:] for i in e.env_indices]} failed too)",)
    return error


def error_report(index: int, command: str, exc: BaseException) -> tuple:
    """What a worker sends when env `index` raised during `command`: (index, command, summary,
    traceback)."""
    try:
        summary = f"{type(exc).__qualname__}: {exc}"
    except Exception:  # noqa: BLE001 - an exception whose __str__ fails still gets reported
        summary = type(exc).__qualname__
    return index, command, summary, "".join(traceback.format_exception(exc))


def remote_error(report: tuple, where: str) -> WorkerError:
    """The WorkerError of an error_report, raised `where` (a worker and its pid, or this
    process)."""
    index, command, summary, remote_tb = report
    message = f"env {index} raised {summary} during '{command}' ({where}).\nWorker traceback:\n{remote_tb}"
    return WorkerError(message, [index], command)
