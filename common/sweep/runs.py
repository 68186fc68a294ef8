"""The runs of a sweep: which run an (env id, seed) is (the flags it was asked for), what it does
next (start, resume, extend, skip), running it held by one sweep at a time, the sweep's stop, and
the engines that run the runs."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ..run import flags, records, stops
from ..run.flags import flag
from ..vecenv.process_control import STOP_SIGNALS


def lock_holder(lock: Path) -> int | None:
    """The pid of the live process that holds the lock file `lock` (-1: one that wrote no pid),
    or None."""
    try:
        fd = os.open(lock, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return None
    except BlockingIOError:
        pid = os.read(fd, 32).split()[:1]
        return int(pid[0]) if pid and pid[0].isdigit() else -1
    finally:
        os.close(fd)


def read_args(path: Path) -> dict[str, Any] | None:
    """args.json as runs write it (what it was asked for: defaults and given; each resume and the
    flags it changed), or None (missing, unreadable, or of an older version)."""
    record = records.read_json(path)
    return record if record and isinstance(record.get("defaults"), dict) and "given" in record else None


@dataclasses.dataclass
class Run:
    """One run of a sweep: the script, its env id and seed, the flags every run gets, and the folder
    it runs from."""

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
        """Every runs/ folder of this (env id, exp name, seed), oldest first: by the time its name
        gives (the second it was made, then -2, -3, ...: folder.make_run_dir), not by the last write
        into it."""

        def made(folder: Path) -> tuple[int, int]:
            stamp, _, k = folder.name.rsplit("__", 1)[1].partition("-")
            return (int(stamp), int(k or 1)) if stamp.isdigit() and (k or "1").isdigit() else (0, 0)

        return sorted(Path(self.cwd, "runs").glob(self.key + "__*"), key=lambda folder: (made(folder), folder.name))

    def asked(self, saved: dict[str, Any]) -> dict[str, Any]:
        """The flag values this run asks for, as args.json writes them: the script's defaults (those
        `saved`, an args.json of the same script, records), with the flags given to every run and
        this run's own."""
        asked = dict(saved.get("defaults", {}))
        given = [*self.flags, "--env-id", self.env_id, "--seed", str(self.seed), "--exp-name", self.exp_name]
        asked.update(parse_flags(given, asked))
        return asked

    def differences(self, folder: Path) -> dict[str, tuple[Any, Any]]:
        """{field: (value asked, value the run in `folder` was made with)} for the flags that change
        results, its --total-timesteps included where it keeps that run from becoming the one asked
        (other_length)."""
        saved = read_args(folder / "args.json")
        if saved is None:  # none, one of an older version, or one edited out of shape
            return {"args.json": (None, None)}
        asked = self.asked(saved)
        found = flags.differing(asked, asked_of(saved))
        # torchrun's ranks: other iterations, and a resume needs as many
        if saved.get("world_size", 1) != 1:
            found["ranks"] = (1, saved["world_size"])
        reached = number((records.read_json(folder / "summary.json") or {}).get("global_step"))
        if (total := asked.get("total_timesteps")) is not None and (why := other_length(total, saved, reached)):
            found["total_timesteps"] = (total, why)
        return found

    def folder(self) -> Path | None:
        """The newest runs/ folder of this run made with the flags it asks for, if it was started
        before."""
        same = [folder for folder in self.folders() if not self.differences(folder)]
        return same[-1] if same else None

    def unlike(self, folder: Path) -> str:
        """Why the run in `folder` is not this one: "<folder> was made with other flags: --gamma
        0.99 there, 0.95 here", or "<folder> has no args.json telling what it was asked for"."""
        found = self.differences(folder)
        if "args.json" in found:
            return f"{folder.name} has no args.json telling what it was asked for"
        flags = ", ".join(
            f"{'torchrun ranks' if name == 'ranks' else flag(name)} {theirs} there, {ours} here"
            for name, (ours, theirs) in found.items()
        )
        return f"{folder.name} was made with other flags: {flags}"

    def untrained(self, folder: Path | None) -> bool:
        """True for a folder nobody writes whose start was stopped before it trained (a sweep killed
        in its first seconds): no checkpoint, and step 0 in summary.json (no summary.json: no events
        either). The run starts anew without it."""
        if folder is None or (folder / "checkpoint.pt").exists() or lock_holder(folder / records.LOCK) is not None:
            return False
        summary = records.read_json(folder / "summary.json")
        return summary.get("global_step") == 0 if summary else not any(folder.glob("events.*"))

    def command(self) -> tuple[list[str], str]:
        """The command line that runs, resumes or extends it, and what it will do; ([], why) if
        there is nothing to."""
        cmd = [
            sys.executable,
            self.script,
            "--env-id",
            self.env_id,
            "--seed",
            str(self.seed),
            "--exp-name",
            self.exp_name,
            *self.flags,
        ]
        folder = self.folder()
        if folder is None:
            other = self.folders()
            return cmd, f"start (a new run: {self.unlike(other[-1])})" if other else "start"
        pid = lock_holder(folder / records.LOCK)
        if pid is not None:
            return [], f"running in process {pid}: skipped"
        if self.untrained(folder):
            return cmd, f"start (its earlier start, {folder.name}, trained nothing: removed)"
        if not (folder / "checkpoint.pt").exists():
            return cmd, "start (a new run: its earlier start logged but saved nothing)"
        summary, saved = (records.read_json(folder / "summary.json") or {}, read_args(folder / "args.json"))
        total, reached = self.asked(saved).get("total_timesteps"), number(summary.get("global_step"))
        resume = [*cmd, "--resume", str(folder / "checkpoint.pt")]
        if summary.get("status") != "done":
            return resume, "resume"
        # its steps are those asked (other_length)
        if total is None or ends_at(total, saved) <= reached:
            return [], "finished before: skipped"
        return resume, f"extend (from {reached} to {ends_at(total, saved)} steps: no schedule spans it)"


