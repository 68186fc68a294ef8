"""Soak: ppo_vec.py on a CartPole whose workers die about once per 10,000 env steps, against a crash-free run.

    python benchmarks/soak.py                          # 500k steps each, seed 1
    python benchmarks/soak.py --total-timesteps 2000000 --crash-every 10000

Both runs use the same seed and flags; the crashing one gets a large --max-restarts budget. While
they run, the memory of the trainer and of every worker (summed RSS of the process tree) is sampled
every few seconds. Reports the restarts, the mean return of the last 20 episodes of each run, and
the memory at the start and the end.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import gymnasium as gym
import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.helpers import descendants, only_run_dir, read_scalars  # noqa: E402


class CrashingCartPole(gym.Wrapper):
    """CartPole whose process SIGKILLs itself with probability 1 / crash_every at each step."""

    def __init__(self):
        super().__init__(gym.make("CartPole-v1"))
        self.rng = np.random.default_rng()
        self.crash_every = int(os.environ.get("SOAK_CRASH_EVERY", 10_000))

    def step(self, action):
        if self.rng.random() < 1.0 / self.crash_every:
            os.kill(os.getpid(), signal.SIGKILL)
        return self.env.step(action)


gym.register("CrashingCartPole-v1", entry_point=CrashingCartPole, max_episode_steps=500)


def tree_rss_mb(root: int) -> float:
    total = 0.0
    for pid in {root} | descendants(root):
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) / 1024
        except OSError:
            pass
    return total


def run(env_id: str, args, extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as cwd:
        cmd = [sys.executable, str(REPO / "ppo_vec.py"), "--env-id", env_id, "--seed", str(args.seed)]
        cmd += ["--total-timesteps", str(args.total_timesteps), *extra]
        env = dict(os.environ, PYTHONPATH=str(REPO), SOAK_CRASH_EVERY=str(args.crash_every))
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        memory, start = [], time.monotonic()
        while proc.poll() is None:
            memory.append((time.monotonic() - start, tree_rss_mb(proc.pid)))
            time.sleep(5)
        stderr = proc.stderr.read()
        if proc.returncode:
            raise RuntimeError(stderr[-3000:])
        scalars = read_scalars(only_run_dir(cwd))
        returns = [v for _, v in scalars["charts/episodic_return"]]
        return {
            "seconds": time.monotonic() - start,
            "restarts": int(scalars["charts/worker_restarts"][-1][1]),
            "last20": float(np.mean(returns[-20:])),
            "memory": memory,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--total-timesteps", type=int, default=500_000)
    parser.add_argument("--crash-every", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    crashing = run("benchmarks.soak:CrashingCartPole-v1", args, ["--max-restarts", "100000"])
    clean = run("CartPole-v1", args, [])
    for name, result in (("crashing", crashing), ("crash-free", clean)):
        memory = result["memory"]
        early = np.median([m for t, m in memory if t > 10][:3] or [memory[0][1]])
        late = np.median([m for _, m in memory[-3:]])
        print(
            f"{name:10s}: {result['seconds']:.0f} s, {result['restarts']} worker restarts, mean "
            "return of the last "
            f"20 episodes {result['last20']:.1f}, process-tree RSS {early:.0f} MiB early -> "
            f"{late:.0f} MiB at the end"
        )


if __name__ == "__main__":
    main()
