"""The Atari peers of benchmarks/ do the same work as our pipeline: set up as benchmarks/peers.py
sets them up, driven with the same actions, they agree with ours on what can be compared. With their
randomness taken away (no noops) and fed the steps our wrappers take on their own, every frame and
reward is the same; set up as the benchmark has them, every backend ends an episode at each lost
life and plays the game on."""

from __future__ import annotations

import importlib.util

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

import ppo_atari_multigpu
from benchmarks import peers

FIRE, SECOND = 1, 2  # FireResetEnv presses FIRE, then action 2 (as DeepMind's did)
NOOP = 0


def fixed_actions(n: int, steps: int) -> np.ndarray:
    """The same actions for every backend: a pattern with FIRE and both directions, shifted per env,
    half random."""
    rng = np.random.default_rng(0)
    pattern = np.array([FIRE, 2, 2, 2, 3, 3, 3, 0, 2, 3, 3, 2])
    out = np.stack([np.resize(np.roll(pattern, i), steps) for i in range(n)])
    return np.where(rng.random((n, steps)) < 0.5, out, rng.integers(0, 4, (n, steps)))


def ours(n: int, noop_max: int = 30) -> gym.vector.SyncVectorEnv:
    fns = [ppo_atari_multigpu.make_env(ppo_atari_multigpu.Args(), i, None, noop_max) for i in range(n)]
    return gym.vector.SyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP)


def play_ours(acts: np.ndarray, noop_max: int) -> list[list[tuple]]:
    """Per env, per step: (newest frame, clipped reward, how the step ended: None, "life" or "game")."""
    envs = ours(acts.shape[0], noop_max)
    envs.reset(seed=0)
    record = [[] for _ in range(acts.shape[0])]
    for t in range(acts.shape[1]):
        obs, rewards, terminations, truncations, infos = envs.step(acts[:, t])
        for i, steps in enumerate(record):
            game_over = "episode" in infos.get("final_info", {}) and infos["final_info"]["_episode"][i]
            end = None if not (terminations[i] or truncations[i]) else "game" if game_over else "life"
            steps.append((obs[i, -1].copy(), float(rewards[i]), end))
    envs.close()
    return record


def test_ale_py_set_up_like_ours_plays_the_same_frames():
    """No noops on either side, no fire reset in ale-py, and ale-py fed the steps our wrappers take
    by themselves (FIRE and action 2 after a reset, NOOP, FIRE and action 2 after a lost life):
    frame for frame the same game."""
    acts = fixed_actions(2, 700)
    record = play_ours(acts, noop_max=0)
    streams, where = [], []  # per env: the actions ale-py gets, and where each of our steps falls in them
    for env_acts, steps in zip(acts, record, strict=True):
        stream, index = [FIRE, SECOND], []
        for action, (_, _, end) in zip(env_acts, steps, strict=True):
            stream.append(int(action))
            index.append(len(stream) - 1)
            stream += [NOOP, FIRE, SECOND] if end == "life" else [FIRE, SECOND] if end == "game" else []
        streams.append(stream)
        where.append(index)
    length = max(map(len, streams))
    feed = np.array([s + [NOOP] * (length - len(s)) for s in streams])
    envs = peers.ale_vector(2, noop_max=0, use_fire_reset=False)
    envs.reset(seed=0)
    theirs = []
    for t in range(length):
        obs, rewards, terminations, truncations, infos = envs.step(feed[:, t])
        theirs.append((obs[:, -1].copy(), rewards.copy(), terminations | truncations, infos["lives"].copy()))
    envs.close()
    ends = {"life": 0, "game": 0}
    for i, steps in enumerate(record):
        for k, (frame, reward, end) in enumerate(steps):
            their_frame, their_rewards, their_ends, lives = theirs[where[i][k]]
            assert float(their_rewards[i]) == reward, (i, k)
            assert bool(their_ends[i]) == (end is not None), (i, k)
            if end is None:
                assert np.array_equal(frame, their_frame[i]), (i, k)  # ours shows the reset frame at an end
            else:
                ends[end] += 1
                assert (lives[i] == 5) == (end == "game"), (i, k, lives[i])  # a lost life: the game went on
    assert ends["life"] >= 10 and ends["game"] >= 2  # both kinds of end were crossed


BACKENDS = ["ours", "ale-py"] + (["EnvPool"] if importlib.util.find_spec("envpool") else [])


@pytest.mark.parametrize("backend", BACKENDS)
def test_as_benchmarked_every_backend_ends_an_episode_at_each_lost_life_and_plays_on(backend):
    """The setups the throughput benchmark times: the same observations (4 x 84 x 84 uint8), rewards
    clipped to their sign, an episode ending at every lost life with the game going on, and a reset
    only after the last life."""
    n, steps = 2, 1500
    acts = fixed_actions(n, steps)
    envs = {"ours": lambda: ours(n), "ale-py": lambda: peers.ale_vector(n), "EnvPool": lambda: peers.envpool_vector(n)}
    envs = envs[backend]()
    obs, infos = envs.reset(seed=0) if backend != "EnvPool" else envs.reset()
    assert obs.shape == (n, 4, 84, 84) and obs.dtype == np.uint8
    lives, ends, games = infos["lives"].copy(), 0, 0
    for t in range(steps):
        obs, rewards, terminations, truncations, infos = envs.step(acts[:, t])
        assert set(np.unique(rewards)) <= {-1.0, 0.0, 1.0}
        for i in np.flatnonzero(terminations | truncations):
            ends += 1
            if backend == "EnvPool":
                games += int(infos["terminated"][i])  # EnvPool says which end was the game's
            elif infos["lives"][i] >= lives[i]:  # same-step reset: lives back to 5 after the last one
                games += 1
            else:
                assert infos["lives"][i] == lives[i] - 1  # one life lost, the game goes on
        lives = infos["lives"].copy()
    envs.close()
    assert games >= 2 and ends >= 5 * games  # five lives a game: an episode per life
