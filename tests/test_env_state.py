"""Env states as data: SubprocVecEnv.save_env_states gives values only (checkpoints load them with
weights_only=True), and envs rebuilt by the same env_fns, given them, step on exactly as the envs they
were taken from, in either layout; an env that holds anything else cannot be saved, and states that do
not fit these envs are refused with the reason, before anything runs."""

from __future__ import annotations

import io

import gymnasium as gym
import numpy as np
import pytest
import torch

from common.multiprocessing_env import SubprocVecEnv
from tests.envs import HoldsAnObjectEnv, SavedCounterEnv, SavedDictObsEnv, make_counter
from tests.helpers import assert_same


def atari():
    import ale_py

    from common.atari_wrappers import AtariPipeline

    gym.register_envs(ale_py)
    return AtariPipeline(gym.make("BreakoutNoFrameskip-v4", frameskip=1, obs_type="ram"))


def mujoco():
    pytest.importorskip("mujoco")
    return gym.wrappers.RecordEpisodeStatistics(gym.make("Ant-v5"))  # it reads positions before a step


def counter():
    return gym.wrappers.TimeLimit(SavedCounterEnv(terminate_at=4), max_episode_steps=6)


def normalized():  # gymnasium's own helper object (a RunningMeanStd) inside a wrapper
    return gym.wrappers.NormalizeObservation(gym.wrappers.TimeLimit(gym.make("Pendulum-v1").unwrapped, 50))


CASES = {
    "counter": (counter, 3),
    "dict-obs": (lambda: gym.wrappers.TimeLimit(SavedDictObsEnv(), 5), 3),
    "cartpole": (lambda: gym.make("CartPole-v1", max_episode_steps=20), 4),
    "normalized": (normalized, 2),
    "atari": (atari, 1),
    "mujoco": (mujoco, 2),
}


def only_data(value) -> bool:
    if isinstance(value, dict):
        return all(only_data(k) and only_data(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return all(only_data(item) for item in value)
    return type(value) in (type(None), bool, int, float, str, bytes)


def untimed(value):
    """A step's results without the wall-clock times of episode statistics ("t")."""
    if isinstance(value, dict):
        return {k: untimed(v) for k, v in value.items() if not (k == "t" and "r" in value and "l" in value)}
    return tuple(untimed(v) for v in value) if isinstance(value, tuple) else value


@pytest.mark.parametrize("layout", [0, 2], ids=["in-process", "workers"])
@pytest.mark.parametrize("case", CASES)
def test_envs_given_a_saved_state_step_on_as_the_envs_it_was_taken_from(case, layout):
    make, n = CASES[case]
    with SubprocVecEnv([make] * n, num_workers=min(layout, n)) as envs:
        envs.reset(seed=3)
        envs.action_space.seed(3)
        for _ in range(37):
            last_obs = envs.step(envs.action_space.sample())[0]
        saved = envs.save_env_states()
        assert saved is not None and only_data(saved)  # nothing names a class or a function
        buffer = io.BytesIO()
        torch.save(saved, buffer)
        buffer.seek(0)
        saved = torch.load(buffer, weights_only=True)
        with SubprocVecEnv([make] * n, num_workers=min(2 - layout, n)) as rebuilt:  # the other layout
            assert_same(rebuilt.load_env_states(saved), last_obs, "obs")
            for _ in range(60):  # through episode ends: resets go on alike
                actions = envs.action_space.sample()
                assert_same(untimed(rebuilt.step(actions)), untimed(envs.step(actions)), case)


def test_an_env_holding_anything_but_data_cannot_be_saved():
    for make in (HoldsAnObjectEnv, make_counter):  # opted in but holds an object; not opted in
        with SubprocVecEnv([make], num_workers=0) as envs:
            envs.reset(seed=0)
            assert envs.save_env_states() is None


def damaged(state):
    """The state with every array's bytes cut short."""
    if isinstance(state, dict):
        return {key: damaged(value) for key, value in state.items()}
    if isinstance(state, list):
        return [damaged(value) for value in state]
    if isinstance(state, tuple) and state[:1] == ("array",):
        return (*state[:3], state[3][:-1])
    return tuple(damaged(value) for value in state) if isinstance(state, tuple) else state


def test_states_that_do_not_fit_are_refused_with_the_reason():
    with SubprocVecEnv([counter] * 2, num_workers=0) as envs:
        envs.reset(seed=0)
        saved = envs.save_env_states()
    with SubprocVecEnv([make_counter] * 2, num_workers=2) as other:  # another class, the same spaces
        message = r"env 0: ValueError: it was taken from SavedCounterEnv < TimeLimit, these are CounterEnv < "
        with pytest.raises(ValueError, match=message):
            other.load_env_states(saved)
        other.reset(seed=0)  # usable still
    with SubprocVecEnv([counter] * 3, num_workers=0) as envs:
        with pytest.raises(ValueError, match="2 states for 3 envs"):
            envs.load_env_states(saved)
    with SubprocVecEnv([counter] * 2, num_workers=0) as envs:
        with pytest.raises(ValueError, match="buffer size must be a multiple of element size"):
            envs.load_env_states(damaged(saved))
        envs.reset(seed=0)


@pytest.mark.parametrize("workers", [1, 2], ids=["one-worker", "two-workers"])
def test_when_some_states_do_not_fit_every_env_is_as_it_was(workers):
    """Env 0's state fits, env 1's does not (it names another class): the refusal leaves env 0 as it
    was too, so that the run's fresh episodes are fresh for every env."""
    with SubprocVecEnv([counter] * 2, num_workers=0) as envs:
        envs.reset(seed=0)
        for _ in range(3):
            envs.step(np.zeros(2, dtype=np.int64))
        saved = envs.save_env_states()
    saved["envs"][1]["classes"] = ["OtherEnv", "TimeLimit"]
    with SubprocVecEnv([counter] * 2, num_workers=workers) as envs:
        envs.reset(seed=5)
        with pytest.raises(ValueError, match=r"env 1: ValueError: it was taken from OtherEnv < TimeLimit, these are "):
            envs.load_env_states(saved)
        assert envs.get_attr("t") == (0, 0)  # env 0's saved state (t = 3) was put back
