"""The peers our Atari pipeline is compared with, set up to do the same work, in one place: the throughput benchmark
builds them from here, and tests/test_atari_peers.py checks, step by step, that they agree with ours.

Ours (ppo_atari_multigpu.make_env): noop reset (up to 30), frame skip 4 with a max over the last two frames, 84x84
gray, a lost life ends the episode (terminated) while the game goes on, FIRE (then action 2) after every reset, rewards
clipped to their sign, 4 frames stacked, no sticky actions, same-step autoreset, raw full-game scores for logging.

ale-py's AtariVectorEnv can do all of it (life_loss_info=True: a lost life ends the episode, the game goes on; NOT
episodic_life=True, which resets the whole game at every lost life: other work, other episodes). What no option gives
it: after a lost life ours plays NOOP, FIRE, then action 2 (12 frames) while ale-py plays on at once (the agent fires);
after a game reset ours plays its noops, then FIRE; ale-py FIRE, then its noops; the frames before the first of a
stack are zeros in ale-py, copies of it in ours. EnvPool likewise (episodic_life=True in EnvPool is ale-py's
life_loss_info), but it resets only at the step after an episode's end (NEXT_STEP autoreset: a step spent per end),
and after a lost life plays its noops then one FIRE frame.
"""

from __future__ import annotations

from typing import Any

# What each peer is told; the throughput table says "set up as benchmarks/peers.py"
ALE_ALIKE = dict(
    frameskip=4, maxpool=True, img_height=84, img_width=84, grayscale=True, stack_num=4, noop_max=30,
    use_fire_reset=True, episodic_life=False, life_loss_info=True, reward_clipping=True,
    repeat_action_probability=0.0, max_num_frames_per_episode=108_000, full_action_space=False,
)  # fmt: skip
ENVPOOL_ALIKE = dict(
    frame_skip=4, img_height=84, img_width=84, gray_scale=True, stack_num=4, noop_max=30, use_fire_reset=True,
    episodic_life=True, reward_clip=True, repeat_action_probability=0.0, use_inter_area_resize=True,
    max_episode_steps=27_000, full_action_space=False,
)  # fmt: skip


def ale_vector(n: int, num_threads: int = 0, **changes: Any) -> Any:
    """ale-py's C++ vector env of n Breakouts set up like ours (same-step autoreset), `changes` applied."""
    from ale_py import AtariVectorEnv
    from gymnasium.vector import AutoresetMode

    kwargs = ALE_ALIKE | {"autoreset_mode": AutoresetMode.SAME_STEP, "num_threads": num_threads} | changes
    return AtariVectorEnv("breakout", n, **kwargs)


def envpool_vector(n: int, **changes: Any) -> Any:
    """EnvPool's n Breakouts set up like ours (gymnasium API), `changes` applied; ImportError without EnvPool."""
    import envpool

    return envpool.make_gymnasium("Breakout-v5", num_envs=n, batch_size=n, seed=0, **(ENVPOOL_ALIKE | changes))
