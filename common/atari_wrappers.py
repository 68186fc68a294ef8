"""The DeepMind Atari preprocessing as one wrapper over the ALE (AtariPipeline)."""

import time
from typing import Any

import cv2
import gymnasium as gym
import numpy as np


class AtariPipeline(gym.Wrapper):
    """DeepMind's preprocessing in one wrapper around an ALE env made with frameskip=1 and
    obs_type="ram" (it reads the frames it keeps from the emulator): noop reset (up to noop_max),
    frame skip with a max over the last two frames, 84x84 gray, a lost life ends the episode while
    the game goes on, FIRE (then action 2) after a reset where the game has FIRE, rewards clipped to
    their sign, 4 frames stacked; its episode statistics are raw, full-game scores. It gives
    gymnasium's own wrapper chain's numbers step for step (benchmarks/peers.py, tested), driving the
    emulator through its ALEInterface instead of through seven wrappers per frame: a wrapper below
    it would miss every frame, so wrap it instead (RecordVideo, with render_mode="rgb_array",
    records each agent step)."""

    def __init__(self, env: gym.Env, noop_max: int = 30, frame_skip: int = 4, size: int = 84, stack: int = 4):
        below, inner = [], env
        while isinstance(inner, gym.Wrapper):
            below, inner = [*below, type(inner).__name__], inner.env
        if set(below) - {"OrderEnforcing", "PassiveEnvChecker"}:
            raise ValueError(
                f"AtariPipeline drives the emulator itself: the wrappers below it ({', '.join(below)}) "
                "would miss every frame; wrap the pipeline instead"
            )
        super().__init__(env)
        self.ale = env.unwrapped.ale
        self.action_set = [a.value for a in env.unwrapped._action_set]  # action index -> the ALE's
        self.noop_max, self.frame_skip, self.size = noop_max, frame_skip, size
        self.fire = env.unwrapped.get_action_meanings()[1:2] == ["FIRE"] and env.action_space.n >= 3
        # The last two frames of a step, max-pooled; the stack, oldest first
        self.screens = np.zeros((2, *self.ale.getScreenDims()), np.uint8)
        self.frames = np.zeros((stack, size, size), np.uint8)
        self.observation_space = gym.spaces.Box(0, 255, (stack, size, size), np.uint8)
        self.game_return, self.game_frames, self.game_start = 0.0, 0, time.perf_counter()  # the episode's
        self.lives, self.game_over = 0, True  # EpisodicLifeEnv

    def step(self, action):
        obs, reward, terminated, truncated, info = self._life_step(action)
        self.frames[:-1] = self.frames[1:]
        self.frames[-1] = obs
        clipped = np.float64(min(max(reward, -1.0), 1.0))  # ClipReward
        return self.frames.copy(), clipped, terminated, truncated, info

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        obs, info = self._life_reset(seed, options)
        for action in (1, 2) if self.fire else ():  # FireResetEnv
            obs, _, terminated, truncated, _ = self._life_step(action)
            if terminated or truncated:
                obs, info = self._life_reset(None, options)
        self.frames[:] = obs
        return self.frames.copy(), info

    def _life_step(self, action: int) -> tuple:
        """EpisodicLifeEnv.step: a lost life ends the episode, the game goes on."""
        obs, reward, terminated, truncated, info = self._skip(action)
        self.game_over = terminated or truncated
        lost_life = 0 < info["lives"] < self.lives  # the ALE's lives, as _info read them
        self.lives = info["lives"]
        return obs, reward, terminated or lost_life, truncated, info

    def _life_reset(self, seed: int | None, options: dict | None) -> tuple:
        """EpisodicLifeEnv.reset: a new game after a game over or with a seed, else a no-op step."""
        if self.game_over or seed is not None:
            obs, info = self._game_reset(seed, options)
        else:
            obs, _, terminated, truncated, info = self._skip(0)
            if terminated or truncated:
                obs, info = self._game_reset(None, options)
        self.game_over, self.lives = False, self.ale.lives()
        return obs, info

    def _skip(self, action: int) -> tuple:
        """AtariPreprocessing.step: the action repeated frame_skip times, the last two frames
        max-pooled (the max stays in the buffer: the next step's may read it)."""
        total, terminated, truncated, ale_action = 0.0, False, False, self.action_set[action]
        for t in range(self.frame_skip):
            reward, terminated, truncated = self._frame(ale_action)
            total += reward
            if terminated or truncated:
                break
            if t >= self.frame_skip - 2:
                self.ale.getScreenGrayscale(self.screens[self.frame_skip - 1 - t])
        return self._observe(), total, terminated, truncated, self._info(terminated or truncated)

    def _game_reset(self, seed: int | None, options: dict | None) -> tuple:
        """AtariPreprocessing.reset: the game reset (seeding the ALE), then 1 to noop_max no-ops."""
        _, info = self.env.reset(seed=seed, options=options)
        self.game_return, self.game_frames, self.game_start = 0.0, 0, time.perf_counter()
        noops = self.env.unwrapped.np_random.integers(1, self.noop_max + 1) if self.noop_max > 0 else 0
        for _ in range(noops):
            _, terminated, truncated = self._frame(self.action_set[0])
            info.update(self._info(terminated or truncated))
            if terminated or truncated:
                _, info = self.env.reset(seed=seed, options=options)
                self.game_return, self.game_frames, self.game_start = 0.0, 0, time.perf_counter()
        self.ale.getScreenGrayscale(self.screens[0])
        self.screens[1].fill(0)
        return self._observe(), info

    def _frame(self, ale_action: Any) -> tuple[float, bool, bool]:
        """One frame, as AtariEnv.step with frameskip=1, counted as RecordEpisodeStatistics does."""
        reward = self.ale.act(ale_action, 1.0)
        self.game_return += reward
        self.game_frames += 1
        return reward, self.ale.game_over(with_truncation=False), self.ale.game_truncated()

    def _info(self, ended: bool) -> dict[str, Any]:
        """AtariEnv's info of the last frame; RecordEpisodeStatistics' episode if the game ended."""
        info = {
            "lives": self.ale.lives(),
            "episode_frame_number": self.ale.getEpisodeFrameNumber(),
            "frame_number": self.ale.getFrameNumber(),
        }
        if ended:
            elapsed, self.game_start = round(time.perf_counter() - self.game_start, 6), time.perf_counter()
            info["episode"] = {"r": self.game_return, "l": self.game_frames, "t": elapsed}
        return info

    def _observe(self) -> np.ndarray:
        np.maximum(self.screens[0], self.screens[1], out=self.screens[0])
        return cv2.resize(self.screens[0], (self.size, self.size), interpolation=cv2.INTER_AREA)
