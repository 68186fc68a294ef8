"""The shared-memory block of a SubprocVecEnv: one row per env of rewards, flags, actions and observation, which each
worker maps and writes in place, so that a step moves no observation over a pipe. Observations of nested Dict/Tuple
spaces live there leaf by leaf; spaces that cannot (Text, Graph, ...) travel pickled instead."""

from __future__ import annotations

import os
import tempfile
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.spaces import Box, Dict, Discrete, MultiBinary, MultiDiscrete, Tuple

BASE_SPACES = (Box, Discrete, MultiDiscrete, MultiBinary)  # spaces whose values are one fixed-shape array


def leaves(space: gym.Space, strict: bool = True) -> list[gym.Space]:
    """The array-valued spaces of a (nested Dict/Tuple) space, in a fixed order; TypeError for any other (none, not
    strict)."""
    if isinstance(space, BASE_SPACES):
        return [space]
    if isinstance(space, (Dict, Tuple)):
        subspaces = space.spaces.values() if isinstance(space, Dict) else space.spaces
        return [leaf for sub in subspaces for leaf in leaves(sub, strict)]
    if strict:
        raise TypeError(f"{type(space).__name__} cannot live in shared memory")
    return []


def flatten(space: gym.Space, value: Any) -> list[Any]:
    """One observation as its list of leaves, in `leaves` order."""
    if isinstance(space, Dict):
        return [leaf for key, sub in space.spaces.items() for leaf in flatten(sub, value[key])]
    if isinstance(space, Tuple):
        return [leaf for sub, item in zip(space.spaces, value, strict=True) for leaf in flatten(sub, item)]
    return [value]


def unflatten(space: gym.Space, values: Any) -> Any:
    """Inverse of `flatten` over an iterator of leaves."""
    if isinstance(space, Dict):
        return {key: unflatten(sub, values) for key, sub in space.spaces.items()}
    if isinstance(space, Tuple):
        return tuple(unflatten(sub, values) for sub in space.spaces)
    return next(values)


def block_fields(n: int, obs_space: gym.Space, act_space: gym.Space, shared_memory: bool) -> tuple[list, bool, bool]:
    """The arrays of the block for n envs, (name, shape, dtype) each, and whether observations and actions live there.
    The observation's leaves are obs0, obs1, ..."""
    fields = [("rewards", (n,), np.float64), ("terminations", (n,), np.bool_), ("truncations", (n,), np.bool_)]
    actions_in = isinstance(act_space, BASE_SPACES)
    fields.append(("actions", (n, *act_space.shape) if actions_in else (0,), act_space.dtype or np.uint8))
    try:
        obs_leaves = leaves(obs_space) if shared_memory else []
    except TypeError:
        obs_leaves = []
    fields += [(f"obs{j}", (n, *leaf.shape), leaf.dtype) for j, leaf in enumerate(obs_leaves)]
    return fields, bool(obs_leaves), actions_in


def layout(fields: list[tuple[str, tuple[int, ...], Any]]) -> tuple[list[tuple], int]:
    """Offsets of the arrays in one block, each 64-byte aligned so that workers never share a cache line."""
    placed, offset = [], 0
    for name, shape, dtype in fields:
        placed.append((name, offset, shape, np.dtype(dtype).str))
        offset += -(-int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize // 64) * 64
    return placed, max(offset, 64)


def views(buffer: Any, placed: list[tuple]) -> dict[str, np.ndarray]:
    return {name: np.ndarray(shape, dtype, buffer=buffer, offset=offset) for name, offset, shape, dtype in placed}


def anonymous_file(size: int) -> int:
    """A file descriptor of `size` zero bytes that no path names: nothing to leak, even if we crash."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("subprocvecenv")
    else:
        fd, path = tempfile.mkstemp(prefix="subprocvecenv-")
        os.unlink(path)
    os.ftruncate(fd, size)
    return fd
