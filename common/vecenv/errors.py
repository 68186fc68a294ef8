"""What a SubprocVecEnv raises: when its envs fail (and which failure when several fail at once), and
for arguments that cannot work."""

import math
import multiprocessing as mp
import traceback
from collections.abc import Sequence
from typing import Any

import numpy as np


class WorkerError(RuntimeError):
    """An env in a worker process raised, or a worker died; the message says which and why."""

    def __init__(self, message: str, env_indices: Sequence[int], command: str, exitcode: int | None = None):
        super().__init__(message)
        self.env_indices, self.command, self.exitcode = tuple(env_indices), command, exitcode


class WorkerTimeout(TimeoutError, mp.TimeoutError):
    """Workers did not answer within the bound (both TimeoutErrors, as gymnasium's vector envs
    raise). After step_wait or reset_wait the call stays pending: waiting again takes the answer, if it comes."""

    def __init__(self, message: str, env_indices: Sequence[int], command: str):
        super().__init__(message)
        self.env_indices, self.command = tuple(env_indices), command


def first_failure(failures: dict[int, Exception]) -> Exception:
    """A WorkerError (it ends the vec env) before a timeout, then the lowest env index, naming the others:
    never whoever answered first."""
    ordered = sorted(failures.values(), key=lambda error: (not isinstance(error, WorkerError), error.env_indices))
    error = ordered[0]
    if len(ordered) > 1:
        error.args = (f"{error.args[0]}\n(envs {[i for e in ordered[1:] for i in e.env_indices]} failed too)",)
    return error


def error_report(index: int, command: str, exc: BaseException) -> tuple:
    """What a worker sends when env `index` raised: (index, command, summary, traceback)."""
    try:
        summary = f"{type(exc).__qualname__}: {exc}"
    except Exception:  # noqa: BLE001 - an exception whose __str__ fails still gets reported
        summary = type(exc).__qualname__
    return index, command, summary, "".join(traceback.format_exception(exc))


def remote_error(report: tuple, where: str) -> WorkerError:
    """The WorkerError of an error_report, raised `where` (a worker and its pid, or here)."""
    index, command, summary, remote_tb = report
    message = f"env {index} raised {summary} during '{command}' ({where}).\nWorker traceback:\n{remote_tb}"
    return WorkerError(message, [index], command)


def check_arguments(env_fns, num_workers, context, max_restarts, worker_spin, seconds) -> None:
    """ValueError for any argument of SubprocVecEnv that cannot work, naming it."""
    if not env_fns or not all(callable(fn) for fn in env_fns):
        raise ValueError("env_fns must be a non-empty sequence of zero-argument callables that build an env")
    if num_workers is not None and (not isinstance(num_workers, int) or num_workers < 0):
        raise ValueError(f"num_workers must be an int >= 0 (0: in this process) or None, got {num_workers!r}")
    if context is not None and context not in mp.get_all_start_methods():
        raise ValueError(f"context must be one of {mp.get_all_start_methods()}, got {context!r}")
    if max_restarts < 0:
        raise ValueError(f"max_restarts must be >= 0, got {max_restarts}")
    if worker_spin is not None and not 0 <= worker_spin < math.inf:
        raise ValueError(f"worker_spin must be >= 0 seconds (or None), got {worker_spin}")
    for name, value in seconds.items():
        if value is not None and not 0 < value < math.inf:
            raise ValueError(f"{name} must be a finite number of seconds > 0, got {value}")
    check_layout(num_workers, seconds["step_timeout"], max_restarts)


def check_layout(num_workers: int | None, step_timeout: float | None, max_restarts: int, spell=str) -> None:
    """ValueError when num_workers=0 comes with step_timeout or max_restarts (`spell`: a script's flag names)."""
    if num_workers == 0 and (step_timeout is not None or max_restarts):
        raise ValueError(
            f"{spell('num_workers')} 0 steps the envs in this process, where a step can be neither bounded "
            f"nor restarted: drop {spell('step_timeout')} and {spell('max_restarts')}, or give "
            f"{spell('num_workers')} >= 1"
        )


def check_spaces(spaces: list[tuple], expected: tuple, first: int = 0) -> None:
    """RuntimeError unless every env's (observation space, action space) is `expected` (env 0's)."""
    for i, (obs_space, act_space) in enumerate(spaces, start=first):
        if (obs_space, act_space) != expected:
            raise RuntimeError(
                f"env {i} has observation space {obs_space} and action space {act_space}, but env 0 has "
                f"{expected[0]} and {expected[1]}; all envs must match"
            )


def check_reset_mask(mask: Any, n: int) -> np.ndarray:
    """options["reset_mask"], checked as gymnasium's vector envs check it."""
    if not isinstance(mask, np.ndarray):
        raise TypeError(f"`options['reset_mask']` must be a numpy array, got {type(mask)}")
    if mask.shape != (n,):
        raise ValueError(f"`options['reset_mask']` must have shape `({n},)`, got {mask.shape}")
    if mask.dtype != np.bool_:
        raise TypeError(f"`options['reset_mask']` must have `dtype=np.bool_`, got {mask.dtype}")
    if not mask.any():
        raise ValueError(f"`options['reset_mask']` must select at least one env, got reset_mask={mask}")
    return mask
