"""How SubprocVecEnv chooses between stepping the envs in the calling process and in worker processes.

A process round trip costs more than a cheap env step: on 2 cores, 8 CartPoles step faster in the calling process
than in workers. With num_workers=None it times one env step (in a probe env built here), then a step of num_envs
stand-in envs that take as long, in this process and in one worker per core, and takes workers only if they are at
least 10% faster.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.spaces import Box, Discrete

from common.processes import plural


class StandInEnv(gym.Env):
    """An env that keeps the CPU busy for `seconds` per step and ends an episode every `length` steps with `info`:
    what a layout is timed with, in place of the real envs (which must not be stepped before the user resets them)."""

    observation_space = Box(-1.0, 1.0, (1,), np.float32)
    action_space = Discrete(2)

    def __init__(self, seconds: float = 0.0, length: float = math.inf, info: dict | None = None, offset: int = 0):
        self.seconds, self.length, self.info, self.t = seconds, length, info or {}, offset

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        return np.zeros(1, np.float32), {}

    def step(self, action):
        end = time.perf_counter() + self.seconds
        while time.perf_counter() < end:
            pass
        self.t += 1
        done = self.t % self.length < 1
        return np.zeros(1, np.float32), 0.0, done, False, self.info if done else {}


def measure_layout(n: int, step: float, length: float, info: dict, **layout: Any) -> float:
    """Median seconds of one step of `n` stand-in envs like the probe (`step` seconds, episodes of `length` steps
    ending with `info`) in the given layout, from about 0.2 s of stepping: commands, wake-ups, replies and infos
    included, and how well workers really run side by side here, which is not always as well as there are cores."""
    from common.multiprocessing_env import SubprocVecEnv

    env_fns = [functools.partial(StandInEnv, step, round(length) if length < math.inf else math.inf, info, i * 7)
               for i in range(n)]  # fmt: skip
    with SubprocVecEnv(env_fns, **layout) as envs:
        envs.reset(seed=0)
        actions, samples, start = np.zeros(n, np.int64), [], time.perf_counter()
        while len(samples) < 200 and (len(samples) < 10 or time.perf_counter() - start < 0.2):
            tick = time.perf_counter()
            envs.step(actions)
            samples.append(time.perf_counter() - tick)
    return float(np.median(samples[len(samples) // 4 :]))  # the first steps wake processes that were just started


def measure_step(env_fn: Callable[[], gym.Env]) -> tuple[float, float, dict]:
    """Mean seconds of one env step (resets included, with random actions), steps per episode, and the info of an
    episode's end, from a probe env built here."""
    env = env_fn()
    try:
        env.action_space.seed(0)
        actions = [env.action_space.sample() for _ in range(200)]
        env.reset(seed=0)
        steps, ends, final_info, start = 0, 0, {}, time.perf_counter()
        while steps < len(actions) and (steps < 10 or time.perf_counter() - start < 0.02):
            _, _, terminated, truncated, info = env.step(actions[steps])
            if terminated or truncated:
                ends, final_info = ends + 1, info
                env.reset()
            steps += 1
        return (time.perf_counter() - start) / steps, steps / max(ends, 1) if ends else math.inf, final_info
    finally:
        try:
            env.close()
        except Exception:  # noqa: BLE001 - a probe's close is best effort
            pass


def choose(env_fns: list, workers: int, context: str, spin: float) -> tuple[int, dict[str, float | None]]:
    """The number of workers to use (0: this process) and the figures the choice was made from."""
    step, length, info = measure_step(env_fns[-1])  # the last env: env 0 often records video
    like_the_probe = (min(step, 0.002), length, info)  # costlier steps only favour workers more
    n = len(env_fns)
    figures = {"step": step, "in_process": measure_layout(n, *like_the_probe, num_workers=0), "workers": None}
    if workers > 1:
        layout = {"num_workers": workers, "context": context, "worker_spin": spin}
        figures["workers"] = measure_layout(n, *like_the_probe, **layout)
    if workers == 1 or figures["workers"] > 0.9 * figures["in_process"]:
        workers = 0  # workers must be clearly faster: a step in this process is easier to debug, can't crash
    return workers, figures


def describe(n: int, num_workers: int, figures: dict[str, float | None], workers_measured: int) -> str:
    """The layout in words, with the figures the choice was made from: "8 envs in this process (measured: ...)"."""
    envs = "1 env" if n == 1 else f"{n} envs"
    text = f"{envs} in " + ("this process" if num_workers == 0 else plural(num_workers, "worker process"))
    if figures["step"] is not None:
        text += f" (measured: one env step {figures['step'] * 1e6:.0f} us; one step of {envs}"
        text += f" {figures['in_process'] * 1e6:.0f} us in this process"
        if figures["workers"] is not None:
            text += f", {figures['workers'] * 1e6:.0f} us in {plural(workers_measured, 'worker')}"
        text += ")"
    return text
