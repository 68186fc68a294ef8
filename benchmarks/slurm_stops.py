"""Stops on a real Slurm, on a loaded machine: each batch script's job stopped again and again, as a
cluster stops it, until its run is done.

    sudo slurm/local_slurm.sh start && export SLURM_CONF=/tmp/ppo-vec-slurm/slurm.conf
    python benchmarks/slurm_stops.py                       # 2 busy loops beside, 6 stops a job
    python benchmarks/slurm_stops.py --stops 3 --load 0 --cases vec
    python benchmarks/slurm_stops.py --cases atari --kinds notice warning --stops 10

Cases: `vec`, slurm/ppo_vec.sbatch with ppo_vec.py's defaults (CartPole, 8 envs); `atari`,
slurm/ppo_atari_multigpu.sbatch over the two nodes, a rank each (small iterations). Each stop comes
1 to 6 s after the slice's first progress line, and is, in turn: the time limit's warning or a
preemption notice (SIGUSR1, SIGUSR2 to the job's steps: the job requeues itself) or a requeue by
Slurm (SIGTERM to everything); `--kinds` keeps some of these. For each stop: the seconds from the
signal to the run's summary saying it stopped (its checkpoint saved), and the iterations the next
slice redoes (from the checkpoint to where the stop found the run). Per case: the requeues and
how many slices of the job's log print a Python traceback or c10d's C++ stack dump (`frame #`),
which none may. Slurm holds a requeued job two minutes; this releases it after 3 s. Writes
benchmarks/results/slurm_stops.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.report import MACHINE, RESULTS  # noqa: E402
from tests.helpers import wait_until  # noqa: E402

# case: (batch script, its job's name, flags, the run's folder, global steps an iteration)
CASES = {
    "vec": ("ppo_vec.sbatch", "ppo_vec", ["--total-timesteps", "3000000"], "CartPole-v1__ppo_vec__1__{job}", 1024),
    "atari": (
        "ppo_atari_multigpu.sbatch",
        "ppo_atari",
        ["--local-num-envs", "2", "--num-steps", "32", "--total-timesteps", "40000", "--num-threads", "1"],
        "BreakoutNoFrameskip-v4__ppo_atari_multigpu__1__{job}",
        128,
    ),
}
KINDS = [
    ("notice", ["scancel", "--signal=USR2"]),
    ("warning", ["scancel", "--signal=USR1"]),
    ("requeue", ["scontrol", "requeue"]),
]


def sh(*args: str) -> str:
    return subprocess.run(args, capture_output=True, text=True, timeout=60, check=True).stdout


def state(job: str) -> str:
    return sh("scontrol", "show", "job", job).split("JobState=")[1].split()[0]


def summary(folder: Path) -> dict:
    try:
        return json.loads((folder / "summary.json").read_text())
    except (OSError, ValueError):
        return {}


def wait(what: str, ready, timeout: float = 600.0):
    return wait_until(what, ready, timeout, every=0.1)


def trains(log: Path, slice_number: int, job: str) -> bool:
    """True once slice `slice_number` of the job has printed a progress line; the log if the job ended."""
    text = log.read_text() if log.exists() else ""
    if state(job) in ("FAILED", "CANCELLED", "COMPLETED", "TIMEOUT", "NODE_FAIL"):
        raise SystemExit(f"job {job} ended before slice {slice_number} trained:\n{text}")
    return f"slice {slice_number} of job" in text and "global_step=" in text.split(f"slice {slice_number} of job")[1]


def unclean(log: Path) -> tuple[int, int]:
    """How many slices of the job's log print a traceback, and how many a C++ stack dump."""
    slices = log.read_text().split(" of job ")[1:]
    return sum("Traceback" in text for text in slices), sum("frame #" in text for text in slices)


def run_case(name: str, stops: int, kinds: list, cwd: Path) -> dict:
    script, job_name, flags, folder_name, steps = CASES[name]
    cwd.mkdir()
    for target in ("ppo_vec.py", "ppo_atari_multigpu.py", "slurm"):  # the batch scripts run slurm/launch.py
        (cwd / target).symlink_to(REPO / target)
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}", MASTER_PORT="29517")
    command = ["sbatch", "--parsable", "--cpus-per-task=1", str(REPO / "slurm" / script), *flags]
    job = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, check=True).stdout.strip()
    folder, log = cwd / "runs" / folder_name.format(job=job), cwd / f"slurm-{job_name}-{job}.out"
    rows = []
    for k in range(stops):
        wait(f"slice {k + 1} trains", lambda k=k: trains(log, k + 1, job))
        time.sleep(random.uniform(1.0, 6.0))
        kind, signal_command = kinds[k % len(kinds)]
        sent = time.monotonic()
        sh(*signal_command, job)
        stopped = wait(
            "the run stops", lambda: summary(folder).get("status", "").startswith("stopped by") and summary(folder)
        )
        seconds = time.monotonic() - sent
        redone = (stopped["global_step"] - stopped["checkpoint_iteration"] * steps) / steps
        rows.append({"kind": kind, "status": stopped["status"], "seconds": round(seconds, 2), "redone": redone})
        print(f"{name} stop {k + 1}: {kind}, {stopped['status']} after {seconds:.1f} s, {redone:.1f} iterations redone")
        wait(f"job {job} requeued", lambda: state(job) == "PENDING")
        time.sleep(3.0)  # a node refuses to start the job again within the second its last slice ended
        sh("scontrol", "update", f"JobId={job}", "StartTime=now")
    wait(f"slice {stops + 1} trains", lambda: trains(log, stops + 1, job))
    sh("scancel", job)  # the rest of the run is not timed
    tracebacks, dumps = unclean(log)
    print(f"{name}: {tracebacks} slices printed a traceback, {dumps} a C++ stack dump")
    return {"case": name, "stops": rows, "tracebacks": tracebacks, "dumps": dumps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--stops", type=int, default=6)
    parser.add_argument("--kinds", nargs="+", default=[kind for kind, _ in KINDS], choices=[kind for kind, _ in KINDS])
    parser.add_argument("--load", type=int, default=2, help="busy loops beside the jobs")
    args = parser.parse_args()
    if not os.environ.get("SLURM_CONF"):
        raise SystemExit("no Slurm: sudo slurm/local_slurm.sh start, then export SLURM_CONF=...")
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.load)]
    try:
        with tempfile.TemporaryDirectory() as tmp:
            kinds = [kind for kind in KINDS if kind[0] in args.kinds]
            results = [run_case(name, args.stops, kinds, Path(tmp, name)) for name in args.cases]
    finally:
        for loop in loops:
            loop.kill()
    command = "python benchmarks/slurm_stops.py " + " ".join(sys.argv[1:])
    lines = [f"# Stops on a real Slurm ({MACHINE}, {args.load} busy loops beside)", "", f"`{command.strip()}`", ""]
    lines += [
        "| case | stops | signal to saved: median, slowest (s) | iterations redone: most | requeues | slices with a"
        " traceback, a C++ dump |",
        "|---|---|---|---|---|---|",
    ]
    for result in results:
        seconds, kinds = [row["seconds"] for row in result["stops"]], [row["kind"] for row in result["stops"]]
        redone = max(row["redone"] for row in result["stops"])
        times = f"{statistics.median(seconds):.1f}, {max(seconds):.1f}"
        lines.append(
            f"| {result['case']} | {len(seconds)} ({', '.join(kinds)}) | {times} | {redone:.1f} | {len(seconds)} |"
            f" {result['tracebacks']}, {result['dumps']} |"
        )
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "slurm_stops.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
