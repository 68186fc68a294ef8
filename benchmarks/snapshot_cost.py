"""What keeping the state of each iteration boundary costs a run: the time of Run's boundary (the state dicts copied,
every env's state pickled in its worker or here, the generators' states), against the time of a whole iteration of
the same run, for the scripts' own default commands.

    python benchmarks/snapshot_cost.py                 # CartPole (ppo_vec.py) and Breakout (ppo_atari_multigpu.py)
    python benchmarks/snapshot_cost.py --repeats 5

Each case runs the script as a user would, in a process of its own, its Run's boundary timed from inside (a wrapper
around Run._boundary that adds nothing to the work it times). The first boundary (before the first iteration) and the
last (which also writes the final checkpoint) are left out; an iteration's time is from one boundary's start to the
next one's. Per run: the median boundary over the median iteration; over the repeats: the median of those ratios, and
the highest. Also the size of one boundary's state as a checkpoint writes it. Writes results/snapshot_cost.md, .json.
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

CASES = {  # the scripts' default commands, long enough for a few iterations to time
    "CartPole-v1, ppo_vec.py, 8 envs in the trainer": ("ppo_vec.py", ["--total-timesteps", str(24 * 1024)]),
    "Breakout, ppo_atari_multigpu.py, 8 envs in workers": ("ppo_atari_multigpu.py", ["--total-timesteps", "8192"]),
}

# Runs the script as __main__ with Run._boundary timed; writes the times and the last state's size to argv[1]
DRIVER = r"""
import json, pickle, runpy, sys, time
from common.run import run
times, boundary = [], run.Run._boundary

def timed(self, done):
    start = time.perf_counter()
    boundary(self, done)
    times.append((start, time.perf_counter(), len(pickle.dumps(self.last)) if self.last else 0))

run.Run._boundary = timed
out, script, *flags = sys.argv[1:]
sys.argv = [script, *flags]
try:
    runpy.run_path(script, run_name="__main__")
finally:
    json.dump(times, open(out, "w"))
"""


def measure(script: str, flags: list[str]) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as cwd:
        out = Path(cwd) / "times.json"
        cmd = [sys.executable, "-c", DRIVER, str(out), str(REPO / script), *flags]
        done = subprocess.run(cmd, cwd=cwd, env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{script} failed: {done.stderr[-2000:]}")
        times = json.loads(out.read_text())
    starts = [start for start, _, _ in times]
    iterations = [b - a for a, b in zip(starts[1:-1], starts[2:], strict=False)]
    boundaries = [end - start for start, end, _ in times[1:-1]]
    return {"boundary": statistics.median(boundaries), "iteration": statistics.median(iterations),
            "ratio": statistics.median(boundaries) / statistics.median(iterations), "bytes": times[-1][2],
            "iterations": len(iterations)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rows, data = [], {}
    for label, (script, flags) in CASES.items():
        runs = []
        for _ in range(args.repeats):
            runs.append(measure(script, flags))
            print(label, runs[-1], flush=True)
        ratios = [r["ratio"] for r in runs]
        data[label] = runs
        rows.append(f"| {label} | {statistics.median(r['iteration'] for r in runs):.3f} s | "
                    f"{statistics.median(r['boundary'] for r in runs) * 1e3:.2f} ms | "
                    f"{100 * statistics.median(ratios):.2f}% (highest {100 * max(ratios):.2f}%) | "
                    f"{runs[0]['bytes'] / 1e6:.2f} MB |")  # fmt: skip
    lines = [
        "# What keeping each iteration boundary's state costs",
        "",
        f"`python benchmarks/snapshot_cost.py --repeats {args.repeats}`, {time.strftime('%Y-%m-%d')}, {MACHINE}. "
        "Medians over the iterations of a run, then over runs (see the script's docstring); goal: under 2%.",
        "",
        "| case | iteration | boundary | boundary / iteration | the state's size |",
        "|---|---|---|---|---|",
        *rows,
    ]
    save("snapshot_cost", lines, {"runs": data})


if __name__ == "__main__":
    main()
