"""Runs a script over several env ids and seeds, each run in its normal runs/ folder, and summarizes them.

    python -m common.sweep ppo_vec.py --env-ids CartPole-v1 Acrobot-v1 --seeds 1 2 3 --jobs 2 -- --num-envs 8
    python -m common.sweep ppo_vec.py --env-ids Hopper-v5 Walker2d-v5 --seeds 1-10 --executor slurm \\
        --partition gpu --timeout-min 240 --cpus-per-task 8 --jobs 20 -- --total-timesteps 1000000
    python path/to/common/sweep.py path/to/ppo_vec.py --env-ids CartPole-v1 --seeds 1-3 --report reports/classic

A run is one (env id, seed) under --exp-name (default: the script's name) with the flags after --, run from this
folder. Run the same command again and finished runs are skipped, stopped or failed ones resume from their
checkpoint, missing ones start: a sweep is re-runnable and resumable, on one machine or on a cluster. A run is
reused only if it was made with the same flags, but for those that change nothing learned (--checkpoint-interval,
--num-workers, ...: common/results.py's TOLERATED) and a larger --total-timesteps, which extends it; with other
flags a new run starts beside it, and the sweep says why. A run another process is writing is never started twice.
Engines, none written here: --executor local runs --jobs runs at a time in a thread pool (they end with the sweep,
and Ctrl-C stops them, each saving); --executor slurm submits a SLURM job array through submitit (at most --jobs at
once; a job preempted or out of time stops its run, which saves, and requeues itself to resume it); --executor
submitit-local is submitit's local executor, the same path as SLURM, on this machine. --report DIR writes
DIR/report.md (per env: the runs, their steps and the flags that differ from the script's defaults, mean +- std and
IQM with a 95% bootstrap interval over seeds of the last-20 return; runs missing, running, unfinished or unreadable
named, never averaged) and DIR/<env>.png (mean and 95% band against global step and wall time).
"""

from __future__ import annotations

import argparse
import dataclasses
import fcntl
import math
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file, from any folder: common/ is imported from beside this one
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import results  # noqa: E402


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

    @property
    def key(self) -> str:
        return f"{self.env_id.replace('/', '-').replace(':', '-')}__{self.exp_name}__{self.seed}"

    def folders(self) -> list[Path]:
        """Every runs/ folder of this (env id, exp name, seed), oldest first."""
        return sorted(Path(self.cwd, "runs").glob(self.key + "__*"), key=lambda p: p.stat().st_mtime)

    def asked(self, saved: dict[str, Any]) -> dict[str, Any]:
        """The flag values this run asks for, as args.json writes them: the script's defaults (those `saved`, an
        args.json of the same script, records), with the flags given to every run and this run's own."""
        asked = dict(saved.get("defaults", {}))
        given = [*self.flags, "--env-id", self.env_id, "--seed", str(self.seed), "--exp-name", self.exp_name]
        asked.update(parse_flags(given, asked))
        return asked

    def differences(self, folder: Path) -> dict[str, tuple[Any, Any]]:
        """{field: (value asked, value the run in `folder` was made with)} for the flags that change results."""
        saved = results.read_json(folder / "args.json") or {}
        return results.differing(self.asked(saved), results.asked(saved)) if saved else {"args.json": ("here", None)}

    def folder(self) -> Path | None:
        """The newest runs/ folder of this run made with the flags it asks for, if it was started before."""
        same = [folder for folder in self.folders() if not self.differences(folder)]
        return same[-1] if same else None

    def command(self) -> tuple[list[str], str]:
        """The command line that runs, resumes or extends it, and what it will do; ([], why) if there is nothing to."""
        cmd = [sys.executable, self.script, "--env-id", self.env_id, "--seed", str(self.seed), "--exp-name",
               self.exp_name, *self.flags]  # fmt: skip
        folder = self.folder()
        if folder is None:
            other = self.folders()
            if not other:
                return cmd, "start"
            shown = ", ".join(f"{flag(name)} {theirs} there, {ours} here"
                              for name, (ours, theirs) in self.differences(other[-1]).items())  # fmt: skip
            return cmd, f"start (a new run: {other[-1].name} was made with other flags: {shown})"
        pid = results.writer(folder)
        if pid is not None:
            return [], f"running in process {pid}: skipped"
        if not (folder / "checkpoint.pt").exists():
            return cmd, "start (its earlier start saved nothing)"
        summary, saved = results.read_json(folder / "summary.json") or {}, results.read_json(folder / "args.json")
        total = self.asked(saved).get("total_timesteps")
        if summary.get("status") == "done" and total is not None and total <= saved.get("total_timesteps", 0):
            return [], "finished before: skipped"
        return [*cmd, "--resume", str(folder / "checkpoint.pt")], "resume"


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def parse_flags(words: list[str], like: dict[str, Any]) -> dict[str, Any]:
    """{field: value} of command-line flags, each value of the type of its default in `like` (an int, a float, a
    switch: --x or --no-x, a list, None); flags `like` does not have are left to the script to refuse."""
    found, k = {}, 0
    while k < len(words):
        word, k = words[k], k + 1
        if not word.startswith("--"):
            continue
        name, _, inline = word[2:].partition("=")
        field = name.replace("-", "_")
        if field.startswith("no_") and isinstance(like.get(field[3:]), bool):
            found[field[3:]] = False
            continue
        if field not in like:
            continue
        if isinstance(like[field], bool):
            found[field] = True
            continue
        values = [inline] if inline else []
        while not inline and k < len(words) and not words[k].startswith("--"):
            values.append(words[k])
            k += 1
        found[field] = _value(values, like[field])
    return found


