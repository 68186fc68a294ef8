"""Runs a script over several env ids and seeds, each run in its normal runs/ folder, and summarizes them.

    python -m common.sweep ppo_vec.py --env-ids CartPole-v1 Acrobot-v1 --seeds 1 2 3 --jobs 2 -- --num-envs 8
    python -m common.sweep ppo_vec.py --env-ids Hopper-v5 Walker2d-v5 --seeds 1-10 --executor slurm \\
        --partition gpu --timeout-min 240 --cpus-per-task 8 --jobs 20 -- --total-timesteps 1000000
    python -m common.sweep ppo_vec.py --env-ids CartPole-v1 Acrobot-v1 --seeds 1 2 3 --report reports/classic

A run is one (env id, seed) under --exp-name (default: the script's name), run from this folder. Run the same command
again and finished runs are skipped, stopped or failed ones resume from their checkpoint, missing ones start: a sweep
is re-runnable and resumable, on one machine or on a cluster. Engines, none written here: --executor local runs --jobs
runs at a time in a thread pool; --executor slurm submits a SLURM job array through submitit (at most --jobs at once;
a job preempted or out of time stops its run, which saves, and requeues itself to resume it); --executor
submitit-local is submitit's local executor, the same path as SLURM, on this machine (all runs at once). --report DIR
writes DIR/report.md (per env: mean +- std and IQM with a 95% bootstrap interval over seeds of the last-20 return) and
DIR/<env>.png (mean and 95% band against global step and wall time), from the runs' TensorBoard events.
"""

from __future__ import annotations

import argparse
import dataclasses
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from common import results


@dataclasses.dataclass
class Run:
    """One run of a sweep: the script, its env id and seed, the flags every run gets, and the folder it runs from."""

    script: str
    env_id: str
    seed: int
    exp_name: str
    flags: list[str]
    cwd: str

    @property
    def label(self) -> str:
        return f"{self.env_id} seed {self.seed}"

    def folder(self) -> Path | None:
        """The newest runs/ folder of this run, if it was started before."""
        name = f"{self.env_id.replace('/', '-').replace(':', '-')}__{self.exp_name}__{self.seed}__"
        found = sorted(Path(self.cwd, "runs").glob(name + "*"), key=lambda p: p.stat().st_mtime)
        return found[-1] if found else None

    def command(self) -> tuple[list[str], str]:
        """The command line that runs, resumes or extends it, and what it will do; ([], why) if there is nothing to."""
        cmd = [sys.executable, self.script, "--env-id", self.env_id, "--seed", str(self.seed), "--exp-name",
               self.exp_name, *self.flags]  # fmt: skip
        folder = self.folder()
        if folder is None or not (folder / "checkpoint.pt").exists():
            return cmd, "start"
        summary, saved = results.read_json(folder / "summary.json") or {}, results.read_json(folder / "args.json") or {}
        total = _flag_value(self.flags, "--total-timesteps")
        if summary.get("status") == "done" and (total is None or int(total) <= int(saved.get("total_timesteps", 0))):
            return [], "finished before: skipped"
        return [*cmd, "--resume", str(folder / "checkpoint.pt")], "resume"


def _flag_value(flags: list[str], name: str) -> str | None:
    for i, flag in enumerate(flags):
        if flag == name and i + 1 < len(flags):
            return flags[i + 1]
        if flag.startswith(name + "="):
            return flag.split("=", 1)[1]
    return None


class RunJob:
    """Runs one Run to its end, its output in <cwd>/runs/<label>.log. Under submitit it is Checkpointable: when SLURM
    preempts the job or its time runs out, the run is stopped (it saves) and the job requeues itself to resume it."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None

    def __call__(self, run: Run) -> dict[str, Any]:
        cmd, what = run.command()
        outcome = {"run": run.label, "did": what, "exit": 0}
        if cmd:
            log = Path(run.cwd, "runs", f"{run.exp_name}__{run.env_id.replace('/', '-')}__{run.seed}.log")
            log.parent.mkdir(parents=True, exist_ok=True)
            with open(log, "a") as out:
                self.proc = subprocess.Popen(cmd, cwd=run.cwd, stdout=out, stderr=subprocess.STDOUT)
                outcome["exit"] = self.proc.wait()
                self.proc = None
        folder = run.folder()
        summary = results.read_json(folder / "summary.json") if folder else None
        return outcome | {"folder": str(folder) if folder else None, "summary": summary}

    def checkpoint(self, run: Run) -> Any:
        """submitit's hook before a requeue: stop the run (it saves), then come back to resume it."""
        import submitit

        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=150)  # the scripts bound their own stop path at 120 s
        self.proc = None
        return submitit.helpers.DelayedSubmission(self, run)

    def __getstate__(self) -> dict:
        return {"proc": None}