def number(value: Any) -> int | float:
    """A figure a record gives, 0 where it gives none (or something else: a file edited by hand)."""
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else 0


def ends_at(total: int, saved: dict[str, Any]) -> int:
    """The step a run of args.json `saved`'s iteration size ends at when asked for `total` steps
    (whole iterations; `total` itself for a record that does not give the size)."""
    steps = number(saved.get("steps_per_iteration"))
    return total // steps * steps if steps > 0 else total


def other_length(total: int, saved: dict[str, Any], reached: int) -> str | None:
    """Why the run of args.json `saved`, at step `reached`, is not the run of `total` steps that its
    other flags make it (None: it is, once resumed to `total`), said as its --total-timesteps: with
    a SCHEDULED flag on, it was made for another number of iterations, or a resume changed that
    number; else it is past the steps asked."""
    trained = saved.get("total_timesteps")
    if not isinstance(trained, int):
        return "not recorded"
    # a schedule on (records of older versions: --anneal-lr)
    if any(saved.get(name) for name in saved.get("scheduled", ["anneal_lr"])):
        stretched = [
            change
            for resume in saved.get("resumes", [])
            if isinstance(resume, dict)
            and (change := resume.get("changed", {}).get("total_timesteps"))
            and ends_at(number(change[0]), saved) != ends_at(number(change[1]), saved)
        ]
        if stretched:
            before, after = stretched[0]
            return f"{before} made {after} by a resume (--anneal-lr's schedule changed midway)"
        if ends_at(trained, saved) == ends_at(total, saved):
            return None
        return f"{trained} (--anneal-lr: the learning rate falls over all of them)"
    return f"{trained} (at step {reached})" if reached > ends_at(total, saved) else None


def asked_of(saved: dict[str, Any]) -> dict[str, Any]:
    """What a run was asked for, from its args.json: the script's defaults and the flags its
    command line gave (a flag's effect, such as norm_obs off for Discrete actions, is not what
    was asked)."""
    return {**saved.get("defaults", {}), **{name: saved[name] for name in saved.get("given", []) if name in saved}}


