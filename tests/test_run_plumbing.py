"""The run plumbing (common/run/), piece by piece: flag checks, run folders, progress, the ranks,
the way a run ends and the exit statuses."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import gymnasium as gym
import pytest
import torch

from common.run import errors, flags, progress, records
from common.run.cli import CommandLine
from common.run.errors import FlagError
from common.vecenv import layout
from tests.envs import HangsWhenBuilt, failing_factory
from tests.helpers import REPO, run_command, run_program, start_program

COMMAND_LINE = CommandLine(["s.py"], frozenset(), None)  # a command line that names no flag


@dataclasses.dataclass
class Flags:
    exp_name: str = "exp"
    env_id: str = "CartPole-v1"
    seed: int = 1
    gamma: float = 0.99
    num_envs: int = 4
    num_steps: int = 8
    target_kl: float | None = None


# ----------------------------------------------------------------------------------------------------
# flag checks
@pytest.mark.parametrize(
    ("changes", "rules", "message"),
    [
        ({"gamma": float("nan")}, [], "--gamma must be a finite number, got nan"),
        ({"target_kl": float("inf")}, [], "--target-kl must be a finite number, got inf"),
        ({"gamma": 1.5}, [], "--gamma must be in (0, 1], got 1.5"),
        ({"seed": -1}, [], "--seed must be in [0, 2**32), got -1"),
        ({"exp_name": "a/b"}, [], "--exp-name must be a plain name (no '/', not '.' or '..'), got a/b"),
        ({"exp_name": ".."}, [], "--exp-name must be a plain name"),
        ({"exp_name": "x" * 250}, [], "--exp-name must be at most 200 bytes (it names a folder with the env id"),
        ({"num_envs": 0}, [("num_envs", False, ">= 1")], "--num-envs must be >= 1, got 0"),
    ],
)
def test_check_flags_names_the_flag_and_what_is_allowed(changes, rules, message):
    with pytest.raises(FlagError) as info:
        flags.check(Flags(**changes), rules)
    assert str(info.value).startswith(message)


def test_check_flags_passes_good_flags_and_skips_fields_a_script_lacks():
    flags.check(Flags(), [("num_envs", True, ">= 1")])  # no learning_rate field: its rule is not applied


def test_the_words_of_a_command_line_are_checked_before_tyro_sees_them():
    """A bool flag given a value (CleanRL's old `--capture-video True`) and a word that names no flag
    are one line each, the latter with the flags it may have meant; the empty command line passes."""

    @dataclasses.dataclass
    class WithVideo:
        capture_video: bool = False
        num_envs: int = 4

    for argv in ([], ["--capture-video"], ["--no-capture-video", "--num-envs", "1"], ["--num_envs=2"]):
        flags.check_words(WithVideo, argv, "s.py")
    for argv in (["--capture-video", "True"], ["--num-envs", "1", "--capture-video=false"]):
        with pytest.raises(FlagError, match="--capture-video is a switch and takes no value"):
            flags.check_words(WithVideo, argv, "s.py")
    with pytest.raises(FlagError, match=r"^--num-env is not a flag of s.py: did you mean --num-envs\?$"):
        flags.check_words(WithVideo, ["--num-env", "3"], "s.py")
    with pytest.raises(FlagError, match=r"^--gpu is not a flag of s.py: python s.py --help lists them$"):
        flags.check_words(WithVideo, ["--gpu"], "s.py")
    assert flags.named_fields(WithVideo, ["--no-capture-video", "--num_envs=2", "3"]) == {"capture_video", "num_envs"}


def test_a_missing_package_is_named(monkeypatch):
    @dataclasses.dataclass
    class WithVideo:
        capture_video: bool = True

    monkeypatch.setattr(flags.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FlagError, match=r"--capture-video needs moviepy, which is not installed: pip install moviepy$"):
        flags.check(WithVideo(), [])
    flags.check(WithVideo(False), [])


def test_check_env_id(tmp_path, monkeypatch):
    flags.check_env_id("CartPole-v1")
    with pytest.raises(FlagError, match=r"'CartPol-v1' is not a registered gymnasium env; did you mean CartPole-v1"):
        flags.check_env_id("CartPol-v1")
    (tmp_path / "broken_envs.py").write_text("import numpy\nraise RuntimeError('missing licence file')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(FlagError) as info:
        flags.check_env_id("broken_envs:Thing-v0")  # the module's own error, not "did you mean"
    assert (
        str(info.value)
        == "--env-id broken_envs:Thing-v0: importing broken_envs failed (RuntimeError: missing licence file)"
    )
    with pytest.raises(
        FlagError,
        match=r"importing my_envs failed \(ModuleNotFoundError: No module named 'my_envs'\); "
        f"it is looked for in {os.getcwd()}, in the script's folder and on PYTHONPATH: run from the folder",
    ):
        flags.check_env_id("my_envs:MyEnv-v0")


def test_a_probe_that_cannot_start_says_its_own_error_not_the_envs(monkeypatch, tmp_path):
    """An import in the probe's own start that fails (a copy of the package broken): the line says
    the probe could not start, with its error, and does not blame the env."""
    shutil.copytree(REPO / "common", tmp_path / "common")
    broken = tmp_path / "common" / "vecenv" / "layout.py"
    broken.write_text(broken.read_text().replace("import Channel", "import no_such_name"))
    monkeypatch.setattr(layout, "_ROOT", str(tmp_path))  # the probe runs the broken copy
    with pytest.raises(FlagError) as info:
        flags.probe_env("CartPole-v1", lambda: gym.make("CartPole-v1"), 60, None)
    assert str(info.value).startswith(
        "--env-id CartPole-v1: the process that builds it to look at it could not start "
        "(the probe process ended (exit code 1: ImportError: cannot import name "
        "'no_such_name'"
    )


def test_probe_env_builds_the_env_elsewhere_and_says_why_it_cannot():
    found = flags.probe_env("CartPole-v1", lambda: gym.wrappers.FlattenObservation(gym.make("CartPole-v1")), 60, None)
    assert found["spaces"][0].shape == (4,) and found["spaces"][1] == gym.spaces.Discrete(2)
    with pytest.raises(FlagError, match=r"--env-id CartPole-v1 cannot be built here: RuntimeError: factory refused"):
        flags.probe_env("CartPole-v1", failing_factory, 60, None)
    with pytest.raises(FlagError, match=r"--env-id CartPole-v1: building the env did not finish within 1 s"):
        flags.probe_env("CartPole-v1", HangsWhenBuilt, 1.0, None)


# ----------------------------------------------------------------------------------------------------
# run folders
def test_run_dirs_are_unique_within_one_second(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(time, "time", lambda: 1_700_000_000.5)
    args = Flags(env_id="ALE/Breakout-v5")
    first, second, third = (records.make_run_dir(args, COMMAND_LINE, 10, 1) for _ in range(3))
    assert first.name == "ALE-Breakout-v5__exp__1__1700000000"
    assert [second.name, third.name] == [f"{first.name}-2", f"{first.name}-3"]
    assert all(path.is_dir() and path.parent.name == "runs" for path in (first, second, third))


def test_run_folder_is_one_line_where_it_cannot_be_made_and_records_the_flags(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run_dir = records.make_run_dir(Flags(), COMMAND_LINE, 10, 1)
    assert json.loads((run_dir / "args.json").read_text())["num_envs"] == 4
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    (tmp_path / "elsewhere" / "runs").write_text("a file where the runs go")
    with pytest.raises(errors.RunError, match=r"^cannot make the run folder in .*/runs \(a file of that name"):
        records.make_run_dir(Flags(), COMMAND_LINE, 10, 1)
    (tmp_path / "elsewhere" / "runs").unlink()
    read_only = tmp_path / "elsewhere"
    os.chmod(read_only, 0o500)  # root writes there anyway: an immutable folder stops root too
    chattr = subprocess.run(["chattr", "+i", str(read_only)], capture_output=True) if os.geteuid() == 0 else None
    immutable = chattr is not None and chattr.returncode == 0
    try:
        if os.access(read_only, os.W_OK) and not immutable:
            pytest.skip("this user writes anywhere and chattr is not at hand: no read-only folder to try")
        with pytest.raises(errors.RunError, match=r"cannot make the run folder in .* \((Permission denied|Operat)"):
            records.make_run_dir(Flags(), COMMAND_LINE, 10, 1)
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(read_only)], check=True)
        os.chmod(read_only, 0o700)


def test_progress_line_shows_elapsed_and_eta_as_hms_the_eta_once_it_means_something(monkeypatch, capsys):
    """The first iteration pays for start-up (the envs' first steps, the first update): the first line
    shows no ETA, later ones count from the end of the first."""
    now = [1000.0]
    monkeypatch.setattr(time, "time", lambda: now[0])
    line_of = progress.Progress(1_000_000, 10_000, True, [1.0, 2.0], {})
    now[0] += 60.0  # a slow first iteration of 2,500 steps
    line_of.log(progress.NoWriter(), 12_500, [], 0, {"env": 0.5})
    assert capsys.readouterr().out == (
        "global_step=12500/1000000 SPS=41 episodic_return=1.5 (last 2) elapsed=0:01:00 [env 0.50s]\n"
    )
    now[0] += 3700.0  # 370,000 steps since the first: 100 steps/s, 6175 s left
    line = line_of.line(382_500, {"env": 0.5, "update": 0.25})
    assert line == (
        "global_step=382500/1000000 SPS=99 episodic_return=1.5 (last 2) elapsed=1:02:40 ETA=1:42:55 "
        "[env 0.50s, update 0.25s]"
    )
    assert progress.hms(0) == "0:00:00" and progress.hms(86399) == "23:59:59"


def test_mean_over_ranks_is_the_same_on_every_rank(tmp_path):
    """Each rank holds a different local value; all must get their mean (what decides the early stop
    on every rank)."""
    (tmp_path / "ranks.py").write_text(
        "import os, torch, torch.distributed as dist\n"
        "from common.run.ranks import RankedRun\n"
        "dist.init_process_group('gloo')\n"
        "ranked = RankedRun.__new__(RankedRun)\n"
        "ranked.distributed, ranked.world_size = True, dist.get_world_size()\n"
        "mean = ranked.mean_over_ranks(torch.tensor([1.0 + 2.0 * dist.get_rank()])).item()\n"
        "os.write(1, f'{mean}\\n'.encode())  # one write: the ranks' lines do not interleave\n"
        "dist.destroy_process_group()\n"
    )
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "ranks.py"]
    out = run_command(cmd, tmp_path, timeout=120, extra_env={"PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["2.0", "2.0"]


# ----------------------------------------------------------------------------------------------------
# stop path
CLOSING = (
    r"prog.py: {}: {} of 100 steps in 0:00:\d\d \(\d+ SPS\), last-20 return n/a; "
    r"results in (runs/CartPole-v1__prog__1__\d+) "
)


@pytest.mark.parametrize(
    ("outcome", "status", "stderr"),
    [
        ("flag", 2, "prog.py: error: --thing must be > 0, got 0\n"),
        ("fail", 1, "prog.py: error: the disk is full\n"),
        ("done", 0, ""),
    ],
)
def test_exit_statuses_and_the_closing_line(tmp_path, outcome, status, stderr):
    out = run_program(tmp_path, "--outcome", outcome)
    assert (out.returncode, out.stderr.split("\n")[0] + "\n" if out.stderr else "") == (status, stderr), out.stderr
    # failed in iteration 4: the closing line names no checkpoint (the script's error saves none)
    if outcome == "fail":
        assert re.search(CLOSING.format("failed", 30) + r"\(tensorboard --logdir runs\)$", out.stderr.split("\n")[-2])
    if outcome == "done":  # the closing line, the summary, the final checkpoint
        closing = re.search(CLOSING.format("done", 100) + r".*; evaluate with: python prog.py --eval-", out.stdout)
        summary = json.loads((tmp_path / closing.group(1) / "summary.json").read_text())
        assert summary["status"] == "done" and summary["global_step"] == 100 and summary["checkpoint_iteration"] == 10


def test_a_bug_keeps_its_traceback_and_saves_nothing(tmp_path):
    out = run_program(tmp_path, "--outcome", "raise")
    assert out.returncode == 1 and "Traceback" in out.stderr and "ValueError: a bug keeps its traceback" in out.stderr
    assert re.search(CLOSING.format("failed", 30), out.stderr.splitlines()[-1])
    assert not list((tmp_path / "runs").glob("*/checkpoint.pt"))


def test_help_opens_with_the_description_and_the_commands(tmp_path):
    out = run_program(tmp_path, "--help")
    assert out.returncode == 0
    assert "A test program.\n" in out.stdout and "python prog.py --outcome wait" in out.stdout
    assert "More text" not in out.stdout


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_saves_then_exits_128_plus_its_number(tmp_path, sig):
    proc = start_program(tmp_path, "--outcome", "wait")
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 128 + sig
    closing = CLOSING.format(f"stopped by {signal.Signals(sig).name}", 30) + r"\(tensorboard --logdir runs\); "
    closing = re.fullmatch(closing + r"continue with: python prog.py --resume (\S+)\n", stderr)
    assert closing and torch.load(tmp_path / closing.group(2), weights_only=True)["iteration"] == 3
