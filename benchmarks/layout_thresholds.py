"""What a step of SubprocVecEnv's workers costs beyond their envs' work here: the ROUND_TRIP its
default layout is decided with (common/vecenv/layout.py), a ratio to the CPU of
layout.reference_work() ("units" below), and the rule checked against real envs.

    python benchmarks/layout_thresholds.py                 # writes benchmarks/results/layout_thresholds.md
    python benchmarks/layout_thresholds.py --repetitions 9 --seconds 0.5

Stand-in envs that burn a fixed CPU time per step (0 to 80 us) are stepped n at a time (4 to 32) in
the calling process and in w = min(cores, n) workers (the default layout's start method and
polling), interleaved, medians of the repetitions. A step of n envs takes n * s + A(n) in the
calling process and ceil(n / w) * s + B(n) in workers, so the calling process is faster exactly
where what workers save, s * (n - ceil(n / w)), is under B(n) - A(n), the round trip. Stand-ins that
never end an episode give its floor; real envs (CartPole, Acrobot, Pendulum, whose episodes end and
send their final observations over the pipe) give what users pay, and ROUND_TRIP is the median of
their estimates, each divided by the CPU time of reference_work() timed beside that env's steps (as
the probe does). Each real env is shown with the layout the rule picks for it, beside the faster one
measured. Run it alone on a quiet machine.
"""

from __future__ import annotations

import argparse
import functools
import math
import platform
import statistics
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from common.multiprocessing_env import SubprocVecEnv  # noqa: E402
from common.vecenv import layout, process_control  # noqa: E402


class BusyEnv(gym.Env):
    """A step that burns `seconds` of CPU time and returns a CartPole-sized observation."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.obs = np.zeros(4, np.float32)

    def reset(self, *, seed=None, options=None):
        return self.obs, {}

    def step(self, action):
        end = time.thread_time() + self.seconds
        while time.thread_time() < end:
            pass
        return self.obs, 1.0, False, False, {}


def step_seconds(env_fns: list, seconds: float, **layout) -> float:
    """Median wall seconds of one step of all envs, over about `seconds` of stepping (the first
    fifth dropped)."""
    with SubprocVecEnv(env_fns, **layout) as envs:
        envs.reset(seed=0)
        space = envs.action_space
        actions, samples, start = np.zeros(space.shape, space.dtype), [], time.perf_counter()
        while time.perf_counter() - start < seconds or len(samples) < 20:
            tick = time.perf_counter()
            envs.step(actions)
            samples.append(time.perf_counter() - tick)
    return float(np.median(samples[len(samples) // 5 :]))


def both(env_fns: list, repetitions: int, seconds: float) -> tuple[float, float]:
    """Medians over interleaved repetitions of a step in this process and in the default number of workers."""
    workers = min(process_control.cores(), len(env_fns))
    here, there = [], []
    for _ in range(repetitions):
        here.append(step_seconds(env_fns, seconds, num_workers=0))
        there.append(step_seconds(env_fns, seconds, num_workers=workers))
    return statistics.median(here), statistics.median(there)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=0.3, help="of stepping per measurement")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "layout_thresholds.md")
    args = parser.parse_args()
    cores = process_control.cores()
    lines = [
        "# SubprocVecEnv's round trip, and the default layout checked (benchmarks/layout_thresholds.py)",
        "",
        f"`python benchmarks/layout_thresholds.py --repetitions {args.repetitions} --seconds "
        f"{args.seconds}`, "
        f"{time.strftime('%Y-%m-%d')}, {cores} cores ({platform.machine()}, "
        f"{platform.processor() or 'cpu'}), "
        f"Python {platform.python_version()}. Medians of {args.repetitions} interleaved "
        "repetitions; w = min(cores, n)"
        f" workers. The in-code ROUND_TRIP when this ran: {layout.ROUND_TRIP:g} units "
        "(reference_work() calls).",
        "",
        "| n | CPU per env step | this process | workers | estimate of the round trip |",
        "|---|---|---|---|---|",
    ]
    estimates = []
    for n in (4, 8, 16, 32):
        w = min(cores, n)
        for s in (0.0, 10e-6, 20e-6, 40e-6, 80e-6):
            here, there = both([functools.partial(BusyEnv, s)] * n, args.repetitions, args.seconds)
            estimate = there - here + s * (n - math.ceil(n / w))
            estimates.append(estimate)
            lines.append(
                f"| {n} | {s * 1e6:.0f} us | {here * 1e6:.0f} us | {there * 1e6:.0f} us | {estimate * 1e6:.0f} us |"
            )
            print(lines[-1], flush=True)
    low, high = (np.percentile(estimates, q) * 1e6 for q in (25, 75))
    lines += [
        "",
        f"Stand-ins: median {statistics.median(estimates) * 1e6:.0f} us (quartiles {low:.0f}-{high:.0f} us).",
        "",
    ]
    lines += [
        "Real envs: the layout the rule picks (the env's step timed as the probe times it) against both, measured.",
        "",
        "| env | n | probe's CPU per step | this process | workers | estimate of the round trip | "
        "the rule picks | "
        "faster |",
        "|---|---|---|---|---|---|---|---|",
    ]
    estimates = []
    for env_id in ("CartPole-v1", "Acrobot-v1", "Pendulum-v1"):
        probe = gym.make(env_id)
        probe.reset(seed=0)
        cpu, reference = layout.cpu_per_step(probe)
        for n in (8, 16, 32):
            here, there = both([functools.partial(gym.make, env_id)] * n, args.repetitions, args.seconds)
            picked = layout.decide({"trusted": True, "step": cpu, "reference": reference}, n, cores)[0]
            seconds = there - here + cpu * (n - math.ceil(n / min(cores, n)))
            estimates.append(seconds / reference)
            lines.append(
                f"| {env_id} | {n} | {cpu * 1e6:.0f} us ({cpu / reference:.2f} units) | {here * 1e6:.0f} us "
                f"| {there * 1e6:.0f} us | {seconds * 1e6:.0f} us ({estimates[-1]:.1f} units) | "
                f"{'this process' if picked == 0 else 'workers'} | "
                f"{'this process' if here <= there else 'workers'} |"
            )
            print(lines[-1], flush=True)
    round_trip = statistics.median(estimates)
    low, high = (np.percentile(estimates, q) for q in (25, 75))
    lines += [
        "",
        f"Round trip of real envs: median **{round_trip:.1f} units** (quartiles {low:.1f}-{high:.1f}) of "
        "reference work: what ROUND_TRIP in common/vecenv/layout.py is set from.",
    ]
    args.out.write_text("\n".join(lines) + "\n")
    print(f"round trip {round_trip:.1f} units; written to {args.out}")


if __name__ == "__main__":
    main()
