"""Checkpoints: atomic writes, reads that never run code, one-line refusals, a run's state kept at
its iteration boundaries and put back by a resume, evaluation."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import gymnasium as gym
import numpy as np
import pytest
import torch

from common.run import Run, flags, records
from common.run import run as run_module
from common.run.cli import CommandLine
from common.run.errors import Finished, FlagError, RunError
from common.run.stops import Stopped, StopRequest
from common.sweep.runs import parse_flags
from tests.helpers import REPO

RNG = np.random.default_rng(0).bit_generator.state  # a generator's state, as a run keeps it


@dataclasses.dataclass
class Flags:
    exp_name: str = "exp"
    env_id: str = "CartPole-v1"
    seed: int = 1
    learning_rate: float = 2.5e-4
    gamma: float = 0.99
    total_timesteps: int = 320
    num_envs: int = 4
    num_steps: int = 8
    num_minibatches: int = 1
    checkpoint_interval: int = 0
    num_workers: int | None = 0
    max_restarts: int = 0
    step_timeout: float | None = None
    save_model: bool = False
    capture_video: bool = False
    track: bool = False
    resume: str | None = None
    eval_checkpoint: str | None = None
    eval_episodes: int = 10


def write_checkpoint(path, **changes) -> str:
    """A checkpoint after 5 iterations of 32 steps of a run of this file (Flags, a Linear(2, 1),
    a generator)."""
    state = {
        "script": "test_checkpointing.py",
        "args": dataclasses.asdict(Flags()),
        "world_size": 1,
        "iteration": 5,
        "global_step": 160,
        "model": torch.nn.Linear(2, 1).state_dict(),
        "rng": [RNG],
        "env_states": [None],
        "torch_rng": [torch.get_rng_state()],
        "recent_returns": [],
    } | changes
    # None: absent
    records.save_checkpoint(path, {name: value for name, value in state.items() if value is not None})
    return str(path)


def run_of(monkeypatch, *argv: str) -> Run:
    """The Run this file's main would make of its command line argv (in a folder of its own:
    monkeypatch.chdir)."""
    command_line = CommandLine(["test_checkpointing.py", *argv], flags.named_fields(Flags, list(argv)), StopRequest())
    return Run(Flags(**parse_flags(list(argv), dataclasses.asdict(Flags()))), command_line)


def start(run: Run, **state) -> None:
    """run.start as a script's main calls it, for iterations of 32 steps; raises what it raises."""
    with run.start(torch.device("cpu"), run.args.total_timesteps // 32, 32, state):
        pass


def test_checkpoint_round_trip(tmp_path):
    path = tmp_path / "checkpoint.pt"
    rng = [np.random.default_rng(3).bit_generator.state]
    state = {"script": "s.py", "args": {}, "model": {"w": torch.arange(4.0)}, "rng": rng, "env_states": [b"\0envs"]}
    records.save_checkpoint(path, state)
    loaded = records.load_checkpoint(str(path), "--resume", "s.py")
    torch.testing.assert_close(loaded["model"]["w"], torch.arange(4.0))
    assert loaded["rng"] == state["rng"] and loaded["env_states"] == [b"\0envs"]
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]


class Unpicklable:
    def __reduce__(self):
        raise RuntimeError("cannot pickle this")


def test_a_failed_write_leaves_the_old_checkpoint_and_no_temp_file(tmp_path):
    path = tmp_path / "checkpoint.pt"
    records.save_checkpoint(path, {"script": "s.py", "value": torch.ones(3)})
    before = path.read_bytes()
    with pytest.raises(RunError, match=r"could not write .*checkpoint.pt \(cannot pickle this\); the previous file"):
        records.save_checkpoint(path, {"script": "s.py", "value": torch.zeros(3), "bad": Unpicklable()})
    with pytest.raises(RunError, match="holds NaN/Inf values"):
        records.save_checkpoint(path, {"script": "s.py", "value": torch.tensor([float("nan")])})
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]


