"""A run stopped at any moment and resumed is the run of its seed: it ends with the weights,
optimizer, generators and statistics of the run never stopped, and logs on into its own folder. Envs
in the trainer, in workers, Atari, one rank and two under torchrun."""

from __future__ import annotations

import os
import random
import signal
import sys
import time

import pytest
import torch

from tests.helpers import (
    ATARI,
    ATARI_TINY,
    VEC,
    VEC_TINY,
    only_run_dir,
    read_scalars,
    run_command,
    run_script,
    start_torchrun,
    start_training,
    stop,
)

pytestmark = pytest.mark.e2e  # runs the scripts as users do: the README's test command, not the fast tier

# Gymnasium's envs whose steps take a millisecond more (tests/envs.py: Paced): the stop lands in a run
# that lasts seconds however fast the machine is
CASES = [
    # in the trainer (in CI: the envs' states taken and put back in this process, tests/test_env_state.py)
    pytest.param(
        VEC, [*VEC_TINY, "--env-id", "tests.envs:PacedCartPole-v1", "--num-workers", "0"], 128, marks=pytest.mark.long
    ),
    # in workers, each env's statistics
    (VEC, [*VEC_TINY, "--env-id", "tests.envs:PacedPendulum-v1", "--num-workers", "2"], 128),
    # in two groups of workers, one stepping while the other's actions are drawn
    (VEC, [*VEC_TINY, "--env-id", "tests.envs:PacedCartPole-v1", "--num-workers", "2", "--overlap"], 128),
    pytest.param(ATARI, ATARI_TINY, 16, marks=pytest.mark.long),  # the emulators' states (in CI: test_slurm, two ranks)
]


def assert_same_run(resumed_dir, expected_dir, script) -> None:
    """The final model files of two runs hold the same state, to the bit; the resumed run's curve
    has each iteration once."""
    model = f"{script.stem}.cleanrl_model"
    expected = torch.load(expected_dir / model, weights_only=True)
    resumed = torch.load(resumed_dir / model, weights_only=True)
    assert resumed["iteration"] == expected["iteration"] and resumed["rng"] == expected["rng"]
    for key in ("model", "optimizer", "reward_scaler", "obs_normalizer") if script == VEC else ("model", "optimizer"):
        torch.testing.assert_close(resumed[key], expected[key], rtol=0, atol=0)
    steps = [step for step, _ in read_scalars(resumed_dir)["losses/policy_loss"]]
    # none twice, none missing
    assert steps == [step for step, _ in read_scalars(expected_dir)["losses/policy_loss"]]


@pytest.mark.parametrize(
    ("script", "args", "steps_per_iteration"), CASES, ids=["trainer", "workers", "overlap", "atari"]
)
def test_a_run_stopped_at_any_moment_and_resumed_is_the_run_of_its_seed(tmp_path, script, args, steps_per_iteration):
    args = [*args, "--total-timesteps", 30 * steps_per_iteration, "--save-model", "--eval-episodes", "0"]
    full, stopped = tmp_path / "full", tmp_path / "stopped"
    for cwd in (full, stopped):
        cwd.mkdir()
    # an interpreter of its own: another hash seed than the stopped run's
    out = run_script(script, args, full, fresh=True)
    assert out.returncode == 0, out.stderr
    proc = start_training(script, args, stopped)
    time.sleep(random.uniform(0.0, 0.5))  # a rollout, an update, a periodic save: any moment
    stderr = stop(proc, signal.SIGINT, within=30)
    assert proc.returncode == 130, stderr
    run_dir = only_run_dir(stopped)
    saved = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    # the envs' states at that boundary
    assert 0 <= saved["iteration"] < 30 and None not in saved["env_states"]  # the last kept boundary
    out = run_script(script, [*args, "--resume", run_dir / "checkpoint.pt"], stopped)
    assert out.returncode == 0, out.stderr
    assert (
        f"resuming from iteration {saved['iteration']} (step {saved['global_step']}), the envs as they were"
        in (out.stdout.splitlines()[0])
    )
    assert_same_run(run_dir, only_run_dir(full), script)  # requeued once more: test_survival, nothing to do


@pytest.mark.long  # three torchrun jobs, 95 CPU-s; in CI two ranks stop and resume on Slurm (test_slurm's Atari case)
def test_ctrl_c_to_a_two_rank_job_saves_and_resumes_into_the_run_of_its_seed(tmp_path):
    """Ctrl-C in a terminal: SIGINT to the launcher and both ranks at once (the launcher forwards
    its own a moment later). Each rank stops once, rank 0 saves every rank's state, and the job
    resumed ends as the job never stopped. Each rank's envs step in two groups (--overlap)."""
    extra = ["--save-model", "--eval-episodes", "0", "--num-workers", "2", "--overlap"]
    args = [*ATARI_TINY, "--total-timesteps", "640", *extra]  # 20 x 32 global steps
    full, stopped = tmp_path / "full", tmp_path / "stopped"
    for cwd in (full, stopped):
        cwd.mkdir()
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(ATARI)]
    out = run_command([*torchrun, *args], full, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    proc = start_torchrun(stopped, extra, total=640)
    start = time.monotonic()
    # the terminal's foreground process group: launcher, ranks, their helpers
    os.killpg(proc.pid, signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    # the stop path, not its 120 s bound
    assert time.monotonic() - start < 60, "the job took too long to stop"
    assert "ppo_atari_multigpu.py: stopped by SIGINT: " in stderr, stderr[-3000:]
    run_dir = only_run_dir(stopped)
    saved = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    # both ranks'
    assert saved["world_size"] == 2 and None not in saved["rng"] and None not in saved["env_states"]
    out = run_command([*torchrun, *args, "--resume", str(run_dir / "checkpoint.pt")], stopped, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert_same_run(run_dir, only_run_dir(full), ATARI)
