"""The peers our Atari pipeline is compared with, set up to do the same work, in one place: the
throughput benchmark builds them from here, and tests/test_atari_peers.py checks, step by step, that
they agree with ours.

Ours (ppo_atari_multigpu.make_env): noop reset (up to 30), frame skip 4 with a max over the last two
frames, 84x84 gray, a lost life ends the episode (terminated) while the game goes on, FIRE (then
action 2) after every reset, rewards clipped to their sign, 4 frames stacked, no sticky actions,
same-step autoreset, raw full-game scores for logging.

ale-py's AtariVectorEnv can do all of it (life_loss_info=True: a lost life ends the episode, the
game goes on; NOT episodic_life=True, which resets the whole game at every lost life: other work,
other episodes). What no option gives it: after a lost life ours plays NOOP, FIRE, then action 2 (12
frames) while ale-py plays on at once (the agent fires); after a game reset ours plays its noops,
then FIRE; ale-py FIRE, then its noops; the frames before the first of a stack are zeros in ale-py,
copies of it in ours. EnvPool likewise (episodic_life=True in EnvPool is ale-py's life_loss_info),
but it resets only at the step after an episode's end (NEXT_STEP autoreset: a step spent per end),
and after a lost life plays its noops then one FIRE frame.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

# What each peer is told; the throughput table says "set up as benchmarks/peers.py"
ALE_ALIKE = dict(
    frameskip=4,
    maxpool=True,
    img_height=84,
    img_width=84,
    grayscale=True,
    stack_num=4,
    noop_max=30,
    use_fire_reset=True,
    episodic_life=False,
    life_loss_info=True,
    reward_clipping=True,
    repeat_action_probability=0.0,
    max_num_frames_per_episode=108_000,
    full_action_space=False,
)
ENVPOOL_ALIKE = dict(
    frame_skip=4,
    img_height=84,
    img_width=84,
    gray_scale=True,
    stack_num=4,
    noop_max=30,
    use_fire_reset=True,
    episodic_life=True,
    reward_clip=True,
    repeat_action_probability=0.0,
    use_inter_area_resize=True,
    max_episode_steps=27_000,
    full_action_space=False,
)


def ale_vector(n: int, num_threads: int = 0, **changes: Any) -> Any:
    """ale-py's C++ vector env of n Breakouts set up like ours (same-step autoreset), `changes` applied."""
    from ale_py import AtariVectorEnv
    from gymnasium.vector import AutoresetMode

    kwargs = ALE_ALIKE | {"autoreset_mode": AutoresetMode.SAME_STEP, "num_threads": num_threads} | changes
    return AtariVectorEnv("breakout", n, **kwargs)


def envpool_vector(n: int, **changes: Any) -> Any:
    """EnvPool's n Breakouts set up like ours (gymnasium API), `changes` applied; ImportError
    without EnvPool."""
    import envpool

    return envpool.make_gymnasium("Breakout-v5", num_envs=n, batch_size=n, seed=0, **(ENVPOOL_ALIKE | changes))


# gymnasium's own wrappers, and the two DeepMind wrappers gymnasium lacks, as CleanRL stacks them:
# the reference AtariPipeline (common/atari_wrappers.py) is tested against, and what
# benchmarks/cleanrl_reference.py runs
class ScreenSpace(gym.Wrapper):
    """Declares the screen as the observation space of an ALE env made with obs_type="ram".

    AtariPreprocessing reads the frames it keeps from the emulator itself (twice per frame skip) and
    only sizes its buffers from the observation space below it; the RGB frame the env would copy out
    on every emulated frame is never looked at. With obs_type="ram" the env hands over 128 bytes
    instead, and the observations are the same.
    """

    def __init__(self, env: gym.Env):
        super().__init__(env)
        height, width = env.unwrapped.ale.getScreenDims()
        self.observation_space = gym.spaces.Box(0, 255, (height, width, 3), np.uint8)


class EpisodicLifeEnv(gym.Wrapper):
    """A lost life ends the training episode (terminated=True) but not the game: the next
    `reset()` just continues it with a no-op step. Only a real game over, or a reset with an
    explicit seed, resets the game."""

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


def gymnasium_chain(env: gym.Env, noop_max: int = 30) -> gym.Env:
    """DeepMind's preprocessing around an ALE env made with frameskip=1 (and obs_type="ram"), from
    gymnasium's own wrappers and the two above, as CleanRL stacks them; RecordEpisodeStatistics
    below life loss and reward clipping, so the returns it reports are raw full-game scores.
    AtariPipeline gives the same numbers, faster (tested)."""
    env = gym.wrappers.RecordEpisodeStatistics(ScreenSpace(env))
    env = gym.wrappers.AtariPreprocessing(env, noop_max=noop_max, frame_skip=4, screen_size=84, grayscale_obs=True)
    env = EpisodicLifeEnv(env)
    if env.unwrapped.get_action_meanings()[1:2] == ["FIRE"]:
        env = FireResetEnv(env)
    env = gym.wrappers.ClipReward(env, -1.0, 1.0)
    return gym.wrappers.FrameStackObservation(env, 4)
