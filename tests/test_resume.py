"""Both scripts resume from their checkpoints exactly: a run checkpointed halfway and resumed ends where a run that
never stopped ends, and logs on into its own run folder."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import ATARI, ATARI_TINY, VEC, VEC_TINY, only_run_dir, read_scalars, run_script

pytestmark = pytest.mark.e2e  # runs the scripts as users do: the README's test command, not the fast tier


@pytest.mark.parametrize(
    ("script", "args", "steps_per_iteration"),
    [
        (VEC, [*VEC_TINY, "--env-id", "CartPole-v1", "--num-workers", "0"], 128),  # the layout plays no part
        (VEC, [*VEC_TINY, "--env-id", "Pendulum-v1", "--num-workers", "0"], 128),  # with each env's statistics
        # Atari's exact resume (44 s): under -m long; the README's command resumes Atari in the two-rank SIGINT test
        pytest.param(ATARI, ATARI_TINY, 16, marks=pytest.mark.long),
    ],
    ids=["ppo_vec-discrete", "ppo_vec-box", "atari"],
)
def test_resume_matches_an_uninterrupted_run(tmp_path, script, args, steps_per_iteration):
    """Checkpoint after 2 of 4 iterations, resume to 4: the same weights, optimizer state, RNG and statistics."""
    args = [*args, "--checkpoint-interval", "2", "--save-model", "--eval-episodes", "0", "--no-anneal-lr"]
    full, first = tmp_path / "full", tmp_path / "first"
    for cwd in (full, first):
        cwd.mkdir()
    out = run_script(script, [*args, "--total-timesteps", 4 * steps_per_iteration], full)  # checkpoints at 2 and 4
    assert out.returncode == 0, out.stderr
    out = run_script(script, [*args, "--total-timesteps", 2 * steps_per_iteration], first)  # ends after iteration 2
    assert out.returncode == 0, out.stderr
    run_dir = only_run_dir(first)
    resume = [*args, "--total-timesteps", 4 * steps_per_iteration, "--resume", run_dir / "checkpoint.pt"]
    out = run_script(script, resume, first)
    assert out.returncode == 0, out.stderr
    assert only_run_dir(first) == run_dir and f"global_step={4 * steps_per_iteration}/" in out.stdout
    model = f"{script.stem}.cleanrl_model"
    expected = torch.load(only_run_dir(full) / model, weights_only=True)
    resumed = torch.load(run_dir / model, weights_only=True)
    assert resumed["iteration"] == expected["iteration"] == 4 and resumed["rng"] == expected["rng"]
    for key in ("model", "optimizer", "reward_scaler", "obs_normalizer") if script == VEC else ("model", "optimizer"):
        torch.testing.assert_close(resumed[key], expected[key], rtol=0, atol=0)
    if "Pendulum-v1" in args:  # all 4 iterations and one reset counted: the resumed envs are the saved ones
        assert resumed["obs_normalizer"]["count"].item() == pytest.approx(4 * (4 * 32 + 1), abs=0.01)
    steps = [step for step, _ in read_scalars(run_dir)["losses/policy_loss"]]
    assert steps == [steps_per_iteration * i for i in range(1, 5)]  # one curve, continued by the resumed run
    out = run_script(script, resume, first)  # once more: nothing left to do
    assert out.returncode == 0 and "that run finished its 4 iterations already; nothing to do" in out.stdout
    assert only_run_dir(first) == run_dir and out.stderr == ""
