"""ppo_atari_multigpu.py end to end: one rank, torchrun with gloo on CPU, two "nodes" on 127.0.0.1, resume."""

from __future__ import annotations

import ast
import inspect
import re
import socket
import subprocess
import sys

import ale_py
import gymnasium as gym
import numpy as np
import pytest
import torch

from common.atari_wrappers import FireResetEnv
from tests.helpers import REPO, only_run_dir, read_scalars, run_script
from tests.test_ppo_vec import CLEANRL_TAGS

sys.path.insert(0, str(REPO))
import ppo_atari_multigpu  # noqa: E402
import ppo_vec  # noqa: E402

SCRIPT = REPO / "ppo_atari_multigpu.py"
# 2 envs x 8 steps per rank: one iteration is a handful of CNN updates on CPU.
TINY = ["--local-num-envs", "2", "--num-steps", "8", "--num-minibatches", "2", "--update-epochs", "2"]


def torchrun(args, cwd, nproc=2, timeout=300):
    cmd = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", str(SCRIPT), *args]
    return subprocess.run([sys.executable, *cmd], cwd=cwd, capture_output=True, text=True, timeout=timeout)


def checksums(stdout: str) -> tuple[float, list[float]]:
    initial = float(re.search(r"initial parameter checksum (\S+)", stdout).group(1))
    final = ast.literal_eval(re.search(r"final parameter checksum per rank: (\[.*\])", stdout).group(1))
    return initial, final


def test_helpers_repeated_across_scripts_stay_identical():
    for name in ("layer_init", "compute_gae"):
        assert inspect.getsource(getattr(ppo_vec, name)) == inspect.getsource(getattr(ppo_atari_multigpu, name)), name


def test_one_rank_logs_cleanrl_tags(tmp_path):
    out = run_script(SCRIPT, [*TINY, "--total-timesteps", "48"], tmp_path)
    assert out.returncode == 0, out.stderr
    assert "global_step=48/48" in out.stdout
    scalars = read_scalars(only_run_dir(tmp_path))
    assert CLEANRL_TAGS - {"charts/episodic_return", "charts/episodic_length"} <= scalars.keys()
    assert [step for step, _ in scalars["losses/policy_loss"]] == [16, 32, 48]
    initial, (final,) = checksums(out.stdout)
    assert final != initial


def test_two_ranks_with_gloo_stay_identical(tmp_path):
    out = torchrun([*TINY, "--total-timesteps", "96"], tmp_path)  # 96 global steps = 3 global iterations
    assert out.returncode == 0, out.stdout + out.stderr
    assert "2 rank(s); env seeds per rank: [[1, 2], [3, 4]]" in out.stdout
    initial, (rank0, rank1) = checksums(out.stdout)
    assert rank0 == rank1 and rank0 != initial
    assert out.stdout.count("final parameter checksum") == 1  # rank 0 alone prints
    steps = [step for step, _ in read_scalars(only_run_dir(tmp_path))["losses/policy_loss"]]
    assert steps == [32, 64, 96]  # global steps: both ranks' envs count


def test_early_stop_is_decided_together(tmp_path):
    """A target_kl this low stops every epoch loop at once; ranks that decided alone would deadlock."""
    out = torchrun([*TINY, "--update-epochs", "6", "--target-kl", "1e-9", "--total-timesteps", "64"], tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    _, (rank0, rank1) = checksums(out.stdout)
    assert rank0 == rank1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
        cmd = [sys.executable, *launch, str(SCRIPT), *TINY, "--total-timesteps", "64"]
        nodes.append(subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs = [node.communicate(timeout=300)[0] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outputs
    stdout = next(out for out in outputs if "final parameter checksum" in out)
    assert "env seeds per rank: [[1, 2], [3, 4]]" in stdout  # global ranks, though each node has local rank 0
    _, (rank0, rank1) = checksums(stdout)
    assert rank0 == rank1


def test_resume_matches_uninterrupted_run(tmp_path):
    common = [*TINY, "--no-anneal-lr", "--checkpoint-interval", "2", "--save-model", "--eval-episodes", "0"]
    full, first, second = (tmp_path / name for name in ("full", "first", "second"))
    for cwd in (full, first, second):
        cwd.mkdir()
    out = run_script(SCRIPT, [*common, "--total-timesteps", "64"], full)  # 4 iterations, checkpoints at 2 and 4
    assert out.returncode == 0, out.stderr
    out = run_script(SCRIPT, [*common, "--total-timesteps", "32"], first)  # stops after iteration 2
    assert out.returncode == 0, out.stderr
    checkpoint = only_run_dir(first) / "checkpoint.pt"
    out = run_script(SCRIPT, [*common, "--total-timesteps", "64", "--resume", checkpoint], second)
    assert out.returncode == 0, out.stderr
    assert "global_step=64/64" in out.stdout
    expected = torch.load(next(only_run_dir(full).glob("*.cleanrl_model")), weights_only=True)["model"]
    resumed = torch.load(next(only_run_dir(second).glob("*.cleanrl_model")), weights_only=True)["model"]
    for name in expected:
        torch.testing.assert_close(resumed[name], expected[name], rtol=0, atol=0)
    steps = [step for step, _ in read_scalars(only_run_dir(second))["losses/policy_loss"]]
    assert steps == [48, 64]


def test_corrupted_checkpoint_gives_a_clear_error(tmp_path):
    bad = tmp_path / "checkpoint.pt"
    bad.write_bytes(b"not a checkpoint at all")
    out = run_script(SCRIPT, [*TINY, "--total-timesteps", "32", "--resume", bad], tmp_path)
    assert out.returncode != 0
    assert f"--resume {bad}: not a readable checkpoint" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize(
    ("flags", "world_size", "message"),
    [
        (["--local-num-envs", "0"], 1, "--local-num-envs must be >= 1, got 0"),
        (["--num-minibatches", "3"], 1, "--num-minibatches 3 must divide the per-rank batch size 1024"),
        (["--total-timesteps", "3000"], 4, "--total-timesteps 3000 is smaller than one global batch of 4096 steps"),
        (["--env-id", "CartPole-v1"], 1, "--env-id 'CartPole-v1' is not an Atari env id"),
        (["--backend", "nccl", "--no-cuda"], 1, "--backend nccl needs CUDA"),
        (["--backend", "tcp"], 1, "--backend must be nccl, gloo or mpi, got tcp"),
        (["--resume", "nowhere.pt"], 1, "--resume 'nowhere.pt' is not a file"),
    ],
)
def test_bad_input_is_rejected_with_the_flag_named(flags, world_size, message):
    import tyro

    with pytest.raises(ValueError) as info:
        ppo_atari_multigpu.check_args(tyro.cli(ppo_atari_multigpu.Args, args=flags), world_size, 1)
    assert message in str(info.value)


def test_raw_full_game_score_is_reported_across_lives():
    """Episodic life ends training episodes per life and clips rewards, but the logged return is the raw game score."""
    env = ppo_atari_multigpu.make_env("BreakoutNoFrameskip-v4", 1, False, "")()
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
                assert env.unwrapped.ale.lives() < lives_before  # a life lost: training episode over, game goes on
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


def test_fire_reset_refuses_games_without_fire():
    gym.register_envs(ale_py)
    with pytest.raises(ValueError, match=r"needs action 1 to be FIRE, got actions \['NOOP', 'UP', 'DOWN'\]"):
        FireResetEnv(gym.make("ALE/Freeway-v5"))
