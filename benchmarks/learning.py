"""Learning results of the two scripts, measured: mean raw return of the last 20 episodes of each run, and curves.

    python benchmarks/learning.py cartpole                # the mission's command, CartPole-v1, 8 envs, seeds 1-10
    python benchmarks/learning.py cartpole-ablation       # the same without reward normalization (CleanRL's ppo.py)
    python benchmarks/learning.py pendulum                # Pendulum-v1 with the README's flags, seeds 1-10
    python benchmarks/learning.py acrobot                 # Acrobot-v1 with the README's flags, seeds 1-10
    python benchmarks/learning.py breakout                # ppo_atari_multigpu.py, 1M steps, seed 1 (~40 min, 2 cores)
    python benchmarks/learning.py breakout-ranks          # 2 ranks x 4 envs vs 1 rank x 8 envs (same global batch)
    python benchmarks/learning.py CASE --seeds 101 102    # other seeds (the ppo_vec cases)
    python benchmarks/learning.py CASE --runs DIR         # runs in DIR; those already there are summarized, not rerun

Each run is the script's own command line (printed), in a scratch folder (or DIR with --runs), `--jobs` at a time
(results do not depend on it: a run gives the same numbers alone or beside another). Writes
benchmarks/results/learning_CASE.md, .json and .png (episodic return against global step, 20-episode mean), and
for the ppo_vec cases the learning diagnostics (entropy, approx_kl, explained variance, value loss) per seed.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.report import MACHINE, RESULTS, save  # noqa: E402
from tests.helpers import read_scalars  # noqa: E402

VEC, ATARI = str(REPO / "ppo_vec.py"), str(REPO / "ppo_atari_multigpu.py")
CARTPOLE = "--env-id CartPole-v1 --num-envs 8"  # the mission's command: every other flag at its default
PENDULUM = "--env-id Pendulum-v1 --num-envs 8 --num-steps 256 --total-timesteps 300000 --gamma 0.9 --learning-rate 1e-3"
PENDULUM += " --update-epochs 10 --num-minibatches 8 --ent-coef 0 --no-norm-obs"
ACROBOT = "--env-id Acrobot-v1 --num-envs 16"
VEC_CASES = {  # case -> (target, flags, default seeds)
    "cartpole": ("last-20 mean return >= 475 on every seed", CARTPOLE, range(1, 11)),
    "cartpole-ablation": ("the same, without reward normalization", CARTPOLE + " --no-norm-reward", range(1, 11)),
    "pendulum": ("last-20 mean return >= -300 on every seed", PENDULUM, range(1, 11)),
    "acrobot": ("reported (no target set)", ACROBOT, range(1, 11)),
}
OTHER_CASES = {
    "breakout": (
        "last-20 mean raw return >= 8 after 1M steps",
        {"seed 1": [ATARI, *"--total-timesteps 1000000 --seed 1 --checkpoint-interval 100".split()]},
    ),
    "breakout-ranks": (
        "the same learning curve within noise, same global batch",
        {
            "1 rank x 8 envs": [ATARI, "--total-timesteps", "200000", "--local-num-envs", "8"],
            "2 ranks x 4 envs": ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", ATARI,
                                 "--total-timesteps", "200000", "--local-num-envs", "4"],
        },
    ),
}  # fmt: skip
DIAGNOSTICS = ["losses/entropy", "losses/approx_kl", "losses/explained_variance", "losses/value_loss"]


def commands(case: str, seeds: list[int] | None) -> tuple[str, dict[str, list[str]]]:
    if case in OTHER_CASES:
        return OTHER_CASES[case]
    target, flags, default_seeds = VEC_CASES[case]
    return target, {f"seed {s}": [VEC, *flags.split(), "--seed", str(s)] for s in (seeds or default_seeds)}


def run(label: str, cmd: list[str], cwd: Path) -> None:
    cwd.mkdir(parents=True, exist_ok=True)
    print(f"{label}: python {' '.join(cmd)}", flush=True)
    subprocess.run([sys.executable, *cmd], cwd=cwd, check=True, stdout=subprocess.DEVNULL)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("case", choices=sorted(VEC_CASES) + sorted(OTHER_CASES))
    parser.add_argument("--seeds", nargs="+", type=int, help="seeds to run instead of the case's own")
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time")
    parser.add_argument("--runs", type=Path, help="where the runs go, one subfolder each; finished ones are kept")
    args = parser.parse_args()
    target, cmds = commands(args.case, args.seeds)
    if args.runs is None:
        args.runs = Path(tempfile.mkdtemp(prefix=f"learning-{args.case}-"))
    print(f"runs go to {args.runs} (kept: summarize them again with --runs {args.runs})", flush=True)
    todo = {label: cmd for label, cmd in cmds.items() if not (args.runs / label.replace(" ", "_") / "runs").exists()}
    with ThreadPoolExecutor(args.jobs) as pool:
        for future in [
            pool.submit(run, label, cmd, args.runs / label.replace(" ", "_")) for label, cmd in todo.items()
        ]:
            future.result()

    lines = [
        f"Learning, {args.case} (target: {target}). Machine: {MACHINE}.",
        f"Command: `python benchmarks/learning.py {args.case}`; each run:",
        "",
        "| run | command | episodes | last-20 mean return |",
        "|---|---|---|---|",
    ]
    curves, finals, diagnostics = {}, {}, {}
    for label, cmd in cmds.items():
        run_dir = next((args.runs / label.replace(" ", "_") / "runs").iterdir())
        scalars = read_scalars(run_dir)
        steps, returns = (np.array(values) for values in zip(*scalars["charts/episodic_return"], strict=True))
        finals[label] = float(returns[-20:].mean())
        curves[label] = (steps.tolist(), returns.tolist())
        diagnostics[label] = {tag: scalars[tag] for tag in DIAGNOSTICS if tag in scalars}
        shown = " ".join(Path(c).name if c in (VEC, ATARI) else c for c in cmd)
        lines.append(f"| {label} | `{shown}` | {len(returns)} | {finals[label]:.1f} |")
    values = list(finals.values())
    lines += ["", f"All runs: mean {np.mean(values):.1f}, median {np.median(values):.1f}, min {np.min(values):.1f}."]
    plt = save(f"learning_{args.case}", lines, {"finals": finals, "curves": curves, "diagnostics": diagnostics})
    if plt is None:
        return
    panels = ["return"] + (DIAGNOSTICS if args.case in VEC_CASES else [])
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    for ax, panel in zip(axes[0], panels, strict=True):
        for label in cmds:
            points = diagnostics[label].get(panel, [])
            steps, values = curves[label] if panel == "return" else ([p[0] for p in points], [p[1] for p in points])
            window = 20 if panel == "return" else 5
            smooth = np.convolve(values, np.ones(window) / window, mode="valid") if len(values) >= window else values
            ax.plot(np.array(steps)[len(steps) - len(smooth) :], smooth, label=label, lw=1)
        ax.set(title=panel, xlabel="global step")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"{args.case}: {target}")
    fig.tight_layout()
    fig.savefig(RESULTS / f"learning_{args.case}.png", dpi=100)


if __name__ == "__main__":
    main()
