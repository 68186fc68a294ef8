"""common/sweep: a sweep over seeds that skips what is finished and resumes or extends the rest,
through the thread pool and through submitit's local executor, and the report's figures on known
inputs."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from torch.utils.tensorboard import SummaryWriter

from common.sweep import report, runs, submitted
from common.sweep.__main__ import main as sweep_main
from tests.helpers import LONG, REPO, VEC_TINY, run_command

TINY = [*VEC_TINY, "--num-workers", "0"]  # in-process: the fastest run there is


def run_sweep(tmp_path, *argv, timeout=300):
    cmd = [sys.executable, "-m", "common.sweep", str(REPO / "ppo_vec.py"), "--env-ids", "CartPole-v1", *argv]
    return run_command(cmd, tmp_path, timeout=timeout, extra_env={"PYTHONPATH": str(REPO)})


@pytest.mark.e2e
@pytest.mark.parametrize("executor", ["local", *LONG("submitit-local")])
def test_a_sweep_runs_each_seed_once_then_skips_or_extends(tmp_path, executor):
    flags = [
        "--seeds",
        "1",
        "2",
        "--jobs",
        "2",
        "--executor",
        executor,
        "--",
        *TINY,
        "--no-anneal-lr",
        "--total-timesteps",
        "512",
    ]
    out = run_sweep(tmp_path, *flags)
    assert out.returncode == 0, out.stdout + out.stderr
    folders = sorted((tmp_path / "runs").glob("CartPole-v1__ppo_vec__*"))
    assert [f.name.split("__")[2] for f in folders] == ["1", "2"]
    for folder in folders:
        summary = json.loads((folder / "summary.json").read_text())
        assert summary["status"] == "done" and summary["global_step"] == 512
    assert out.stdout.count(": start, exit 0, status done") == 2
    out = run_sweep(tmp_path, *flags)  # the same command again: nothing to run
    assert out.returncode == 0 and out.stdout.count("finished before: skipped") == 2, out.stdout
    if executor != "local":
        return  # what follows is the sweep's, whichever executor runs the runs
    more = [*flags[:-1], "640"]  # a larger total extends each run in its folder (no schedule spans the run)
    out = run_sweep(tmp_path, *more)
    assert out.returncode == 0, out.stdout
    assert out.stdout.count(": extend (from 512 to 640 steps: no schedule spans it), exit 0, status done") == 2
    assert sorted((tmp_path / "runs").glob("CartPole-v1__ppo_vec__*")) == folders
    assert all(json.loads((f / "summary.json").read_text())["global_step"] == 640 for f in folders)
    out = run_sweep(tmp_path, "--report-only", "--report", "report", *more)  # the runs of those flags
    assert out.returncode == 0 and "| CartPole-v1 | 2 | " in (tmp_path / "report" / "report.md").read_text()
    assert (tmp_path / "report" / "CartPole-v1.png").stat().st_size > 10_000


def test_seeds_are_read_as_written():
    assert runs.seeds(["1-3", "7"]) == [1, 2, 3, 7]


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--seeds", "abc"], "--seeds abc: write seeds in [0, 2**32), or ranges low-high such as 1-10"),
        (["--seeds", "-3"], "--seeds -3: write seeds"),
        (["--seeds", "5-1"], "--seeds 5-1: write seeds"),  # an empty range: the sweep ran nothing, exit 0
        (["--seeds", "\u0663"], "write seeds"),  # an Arabic-Indic 3: str.isdigit took it as seed 3
        (["--jobs", "0"], "--jobs must be >= 1, got 0"),
        # submitit's job then ended with a traceback
        (["--timeout-min", "0"], "--timeout-min must be >= 1, got 0"),
        (["--cpus-per-task", "0"], "--cpus-per-task must be >= 1, got 0"),
        (["--gpus", "-1"], "--gpus must be >= 0, got -1"),
        (["--seeds", "0-4294967295"], "--seeds 0-4294967295 asks for over 10000 seeds: a sweep takes at most"),
    ],
)
def test_a_bad_sweep_flag_is_one_line_before_any_run(tmp_path, monkeypatch, capsys, flags, says):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.py").write_text("")
    with pytest.raises(SystemExit) as ended:
        sweep_main(["s.py", "--env-ids", "CartPole-v1", *flags])
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert ended.value.code == 2 and says in error and not (tmp_path / "runs").exists(), error


def test_aggregate_on_known_numbers():
    a = report.aggregate([10.0, 20.0, 30.0, 40.0, 1000.0])
    assert a["runs"] == 5 and a["mean"] == 220.0 and a["std"] == pytest.approx(np.std([10, 20, 30, 40, 1000], ddof=1))
    assert a["iqm"] == pytest.approx(30.0)  # the middle half of 5: 20, 30, 40 (one cut at each end)
    assert 10.0 <= a["iqm_low"] <= a["iqm"] <= a["iqm_high"] <= 1000.0
    # a fixed generator: the same interval again
    assert report.aggregate([10.0, 20.0, 30.0, 40.0, 1000.0]) == a
    one = report.aggregate([7.0])
    assert (one["iqm"], one["iqm_low"], one["iqm_high"], one["std"]) == (7.0, 7.0, 7.0, 0.0)
    table = report.markdown_table({"Hopper-v5": a}, reference={"Hopper-v5": "2382.9 +- 271.7"})
    interval = f"[{a['iqm_low']:.1f}, {a['iqm_high']:.1f}]"
    assert table[2] == f"| Hopper-v5 | 5 | 220.0 +- {a['std']:.1f} | 30.0 {interval} | 2382.9 +- 271.7 |"


def write_run(folder, returns, step=10):
    writer = SummaryWriter(str(folder))
    for i, value in enumerate(returns):
        writer.add_scalar("charts/episodic_return", value, (i + 1) * step)
    writer.close()
    return folder


def test_curves_from_events(tmp_path):
    """Two runs whose returns are 1, 2, 3, ... and 3, 4, 5, ...: the 20-episode means differ by 2
    everywhere, their mean lies halfway, and the band holds it; the last-20 return of each run is
    read from its events."""
    a = write_run(tmp_path / "a", np.arange(1.0, 101.0))
    b = write_run(tmp_path / "b", np.arange(3.0, 103.0))
    assert report.final_return(a) == pytest.approx(np.mean(np.arange(81.0, 101.0)))
    grid, mean, low, high = report.curve_band([a, b], points=10)
    assert grid[0] == 200.0 and grid[-1] == 1000.0
    # run a's mean at step s is s/10 - 9.5; b's is 2 more
    np.testing.assert_allclose(mean, grid / 10 - 9.5 + 1.0)
    assert (low <= mean).all() and (mean <= high).all() and (high - low).max() <= 2.0 + 1e-9
    png = report.plot_groups({"two runs": [a, b]}, tmp_path / "curves.png", "test")
    assert png.stat().st_size > 10_000


def test_a_requeued_job_stops_its_run_first_while_the_job_waits_for_it(tmp_path):
    """submitit's checkpoint hook (Slurm's warning before a time limit or a preemption) runs in a
    signal handler while the main thread waits for the run: the run is warned too, saves (here: a
    second) and exits, and the hook returns once it has, to come back with the same run. A hook that
    waited through Popen (whose lock the main thread holds) spun for 150 s, then raised."""
    run = runs.Run("ppo_vec.py", "CartPole-v1", 3, "exp", [], str(tmp_path))
    job = runs.RunJob()
    saving = "import signal, sys, time; signal.signal(signal.SIGUSR2, lambda *_: (time.sleep(1), sys.exit(140)))"
    command = [sys.executable, "-c", f"{saving}; print('ready', flush=True); time.sleep(60)"]
    job.proc = child = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline() == "ready\n"
    hooked = []
    previous = signal.signal(signal.SIGUSR2, lambda *_: hooked.append(job.checkpoint(run)))
    try:
        threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGUSR2)).start()  # submitit's process is warned
        start = time.monotonic()
        child.wait(timeout=60)  # the main thread of RunJob._run
    finally:
        signal.signal(signal.SIGUSR2, previous)
    assert child.returncode == 140 and time.monotonic() - start < 10  # it saved, and nothing spun
    (again,) = hooked
    assert job.proc is None and again.args == (run,) and again.function is job


class RequeuedJob:
    """A Slurm array task as submitit shows it while Slurm requeues it: done() (sacct showed an ended
    state for a moment), no result yet; the result comes a second later."""

    def __init__(self, folder):
        self.job_id, self.state = "7_0", "PENDING"
        self.paths = argparse.Namespace(result_pickle=folder / "7_0_result.pkl")
        threading.Timer(1.0, self.paths.result_pickle.write_text, ("done",)).start()

    def done(self):
        return True

    def result(self):
        return {"did": self.paths.result_pickle.read_text()}


def test_a_job_slurm_still_holds_is_waited_for_though_submitit_says_it_ended(tmp_path, monkeypatch):
    """submitit's done() asks sacct, which showed a task being requeued as ended: the sweep asks Slurm's
    controller (scontrol), waits while the job is pending or running there, and gets its result."""
    job = RequeuedJob(tmp_path)
    scontrol = tmp_path / "bin" / "scontrol"  # Slurm's answer: pending until the result is written
    scontrol.parent.mkdir()
    scontrol.write_text(f"#!/bin/sh\n[ -e {job.paths.result_pickle} ] && s=COMPLETED || s=PENDING\necho JobState=$s\n")
    scontrol.chmod(0o755)
    monkeypatch.setenv("PATH", f"{scontrol.parent}{os.pathsep}{os.environ['PATH']}")
    executor = argparse.Namespace(map_array=lambda function, runs: [job])
    monkeypatch.setattr(submitted, "submitit_executor", lambda args: executor)
    args = argparse.Namespace(executor="slurm", again="")
    start = time.monotonic()
    assert submitted.run_submitted([None], args) == [{"did": "done"}]
    assert time.monotonic() - start < 30


def test_a_sweep_says_what_to_install_before_any_run(tmp_path, monkeypatch, capsys):
    """Its report's curves need matplotlib, SLURM needs submitit: said before any run trains. Its
    statistics need nothing beyond numpy."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.py").write_text("")
    monkeypatch.setitem(sweep_main.__globals__, "find_spec", lambda name: None)
    with pytest.raises(SystemExit) as ended:
        sweep_main(["s.py", "--env-ids", "CartPole-v1", "--report", "r"])
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert ended.value.code == 2 and "matplotlib is not installed: pip install matplotlib" in error
    monkeypatch.setitem(sys.modules, "scipy", None)  # (import scipy fails)
    assert report.aggregate([1.0, 2.0, 3.0])["iqm"] == 2.0


@pytest.mark.e2e
def test_the_folder_form_sends_submitit_jobs_from_another_folder(tmp_path):
    """python path/to/common/sweep, from a folder that does not hold common/: the jobs import it."""
    cmd = [sys.executable, str(REPO / "common" / "sweep"), str(REPO / "ppo_vec.py"), "--env-ids", "CartPole-v1"]
    cmd += ["--executor", "submitit-local", "--", *TINY, "--total-timesteps", "128"]
    out = run_command(cmd, tmp_path, extra_env={"PYTHONPATH": ""})
    assert out.returncode == 0 and "CartPole-v1 seed 1: start, exit 0, status done" in out.stdout, out.stdout
