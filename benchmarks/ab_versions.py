"""SubprocVecEnv's default layout in two checkouts of this project, stepped alternately: is a change slower?

    git worktree add /tmp/before <commit>
    # CartPole-v1 and Breakout, N = 1 8 16, 7 repetitions
    python benchmarks/ab_versions.py /tmp/before .

Each measurement is a fresh process of one checkout that builds SubprocVecEnv(env_fns) with default
arguments (for Breakout, ppo_atari_multigpu.make_env's envs) and steps it with random actions for
--seconds; the checkouts alternate A B A B ..., so the machine's drift hits both alike. Prints each
checkout's median steps/s, the ratio of the medians (B / A) and the median of the per-repetition
ratios, and the layout each chose.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

MEASURE = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
import gymnasium as gym
import numpy as np
from common.multiprocessing_env import SubprocVecEnv
from ppo_atari_multigpu import Args, make_env

if __name__ == "__main__":
    env, n, seconds = sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    fns = ([lambda: gym.make("CartPole-v1")] * n if env == "CartPole-v1"
           else [make_env(Args(), i, None) for i in range(n)])
    with SubprocVecEnv(fns) as envs:
        envs.reset(seed=0)
        rng, steps = np.random.default_rng(0), 0
        actions = [rng.integers(0, envs.single_action_space.n, n) for _ in range(64)]
        for k in range(20):  # warm up
            envs.step(actions[k % 64])
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            envs.step(actions[steps % 64])
            steps += 1
        rate = steps * n / (time.perf_counter() - start)
        print(json.dumps({"rate": rate, "layout": getattr(envs, "placement", envs.layout.split(" (")[0])}))
"""


def measure(repo: str, env: str, n: int, seconds: float) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", MEASURE, str(Path(repo).resolve()), env, str(n), str(seconds)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if out.returncode:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("a", help="checkout A (before)")
    parser.add_argument("b", help="checkout B (after)")
    parser.add_argument("--envs", nargs="+", default=["CartPole-v1", "Breakout"])
    parser.add_argument("--num-envs", nargs="+", type=int, default=[1, 8, 16])
    parser.add_argument("--repetitions", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    print("| env | N | A steps/s | B steps/s | B / A (medians) | B / A (median of pairs) | A's layout | B's layout |")
    print("|---|---|---|---|---|---|---|---|")
    for env in args.envs:
        for n in args.num_envs:
            pairs = [
                (measure(args.a, env, n, args.seconds), measure(args.b, env, n, args.seconds))
                for _ in range(args.repetitions)
            ]
            a, b = ([p[k]["rate"] for p in pairs] for k in (0, 1))
            ratio = statistics.median(b) / statistics.median(a)
            paired = statistics.median(y / x for x, y in zip(a, b, strict=True))
            print(
                f"| {env} | {n} | {statistics.median(a):.0f} | {statistics.median(b):.0f} | {ratio:.2f}x | "
                f"{paired:.2f}x | {pairs[0][0]['layout']} | {pairs[0][1]['layout']} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
