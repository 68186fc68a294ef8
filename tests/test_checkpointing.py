"""common/run/checkpointing.py: atomic writes, reads that never run code, one-line refusals, snapshots whose label
matches their contents, the envs' statistics."""

from __future__ import annotations

import dataclasses
import errno
import os
import subprocess
import sys
import textwrap

import gymnasium as gym
import numpy as np
import pytest
import torch

from common.run import checkpointing, errors
from common.run.checkpointing import Checkpoints
from common.run.errors import FlagError, RunError
from tests.helpers import REPO

RNG = np.random.default_rng(0).bit_generator.state  # a generator's state, as the scripts snapshot it


@dataclasses.dataclass
class Flags:
    exp_name: str = "exp"
    env_id: str = "CartPole-v1"
    num_envs: int = 4


def test_checkpoint_round_trip(tmp_path):
    path = tmp_path / "checkpoint.pt"
    rng = [np.random.default_rng(3).bit_generator.state]
    state = {"script": "s.py", "args": {}, "model": {"w": torch.arange(4.0)}, "rng": rng}
    checkpointing.save_checkpoint(path, state)
    loaded = checkpointing.load_checkpoint(str(path), "--resume", "s.py")
    torch.testing.assert_close(loaded["model"]["w"], torch.arange(4.0))
    assert loaded["rng"] == state["rng"]
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]


class Unpicklable:
    def __reduce__(self):
        raise RuntimeError("cannot pickle this")


def test_a_failed_write_leaves_the_old_checkpoint_and_no_temp_file(tmp_path):
    path = tmp_path / "checkpoint.pt"
    checkpointing.save_checkpoint(path, {"script": "s.py", "value": torch.ones(3)})
    before = path.read_bytes()
    with pytest.raises(RunError, match=r"could not write .*checkpoint.pt \(cannot pickle this\); the previous file"):
        checkpointing.save_checkpoint(path, {"script": "s.py", "value": torch.zeros(3), "bad": Unpicklable()})
    with pytest.raises(RunError, match="holds NaN/Inf values"):
        checkpointing.save_checkpoint(path, {"script": "s.py", "value": torch.tensor([float("nan")])})
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]


