"""Where a SubprocVecEnv step's time goes, for Breakout in one worker per core: each worker's busy
time (its envs' steps and resets), the wait for the slowest worker, and the rest (commands and
replies, merging, copies).

    # N=8 and 16, worker_spin 300 us (the old default)
    python benchmarks/where_time_goes.py
                                                               # and the default (20 ms), alternating
    python benchmarks/where_time_goes.py --num-envs 16 --spin 0 0.02 --steps 3000

Beside them, the same repetitions time: the envs split over one process per core as the workers
split them, each process stepping its own with nothing else (no trainer, no commands, no waiting for
the other: what the fixed split of envs over processes could give at best); ale-py's AtariVectorEnv
set up alike (benchmarks/peers.py); and, without the barrier of a step over all envs, ours as two
halves each stepped as soon as it answers against ale-py's asynchronous mode (each recv() the first
n/2 envs done): the same work on both sides. A third table models why a step waits, from each env's
step times in one process (schedule()): a fixed split against a pool that hands each env to
whichever thread is free. Ours is timed with forked workers (each env wrapped in Traced, which times
its steps); benchmarks/vecenv_throughput.py times the default start method.

Each worker records when its envs' steps started and ended in its process (the same clock as the
trainer's); the trainer records its step() calls. Per step: period = time between step() calls; busy
= a worker's own work; slowest = the largest busy of the step; wait for the slowest = slowest - mean
busy (the cost of a fixed split of the envs when one worker draws a reset); the rest = period -
slowest. Repetitions alternate between the settings, so drift hits them alike; medians of the
repetitions' means. Writes benchmarks/results/where_time_goes.md and .json.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import queue as queue_module
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks import peers  # noqa: E402
from benchmarks.report import CORES, MACHINE, save  # noqa: E402
from common.multiprocessing_env import SubprocVecEnv  # noqa: E402
from ppo_atari_multigpu import Args, make_env  # noqa: E402

TRACE_DIR = tempfile.mkdtemp(prefix="where_time_goes_")
_log: list[tuple[float, float]] = []


class Traced:
    """An env's thunk whose env records each step's start and end (time.monotonic) in its worker;
    every 500 records the worker writes them to a file of its own."""

    def __init__(self, make):
        self.make = make

    def __call__(self):
        import gymnasium as gym

        class Timed(gym.Wrapper):
            def step(self, action):
                start = time.monotonic()
                result = self.env.step(action)
                _log.append((start, time.monotonic()))
                if len(_log) % 500 == 0:
                    np.save(os.path.join(TRACE_DIR, f"{os.getpid()}.npy"), np.array(_log))
                return result

            def reset(self, **kwargs):  # a same-step reset belongs to the step it follows
                obs, info = self.env.reset(**kwargs)
                if _log:
                    _log[-1] = (_log[-1][0], time.monotonic())
                return obs, info

        return Timed(self.make())


def measure(n: int, spin: float, steps: int) -> dict[str, float]:
    """One repetition: `steps` steps of n Breakouts in a worker per core (fork start), each worker
    tracing its steps."""
    for name in os.listdir(TRACE_DIR):
        os.remove(os.path.join(TRACE_DIR, name))
    envs = SubprocVecEnv(
        [Traced(make_env(Args(), i, None)) for i in range(n)], num_workers=CORES, worker_spin=spin, context="fork"
    )
    try:
        envs.reset(seed=0)
        actions = np.random.default_rng(0).integers(4, size=(64, n))
        calls = []
        for t in range(steps):
            start = time.monotonic()
            envs.step(actions[t % 64])
            calls.append((start, time.monotonic()))
        pids = envs.worker_pids
    finally:
        envs.close()
    skip = 100  # the first steps: caches and branch predictors warming up
    # a worker's step spans its envs' steps
    logs = [np.load(os.path.join(TRACE_DIR, f"{pid}.npy")) for pid in pids]
    logs = [log[: len(log) // k * k].reshape(-1, k, 2) for log, k in zip(logs, map(len, worker_slices(n)), strict=True)]
    logs = np.stack([np.stack([log[:, 0, 0], log[:, -1, 1]], axis=-1)[skip : steps - steps % 500] for log in logs])
    calls = np.array(calls)[skip : steps - steps % 500]
    busy = logs[:, :, 1] - logs[:, :, 0]
    slowest = busy.max(axis=0)
    period = np.diff(calls[:, 0]).mean()
    return {
        "steps/s": n / period,
        "period": period,
        "busy": busy.mean(),
        "wait for the slowest": (slowest - busy.mean(axis=0)).mean(),
        "rest": period - slowest.mean(),
        "busy per env step": busy.mean() / (n / len(pids)),
    }


def worker_slices(n: int) -> list[np.ndarray]:
    """The envs of each of CORES workers as SubprocVecEnv splits them: ceil(n / CORES) each, the
    last the rest."""
    per_worker = -(-n // CORES)
    return [np.arange(lo, min(lo + per_worker, n)) for lo in range(0, n, per_worker)]


def _alone(envs_of_process: list[int], steps: int, start: Any, queue: Any) -> None:
    """One process stepping its slice of the envs `steps` times (autoreset as a worker's), nothing else."""
    envs = [make_env(Args(), i, None)() for i in envs_of_process]
    for i, env in zip(envs_of_process, envs, strict=True):
        env.reset(seed=i)
    actions = np.random.default_rng(0).integers(4, size=(64, max(envs_of_process) + 1))[:, envs_of_process]
    start.wait()
    began = time.monotonic()
    for t in range(steps):
        for env, action in zip(envs, actions[t % 64], strict=True):
            _, _, terminated, truncated, _ = env.step(int(action))
            if terminated or truncated:
                env.reset()
    queue.put(time.monotonic() - began)


def no_coordination(n: int, steps: int) -> float:
    """Steps/s of n Breakouts split over CORES processes that never wait for anything: the
    slowest one's time."""
    ctx = mp.get_context("fork")
    slices = worker_slices(n)
    start, queue = ctx.Barrier(len(slices)), ctx.Queue()
    procs = [ctx.Process(target=_alone, args=(part.tolist(), steps, start, queue)) for part in slices]
    for proc in procs:
        proc.start()
    times: list[float] = []
    try:
        while len(times) < len(procs):
            try:
                times.append(queue.get(timeout=1.0))
            except queue_module.Empty:
                if any(proc.exitcode not in (None, 0) for proc in procs):
                    raise RuntimeError("a process stepping envs alone failed (its traceback is above)") from None
    finally:
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
    return n * steps / max(times)


def halves(n: int, steps: int) -> float:
    """Steps/s of n Breakouts as two SubprocVecEnvs of n/2 (one worker each), each stepped again as
    soon as it answers (a thread each: the wait releases the GIL): no step waits for the other half,
    each half keeps the same-step contract. What double buffering in a training loop could get from
    the envs."""
    parts = [
        SubprocVecEnv([make_env(Args(), i, None) for i in part], num_workers=1)
        for part in np.array_split(np.arange(n), 2)
    ]
    try:
        for part, env in zip(np.array_split(np.arange(n), 2), parts, strict=True):
            env.reset(seed=int(part[0]))

        def drive(env: SubprocVecEnv) -> None:
            actions = np.random.default_rng(0).integers(4, size=(64, env.num_envs))
            for t in range(steps):
                env.step(actions[t % 64])

        threads = [threading.Thread(target=drive, args=(env,)) for env in parts]
        began = time.monotonic()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return n * steps / (time.monotonic() - began)
    finally:
        for env in parts:
            env.close()


def ale_py(n: int, steps: int, batch: int | None = None) -> float:
    """Steps/s of ale-py's AtariVectorEnv of n Breakouts set up like ours (its thread pool on every
    core); with `batch`, asynchronous: each recv() returns the first `batch` envs done, which are
    sent their next actions."""
    envs = peers.ale_vector(n, batch_size=batch or 0)
    batch = batch or n
    try:
        envs.reset(seed=0)
        actions = np.random.default_rng(0).integers(4, size=(64, batch))
        rounds = steps * n // batch
        began = time.monotonic()
        envs.send(actions[0])
        for t in range(1, rounds + 1):
            envs.recv()
            if t < rounds:
                envs.send(actions[t % 64])
        return batch * rounds / (time.monotonic() - began)
    finally:
        envs.close()


def schedule(n: int, steps: int, seed: int) -> dict[str, float]:
    """How much a step over all envs waits for its slowest part, from each env's step times (its
    reset included) in one process: a fixed split of the envs over CORES processes (ours) against a
    pool of CORES threads that hands each env to whichever thread is free (ale-py's), as periods
    over the ideal (all env work / CORES), with and without game resets (their steps timed as a
    median step), and the shares of the work in steps that reset a game or a life (a lost life costs
    ours NOOP, FIRE and UP steps that ale-py does not play)."""
    envs = [make_env(Args(), i, None)() for i in range(n)]
    for i, env in enumerate(envs):
        env.reset(seed=seed * n + i)
    actions = np.random.default_rng(seed).integers(4, size=(steps, n))
    took, kind = np.zeros((steps, n)), np.zeros((steps, n), np.int8)  # kind: 1 a life reset, 2 a game reset
    for t in range(steps):
        for i, env in enumerate(envs):
            start = time.perf_counter()
            _, _, terminated, truncated, info = env.step(int(actions[t, i]))
            if terminated or truncated:
                kind[t, i] = 2 if "episode" in info else 1
                env.reset()
            took[t, i] = time.perf_counter() - start
    for env in envs:
        env.close()
    took, kind = took[100:], kind[100:]  # the first steps: caches warming up

    def fixed(times: np.ndarray) -> float:
        return float(np.max([times[:, part].sum(axis=1) for part in worker_slices(n)], axis=0).sum())

    def pool(times: np.ndarray) -> float:
        total = 0.0
        for row in times:
            free_at = np.zeros(CORES)
            for took_env in row:
                free_at[free_at.argmin()] += took_env
            total += free_at.max()
        return total

    ideal, median_step = took.sum() / CORES, np.median(took[kind == 0])
    cheap = np.where(kind == 2, median_step, took)
    return {
        "fixed split": fixed(took) / ideal,
        "pool": pool(took) / ideal,
        "fixed split, game resets as a step": fixed(cheap) / (cheap.sum() / CORES),
        "game resets": took[kind == 2].sum() / took.sum(),
        "lost lives": (took[kind == 1] - median_step).sum() / took.sum(),
        "games per env step": float((kind == 2).mean()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-envs", nargs="+", type=int, default=[8, 16])
    parser.add_argument("--spin", nargs="+", type=float, default=[300e-6, 0.02], help="worker_spin values (s)")
    parser.add_argument("--steps", type=int, default=2100, help="steps per repetition")
    parser.add_argument("--repetitions", type=int, default=3)
    args = parser.parse_args()
    if args.steps < 600:
        parser.error(
            f"--steps must be at least 600 (the first 100 are dropped, workers write their times every 500), "
            f"got {args.steps}"
        )
    lines = [
        "# Where a step's time goes: Breakout, one worker per core",
        "",
        f"{MACHINE}. Command: `python benchmarks/where_time_goes.py` with "
        f"`--num-envs {' '.join(map(str, args.num_envs))} --spin {' '.join(f'{s:g}' for s in args.spin)} "
        f"--steps {args.steps} --repetitions {args.repetitions}`. Milliseconds per step (medians of the "
        "repetitions' means); shares of the period in brackets.",
        "",
        "| N | worker_spin | steps/s | period | busy (mean worker) | wait for the slowest | rest | busy per env step |",
        "|---|---|---|---|---|---|---|---|",
    ]
    data: dict[str, list] = {}
    bounds = [
        "",
        "Against the bounds, in the same repetitions (steps/s: medians; ratios to ale-py: medians of pairs):",
        "",
        "| N | layout | steps/s | / ale-py | / ale-py asynchronous |",
        "|---|---|---|---|---|",
    ]
    schedules = [
        "",
        f"What a step over all envs waits for, from each env's step times in one process (a repetition's "
        f"actions seeded with its number; medians): period over the ideal (env work / {CORES}) for the fixed "
        f"split over {CORES} processes and for a pool of {CORES} threads that hands each env to whichever is "
        "free (ale-py's); the shares of env work in game resets and in the NOOP, FIRE and UP steps that "
        "follow a lost life in ours (not in ale-py)",
        "",
        "| N | fixed split | pool | fixed split, game resets as cheap as a step | game resets' work | "
        "lost lives' extra work | env steps per game |",
        "|---|---|---|---|---|---|---|",
    ]
    for n in args.num_envs:
        samples: dict[float, list[dict[str, float]]] = {spin: [] for spin in args.spin}
        alone, ale, split, ale_async, waits = [], [], [], [], []
        for rep in range(args.repetitions):
            for spin in args.spin:
                samples[spin].append(measure(n, spin, args.steps))
                print(f"N={n} spin={spin:g} rep {rep}: {samples[spin][-1]['steps/s']:.0f} steps/s", flush=True)
            alone.append(no_coordination(n, args.steps))
            ale.append(ale_py(n, args.steps))
            split.append(halves(n, args.steps))
            ale_async.append(ale_py(n, args.steps, batch=n // 2))
            waits.append(schedule(n, args.steps, seed=rep))
            print(
                f"N={n} rep {rep}: no coordination {alone[-1]:.0f}, ale-py {ale[-1]:.0f}, halves "
                f"{split[-1]:.0f}, "
                f"ale-py async {ale_async[-1]:.0f} steps/s",
                flush=True,
            )
        for spin, runs in samples.items():
            data[f"N={n} spin={spin:g}"] = runs
            m = {key: float(np.median([r[key] for r in runs])) for key in runs[0]}
            share = {key: m[key] / m["period"] for key in ("busy", "wait for the slowest", "rest")}
            lines.append(
                f"| {n} | {spin * 1e3:g} ms | {m['steps/s']:.0f} | {m['period'] * 1e3:.2f} | "
                f"{m['busy'] * 1e3:.2f} ({share['busy']:.0%}) | {m['wait for the slowest'] * 1e3:.2f} "
                f"({share['wait for the slowest']:.0%}) | {m['rest'] * 1e3:.2f} ({share['rest']:.0%}) | "
                f"{m['busy per env step'] * 1e6:.0f} us |"
            )
        data[f"N={n} no coordination"], data[f"N={n} ale-py"] = alone, ale
        data[f"N={n} halves"], data[f"N={n} ale-py async"] = split, ale_async
        data[f"N={n} schedule"] = waits
        m = {key: np.median([w[key] for w in waits]) for key in waits[0]}
        schedules.append(
            f"| {n} | {m['fixed split']:.3f} | {m['pool']:.3f} | "
            f"{m['fixed split, game resets as a step']:.3f} | "
            f"{m['game resets']:.1%} | {m['lost lives']:.1%} | {1 / m['games per env step']:.0f} |"
        )
        rows = {f"ours, worker_spin {spin * 1e3:g} ms": [r["steps/s"] for r in runs] for spin, runs in samples.items()}
        rows |= {
            f"no coordination ({CORES} processes alone)": alone,
            "ale-py AtariVectorEnv": ale,
            "ours as two halves, each stepped when it answers": split,
            f"ale-py asynchronous (batch_size={n // 2})": ale_async,
        }
        for name, rates in rows.items():
            ratios = [np.median(np.array(rates) / np.array(peer)) for peer in (ale, ale_async)]
            bounds.append(f"| {n} | {name} | {np.median(rates):.0f} | {ratios[0]:.2f}x | {ratios[1]:.2f}x |")
    lines += bounds + schedules
    save("where_time_goes", lines, data)
    shutil.rmtree(TRACE_DIR, ignore_errors=True)


if __name__ == "__main__":
    main()
