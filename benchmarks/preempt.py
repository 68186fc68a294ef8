"""Repeated preemption: a CartPole run stopped N times, as a scheduler stops a job, then resumed to its end.

    # 5 stops, seed 1, 500k steps (the README's CartPole run)
    python benchmarks/preempt.py
    python benchmarks/preempt.py --stops 10 --seed 3 --num-workers 0   # envs in the trainer

Each stop comes at a random moment of training and sends SIGTERM to every process of the run
(trainer, env workers, watcher), in a random order spread over up to 20 ms, as SLURM or Kubernetes
do. Each stopped run must exit 143 with a checkpoint; each next one resumes from it with `--resume`;
the last one runs to the end and must exit 0. Then the run's TensorBoard curve is checked: every
per-iteration scalar logged exactly once per iteration, no iteration missing, and the episodes'
steps never going back. An uninterrupted run of the same seed is shown beside it (the checkpoints a
stop writes start fresh episodes, so the two runs differ, but both should reach 500).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.helpers import descendants, only_run_dir, read_scalars  # noqa: E402


def start(cwd: str, args, resume: Path | None) -> subprocess.Popen:
    cmd = [sys.executable, str(REPO / "ppo_vec.py"), "--seed", str(args.seed)]
    cmd += ["--total-timesteps", str(args.total_timesteps), "--num-workers", str(args.num_workers)]
    if resume is not None:
        cmd += ["--resume", str(resume)]
    return subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def stop_everything(proc: subprocess.Popen, rng: random.Random) -> list[int]:
    """SIGTERM to the run's every process in a random order, up to 20 ms apart; returns the order (pids)."""
    pids = [proc.pid, *descendants(proc.pid)]
    rng.shuffle(pids)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        time.sleep(rng.uniform(0, 0.02 / len(pids)))
    return pids


def wait_for_training(proc: subprocess.Popen, timeout: float = 120) -> None:
    """Returns once the run prints its first progress line (its start-up is over)."""
    deadline = time.monotonic() + timeout
    for line in proc.stdout:
        if line.startswith("global_step="):
            return
        if time.monotonic() > deadline:
            break
    raise RuntimeError(f"no progress line within {timeout} s: {proc.stderr.read()[-2000:]}")


def check_curve(run_dir: Path, batch: int, total: int) -> tuple[int, float]:
    scalars = read_scalars(run_dir)
    iterations = total // batch
    expected = [batch * (i + 1) for i in range(iterations)]
    for tag in ("losses/value_loss", "losses/policy_loss", "charts/learning_rate", "charts/SPS"):
        steps = [step for step, _ in scalars[tag]]
        assert steps == expected, f"{tag}: {len(steps)} points for {iterations} iterations; repeated or missing steps"
    episodes = [step for step, _ in scalars["charts/episodic_return"]]
    assert episodes == sorted(episodes), "episode steps go back: an iteration was logged twice"
    returns = [value for _, value in scalars["charts/episodic_return"]]
    return iterations, float(np.mean(returns[-20:]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stops", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--total-timesteps", type=int, default=500_000)
    parser.add_argument("--num-workers", type=int, default=2, help="env worker processes (0: envs in the trainer)")
    parser.add_argument("--batch", type=int, default=1024, help="ppo_vec.py's default num-envs x num-steps")
    parser.add_argument("--stop-seed", type=int, default=0, help="seeds the stop moments and signal orders")
    args = parser.parse_args()
    rng = random.Random(args.stop_seed)
    total = args.total_timesteps // args.batch * args.batch

    with tempfile.TemporaryDirectory() as cwd:
        checkpoint = None
        for stop in range(args.stops):
            proc = start(cwd, args, checkpoint)
            wait_for_training(proc)
            delay = rng.uniform(0.2, 8.0)
            time.sleep(delay)
            order = stop_everything(proc, rng)
            out, err = proc.communicate(timeout=150)
            run_dir = only_run_dir(cwd)
            summary = json.loads((run_dir / "summary.json").read_text())
            print(
                f"stop {stop + 1}: SIGTERM {delay:.1f} s into training to {len(order)} processes "
                f"(trainer {order.index(proc.pid) + 1}. of them); exit {proc.returncode}, "
                f"{summary['status']} at step {summary['global_step']}"
            )
            assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
            checkpoint = run_dir / "checkpoint.pt"
            assert checkpoint.exists(), "the stop wrote no checkpoint"
            assert not descendants(proc.pid), "a process of the stopped run outlived it"
        proc = start(cwd, args, checkpoint)
        out, err = proc.communicate(timeout=1800)
        assert proc.returncode == 0, err[-2000:]
        iterations, last20 = check_curve(only_run_dir(cwd), args.batch, total)
        print(
            f"last resume: exit 0; {iterations} iterations, each per-iteration scalar logged once; "
            f"last-20 return {last20:.1f}"
        )
    with tempfile.TemporaryDirectory() as cwd:
        proc = start(cwd, args, None)
        out, err = proc.communicate(timeout=1800)
        assert proc.returncode == 0, err[-2000:]
        _, last20 = check_curve(only_run_dir(cwd), args.batch, total)
        print(f"uninterrupted run, same seed: last-20 return {last20:.1f}")


if __name__ == "__main__":
    main()