def _value(values: list[str], default: Any) -> Any:
    def one(text: str) -> Any:
        if text == "None":
            return None
        for kind in (int, float):
            try:
                return kind(text)
            except ValueError:
                pass
        return text

    if isinstance(default, list):
        return [one(v) for v in values]
    value = one(values[0]) if values else None
    return float(value) if isinstance(default, float) and isinstance(value, int) else value


class Stop:
    """The sweep's stop: SIGINT or SIGTERM, passed on to the runs under way (which save and end), and no new run
    started after it. The handler records and forwards; it raises nothing."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.procs: set[subprocess.Popen] = set()

    def install(self) -> None:
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, self._forward)

    def _forward(self, signum: int, frame: Any) -> None:
        self.signum = self.signum or signum
        for proc in list(self.procs):
            proc.send_signal(signum)

    def started(self, proc: subprocess.Popen) -> None:
        self.procs.add(proc)
        if self.signum is not None:  # the stop came while it was starting
            proc.send_signal(self.signum)


STOP = Stop()


class RunJob:
    """Runs one Run to its end, its output in <cwd>/runs/sweep/<run>.log, holding <cwd>/runs/sweep/<run>.lock meanwhile,
    so that two sweeps never run it twice. Under submitit it is Checkpointable: when SLURM preempts the job or its
    time runs out, the run is stopped (it saves) and the job requeues itself to resume it."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None

    def __call__(self, run: Run) -> dict[str, Any]:
        outcome = {"run": run.label, "did": "not started: the sweep was stopped", "exit": None}
        if STOP.signum is not None:
            return outcome | {"folder": None, "summary": None}
        lock = Path(run.cwd, "runs", "sweep", run.key + ".lock")
        lock.parent.mkdir(parents=True, exist_ok=True)
        with open(lock, "a+") as held:
            try:
                fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                held.seek(0)
                return outcome | {"did": f"run by another sweep (process {held.read().strip()}): skipped",
                                  "folder": None, "summary": None}  # fmt: skip
            held.truncate(0)
            held.write(str(os.getpid()))
            held.flush()
            cmd, outcome["did"] = run.command()
            if cmd:
                outcome["exit"] = self._run(run, cmd)
        folder = run.folder()
        summary = results.read_json(folder / "summary.json") if folder else None
        return outcome | {"folder": str(folder) if folder else None, "summary": summary}

    def _run(self, run: Run, cmd: list[str]) -> int:
        log = Path(run.cwd, "runs", "sweep", f"{run.key}.log")
        env = dict(os.environ, **{results.END_WITH_PARENT: "1"})  # the run stops when the sweep dies
        with open(log, "a") as out:
            self.proc = subprocess.Popen(cmd, cwd=run.cwd, stdout=out, stderr=subprocess.STDOUT, env=env)
            STOP.started(self.proc)
            code = self.proc.wait()
        STOP.procs.discard(self.proc)
        self.proc = None
        return code

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


