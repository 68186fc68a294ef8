"""Breakout at CleanRL's hyperparameters on one GPU node, side by side in one call: ours (eager without
--overlap, with it, with --overlap --compile --cudagraphs; with --overlap at 16, 32 and 64 envs, and with all
three at 64), CleanRL's own ppo_atari.py and LeanRL's own ppo_atari_envpool_torchcompile.py --compile
--cudagraphs, where an iteration of ours goes, and env stepping alone (ours against ale-py's AtariVectorEnv at
16, 32 and 64 envs), in that order: a part the budget leaves no time for is said so.

    python benchmarks/gpu_prep.py                      # here (PyPI, fetch mirrors): peers' files, wheels
    bash benchmarks/gpu_side_by_side.sh                # on the GPU node, offline, in under 9 minutes
    bash benchmarks/gpu_side_by_side.sh --rehearse     # on a CPU: every run tiny, CUDA off (a few minutes)

The peers' files are their own, unmodified, copied by gpu_prep.py into benchmarks/.gpu_peers/peers;
their packages are installed here from benchmarks/.gpu_peers/wheels/cpXY with `pip install --no-index
--no-deps --target`, one folder per group (ours, cleanrl, leanrl) put first on that group's
PYTHONPATH, so the machine's own CUDA torch is the one imported (a venv's --system-site-packages would
show the base interpreter's packages, not those of a python that is itself a venv, as the GPU node's
is). Every run goes the same number of iterations of the same size: `warmup` iterations, then
`measured` ones; SPS = steps of the measured iterations / wall time from the end of the last warm-up
iteration to the end of the last, read from each run's own per-iteration records (ours and CleanRL:
the wall time of their TensorBoard charts/SPS events; LeanRL: the time of its wandb.log calls, made
every 10 iterations, so warmup and measured are multiples of 10). A run that fails or runs out of
time keeps what it logged. Writes
benchmarks/results/gpu_side_by_side.md and .json (and into $OUT when set, after every part).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from benchmarks.report import RESULTS, commit  # noqa: E402

PEERS = REPO / "benchmarks" / ".gpu_peers"
STUBS = REPO / "benchmarks" / "peer_stubs"
TAG = f"cp{sys.version_info.major}{sys.version_info.minor}"

# What each group installs (--no-deps: each need named; torch, opencv, tensorboard, tqdm's absl-py
# and cloudpickle are the machine's own). numpy 1.26 for CleanRL: its gymnasium 0.29 uses np.bool8.
# tensordict 0.13 for LeanRL: from 0.14 on, from_module(...).data no longer detaches, and its rollout
# then builds a graph its update backwards through twice.
GROUPS = {
    "ours": [
        "gymnasium==1.4.0",
        "farama-notifications==0.0.6",
        "ale-py==0.12.1",
        "tyro==1.0.17",
        "docstring-parser==0.18.0",
        "typeguard==4.6.1",
        "typing-extensions==4.15.0",
    ],
    "cleanrl": [
        "gymnasium==0.29.1",
        "farama-notifications==0.0.6",
        "ale-py==0.9.1",
        "numpy==1.26.4",
        "tyro==1.0.17",
        "docstring-parser==0.18.0",
        "typeguard==4.6.1",
        "typing-extensions==4.15.0",
    ],
    "leanrl": [
        "envpool==0.9.0",
        "gym==0.25.2",
        "gym-notices==0.1.0",
        "gymnasium==1.4.0",
        "farama-notifications==0.0.6",
        "dm-env==1.6",
        "optree==0.20.0",
        "tensordict==0.13.0",
        "packaging==25.0",
        "pyvers==0.2.3",
        "tqdm==4.70.1",
        "tyro==1.0.17",
        "docstring-parser==0.18.0",
        "typeguard==4.6.1",
        "typing-extensions==4.15.0",
    ],
}
IMPORTS = {
    "ours": "gymnasium ale_py tyro",
    "cleanrl": "gymnasium ale_py tyro numpy",
    "leanrl": "envpool gym tensordict",
}
CLEANRL_FILE = PEERS / "peers" / "cleanrl" / "cleanrl" / "ppo_atari.py"
LEANRL_FILE = PEERS / "peers" / "leanrl" / "leanrl" / "ppo_atari_envpool_torchcompile.py"


def group_env(group: str) -> dict:
    paths = [PEERS / "site" / group]
    paths += {"cleanrl": [PEERS / "peers" / "cleanrl"], "leanrl": [STUBS]}.get(group, [])
    return dict(os.environ, PYTHONPATH=os.pathsep.join(map(str, paths)))


def pasteable(cmd: list[str], cwd: Path, group: str) -> str:
    """The command as one line that works pasted at the repository root."""
    rel = os.path.relpath(cwd, REPO)
    pythonpath = os.pathsep.join(os.path.relpath(p, cwd) for p in group_env(group)["PYTHONPATH"].split(os.pathsep))
    return f"(cd {shlex.quote(rel)} && PYTHONPATH={shlex.quote(pythonpath)} {shlex.join(cmd)})"


def install() -> dict:
    """Each group's wheels into its own folder, offline; the versions each group then imports."""
    wheels = PEERS / "wheels" / TAG
    if not wheels.is_dir():
        found = sorted(p.name for p in (PEERS / "wheels").glob("*")) if (PEERS / "wheels").is_dir() else []
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        prep = f"python benchmarks/gpu_prep.py --python {version}"
        raise SystemExit(f"no wheels for {TAG} in {wheels} (there: {found}); run here with PyPI: {prep}")
    versions = {}
    for group, requirements in GROUPS.items():
        site = PEERS / "site" / group
        shutil.rmtree(site, ignore_errors=True)
        pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile"]
        pip += [
            "--disable-pip-version-check",
            "--root-user-action=ignore",
            "--find-links",
            str(wheels),
            "--target",
            str(site),
            *requirements,
        ]
        subprocess.run(pip, check=True, env=dict(os.environ, PIP_CONSTRAINT="", PIP_FIND_LINKS=""))
        names = IMPORTS[group].split()
        code = "import importlib, sys; print(*(f'{n} {importlib.import_module(n).__version__}' for n in sys.argv[1:]))"
        out = subprocess.run([sys.executable, "-c", code, *names], env=group_env(group), capture_output=True, text=True)
        versions[group] = out.stdout.strip() or f"import failed: {out.stderr.strip().splitlines()[-1:]}"
        print(f"installed {group}: {versions[group]}", flush=True)
    return versions


