"""The shared-memory block of a SubprocVecEnv: a row per env of rewards, flags, actions and obs,
which each worker writes in place. Observations that are not one array travel pickled instead."""

import os
import tempfile
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.spaces import Box, Discrete, MultiBinary, MultiDiscrete

ARRAY_SPACES = (Box, Discrete, MultiDiscrete, MultiBinary)  # a value is one fixed-shape array


def layout(n: int, obs_space: gym.Space, act_space: gym.Space, shared_memory: bool) -> tuple[list, int, bool, bool]:
    """The block for n envs: (name, offset, shape, dtype) of each array, 64-byte aligned so that
    workers never share a cache line; its size; whether observations and actions live there."""
    fields = [("rewards", (n,), np.float64), ("terminations", (n,), np.bool_), ("truncations", (n,), np.bool_)]
    actions_in, obs_in = (isinstance(act_space, ARRAY_SPACES), shared_memory and isinstance(obs_space, ARRAY_SPACES))
    fields.append(("actions", (n, *act_space.shape) if actions_in else (0,), act_space.dtype or np.uint8))
    fields.append(("obs", (n, *obs_space.shape) if obs_in else (0,), obs_space.dtype if obs_in else np.uint8))
    offsets, offset = [], 0
    for name, shape, dtype in fields:
        offsets.append((name, offset, shape, np.dtype(dtype).str))
        offset += -(-int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize // 64) * 64
    return offsets, max(offset, 64), obs_in, actions_in


def views(buffer: Any, offsets: list[tuple]) -> dict[str, np.ndarray]:
    return {name: np.ndarray(shape, dtype, buffer=buffer, offset=offset) for name, offset, shape, dtype in offsets}


def anonymous_file(size: int) -> int:
    """A file descriptor of `size` zero bytes that no path names: nothing leaks if we crash."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("subprocvecenv")
    else:
        fd, path = tempfile.mkstemp(prefix="subprocvecenv-")
        os.unlink(path)
    os.ftruncate(fd, size)
    return fd
