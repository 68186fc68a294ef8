"""Learning results of the two scripts, measured: mean raw return of the last 20 episodes of each
run, and curves.

    # the mission's command, CartPole-v1, 8 envs, seeds 1-10
    python benchmarks/learning.py cartpole
    # the same without reward normalization (CleanRL's ppo.py)
    python benchmarks/learning.py cartpole-ablation
    python benchmarks/learning.py pendulum                # Pendulum-v1 with the README's flags, seeds 1-10
    python benchmarks/learning.py acrobot                 # Acrobot-v1 with the README's flags, seeds 1-10
    # the MuJoCo preset on 4 envs (v5), 1M steps, seeds 1-3, each run's final model also evaluated
    python benchmarks/learning.py mujoco --jobs 1
    python benchmarks/learning.py mujoco --envs HalfCheetah-v5 Hopper-v5 --jobs 1 --runs DIR
    # ppo_atari_multigpu.py, 1M steps, seed 1 (~40 min, 2 cores)
    python benchmarks/learning.py breakout
    # 2 ranks x 4 envs vs 1 rank x 8 envs (same global batch)
    python benchmarks/learning.py breakout-ranks
    python benchmarks/learning.py CASE --seeds 101 102    # other seeds (the ppo_vec cases)
    # runs in DIR; those already there are summarized, not rerun
    python benchmarks/learning.py CASE --runs DIR
    # run nothing: the finished runs, the rest listed
    python benchmarks/learning.py CASE --runs DIR --finished-only

Each run is the script's own command line (printed), in a scratch folder (or DIR with --runs),
`--jobs` at a time (results do not depend on it: a run gives the same numbers alone or beside
another). Writes benchmarks/results/learning_CASE.md, .json and .png (episodic return against global
step, 20-episode mean) as each run ends, with the runs finished so far; for mujoco also each final
model's deterministic evaluation over 10 episodes (--save-model: rl-baselines3-zoo's measure), and
for the ppo_vec cases the learning diagnostics (entropy, approx_kl, explained variance, value loss)
per seed; the .json keeps the curves as drawn (smoothed, at most 300 points each), not every episode.
The statistics over seeds (mean +- std, IQM with a 95% bootstrap interval) and the curve bands come
from common/sweep/report.py, as the sweep's report does (python -m common.sweep ... --report).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.report import MACHINE, RESULTS, save, save_png, smoothed  # noqa: E402
from common.run import records  # noqa: E402
from common.sweep import report  # noqa: E402
from common.sweep.report import read_scalars  # noqa: E402

VEC, ATARI = str(REPO / "ppo_vec.py"), str(REPO / "ppo_atari_multigpu.py")
CARTPOLE = "--env-id CartPole-v1 --num-envs 8"  # the mission's command: every other flag at its default
PENDULUM = "--env-id Pendulum-v1 --num-envs 8 --num-steps 256 --total-timesteps 300000 --gamma 0.9"
PENDULUM += " --learning-rate 1e-3 --update-epochs 10 --num-minibatches 8 --ent-coef 0 --no-norm-obs"
ACROBOT = "--env-id Acrobot-v1 --num-envs 16"
# CleanRL's continuous-control settings (ppo_continuous_action.py) on 8 envs x 256 steps: the same
# batch of 2048
MUJOCO = "--num-envs 8 --num-steps 256 --learning-rate 3e-4 --num-minibatches 32 --update-epochs 10 --ent-coef 0"
MUJOCO_ENVS = ["HalfCheetah-v5", "Hopper-v5", "Walker2d-v5", "InvertedPendulum-v5"]
CLEANRL_MUJOCO = {  # CleanRL's published ppo_continuous_action.py results, v4 envs, 1M steps, 3 seeds
    "HalfCheetah-v5": "1442.6 +- 46.0 (v4)",
    "Hopper-v5": "2382.9 +- 271.7 (v4)",
    "Walker2d-v5": "2288.0 +- 571.8 (v4)",
    "InvertedPendulum-v5": "963.1 +- 22.2 (v4)",
}
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
DIAGNOSTICS = ["losses/entropy", "losses/approx_kl", "losses/explained_variance", "losses/value_loss"]


def commands(case: str, seeds: list[int] | None, envs: list[str] | None = None) -> tuple[str, dict[str, list[str]]]:
    if case == "mujoco":
        target = "at or above CleanRL's mean on each env (theirs v4, ours v5)"
        flags = [*MUJOCO.split(), "--total-timesteps", "1000000", "--save-model"]
        runs = [(env, seed) for env in envs or MUJOCO_ENVS for seed in seeds or [1, 2, 3]]
        return target, {f"{env} seed {s}": [VEC, "--env-id", env, *flags, "--seed", str(s)] for env, s in runs}
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
    parser.add_argument("case", choices=sorted(VEC_CASES) + sorted(OTHER_CASES) + ["mujoco"])
    parser.add_argument("--seeds", nargs="+", type=int, help="seeds to run instead of the case's own")
    parser.add_argument("--envs", nargs="+", choices=MUJOCO_ENVS, help="mujoco: these envs only")
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time")
    parser.add_argument("--runs", type=Path, help="where the runs go, one subfolder each; finished ones are kept")
    parser.add_argument("--finished-only", action="store_true", help="with --runs: summarize what finished")
    args = parser.parse_args()
    target, cmds = commands(args.case, args.seeds, args.envs)
    if args.finished_only and args.runs is None:
        parser.error("--finished-only summarizes the runs in --runs DIR: give it")
    if args.runs is None:
        args.runs = Path(tempfile.mkdtemp(prefix=f"learning-{args.case}-"))
    print(f"runs go to {args.runs} (kept: summarize them again with --runs {args.runs})", flush=True)
    todo = {label: cmd for label, cmd in cmds.items() if not (args.runs / label.replace(" ", "_") / "runs").exists()}
    if args.finished_only:
        todo = {}
    with ThreadPoolExecutor(args.jobs) as pool:
        futures = [pool.submit(run, label, cmd, args.runs / label.replace(" ", "_")) for label, cmd in todo.items()]
        for future in as_completed(futures):
            future.result()
            summarize(args, target, cmds)  # a session that ends midway loses only the runs under way
    summarize(args, target, cmds)


def finished(args: argparse.Namespace, label: str) -> bool:
    summaries = list((args.runs / label.replace(" ", "_") / "runs").glob("*/summary.json"))
    return bool(summaries) and (records.read_json(summaries[0]) or {}).get("status") == "done"


def summarize(args: argparse.Namespace, target: str, cmds: dict[str, list[str]]) -> None:
    """The results of the runs finished so far, the others named."""
    not_run = [label for label in cmds if not finished(args, label)]
    cmds = {label: cmd for label, cmd in cmds.items() if label not in not_run}
    if not cmds:
        return
    evaluated = args.case == "mujoco"
    shown = " ".join(arg for arg in sys.argv[1:] if arg != "--finished-only")  # the command that ran the runs
    lines = [
        f"Learning, {args.case} (target: {target}). Machine: {MACHINE}.",
        f"Command: `python benchmarks/learning.py {shown}`; a run's figure is the mean raw return of its last 20",
        "training episodes (full games for Atari); over runs, mean +- std and the IQM with a 95% bootstrap interval.",
        *(["The final model's deterministic evaluation: its mean return over 10 episodes (--save-model)."] * evaluated),
        "",
        "| run | command | episodes | last-20 mean return |" + (" deterministic eval, 10 episodes |" * evaluated),
        "|---|---|---|---|" + ("---|" * evaluated),
    ]
    curves, finals, evals, diagnostics, folders = {}, {}, {}, {}, {}
    for label, cmd in cmds.items():
        run_dir = folders[label] = next((args.runs / label.replace(" ", "_") / "runs").iterdir())
        scalars = read_scalars(run_dir)
        steps, returns, _ = report.episodes(run_dir)
        finals[label] = report.final_return(run_dir)
        curves[label] = smoothed(steps, returns, 20)
        diagnostics[label] = {
            tag: smoothed(*zip(*scalars[tag], strict=True), 5, points=150) for tag in DIAGNOSTICS if scalars.get(tag)
        }
        shown = " ".join(Path(c).name if c in (VEC, ATARI) else c for c in cmd)
        row = f"| {label} | `{shown}` | {len(returns)} | {finals[label]:.1f} |"
        if evaluated and scalars.get("eval/episodic_return"):
            evals[label] = sum(value for _, value in scalars["eval/episodic_return"]) / len(
                scalars["eval/episodic_return"]
            )
            row += f" {evals[label]:.1f} |"
        lines.append(row)
    groups = {}  # what the statistics are over: an env's seeds (the mujoco case), or every run
    for label in cmds:
        groups.setdefault(label.split(" seed ")[0] if args.case == "mujoco" else args.case, []).append(label)
    stats = {group: report.aggregate([finals[label] for label in labels]) for group, labels in groups.items()}
    reference = CLEANRL_MUJOCO if args.case == "mujoco" else None
    lines += ["", *report.markdown_table(stats, reference)]
    if evals:
        eval_stats = {
            group: report.aggregate([evals[label] for label in labels if label in evals])
            for group, labels in groups.items()
        }
        lines += ["", "The deterministic evaluations, over seeds:", "", *report.markdown_table(eval_stats, reference)]
    if not_run:
        lines += ["", f"Not run (or not finished) for this table: {', '.join(not_run)}."]
    if args.case == "mujoco":
        for group, labels in groups.items():
            png = RESULTS / f"learning_mujoco_{group}.png"
            runs = {group: [folders[label] for label in labels]}
            save_png(report.plot_groups(runs, png, f"{group}, ppo_vec.py preset"))
            lines += ["", f"![{group}]({png.name})"]
    data = {"finals": finals, "stats": stats, "curves": curves, "diagnostics": diagnostics}
    plt = save(f"learning_{args.case}", lines, data | ({"evals": evals} if evaluated else {}))
    if plt is None or args.case == "mujoco":
        return
    panels = ["return"] + (DIAGNOSTICS if args.case in VEC_CASES else [])
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    for ax, panel in zip(axes[0], panels, strict=True):
        for label in cmds:
            steps, values = curves[label] if panel == "return" else diagnostics[label].get(panel, ([], []))
            ax.plot(steps, values, label=label, lw=1)
        ax.set(title=panel, xlabel="global step")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"{args.case}: {target}")
    fig.tight_layout()
    save_png(fig, RESULTS / f"learning_{args.case}.png")


if __name__ == "__main__":
    main()