def event_times(run_root: Path) -> dict[str, list]:
    """(wall_time, step, value) of every scalar in the TensorBoard run under run_root, by tag."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    folders = [p.parent for p in run_root.rglob("events.out.tfevents.*")]
    if not folders:
        return {}
    accumulator = EventAccumulator(str(folders[0]), size_guidance={"scalars": 0})
    accumulator.Reload()
    return {
        tag: [(e.wall_time, e.step, e.value) for e in accumulator.Scalars(tag)] for tag in accumulator.Tags()["scalars"]
    }


def rate(marks: list[tuple[float, int]], warmup_step: int) -> tuple[float | None, int]:
    """SPS from the mark at warmup_step to the last one (marks: (time, global_step) at iteration ends)."""
    start = [m for m in marks if m[1] == warmup_step]
    if not start or marks[-1][1] <= warmup_step:
        return None, 0
    steps = marks[-1][1] - warmup_step
    return steps / (marks[-1][0] - start[0][0]), steps


class Bench:
    def __init__(self, args):
        self.args, self.deadline = args, time.time() + args.budget
        self.rows, self.envs_only, self.notes, self.breakdowns = [], [], [], {}
        self.cuda = not args.rehearse
        self.data = {"rows": self.rows, "env_only": self.envs_only, "notes": self.notes, "breakdown": self.breakdowns}

    def launch(self, name: str, group: str, cmd: list[str], cap: float) -> tuple[Path, str, float, str]:
        """Runs cmd in benchmarks/.gpu_peers/runs/name with a timeout; (folder, output, seconds, status)."""
        cwd = PEERS / "runs" / re.sub(r"[^\w.]+", "-", name).strip("-")
        shutil.rmtree(cwd, ignore_errors=True)
        cwd.mkdir(parents=True)
        timeout = min(cap, self.deadline - time.time() - 5)
        line = pasteable(cmd, cwd, group)
        if timeout < 20:
            self.notes.append(f"{name}: not run, no time left in the budget")
            return cwd, "", 0.0, "not run (no time left)"
        print(f"\n== {name} (timeout {timeout:.0f} s)\n{line}", flush=True)
        start = time.time()
        with open(cwd / "log.txt", "w") as log:
            try:
                code = subprocess.run(
                    cmd, cwd=cwd, env=group_env(group), stdout=log, stderr=subprocess.STDOUT, timeout=timeout
                )
                status = "ok" if code.returncode == 0 else f"exit {code.returncode}"
            except subprocess.TimeoutExpired:
                status = f"timed out after {timeout:.0f} s"
        seconds = time.time() - start
        output = (cwd / "log.txt").read_text(errors="replace")
        if status != "ok":
            print("\n".join(output.replace("\r", "\n").splitlines()[-15:]), flush=True)
        print(f"{name}: {status} in {seconds:.0f} s", flush=True)
        return cwd, output, seconds, status

    def add_row(self, name, line, sps, steps, status, seconds, extra=None):
        row = {"run": name, "sps": sps and round(sps), "steps_measured": steps, "status": status}
        row |= {"seconds": round(seconds), "command": line} | (extra or {})
        self.rows.append(row)
        print(f"{name}: SPS {row['sps']} over {steps} steps ({status})", flush=True)
        self.write()

    def ours(self, name: str, num_envs: int, flags: list[str], warmup: int, measured: int, cap: float):
        args = self.args
        cmd = [sys.executable, str(REPO / "ppo_atari_multigpu.py"), "--local-num-envs", str(num_envs)]
        cmd += [
            "--num-steps",
            str(args.num_steps),
            "--total-timesteps",
            str((warmup + measured) * num_envs * args.num_steps),
        ]
        cmd += [*flags, *([] if self.cuda else ["--no-cuda"])]
        cwd, output, seconds, status = self.launch(name, "ours", cmd, cap)
        scalars = event_times(cwd / "runs")
        marks = [(t, s) for t, s, _ in scalars.get("charts/SPS", [])]
        sps, steps = rate(marks, warmup * num_envs * args.num_steps)
        parts = {part: scalars.get(f"perf/{part}_seconds", []) for part in ("env", "inference", "update")}
        measured_steps = {s for _, s in marks if s > warmup * num_envs * args.num_steps}
        if measured_steps and all(parts.values()):
            periods = [b[0] - a[0] for a, b in zip(marks, marks[1:], strict=False) if b[1] in measured_steps]
            median = {p: sorted(v for _, s, v in parts[p] if s in measured_steps) for p in parts}
            median = {p: v[len(v) // 2] for p, v in median.items() if v}
            period = sorted(periods)[len(periods) // 2]
            self.breakdowns[name] = {"iteration": period, **median, "rest": period - sum(median.values())}
        start_line = next((ln for ln in output.splitlines() if ln.startswith("ppo_atari")), "")
        self.add_row(name, pasteable(cmd, cwd, "ours"), sps, steps, status, seconds, {"start_line": start_line})

    def cleanrl(self, warmup: int, measured: int, cap: float):
        args = self.args
        cmd = [sys.executable, str(CLEANRL_FILE), "--env-id", "ale_py:BreakoutNoFrameskip-v4", "--num-envs", "8"]
        cmd += ["--num-steps", str(args.num_steps), "--total-timesteps", str((warmup + measured) * 8 * args.num_steps)]
        cmd += [] if self.cuda else ["--no-cuda"]
        cwd, _, seconds, status = self.launch("cleanrl ppo_atari.py", "cleanrl", cmd, cap)
        marks = [(t, s) for t, s, _ in event_times(cwd / "runs").get("charts/SPS", [])]
        sps, steps = rate(marks, warmup * 8 * args.num_steps)
        self.add_row("CleanRL ppo_atari.py", pasteable(cmd, cwd, "cleanrl"), sps, steps, status, seconds)

    def leanrl(self, flags: list[str], warmup: int, measured: int, cap: float):
        args = self.args
        cmd = [sys.executable, str(LEANRL_FILE), "--num-envs", "8", "--num-steps", str(args.num_steps)]
        cmd += ["--total-timesteps", str((warmup + measured) * 8 * args.num_steps), *flags]
        cmd += [] if self.cuda else ["--no-cuda"]
        name = "LeanRL " + " ".join(flags or ["eager"])
        cwd, output, seconds, status = self.launch(name, "leanrl", cmd, cap)
        # tqdm's progress bar (carriage returns, no newline) may stand before a line of the stub's
        logs = [(float(t), json.loads(d)) for t, d in re.findall(r"wandb\.log (\S+) (\{.*\})", output)]
        sps, steps = rate([(t, d["step"]) for t, d in logs], warmup * 8 * args.num_steps)
        own = [d["speed"] for _, d in logs if d["step"] > warmup * 8 * args.num_steps]
        extra = {"its_own_speed": [round(s) for s in own]}
        self.add_row(name, pasteable(cmd, cwd, "leanrl"), sps, steps, status, seconds, extra)

    def env_only(self, cap: float):
        nums = ",".join(map(str, self.args.env_nums))
        cmd = [sys.executable, str(Path(__file__).resolve()), "--env-only-child", nums, str(self.args.env_seconds)]
        cwd, output, seconds, status = self.launch("env stepping alone", "ours", cmd, cap)
        for line in output.splitlines():
            if line.startswith("{"):
                self.envs_only.append(json.loads(line))
        self.write()

    def write(self):
        lines = report_lines(self.args, self.data)
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "gpu_side_by_side.md").write_text("\n".join(lines) + "\n")
        (RESULTS / "gpu_side_by_side.json").write_text(json.dumps(self.data, separators=(",", ":")) + "\n")
        if os.environ.get("OUT"):
            for suffix in (".md", ".json"):
                shutil.copy(
                    RESULTS / f"gpu_side_by_side{suffix}", Path(os.environ["OUT"]) / f"gpu_side_by_side{suffix}"
                )


def env_only_child(nums: list[int], seconds: float) -> None:
    """Runs with ours' packages: ours (default layout) against ale-py, interleaved, one JSON line per N."""
    import numpy as np

    from benchmarks.vecenv_throughput import builders, draw_actions, measure

    for n in nums:
        found = builders("Breakout", n)
        runners = {name: found[name]() for name in ("ours (default)", "ale-py Vector")}
        actions = draw_actions("Breakout", n)
        samples = {name: [] for name in runners}
        for rep in range(2):
            for name in runners if rep % 2 == 0 else reversed(runners):
                samples[name].append(measure(runners[name], actions, seconds))
        layout = str(runners["ours (default)"].env.layout)
        for runner in runners.values():
            runner.close()
        medians = {name: float(np.median(v)) for name, v in samples.items()}
        print(json.dumps({"n": n, **medians, "layout": layout}), flush=True)


