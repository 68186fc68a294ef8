"""What SubprocVecEnv is given, checked before anything starts: ValueError or TypeError naming the argument."""

from __future__ import annotations

import math
import multiprocessing as mp
from typing import Any

import numpy as np


def check_layout(num_workers: int | None, step_timeout: float | None, max_restarts: int, spell=str) -> None:
    """ValueError when num_workers=0 (every env in this process) comes with step_timeout or max_restarts, which need
    workers. `spell` writes a parameter's name (a script passes its flag spelling)."""
    if num_workers == 0 and (step_timeout is not None or max_restarts):
        raise ValueError(f"{spell('num_workers')} 0 steps the envs in this process, where a step can be neither "
                         f"bounded nor restarted: drop {spell('step_timeout')} and {spell('max_restarts')}, or give "
                         f"{spell('num_workers')} >= 1")  # fmt: skip


def check_arguments(env_fns, num_workers, envs_per_worker, context, max_restarts, worker_spin, seconds) -> None:
    """ValueError for any argument of SubprocVecEnv that cannot work, naming it."""
    if not env_fns or not all(callable(fn) for fn in env_fns):
        raise ValueError("env_fns must be a non-empty sequence of zero-argument callables that build an env")
    if num_workers is not None and (not isinstance(num_workers, int) or num_workers < 0):
        raise ValueError(f"num_workers must be an int >= 0 (0: in this process) or None, got {num_workers!r}")
    if envs_per_worker is not None and (not isinstance(envs_per_worker, int) or envs_per_worker < 1):
        raise ValueError(f"envs_per_worker must be a positive int (or None), got {envs_per_worker!r}")
    if num_workers is not None and envs_per_worker is not None:
        raise ValueError("give num_workers or envs_per_worker, not both")
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
