"""A run folder is the truth: one writer at a time, the flags the run was trained with, resumes that
continue the run they name, and sweeps and reports that show only what ran."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch.utils.tensorboard import SummaryWriter

from common.run import records, stops
from common.run.cli import CommandLine
from common.run.errors import FlagError
from common.sweep import report, runs
from tests.helpers import (
    REPO,
    VEC_TINY,
    alive,
    only_run_dir,
    read_scalars,
    run_command,
    run_script,
    spawn,
    start_training,
)

VEC = REPO / "ppo_vec.py"

TINY = [*VEC_TINY, "--num-workers", "0"]  # in-process: the fastest run there is


@dataclasses.dataclass
class Flags:
    exp_name: str = "exp"
    env_id: str = "CartPole-v1"
    seed: int = 1
    learning_rate: float = 2.5e-4
    gamma: float = 0.99
    norm_obs: bool = True
    anneal_lr: bool = True
    total_timesteps: int = 1000
    checkpoint_interval: int = 0
    device_ids: list[int] = dataclasses.field(default_factory=list)
    resume: str | None = None


# -------------------------------------------------------------------------------------------------
# a run's identity
def write_folder(runs_dir, name, given=None, status="done", global_step=1000, steps_per_iteration=None, **flags):
    """A run folder as a script leaves it (its seed the one its name says, given as a sweep gives
    it): args.json (flags, defaults, what its command line gave), summary.json, a checkpoint file."""
    folder = runs_dir / name
    folder.mkdir(parents=True)
    flags["seed"] = int(name.split("__")[2])
    given = sorted(flags) if given is None else [*given, "seed"]
    record = {
        "script": "s.py",
        **dataclasses.asdict(Flags(**flags)),
        "defaults": dataclasses.asdict(Flags()),
        "given": given,
        "steps_per_iteration": steps_per_iteration,
        "resumes": [],
    }
    records.write_json(folder / "args.json", record)
    records.write_json(folder / "summary.json", {"status": status, "global_step": global_step, "last_step": 1000})
    (folder / "checkpoint.pt").write_bytes(b"")
    return folder


def test_flags_are_read_as_the_script_would_read_them():
    like = dataclasses.asdict(Flags())
    words = [
        "--learning-rate",
        "1e-3",
        "--gamma=0.95",
        "--no-norm-obs",
        "--device-ids",
        "0",
        "1",
        "--seed",
        "3",
        "--resume",
        "None",
        "--unknown",
        "x",
    ]
    assert runs.parse_flags(words, like) == {
        "learning_rate": 1e-3,
        "gamma": 0.95,
        "norm_obs": False,
        "device_ids": [0, 1],
        "seed": 3,
        "resume": None,
    }


def test_a_sweep_reuses_a_run_only_if_it_was_asked_for_the_same_flags(tmp_path):
    runs_dir = tmp_path / "runs"
    run = runs.Run(
        "s.py", "CartPole-v1", 1, "exp", ["--total-timesteps", "500", "--learning-rate", "1e-3"], str(tmp_path)
    )
    assert run.command()[1] == "start"
    write_folder(runs_dir, "CartPole-v1__exp__1__1", given=["total_timesteps"], total_timesteps=500_000)
    cmd, what = run.command()  # the default rate there: a new run beside it, and why
    assert cmd and what == (
        "start (a new run: CartPole-v1__exp__1__1 was made with other flags: --learning-rate "
        "0.00025 there, 0.001 here, --total-timesteps 500000 (--anneal-lr: the learning rate "
        "falls over all of them) there, 500 here)"
    )
    made = write_folder(
        runs_dir,
        "CartPole-v1__exp__1__2",
        learning_rate=1e-3,
        total_timesteps=500,
        norm_obs=False,
        checkpoint_interval=5,
        given=["learning_rate", "total_timesteps", "checkpoint_interval"],
    )
    # norm_obs false as it took effect (not asked), another --checkpoint-interval (tolerated): the same run
    assert run.folder() == made and run.command()[1] == "finished before: skipped"
    records.write_json(made / "summary.json", {"status": "stopped by SIGTERM", "global_step": 96})
    assert run.command() == ([*run.command()[0][:-2], "--resume", str(made / "checkpoint.pt")], "resume")
    records.hold(made / records.LOCK)  # a live process writes it
    assert run.command() == ([], f"running in process {os.getpid()}: skipped")


def test_a_sweep_reuses_a_run_of_another_length_only_if_it_becomes_the_run_asked(tmp_path):
    """With --anneal-lr the learning rate falls over all of a run's iterations: a run of other
    iterations, or one a resume stretched, is another run. Without a schedule, a run not past the
    steps asked is resumed or extended to them. Totals that make the same whole iterations (100
    steps each here) are the same run."""
    runs_dir = tmp_path / "runs"

    def sweep(total, *flags):
        return runs.Run("s.py", "CartPole-v1", 1, "exp", ["--total-timesteps", str(total), *flags], str(tmp_path))

    annealed = write_folder(
        runs_dir, "CartPole-v1__exp__1__1", total_timesteps=500, global_step=500, steps_per_iteration=100
    )
    assert sweep(500).command()[1] == sweep(550).command()[1] == "finished before: skipped"  # 5 iterations
    for total in (250, 800):  # neither a shorter nor a longer run is the one that finished
        assert sweep(total).folder() is None
        assert sweep(total).command()[1] == (
            "start (a new run: CartPole-v1__exp__1__1 was made with other flags: "
            "--total-timesteps 500 (--anneal-lr: "
            f"the learning rate falls over all of them) there, {total} here)"
        )
    saved = records.read_json(annealed / "args.json")
    # its 5 iterations kept
    saved["resumes"] = [{"from_step": 300, "changed": {"total_timesteps": [500, 550]}}]
    records.write_json(annealed / "args.json", saved)
    assert sweep(500).folder() == annealed
    saved["total_timesteps"] = 800  # a later resume made it 8 iterations long
    saved["resumes"].append({"from_step": 500, "changed": {"total_timesteps": [550, 800]}})
    records.write_json(annealed / "args.json", saved)
    assert sweep(800).folder() is None and "--total-timesteps 550 made 800 by a resume" in sweep(800).command()[1]

    plain = write_folder(
        runs_dir,
        "CartPole-v1__exp__1__2",
        total_timesteps=500,
        global_step=500,
        anneal_lr=False,
        steps_per_iteration=100,
    )
    cmd, what = sweep(800, "--no-anneal-lr").command()
    assert (cmd[-2:], what) == (
        ["--resume", str(plain / "checkpoint.pt")],
        "extend (from 500 to 800 steps: no schedule spans it)",
    )
    assert sweep(550, "--no-anneal-lr").command()[1] == "finished before: skipped"  # no more whole iterations
    assert sweep(250, "--no-anneal-lr").folder() is None  # past step 250: not the 250-step run
    assert "--total-timesteps 500 (at step 500) there, 250 here" in sweep(250, "--no-anneal-lr").command()[1]
    records.write_json(plain / "summary.json", {"status": "stopped by SIGTERM", "global_step": 200})
    assert sweep(250, "--no-anneal-lr").command() == (
        [*cmd[:-5], "--total-timesteps", "250", "--no-anneal-lr", "--resume", str(plain / "checkpoint.pt")],
        "resume",
    )


def test_a_run_whose_args_json_does_not_say_what_it_was_asked_for_is_never_reused(tmp_path):
    """A run folder from before args.json recorded the defaults and the flags given matches nothing: a
    new run."""
    old = write_folder(tmp_path / "runs", "CartPole-v1__exp__1__1", total_timesteps=500, global_step=500)
    saved = records.read_json(old / "args.json")
    records.write_json(old / "args.json", {k: v for k, v in saved.items() if k not in ("defaults", "given")})
    run = runs.Run(
        "s.py", "CartPole-v1", 1, "exp", ["--total-timesteps", "1280", "--learning-rate", "0.001"], str(tmp_path)
    )
    assert run.folder() is None
    assert run.command()[1] == (
        "start (a new run: CartPole-v1__exp__1__1 has no args.json telling what it was asked for)"
    )


def test_a_run_of_other_ranks_or_a_start_that_saved_nothing_is_not_the_run_asked(tmp_path):
    """A run made under torchrun with 2 ranks has other iterations than a plain one, and resumes
    only with 2 ranks: another run. A folder a killed start left before training is removed, and its
    run starts anew (one folder); one that trained and saved nothing is kept beside the new run;
    records edited by hand (a string where a number was) are not read as numbers."""
    runs_dir = tmp_path / "runs"
    ranked = write_folder(runs_dir, "CartPole-v1__exp__1__1", given=["total_timesteps"], total_timesteps=1000)
    records.write_json(ranked / "args.json", records.read_json(ranked / "args.json") | {"world_size": 2})
    run = runs.Run(str(tmp_path / "s.py"), "CartPole-v1", 1, "exp", ["--total-timesteps", "1000"], str(tmp_path))
    assert run.command()[1] == (
        "start (a new run: CartPole-v1__exp__1__1 was made with other flags: torchrun ranks 2 there, 1 here)"
    )
    records.write_json(
        ranked / "args.json",
        records.read_json(ranked / "args.json")
        | {"world_size": 1, "steps_per_iteration": "100", "total_timesteps": "1000"},
    )
    assert run.command()[1].startswith(
        "start (a new run: CartPole-v1__exp__1__1 was made with other flags: --total-timesteps not recorded"
    )
    records.write_json(ranked / "args.json", records.read_json(ranked / "args.json") | {"total_timesteps": 1000})
    (ranked / "checkpoint.pt").unlink()
    (ranked / "events.out.tfevents.1").write_bytes(b"")  # what a start stopped before training leaves
    records.write_json(ranked / "summary.json", {"status": "stopped by SIGTERM", "global_step": 0})
    (tmp_path / "s.py").write_text("")  # the script: it does nothing, and ends
    outcome = runs.RunJob()(run)
    assert outcome["did"] == "start (its earlier start, CartPole-v1__exp__1__1, trained nothing: removed)"
    assert outcome["exit"] == 0 and not ranked.exists()
    trained = write_folder(runs_dir, "CartPole-v1__exp__1__2", given=["total_timesteps"], total_timesteps=1000)
    (trained / "checkpoint.pt").unlink()
    (trained / "events.out.tfevents.2").write_bytes(b"")
    for summary in ({"status": "failed", "global_step": 300}, {"status": "failed", "global_step": "300"}, None):
        # a bug ended it; a summary edited by hand; a SIGKILL
        (trained / "summary.json").unlink(missing_ok=True)
        if summary is not None:
            records.write_json(trained / "summary.json", summary)
        assert run.command()[1] == "start (a new run: its earlier start logged but saved nothing)"


def test_one_writer_per_run_folder(tmp_path):
    assert runs.lock_holder(tmp_path / records.LOCK) is None
    records.hold(tmp_path / records.LOCK)
    assert runs.lock_holder(tmp_path / records.LOCK) == os.getpid()
    with pytest.raises(FlagError, match=rf"{tmp_path} is being written by process {os.getpid()}: a run has one "):
        records.hold(tmp_path / records.LOCK)  # another open file: refused, even in the same process


def write_events(folder, steps_logged, returns=(1.0,) * 20):
    writer = SummaryWriter(str(folder))
    for i, value in enumerate(returns):
        writer.add_scalar("charts/episodic_return", value, i + 1)
    for step in steps_logged:
        writer.add_scalar("losses/value_loss", 0.0, step)
    writer.close()


def test_the_report_averages_only_finished_readable_runs_and_names_the_others(tmp_path):
    runs_dir = tmp_path / "runs"
    ok = write_folder(runs_dir, "CartPole-v1__exp__1__1", learning_rate=1e-3)
    write_events(ok, [500, 1000], returns=[100.0] * 20)
    truncated = write_folder(runs_dir, "CartPole-v1__exp__2__1", learning_rate=1e-3)
    write_events(truncated, [500], returns=[7.0] * 20)  # its events end halfway: a damaged file
    stopped = write_folder(
        runs_dir, "CartPole-v1__exp__3__1", learning_rate=1e-3, status="stopped by SIGTERM", global_step=460
    )
    write_events(stopped, [460], returns=[3.0] * 20)
    # other flags: not this sweep's run
    other = write_folder(runs_dir, "CartPole-v1__exp__5__1", learning_rate=0.5)
    write_events(other, [1000], returns=[-50.0] * 20)
    flags = ["--learning-rate", "1e-3"]
    asked = [runs.Run("s.py", "CartPole-v1", seed, "exp", flags, str(tmp_path)) for seed in (1, 2, 3, 4, 5)]
    text = "\n".join(report.report(asked, tmp_path / "report"))
    assert "| CartPole-v1 | 1 | 100.0 +- 0.0 | 100.0 [100.0, 100.0] | 1 | 1000 | --learning-rate 0.001 |" in text
    assert "- CartPole-v1 seed 2: unreadable: its events end at step 500, its summary at 1000" in text
    assert "- CartPole-v1 seed 3: unfinished: stopped by SIGTERM at 46%" in text
    assert "- CartPole-v1 seed 4: missing\n" in text
    assert (
        "- CartPole-v1 seed 5: missing; CartPole-v1__exp__5__1 was made with other flags: "
        "--learning-rate 0.5 "
        "there, 0.001 here"
    ) in text


# ---------------------------------------------------------------------------------------------------
# the records
def test_args_json_keeps_what_the_run_was_asked_for_and_each_resume(tmp_path, monkeypatch):
    first = CommandLine(["s.py", "--learning-rate", "0.001"], frozenset({"learning_rate"}), None)
    records.write_args(tmp_path, Flags(learning_rate=1e-3, norm_obs=False), first, 32, 1)
    again = CommandLine(["s.py", "--resume", "x", "--checkpoint-interval", "3"], frozenset({"resume"}), None)
    flags = Flags(learning_rate=1e-3, norm_obs=False, checkpoint_interval=3, resume="x")
    records.write_args(tmp_path, flags, again, 32, 1, resumed={"iteration": 7, "global_step": 224})
    saved = json.loads((tmp_path / "args.json").read_text())
    assert saved["norm_obs"] is False and saved["given"] == ["learning_rate"] and saved["defaults"]["norm_obs"]
    assert runs.asked_of(saved)["norm_obs"] is True  # asked for the default; its effect is what the flags say
    (resume,) = saved["resumes"]
    assert (resume["from_iteration"], resume["from_step"]) == (7, 224)
    assert resume["changed"] == {"checkpoint_interval": [0, 3]}


def test_the_script_s_float32_observations_say_no_warning():
    """A float64 Box (Hopper's, a Dict's one-hots) becomes the agent's float32 without gymnasium's
    "precision lowered" warnings, which the script's own conversion caused."""
    import ppo_vec

    gym.register("Float64Obs-v0", entry_point=Float64Env)
    args = ppo_vec.Args(env_id="Float64Obs-v0")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        env = ppo_vec.make_env(args, 0, None)()
    assert env.observation_space == gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
    assert env.reset(seed=0)[0].dtype == np.float32
    assert [str(w.message) for w in caught] == []