def machine() -> dict:
    gpu = (
        subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
        ).stdout.strip()
        if shutil.which("nvidia-smi")
        else "none (no nvidia-smi)"
    )
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    import torch

    return {
        "gpu": gpu,
        "cpu": cpu,
        "cores": len(os.sched_getaffinity(0)),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit(REPO),
    }


def report_lines(args, data) -> list[str]:
    m = data["machine"]
    lines = [
        "# Breakout side by side on one machine",
        "",
        f"{m['date']}, commit {m['commit']}. GPU: {m['gpu']}. CPU: {m['cpu']}, {m['cores']} cores."
        f" Python {m['python']}, torch {m['torch']}."
        f" Command: `bash benchmarks/gpu_side_by_side.sh {' '.join(sys.argv[1:])}`"
        f"{' (REHEARSAL: tiny runs on CPU, the figures mean nothing)' if args.rehearse else ''}.",
        f"Each run: {args.warmup} warm-up iterations, then {args.measured} measured ({args.num_steps} steps per env"
        f" per iteration; envs x steps per iteration as the row says); the envs sweep: {args.sweep_warmup} + "
        f"{args.sweep_measured}. Installed: "
        + "; ".join(f"{g}: {v}" for g, v in data.get("installed", {}).items())
        + ".",
        "",
        "| run | SPS | / CleanRL | / LeanRL compile+cudagraphs | steps measured | status | wall s |",
        "|---|---|---|---|---|---|---|",
    ]
    by_name = {r["run"]: r["sps"] for r in data["rows"]}
    cleanrl = by_name.get("CleanRL ppo_atari.py")
    leanrl = by_name.get("LeanRL --compile --cudagraphs") or by_name.get("LeanRL eager")
    for r in data["rows"]:
        ratio = [f"{r['sps'] / peer:.2f}x" if r["sps"] and peer else "-" for peer in (cleanrl, leanrl)]
        lines.append(
            f"| {r['run']} | {r['sps'] or '-'} | {ratio[0]} | {ratio[1]} | {r['steps_measured']} | {r['status']} |"
            f" {r['seconds']} |"
        )
    if data["env_only"]:
        lines += ["", "Env stepping alone (random actions, median of 2 interleaved), steps/s:", ""]
        lines += [
            "| N | ours (default layout) | ale-py AtariVectorEnv | ours / ale-py | ours' layout |",
            "|---|---|---|---|---|",
        ]
        for e in data["env_only"]:
            ours, ale = e["ours (default)"], e["ale-py Vector"]
            lines.append(f"| {e['n']} | {ours:.0f} | {ale:.0f} | {ours / ale:.2f}x | {e['layout']} |")
    if data["breakdown"]:
        lines += [
            "",
            "Where an iteration of ours goes (medians over the measured iterations, seconds; the rest: logging,",
        ]
        lines += ["GAE, copies, anything outside the three timed parts):", ""]
        lines += ["| run | iteration | env wait | inference | update | the rest |", "|---|---|---|---|---|---|"]
        for name, b in data["breakdown"].items():
            cells = " | ".join(
                f"{b.get(k, float('nan')):.3f}" for k in ("iteration", "env", "inference", "update", "rest")
            )
            lines.append(f"| {name} | {cells} |")
    lines += ["", "Notes:", ""] + [f"- {n}" for n in data["notes"]]
    lines += ["", "Commands (from the repository root):", ""] + [
        f"- {r['run']}: `{r['command']}`" for r in data["rows"]
    ]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rehearse", action="store_true", help="tiny runs on CPU: proves the installs and the parsing")
    parser.add_argument("--budget", type=float, default=500, help="seconds for everything (install included)")
    parser.add_argument("--num-steps", type=int, default=128)
    parser.add_argument("--warmup", type=int, default=10, help="warm-up iterations (a multiple of 10: LeanRL's logs)")
    parser.add_argument("--measured", type=int, default=20, help="measured iterations (a multiple of 10)")
    parser.add_argument("--sweep-warmup", type=int, default=3)
    parser.add_argument("--sweep-measured", type=int, default=5)
    parser.add_argument("--env-nums", type=int, nargs="+", default=[16, 32, 64])
    parser.add_argument("--env-seconds", type=float, default=1.5)
    parser.add_argument("--env-only-child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.env_only_child:
        return env_only_child([int(n) for n in args.env_only_child[0].split(",")], float(args.env_only_child[1]))
    if args.rehearse:
        args.num_steps, args.sweep_warmup, args.sweep_measured, args.env_seconds = 16, 1, 2, 0.3
        args.budget = max(args.budget, 900)
    if args.warmup % 10 or args.measured % 10:
        parser.error(
            f"--warmup and --measured must be multiples of 10 (LeanRL logs every 10), got {args.warmup}, "
            f"{args.measured}"
        )
    bench = Bench(args)
    bench.data["machine"] = machine()
    print(json.dumps(bench.data["machine"]), flush=True)
    bench.data["installed"] = install()
    w, m = args.warmup, args.measured
    graphs = ["--compile", "--cudagraphs"] if bench.cuda else ["--compile"]  # (CUDA graphs need CUDA)
    bench.ours("ours eager, --no-overlap", 8, ["--no-overlap"], w, m, cap=80)
    if bench.cuda:
        bench.leanrl(["--compile", "--cudagraphs"], w, m, cap=150)
    else:
        bench.notes.append(
            "LeanRL: eager on CPU (--cudagraphs needs CUDA; its --compile on CPU with torch 2.13 stops in its update:"
            " backward through the graph a second time)"
        )
        bench.leanrl([], w, m, cap=200)
    bench.cleanrl(w, m, cap=110 if bench.cuda else 200)
    bench.ours("ours --overlap", 8, ["--overlap"], w, m, cap=80)
    bench.ours(f"ours --overlap {' '.join(graphs)}", 8, ["--overlap", *graphs], w, m, cap=150)
    for n in (16, 32, 64):
        bench.ours(f"ours --overlap, {n} envs", n, ["--overlap"], args.sweep_warmup, args.sweep_measured, cap=60)
    sweep = args.sweep_warmup, args.sweep_measured
    bench.ours(f"ours --overlap {' '.join(graphs)}, 64 envs", 64, ["--overlap", *graphs], *sweep, cap=120)
    bench.env_only(cap=75 if bench.cuda else 150)
    bench.notes += NOTES
    bench.write()
    print("\n" + "\n".join(report_lines(args, bench.data)))


NOTES = [
    "Same work where it can be: 8 envs x 128 steps, 4 minibatches x 4 epochs, seed 1, Breakout with DeepMind's"
    " preprocessing in each. What cannot be made the same: LeanRL steps EnvPool's Breakout-v5 (its own C++ pool;"
    " a lost life ends the episode, the game goes on; it autoresets a step after an end) where ours and CleanRL step"
    " the ALE through Python wrappers; LeanRL sets TF32 matmuls (`torch.set_float32_matmul_precision('high')`).",
    "CleanRL's ppo_atari.py (fe8d8a0) runs with gymnasium 0.29.1 (its pin) and numpy 1.26, but ale-py 0.9.1 for"
    " its pinned 0.8.1 (no wheel for Python 3.12); ale-py 0.9 registers its envs on import, so the env id is passed"
    " as `ale_py:BreakoutNoFrameskip-v4` (gymnasium imports the module named before the colon; the same env).",
    "LeanRL's file (8dbb633) with envpool 0.9.0 (the last that keeps gym's old reset and step, which the file"
    " uses; its wheel cut down to the Atari part by gpu_prep.py), gym 0.25.2 (its requirement: gym<0.26),"
    " tensordict 0.13.0 (it names tensordict-nightly; from 0.14 its detached copy of the weights is not detached"
    " and its update fails; installed without its dependencies, so torch stays the machine's), and"
    " benchmarks/peer_stubs/wandb.py for wandb (it calls wandb.init on every run): nothing is sent, each log"
    " call prints a line read here. Its own speed figures (every 10 iterations) are in the .json.",
]


if __name__ == "__main__":
    main()
