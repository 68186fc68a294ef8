"""Learning targets, run with `python -m pytest -m slow` (minutes each on 2 cores; not part of the
default run).

Each runs the README's command for a few of the seeds benchmarks/results/learning_*.md reports
(seeds 1-10 there)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from benchmarks.learning import VEC_CASES
from tests.helpers import VEC, only_run_dir, read_scalars, run_script


def last_20_mean(case: str, seed: int, cwd, *extra: str) -> float:
    out = run_script(VEC, [*VEC_CASES[case][1].split(), *extra, "--seed", seed], cwd, timeout=3600)
    assert out.returncode == 0, out.stderr
    return float(np.mean([value for _, value in read_scalars(only_run_dir(cwd))["charts/episodic_return"]][-20:]))


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 4, 7])
def test_the_mission_command_solves_cartpole(tmp_path, seed):
    """python ppo_vec.py --env-id CartPole-v1 --num-envs 8, every other flag at its default."""
    assert last_20_mean("cartpole", seed, tmp_path) >= 475


@pytest.mark.slow
def test_the_compiled_path_solves_cartpole(tmp_path):
    """The mission's command with --compile: torch.compile of the rollout's policy and the minibatch's losses."""
    assert last_20_mean("cartpole", 3, tmp_path, "--compile") >= 475
    assert torch.load(only_run_dir(tmp_path) / "checkpoint.pt", weights_only=True)["args"]["compile"]


@pytest.mark.slow
@pytest.mark.parametrize("seed", [2, 5])
def test_pendulum_with_the_documented_flags(tmp_path, seed):
    assert last_20_mean("pendulum", seed, tmp_path) >= -300
