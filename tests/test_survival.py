"""Long runs on a cluster, end to end, where the survival mechanisms meet: checkpoints never change
training, a stop at any moment (mid-save, signalled to any thread) leaves one correctly labelled
checkpoint, signals to every process of a job end in the trainer's stop path, a failing rank says
why with its rank, ranks end with their launcher, and nothing a run started outlives it."""

from __future__ import annotations

import ctypes
import os
import platform
import re
import signal
import sys
import time
from pathlib import Path

import pytest
import torch

from common.sweep.report import read_scalars
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
    free_port,
    learning_curves,
    only_run_dir,
    parent_pid,
    rank_pid,
    run_command,
    run_script,
    spawn,
    start_torchrun,
    start_training,
    stop,
)

pytestmark = pytest.mark.e2e
# 128 steps an iteration, in the trainer
CARTPOLE = [*VEC_TINY, "--env-id", "CartPole-v1", "--num-workers", "0"]


@pytest.mark.parametrize(
    ("script", "args", "steps"), [(VEC, CARTPOLE, 128), pytest.param(ATARI, ATARI_TINY, 16, marks=pytest.mark.long)]
)
def test_checkpointing_is_invisible_to_training(tmp_path, script, args, steps):
    """The same run with and without --checkpoint-interval 1 logs the same numbers, episodes and
    losses alike."""
    curves = []
    for interval in ("0", "1"):
        cwd = tmp_path / interval
        cwd.mkdir()
        out = run_script(script, [*args, "--total-timesteps", 6 * steps, "--checkpoint-interval", interval], cwd)
        assert out.returncode == 0, out.stderr
        curves.append(learning_curves(only_run_dir(cwd)))
    assert curves[0] == curves[1]
    assert len(curves[0]["losses/value_loss"]) == 6
    if script == VEC:  # episodes crossed the iteration boundaries the saves fell on
        assert max(length for _, length in curves[0]["charts/episodic_length"]) > 32


SLOW_SAVE = """
import os, sys, time
_fsync = os.fsync

def fsync(fd):
    if os.readlink(f"/proc/self/fd/{fd}").endswith("checkpoint.pt.tmp"):
        print("saving", file=sys.stderr, flush=True)
        time.sleep(3)
    _fsync(fd)

os.fsync = fsync
"""


def thread_kill(pid: int, tid: int, sig: int) -> None:
    """Sends sig to one thread of another process (tgkill), as the kernel may deliver a process's signal."""
    number = {"x86_64": 234, "aarch64": 131}[platform.machine()]
    assert ctypes.CDLL(None, use_errno=True).syscall(number, pid, tid, sig) == 0


