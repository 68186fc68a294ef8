"""The DeepMind Atari wrappers gymnasium 1.x lacks; everything else comes from gymnasium itself.

Use them with `gymnasium.wrappers.AtariPreprocessing` (noop reset, frame skip with max-pool, 84x84 grayscale):

    env = ScreenSpace(gym.make("BreakoutNoFrameskip-v4", frameskip=1, obs_type="ram"))
    env = gym.wrappers.AtariPreprocessing(env, frame_skip=4)
    env = EpisodicLifeEnv(env)
    env = FireResetEnv(env)  # only for games whose action 1 is FIRE
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


class ScreenSpace(gym.Wrapper):
    """Declares the screen as the observation space of an ALE env made with obs_type="ram".

    AtariPreprocessing reads the frames it keeps from the emulator itself (twice per frame skip) and only sizes its
    buffers from the observation space below it; the RGB frame the env would copy out on every emulated frame is
    never looked at. With obs_type="ram" the env hands over 128 bytes instead, and the observations are the same.
    """

    def __init__(self, env: gym.Env):
        super().__init__(env)
        height, width = env.unwrapped.ale.getScreenDims()
        self.observation_space = gym.spaces.Box(0, 255, (height, width, 3), np.uint8)


class EpisodicLifeEnv(gym.Wrapper):
    """A lost life ends the training episode (terminated=True) but not the game: the next `reset()` just
    continues it with a no-op step. Only a real game over, or a reset with an explicit seed, resets the game."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.lives = 0
        self.game_over = True

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.game_over = terminated or truncated
        lives = self.env.unwrapped.ale.lives()
        if 0 < lives < self.lives:
            terminated = True
        self.lives = lives
        return obs, reward, terminated, truncated, info

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        if self.game_over or seed is not None:
            obs, info = self.env.reset(seed=seed, options=options)
        else:
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:  # the no-op itself ended the game
                obs, info = self.env.reset(options=options)
        self.game_over = False
        self.lives = self.env.unwrapped.ale.lives()
        return obs, info


class FireResetEnv(gym.Wrapper):
    """Presses FIRE (then UP, as DeepMind did) after every reset, for games that wait for FIRE to start."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        meanings = env.unwrapped.get_action_meanings()
        if len(meanings) < 3 or meanings[1] != "FIRE":
            raise ValueError(f"FireResetEnv needs action 1 to be FIRE, got actions {meanings}")

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        obs, info = self.env.reset(seed=seed, options=options)
        for action in (1, 2):
            obs, _, terminated, truncated, _ = self.env.step(action)
            if terminated or truncated:
                obs, info = self.env.reset(options=options)
        return obs, info