def judge(run: Run) -> tuple[Path | None, str | None]:
    """The run's folder, and why it cannot be averaged (None if it can): missing, running, unfinished, unreadable."""
    folder = run.folder()
    if folder is None:
        return None, "missing"
    if results.writer(folder) is not None:
        return folder, f"still running ({folder.name})"
    summary = results.read_json(folder / "summary.json") or {}
    step, last = summary.get("global_step", 0), summary.get("last_step") or math.inf
    if summary.get("status") != "done" or step < last:
        return folder, f"unfinished: {summary.get('status', 'no summary')} at {100 * step / last:.0f}% ({folder.name})"
    try:
        logged = max((s for s, _ in results.read_scalars(folder).get("losses/value_loss", [])), default=0)
    except Exception as exc:  # noqa: BLE001 - a damaged events file, whatever its damage
        return folder, f"unreadable: {type(exc).__name__} ({folder.name})"
    if logged < step:
        return folder, f"unreadable: its events end at step {logged}, its summary at {step} ({folder.name})"
    return folder, None


def report(runs: list[Run], out: Path, reference: dict[str, str] | None = None) -> list[str]:
    """DIR/report.md and DIR/<env>.png for the runs that finished with the flags asked (common/results.py computes
    the figures); the others are named, not averaged."""
    out.mkdir(parents=True, exist_ok=True)
    rows, columns, notes, averaged = {}, {}, [], {}
    for env_id in dict.fromkeys(run.env_id for run in runs):
        judged = [(run, *judge(run)) for run in runs if run.env_id == env_id]
        notes += [f"- {run.label}: {why}" for run, _, why in judged if why is not None]
        finished = [(run, folder) for run, folder, why in judged if why is None]
        if not finished:
            continue
        averaged[env_id] = [folder for _, folder in finished]
        saved = results.read_json(finished[0][1] / "args.json") or {}
        summaries = [results.read_json(folder / "summary.json") or {} for folder in averaged[env_id]]
        steps = sorted({summary["global_step"] for summary in summaries})
        flags = {
            name: value
            for name, value in results.asked(saved).items()
            if name not in ("env_id", "seed", "exp_name", *results.TOLERATED)
            and value != saved.get("defaults", {}).get(name)
        }
        seeds_run = ", ".join(str(run.seed) for run, _ in finished)
        columns[env_id] = (
            f" {seeds_run} | {'-'.join(map(str, dict.fromkeys([steps[0], steps[-1]])))} | "
            + (" ".join(f"{flag(name)} {value}" for name, value in flags.items()) or "defaults")
            + " |"
        )
        rows[env_id] = results.aggregate([results.final_return(folder) for folder in averaged[env_id]])
    lines = [f"Runs of {Path(runs[0].script).name} (--exp-name {runs[0].exp_name}), last-20 raw return of each run; "
             "mean +- std over seeds, IQM with a 95% percentile bootstrap interval (scipy). Only runs that finished "
             "with the flags asked are averaged.", ""]  # fmt: skip
    head, rule, *body = results.markdown_table(rows, reference)
    lines += [head + " seeds | steps | flags (the others: the script's defaults) |", rule + "---|---|---|"]
    lines += [row + columns[env_id] for env_id, row in zip(rows, body, strict=True)]
    if notes:
        lines += ["", "Not averaged:", *notes]
    for env_id, folders in averaged.items():
        png = results.plot_groups({env_id: folders}, out / f"{env_id.replace('/', '-').replace(':', '-')}.png", env_id)
        lines += ["", f"![{env_id}]({png.name})"]
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
        STOP.install()
        start = time.time()
        for outcome in run_all(runs, args):
            summary = outcome["summary"] or {}
            mean = summary.get("episodic_return_last_20")
            shown = "n/a" if mean is None else f"{mean:.1f}"
            print(f"{outcome['run']}: {outcome['did']}, exit {outcome['exit']}, status {summary.get('status', '?')}, "
                  f"last-20 return {shown}, {outcome['folder']}", flush=True)  # fmt: skip
            status = status or (outcome["exit"] not in (0, None))
        print(f"{len(runs)} runs in {time.time() - start:.0f} s", flush=True)
        if STOP.signum is not None:
            print(f"stopped by {signal.Signals(STOP.signum).name}: the runs under way saved their last iteration; the "
                  "same command resumes them and starts the rest", flush=True)  # fmt: skip
            return 128 + STOP.signum
    if args.report or args.report_only:
        print("\n".join(report(runs, args.report or Path("report"))), flush=True)
    return int(status)


if __name__ == "__main__":
    sys.exit(main())
