"""What keeping the state of iteration boundaries costs a run: the scripts' default runs as they are
(a boundary is kept once 50 times what keeping the last one took has passed: run.KEEP_EVERY), against
the same runs with the state kept only where a save needs it (the first boundary and the last),
alternated.

    # CartPole (ppo_vec.py) and Breakout (ppo_atari_multigpu.py)
    python benchmarks/snapshot_cost.py
    python benchmarks/snapshot_cost.py --repeats 5

Both sides do the same work but for the kept state: the same flags, seeds, envs and updates (the
state is kept between iterations, so what it costs lands in the iteration's time). Each run is the
script as a user runs it, in a process of its own, its Run's boundary timed from inside: wall time,
and the trainer thread's CPU time (in the trainer, TensorBoard's writer thread, woken by the
iteration's logging, takes the GIL in turns with the boundary: wall time counts its work too). An
iteration is from one boundary's start to the next one's; per run the median of the iterations and the
mean of what a boundary took (those not kept take microseconds), over runs the median. Writes
results/snapshot_cost.md and .json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.report import MACHINE, save  # noqa: E402

CASES = {  # the scripts' default commands, long enough for many iterations
    "CartPole-v1, ppo_vec.py, 8 envs in the trainer": ("ppo_vec.py", ["--total-timesteps", str(48 * 1024)]),
    "Breakout, ppo_atari_multigpu.py, 8 envs in workers": ("ppo_atari_multigpu.py", ["--total-timesteps", "8192"]),
}

# Runs the script as __main__ with Run._boundary timed (KEEP=0: the state kept at the first and last
# boundary only)
DRIVER = r"""
import json, os, runpy, sys, time
from common.run import run
times, boundary, keep = [], run.Run._boundary, os.environ["KEEP"] == "1"

def timed(self, done):
    start, cpu, kept_at = time.perf_counter(), time.thread_time(), self.kept_at
    if keep or done in (self.start_iteration - 1, self.num_iterations):
        boundary(self, done)
    times.append((start, time.perf_counter() - start, time.thread_time() - cpu, self.kept_at != kept_at))

run.Run._boundary = timed
out, script, *flags = sys.argv[1:]
sys.argv = [script, *flags]
try:
    runpy.run_path(script, run_name="__main__")
finally:
    json.dump(times, open(out, "w"))
"""


def measure(script: str, flags: list[str], keep: bool) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as cwd:
        out = Path(cwd) / "times.json"
        env = dict(os.environ, PYTHONPATH=str(REPO), KEEP=str(int(keep)))
        done = subprocess.run(
            [sys.executable, "-c", DRIVER, str(out), str(REPO / script), *flags],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise RuntimeError(f"{script} failed: {done.stderr[-2000:]}")
        times = json.loads(out.read_text())[1:-1]  # the first and the last boundary: kept on both sides
    starts = [start for start, *_ in times]
    return {
        "iteration": statistics.median(b - a for a, b in zip(starts, starts[1:], strict=False)),
        "wall": statistics.mean(wall for _, wall, _, _ in times),
        "cpu": statistics.mean(cpu for _, _, cpu, _ in times),
        "kept": statistics.mean(kept for *_, kept in times),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rows, data = [], {}
    for label, (script, flags) in CASES.items():
        kept, not_kept = [], []
        for _ in range(args.repeats):  # alternated: drift hits both alike
            kept.append(measure(script, flags, keep=True))
            not_kept.append(measure(script, flags, keep=False))
            print(label, kept[-1], not_kept[-1], flush=True)
        with_it, without = (statistics.median(r["iteration"] for r in side) for side in (kept, not_kept))
        wall, cpu, share_kept = (statistics.median(r[key] for r in kept) for key in ("wall", "cpu", "kept"))
        data[label] = {"kept": kept, "not kept": not_kept}
        share = {
            key: f"{value * 1e3:.1f} ms ({100 * value / with_it:.1f}%)" for key, value in (("wall", wall), ("cpu", cpu))
        }
        rows.append(
            f"| {label} | {with_it:.3f} s | {without:.3f} s | {100 * (with_it / without - 1):+.1f}% | "
            f"{100 * share_kept:.0f}% | {share['wall']} | {share['cpu']} |"
        )
    lines = [
        "# What keeping each iteration boundary's state costs",
        "",
        f"`python benchmarks/snapshot_cost.py --repeats {args.repeats}`, "
        f"{time.strftime('%Y-%m-%d')}, {MACHINE}. "
        "Per run the median iteration and the mean boundary, then medians over runs; goal: under 2% of an "
        "iteration.",
        "",
        "| case | iteration, state kept | iteration, not kept | difference | boundaries kept | a boundary, wall "
        "| a boundary, trainer CPU |",
        "|---|---|---|---|---|---|---|",
        *rows,
    ]
    save("snapshot_cost", lines, {"runs": data})


if __name__ == "__main__":
    main()
