"""Injected faults end to end: crashed, raising and stuck envs, signals, NaNs, broken
checkpoints, dead ranks."""

from __future__ import annotations

import os
import re
import signal
import sys
import time

import pytest
import torch

from tests.helpers import (
    ATARI,
    ATARI_TINY,
    FAULT_ENV,
    LONG,
    REPO,
    VEC,
    VEC_TINY,
    alive,
    all_gone,
    descendants,
    fault_env,
    only_run_dir,
    rank_pid,
    read_scalars,
    run_script,
    spawn,
    start_torchrun,
    start_training,
    stop,
)

pytestmark = pytest.mark.e2e  # runs the scripts as users do: the README's test command, not the fast tier


def assert_workers_gone(tmp_path, within: float = 5.0) -> None:
    pids = [int(p.name.split("-")[-1]) for p in (tmp_path / "pids").iterdir()]
    assert pids, "no env recorded its worker"
    deadline = time.monotonic() + within
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [pid for pid in pids if alive(pid)], "worker processes outlived the trainer"


@pytest.mark.parametrize("fault", ["sigkill:30", *LONG("hang:30", "raise:30")])  # a hang in CI: with restarts
def test_crash_without_restarts_stops_with_the_worker_error(tmp_path, fault):
    """The run ends with what went wrong; a stuck env, with the flags that bound it (not the API's
    retry, which a command line cannot do)."""
    args = [*FAULT_ENV, *VEC_TINY, "--total-timesteps", "2048", "--step-timeout", "2"]
    out = run_script(VEC, args, tmp_path, timeout=120, extra_env=fault_env(tmp_path, fault))
    assert out.returncode != 0
    hang = r"did not answer 'step' within 2 s \(worker \d\); --step-timeout sets that bound, --max-restarts N "
    expected = {"sigkill": "was killed by SIGKILL", "raise": "raised ValueError", "hang": hang}
    assert re.search(expected[fault.split(":")[0]], out.stderr) and "step_wait" not in out.stderr, out.stderr
    assert_workers_gone(tmp_path)


@pytest.mark.parametrize("fault", ["hang:30", "sigkill:30 --overlap", *LONG("sigkill:30", "raise:30 --overlap")])
def test_crash_with_restarts_finishes_training(tmp_path, fault):
    """A worker replaced, its envs' episodes truncated; with --overlap, its group's while the other steps."""
    fault, *flags = fault.split()
    args = [*FAULT_ENV, *VEC_TINY, "--total-timesteps", "2048", "--step-timeout", "2", "--max-restarts", "1", *flags]
    out = run_script(VEC, args, tmp_path, timeout=120, extra_env=fault_env(tmp_path, fault))
    assert out.returncode == 0, out.stderr
    assert "restarting worker" in out.stderr and "global_step=2048/2048" in out.stdout
    assert read_scalars(only_run_dir(tmp_path))["charts/worker_restarts"][-1][1] == 1
    assert_workers_gone(tmp_path)


@pytest.mark.parametrize("fault", ["segfault", *LONG("exit")])
def test_an_env_of_yours_that_crashes_late_is_named_and_saved_with_default_flags(tmp_path, fault):
    """A cheap env of yours that crashes at its 2000th step, with no layout flag given: it steps in
    workers, so the crash is a named WorkerError and the last iteration is saved (in the trainer it
    would take the run with it)."""
    args = ["--env-id", f"tests.envs:FailsLater-{fault}-v0", *VEC_TINY, "--total-timesteps", "100000"]
    out = run_script(VEC, args, tmp_path, timeout=120, extra_env={"PYTHONPATH": str(REPO)})
    assert out.returncode == 1, out.stderr
    died = r"was killed by SIGSEGV \(exit code -11\)" if fault == "segfault" else "exited with code 3"
    assert re.search(rf"ppo_vec.py: error: worker \d \(pid \d+, envs \[\d, \d\]\) {died} during 'step'", out.stderr)
    assert torch.load(only_run_dir(tmp_path) / "checkpoint.pt", weights_only=True)["iteration"] >= 50


def test_a_short_step_timeout_bounds_the_envs_work_not_the_probes_start(tmp_path):
    """--step-timeout 0.1 on CartPole: the probe that checks the env takes longer than that to start
    Python, which the bound does not count; the run trains."""
    out = run_script(VEC, [*VEC_TINY, "--step-timeout", "0.1", "--total-timesteps", "256"], tmp_path, timeout=120)
    assert out.returncode == 0 and "global_step=256/256" in out.stdout, out.stderr


