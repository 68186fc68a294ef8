"""Training speed (SPS) of ppo_vec.py and ppo_atari_multigpu.py against a CleanRL-style loop, side by side.

    # CartPole at 1, 2, 4, 8, 16 envs, Breakout at 8; 3 repetitions
    python benchmarks/train_speed.py
    python benchmarks/train_speed.py --quick          # CartPole at 1 and 8 envs only, 1 repetition
    python benchmarks/train_speed.py --baseline REV   # also the scripts as they were at git revision REV
    # also CleanRL's own scripts, from a checkout of it in DIR
    python benchmarks/train_speed.py --cleanrl DIR
    python benchmarks/train_speed.py --cleanrl DIR --hopper   # ... and a whole 1M-step Hopper run of each

`--cleanrl DIR`: CleanRL's ppo.py and ppo_atari.py as published (tested at its commit fe8d8a0, fetch
it with `git clone https://github.com/vwxyzjn/cleanrl DIR && git -C DIR checkout fe8d8a0`), in a
venv of their own (benchmarks/.venv-cleanrl, made once with CleanRL's pins: gymnasium 0.29.1, ale-py
0.8.1 with the ROMs of the ale-py 0.9.1 wheel, mujoco 2.3.3; the PyPI `cleanrl` package ships only
older scripts for Python < 3.11). Their envs are the v4 ones that gymnasium 0.29 has (Hopper-v4
where ours is Hopper-v5). `--hopper` times CleanRL's ppo_continuous_action.py (1 env x 2048 steps)
against ppo_vec.py's continuous preset for a whole 1M-step run each, wall time from start to exit.

Every run is a fresh subprocess, as a user runs it; repetitions are interleaved (ours, reference, ours, ...).
SPS counts from the first step (env start-up excluded, as both scripts report it). For ours, the time per
iteration splits into env wait, inference (policy forward passes and bookkeeping) and update, read from the
run's TensorBoard `perf/` scalars. Writes benchmarks/results/train_speed.md and train_speed.png.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.report import MACHINE, RESULTS, commit, save, save_png, venv_python  # noqa: E402
from tests.helpers import read_scalars  # noqa: E402

CLEANRL_VENV = REPO / "benchmarks" / ".venv-cleanrl"
HOPPER_PRESET = [
    "--num-envs",
    "8",
    "--num-steps",
    "256",
    "--learning-rate",
    "3e-4",
    "--num-minibatches",
    "32",
    "--update-epochs",
    "10",
    "--ent-coef",
    "0",
]


def cleanrl_python() -> str:
    """CleanRL's own venv, with the pins of its requirements at fe8d8a0 (torch: the CPU build on
    this disk)."""
    pins = ["gymnasium==0.29.1", "numpy==1.24.4", "tyro==0.5.10", "tensorboard==2.11.2", "protobuf==3.20.3"]
    pins += ["mujoco==2.3.3", "imageio", "ale-py==0.8.1", "shimmy==1.1.0", "opencv-python-headless==4.7.0.72"]
    python, pip = venv_python(CLEANRL_VENV, pins)
    if pip:  # ale-py 0.8 downloads ROMs from outside PyPI; 0.9.1's wheel has them
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run([*pip[:-2], "download", "-q", "--no-deps", "ale-py==0.9.1", "-d", tmp], check=True)
            wheel = next(Path(tmp).glob("ale_py-0.9.1-*.whl"))
            subprocess.run(["unzip", "-oq", "-j", str(wheel), "ale_py/roms/*.bin", "-d", f"{tmp}/roms"], check=True)
            subprocess.run([str(CLEANRL_VENV / "bin" / "ale-import-roms"), f"{tmp}/roms"], check=True)
    return python


def run(cmd: list[str], env: dict | None = None) -> tuple[int, dict]:
    """Runs one training command in a scratch folder: its last SPS, its wall time from start to exit
    ("wall") and, for ours, median per-iteration seconds."""
    with tempfile.TemporaryDirectory() as cwd:
        start = time.perf_counter()
        out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=7200, env=env)
        wall = time.perf_counter() - start
        if out.returncode:
            raise RuntimeError(f"{cmd} failed:\n{out.stderr[-3000:]}")
        sps = int(re.findall(r"SPS[=:] ?(\d+)", out.stdout)[-1])  # ours: SPS=..., CleanRL's: SPS: ...
        breakdown = {"wall": wall}
        runs = Path(cwd, "runs")
        if Path(cmd[1]).name in ("ppo_vec.py", "ppo_atari_multigpu.py"):
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
    parser.add_argument("--cleanrl", type=Path, help="a checkout of CleanRL: its scripts run beside ours, interleaved")
    parser.add_argument("--hopper", action="store_true", help="with --cleanrl: a 1M-step Hopper run of each, once")
    parser.add_argument("--hopper-steps", type=int, default=1_000_000, help="with --hopper: the runs' total steps")
    args = parser.parse_args()
    if args.quick:
        args.num_envs, args.repetitions, args.no_atari = [1, 8], 1, True
    py, ours_vec, ours_atari = sys.executable, str(REPO / "ppo_vec.py"), str(REPO / "ppo_atari_multigpu.py")
    reference = str(REPO / "benchmarks" / "cleanrl_reference.py")
    cleanrl = None
    if args.cleanrl:
        cleanrl = {"python": cleanrl_python(), "dir": args.cleanrl.resolve()}
        # ppo_atari.py imports cleanrl_utils
        cleanrl["env"] = dict(os.environ, PYTHONPATH=str(cleanrl["dir"]))

    baseline = None
    if args.baseline:  # the scripts and common/ of that revision, unpacked into a folder of their own
        baseline = Path(tempfile.mkdtemp(prefix="baseline-"))
        archive = subprocess.run(
            ["git", "archive", args.baseline, "ppo_vec.py", "ppo_atari_multigpu.py", "common"],
            cwd=REPO,
            capture_output=True,
            check=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(baseline)], input=archive, check=True)

    def published(script: str, *flags: str) -> tuple[list[str], dict]:
        return [cleanrl["python"], str(cleanrl["dir"] / "cleanrl" / script), *flags, "--no-cuda"], cleanrl["env"]

    cases = {}  # label -> {backend: (argv, environment or None)}
    for n in args.num_envs:
        steps = n * 128 * args.iterations
        flags = ["--env-id", "CartPole-v1", "--num-envs", str(n), "--total-timesteps", str(steps)]
        case = cases[f"CartPole-v1, {n} envs"] = {
            "ours": ([py, ours_vec, *flags], None),
            "reference": ([py, reference, *flags[:4], "--iterations", str(args.iterations)], None),
        }
        if baseline:
            case["baseline"] = ([py, str(baseline / "ppo_vec.py"), *flags], None)
        if cleanrl:
            case["CleanRL"] = published("ppo.py", *flags)
    if not args.no_atari:
        steps = 8 * 128 * args.atari_iterations
        flags = ["--local-num-envs", "8", "--total-timesteps", str(steps)]
        case = cases["Breakout, 8 envs, 1 rank"] = {
            "ours": ([py, ours_atari, *flags], None),
            "reference": (
                [
                    py,
                    reference,
                    "--env-id",
                    "BreakoutNoFrameskip-v4",
                    "--num-envs",
                    "8",
                    "--iterations",
                    str(args.atari_iterations),
                ],
                None,
            ),
        }
        if baseline:
            case["baseline"] = ([py, str(baseline / "ppo_atari_multigpu.py"), *flags], None)
        if cleanrl:
            case["CleanRL"] = published("ppo_atari.py", "--env-id", "BreakoutNoFrameskip-v4", *flags[2:])
    samples = {label: {name: [] for name in [*cmds, "breakdown"]} for label, cmds in cases.items()}
    for _ in range(args.repetitions):
        for label, cmds in cases.items():
            for name, (cmd, env) in cmds.items():
                sps, breakdown = run(cmd, env)
                samples[label][name].append(sps)
                if name == "ours":
                    samples[label]["breakdown"].append(breakdown)
            print(f"{label:28s} " + ", ".join(f"{name} {samples[label][name][-1]:6d} SPS" for name in cmds), flush=True)
    hopper = None
    if args.hopper and cleanrl:  # one whole run each, ours first
        steps = ["--total-timesteps", str(args.hopper_steps), "--seed", "1"]
        ours_sps, ours = run([py, ours_vec, "--env-id", "Hopper-v5", *HOPPER_PRESET, *steps])
        theirs_sps, theirs = run(
            published("ppo_continuous_action.py", "--env-id", "Hopper-v4", *steps)[0], cleanrl["env"]
        )
        hopper = {"ours": (ours_sps, ours["wall"]), "CleanRL": (theirs_sps, theirs["wall"])}
        walls = f"ours {ours['wall']:.0f} s, CleanRL {theirs['wall']:.0f} s"
        print(f"Hopper, {args.hopper_steps} steps: {walls}", flush=True)
    write_report(samples, args, hopper)


def write_report(samples, args, hopper=None) -> None:
    machine = MACHINE
    extra = [name for name in ("baseline", "CleanRL") if getattr(args, name.lower())]
    lines = [
        f"Training SPS, median of {args.repetitions} interleaved runs; reference: benchmarks/cleanrl_reference.py",
        "(a CleanRL-style loop over SyncVectorEnv)"
        + (f"; baseline: the scripts at git revision {args.baseline}" if args.baseline else "")
        + ("; CleanRL: its ppo.py / ppo_atari.py as published, in a venv of their own" if args.cleanrl else "")
        + f". Machine: {machine}.",
        f"Command: `python benchmarks/train_speed.py {' '.join(sys.argv[1:])}` at {commit(REPO)}.",
        "Per-iteration seconds of ours (medians): env wait / inference and bookkeeping / update.",
        "",
        "| case | ours SPS | reference SPS | ours / reference |"
        + "".join(f" {name} SPS | ours / {name} |" for name in extra)
        + " env s | inference s | update s |",
        "|---|---|---|---|" + "---|---|" * len(extra) + "---|---|---|",
    ]
    summary = {}
    for label, s in samples.items():
        ours, ref = float(np.median(s["ours"])), float(np.median(s["reference"]))
        parts = [float(np.median([b[p] for b in s["breakdown"]])) for p in ("env", "inference", "update")]
        summary[label] = dict(ours=ours, reference=ref, breakdown=parts, samples=s)
        row = f"| {label} | {ours:.0f} | {ref:.0f} | {ours / ref:.2f}x |"
        for name in extra:
            summary[label][name] = other = float(np.median(s[name]))
            row += f" {other:.0f} | {ours / other:.2f}x |"
        lines.append(row + " " + " | ".join(f"{p:.3f}" for p in parts) + " |")
    one, eight = summary.get("CartPole-v1, 1 envs"), summary.get("CartPole-v1, 8 envs")
    if one and eight:
        lines += ["", f"Vectorization: ppo_vec.py SPS at 8 envs / at 1 env = {eight['ours'] / one['ours']:.2f}x."]
    if hopper:
        (ours_sps, ours_wall), (theirs_sps, theirs_wall) = hopper["ours"], hopper["CleanRL"]
        lines += [
            "",
            f"A whole run, seed 1, {args.hopper_steps} steps: ppo_vec.py Hopper-v5 with the "
            "continuous preset "
            f"{ours_wall:.0f} s "
            f"({ours_sps} SPS); CleanRL's ppo_continuous_action.py Hopper-v4 (1 env x 2048 steps) "
            f"{theirs_wall:.0f} s "
            f"({theirs_sps} SPS): {theirs_wall / ours_wall:.2f}x the wall time of ours.",
        ]
        summary["hopper"] = hopper
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
        save_png(fig, RESULTS / "train_speed.png")


if __name__ == "__main__":
    main()
