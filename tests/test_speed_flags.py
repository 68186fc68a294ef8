"""The scripts' speed flags end to end: --overlap (two groups of envs, one stepping while the other's
actions are drawn) trains the weights a run without it trains; --compile trains, and a compiled run
stopped and resumed is the compiled run of its seed. (--cudagraphs needs CUDA: test_bad_input.)"""

from __future__ import annotations

import random
import signal
import time

import pytest
import torch

import ppo_atari_multigpu
from tests.helpers import (
    ATARI,
    ATARI_TINY,
    VEC,
    VEC_TINY,
    learning_curves,
    only_run_dir,
    read_scalars,
    run_script,
    start_training,
    stop,
)

pytestmark = pytest.mark.e2e


def final_state(run_dir) -> dict:
    return torch.load(next(run_dir.glob("*.cleanrl_model")), weights_only=True)


@pytest.mark.parametrize(
    ("script", "args"),
    [
        (VEC, [*VEC_TINY, "--num-workers", "2", "--total-timesteps", "1280"]),
        pytest.param(
            ATARI,
            [*ATARI_TINY, "--local-num-envs", "4", "--num-workers", "2", "--total-timesteps", "1024"],
            marks=pytest.mark.long,
        ),
    ],
    ids=["cartpole", "atari"],
)
def test_overlap_trains_the_weights_a_run_without_it_trains(tmp_path, script, args):
    """Two workers, each a group: the same actions, episodes, losses and final weights, to the bit
    (on a GPU, a half batch's forward pass may round otherwise: docs/runs.md)."""
    results = {}
    for flag in ("--overlap", "--no-overlap"):
        cwd = tmp_path / flag
        cwd.mkdir()
        out = run_script(script, [*args, flag, "--save-model", "--eval-episodes", "0"], cwd)
        assert out.returncode == 0, out.stderr
        assert ("2 worker processes, stepped in 2 groups" in out.stdout.splitlines()[0]) == (flag == "--overlap")
        results[flag] = final_state(only_run_dir(cwd)), learning_curves(only_run_dir(cwd))
    (overlapped, overlapped_curves), (plain, plain_curves) = results.values()
    assert overlapped["rng"] == plain["rng"]
    for key in ("model", "optimizer"):
        torch.testing.assert_close(overlapped[key], plain[key], rtol=0, atol=0)
    assert overlapped_curves == plain_curves and overlapped_curves["charts/episodic_return"]


def test_compile_trains_and_a_stopped_compiled_run_resumes_weight_for_weight(tmp_path):
    args = [*VEC_TINY, "--num-workers", "0", "--compile", "--total-timesteps", 20 * 128, "--save-model"]
    args += ["--eval-episodes", "0", "--env-id", "tests.envs:PacedCartPole-v1"]
    full, stopped = tmp_path / "full", tmp_path / "stopped"
    for cwd in (full, stopped):
        cwd.mkdir()
    # an interpreter of its own: another hash seed than the stopped run's
    out = run_script(VEC, args, full, fresh=True)
    assert out.returncode == 0, out.stderr
    proc = start_training(VEC, args, stopped)
    time.sleep(random.uniform(0.0, 0.5))
    stop(proc, signal.SIGINT, within=60)
    checkpoint = only_run_dir(stopped) / "checkpoint.pt"
    saved = torch.load(checkpoint, weights_only=True)
    assert saved["args"]["compile"] and 0 <= saved["iteration"] < 20
    out = run_script(VEC, [*args, "--resume", checkpoint], stopped)
    assert out.returncode == 0, out.stderr
    resumed, expected = final_state(only_run_dir(stopped)), final_state(only_run_dir(full))
    assert resumed["rng"] == expected["rng"]
    for key in ("model", "optimizer", "reward_scaler"):
        torch.testing.assert_close(resumed[key], expected[key], rtol=0, atol=0)
    losses = read_scalars(only_run_dir(full))["losses/value_loss"]
    assert len(losses) == 20 and all(torch.isfinite(torch.tensor(value)) for _, value in losses)


@pytest.mark.long
def test_the_compiled_atari_update_trains_beside_the_overlap(tmp_path):
    args = [*ATARI_TINY, "--local-num-envs", "4", "--num-workers", "2", "--overlap", "--compile"]
    out = run_script(ATARI, [*args, "--total-timesteps", "128", "--save-model", "--eval-episodes", "0"], tmp_path)
    assert out.returncode == 0, out.stderr
    scalars = read_scalars(only_run_dir(tmp_path))
    for tag in ("losses/policy_loss", "losses/value_loss", "losses/entropy", "losses/approx_kl"):
        assert len(scalars[tag]) == 4 and all(torch.isfinite(torch.tensor(v)) for _, v in scalars[tag]), tag
    torch.manual_seed(1)
    initial = ppo_atari_multigpu.Agent(4).state_dict()
    trained = final_state(only_run_dir(tmp_path))["model"]
    assert not all(torch.equal(initial[name], trained[name]) for name in initial)