def test_a_full_disk_leaves_the_old_checkpoint_and_no_temp_file(tmp_path):
    """A file size limit makes the write fail the way a full disk does (an OSError from write)."""
    code = textwrap.dedent(f"""
        import resource, signal, torch
        from common.run import checkpointing, errors
        path = {str(tmp_path / "checkpoint.pt")!r}
        checkpointing.save_checkpoint(path, {{"script": "s.py", "value": torch.ones(10)}})
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))
        try:
            checkpointing.save_checkpoint(path, {{"script": "s.py", "value": torch.zeros(1_000_000)}})
        except errors.RunError as exc:
            print(exc)
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "could not write" in out.stdout and "the previous file, if any, is unchanged" in out.stdout
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]
    assert torch.load(tmp_path / "checkpoint.pt", weights_only=True)["value"].tolist() == [1.0] * 10


def test_a_full_disk_is_said_so(tmp_path, monkeypatch):
    path = tmp_path / "checkpoint.pt"
    checkpointing.save_checkpoint(path, {"script": "s.py", "value": torch.ones(3)})

    def full(fd, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(checkpointing.os, "write", full)
    with pytest.raises(RunError) as info:
        checkpointing.save_checkpoint(path, {"script": "s.py", "value": torch.zeros(3)})
    expected = f"could not write {path} (no space left on device); the previous file, if any, is unchanged"
    assert str(info.value) == expected
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]


def test_unreadable_or_foreign_files_are_one_line_naming_the_flag(tmp_path):
    good = tmp_path / "good.pt"
    checkpointing.save_checkpoint(good, {"script": "ppo_vec.py", "iteration": 1})
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    text = tmp_path / "notes.txt"
    text.write_text("hello\n")
    plain = tmp_path / "plain.pt"
    torch.save(torch.ones(2), plain)
    cases = {
        str(tmp_path / "missing.pt"): "no such file",
        str(text): "not a checkpoint (not a file that torch.save wrote)",
        str(truncated): "not a readable checkpoint (",
        str(plain): "is not a checkpoint of this project",
        str(good): "was written by ppo_vec.py; ppo_atari_multigpu.py reads only its own checkpoints",
    }
    for path, message in cases.items():
        with pytest.raises(FlagError) as info:
            checkpointing.load_checkpoint(path, "--eval-checkpoint", "ppo_atari_multigpu.py")
        assert str(info.value).startswith(f"--eval-checkpoint {path}") and message in str(info.value), str(info.value)
        assert "\n" not in str(info.value)


def test_resume_refuses_other_ranks_and_says_when_a_run_is_finished(tmp_path):
    model = torch.nn.Linear(2, 1)
    checkpoints = Checkpoints("s.py", Flags(), {"model": model}, steps_per_iteration=32, world_size=2)
    checkpoints.snapshot(5, rng=[RNG, None])
    path = checkpoints.save(tmp_path / "checkpoint.pt")
    one_rank = Checkpoints("s.py", Flags(), {"model": model}, steps_per_iteration=16, world_size=1)
    with pytest.raises(FlagError, match=r"was written with 2 ranks; resume it with 2, not 1"):
        one_rank.resume(str(path), num_iterations=10)
    with pytest.raises(errors.Finished, match="finished its 5 iterations already"):
        checkpoints.resume(str(path), num_iterations=5)
    with torch.no_grad():
        model.weight.zero_()
    checkpoint = checkpoints.resume(str(path), num_iterations=10)
    assert checkpoint["iteration"] == 5 and checkpoint["global_step"] == 160 and model.weight.abs().sum() > 0
    other = Checkpoints("s.py", Flags(), {"model": torch.nn.Linear(3, 1)}, 32, 2)
    with pytest.raises(FlagError, match=r"does not fit this run's model: weight has shape \(1, 2\) there, \(1, 3\)"):
        other.resume(str(path), 10)
    newer = Checkpoints("s.py", Flags(), {"model": model, "scaler": torch.nn.Linear(1, 1)}, 32, 2)
    with pytest.raises(FlagError, match=r"holds no scaler: not a whole checkpoint of s.py \(an older version"):
        newer.resume(str(path), 10)


@pytest.mark.parametrize("entry", ["iteration", "rng", "scaler"])
def test_a_checkpoint_missing_an_entry_is_one_line(tmp_path, entry):
    modules = {"model": torch.nn.Linear(2, 1), "scaler": torch.nn.Linear(1, 1)}
    checkpoints = Checkpoints("s.py", Flags(), modules, 32)
    checkpoints.snapshot(5, rng=[RNG])
    path = tmp_path / "checkpoint.pt"
    state = dict(checkpoints.last)
    del state[entry]
    checkpointing.save_checkpoint(path, state)
    with pytest.raises(FlagError) as info:
        checkpoints.resume(str(path), 10)
    assert str(info.value) == (f"--resume {path} holds no {entry}: not a whole checkpoint of s.py (an older version, "
                               "or a file edited since)")  # fmt: skip


def test_a_save_writes_the_last_snapshot_whatever_the_weights_are_doing(tmp_path):
    """A stop in the middle of an update saves the state after the last whole iteration, labelled as such: the
    weights being changed are not what is written."""
    model = torch.nn.Linear(2, 1)
    checkpoints = Checkpoints("s.py", Flags(), {"model": model}, 32)
    checkpoints.snapshot(4, rng=[RNG])
    weights_after_4 = model.weight.detach().clone()
    with torch.no_grad():
        model.weight.add_(1.0)  # iteration 5's update, under way
    saved = torch.load(checkpoints.save(tmp_path / "checkpoint.pt"), weights_only=True)
    assert saved["iteration"] == 4 and torch.equal(saved["model"]["weight"], weights_after_4)
    checkpoints.snapshot(5, rng=[RNG])
    saved = torch.load(checkpoints.save(tmp_path / "checkpoint.pt", env_states=[b"envs"]), weights_only=True)
    assert saved["iteration"] == 5 and torch.equal(saved["model"]["weight"], weights_after_4 + 1)
    assert checkpointing.env_states_of(saved) == b"envs"


def test_evaluating_another_env_than_the_checkpoints_is_refused(tmp_path, monkeypatch):
    checkpoints = Checkpoints("s.py", Flags(), {"model": torch.nn.Linear(2, 1)}, 32)
    checkpoints.snapshot(1, rng=[RNG])
    path = str(checkpoints.save(tmp_path / "checkpoint.pt"))
    monkeypatch.setattr(sys, "argv", ["s.py", "--eval-checkpoint", path, "--env-id", "Acrobot-v1"])
    with pytest.raises(FlagError, match=r"holds a policy for CartPole-v1, not --env-id Acrobot-v1: drop --env-id"):
        checkpointing.load_for_eval(path, "s.py", Flags, "Acrobot-v1")
    monkeypatch.setattr(sys, "argv", ["s.py", "--eval-checkpoint", path])  # the default env id: the saved one is used
    assert checkpointing.load_for_eval(path, "s.py", Flags, "Acrobot-v1")[1].env_id == "CartPole-v1"


def test_evaluate_counts_whole_episodes_only():
    """An episode ending without 'episode' info (a life lost, in Atari) does not count: the game goes on."""

    class LivesEnv(gym.Env):
        observation_space, action_space = gym.spaces.Discrete(1), gym.spaces.Discrete(1)

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self.t = getattr(self, "t", 0)
            return 0, {}

        def step(self, action):
            self.t += 1
            info = {"episode": {"r": float(self.t)}} if self.t % 3 == 0 else {}
            return 0, 1.0, True, False, info

    assert checkpointing.evaluate(LivesEnv(), lambda obs: 0, episodes=2, seed=0) == [3.0, 6.0]
