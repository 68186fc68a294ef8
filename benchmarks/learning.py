"""Learning results of the two scripts, measured: mean raw return of the last 20 episodes of each run, and curves.

    python benchmarks/learning.py cartpole                # ppo_vec.py, CartPole-v1, 8 envs, 128|64 steps, seeds 1-3
    python benchmarks/learning.py pendulum                # ppo_vec.py, Pendulum-v1 with the README's flags, seeds 1-3
    python benchmarks/learning.py breakout                # ppo_atari_multigpu.py, 1M steps, seed 1 (~40 min, 2 cores)
    python benchmarks/learning.py breakout-ranks          # 2 ranks x 4 envs vs 1 rank x 8 envs (same global batch)
    python benchmarks/learning.py CASE --runs DIR         # summarize runs already in DIR/runs, without training

Each run is the script's own command line (printed), in a scratch folder, or DIR with --runs (kept). Writes
benchmarks/results/learning_CASE.md, .json and .png (episodic return against global step, 20-episode mean).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.report import MACHINE, RESULTS, save  # noqa: E402
from tests.helpers import read_scalars  # noqa: E402

VEC, ATARI = str(REPO / "ppo_vec.py"), str(REPO / "ppo_atari_multigpu.py")
PENDULUM = "--num-envs 8 --num-steps 256 --gamma 0.9 --learning-rate 1e-3 --update-epochs 10 --num-minibatches 8"
PENDULUM += " --ent-coef 0 --no-norm-obs --total-timesteps 300000"
CASES = {  # case -> (target, {label: command})
    "cartpole": (  # CleanRL's num_steps 128, then 64: CleanRL's batch of 512 steps (4 envs x 128) on 8 envs
        "last-20 mean return >= 475 for every seed",
        {
            f"seed {s}, {n} steps": [VEC, *f"--env-id CartPole-v1 --num-envs 8 --num-steps {n} --seed {s}".split()]
            for n in ("128", "64")
            for s in (1, 2, 3)
        },
    ),
    "pendulum": (
        "last-20 mean return >= -300, averaged over the seeds",
        {f"seed {s}": [VEC, "--env-id", "Pendulum-v1", *PENDULUM.split(), "--seed", str(s)] for s in (1, 2, 3)},
    ),
    "breakout": (
        "last-20 mean raw return >= 8 after 1M steps",
        {"seed 1": [ATARI, *"--total-timesteps 1000000 --seed 1 --checkpoint-interval 100".split()]},
    ),
    "breakout-ranks": (
        "the same learning curve within noise, same global batch",
        {
            "1 rank x 8 envs": [ATARI, "--total-timesteps", "200000", "--local-num-envs", "8"],
            "2 ranks x 4 envs": [
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc_per_node",
                "2",
                ATARI,
                "--total-timesteps",
                "200000",
                "--local-num-envs",
                "4",
            ],
        },
    ),
}


def returns_of(run_dir: Path) -> tuple[np.ndarray, np.ndarray]:
    scalars = read_scalars(run_dir)
    points = scalars.get("charts/episodic_return", [])
    return np.array([s for s, _ in points]), np.array([r for _, r in points])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("case", choices=sorted(CASES))
    parser.add_argument("--runs", type=Path, help="a folder whose runs/ already holds the runs, in command order")
    args = parser.parse_args()
    target, commands = CASES[args.case]
    if args.runs is None:
        scratch = Path(tempfile.mkdtemp(prefix=f"learning-{args.case}-"))
        print(f"runs go to {scratch}/runs (kept: summarize them again with --runs {scratch})", flush=True)
        for label, cmd in commands.items():
            print(f"{label}: python {' '.join(cmd)}", flush=True)
            subprocess.run([sys.executable, *cmd], cwd=scratch, check=True, stdout=subprocess.DEVNULL)
        args.runs = scratch
    run_dirs = sorted((args.runs / "runs").iterdir(), key=lambda d: d.stat().st_mtime)
    if len(run_dirs) != len(commands):
        sys.exit(f"{args.runs / 'runs'} holds {len(run_dirs)} runs; case {args.case} has {len(commands)}")

    lines = [
        f"Learning, {args.case} (target: {target}). Machine: {MACHINE}.",
        f"Command: `python benchmarks/learning.py {args.case}`; each run:",
        "",
        "| run | command | episodes | last-20 mean return |",
        "|---|---|---|---|",
    ]
    curves, finals = {}, {}
    for (label, cmd), run_dir in zip(commands.items(), run_dirs, strict=True):
        steps, returns = returns_of(run_dir)
        finals[label] = float(returns[-20:].mean())
        curves[label] = (steps.tolist(), returns.tolist())
        shown = " ".join(Path(c).name if c in (VEC, ATARI) else c for c in cmd)
        lines.append(f"| {label} | `{shown}` | {len(returns)} | {finals[label]:.1f} |")
    groups = {}  # "seed 1, 64 steps" -> "64 steps": the runs that differ only in their seed
    for label, final in finals.items():
        groups.setdefault(label.partition(", ")[2] or "all runs", []).append(final)
    lines.append("")
    for group, values in groups.items():
        lines.append(f"{group}: mean {np.mean(values):.1f}, median {np.median(values):.1f}, min {np.min(values):.1f}.")
    plt = save(f"learning_{args.case}", lines, {"finals": finals, "curves": curves})
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, (steps, returns) in curves.items():
        smooth = np.convolve(returns, np.ones(20) / 20, mode="valid") if len(returns) >= 20 else np.array(returns)
        ax.plot(np.array(steps)[len(steps) - len(smooth) :], smooth, label=label)
    ax.set(title=f"{args.case}: episodic return (20-episode mean)", xlabel="global step", ylabel="return")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / f"learning_{args.case}.png", dpi=110)


if __name__ == "__main__":
    main()