def test_a_stop_during_a_periodic_save_saves_that_iteration_once(tmp_path):
    """SIGTERM to a thread other than the main one while the first periodic checkpoint is being
    written (its fsync made slow): the checkpoint written is labelled with the iteration whose
    weights it holds, and the resumed run ends where a run never stopped ends, every iteration
    logged once."""
    args = [*CARTPOLE, "--checkpoint-interval", "1", "--no-anneal-lr", "--save-model", "--eval-episodes", "0"]
    args += ["--total-timesteps", 6 * 128]
    (tmp_path / "full").mkdir()
    out = run_script(VEC, args, tmp_path / "full")
    assert out.returncode == 0, out.stderr
    (tmp_path / "hooks").mkdir()
    (tmp_path / "hooks" / "sitecustomize.py").write_text(SLOW_SAVE)
    (tmp_path / "stopped").mkdir()
    hooks = {"PYTHONPATH": str(tmp_path / "hooks")}
    proc = spawn([sys.executable, VEC, *args], tmp_path / "stopped", hooks, session=False)
    assert proc.stderr.readline() == "saving\n"
    threads = sorted(int(t) for t in os.listdir(f"/proc/{proc.pid}/task"))
    # the newest thread: not the main one, if there are others
    thread_kill(proc.pid, threads[-1], signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 143, stderr
    run_dir = only_run_dir(tmp_path / "stopped")
    assert [p.name for p in run_dir.glob("*.tmp")] == []
    saved = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    # the snapshot being saved, with its envs
    assert saved["iteration"] == 1 and saved["env_states"] is not None
    out = run_script(VEC, [*args, "--resume", run_dir / "checkpoint.pt"], tmp_path / "stopped")
    assert out.returncode == 0, out.stderr
    expected = torch.load(only_run_dir(tmp_path / "full") / "ppo_vec.cleanrl_model", weights_only=True)
    resumed = torch.load(run_dir / "ppo_vec.cleanrl_model", weights_only=True)
    for key in ("model", "optimizer", "reward_scaler"):
        torch.testing.assert_close(resumed[key], expected[key], rtol=0, atol=0)
    steps = [step for step, _ in read_scalars(run_dir)["losses/policy_loss"]]
    assert steps == [128 * i for i in range(1, 7)]  # each iteration once: none repeated, none skipped


# A stop delivered inside TensorBoard's writer queue, where an exception thrown by a signal handler
# loses the wake-up of the writer thread (which then sleeps until its 120 s flush): the N-th event
# the run logs is put once the writer thread waits for it, and the signal comes between counting the
# event and waking the thread.
STOP_INSIDE_TENSORBOARD = """
import os, queue, signal, sys, time

_put, _count = queue.Queue.put, 0


class _SignalFirst:
    def __init__(self, condition):
        self.condition = condition

    def notify(self, n=1):
        os.kill(os.getpid(), getattr(signal, os.environ["STOP_SIGNAL"]))
        self.condition.notify(n)


def put(self, item, block=True, timeout=None):
    global _count
    if isinstance(item, bytes) and "event_file_writer" in sys._getframe(1).f_code.co_filename:
        _count += 1
        if _count == int(os.environ["STOP_AT_EVENT"]):
            self.join()
            # bounded: the writer thread is back in its wait within microseconds
            deadline = time.monotonic() + 10
            while not self.not_empty._waiters and time.monotonic() < deadline:
                time.sleep(0.001)
            real, self.not_empty = self.not_empty, _SignalFirst(self.not_empty)
            try:
                return _put(self, item, block, timeout)
            finally:
                self.not_empty = real
    return _put(self, item, block, timeout)


queue.Queue.put = put
"""


@pytest.mark.parametrize("sig", ["SIGTERM", *LONG("SIGINT")])
def test_a_stop_inside_a_tensorboard_write_ends_promptly_and_saves(tmp_path, sig):
    """The stop arrives at the one point of TensorBoard's queue where an exception would hang its
    writer thread: the run still stops within seconds, with its checkpoint, its events flushed and
    its closing line."""
    (tmp_path / "hooks").mkdir()
    (tmp_path / "hooks" / "sitecustomize.py").write_text(STOP_INSIDE_TENSORBOARD)
    hooks = {"PYTHONPATH": str(tmp_path / "hooks"), "STOP_AT_EVENT": "30", "STOP_SIGNAL": sig}
    start = time.monotonic()
    out = run_script(VEC, [*CARTPOLE, "--total-timesteps", "100000"], tmp_path, timeout=60, extra_env=hooks)
    assert time.monotonic() - start < 30 and out.returncode == 128 + getattr(signal, sig), out.stderr
    run_dir = only_run_dir(tmp_path)
    assert out.stderr.splitlines()[-1].startswith(f"ppo_vec.py: stopped by {sig}: ")
    saved = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    assert saved["iteration"] >= 1 and len(read_scalars(run_dir)["losses/value_loss"]) >= saved["iteration"]


def test_a_rank_that_fails_at_start_up_says_why_and_the_job_ends(tmp_path):
    """An env that cannot be built on rank 1 alone: rank 1 says so with its rank, and rank 0,
    waiting for it in the rendezvous when the launcher stops it, ends at once."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(ATARI)]
    cmd += [*ATARI_TINY, "--env-id", "tests.envs:BreakoutOnRank0-v0", "--total-timesteps", "1000"]
    start = time.monotonic()
    out = run_command(cmd, tmp_path, timeout=300, extra_env={"PYTHONPATH": str(REPO)})
    assert out.returncode != 0 and time.monotonic() - start < 120, out.stderr[-3000:]  # (starting both: 25 s loaded)
    # rank 0 ended at the launcher's SIGTERM (its stop path: 143; still starting: -15), not by the SIGKILL that
    # follows 30 s later: a bound on the whole command cannot tell these apart under load
    assert re.search(r"rank\s+: 0 \(local_rank: 0\)\n\s+exitcode\s+: (143|-15) ", out.stderr), out.stderr[-3000:]
    line = next(line for line in out.stderr.splitlines() if line.startswith("ppo_atari_multigpu.py: rank 1: "))
    assert line.startswith("ppo_atari_multigpu.py: rank 1: error: --env-id tests.envs:BreakoutOnRank0-v0 cannot be")


def test_the_scripts_run_with_no_flags_at_all(tmp_path):
    """`python ppo_vec.py` alone (every default): it trains; Ctrl-C stops it with its checkpoint."""
    proc = start_training(VEC, [], tmp_path)
    stderr = stop(proc, signal.SIGINT, within=15)
    assert proc.returncode == 130 and "ppo_vec.py: stopped by SIGINT: " in stderr, stderr
    assert (only_run_dir(tmp_path) / "checkpoint.pt").exists()


@pytest.mark.parametrize("gap", [0.02, *LONG(0.0, 0.5)])
def test_signals_to_every_process_of_the_job_end_in_the_stop_path(tmp_path, gap):
    """A scheduler signals every process of a job: the workers (and the forkserver) first, the
    trainer `gap` seconds later. The workers leave stopping to the trainer, which saves, then resumes."""
    args = [*FAULT_ENV, *VEC_TINY, "--num-workers", "2"]
    proc = start_training(VEC, [*args, "--total-timesteps", "10000000"], tmp_path, fault_env(tmp_path))
    family = descendants(proc.pid)
    workers = [int(p.name) for p in (tmp_path / "pids").iterdir() if int(p.name) in family]
    assert len(family) >= 3 and len(workers) == 2  # two workers, a forkserver
    for pid in family:
        os.kill(pid, signal.SIGTERM)
    time.sleep(gap)
    assert all(alive(pid) for pid in workers)  # still at work: stopping is the trainer's
    stderr = stop(proc, signal.SIGTERM, within=15)
    assert proc.returncode == 143, stderr
    assert "WorkerError" not in stderr and "was killed" not in stderr
    assert stderr.splitlines()[-1].startswith("ppo_vec.py: stopped by SIGTERM: ")
    assert f"continue with: python {VEC} --resume runs/" in stderr
    checkpoint = only_run_dir(tmp_path) / "checkpoint.pt"
    total = torch.load(checkpoint, weights_only=True)["global_step"] + 2 * 128
    out = run_script(
        VEC,
        [*args, "--total-timesteps", total, "--resume", checkpoint],
        tmp_path,
        timeout=300,
        extra_env=fault_env(tmp_path),
    )
    assert out.returncode == 0 and f"global_step={total}/{total}" in out.stdout, out.stderr


def forkserver_children(rank: int, timeout: float = 30.0) -> list[int]:
    """The worker processes of a rank: children of the forkserver it started (the rank's own child
    whose command line names the forkserver; the workers it forks carry the same command line).
    Waits for them, bounded."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pid in descendants(rank):
            try:
                if parent_pid(pid) == rank and b"forkserver" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
                    if children:
                        return sorted(int(child) for child in children)
            except OSError:
                continue
        time.sleep(0.1)
    raise AssertionError(f"rank {rank} has no forkserver with workers after {timeout} s")


def test_a_failing_rank_says_why_with_its_rank(tmp_path):
    proc = start_torchrun(tmp_path, extra=["--num-workers", "1"])
    worker = forkserver_children(rank_pid(proc.pid, 1))[0]
    os.kill(worker, signal.SIGKILL)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode != 0
    line = next(line for line in stderr.splitlines() if line.startswith("ppo_atari_multigpu.py: rank 1: error: "))
    assert f"worker 0 (pid {worker}, envs [0, 1]) was killed by SIGKILL" in line
    assert "Traceback" not in stderr.split("ppo_atari_multigpu.py: rank 1: error")[0][-2000:]


def test_a_rank_whose_peer_vanished_says_so_in_one_line_and_saves(tmp_path):
    """Ranks a scheduler's own launcher started (no torchrun agent to end the job): rank 0 learns
    that rank 1 was killed from its next collective, and says so in one line, saves the last
    boundary and exits 1."""
    port = free_port()
    ranks, cmd = [], [sys.executable, ATARI, *ATARI_TINY, "--total-timesteps", "10000000"]
    for rank in (0, 1):
        world = {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        ranks.append(spawn(cmd, tmp_path, {"RANK": str(rank), "LOCAL_RANK": str(rank), **world}))
    try:
        next(line for line in ranks[0].stdout if line.startswith("global_step="))
        ranks[1].kill()
        _, stderr = ranks[0].communicate(timeout=60)
    finally:
        for proc in ranks:
            proc.kill()
            proc.communicate(timeout=30)
    assert ranks[0].returncode == 1 and "Traceback" not in stderr, stderr[-3000:]
    assert stderr.startswith("ppo_atari_multigpu.py: rank 0: error: lost contact with another rank ("), stderr
    assert "that rank's own message says why\nppo_atari_multigpu.py: failed: " in stderr
    assert torch.load(only_run_dir(tmp_path) / "checkpoint.pt", weights_only=True)["world_size"] == 2


def test_ranks_stop_and_save_when_their_launcher_dies(tmp_path):
    """SIGKILL to torchrun's agent alone: each rank is told (SIGTERM), stops through its stop path
    within seconds (rank 0 saves), and leaves nothing behind."""
    proc = start_torchrun(tmp_path)
    family = descendants(proc.pid)
    start = time.monotonic()
    proc.kill()
    proc.communicate(timeout=60)  # its pipes close once every rank has ended
    deadline = time.monotonic() + 10
    while [pid for pid in family if alive(pid)] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in family if alive(pid)] and time.monotonic() - start < 30
    assert torch.load(only_run_dir(tmp_path) / "checkpoint.pt", weights_only=True)["world_size"] == 2


def helpers(tmp_path) -> list[int]:
    return [int(p.name.split("-")[1]) for p in (tmp_path / "pids").glob("helper-*")]


# a SIGKILL in CI: tests/test_vec_construction.py, the helpers of a killed trainer's workers
@pytest.mark.parametrize("ending", ["SIGTERM", *LONG("SIGKILL", "done")])
def test_helpers_of_the_envs_end_with_the_run(tmp_path, ending):
    """An env of yours that starts a helper process (and never ends it) steps in workers by default:
    the probe's helper and the workers' end with the run, however it ends. (With --num-workers 0 the
    envs are the trainer's, as in SyncVectorEnv: what they start is theirs to end.)"""
    args = ["--env-id", "tests.envs:HelperExec-v0", *VEC_TINY]
    if ending == "done":
        out = run_script(VEC, [*args, "--total-timesteps", "256"], tmp_path, extra_env=fault_env(tmp_path))
        assert out.returncode == 0, out.stderr
    else:
        proc = start_training(VEC, [*args, "--total-timesteps", "10000000"], tmp_path, fault_env(tmp_path))
        proc.send_signal(getattr(signal, ending))
        proc.communicate(timeout=60)
    assert len(helpers(tmp_path)) == 5  # the probe's env and the run's 4
    assert all_gone(helpers(tmp_path)), "env helpers outlived the run"


def test_a_finished_run_requeued_with_its_resume_command_does_nothing(tmp_path):
    """A job requeued after its run finished (resumed earlier from a stop) finds the final
    checkpoint: nothing to do, nothing retrained, the model left as it was."""
    args = [*CARTPOLE, "--total-timesteps", "384", "--save-model", "--eval-episodes", "0"]
    out = run_script(VEC, args, tmp_path)
    assert out.returncode == 0, out.stderr
    run_dir = only_run_dir(tmp_path)
    model = (run_dir / "ppo_vec.cleanrl_model").read_bytes()
    out = run_script(VEC, [*args, "--resume", run_dir / "checkpoint.pt"], tmp_path)
    assert out.returncode == 0 and "that run finished its 3 iterations already; nothing to do" in out.stdout
    assert (run_dir / "ppo_vec.cleanrl_model").read_bytes() == model and out.stderr == ""
    assert only_run_dir(tmp_path) == run_dir  # no folder of its own either


def test_a_run_folder_that_cannot_be_made_is_one_line(tmp_path):
    (tmp_path / "runs").write_text("not a folder")
    out = run_script(VEC, CARTPOLE, tmp_path)
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr == (
        f"ppo_vec.py: error: cannot make the run folder in {tmp_path / 'runs'} (a file of that "
        "name is in the way); run from a folder you can write to\n"
    )


def test_a_plain_rerun_after_a_sigterm_resumes_its_run_by_its_run_id(tmp_path):
    """A Kubernetes Job restarted after a SIGTERM runs the same command again: with --run-id it
    finds its run, resumes it (another --num-threads is allowed and said), and once the run is done,
    the same command trains nothing; another run id is another run."""
    args = [*CARTPOLE, "--total-timesteps", "1000000", "--run-id", "job-7"]
    proc = start_training(VEC, args, tmp_path)
    stderr = stop(proc, signal.SIGTERM, within=15)
    assert proc.returncode == 143 and "ppo_vec.py: stopped by SIGTERM: " in stderr, stderr
    run_dir = tmp_path / "runs" / "CartPole-v1__ppo_vec__1__job-7"
    saved = torch.load(run_dir / "checkpoint.pt", weights_only=True)["iteration"]
    shorter = [*CARTPOLE, "--total-timesteps", str((saved + 2) * 128), "--run-id", "job-7", "--no-anneal-lr"]
    out = run_script(VEC, [*shorter, "--num-threads", "2"], tmp_path)
    assert out.returncode == 2 and "--run-id job-7 (runs/CartPole-v1__ppo_vec__1__job-7/checkpoint.pt) continues " in (
        out.stderr
    ), out.stderr  # --no-anneal-lr is another run: the id says which flags it has
    out = run_script(VEC, [*shorter[:-1], "--num-threads", "2"], tmp_path)
    assert out.returncode == 0, out.stderr
    start = next(line for line in out.stdout.splitlines() if "resuming from iteration" in line)
    assert f"resuming from iteration {saved} " in start and "the envs as they were" in start, start
    assert "--num-threads 2, not the 1 it trained with: its weights may differ from an unstopped run's" in start
    out = run_script(VEC, shorter[:-1], tmp_path)
    assert out.returncode == 0 and f"that run finished its {saved + 2} iterations already; nothing to do" in out.stdout
    out = run_script(VEC, [*shorter[:-2], "job-8"], tmp_path)
    assert out.returncode == 0 and (tmp_path / "runs" / "CartPole-v1__ppo_vec__1__job-8" / "checkpoint.pt").exists()
    assert len(list((tmp_path / "runs").iterdir())) == 2