class Float64Env(gym.Env):
    observation_space = gym.spaces.Box(-np.inf, np.inf, (3,), np.float64)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        return np.zeros(3), {}

    def step(self, action):
        return np.zeros(3), 0.0, True, False, {}


# ------------------------------------------------------------------------------------------------ end to end
def tiny_sweep(cwd, *argv, timeout=300, **popen):
    cmd = [sys.executable, str(REPO / "common" / "sweep"), str(VEC), "--env-ids", "CartPole-v1", *argv]
    return run_command(cmd, cwd, timeout=timeout)


@pytest.mark.e2e
def test_a_sweep_asked_for_other_flags_than_a_runs_starts_its_own_and_reports_only_it(tmp_path):
    """The issue's case: a run made with the defaults, then a sweep asking for another rate and
    gamma from another folder (the sweep run as a file): a new run, said why; the report averages
    that run alone."""
    out = run_script(VEC, [*TINY, "--total-timesteps", "256"], tmp_path)
    assert out.returncode == 0, out.stderr
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    os.rename(tmp_path / "runs", cwd / "runs")
    flags = [
        "--seeds",
        "1",
        "--report",
        "report",
        "--",
        *TINY,
        "--total-timesteps",
        "384",
        "--learning-rate",
        "1e-3",
        "--gamma",
        "0.95",
    ]
    out = tiny_sweep(cwd, *flags)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "CartPole-v1 seed 1: start (a new run: CartPole-v1__ppo_vec__1__" in out.stdout
    said = (
        "was made with other flags: --learning-rate 0.00025 there, 0.001 here, --gamma 0.99 "
        "there, 0.95 here, "
        "--total-timesteps 256 (--anneal-lr: the learning rate falls over all of them) there, 384 here)"
    )
    assert said in out.stdout
    text = (cwd / "report" / "report.md").read_text()
    # one run: the new one
    (row,) = [line for line in text.splitlines() if line.startswith("| CartPole-v1 | 1 | ")]
    assert "| 1 | 384 | --total-timesteps 384 --learning-rate 0.001 --num-envs 4 --num-steps 32 --gamma 0.95 " in row


