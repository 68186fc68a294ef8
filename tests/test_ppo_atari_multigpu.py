"""ppo_atari_multigpu.py end to end: one rank, torchrun with gloo on CPU, two "nodes" on 127.0.0.1, resume."""

from __future__ import annotations

import ast
import inspect
import re
import subprocess
import sys
import textwrap

import ale_py
import gymnasium as gym
import numpy as np
import pytest
import torch

from benchmarks.peers import EpisodicLifeEnv, FireResetEnv, gymnasium_chain
from common.atari_wrappers import AtariPipeline
from tests.helpers import (
    ATARI,
    ATARI_TINY,
    CLEANRL_TAGS,
    REPO,
    assert_same,
    free_port,
    only_run_dir,
    read_scalars,
    run_command,
    run_script,
)

sys.path.insert(0, str(REPO))
import ppo_atari_multigpu  # noqa: E402
import ppo_vec  # noqa: E402


def torchrun(args, cwd, nproc=2, timeout=300):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", str(ATARI)]
    return run_command([*cmd, *map(str, args)], cwd, timeout)


def checksums(stdout: str, seed: int = 1) -> tuple[float, list[float]]:
    """The initial weights' checksum (the script's own seeding, redone here), and each rank's final
    one it printed."""
    torch.manual_seed(seed)
    initial = sum(p.detach().double().sum().item() for p in ppo_atari_multigpu.Agent(4).parameters())
    final = ast.literal_eval(re.search(r"final parameter checksum per rank .*: (\[.*\])", stdout).group(1))
    return initial, final


def block(source: str, first: str, last: str) -> str:
    """The lines of `source` from the one containing `first` to the next one containing `last`, dedented."""
    lines = source.splitlines()
    start = next(i for i, line in enumerate(lines) if first in line)
    end = next(i for i in range(start, len(lines)) if last in lines[i])
    return textwrap.dedent("\n".join(lines[start : end + 1]))


# Where both scripts do the same thing, they do it the same way with the same names (each script
# reads alone, so it is written twice; this keeps the two copies from drifting apart).
SHARED_BLOCKS = [
    ("for iteration in run.iterations():", "for step in range(args.num_steps + 1):"),  # an iteration's start
    ("for group in envs.groups:", "env_time += "),  # a group's step coming back (ppo_vec.py scales the rewards next)
    ("ends[step - 1, group] = ", "episodes.append("),  # truncation cuts, episode records
    ("# --compile:", "minibatch_losses = torch.compile("),
    # the batched pass (ppo_vec.py normalizes V's input)
    ("# LOG-PROBS, VALUES", "cut_steps, cut_envs, final_obs = "),
    ("# GAE", "# UPDATE"),
    ("logratio = newlogprob", "return loss, torch.stack("),  # the losses and what is logged of them
    ("optimizer.zero_grad()", "stats.append("),
    # logging (the losses: means over ranks)
    ("var_y = np.var(returns)", 'writer.add_scalar("charts/learning_rate"'),
    ('writer.add_scalar("losses/explained_variance"', "run.log("),
]


def test_what_both_scripts_do_is_written_the_same_way():
    for name in ("layer_init", "compute_gae", "sample"):
        assert inspect.getsource(getattr(ppo_vec, name)) == inspect.getsource(getattr(ppo_atari_multigpu, name)), name
    vec, atari = inspect.getsource(ppo_vec.main), inspect.getsource(ppo_atari_multigpu.main)
    for first, last in SHARED_BLOCKS:
        assert block(vec, first, last) == block(atari, first, last), first
        assert block(vec, first, last).count("\n") >= 2


@pytest.mark.e2e
def test_one_rank_logs_cleanrl_tags(tmp_path):
    out = run_script(ATARI, [*ATARI_TINY, "--total-timesteps", "48"], tmp_path)
    assert out.returncode == 0, out.stderr
    assert "global_step=48/48" in out.stdout
    scalars = read_scalars(only_run_dir(tmp_path))
    assert CLEANRL_TAGS - {"charts/episodic_return", "charts/episodic_length"} <= scalars.keys()
    assert [step for step, _ in scalars["losses/policy_loss"]] == [16, 32, 48]
    # the start line, no per-rank line
    assert "checksum" not in out.stdout and len(out.stdout.splitlines()[0]) <= 160
    torch.manual_seed(1)
    initial = sum(p.detach().double().sum().item() for p in ppo_atari_multigpu.Agent(4).parameters())
    saved = torch.load(only_run_dir(tmp_path) / "checkpoint.pt", weights_only=True)["model"]
    assert sum(w.double().sum().item() for w in saved.values()) != initial  # trained


