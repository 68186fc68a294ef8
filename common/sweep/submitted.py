"""The runs of a sweep as jobs through submitit: a Slurm job array (--executor slurm) or submitit's
local executor, waited for until each ends or the sweep is stopped, which cancels those not ended."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from ..run import records
from .runs import STOP, Run, RunJob


def submitit_executor(args: argparse.Namespace) -> Any:
    """submitit's executor for --executor slurm or submitit-local, its logs in runs/submitit."""
    import submitit

    folder = Path(args.cwd, "runs", "submitit", "%j")
    if args.executor == "submitit-local":
        executor = submitit.AutoExecutor(folder=folder, cluster="local")
        executor.update_parameters(timeout_min=args.timeout_min)
        return executor
    # a job comes back as many times as its run needs (submitit's default: 3 timeouts)
    executor = submitit.AutoExecutor(folder=folder, cluster="slurm", slurm_max_num_timeout=1_000_000)
    params = {
        "timeout_min": args.timeout_min,
        "slurm_array_parallelism": args.jobs,
        "slurm_partition": args.partition,
        "cpus_per_task": args.cpus_per_task,
        "gpus_per_node": args.gpus,
        "name": args.exp_name,
    }
    executor.update_parameters(**{k: v for k, v in params.items() if v is not None})
    return executor


# Slurm's states of a job that has ended (`scontrol show job`'s JobState); any other, it may still run
ENDED = set("COMPLETED CANCELLED FAILED TIMEOUT NODE_FAIL BOOT_FAIL DEADLINE OUT_OF_MEMORY REVOKED".split())


def slurm_holds(job: Any) -> bool:
    """True while a job with no result is one Slurm's controller still has pending or running. submitit
    asks sacct, which can show an array task that is being requeued as ended for a moment (the sweep
    then said "ended with no result (PENDING)" and exited while the job came back and finished)."""
    if job.paths.result_pickle.exists():
        return False
    try:
        shown = subprocess.run(["scontrol", "show", "job", job.job_id], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return False  # no scontrol: submitit's word stands
    if shown.returncode != 0:  # Slurm forgot the job (it has ended), or its controller did not answer: asked again
        return "Invalid job id" not in shown.stderr
    state = shown.stdout.partition("JobState=")[2].split()[:1]
    return bool(state) and state[0] not in ENDED


def run_submitted(runs: list[Run], args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every run as a job; one outcome each, in order. A stop of the sweep (Ctrl-C) cancels the jobs
    not ended (their runs save, SIGTERM being a stop) and says how to go on, at once."""
    executor = submitit_executor(args)
    # the folder this package is in: jobs import it
    root = str(Path(__file__).resolve().parents[__package__.count(".") + 1])
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    jobs = executor.map_array(RunJob(), runs)
    print(f"submitted {len(jobs)} jobs ({', '.join(job.job_id for job in jobs[:3])}...)", flush=True)
    slurm = args.executor == "slurm"

    def ended(job: Any) -> bool:
        return job.done() and not (slurm and slurm_holds(job))

    while STOP.signum is None and not all(ended(job) for job in jobs):
        time.sleep(1.0)  # a stop signal's handler returns here, and the loop sees it
    cancelled = [] if STOP.signum is None else [job for job in jobs if not ended(job)]
    for job in cancelled:
        job.cancel(check=False)
    if cancelled:
        ids = " ".join(job.job_id for job in cancelled)
        print(
            f"stopped by {signal.Signals(STOP.signum).name}: cancelled jobs {ids} (each run saves as its job ends); "
            f"to go on with them: {args.again}",
            flush=True,
        )
    outcomes = []
    for run, job in zip(runs, jobs, strict=True):
        try:
            if job in cancelled:
                raise RuntimeError("cancelled")
            outcomes.append(job.result())
        except Exception:  # noqa: BLE001 - a job that ended with no result (cancelled, killed, failed): said below
            folder = run.folder()
            did = (
                f"job {job.job_id} cancelled by the sweep's stop"
                if job in cancelled
                else f"job {job.job_id} ended with no result ({job.state}; its log: {job.paths.stdout})"
            )
            summary = records.read_json(folder / "summary.json") if folder else None
            outcomes.append(
                {"run": run.label, "did": did, "exit": None, "folder": folder and str(folder), "summary": summary}
            )
    return outcomes