@pytest.mark.e2e
def test_the_printed_resume_command_continues_the_run_it_names(tmp_path):
    """A run with its own flags, stopped: the closing line's command goes on with those flags (not
    the defaults), says where it resumes from, and its summary counts every segment; another rate is
    refused in one line."""
    flags = [
        *TINY,
        "--total-timesteps",
        "30720",
        "--learning-rate",
        "0.001",
        "--gamma",
        "0.95",
        "--checkpoint-interval",
        "2",
    ]
    proc = spawn([sys.executable, VEC, *flags], tmp_path, session=False)
    for line in proc.stdout:
        if line.startswith("global_step="):
            break
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    command = stderr.strip().splitlines()[-1].split("continue with: ")[1].split()
    assert command[:2] == ["python", str(VEC)] and command[2] == "--resume", command
    run_dir = only_run_dir(tmp_path)
    stopped_at = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    refused = run_script(VEC, [*command[2:], "--learning-rate", "0.002"], tmp_path)
    assert refused.returncode == 2 and refused.stderr == (
        f"ppo_vec.py: error: --resume {command[3]} continues a run trained with --learning-rate "
        "0.001 (not 0.002): a "
        "run's results come from one set of flags; drop those flags, or start a new run\n"
    )
    out = run_command(
        [sys.executable, *command[1:], "--total-timesteps", str(stopped_at["global_step"] + 256)], tmp_path
    )
    assert out.returncode == 0, out.stderr
    resumed = f"; resuming from iteration {stopped_at['iteration']} (step {stopped_at['global_step']}), the envs as"
    assert resumed in out.stdout
    # a shorter run: the schedule moves, said
    share = 1 - stopped_at["iteration"] / (stopped_at["iteration"] + 2)
    assert (
        f"ppo_vec.py: --total-timesteps {stopped_at['global_step'] + 256} moves the end of "
        "--anneal-lr's schedule "
        f"(made for 30720 steps): --learning-rate goes on from {share:.2f} x its value "
        "down to 0 at step "
        f"{stopped_at['global_step'] + 256}\n"
    ) in out.stdout
    saved = json.loads((run_dir / "args.json").read_text())
    assert (saved["learning_rate"], saved["gamma"], saved["checkpoint_interval"]) == (0.001, 0.95, 2)
    assert saved["resumes"][0]["changed"] == {"total_timesteps": [30720, stopped_at["global_step"] + 256]}
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["segments"] == 2 and summary["global_step"] == stopped_at["global_step"] + 256
    assert re.search(rf"done: {summary['global_step']} of {summary['global_step']} steps in 0:00:\d\d", out.stdout)
    # 0.001, annealed over the new total's iterations
    lr = dict(read_scalars(run_dir)["charts/learning_rate"])
    first = stopped_at["iteration"] + 1
    assert lr[first * 128] == pytest.approx(0.001 * (1 - stopped_at["iteration"] / (first + 1)))