@pytest.mark.e2e
def test_two_ranks_with_gloo_stay_identical_and_stop_early_together(tmp_path):
    """Two ranks train in lockstep: same weights at the end, global steps logged by rank 0 alone. A
    target_kl near the KLs the ranks see, over many epochs, puts their local KLs on both sides of it
    again and again: decided on the mean over ranks, every rank stops at the same epoch; a rank
    deciding alone would leave the other blocked in an all-reduce that never comes (the job hangs or
    fails)."""
    args = [*ATARI_TINY, "--update-epochs", "12", "--target-kl", "0.0005", "--learning-rate", "0.003"]
    # 160 global steps: 5 iterations
    out = torchrun([*args, "--total-timesteps", "160"], tmp_path, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert ", cpu, x 2 ranks, env seeds [[1, 2], [3, 4]]" in out.stdout
    initial, (rank0, rank1) = checksums(out.stdout)
    assert rank0 == rank1 and rank0 != initial
    assert out.stdout.count("final parameter checksum") == 1  # rank 0 alone prints
    scalars = read_scalars(only_run_dir(tmp_path))
    # both ranks' envs count
    assert [step for step, _ in scalars["losses/policy_loss"]] == [32, 64, 96, 128, 160]
    kls = [kl for _, kl in scalars["losses/approx_kl"]]
    assert any(kl > 0.0005 for kl in kls) and min(kls) < 0.0005  # the threshold sat inside the KLs seen


@pytest.mark.e2e
@pytest.mark.long  # in CI two nodes meet on this host under Slurm (test_slurm's Atari case)
def test_two_nodes_on_localhost(tmp_path):
    endpoint = f"127.0.0.1:{free_port()}"
    nodes = []
    for node_rank in (0, 1):
        cwd = tmp_path / f"node{node_rank}"
        cwd.mkdir()
        launch = [
            "-m",
            "torch.distributed.run",
            "--nnodes",
            "2",
            "--nproc_per_node",
            "1",
            "--node-rank",
            str(node_rank),
        ]
        launch += ["--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", "ppo-vec-test"]
        cmd = [sys.executable, *launch, str(ATARI), *ATARI_TINY, "--total-timesteps", "64"]
        nodes.append(subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs = [node.communicate(timeout=300)[0] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outputs
    stdout = next(out for out in outputs if "final parameter checksum" in out)
    assert "env seeds [[1, 2], [3, 4]]" in stdout  # global ranks, though each node has local rank 0
    _, (rank0, rank1) = checksums(stdout)
    assert rank0 == rank1


def test_raw_full_game_score_is_reported_across_lives():
    """Episodic life ends training episodes per life and clips rewards, but the logged return is the
    raw game score."""
    env = ppo_atari_multigpu.make_env(ppo_atari_multigpu.Args(), 1, None)()
    assert env.observation_space.shape == (4, 84, 84) and env.observation_space.dtype == np.uint8
    rng = np.random.default_rng(0)
    env.reset(seed=0)
    for _ in range(5):  # random play sometimes scores nothing: play games until one scores
        clipped_total, life_ends = 0.0, 0
        while True:
            lives_before = env.unwrapped.ale.lives()
            _, reward, terminated, truncated, info = env.step(int(rng.integers(0, 4)))
            assert reward in (-1.0, 0.0, 1.0)
            clipped_total += reward
            if terminated or truncated:
                if "episode" in info:
                    break
                # a life lost: training episode over, game goes on
                assert env.unwrapped.ale.lives() < lives_before
                life_ends += 1
                env.reset()
        assert life_ends == 4  # Breakout: 5 lives, the fifth loss ends the game
        raw_total = float(info["episode"]["r"])
        assert raw_total >= clipped_total  # the whole game's score, not the last life's, and unclipped
        env.reset()
        if raw_total > 0:
            break
    assert raw_total > 0
    env.close()


def test_the_pipeline_gives_gymnasiums_observations_step_by_step():
    """make_env skips the RGB frame the base env copies out per emulated frame; what comes out is
    what gymnasium's own stack (RGB base env, AtariPreprocessing, ...) gives, step for step, resets
    and episode statistics included."""
    gym.register_envs(ale_py)

    def reference():
        env = gym.wrappers.RecordEpisodeStatistics(gym.make("BreakoutNoFrameskip-v4", frameskip=1))
        env = gym.wrappers.AtariPreprocessing(env, noop_max=30, frame_skip=4, screen_size=84, grayscale_obs=True)
        env = gym.wrappers.ClipReward(FireResetEnv(EpisodicLifeEnv(env)), -1.0, 1.0)
        return gym.wrappers.FrameStackObservation(env, 4)

    ours, theirs = ppo_atari_multigpu.make_env(ppo_atari_multigpu.Args(), 1, None)(), reference()
    for seed in (0, 1):
        assert_same(ours.reset(seed=seed), theirs.reset(seed=seed))
        rng, ends = np.random.default_rng(seed), 0
        for _ in range(400):
            action = int(rng.integers(0, 4))
            got, want = ours.step(action), theirs.step(action)
            for info in (got[4], want[4]):
                info.get("episode", {}).pop("t", None)  # wall-clock time: the one thing that may differ
            assert_same(got, want)
            if want[2] or want[3]:
                ends += 1
                assert_same(ours.reset(), theirs.reset())
        assert ends >= 2  # lives lost, so resets inside a game were compared too


def test_fire_reset_refuses_games_without_fire():
    gym.register_envs(ale_py)
    with pytest.raises(ValueError, match=r"needs action 1 to be FIRE, got actions \['NOOP', 'UP', 'DOWN'\]"):
        FireResetEnv(gym.make("ALE/Freeway-v5"))


@pytest.mark.parametrize("env_id", ["BreakoutNoFrameskip-v4", "ALE/SpaceInvaders-v5"])
def test_the_one_wrapper_pipeline_gives_gymnasiums_numbers(env_id):
    """AtariPipeline against gymnasium's wrappers (gymnasium_chain), the same seeds and actions,
    through resets, lost lives and game overs (sticky actions too, in the v5 env): every
    observation, reward, flag and info the same."""
    gym.register_envs(ale_py)

    def without_time(result):  # an episode's wall-clock seconds differ, of course
        return tree_map(result, lambda d: {k: v for k, v in d.items() if k != "t"})

    ours = AtariPipeline(gym.make(env_id, frameskip=1, obs_type="ram"))
    theirs = gymnasium_chain(gym.make(env_id, frameskip=1, obs_type="ram"))
    rng, ends = np.random.default_rng(0), 0
    assert_same(without_time(ours.reset(seed=5)), without_time(theirs.reset(seed=5)), "reset")
    for t in range(2500):
        action = int(rng.integers(ours.action_space.n))
        step = ours.step(action)
        assert_same(without_time(step), without_time(theirs.step(action)), f"step {t}")
        if step[2] or step[3]:
            ends += 1
            assert_same(without_time(ours.reset()), without_time(theirs.reset()), f"reset after step {t}")
    assert ends >= 10


def tree_map(value, on_dict):
    if isinstance(value, tuple):
        return tuple(tree_map(v, on_dict) for v in value)
    if isinstance(value, dict):
        return {k: tree_map(v, on_dict) for k, v in on_dict(value).items()}
    return value


def test_a_wrapper_below_the_pipeline_is_refused_and_one_above_sees_every_step():
    """The pipeline drives the emulator itself: a wrapper below it (a time limit) would miss every
    frame, so it is refused in one line; one above it (a video recorder) sees each agent step, and
    changes no number."""
    gym.register_envs(ale_py)
    limited = gym.wrappers.TimeLimit(gym.make("BreakoutNoFrameskip-v4", frameskip=1, obs_type="ram"), 100)
    with pytest.raises(ValueError, match=r"below it \(TimeLimit, OrderEnforcing, PassiveEnvChecker\) would miss"):
        AtariPipeline(limited)

    class CountsSteps(gym.Wrapper):
        steps = 0

        def step(self, action):
            self.steps += 1
            return self.env.step(action)

    plain = AtariPipeline(gym.make("BreakoutNoFrameskip-v4", frameskip=1, obs_type="ram"))
    recorded = CountsSteps(
        AtariPipeline(gym.make("BreakoutNoFrameskip-v4", frameskip=1, obs_type="ram", render_mode="rgb_array"))
    )
    assert_same(plain.reset(seed=0), recorded.reset(seed=0))
    for action in [1, 2, 3, 0] * 25:
        got, want = recorded.step(action), plain.step(action)
        for info in (got[4], want[4]):
            info.get("episode", {}).pop("t", None)
        assert_same(got, want)
    # the screen, as RecordVideo takes it
    assert recorded.steps == 100 and recorded.render().shape == (210, 160, 3)
