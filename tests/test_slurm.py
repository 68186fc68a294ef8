"""On a real Slurm (slurm/local_slurm.sh: two nodes, n1 and n2, on this machine; .ci/run starts it):
a time limit, a preemption notice, a requeue and a hard kill, each ending with the run done and the
weights of the run never stopped, for both batch scripts and the sweep. Skipped, saying why, where no
such Slurm answers. Slurm holds a requeued job back two minutes (its begin time); the tests release it
at once, as an admin would (scontrol update StartTime=now)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from common.sweep.submitted import ENDED
from tests.helpers import ATARI_TINY, LONG, REPO, VEC_TINY, Forked, free_port, run_command, start_script, wait_until

pytestmark = pytest.mark.e2e
# gymnasium's CartPole, a millisecond slower a step: a run lasts as long on a busy machine as on a quiet one
PACED = [*VEC_TINY, "--env-id", "tests.envs:PacedCartPole-v1", "--num-workers", "0"]
MODEL = ["--save-model", "--eval-episodes", "0"]


@pytest.fixture(scope="module")
def slurm():
    """The environment Slurm's commands and jobs run in, or a skip saying why there is none."""
    if shutil.which("sbatch") is None or not os.environ.get("SLURM_CONF"):
        pytest.skip("no Slurm here: as root, slurm/local_slurm.sh start, then export SLURM_CONF=... (docs/cluster.md)")
    try:
        subprocess.run(["sinfo"], capture_output=True, timeout=20, check=True)
    except (subprocess.SubprocessError, OSError) as exc:
        pytest.skip(f"Slurm does not answer at SLURM_CONF={os.environ['SLURM_CONF']}: {exc}")
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])  # jobs run this Python
    env = dict(os.environ, PATH=path, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
    yield env
    for job in JOBS:  # a test that failed leaves no job behind to hold up the next ones
        subprocess.run(["scancel", job], capture_output=True, timeout=30, env=env)


JOBS: list[str] = []  # every job the tests submitted


def slurm_command(env: dict, *args: str) -> str:
    out = subprocess.run(list(args), capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, f"{args}: {out.stderr}"
    return out.stdout


def sbatch(env: dict, cwd: Path, script: str, *flags: str, options: tuple = ()) -> str:
    """Submits slurm/<script> from `cwd`, which holds the scripts as a user's checkout does, with
    the training script's flags; the job's id."""
    cwd.mkdir(parents=True)
    for name in ("ppo_vec.py", "ppo_atari_multigpu.py", "slurm"):
        (cwd / name).symlink_to(REPO / name)
    command = ["sbatch", "--parsable", *options, str(REPO / "slurm" / script), *flags]
    job = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=60, env=env, check=True).stdout
    JOBS.append(job.strip())
    return job.strip()


def job_state(env: dict, job: str) -> str:
    """The job's state as scontrol says it, or as sacct does once Slurm has forgotten the job (MinJobAge,
    300 s, after it ended: a reference that ended long before the job it is compared with)."""
    out = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True, timeout=60, env=env)
    return out.stdout.split("JobState=")[1].split()[0] if out.returncode == 0 else sacct_state(env, job)


def sacct_state(env: dict, job: str) -> str:
    """The job's state as Slurm's accounting keeps it, after Slurm forgot the job too."""
    return "".join(slurm_command(env, "sacct", "-n", "-X", "-P", "-j", job, "-o", "State").split()[:1])


def completed(env: dict, job: str, log: Path, timeout: float) -> None:
    """Waits for the job to end (at once if it fails) and checks that it completed; a failure shows its log."""
    state = wait_until(f"job {job} ended", lambda: (s := job_state(env, job)) in ENDED and s, timeout=timeout)
    assert state == "COMPLETED", f"job {job} ended {state}: {log.read_text() if log.exists() else 'no log'}"


# Seconds a requeued job waits before the tests release it: a node refuses to start it again within the
# second its last slice ended (its credential was revoked then)
SETTLE = 3.0


def requeued(env: dict, job: str, timeout: float = 300.0) -> None:
    """Waits until the job is requeued (pending); AssertionError if it ended instead (a stop that came too late)."""
    state = wait_until(
        f"job {job} requeued", lambda: (s := job_state(env, job)) in {"PENDING", *ENDED} and s, timeout=timeout
    )
    assert state == "PENDING", f"job {job} ended {state} instead of requeueing"


