"""Training speed (SPS) of ppo_vec.py and ppo_atari_multigpu.py against a CleanRL-style loop, side by side.

    python benchmarks/train_speed.py                  # CartPole at 1, 2, 4, 8, 16 envs, Breakout at 8; 3 repetitions
    python benchmarks/train_speed.py --quick          # CartPole at 1 and 8 envs only, 1 repetition
    python benchmarks/train_speed.py --baseline REV   # also the scripts as they were at git revision REV

Every run is a fresh subprocess, as a user runs it; repetitions are interleaved (ours, reference, ours, ...).
SPS counts from the first step (env start-up excluded, as both scripts report it). For ours, the time per
iteration splits into env wait, inference (policy forward passes and bookkeeping) and update, read from the
run's TensorBoard `perf/` scalars. Writes benchmarks/results/train_speed.md and train_speed.png.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.report import MACHINE, RESULTS, save  # noqa: E402
from tests.helpers import read_scalars  # noqa: E402


def run(cmd: list[str]) -> tuple[int, dict]:
    """Runs one training command in a scratch folder: its SPS and, for ours, median per-iteration seconds."""
    with tempfile.TemporaryDirectory() as cwd:
        out = subprocess.run([sys.executable, *cmd], cwd=cwd, capture_output=True, text=True, timeout=3600)
        if out.returncode:
            raise RuntimeError(f"{cmd} failed:\n{out.stderr[-3000:]}")
        sps = int(re.findall(r"SPS=(\d+)", out.stdout)[-1])
        breakdown = {}
        runs = Path(cwd, "runs")
        if runs.exists():
            scalars = read_scalars(next(runs.iterdir()))
            for part in ("env", "inference", "update"):
                breakdown[part] = float(np.median([v for _, v in scalars[f"perf/{part}_seconds"][1:]]))
        return sps, breakdown


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-envs", nargs="+", type=int, default=[1, 2, 4, 8, 16])
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=10, help="CartPole iterations per run")
    parser.add_argument("--atari-iterations", type=int, default=3)
    parser.add_argument("--no-atari", action="store_true")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--baseline", help="a git revision whose scripts run beside today's, interleaved")
    args = parser.parse_args()
    if args.quick:
        args.num_envs, args.repetitions, args.no_atari = [1, 8], 1, True
    ours_vec, ours_atari = str(REPO / "ppo_vec.py"), str(REPO / "ppo_atari_multigpu.py")
    reference = str(REPO / "benchmarks" / "cleanrl_reference.py")

    baseline = None
    if args.baseline:  # the scripts and common/ of that revision, unpacked into a folder of their own
        baseline = Path(tempfile.mkdtemp(prefix="baseline-"))
        archive = subprocess.run(["git", "archive", args.baseline, "ppo_vec.py", "ppo_atari_multigpu.py", "common"],
                                 cwd=REPO, capture_output=True, check=True).stdout  # fmt: skip
        subprocess.run(["tar", "-x", "-C", str(baseline)], input=archive, check=True)

    cases = {}  # label -> {backend: command}
    for n in args.num_envs:
        steps = n * 128 * args.iterations
        flags = ["--env-id", "CartPole-v1", "--num-envs", str(n), "--total-timesteps", str(steps)]
        cases[f"CartPole-v1, {n} envs"] = {
            "ours": [ours_vec, *flags],
            "reference": [
                reference,
                "--env-id",
                "CartPole-v1",
                "--num-envs",
                str(n),
                "--iterations",
                str(args.iterations),
            ],
        }
        if baseline:
            cases[f"CartPole-v1, {n} envs"]["baseline"] = [str(baseline / "ppo_vec.py"), *flags]
    if not args.no_atari:
        steps = 8 * 128 * args.atari_iterations
        flags = ["--local-num-envs", "8", "--total-timesteps", str(steps)]
        cases["Breakout, 8 envs, 1 rank"] = {
            "ours": [ours_atari, *flags],
            "reference": [reference, "--env-id", "BreakoutNoFrameskip-v4", "--num-envs", "8", "--iterations",
                          str(args.atari_iterations)],
        }  # fmt: skip
        if baseline:
            cases["Breakout, 8 envs, 1 rank"]["baseline"] = [str(baseline / "ppo_atari_multigpu.py"), *flags]
    samples = {label: {name: [] for name in [*cmds, "breakdown"]} for label, cmds in cases.items()}
    for _ in range(args.repetitions):
        for label, cmds in cases.items():
            for name, cmd in cmds.items():
                sps, breakdown = run(cmd)
                samples[label][name].append(sps)
                if name == "ours":
                    samples[label]["breakdown"].append(breakdown)
            print(f"{label:28s} " + ", ".join(f"{name} {samples[label][name][-1]:6d} SPS" for name in cmds), flush=True)
    write_report(samples, args)


def write_report(samples, args) -> None:
    machine = MACHINE
    base = f", baseline: the scripts at git revision {args.baseline}" if args.baseline else ""
    lines = [
        f"Training SPS, median of {args.repetitions} interleaved runs; reference: benchmarks/cleanrl_reference.py",
        f"(a CleanRL-style loop over SyncVectorEnv){base}. Machine: {machine}.",
        f"Command: `python benchmarks/train_speed.py{f' --baseline {args.baseline}' if args.baseline else ''}`.",
        "Per-iteration seconds of ours (medians): env wait / inference and bookkeeping / update.",
        "",
        "| case | ours SPS | reference SPS | ours / reference |"
        + (" baseline SPS | ours / baseline |" if args.baseline else "")
        + " env s | inference s | update s |",
        "|---|---|---|---|" + ("---|---|" if args.baseline else "") + "---|---|---|",
    ]
    summary = {}
    for label, s in samples.items():
        ours, ref = float(np.median(s["ours"])), float(np.median(s["reference"]))
        parts = [float(np.median([b[p] for b in s["breakdown"]])) for p in ("env", "inference", "update")]
        summary[label] = dict(ours=ours, reference=ref, breakdown=parts, samples=s)
        row = f"| {label} | {ours:.0f} | {ref:.0f} | {ours / ref:.2f}x |"
        if args.baseline:
            summary[label]["baseline"] = old = float(np.median(s["baseline"]))
            row += f" {old:.0f} | {ours / old:.2f}x |"
        lines.append(row + " " + " | ".join(f"{p:.3f}" for p in parts) + " |")
    one, eight = summary.get("CartPole-v1, 1 envs"), summary.get("CartPole-v1, 8 envs")
    if one and eight:
        lines += ["", f"Vectorization: ppo_vec.py SPS at 8 envs / at 1 env = {eight['ours'] / one['ours']:.2f}x."]
    plt = save("train_speed", lines, {"summary": summary})
    if plt is None:
        return
    points = sorted(
        (int(label.split(", ")[1].split()[0]), v) for label, v in summary.items() if label.startswith("CartPole")
    )
    if points:
        fig, ax = plt.subplots(figsize=(6, 4))
        ns = [n for n, _ in points]
        ax.plot(ns, [v["ours"] for _, v in points], "-o", label="ppo_vec.py (SubprocVecEnv)")
        ax.plot(ns, [v["reference"] for _, v in points], "--s", label="CleanRL-style (SyncVectorEnv)")
        ax.set(title=f"CartPole-v1 training SPS, {machine}", xlabel="num_envs", ylabel="SPS", xscale="log")
        ax.set_xticks(ns, labels=[str(n) for n in ns])
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(RESULTS / "train_speed.png", dpi=110)


if __name__ == "__main__":
    main()
