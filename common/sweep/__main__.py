"""python -m <package>.sweep (from the folder that holds <package>/), or python
path/to/<package>/sweep (from anywhere): see __init__.py beside this file."""

from __future__ import annotations

import argparse
import importlib
import shlex
import shutil
import signal
import sys
import time
from importlib.util import find_spec
from pathlib import Path

# run as a folder: the package is imported from beside it, under its own name
if __package__ in (None, ""):
    _here = Path(__file__).resolve().parent
    sys.path.insert(0, str(_here.parent.parent))
    sys.exit(importlib.import_module(f"{_here.parent.name}.sweep.__main__").main())

from . import __doc__ as about  # noqa: E402
from .report import report  # noqa: E402
from .runs import STOP, Run, run_all, seeds  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    own, flags = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(
        prog=f"python -m {__package__}",
        description="\n\n".join(about.split("\n\n")[:2]).replace("<package>", __package__.rpartition(".")[0]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Flags after -- go to every run.",
    )
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
    for name, least in (("jobs", 1), ("timeout_min", 1), ("cpus_per_task", 1), ("gpus", 0)):
        if getattr(args, name) is not None and getattr(args, name) < least:
            parser.error(f"--{name.replace('_', '-')} must be >= {least}, got {getattr(args, name)}")
    if not Path(args.script).is_file():
        parser.error(f"{args.script}: no such script")
    needs = {"submitit": args.executor != "local", "matplotlib": args.report or args.report_only}
    for package in [package for package, needed in needs.items() if needed and not find_spec(package)]:
        parser.error(f"{package} is not installed: pip install {package} (or the project's [sweep] extra)")
    if args.report is not None and args.report.exists() and not args.report.is_dir():
        parser.error(f"--report {args.report}: a file of that name is in the way (the report is a folder)")
    try:
        chosen = seeds(args.seeds)
    except ValueError as exc:
        parser.error(str(exc))
    args.exp_name = args.exp_name or Path(args.script).stem
    args.cwd = str(Path.cwd())
    # this sweep again, as it can be pasted here: the folder form runs from anywhere
    on_path = Path(shutil.which("python") or "").resolve() == Path(sys.executable).resolve()
    python = "python" if on_path else sys.executable
    args.again = shlex.join([python, str(Path(__file__).resolve().parent), *argv])
    runs = [
        Run(str(Path(args.script).resolve()), env_id, seed, args.exp_name, flags, args.cwd)
        for env_id in dict.fromkeys(args.env_ids)  # each run once, however often it is named
        for seed in dict.fromkeys(chosen)
    ]
    status = 0
    if not args.report_only:
        STOP.install()
        start, unfinished = time.time(), []
        for outcome in run_all(runs, args):
            summary = outcome["summary"] or {}
            mean = summary.get("episodic_return_last_20")
            shown = f"{mean:.1f}" if isinstance(mean, (int, float)) else "n/a"
            ran = f", exit {outcome['exit']}" if outcome["exit"] is not None else ""
            status_now = f"status {summary.get('status', '?')}, last-20 return {shown}, {outcome['folder']}"
            print(f"{outcome['run']}: {outcome['did']}{ran}, {status_now}", flush=True)
            status = status or (outcome["exit"] not in (0, None))
            if summary.get("status") != "done":
                saved = summary.get("checkpoint_iteration")
                what = f"saved at iteration {saved}" if saved is not None else "nothing saved"
                unfinished.append(
                    f"{outcome['run']} ({summary['status']}, {what})"
                    if "status" in summary
                    else f"{outcome['run']} ({outcome['did']})"
                )
        print(f"{len(runs)} runs in {time.time() - start:.0f} s", flush=True)
        if unfinished:
            print(
                f"unfinished: {', '.join(unfinished)}; the same command resumes what was saved and starts the rest",
                flush=True,
            )
        if STOP.signum is not None:
            print(f"stopped by {signal.Signals(STOP.signum).name}", flush=True)
            return 128 + STOP.signum
        status = status or bool(unfinished)
    if args.report or args.report_only:
        print("\n".join(report(runs, args.report or Path("report"))), flush=True)
    return int(status)


if __name__ == "__main__":
    sys.exit(main())