@pytest.mark.e2e
def test_a_run_has_one_writer_and_a_sweep_its_runs(tmp_path):
    """While a run trains, resuming it elsewhere is refused in one line naming its process; a sweep
    killed with SIGKILL takes its runs with it (they stop, and save), and the same sweep run again
    at once waits for them to end, then resumes them to their end."""
    flags = ["--seeds", "1", "2", "--jobs", "2", "--", *TINY, "--total-timesteps", "6400", "--checkpoint-interval", "1"]
    slow = "tests.envs:SlowStep-v0"  # 2 ms a step, asleep: a run takes 15 s, on a busy machine or a quiet one
    cmd = [sys.executable, "-m", "common.sweep", str(VEC), "--env-ids", slow, *flags]
    proc = spawn(cmd, tmp_path, {"PYTHONPATH": str(REPO)}, session=False)
    deadline = time.monotonic() + 90
    while len(list((tmp_path / "runs").glob("*/checkpoint.pt"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)  # both runs train, and have saved a checkpoint
    folders = sorted((tmp_path / "runs").glob("tests.envs-SlowStep-v0__ppo_vec__*"))
    writers = [runs.lock_holder(folder / records.LOCK) for folder in folders]
    assert len(folders) == 2 and all(writers), writers
    refused = run_script(VEC, [*TINY, "--env-id", slow, "--resume", folders[0] / "checkpoint.pt"], tmp_path)
    assert refused.returncode == 2 and f"is being written by process {writers[0]}: a run has one writer" in (
        refused.stderr
    )
    proc.kill()
    proc.communicate()
    deadline = time.monotonic() + 30
    while any(alive(pid) for pid in writers) and time.monotonic() < deadline:
        time.sleep(0.1)
    # at once: they may save
    again = run_command(cmd, tmp_path, timeout=300, extra_env={"PYTHONPATH": str(REPO)})
    assert not any(alive(pid) for pid in writers), "the runs outlived their sweep"
    statuses = [json.loads((folder / "summary.json").read_text())["status"] for folder in folders]
    assert again.returncode == 0 and again.stdout.count(": resume, exit 0, status done") == 2, again.stdout
    assert statuses == ["done"] * 2 and sorted((tmp_path / "runs").glob("*__ppo_vec__*")) == folders
    resumed = [json.loads((folder / "args.json").read_text())["resumes"] for folder in folders]
    # each stopped once by its sweep's death, and resumed
    assert all(len(resumes) == 1 for resumes in resumed)


@pytest.mark.e2e
def test_a_run_whose_sweep_died_while_it_started_does_not_train(tmp_path):
    """A sweep killed while its run was still starting (importing torch takes seconds): the run
    finds its launcher gone, by the pid the sweep gave it, and stops before it trains, instead of
    training on alone."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a launcher that has ended: this run's parent is another process
    slow = ["--env-id", "tests.envs:SlowStep-v0", "--total-timesteps", "6400"]  # 15 s of steps if it trained
    ran = run_script(VEC, [*TINY, *slow], tmp_path, extra_env={stops.END_WITH_PARENT: str(gone.pid)})
    assert ran.returncode == 128 + signal.SIGTERM and "stopped by SIGTERM" in ran.stderr, ran.stderr
    assert not list(tmp_path.glob("runs/*__ppo_vec__*"))  # stopped while its env was probed: no folder


@pytest.mark.e2e
def test_two_sweeps_never_train_one_run_twice_and_ctrl_c_stops_a_sweep(tmp_path):
    flags = ["--seeds", "1", "--", *TINY, "--total-timesteps", "100000"]
    cmd = [sys.executable, "-m", "common.sweep", str(VEC), "--env-ids", "CartPole-v1", *flags]
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
    first, second = (
        subprocess.Popen(
            cmd,
            cwd=tmp_path,
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        for _ in range(2)
    )
    deadline = time.monotonic() + 60
    while first.poll() is None and second.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    done = [proc for proc in (first, second) if proc.poll() is not None]
    assert len(done) == 1, "none of the sweeps ended: both are training"
    waiting = first if done[0] is second else second
    while not list((tmp_path / "runs").glob("CartPole-v1__*/events.*")) and time.monotonic() < deadline + 60:
        time.sleep(0.1)  # its run trains
    said = done[0].communicate(timeout=10)[0]
    assert "CartPole-v1 seed 1: run by another sweep (process" in said and ": skipped" in said, said
    assert done[0].returncode == 1 and "unfinished: CartPole-v1 seed 1 (run by another sweep (process" in said
    assert len(list((tmp_path / "runs").glob("CartPole-v1__*"))) == 1
    os.killpg(waiting.pid, signal.SIGINT)  # Ctrl-C in the sweep's terminal
    out, err = waiting.communicate(timeout=60)
    assert waiting.returncode == 130 and "Traceback" not in err, err
    (folder,) = (tmp_path / "runs").glob("CartPole-v1__*")
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["status"] == "stopped by SIGINT" and out.splitlines()[-1] == "stopped by SIGINT"
    saved = f"saved at iteration {summary['checkpoint_iteration']}" if summary["checkpoint"] else "nothing saved"
    assert out.splitlines()[-2] == (
        f"unfinished: CartPole-v1 seed 1 (stopped by SIGINT, {saved}); the same command "
        "resumes what was saved and starts the rest"
    )


@pytest.mark.e2e
def test_a_custom_env_beside_you_is_found_when_the_script_lives_elsewhere(tmp_path):
    (tmp_path / "my_module.py").write_text(
        "import gymnasium as gym\n"
        "gym.register('MyCartPole-v0', entry_point='gymnasium.envs.classic_control:CartPoleEnv',\n"
        "             max_episode_steps=50)\n"
    )
    out = run_script(VEC, ["--env-id", "my_module:MyCartPole-v0", *TINY, "--total-timesteps", "128"], tmp_path)
    assert out.returncode == 0 and "global_step=128/128" in out.stdout, out.stderr


def test_a_finished_run_extended_by_a_resume_that_saved_nothing_is_resumed_not_skipped(tmp_path):
    """The rerun of a sweep extension killed before its first save: args.json already says the new
    total, the summary the old end (an older version left it "done"): the run is extended to the steps
    asked, and no report averages it meanwhile."""
    flags = {"anneal_lr": False, "total_timesteps": 20480}
    write_folder(tmp_path / "runs", "CartPole-v1__exp__1__1", steps_per_iteration=1024, global_step=10240, **flags)
    run = runs.Run("s.py", "CartPole-v1", 1, "exp", ["--no-anneal-lr", "--total-timesteps", "20480"], str(tmp_path))
    cmd, did = run.command()
    assert did == "extend (from 10240 to 20480 steps: no schedule spans it)" and "--resume" in cmd
    assert report.judge(run)[1] == "unfinished: done at 50% (CartPole-v1__exp__1__1)"


def test_the_report_names_runs_without_an_episode_and_runs_another_sweep_has(tmp_path):
    """A run that finished no episode is named, not averaged as nan; a run another sweep is running
    (started a moment ago: no folder yet) is that, not missing."""
    quiet = write_folder(tmp_path / "runs", "CartPole-v1__exp__1__1", learning_rate=1e-3)
    write_events(quiet, [500, 1000], returns=[])
    (tmp_path / "runs" / "sweep").mkdir()
    lock = tmp_path / "runs" / "sweep" / "CartPole-v1__exp__2.lock"
    code = f"import pathlib; from common.run import records; records.hold(pathlib.Path({str(lock)!r})); input()"
    holder = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdin=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while runs.lock_holder(lock) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        flags = ["--learning-rate", "1e-3"]
        asked = [runs.Run("s.py", "CartPole-v1", seed, "exp", flags, str(tmp_path)) for seed in (1, 2)]
        text = "\n".join(report.report(asked, tmp_path / "report"))
    finally:
        holder.communicate("\n", timeout=60)
    assert "- CartPole-v1 seed 1: no episode finished (CartPole-v1__exp__1__1)" in text
    assert f"- CartPole-v1 seed 2: being run by another sweep (process {holder.pid})" in text
    assert "nan" not in text


@pytest.mark.e2e
def test_a_run_stopped_while_it_evaluates_its_last_checkpoint_is_done(tmp_path):
    """Ctrl-C to a sweep while its run evaluates its saved model: the run trained every iteration, so
    it is done (its summary, its closing line) and lets go of its folder; the sweep run again skips it,
    and its report averages it."""
    flags = ["--seeds", "1", "--report", "report", "--", *TINY, "--total-timesteps", "256", "--save-model"]
    sweep = [sys.executable, "-m", "common.sweep", str(VEC), "--env-ids", "CartPole-v1", *flags]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([*sweep, "--eval-episodes", "1000000"], cwd=tmp_path, env=env, text=True)
    log, deadline = tmp_path / "runs" / "sweep" / "CartPole-v1__ppo_vec__1.log", time.monotonic() + 120
    while not (log.exists() and "model saved to" in log.read_text()) and time.monotonic() < deadline:
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)  # the sweep passes it on
    assert proc.wait(timeout=60) == 130
    folder = next((tmp_path / "runs").glob("CartPole-v1__*"))
    text = log.read_text()
    # the signal may come before the first episode ends: "n/a over 0 episodes" is a partial line too
    partial = r"\neval: mean return (n/a|[\d.]+) over (\d+) episodes \(stopped by SIGINT after \2 of 1000000\)"
    assert re.search(partial, text), text
    assert "\nppo_vec.py: done: 256 of 256 steps" in text, text
    assert json.loads((folder / "summary.json").read_text())["status"] == "done"
    assert not (folder / ".lock").exists()
    out = run_command([*sweep, "--eval-episodes", "1000000"], tmp_path, extra_env={"PYTHONPATH": str(REPO)})
    assert out.returncode == 0 and "seed 1: finished before: skipped, status done" in out.stdout, out.stdout
    assert "| CartPole-v1 | 1 | " in (tmp_path / "report" / "report.md").read_text()


@pytest.mark.e2e
def test_an_extension_killed_before_it_saves_leaves_its_run_unfinished(tmp_path):
    out = run_script(VEC, [*TINY, "--no-anneal-lr", "--total-timesteps", "256"], tmp_path)
    assert out.returncode == 0, out.stderr
    folder = only_run_dir(tmp_path)
    longer = [*TINY, "--resume", folder / "checkpoint.pt", "--total-timesteps", "2560000"]
    proc = start_training(VEC, longer, tmp_path)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    assert json.loads((folder / "summary.json").read_text())["status"] == "running"  # not done: resumed again