def release(env: dict, job: str) -> None:
    """Once the job is requeued (pending), lets it start now rather than in Slurm's two minutes."""
    requeued(env, job)
    time.sleep(SETTLE)
    update = ["scontrol", "update", f"JobId={job}", "StartTime=now"]
    out = subprocess.run(update, capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr


def summary_of(folder: Path) -> dict:
    try:
        return json.loads((folder / "summary.json").read_text())
    except (OSError, ValueError):
        return {}


def stopped_as(folder: Path, status: str) -> dict:
    """The summary of the run in `folder` once its status is `status` (read before its job is
    released: the next slice writes its own)."""
    return wait_until(
        f"{folder.name} {status}", lambda: (summary := summary_of(folder)).get("status") == status and summary
    )


def saved_after(folder: Path, iteration: int | None) -> int:
    """Waits until the run in `folder` trains and saves past `iteration` (None: any save); the
    iteration saved."""

    def saved() -> int | None:
        summary = summary_of(folder)
        saved = summary.get("checkpoint_iteration") if summary.get("status") == "running" else None
        return saved if saved is not None and saved > (iteration or 0) else None

    return wait_until(f"a save past iteration {iteration} in {folder}", saved)


def assert_same_weights(resumed: Path, expected: Path, script: str) -> None:
    resumed_state = torch.load(resumed / f"{script}.cleanrl_model", weights_only=True)
    expected_state = torch.load(expected / f"{script}.cleanrl_model", weights_only=True)
    for key in ("model", "optimizer"):
        torch.testing.assert_close(resumed_state[key], expected_state[key], rtol=0, atol=0)


def resumes_in(log: str) -> list[int]:
    """The iteration each slice in a log resumed from."""
    return [
        int(line.split("resuming from iteration ")[1].split()[0]) for line in log.splitlines() if "resuming" in line
    ]


def processes_in(cwd: Path, marker: str) -> list[int]:
    """The processes that run in `cwd` with `marker` in their command line."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
            if entry.name.isdigit() and marker.encode() in command and Path(entry / "cwd").resolve() == cwd:
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def kill_hard(cwd: Path, marker: str) -> None:
    """SIGKILL to every process that runs in `cwd` with `marker` in its command line (a run's trainer:
    its workers end with it), at once and with no warning, as the OOM killer or a lost node would."""
    for pid in processes_in(cwd, marker):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue


def reference_run(env: dict, cwd: Path, *flags: str) -> subprocess.Popen | Forked:
    """The same run, never stopped, outside Slurm (beside the job: its steps mostly sleep)."""
    cwd.mkdir()
    proc = start_script(REPO / "ppo_vec.py", flags, cwd, {"PYTHONPATH": env["PYTHONPATH"]})
    proc.printed = ["", ""]  # its stdout and stderr, read as it goes (for reference_done)

    def read() -> None:
        proc.printed[:] = proc.communicate()

    proc.reader = threading.Thread(target=read, daemon=True)
    proc.reader.start()
    return proc


def reference_done(proc: subprocess.Popen | Forked) -> bool:
    """True once the reference run ended, exit 0 (within 300 s); AssertionError with its stderr if not."""
    proc.reader.join(300)
    assert proc.returncode == 0, f"the reference run ended {proc.returncode}: {proc.printed[1]}"
    return True


def test_ppo_vec_sbatch_comes_back_from_a_preemption_notice_a_requeue_and_a_hard_kill(slurm, tmp_path):
    """One job, stopped three ways: a preemption notice (SIGUSR2 to the job's steps: the run saves, the
    job requeues itself), a requeue by Slurm (SIGTERM to everything: the run saves, Slurm brings it
    back), a SIGKILL to the run after a periodic save (the job fails; an admin requeues it). Each slice
    resumes from the checkpoint the last one left; the run ends with the weights of the run never
    stopped; requeued once more, the job trains nothing."""
    flags = [*PACED, "--total-timesteps", str(80 * 128), "--checkpoint-interval", "5", *MODEL]
    reference = reference_run(slurm, tmp_path / "full", *flags)
    job = sbatch(slurm, tmp_path / "job", "ppo_vec.sbatch", *flags)
    folder = tmp_path / "job" / "runs" / f"tests.envs-PacedCartPole-v1__ppo_vec__1__{job}"
    saved_after(folder, None)
    slurm_command(slurm, "scancel", "--signal=USR2", job)  # a preemption notice
    notice = stopped_as(folder, "stopped by SIGUSR2")
    release(slurm, job)
    saved_after(folder, notice["checkpoint_iteration"])
    slurm_command(slurm, "scontrol", "requeue", job)
    requeue = stopped_as(folder, "stopped by SIGTERM")
    release(slurm, job)
    killed_at = saved_after(folder, requeue["checkpoint_iteration"])
    kill_hard(tmp_path / "job", f"--run-id {job} ")  # the job ends, failed
    wait_until(f"job {job} ended", lambda: job_state(slurm, job) == "FAILED")
    slurm_command(slurm, "scontrol", "requeue", job)
    release(slurm, job)
    wait_until(f"job {job} done", lambda: job_state(slurm, job) == "COMPLETED")
    assert summary_of(folder)["status"] == "done" and reference_done(reference)
    assert_same_weights(folder, next((tmp_path / "full" / "runs").iterdir()), "ppo_vec")
    log = tmp_path / "job" / f"slurm-ppo_vec-{job}.out"
    text = log.read_text()
    # each slice goes on from what the last one saved: at most the iterations since then are redone
    assert resumes_in(text) == [notice["checkpoint_iteration"], requeue["checkpoint_iteration"], killed_at], text
    assert text.count("requeued to resume") == 1 and "Traceback" not in text  # the notice's; Slurm requeued the rest
    slurm_command(slurm, "scontrol", "requeue", job)  # once done, the same command finds the run finished
    release(slurm, job)
    wait_until(f"job {job} done again", lambda: job_state(slurm, job) == "COMPLETED")
    last = log.read_text().rstrip().splitlines()[-1]
    assert last.endswith(
        "that run finished its 80 iterations already; nothing to do (a larger --total-timesteps continues it)"
    )


def test_a_slice_that_fails_ends_its_job(slurm, tmp_path):
    """A job whose run a notice stopped, and whose next slice cannot resume it (its checkpoint damaged
    meanwhile), ends failed, saying why in one line: it is not requeued again and again from the
    summary the stopped slice left."""
    flags = [*PACED, "--total-timesteps", str(400 * 128), "--checkpoint-interval", "5"]
    job = sbatch(slurm, tmp_path / "job", "ppo_vec.sbatch", *flags)
    folder = tmp_path / "job" / "runs" / f"tests.envs-PacedCartPole-v1__ppo_vec__1__{job}"
    saved_after(folder, None)
    slurm_command(slurm, "scancel", "--signal=USR2", job)
    wait_until(f"job {job} requeued", lambda: job_state(slurm, job) == "PENDING")
    (folder / "checkpoint.pt").write_bytes(b"not a checkpoint")
    release(slurm, job)
    log = tmp_path / "job" / f"slurm-ppo_vec-{job}.out"
    wait_until(f"job {job} ended", lambda: job_state(slurm, job) in ENDED or log.read_text().count("requeued") > 1)
    text = log.read_text()
    assert job_state(slurm, job) == "FAILED" and text.count("requeued to resume") == 1, text
    last = text.rstrip().splitlines()[-2:]  # the run's one line, then srun's
    assert last[0].startswith("ppo_vec.py: error: ") and "not a checkpoint" in last[0] and "Traceback" not in text


def catches_usr1(cwd: Path, marker: str) -> bool:
    """True once a process in `cwd` with `marker` in its command line has a handler for SIGUSR1
    (/proc/<pid>/status: SigCgt)."""
    for pid in processes_in(cwd, marker):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        caught = int(status.split("SigCgt:")[1].split()[0], 16)
        if caught >> (signal.SIGUSR1 - 1) & 1:
            return True
    return False


def test_a_notice_in_a_slices_first_second_requeues_and_a_new_job_continues_a_cancelled_run(slurm, tmp_path):
    """A notice as the job's step starts (before the script has set its handlers or written a summary)
    still brings the job back (slurm/launch.py's handlers come first); the job, cancelled once its run
    saved, is gone, and a new job given --run-id <its id> goes on with that run from its save, to the
    weights of the run never stopped, and ends COMPLETED."""
    flags = [*PACED, "--total-timesteps", str(60 * 128), "--checkpoint-interval", "5", *MODEL]
    reference = reference_run(slurm, tmp_path / "full", *flags)
    job = sbatch(slurm, tmp_path / "job", "ppo_vec.sbatch", *flags)
    # Slurm drops a signal sent before the step's tasks have started (the job runs on as if none came);
    # one that kills launch.py before its handlers are set makes srun exit 138, which requeues the job
    # too. The notice comes once launch.py catches it, seconds before the script does.
    wait_until(f"job {job}'s launch.py", lambda: catches_usr1(tmp_path / "job", "slurm/launch.py"), every=0.02)
    slurm_command(slurm, "scancel", "--signal=USR1", job)  # in the slice's first second
    folder = tmp_path / "job" / "runs" / f"tests.envs-PacedCartPole-v1__ppo_vec__1__{job}"
    assert not (folder / "summary.json").exists()  # the script had not begun its run
    release(slurm, job)
    saved = saved_after(folder, None)
    slurm_command(slurm, "scancel", job)  # SIGTERM: the run saves, the job ends for good
    wait_until(f"job {job} cancelled", lambda: sacct_state(slurm, job).startswith("CANCELLED"))
    wait_until(f"run of {job} saved", lambda: summary_of(folder).get("status") == "stopped by SIGTERM")
    cancelled = summary_of(folder)["checkpoint_iteration"]
    assert cancelled >= saved
    log = tmp_path / "job" / f"slurm-ppo_vec-{job}.out"
    assert log.read_text().count("requeued to resume") == 1, log.read_text()
    command = ["sbatch", "--parsable", str(REPO / "slurm" / "ppo_vec.sbatch"), *flags, "--run-id", job]
    again = subprocess.run(command, cwd=tmp_path / "job", capture_output=True, text=True, timeout=60, env=slurm)
    JOBS.append(again.stdout.strip())
    wait_until(f"job {again.stdout.strip()} done", lambda: sacct_state(slurm, again.stdout.strip()) == "COMPLETED")
    text = (tmp_path / "job" / f"slurm-ppo_vec-{again.stdout.strip()}.out").read_text()
    assert resumes_in(text) == [cancelled] and "Traceback" not in text, text
    assert summary_of(folder)["status"] == "done" and reference_done(reference)
    assert_same_weights(folder, next((tmp_path / "full" / "runs").iterdir()), "ppo_vec")


def test_an_array_gives_each_task_its_seed_and_a_notice_requeues_that_task_alone(slurm, tmp_path):
    """sbatch --array=1-2 with no --seed: task i trains seed i in a run of its own (run id <array
    id>_<task id>); a notice to task 1 requeues task 1 alone: task 2, never warned, runs one slice
    to the end. Both end COMPLETED, their runs done."""
    flags = [*PACED, "--total-timesteps", str(50 * 128), "--checkpoint-interval", "5"]
    array = sbatch(slurm, tmp_path / "job", "ppo_vec.sbatch", *flags, options=("--array=1-2",))
    folders = {
        task: tmp_path / "job" / "runs" / f"tests.envs-PacedCartPole-v1__ppo_vec__{task}__{array}_{task}"
        for task in (1, 2)
    }
    saved_after(folders[1], None)
    slurm_command(slurm, "scancel", "--signal=USR2", f"{array}_1")
    release(slurm, f"{array}_1")
    for task in (1, 2):
        wait_until(f"task {array}_{task} done", lambda task=task: sacct_state(slurm, f"{array}_{task}") == "COMPLETED")
        assert summary_of(folders[task])["status"] == "done"
    logs = {
        task: "".join(
            log.read_text()
            for log in (tmp_path / "job").glob("slurm-ppo_vec-*.out")
            if f"of job {array}_{task} " in log.read_text()
        )
        for task in (1, 2)
    }
    assert f"requeued to resume: job {array}_1 comes back" in logs[1] and "slice 2 of job" in logs[1], logs
    assert "slice 2" not in logs[2] and "stopped by" not in logs[2] and "requeued" not in logs[2], logs


@pytest.mark.parametrize("stop", ["notice", *LONG("requeue", "time limit", "kill")])
def test_atari_sbatch_on_two_nodes_resumes_its_run(slurm, tmp_path, stop):
    """srun torchrun over the two nodes, a rank on each: a preemption notice, after which the job
    requeues itself (in -m long also a requeue by Slurm, the time limit's warning of the script's own
    --signal line, a hard kill after a save) stops both ranks, rank 0 saves, and the job comes back to
    end with the weights of the same job never stopped, equal on both ranks. The log ends in the ranks'
    own lines on each node: no traceback, and no C++ stack dump of c10d's (a node whose torchrun
    outlived the rendezvous' host: slurm/launch.py)."""
    iterations = 900 if stop == "time limit" else 36  # longer than a slice: the warning comes up to 90 s in
    flags = [*ATARI_TINY, "--total-timesteps", str(iterations * 32), "--checkpoint-interval", "4", "--num-threads", "1"]
    flags += MODEL
    # the job and the same job never stopped run at once, two CPUs a node each
    cpus = ("--cpus-per-task=2",)
    reference_env = dict(slurm, MASTER_PORT=str(free_port()))
    reference = sbatch(reference_env, tmp_path / "reference", "ppo_atari_multigpu.sbatch", *flags, options=cpus)
    limit = 900 if stop == "time limit" else 400
    env = dict(slurm, MASTER_PORT=str(free_port()))
    options = (*cpus, "--time=3") if stop == "time limit" else cpus  # the warning (USR1@120): up to 90 s in
    job = sbatch(env, tmp_path / "job", "ppo_atari_multigpu.sbatch", *flags, options=options)
    folder = tmp_path / "job" / "runs" / f"BreakoutNoFrameskip-v4__ppo_atari_multigpu__1__{job}"
    saved = saved_after(folder, None)
    if stop == "requeue":
        slurm_command(env, "scontrol", "requeue", job)
    elif stop == "notice":
        slurm_command(env, "scancel", "--signal=USR1", job)
    elif stop == "kill":
        kill_hard(tmp_path / "job", f"ppo_atari_multigpu.py --run-id {job} ")  # both ranks
        wait_until(f"job {job} ended", lambda: job_state(env, job) not in ("RUNNING", "COMPLETING"))
        slurm_command(env, "scontrol", "requeue", job)
    requeued(env, job, timeout=limit)
    stopped = summary_of(folder)
    # the time limit stops each slice that lasts a minute or more: each is released
    releaser = Releaser(env, tmp_path / "job")
    releaser.start()
    try:
        wait_until(f"job {job} done", lambda: job_state(env, job) == "COMPLETED", timeout=limit)
    finally:
        releaser.done.set()
    completed(env, reference, tmp_path / "reference" / f"slurm-ppo_atari-{reference}.out", timeout=limit)
    text = (tmp_path / "job" / f"slurm-ppo_atari-{job}.out").read_text()
    assert summary_of(folder)["status"] == "done" and "Traceback" not in text, text
    assert "frame #" not in text and "TCPStore" not in text, text
    assert ("requeued to resume" in text) == (stop in ("notice", "time limit")), text  # the job's own requeue
    assert resumes_in(text)[0] == (saved if stop == "kill" else stopped["checkpoint_iteration"]), text
    checksums = text.split("final parameter checksum per rank (equal: the ranks stayed in step): ")[1].splitlines()[0]
    first, second = json.loads(checksums)
    assert first == second
    expected = tmp_path / "reference" / "runs" / f"BreakoutNoFrameskip-v4__ppo_atari_multigpu__1__{reference}"
    assert_same_weights(folder, expected, "ppo_atari_multigpu")


class Releaser(threading.Thread):
    """Beside a test: releases each job submitted from `cwd` that Slurm holds back after a requeue (the
    other Slurm test group, running at once, releases its own: it must see them pending first; a sweep's
    jobs and ppo_vec.sbatch's share the name ppo_vec, so the job's working directory tells them apart)."""

    def __init__(self, env: dict, cwd: Path):
        super().__init__(daemon=True)
        self.env, self.cwd, self.done = env, str(cwd), threading.Event()

    def run(self) -> None:
        held: dict[str, float] = {}  # job: when it was first seen held back
        while not self.done.wait(1.0):
            command = ["squeue", "-h", "-t", "PD", "-o", "%i %r %Z"]
            pending = subprocess.run(command, capture_output=True, text=True, timeout=30, env=self.env)
            for job, reason, cwd in (line.split(maxsplit=2) for line in pending.stdout.splitlines()):
                if cwd != self.cwd or reason != "BeginTime":
                    continue
                if time.monotonic() - held.setdefault(job, time.monotonic()) > SETTLE:
                    update = ["scontrol", "update", f"JobId={job}", "StartTime=now"]
                    subprocess.run(update, timeout=30, env=self.env)
                    del held[job]


def sweep(env: dict, cwd: Path, *argv: str, env_id: str = "tests.envs:PacedCartPole-v1") -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "common.sweep", str(REPO / "ppo_vec.py"), "--env-ids", env_id]
    releaser = Releaser(env, cwd)
    releaser.start()
    try:
        return run_command([*command, *argv], cwd, timeout=900, extra_env=env)
    finally:
        releaser.done.set()


@pytest.mark.parametrize("stop", ["time limit", *LONG("notice", "requeue", "kill")])
def test_a_sweep_on_slurm_ends_with_every_run_done(slurm, tmp_path, stop):
    """Two seeds, a job each, through submitit: the time limit's warning (submitit's USR2, 90 s
    before a 3-minute limit; in -m long also a preemption notice, a requeue by Slurm, a hard kill after
    a save, after which the sweep run again resumes the run) stops each run, which saves, and its job
    comes back until the run is done. The sweep exits 0 and its report averages both runs; each ends
    with the weights of the same run never stopped; submitit's log says how each slice ended, and
    nothing prints a traceback."""
    # Slurm checks time limits every 30 s: the warning comes 30 to 90 s into a slice of a 3-minute job, and
    # the run (8 ms a step: 1 s an iteration) lasts longer
    slow = stop == "time limit"
    env_id, steps = ("tests.envs:SlowCartPole-v1", 120) if slow else ("tests.envs:PacedCartPole-v1", 150)
    flags = [*VEC_TINY, "--env-id", env_id, "--num-workers", "0", "--total-timesteps", str(steps * 128)]
    flags += ["--checkpoint-interval", "5", *MODEL]
    references = [reference_run(slurm, tmp_path / f"full{seed}", *flags, "--seed", str(seed)) for seed in (1, 2)]
    argv = ["--seeds", "1", "2", "--executor", "slurm", "--jobs", "2", "--timeout-min", "3", "--cpus-per-task", "1"]
    argv += ["--report", "report", "--", *flags]
    if stop != "time limit":
        (tmp_path / "runs").mkdir()
        stopper = threading.Thread(target=stop_sweep_jobs, args=(slurm, tmp_path, stop), daemon=True)
        stopper.start()
    out = sweep(slurm, tmp_path, *argv, env_id=env_id)
    if stop == "kill":  # a run killed is unfinished: the sweep says so, and run again resumes it
        assert out.returncode == 1 and "unfinished: " in out.stdout, out.stdout + out.stderr
        out = sweep(slurm, tmp_path, *argv, env_id=env_id)
    assert out.returncode == 0 and "unfinished" not in out.stdout, out.stdout + out.stderr
    assert f"| {env_id} | 2 | " in (tmp_path / "report" / "report.md").read_text()
    for seed, reference in zip((1, 2), references, strict=True):
        assert reference_done(reference)
        (folder,) = (tmp_path / "runs").glob(f"{env_id.replace(':', '-')}__ppo_vec__{seed}__*")
        assert_same_weights(folder, next((tmp_path / f"full{seed}" / "runs").iterdir()), "ppo_vec")
    logs = sorted((tmp_path / "runs" / "submitit").rglob("*_log.*"))
    text = "".join(log.read_text() for log in logs if log.suffix == ".out")
    assert "Traceback" not in "".join(log.read_text() for log in logs), logs
    how = {"time limit": "stopped by SIGUSR2", "notice": "stopped by SIGUSR1", "requeue": "stopped by SIGTERM"}
    for seed in (1, 2):  # each slice says how it ended: the stop (a killed one cannot), then done
        assert f"seed {seed}: {how.get(stop, 'start')}" in text and f"seed {seed}: done, saved at iteration " in text
        assert f"seed {seed}: resume (slice {1 if stop == 'kill' else 2} of job " in text, text


def stop_sweep_jobs(env: dict, cwd: Path, stop: str) -> None:
    """Beside a sweep: once each run has saved, stops its job as `stop` says."""
    stopped: set[str] = set()
    deadline = time.monotonic() + 300
    while len(stopped) < 2 and time.monotonic() < deadline:
        time.sleep(0.5)
        for folder in (cwd / "runs").glob("tests.envs-PacedCartPole-v1__*"):
            job = summary_of(folder).get("checkpoint_iteration") and slurm_job_of(env, folder)
            if not job or job in stopped:
                continue
            stopped.add(job)
            if stop == "notice":
                subprocess.run(["scancel", "--signal=USR1", job], timeout=30, env=env)
            elif stop == "requeue":
                subprocess.run(["scontrol", "requeue", job], timeout=30, env=env)
            else:
                kill_hard(cwd, f"--seed {folder.name.split('__')[2]} --exp-name")  # the run's trainer


def slurm_job_of(env: dict, folder: Path) -> str | None:
    """The running array task whose run writes `folder`: seed s is task s - 1 (the sweep's order)."""
    task = f"_{int(folder.name.split('__')[2]) - 1}"
    jobs = subprocess.run(["squeue", "-h", "-t", "R", "-o", "%i"], capture_output=True, text=True, timeout=30, env=env)
    return next((job for job in jobs.stdout.split() if job.endswith(task)), None)


def test_ctrl_c_on_a_slurm_sweep_cancels_its_jobs_at_once_and_names_the_command_that_goes_on(slurm, tmp_path):
    """Ctrl-C on python -m common.sweep --executor slurm, once each run has saved: within seconds it
    cancels its jobs (each run saves on the SIGTERM), exits 130 and prints the command that goes on;
    that command, pasted into a shell, resumes both runs to the end."""
    flags = [*PACED, "--total-timesteps", str(60 * 128), "--checkpoint-interval", "5"]
    command = [sys.executable, "-m", "common.sweep", "ppo_vec.py", "--env-ids", "tests.envs:PacedCartPole-v1"]
    command += ["--seeds", "1", "2", "--executor", "slurm", "--jobs", "2", "--cpus-per-task", "1", "--", *flags]
    (tmp_path / "ppo_vec.py").symlink_to(REPO / "ppo_vec.py")
    releaser = Releaser(slurm, tmp_path)
    releaser.start()
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    sweeping = subprocess.Popen(command, cwd=tmp_path, env=slurm, **pipes)
    runs = tmp_path / "runs"
    try:
        wait_until("both runs saved", lambda: len([f for f in runs.glob("tests.*") if saved_in(f)]) == 2)
        sweeping.send_signal(signal.SIGINT)  # Ctrl-C in the sweep's terminal
        start = time.monotonic()
        out, err = sweeping.communicate(timeout=60)
        assert sweeping.returncode == 130 and time.monotonic() - start < 15 and "Traceback" not in err, out + err
        line = next(line for line in out.splitlines() if "to go on with them: " in line)
        assert line.startswith("stopped by SIGINT: cancelled jobs "), out
        for folder in runs.glob("tests.*"):  # SIGTERM: each run saves as its job ends
            wait_until(f"{folder.name} saved", lambda folder=folder: "SIGTERM" in summary_of(folder).get("status", ""))
        again = line.split("to go on with them: ")[1]
        pasted = run_command(["bash", "-c", again], tmp_path, timeout=600, extra_env=slurm)
    finally:
        releaser.done.set()
        if sweeping.poll() is None:
            sweeping.kill()
    assert pasted.returncode == 0 and pasted.stdout.count(": resume, exit 0, status done") == 2, (
        pasted.stdout + pasted.stderr
    )


def saved_in(folder: Path) -> bool:
    return summary_of(folder).get("checkpoint_iteration") is not None
