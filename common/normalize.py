"""gymnasium's NormalizeObservation and NormalizeReward (to the bit), for a batch of envs at once in the trainer:
torch modules only to keep their statistics in checkpoints, computing in numpy on views of those buffers
(updated in place: load_state_dict copies into them)."""

import numpy as np
import torch
import torch.nn as nn


class ObsNormalizer(nn.Module):
    """gymnasium's NormalizeObservation and a clip to +-10, with one running mean and variance for
    all envs (with a set per env, one state meant other inputs in each, and Hopper-v5 learned half
    as well: docs/benchmarks.md). `enabled` False: observations pass as they are (the statistics
    stay in checkpoints alike)."""

    def __init__(self, obs_dim: int, enabled: bool):
        super().__init__()
        self.enabled = enabled
        for name, value in [("mean", 0.0), ("var", 1.0), ("count", 1e-4)]:
            shape = () if name == "count" else (obs_dim,)
            self.register_buffer(name, torch.full(shape, value, dtype=torch.float64))
        self.arrays = [buffer.numpy() for buffer in self.buffers()]

    def forward(self, obs: np.ndarray, update: bool = True) -> np.ndarray:
        """Normalizes a batch of observations.

        Args:
            obs: a batch of observations, (n, obs_dim).
            update: add them to the running statistics first (False: evaluation, bootstrap values).

        Returns:
            (obs - mean) / sqrt(var + 1e-8) clipped to +-10, float32; obs itself when not `enabled`."""
        mean, var, count = self.arrays
        if self.enabled and update:  # RunningMeanStd.update with a batch of observations
            delta, n = obs.mean(0) - mean, len(obs)
            total = count + n
            var[:] = (var * count + obs.var(0) * n + delta**2 * count * n / total) / total
            mean[:] = mean + delta * n / total
            count[...] = total
        return np.clip((obs - mean) / np.sqrt(var + 1e-8), -10, 10, dtype=np.float32) if self.enabled else obs


class RewardScaler(nn.Module):
    """gymnasium's NormalizeReward and a clip to +-10: each env's numbers (its own discounted
    return's running variance), computed for all envs at once (a wrapper in each env cost 3x as
    much)."""

    def __init__(self, num_envs: int, gamma: float):
        super().__init__()
        self.gamma = gamma
        for name, value in [("returns", 0.0), ("mean", 0.0), ("var", 1.0), ("count", 1e-4)]:
            self.register_buffer(name, torch.full((num_envs,), value, dtype=torch.float64))
        self.arrays = [buffer.numpy() for buffer in self.buffers()]

    def forward(self, rewards: np.ndarray, terminations: np.ndarray, envs: slice = slice(None)) -> np.ndarray:
        """Scales one step's rewards, each env's by its discounted return's running std, updated first.

        Args:
            rewards: the rewards of the envs `envs`.
            terminations: their terminations (a termination ends an env's discounted return).
            envs: which envs of the num_envs they are (all by default).

        Returns:
            rewards / sqrt(var + 1e-8), clipped to +-10."""
        returns, mean, var, count = (array[envs] for array in self.arrays)
        returns[:] = returns * self.gamma * ~terminations + rewards
        delta, total = returns - mean, count + 1  # RunningMeanStd.update with one sample per env
        var[:] = (var * count + delta**2 * count / total) / total
        mean[:] = mean + delta / total
        count[:] = total
        return np.clip(rewards / np.sqrt(var + 1e-8), -10, 10)