def submitit_executor(args: argparse.Namespace) -> Any:
    """submitit's executor for --executor slurm or submitit-local, its logs in runs/submitit."""
    import submitit

    folder = Path(args.cwd, "runs", "submitit", "%j")
    if args.executor == "submitit-local":
        executor = submitit.AutoExecutor(folder=folder, cluster="local")
        executor.update_parameters(timeout_min=args.timeout_min)
        return executor
    executor = submitit.AutoExecutor(folder=folder, cluster="slurm")
    params = {"timeout_min": args.timeout_min, "slurm_array_parallelism": args.jobs, "slurm_partition": args.partition,
              "cpus_per_task": args.cpus_per_task, "gpus_per_node": args.gpus, "name": args.exp_name}  # fmt: skip
    executor.update_parameters(**{k: v for k, v in params.items() if v is not None})
    return executor


def run_all(runs: list[Run], args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every run, through the chosen engine; one outcome each, in order."""
    if args.executor == "local":
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:  # each run is a process of its own
            return list(pool.map(lambda run: RunJob()(run), runs))
    executor = submitit_executor(args)
    jobs = executor.map_array(RunJob(), runs)
    print(f"submitted {len(jobs)} jobs ({', '.join(job.job_id for job in jobs[:3])}...)", flush=True)
    return [job.result() for job in jobs]


def report(runs: list[Run], out: Path, reference: dict[str, str] | None = None) -> list[str]:
    """DIR/report.md and DIR/<env>.png for the runs found (common/results.py computes the figures)."""
    out.mkdir(parents=True, exist_ok=True)
    by_env: dict[str, list[Path]] = {}
    for run in runs:
        folder = run.folder()
        if folder is not None:
            by_env.setdefault(run.env_id, []).append(folder)
    rows = {env: results.aggregate([results.final_return(f) for f in folders]) for env, folders in by_env.items()}
    lines = [f"Runs of {runs[0].script} (--exp-name {runs[0].exp_name}), last-20 raw return of each run; "
             "mean +- std over seeds, IQM with a 95% percentile bootstrap interval (scipy).", ""]  # fmt: skip
    lines += results.markdown_table(rows, reference)
    for env, folders in by_env.items():
        png = results.plot_groups({env: folders}, out / f"{env.replace('/', '-').replace(':', '-')}.png", env)
        lines += ["", f"![{env}]({png.name})"]
    (out / "report.md").write_text("\n".join(lines) + "\n")
    return lines


def seeds(spec: list[str]) -> list[int]:
    """Seeds as given: 1 2 3, or ranges 1-10."""
    found = []
    for item in spec:
        lo, _, hi = item.partition("-")
        found += list(range(int(lo), int(hi or lo) + 1))
    return found


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    own, flags = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(prog="python -m common.sweep", description=__doc__.split("\n\n")[0],
                                     epilog="Flags after -- go to every run.")  # fmt: skip
    parser.add_argument("script", help="the script to run, e.g. ppo_vec.py")
    parser.add_argument("--env-ids", nargs="+", required=True)
    parser.add_argument("--seeds", nargs="+", default=["1"], help="seeds, or ranges: 1 2 3, 1-10")
    parser.add_argument("--exp-name", help="the runs' --exp-name (default: the script's name)")
    parser.add_argument("--executor", choices=["local", "slurm", "submitit-local"], default="local")
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time (local), jobs at a time (slurm)")
    parser.add_argument("--partition", help="SLURM partition")
    parser.add_argument("--timeout-min", type=int, default=24 * 60, help="a job's time limit, minutes (submitit)")
    parser.add_argument("--cpus-per-task", type=int, help="SLURM cpus per task")
    parser.add_argument("--gpus", type=int, help="SLURM gpus per node")
    parser.add_argument("--report", type=Path, help="write report.md and curves for the runs into this folder")
    parser.add_argument("--report-only", action="store_true", help="only the report, from the runs there are")
    args = parser.parse_args(own)
    if args.jobs < 1:
        parser.error(f"--jobs must be >= 1, got {args.jobs}")
    if not Path(args.script).is_file():
        parser.error(f"{args.script}: no such script")
    args.exp_name = args.exp_name or Path(args.script).stem
    args.cwd = str(Path.cwd())
    runs = [Run(str(Path(args.script).resolve()), env_id, seed, args.exp_name, flags, args.cwd)
            for env_id in args.env_ids for seed in seeds(args.seeds)]  # fmt: skip
    status = 0
    if not args.report_only:
        start = time.time()
        for outcome in run_all(runs, args):
            summary = outcome["summary"] or {}
            mean = summary.get("episodic_return_last_20")
            shown = "n/a" if mean is None else f"{mean:.1f}"
            print(f"{outcome['run']}: {outcome['did']}, exit {outcome['exit']}, status {summary.get('status', '?')}, "
                  f"last-20 return {shown}, {outcome['folder']}", flush=True)  # fmt: skip
            status = status or (outcome["exit"] != 0)
        print(f"{len(runs)} runs in {time.time() - start:.0f} s", flush=True)
    if args.report or args.report_only:
        print("\n".join(report(runs, args.report or Path("report"))), flush=True)
    return int(status)


if __name__ == "__main__":
    sys.exit(main())