def test_a_full_disk_leaves_the_old_checkpoint_and_no_temp_file(tmp_path):
    """A file size limit makes the write fail the way a full disk does (an OSError from write)."""
    code = textwrap.dedent(f"""
        import resource, signal, torch
        from common.run import errors, records
        path = {str(tmp_path / "checkpoint.pt")!r}
        records.save_checkpoint(path, {{"script": "s.py", "value": torch.ones(10)}})
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))
        try:
            records.save_checkpoint(path, {{"script": "s.py", "value": torch.zeros(1_000_000)}})
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
    records.save_checkpoint(path, {"script": "s.py", "value": torch.ones(3)})

    def full(fd):  # the data reaches the disk, which is full
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(records.os, "fsync", full)
    with pytest.raises(RunError) as info:
        records.save_checkpoint(path, {"script": "s.py", "value": torch.zeros(3)})
    expected = f"could not write {path} (no space left on device); the previous file, if any, is unchanged"
    assert str(info.value) == expected
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]


def test_unreadable_or_foreign_files_are_one_line_naming_the_flag(tmp_path):
    good = tmp_path / "good.pt"
    records.save_checkpoint(good, {"script": "ppo_vec.py", "iteration": 1})
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
            records.load_checkpoint(path, "--eval-checkpoint", "ppo_atari_multigpu.py")
        assert str(info.value).startswith(f"--eval-checkpoint {path}") and message in str(info.value), str(info.value)
        assert "\n" not in str(info.value)


def test_resume_refuses_other_ranks_other_sizes_and_says_when_a_run_is_finished(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = write_checkpoint(
        tmp_path / "checkpoint.pt",
        world_size=2,
        rng=[RNG, RNG],
        env_states=[None, None],
        torch_rng=[torch.get_rng_state()] * 2,
    )
    with pytest.raises(FlagError, match=r"was written with 2 ranks; resume it with 2, not 1"):
        start(run_of(monkeypatch, "--resume", path), model=torch.nn.Linear(2, 1), rng=np.random.default_rng())
    path = write_checkpoint(tmp_path / "checkpoint.pt")
    with pytest.raises(Finished, match=r"that run finished its 5 iterations already \(--total-timesteps 96 asks for 3"):
        start(run_of(monkeypatch, "--resume", path, "--total-timesteps", "96"), model=torch.nn.Linear(2, 1))
    message = r"does not fit this run's model \(Linear: size mismatch for weight: copying a param with shape "
    with pytest.raises(FlagError, match=message + r"torch\.Size\(\[1, 2\]\) from checkpoint, .+\): another env, or"):
        start(run_of(monkeypatch, "--resume", path), model=torch.nn.Linear(3, 1))
    with pytest.raises(FlagError, match=r"holds no scaler: not a whole checkpoint of test_checkpointing.py \(an older"):
        start(run_of(monkeypatch, "--resume", path), model=torch.nn.Linear(2, 1), scaler=torch.nn.Linear(1, 1))
    assert not (tmp_path / "runs").exists()


def test_a_torch_generator_resumes_and_torchs_own_may_be_absent(tmp_path, monkeypatch):
    """A torch.Generator given to run.start comes back as saved; a checkpoint without torch's own
    generator (written on another kind of device: a CUDA run's has its CUDA generator, a CPU run's
    not) still resumes."""
    monkeypatch.chdir(tmp_path)
    saved = torch.Generator().manual_seed(3)
    path = write_checkpoint(tmp_path / "checkpoint.pt", rng=[saved.get_state()], torch_rng=None)
    restored = torch.Generator()
    start(run_of(monkeypatch, "--resume", path), model=torch.nn.Linear(2, 1), rng=restored)
    assert torch.equal(restored.get_state(), saved.get_state())


def test_a_resume_continues_with_the_runs_own_flags(tmp_path, monkeypatch):
    args = dataclasses.asdict(Flags(learning_rate=1e-3, gamma=0.95, checkpoint_interval=2))
    path = write_checkpoint(tmp_path / "checkpoint.pt", args=args)
    assert run_of(monkeypatch, "--resume", path).args == Flags(
        learning_rate=1e-3, gamma=0.95, checkpoint_interval=2, resume=path
    )
    changed = run_of(
        monkeypatch, "--resume", path, "--total-timesteps", "5000", "--checkpoint-interval", "0", "--gamma", "0.95"
    ).args
    assert (changed.total_timesteps, changed.checkpoint_interval, changed.gamma) == (5000, 0, 0.95)
    with pytest.raises(FlagError) as info:
        run_of(monkeypatch, "--resume", path, "--learning-rate", "0.002", "--seed", "4")
    assert str(info.value) == (
        f"--resume {path} continues a run trained with --seed 1 (not 4), --learning-rate 0.001 "
        "(not 0.002): a run's results come from one set of flags; drop those flags, or start a "
        "new run"
    )


def test_a_boundary_is_kept_once_fifty_times_what_keeping_costs_has_passed(tmp_path, monkeypatch):
    """Keeping the state costs under 2% of the time: it is kept at the first two boundaries, at those
    where a save is due, and once KEEP_EVERY times what the last keeping took has passed; a stop saves
    the state last kept (run.last), labelled with its iteration."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(run_module, "KEEP_EVERY", 1e9)  # none kept for time's sake in this test
    run = run_of(monkeypatch, "--checkpoint-interval", "3")
    with run.start(torch.device("cpu"), 10, 32, {"model": torch.nn.Linear(2, 1)}):
        for iteration in run.iterations():
            # 0 and 1 kept (the first keeping pays for what is done once, so the second is timed too), 2
            # not, 3 for its save
            assert run.last["iteration"] == {1: 0, 2: 1, 3: 1}.get(iteration, 3)
            if iteration == 6:
                break
        assert run.keeping > 0
        run.kept_at = time.perf_counter() - 1.0
        monkeypatch.setattr(run_module, "KEEP_EVERY", 50)
        run.keeping = 0.019  # 50 x 0.019 s < 1 s: keep
        assert run._keep_due()
        run.keeping = 0.021
        assert not run._keep_due()


def test_a_save_writes_the_state_of_the_last_boundary_whatever_the_weights_are_doing(tmp_path, monkeypatch):
    """A stop in the middle of an update saves the state after the last whole iteration, labelled as
    such, and the summary names the checkpoint on disk when a save fails."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(run_module, "KEEP_EVERY", 0)  # every boundary kept, however short
    model, rng = torch.nn.Linear(2, 1), np.random.default_rng(0)
    run = run_of(monkeypatch)
    with run.start(torch.device("cpu"), 10, 32, {"model": model, "rng": rng}):
        for iteration in run.iterations():  # before iteration 3: the state after 2 is kept
            if iteration == 3:
                break
            with torch.no_grad():
                model.weight.add_(1.0)
            rng.random()
        after_2, state_2, torch_2 = (model.weight.detach().clone(), rng.bit_generator.state, torch.get_rng_state())
        with torch.no_grad():
            model.weight.add_(1.0)  # iteration 3's update, under way
        rng.random(), torch.rand(3)  # (torch's own generator, as dropout draws from it: kept without asking)
        run.save()
        saved = torch.load(run.dir / "checkpoint.pt", weights_only=True)
        assert saved["iteration"] == 2 and saved["global_step"] == 64 and saved["rng"] == [state_2]
        assert torch.equal(saved["torch_rng"][0], torch_2)
        assert torch.equal(saved["model"]["weight"], after_2)
        run.last = dict(run.last, iteration=3)

        def full(*args):
            raise OSError(errno.ENOSPC, "No space left on device")

        replace = os.replace
        monkeypatch.setattr(os, "replace", full)
        with pytest.raises(RunError, match="no space left on device"):
            run.save()
        monkeypatch.setattr(os, "replace", replace)
        assert run._summarize("stopped by SIGTERM")["checkpoint_iteration"] == 2


def test_evaluating_another_env_than_the_checkpoints_is_refused(tmp_path, monkeypatch):
    path = write_checkpoint(tmp_path / "checkpoint.pt")
    with pytest.raises(FlagError, match=r"holds a policy for CartPole-v1, not --env-id Acrobot-v1: drop --env-id"):
        run_of(monkeypatch, "--eval-checkpoint", path, "--env-id", "Acrobot-v1")
    assert run_of(monkeypatch, "--eval-checkpoint", path).args.env_id == "CartPole-v1"  # the run's own env


def test_evaluate_counts_whole_episodes_only(tmp_path, monkeypatch):
    """An episode ending without 'episode' info (a life lost, in Atari) does not count: the game goes on."""
    args = dataclasses.asdict(Flags(env_id="tests.envs:Lives-v0"))
    path = write_checkpoint(tmp_path / "checkpoint.pt", args=args)
    run = run_of(monkeypatch, "--eval-checkpoint", path, "--eval-episodes", "2", "--env-id", "tests.envs:Lives-v0")
    make_env = lambda args, idx, run_dir: lambda: gym.make(args.env_id)  # noqa: E731
    run.probe(make_env)
    model = torch.nn.Linear(2, 1)
    run.load(model=model)
    assert run.evaluate(lambda obs: np.zeros(1, np.int64), make_env) == [3.0, 6.0]
    assert torch.equal(model.weight, torch.load(path, weights_only=True)["model"]["weight"])  # loaded from it


def resumed(tmp_path, monkeypatch, path) -> None:
    """Starts a resume of the checkpoint at `path` as this file's main would."""
    start(run_of(monkeypatch, "--resume", str(path)), model=torch.nn.Linear(2, 1), rng=np.random.default_rng())


def test_the_summary_names_the_checkpoint_on_disk(tmp_path, monkeypatch):
    """--resume given an older copy of a run's checkpoint, stopped before it saves anything: the
    summary names the iteration of the checkpoint.pt on disk (what a rerun resumes), not the copy's."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run").mkdir()
    write_checkpoint(tmp_path / "run" / "checkpoint.pt", iteration=8, global_step=256)
    old = write_checkpoint(tmp_path / "run" / "old.pt", iteration=2, global_step=64)
    state = {"model": torch.nn.Linear(2, 1), "rng": np.random.default_rng()}
    with pytest.raises(Stopped), run_of(monkeypatch, "--resume", old).start(torch.device("cpu"), 10, 32, state):
        raise Stopped(signal.SIGINT)  # as a safe point raises it, before the first boundary
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "stopped by SIGINT" and summary["checkpoint_iteration"] == 8


def test_a_resume_of_a_run_that_trained_all_its_iterations_marks_it_done(tmp_path, monkeypatch):
    """Its summary said stopped (during its final evaluation, by an older version): resumed, nothing is
    left to do, and the summary says done."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run").mkdir()
    path = write_checkpoint(tmp_path / "run" / "checkpoint.pt", iteration=10, global_step=320)
    records.write_json(tmp_path / "run" / "summary.json", {"status": "stopped by SIGINT", "global_step": 320})
    with pytest.raises(Finished, match="that run finished its 10 iterations already; nothing to do"):
        resumed(tmp_path, monkeypatch, path)
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["status"] == "done"
    assert not (tmp_path / "run" / ".lock").exists()