def parse_flags(words: list[str], like: dict[str, Any]) -> dict[str, Any]:
    """{field: value} of command-line flags, each value of the type of its default in `like` (an
    int, a float, a switch: --x or --no-x, a list, None); flags `like` does not have are left to the
    script to refuse."""
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
    """The sweep's stop: a stop signal (SIGINT, SIGTERM, a scheduler's warning: the scripts' own),
    passed on to the runs under way (which save and end), and no new run started after it. The
    handler records and forwards; it raises nothing."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.procs: set[subprocess.Popen] = set()

    def install(self) -> None:
        for signum in STOP_SIGNALS:
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
# seconds a sweep waits for a run still saving after its sweep was killed (the scripts stop within
# 120)
WAIT = 150.0


class RunJob:
    """Runs one Run to its end, its output in <cwd>/runs/sweep/<run>.log, holding
    <cwd>/runs/sweep/<run>.lock meanwhile, so that two sweeps never run it twice.

    Under submitit on Slurm each slice of the job says in submitit's log (runs/submitit/<job>/) what
    it does and how it ended. Slurm's warning before a time limit or a preemption (USR2, which
    submitit asks for, or USR1) stops the run, which saves, and the job requeues itself to resume it,
    as many times as the run needs. A SIGTERM (Slurm requeues, preempts or cancels the job) stops
    the run too, and the slice ends without a result: a job Slurm requeues resumes the run, and a
    sweep run again resumes one it cancelled."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None

    def __call__(self, run: Run) -> dict[str, Any]:
        outcome = {"run": run.label, "did": "not started: the sweep was stopped", "exit": None}
        if STOP.signum is not None:
            return outcome | {"folder": None, "summary": None}
        slurm = "SUBMITIT_FOLDER" in os.environ and "SLURM_JOB_ID" in os.environ
        if slurm:  # a warning by either signal: submitit's handler checkpoints and requeues
            signal.signal(signal.SIGUSR1, signal.getsignal(signal.SIGUSR2))
        lock = Path(run.cwd, "runs", "sweep", run.key + ".lock")
        lock.parent.mkdir(parents=True, exist_ok=True)
        with open(lock, "a+") as held:
            try:
                fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                held.seek(0)
                return outcome | {
                    "did": f"run by another sweep (process {held.read().strip()}): skipped",
                    "folder": None,
                    "summary": None,
                }
            held.truncate(0)
            held.write(str(os.getpid()))
            held.flush()
            cmd, outcome["did"] = run.command()
            deadline = time.monotonic() + WAIT
            while not cmd and outcome["did"].startswith("running in process") and time.monotonic() < deadline:
                # a run of a sweep killed a moment ago is saving: its end is bounded (STOP_WITHIN)
                time.sleep(0.5)
                cmd, outcome["did"] = run.command()
            if cmd and run.untrained(stale := run.folder()):
                shutil.rmtree(stale)  # the run starts in a folder of its own: one folder per run
            if slurm:
                slice_of = (
                    f"slice {int(os.environ.get('SLURM_RESTART_COUNT', 0)) + 1} of job {os.environ['SLURM_JOB_ID']}"
                )
                print(f"{run.label}: {outcome['did']} ({slice_of})", flush=True)
            if cmd:
                outcome["exit"] = self._run(run, cmd)
        folder = run.folder()
        summary = records.read_json(folder / "summary.json") if folder else None
        if slurm:
            print(f"{run.label}: {ended(summary)}", flush=True)
            if (summary or {}).get("status", "").startswith("stopped by"):  # Slurm ends this slice: no result
                print(f"{run.label}: this slice ends here; a requeued job resumes the run", flush=True)
                os._exit(outcome["exit"] or 1)
        return outcome | {"folder": str(folder) if folder else None, "summary": summary}

    def _run(self, run: Run, cmd: list[str]) -> int:
        log = Path(run.cwd, "runs", "sweep", f"{run.key}.log")
        # the run stops when the sweep dies
        env = dict(os.environ, **{stops.END_WITH_PARENT: str(os.getpid())})
        with open(log, "a") as out:
            self.proc = subprocess.Popen(cmd, cwd=run.cwd, stdout=out, stderr=subprocess.STDOUT, env=env)
            STOP.started(self.proc)
            code = self.proc.wait()
        STOP.procs.discard(self.proc)
        self.proc = None
        return code

    def checkpoint(self, run: Run) -> Any:
        """submitit's hook when Slurm warns of a time limit or a preemption: the run (which Slurm
        warned too; submitit-local warns only this process) stops and saves, then the job comes back
        to resume it. It runs in a signal handler while the main thread waits for the run, so the
        run's end is awaited on its pidfd, never through Popen's lock."""
        import submitit

        proc, self.proc = self.proc, None
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                exited = os.pidfd_open(proc.pid)
                proc.send_signal(signal.SIGUSR2)
                select.select([exited], [], [], WAIT)  # the scripts bound their own stop path at 120 s
                os.close(exited)
        folder = run.folder()
        print(
            f"{run.label}: {ended(records.read_json(folder / 'summary.json') if folder else None)}; requeued",
            flush=True,
        )
        return submitit.helpers.DelayedSubmission(self, run)

    def __getstate__(self) -> dict:
        return {"proc": None}


def ended(summary: dict | None) -> str:
    """How a run's summary says it ended: "stopped by SIGUSR2, saved at iteration 40"."""
    if summary is None:
        return "no summary: it never started"
    saved = summary.get("checkpoint_iteration")
    return f"{summary.get('status')}, {'nothing saved' if saved is None else f'saved at iteration {saved}'}"


def run_all(runs: list[Run], args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every run, through the chosen engine; one outcome each, in order."""
    if args.executor == "local":
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:  # each run is a process of its own
            return list(pool.map(lambda run: RunJob()(run), runs))
    from .submitted import run_submitted  # submitit, only where it is asked for

    return run_submitted(runs, args)


MAX_RUNS = 10_000  # seeds a sweep takes at most (a range such as 0-4294967295 is a typo)


def seeds(spec: list[str]) -> list[int]:
    """Seeds as given: 1 2 3, or ranges 1-10; ValueError naming an item that is neither, or too
    many."""
    found: list[int] = []
    for item in spec:
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", item, re.ASCII)
        lo, hi = (int(match[1]), int(match[2] or match[1])) if match else (1, 0)
        if not lo <= hi < 2**32:
            raise ValueError(f"--seeds {item}: write seeds in [0, 2**32), or ranges low-high such as 1-10")
        if len(found) + hi - lo + 1 > MAX_RUNS:
            raise ValueError(f"--seeds {' '.join(spec)} asks for over {MAX_RUNS} seeds: a sweep takes at most that")
        found += range(lo, hi + 1)
    return found
