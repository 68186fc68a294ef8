"""Stops on a loaded machine: runs of both scripts signalled at random moments, as a scheduler ends jobs.

    python benchmarks/stops.py                      # 100 stops, two busy loops loading the machine
    python benchmarks/stops.py --stops 20 --cases vec-workers atari-2 --load 0

Cases (each with --checkpoint-interval 1, so that many stops fall during a save):
  vec-default     ppo_vec.py's own command (CartPole, 8 envs, its default layout: in the trainer);
                  SIGINT or SIGTERM to the trainer
  vec-in-process  ppo_vec.py, 4 CartPoles in the trainer (--num-workers 0), small iterations; SIGINT
                  or SIGTERM to the trainer
  vec-workers     ppo_vec.py, CartPole in 2 workers; SIGINT or SIGTERM to every process of the run,
                  in a random order
  atari-1         ppo_atari_multigpu.py, one rank; SIGINT or SIGTERM to every process, in a random order
  atari-2         ppo_atari_multigpu.py, two ranks under torchrun; SIGTERM to every process of the job
                  (the launcher too, which forwards its own), in a random order
  crashing        ppo_vec.py on a CartPole whose workers die about every 50 steps (--max-restarts
                  100000): SIGTERM to the workers, the forkserver and every other helper, then 200 ms
                  later to the trainer

A case's runs are timed once to their end; each stop then comes at a random moment between the
launch and that end (start-up included). A stop passes when every process of the job has ended
within 10 s of the first signal, the trainer exited 128 + its signal (or was ended by the signal
itself, while Python was still importing torch: the shell's 130/143 too; under torchrun, whose
launcher exits its own way, rank 0's summary.json says "stopped by", if the run got that far), a
checkpoint exists whenever an iteration had been logged, and a resume from that checkpoint to two
more iterations logs every iteration exactly once. Prints each stop, then per case and in all: the
count, the median and the slowest time to end, and every failure; the summary also goes to
benchmarks/results/stops.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.report import MACHINE, RESULTS  # noqa: E402
from tests.helpers import alive, descendants, read_scalars  # noqa: E402

WITHIN = 10.0  # seconds a stop may take
GIVE_UP = 40.0  # seconds after which a stop that has not ended is killed (and failed)
VEC_TINY = ["--num-envs", "4", "--num-steps", "32", "--num-minibatches", "2", "--update-epochs", "2"]
ATARI_TINY = ["--local-num-envs", "2", "--num-steps", "8", "--num-minibatches", "2", "--update-epochs", "2"]


@dataclasses.dataclass
class Case:
    script: str
    args: list[str]
    batch: int  # global steps per iteration
    signals: tuple[signal.Signals, ...]
    order: str  # "trainer", "all" (random order), "others-first" (200 ms before the trainer)
    ranks: int = 1
    env: dict = dataclasses.field(default_factory=dict)

    def command(self, extra: list[str]) -> list[str]:
        script = str(REPO / self.script)
        if self.ranks == 1:
            return [sys.executable, script, *self.args, *extra]
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={self.ranks}"]
        return [*launcher, script, *self.args, *extra]


SIGNALS = (signal.SIGINT, signal.SIGTERM)
CASES = {
    "vec-default": Case("ppo_vec.py", ["--env-id", "CartPole-v1", "--num-envs", "8"], 1024, SIGNALS, "trainer"),
    "vec-in-process": Case("ppo_vec.py", [*VEC_TINY, "--num-workers", "0"], 128, SIGNALS, "trainer"),
    "vec-workers": Case("ppo_vec.py", [*VEC_TINY, "--num-workers", "2"], 128, SIGNALS, "all"),
    "atari-1": Case("ppo_atari_multigpu.py", [*ATARI_TINY, "--num-workers", "1"], 16, SIGNALS, "all"),
    "atari-2": Case("ppo_atari_multigpu.py", [*ATARI_TINY, "--num-workers", "1"], 32, (signal.SIGTERM,), "all", 2),
    "crashing": Case(
        "ppo_vec.py",
        [
            *VEC_TINY,
            "--num-workers",
            "2",
            "--env-id",
            "benchmarks.soak:CrashingCartPole-v1",
            "--max-restarts",
            "100000",
        ],
        128,
        (signal.SIGTERM,),
        "others-first",
        env={"SOAK_CRASH_EVERY": "50"},
    ),
}
ITERATIONS = {"vec-default": 12}  # a run's length: ~10 s of training here
ITERATIONS_OF_SCRIPT = {"ppo_vec.py": 60, "ppo_atari_multigpu.py": 30}


def launch(case: Case, cwd: str, extra: list[str]) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1", **case.env)
    return subprocess.Popen(
        case.command(extra),
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def family(proc: subprocess.Popen) -> set[int]:
    return {proc.pid, *descendants(proc.pid)}


def trainers(case: Case, proc: subprocess.Popen) -> set[int]:
    """The processes that run the script's main: the launched one, or torchrun's ranks (its
    direct children)."""
    if case.ranks == 1:
        return {proc.pid}
    return {pid for pid in descendants(proc.pid) if _parent(pid) == proc.pid}


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError):
        return None


def send(case: Case, proc: subprocess.Popen, sig: signal.Signals, rng: random.Random) -> float:
    """Signals the job as the case says; returns when the first signal went."""
    main = trainers(case, proc)
    others = sorted(family(proc) - main)
    first = time.monotonic()
    if case.order == "trainer":
        targets = [[proc.pid]]
    elif case.order == "others-first":
        targets = [others, sorted(main)]
    else:
        everything = sorted(family(proc))
        rng.shuffle(everything)
        targets = [everything]
    for k, group in enumerate(targets):
        if k:
            time.sleep(0.2)
        for pid in group:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
            time.sleep(rng.uniform(0, 0.005))
    return first


def ended(proc: subprocess.Popen, pids: set[int], deadline: float) -> bool:
    """Waits until the launched process has exited and every pid of the job is gone, or the
    deadline passes."""
    while time.monotonic() < deadline:
        if proc.poll() is not None and not [pid for pid in pids if alive(pid)]:
            return True
        time.sleep(0.02)
    return False


def logged_iterations(run_dir: Path | None) -> list[int]:
    if run_dir is None or not list(run_dir.glob("events.*")):
        return []
    return [step for step, _ in read_scalars(run_dir).get("losses/value_loss", [])]


def run_dir_of(cwd: str) -> Path | None:
    found = list(Path(cwd, "runs").glob("*")) if Path(cwd, "runs").is_dir() else []
    return found[0] if found else None


def checkpoint_of(run_dir: Path | None) -> dict | None:
    import torch

    path = None if run_dir is None else run_dir / "checkpoint.pt"
    return torch.load(path, weights_only=True, map_location="cpu") if path and path.exists() else None


def one_stop(case: Case, total: int, seconds: float, rng: random.Random, sig: signal.Signals) -> dict:
    with tempfile.TemporaryDirectory() as cwd:
        extra = ["--total-timesteps", str(total), "--checkpoint-interval", "1"]
        proc = launch(case, cwd, extra)
        delay = rng.uniform(0.0, seconds)
        time.sleep(delay)
        pids = family(proc)
        if proc.poll() is not None:  # before the signal: finished, or failed (a failure of its own)
            _, err = proc.communicate()
            if proc.returncode == 0:
                return {"outcome": "finished first", "delay": delay}
            return {
                "outcome": f"failed before the signal, exit {proc.returncode}: {err.strip().splitlines()[-3:]}",
                "delay": delay,
                "seconds": 0.0,
                "exit": proc.returncode,
                "signal": sig.name,
                "iterations_logged": 0,
            }
        first = send(case, proc, sig, rng)
        pids |= family(proc)
        done = ended(proc, pids, first + GIVE_UP)
        took = time.monotonic() - first
        if not done:
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        out, err = proc.communicate(timeout=30)
        result = {"delay": delay, "seconds": took, "exit": proc.returncode, "signal": sig.name}
        problems = []
        if not done:
            problems.append(f"still running {GIVE_UP:g} s after the signal")
        elif took > WITHIN:
            problems.append(f"took {took:.1f} s")
        run_dir = run_dir_of(cwd)
        summary_file = run_dir / "summary.json" if run_dir else None
        summary = json.loads(summary_file.read_text()) if summary_file and summary_file.exists() else {}
        if summary.get("status") == "done":  # the signal came as the run (or torchrun, after it) was ending
            return {"outcome": "finished first", "delay": delay}
        # -sig: before Python set its handlers
        if case.ranks == 1 and proc.returncode not in (128 + sig, -sig):
            problems.append(f"exit {proc.returncode}: {err.strip().splitlines()[-1:] if err.strip() else ''}")
        # rank 0's own account
        if case.ranks > 1 and summary and not summary["status"].startswith("stopped by"):
            problems.append(f"summary.json says {summary['status']!r}: {err.strip().splitlines()[-3:]}")
        logged = logged_iterations(run_dir)
        checkpoint = checkpoint_of(run_dir)
        result["iterations_logged"] = len(logged)
        if logged and checkpoint is None:
            problems.append(f"{len(logged)} iterations logged, no checkpoint")
        if checkpoint is not None and not problems:
            problems += resume(case, cwd, run_dir, checkpoint)
        result["outcome"] = "; ".join(problems) or "ok"
        return result


def resume(case: Case, cwd: str, run_dir: Path, checkpoint: dict) -> list[str]:
    total = checkpoint["global_step"] + 2 * case.batch
    proc = launch(case, cwd, ["--total-timesteps", str(total), "--resume", str(run_dir / "checkpoint.pt")])
    try:
        _, err = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return ["the resume did not end within 300 s"]
    if proc.returncode != 0:
        return [f"the resume exited {proc.returncode}: {err.strip().splitlines()[-1:]}"]
    expected = list(range(case.batch, total + 1, case.batch))
    logged = logged_iterations(run_dir)
    if logged != expected:
        return [f"after the resume, iterations logged at {logged} (expected each of {len(expected)} once)"]
    return []


def calibrate(case: Case, total: int) -> float:
    """Seconds from launch to the end of a whole run of the case (what stops are spread over)."""
    with tempfile.TemporaryDirectory() as cwd:
        start = time.monotonic()
        proc = launch(case, cwd, ["--total-timesteps", str(total), "--checkpoint-interval", "1"])
        _, err = proc.communicate(timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"a whole run of the case failed: {err[-3000:]}")
        return time.monotonic() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stops", type=int, default=100)
    parser.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    parser.add_argument("--load", type=int, default=2, help="busy loops beside the runs (a shared node)")
    parser.add_argument("--seed", type=int, default=0, help="seeds the moments, signals and orders")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.load)]
    results: dict[str, list[dict]] = {name: [] for name in args.cases}
    try:
        lengths = {}
        for name in args.cases:
            case = CASES[name]
            total = ITERATIONS.get(name, ITERATIONS_OF_SCRIPT[case.script]) * case.batch
            lengths[name] = (total, calibrate(case, total))
            print(f"{name}: a whole run of {total} steps takes {lengths[name][1]:.1f} s here", flush=True)
        k, delivered = 0, 0
        while delivered < args.stops:
            name = args.cases[k % len(args.cases)]
            k += 1
            case = CASES[name]
            sig = rng.choice(case.signals)
            result = one_stop(case, *lengths[name], rng, sig)
            results[name].append(result)
            if result["outcome"] == "finished first":
                print(f"    {name}: the run ended before the signal ({result['delay']:.1f} s)", flush=True)
                continue
            delivered += 1
            print(
                f"{delivered:3d} {name}: {sig.name} at {result['delay']:.1f} s, ended in "
                f"{result['seconds']:.2f} s, "
                f"exit {result['exit']}, {result['iterations_logged']} iterations logged: "
                f"{result['outcome']}",
                flush=True,
            )
    finally:
        for loop in loops:
            loop.kill()
    command = " ".join(["python benchmarks/stops.py", *sys.argv[1:]])
    lines = [
        f"# Stops on a loaded machine ({args.load} busy loops beside the runs)",
        "",
        f"`{command}`, {time.strftime('%Y-%m-%d')}, {MACHINE}. A stop passes when every process of the job "
        "ended within 10 s of the first signal with the stop's exit status, a checkpoint exists whenever an "
        "iteration had been logged, and a resume logs every iteration once (see the script's docstring).",
        "",
        "| case | stops | failed | median time to end | slowest |",
        "|---|---|---|---|---|",
    ]
    everything, failures = [], []
    for name, rows in [*results.items(), ("all", None)]:
        rows = [r for r in (rows if rows is not None else everything) if r["outcome"] != "finished first"]
        if name != "all":
            everything += rows
            failures += [
                f"- {name}: {r['signal']} at {r['delay']:.1f} s: {r['outcome']}" for r in rows if r["outcome"] != "ok"
            ]
        if rows:
            times = [r["seconds"] for r in rows]
            failed = sum(r["outcome"] != "ok" for r in rows)
            lines.append(f"| {name} | {len(rows)} | {failed} | {statistics.median(times):.2f} s | {max(times):.2f} s |")
    lines += ["", "Failures:" if failures else "No stop failed.", *failures]
    print("\n" + "\n".join(lines))
    (RESULTS / "stops.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
