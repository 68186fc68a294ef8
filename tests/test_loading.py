"""A checkpoint is data: loading one never runs code. A real run's checkpoint whose every bytes value
is replaced by a pickle that would leave a file behind goes to --resume (envs in the trainer, in
workers, Atari), to --eval-checkpoint and to a sweep rerun: nothing runs, and each says in its start
line that the envs begin fresh episodes. A checkpoint never chooses what is imported either."""

from __future__ import annotations

import pickle
import sys

import pytest
import torch

from tests.helpers import ATARI, ATARI_TINY, REPO, VEC, VEC_TINY, only_run_dir, run_command, run_script

pytestmark = pytest.mark.e2e


def planted(marker) -> bytes:
    """A pickle that, loaded, creates `marker` (builtins.open(marker, "w"), written by hand)."""
    return b"cbuiltins\nopen\n(V" + str(marker).encode("raw_unicode_escape") + b"\nVw\ntR."


def craft(path, marker) -> int:
    """Replaces every bytes value of the checkpoint at `path` with `planted(marker)`; how many."""
    count = 0

    def swap(value):
        nonlocal count
        if isinstance(value, bytes):
            count += 1
            return planted(marker)
        if isinstance(value, dict):
            return {key: swap(item) for key, item in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(swap(item) for item in value)
        return value

    torch.save(swap(torch.load(path, weights_only=True)), path)
    return count


def test_the_planted_pickle_would_run(tmp_path):
    pickle.loads(planted(tmp_path / "ran"))  # what the tests below give to each command
    assert (tmp_path / "ran").exists()


CASES = [
    (VEC, [*VEC_TINY, "--env-id", "CartPole-v1", "--num-workers", "0"], 128),  # envs in the trainer
    (VEC, [*VEC_TINY, "--env-id", "Pendulum-v1", "--num-workers", "2"], 128),  # in workers
    pytest.param(ATARI, ATARI_TINY, 16, marks=pytest.mark.long),  # the emulators' own states
]


@pytest.mark.parametrize(("script", "args", "steps"), CASES, ids=["trainer", "workers", "atari"])
def test_a_crafted_checkpoint_runs_nothing_on_resume_or_evaluation(tmp_path, script, args, steps):
    out = run_script(script, [*args, "--total-timesteps", 3 * steps], tmp_path)
    assert out.returncode == 0, out.stderr
    checkpoint, marker = only_run_dir(tmp_path) / "checkpoint.pt", tmp_path / "ran"
    assert craft(checkpoint, marker) >= 1  # the envs' states hold bytes (arrays, the ALE's state)
    out = run_script(script, ["--resume", checkpoint, "--total-timesteps", 5 * steps], tmp_path)
    assert out.returncode == 0, out.stderr
    start = next(line for line in out.stdout.splitlines() if "resuming from iteration 3 " in line)
    assert "the envs in fresh episodes (its env states do not fit these envs: " in start, start
    out = run_script(script, ["--eval-checkpoint", checkpoint, "--eval-episodes", "1"], tmp_path)
    assert out.returncode == 0 and "eval: mean return" in out.stdout, out.stderr
    assert not marker.exists()


def test_a_sweep_rerun_over_a_crafted_checkpoint_runs_nothing(tmp_path):
    """Sweeps resume what they find in runs/: a shared runs folder is enough to plant a checkpoint."""
    flags = ["--env-ids", "CartPole-v1", "--seeds", "1", "--", *VEC_TINY, "--num-workers", "0", "--no-anneal-lr"]
    sweep = [sys.executable, "-m", "common.sweep", str(VEC), *flags, "--total-timesteps"]
    out = run_command([*sweep, "128"], tmp_path, extra_env={"PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stdout + out.stderr
    folder, marker = next((tmp_path / "runs").glob("CartPole-v1__*")), tmp_path / "ran"
    assert craft(folder / "checkpoint.pt", marker) >= 1
    out = run_command([*sweep, "256"], tmp_path, extra_env={"PYTHONPATH": str(REPO)})  # extends the run
    assert out.returncode == 0 and ": extend (from 128 to 256 steps" in out.stdout, out.stdout + out.stderr
    log = (tmp_path / "runs" / "sweep" / "CartPole-v1__ppo_vec__1.log").read_text()
    assert "the envs in fresh episodes (its env states do not fit" in log, log
    assert not marker.exists()


@pytest.mark.parametrize("flag", ["--resume", "--eval-checkpoint"])
def test_a_checkpoint_never_chooses_the_module_imported(tmp_path, flag):
    """A checkpoint of --env-id evilmod:Evil-v0, a module evilmod beside it: nothing imports it unless
    the command line names that env id itself."""
    (tmp_path / "evilmod.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w')\n")
    out = run_script(VEC, [*VEC_TINY, "--num-workers", "0", "--total-timesteps", "128"], tmp_path)
    assert out.returncode == 0, out.stderr
    checkpoint = only_run_dir(tmp_path) / "checkpoint.pt"
    state = torch.load(checkpoint, weights_only=True)
    state["args"]["env_id"] = "evilmod:Evil-v0"
    torch.save(state, checkpoint)
    out = run_script(VEC, [flag, checkpoint], tmp_path)
    assert out.returncode == 2 and out.stderr == (
        f"ppo_vec.py: error: {flag} {checkpoint} is of --env-id evilmod:Evil-v0, which imports evilmod: "
        "give --env-id evilmod:Evil-v0 to import it\n"
    )
    assert not (tmp_path / "ran").exists()
