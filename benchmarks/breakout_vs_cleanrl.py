"""Breakout learning of ppo_atari_multigpu.py (its defaults, one rank) side by side with CleanRL's
own ppo_atari.py, on the same seeds and steps: each run's last-20 raw return, wall time and CPU time.

    # CleanRL's checkout in DIR (see benchmarks/train_speed.py), seeds 1 and 2, 1M steps (~1-1.5 h a run)
    python benchmarks/breakout_vs_cleanrl.py --cleanrl DIR --runs RUNS --seeds 1 2
    # ours from another checkout (the commit recorded is that checkout's)
    python benchmarks/breakout_vs_cleanrl.py --cleanrl DIR --runs RUNS --ours CHECKOUT
    # run nothing: summarize what finished in RUNS
    python benchmarks/breakout_vs_cleanrl.py --runs RUNS --seeds 1 2 --finished-only
    # run what is missing, keeping the runs the results file holds (a session before, its RUNS gone)
    python benchmarks/breakout_vs_cleanrl.py --cleanrl DIR --runs RUNS --seeds 1 2 --keep

Each run is the script's own command, niced (`nice -n 10`: made to run beside other work), in
RUNS/<name>-<seed>; the runs go one after another (ours, then CleanRL, seed by seed), and a run with
a result.json is kept, not rerun. The wall time is from start to exit (start-up included) and the
CPU time that of the run's whole process tree. Both scripts log each finished game's raw return as
charts/episodic_return (CleanRL's RecordEpisodeStatistics sits under its EpisodicLifeEnv; ours counts
whole games), so the figure is the mean of the last 20 of each. Writes
benchmarks/results/learning_breakout_vs_cleanrl.md, .json and .png (return against steps and
against wall time).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from benchmarks.report import MACHINE, RESULTS, commit, save, save_png, smoothed  # noqa: E402
from benchmarks.train_speed import cleanrl_python  # noqa: E402
from common.sweep import report  # noqa: E402


def commands(args: argparse.Namespace, seed: int) -> dict[str, tuple[list[str], dict]]:
    steps = ["--total-timesteps", str(args.steps), "--seed", str(seed)]
    ours = [sys.executable, str(args.ours / "ppo_atari_multigpu.py"), *steps]
    found = {"ours": (ours, dict(os.environ))}
    if args.cleanrl:  # ppo_atari.py imports cleanrl_utils from its checkout
        cleanrl = [cleanrl_python(), str(args.cleanrl / "cleanrl" / "ppo_atari.py"), *steps]
        found["cleanrl"] = (cleanrl, dict(os.environ, PYTHONPATH=str(args.cleanrl)))
    return found


def run(folder: Path, cmd: list[str], env: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    print(f"{folder.name}: {' '.join(cmd)}", flush=True)
    before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.time()
    with open(folder / "log.txt", "w") as log:
        code = subprocess.run(["nice", "-n", "10", *cmd], cwd=folder, stdout=log, stderr=subprocess.STDOUT, env=env)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    result = {"command": " ".join(cmd), "exit": code.returncode, "wall_seconds": round(time.time() - start, 1)}
    (folder / "result.json").write_text(json.dumps(result | {"cpu_seconds": round(cpu, 1)}, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cleanrl", type=Path, help="a checkout of CleanRL (commit fe8d8a0): its ppo_atari.py runs")
    parser.add_argument("--ours", type=Path, default=REPO, help="the checkout whose ppo_atari_multigpu.py runs")
    parser.add_argument("--runs", type=Path, required=True, help="where the runs go, one folder each; kept")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--finished-only", action="store_true", help="run nothing: summarize what finished")
    parser.add_argument("--keep", action="store_true", help="keep the results file's runs that RUNS lacks")
    args = parser.parse_args()
    args.ours, args.cleanrl = args.ours.resolve(), args.cleanrl and args.cleanrl.resolve()
    # Runs measured before (another session's RUNS, gone since) stay, each with its own command
    earlier = json.loads(RESULTS.joinpath("learning_breakout_vs_cleanrl.json").read_text()) if args.keep else {}
    if not args.finished_only:
        for seed in args.seeds:
            for name, (cmd, env) in commands(args, seed).items():
                done = (args.runs / f"{name}-{seed}" / "result.json").exists() or f"{name}-{seed}" in earlier.get(
                    "runs", {}
                )
                if not done:
                    run(args.runs / f"{name}-{seed}", cmd, env)

    measured = earlier.get("commit") or commit(args.ours)  # kept runs of ours: their commit
    data = {"commit": measured, "steps": args.steps, "ours": {}, "cleanrl": {}, "runs": {}, "curves": {}}
    lines = [
        f"Breakout, {args.steps:,} steps: ppo_atari_multigpu.py (defaults, one rank; commit {data['commit']}) and",
        f"CleanRL's ppo_atari.py, each niced. Machine: {MACHINE}. Command: `python benchmarks/breakout_vs_cleanrl.py"
        f" {' '.join(sys.argv[1:])}`.",
        "",
        "| run | last-20 raw return | games | wall time, s | CPU time, s | command |",
        "|---|---|---|---|---|---|",
    ]
    for name in ("ours", "cleanrl"):
        for seed in args.seeds:
            folder = args.runs / f"{name}-{seed}"
            result = json.loads((folder / "result.json").read_text()) if (folder / "result.json").exists() else None
            key = f"{name}-{seed}"
            if (result is None or result["exit"] != 0) and key in earlier.get("runs", {}):
                data[name][str(seed)], data["runs"][key] = earlier[name][str(seed)], earlier["runs"][key]
                data["curves"][key], result = earlier["curves"][key], earlier["runs"][key]
                games = "-"
            elif result is None or result["exit"] != 0:
                lines.append(f"| {name} seed {seed} | not finished | | | | |")
                continue
            else:
                run_dir = next((folder / "runs").iterdir())
                steps, returns, wall = report.episodes(run_dir)
                data[name][str(seed)] = round(report.final_return(run_dir), 2)
                data["runs"][key] = result
                data["curves"][key] = [*smoothed(steps, returns, 20), smoothed(wall, returns, 20)[0]]
                games = len(returns)
            lines.append(
                f"| {name} seed {seed} | {data[name][str(seed)]:.1f} | {games} | {result['wall_seconds']:.0f} | "
                f"{result['cpu_seconds']:.0f} | `{result['command']}` |"
            )
    ours = sum(data["ours"].values()) / max(len(data["ours"]), 1)
    lines += ["", f"Ours, mean over seeds {', '.join(data['ours'])}: {ours:.1f}."]
    if both := [seed for seed in data["ours"] if seed in data["cleanrl"]]:  # compared on the seeds both finished
        means = {name: sum(data[name][seed] for seed in both) / len(both) for name in ("ours", "cleanrl")}
        lines[-1] += f" On the seeds both finished ({', '.join(both)}): ours {means['ours']:.1f}, CleanRL"
        lines[-1] += f" {means['cleanrl']:.1f} (ours / CleanRL {means['ours'] / means['cleanrl']:.2f}x)."
    lines += ["", "![curves](learning_breakout_vs_cleanrl.png)"]
    plt = save("learning_breakout_vs_cleanrl", lines, data)
    if plt is None:
        return
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for label, (steps, returns, seconds) in data["curves"].items():
        style = "-" if label.startswith("ours") else "--"
        axes[0].plot(steps, returns, style, lw=1, label=label)
        axes[1].plot([s / 60 for s in seconds], returns, style, lw=1, label=label)
    axes[0].set(xlabel="global step", ylabel="raw return, 20-game mean")
    axes[1].set(xlabel="wall time, minutes (niced, beside other work)")
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"Breakout: ppo_atari_multigpu.py ({data['commit']}) and CleanRL's ppo_atari.py")
    fig.tight_layout()
    save_png(fig, RESULTS / "learning_breakout_vs_cleanrl.png")


if __name__ == "__main__":
    main()
