"""From each env's results to the vector env's: its batched spaces, made when first asked for, and its infos."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector.utils import batch_space


class BatchedSpace:
    """A vector env's batched space, made from the single one when first asked for (a 50 MB image space batches into
    GBs, and a training loop never asks)."""

    def __init__(self, single: str):
        self.single = single

    def __set_name__(self, owner: type, name: str) -> None:
        self.attribute = f"_{name}"

    def __get__(self, env: Any, owner: type | None = None) -> Any:
        if env is None:
            return self
        if getattr(env, self.attribute, None) is None:
            setattr(env, self.attribute, batch_space(getattr(env, self.single), env.num_envs))
        return getattr(env, self.attribute)

    def __set__(self, env: Any, space: gym.Space) -> None:
        setattr(env, self.attribute, space)


def add_info(vector_infos: dict[str, Any], env_info: dict[str, Any], env_num: int, n: int) -> dict[str, Any]:
    """One env's info merged into the infos of n envs: gymnasium's VectorEnv._add_info (the same arrays, dtypes,
    masks and key order; tested against it), without its new mask array per key and call: Atari envs send three info
    keys per env and step, merged here while the workers wait."""
    for key, value in env_info.items():
        array = vector_infos.get(key)
        if key == "final_obs":
            if array is None:
                array = np.full(n, fill_value=None, dtype=object)
            array[env_num] = value
        elif isinstance(value, dict):
            array = add_info({} if array is None else array, value, env_num, n)
        else:
            if array is None:
                if type(value) in (int, float, bool) or issubclass(type(value), np.number):
                    array = np.zeros(n, dtype=type(value))
                elif isinstance(value, np.ndarray):
                    array = np.zeros((n, *value.shape), dtype=value.dtype)
                else:
                    array = np.full(n, fill_value=None, dtype=object)
            array[env_num] = value
        mask = vector_infos.get(f"_{key}")
        if mask is None:
            mask = np.zeros(n, dtype=np.bool_)
        mask[env_num] = True
        vector_infos[key], vector_infos[f"_{key}"] = array, mask
    return vector_infos