@pytest.mark.parametrize(
    ("script", "args", "sig"),
    [
        (VEC, [*FAULT_ENV, *VEC_TINY, "--num-workers", "2"], signal.SIGINT),
        pytest.param(VEC, [*VEC_TINY, "--env-id", "Pendulum-v1"], signal.SIGTERM, marks=pytest.mark.long),
        pytest.param(ATARI, ATARI_TINY, signal.SIGTERM, marks=pytest.mark.long),  # 2 ranks: SIGINT test below
    ],
    ids=["ppo_vec-SIGINT", "ppo_vec-box-SIGTERM", "atari-SIGTERM"],
)
def test_a_stopped_run_saves_cleans_up_and_resumes(tmp_path, script, args, sig):
    proc = start_training(script, [*args, "--total-timesteps", "10000000"], tmp_path, fault_env(tmp_path))
    family = descendants(proc.pid)
    stderr = stop(proc, sig, within=20)  # on a loaded machine too, well within Slurm's KillWait (30 s)
    assert proc.returncode == 128 + sig, stderr
    run_dir = only_run_dir(tmp_path)
    checkpoint_path = run_dir / "checkpoint.pt"
    shown = checkpoint_path.relative_to(tmp_path)
    closing = stderr.splitlines()[-1]  # the closing line: how it ended, and how to go on
    assert closing.startswith(f"{script.name}: stopped by {sig.name}: ") and stderr.endswith("\n")
    module_env = f" --env-id {FAULT_ENV[1]}" if FAULT_ENV[1] in args else ""  # the command imports it again
    assert closing.endswith(f"; continue with: python {script} --resume {shown}{module_env}")  # the script as run
    assert "Traceback" not in stderr
    assert "losses/value_loss" in read_scalars(run_dir)  # the events were flushed
    assert all_gone(family, within=5.0)  # the forkserver notices its parent's end a moment after it
    if FAULT_ENV[1] in args:
        assert_workers_gone(tmp_path)
    checkpoint = torch.load(checkpoint_path, weights_only=True)
    steps_per_iteration = 16 if script == ATARI else 128  # the iteration under way may be the first
    total = checkpoint["global_step"] + 2 * steps_per_iteration
    out = run_script(
        script,
        [*args, "--total-timesteps", total, "--resume", checkpoint_path],
        tmp_path,
        timeout=300,
        extra_env=fault_env(tmp_path),
    )
    assert out.returncode == 0, out.stderr
    assert f"global_step={total}/{total}" in out.stdout and only_run_dir(tmp_path) == run_dir
    logged = [step for step, _ in read_scalars(run_dir)["losses/value_loss"]]
    assert logged[-2:] == [total - steps_per_iteration, total]


def test_sigterm_while_the_envs_are_built_exits_143_quietly(tmp_path):
    cmd = [sys.executable, VEC, "--env-id", "tests.envs:SlowToBuild-v0", *VEC_TINY, "--total-timesteps", "256"]
    proc = spawn([*cmd, "--num-workers", "2"], tmp_path, fault_env(tmp_path))
    family = set()
    deadline = time.monotonic() + 60
    # the probe in the trainer, then the workers, record their pids as they build
    while time.monotonic() < deadline:
        family |= descendants(proc.pid)
        if [p for p in (tmp_path / "pids").iterdir() if int(p.name) != proc.pid]:
            break
        time.sleep(0.05)
    stderr = stop(proc, signal.SIGTERM, within=10)
    assert proc.returncode == 143
    assert stderr == "ppo_vec.py: stopped by SIGTERM\n"
    assert not [pid for pid in family | descendants(proc.pid) if alive(pid)]
    assert_workers_gone(tmp_path)


def test_nan_stops_with_the_iteration_named_and_saves_nothing(tmp_path):
    args = [*FAULT_ENV, *VEC_TINY, "--total-timesteps", "2048", "--save-model"]
    out = run_script(VEC, args, tmp_path, timeout=120, extra_env=fault_env(tmp_path, "nan:70"))
    assert out.returncode == 1
    assert out.stderr.startswith(
        "ppo_vec.py: error: iteration 3 (global_step 384): the weights of model became "
        "NaN/Inf; look for NaN/Inf in observations or rewards"
    )
    assert not [p for p in only_run_dir(tmp_path).iterdir() if p.suffix in (".pt", ".cleanrl_model")]
    assert_workers_gone(tmp_path)


# the job also ends when a rank fails through its worker: test_a_failing_rank_says_why_with_its_rank
@pytest.mark.long
def test_a_dead_rank_ends_the_whole_job(tmp_path):
    proc = start_torchrun(tmp_path)
    family = descendants(proc.pid)
    start = time.monotonic()
    os.kill(rank_pid(proc.pid, 1), signal.SIGKILL)
    _, stderr = proc.communicate(timeout=120)
    assert time.monotonic() - start < 60, "the job took too long to notice"
    assert proc.returncode != 0
    assert "exitcode  : -9" in stderr or "Signal 9" in stderr or "SIGKILL" in stderr, stderr[-3000:]
    deadline = time.monotonic() + 5
    while [pid for pid in family if alive(pid)] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in family if alive(pid)]
