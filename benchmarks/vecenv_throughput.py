"""Env-only throughput (env steps/s, random actions) of SubprocVecEnv against its peers, measured
side by side.

    pip install -e ".[bench]"
    # CartPole-v1 and Breakout, N in 1 4 8 16, 5 repetitions
    python benchmarks/vecenv_throughput.py
    # ... and PufferLib, in a venv of its own (made once)
    python benchmarks/vecenv_throughput.py --puffer
    python benchmarks/vecenv_throughput.py --quick         # a smoke run: N=8 only, 2 repetitions

Backends: ours (its default, measured layout; all envs in this process; one worker per core),
gymnasium's SyncVectorEnv and AsyncVectorEnv (shared memory), SB3's SubprocVecEnv, EnvPool and
ale-py's C++ AtariVectorEnv where installed, and with --puffer PufferLib's Multiprocessing backend
(pufferlib-core; the best of 1 and 2 workers). PufferLib pins a CUDA build of torch that its vector
module does not use, so it gets benchmarks/.venv-pufferlib with `pip install --no-deps
pufferlib-core` next to this project; nothing of it is needed elsewhere. Breakout gets the same
DeepMind preprocessing everywhere (ppo_atari_multigpu.make_env for the Python backends; EnvPool and
ale-py set up to do the same work, as benchmarks/peers.py says and tests/test_atari_peers.py
checks). Repetitions run interleaved, A B C A B C ..., so drift on a noisy machine hits every
backend alike; the report gives medians and ratios to SyncVectorEnv at the same N. Writes a markdown
table, a JSON file and a PNG plot into benchmarks/results/.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks import peers  # noqa: E402
from benchmarks.report import CORES, MACHINE, RESULTS, pyplot, save, save_png, venv_python  # noqa: E402
from common.multiprocessing_env import SubprocVecEnv  # noqa: E402
from ppo_atari_multigpu import Args as AtariArgs  # noqa: E402
from ppo_atari_multigpu import make_env as make_atari_env  # noqa: E402

PUFFER_VENV = REPO / "benchmarks" / ".venv-pufferlib"


class Runner:
    """One backend at one N: `step(actions)` advances every env once."""

    def __init__(self, name: str, env, step, close):
        self.name, self.env, self.step, self.close = name, env, step, close


def gym_runner(name, env):
    env.reset(seed=0)
    return Runner(name, env, env.step, env.close)


def env_fns(env_name: str, n: int) -> list:
    if env_name == "CartPole-v1":
        return [lambda: gym.make("CartPole-v1") for _ in range(n)]
    return [make_atari_env(AtariArgs(), i, None) for i in range(n)]


def builders(env_name: str, n: int) -> dict:
    """name -> zero-argument factory of a Runner, for every backend that is installed."""
    fns = env_fns(env_name, n)
    same_step = gym.vector.AutoresetMode.SAME_STEP
    found = {
        "gym Sync": lambda: gym_runner("gym Sync", gym.vector.SyncVectorEnv(fns, autoreset_mode=same_step)),
        "gym Async": lambda: gym_runner(
            "gym Async", gym.vector.AsyncVectorEnv(fns, shared_memory=True, autoreset_mode=same_step)
        ),
        "ours (default)": lambda: gym_runner("ours (default)", SubprocVecEnv(fns)),
        "ours in-process": lambda: gym_runner("ours in-process", SubprocVecEnv(fns, num_workers=0)),
        "ours workers": lambda: gym_runner("ours workers", SubprocVecEnv(fns, num_workers=min(CORES, n))),
    }
    try:
        from stable_baselines3.common.vec_env import SubprocVecEnv as SB3SubprocVecEnv

        def sb3():
            env = SB3SubprocVecEnv(fns)
            env.reset()

            def step(actions):
                env.step_async(actions)
                return env.step_wait()

            return Runner("SB3 Subproc", env, step, env.close)

        found["SB3 Subproc"] = sb3
    except ImportError:
        pass
    if importlib.util.find_spec("envpool"):
        if env_name == "CartPole-v1":
            import envpool

            found["EnvPool"] = lambda: gym_runner("EnvPool", envpool.make_gymnasium("CartPole-v1", num_envs=n))
        else:  # set up as ours, see benchmarks/peers.py (tests/test_atari_peers.py checks it)
            found["EnvPool"] = lambda: gym_runner("EnvPool", peers.envpool_vector(n))
    if env_name != "CartPole-v1":
        found["ale-py Vector"] = lambda: gym_runner("ale-py Vector", peers.ale_vector(n))
    return found


def measure(runner: Runner, actions: np.ndarray, seconds: float) -> float:
    """Steps/s over at least `seconds` (whole passes over the pre-drawn actions)."""
    for a in actions[:20]:
        runner.step(a)
    steps, start = 0, time.perf_counter()
    while True:
        for a in actions:
            runner.step(a)
        steps += actions.shape[0] * actions.shape[1]
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return steps / elapsed


def draw_actions(env_name: str, n: int) -> np.ndarray:
    action_n = 2 if env_name == "CartPole-v1" else 4
    return np.random.default_rng(0).integers(0, action_n, size=(100 if env_name == "CartPole-v1" else 20, n))


# -------------------------------------------------------------------------------------------------------
# PufferLib
def puffer_python() -> str:
    """PufferLib's own venv: this project and pufferlib-core (its torch==2.9.0 pin left out: torch
    is already here)."""
    python, _ = venv_python(PUFFER_VENV, ["-e", str(REPO)], ["--no-deps", "pufferlib-core"], ["psutil"])
    return python


def puffer_measure(env_name: str, n: int, workers: int, seconds: float) -> float:
    """Runs in PufferLib's venv: steps/s of pufferlib.vector.Multiprocessing with `workers`
    busy-waiting workers."""
    import pufferlib.emulation
    import pufferlib.vector

    fns = env_fns(env_name, n)
    creators = [functools.partial(pufferlib.emulation.GymnasiumPufferEnv, env_creator=fn) for fn in fns]
    vecenv = pufferlib.vector.make(
        creators,
        env_args=[[]] * n,
        env_kwargs=[{}] * n,
        num_envs=n,
        num_workers=workers,
        batch_size=n,
        overwork=True,
        backend=pufferlib.vector.Multiprocessing,
    )
    vecenv.async_reset(0)
    vecenv.recv()

    def step(actions):
        vecenv.send(actions)
        return vecenv.recv()

    try:
        return measure(Runner("PufferLib", vecenv, step, vecenv.close), draw_actions(env_name, n), seconds)
    finally:
        vecenv.close()


def puffer_runs(env_name: str, n: int, seconds: float) -> float:
    """PufferLib's best of 1 and 2 workers (the worker count must divide N), each in a fresh process."""
    best = 0.0
    for workers in sorted({w for w in (1, 2) if n % w == 0}):
        cmd = [puffer_python(), __file__, "--puffer-child", env_name, str(n), str(workers), str(seconds)]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if out.returncode:
            print(f"PufferLib {env_name} N={n} workers={workers} failed:\n{out.stderr[-2000:]}", flush=True)
            continue
        best = max(best, json.loads(out.stdout.splitlines()[-1]))
    return best


# ------------------------------------------------------------------------------------------------------------
# main
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--envs", nargs="+", default=["CartPole-v1", "Breakout"])
    parser.add_argument("--num-envs", nargs="+", type=int, default=[1, 4, 8, 16])
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=1.0, help="minimum length of one measurement")
    parser.add_argument("--puffer", action="store_true", help="also PufferLib, from benchmarks/.venv-pufferlib")
    parser.add_argument("--quick", action="store_true", help="N=8 only, 2 repetitions")
    parser.add_argument("--replot", action="store_true", help="redraw the PNG from the last JSON, measure nothing")
    parser.add_argument("--puffer-child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.puffer_child:
        env_name, n, workers, seconds = args.puffer_child
        print(json.dumps(puffer_measure(env_name, int(n), int(workers), float(seconds))))
        return
    if args.replot:
        saved = json.loads((RESULTS / "vecenv_throughput.json").read_text())
        plt = pyplot()
        if plt is not None:
            plot(plt, saved["results"], saved["machine"])
        return
    if args.quick:
        args.num_envs, args.repetitions = [8], 2

    results, layouts = [], {}  # results: dicts of env, n, backend, samples (steps/s)
    for env_name in args.envs:
        for n in args.num_envs:
            runners = {name: build() for name, build in builders(env_name, n).items()}
            layouts[f"{env_name}, N={n}"] = runners["ours (default)"].env.layout
            actions = draw_actions(env_name, n)
            samples = {name: [] for name in [*runners, *(["PufferLib"] if args.puffer else [])]}
            for rep in range(args.repetitions):
                order = list(samples) if rep % 2 == 0 else list(reversed(samples))  # A B C, then C B A
                for name in order:
                    if name == "PufferLib":
                        samples[name].append(puffer_runs(env_name, n, args.seconds))
                    else:
                        samples[name].append(measure(runners[name], actions, args.seconds))
            for runner in runners.values():
                runner.close()
            sync = float(np.median(samples["gym Sync"]))
            for name, values in samples.items():
                median = float(np.median(values))
                results.append(
                    dict(env=env_name, n=n, backend=name, median=median, ratio=median / sync, samples=values)
                )
                print(
                    f"{env_name:12s} N={n:<3d} {name:18s} {median:10.0f} steps/s  {median / sync:5.2f}x Sync",
                    flush=True,
                )
    write_report(results, layouts, args)


def write_report(results, layouts, args) -> None:
    backends = list(dict.fromkeys(r["backend"] for r in results))
    lines = [
        f"Env steps/s with random actions (median of {args.repetitions} interleaved repetitions), and the ratio",
        f"to gymnasium's SyncVectorEnv at the same N. Machine: {MACHINE}.",
        f"Command: `python benchmarks/vecenv_throughput.py{' --puffer' if args.puffer else ''}`.",
        "ours (default): the layout SubprocVecEnv measures and picks (below); in-process: every env in the",
        f"calling process; workers: one worker per core ({CORES}). PufferLib: Multiprocessing, best of 1 and 2",
        "workers.",
        "",
        "| env | N | " + " | ".join(backends) + " |",
        "|---|---|" + "---|" * len(backends),
    ]
    for env_name, n in dict.fromkeys((r["env"], r["n"]) for r in results):
        row = {r["backend"]: r for r in results if r["env"] == env_name and r["n"] == n}
        cells = [f"{row[b]['median'] / 1000:.2f}k ({row[b]['ratio']:.2f}x)" if b in row else "-" for b in backends]
        lines.append(f"| {env_name} | {n} | " + " | ".join(cells) + " |")
    lines += ["", "The layout ours (default) picked, with what it measured:", ""]
    lines += [f"- {key}: {layout}" for key, layout in layouts.items()]
    plt = save("vecenv_throughput", lines, {"results": results, "layouts": layouts})
    if plt is not None:
        plot(plt, results, MACHINE)


def plot(plt, results, machine) -> None:
    backends = list(dict.fromkeys(r["backend"] for r in results))
    envs = list(dict.fromkeys(r["env"] for r in results))
    fig, axes = plt.subplots(1, len(envs), figsize=(6 * len(envs), 4.5), squeeze=False)
    colors = dict(zip(backends, plt.get_cmap("tab10" if len(backends) <= 10 else "tab20").colors, strict=False))
    for ax, env_name in zip(axes[0], envs, strict=True):
        for backend in backends:
            points = sorted((r["n"], r["median"]) for r in results if r["env"] == env_name and r["backend"] == backend)
            if points:
                style = "-o" if backend.startswith("ours") else "--s"
                ax.plot(*zip(*points, strict=True), style, label=backend, color=colors[backend])
        ax.set(title=env_name, xlabel="number of envs N", ylabel="env steps/s", xscale="log", yscale="log")
        ax.set_xticks(sorted({r["n"] for r in results}), labels=[str(n) for n in sorted({r["n"] for r in results})])
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"Vector env throughput, {machine}")
    fig.tight_layout()
    save_png(fig, RESULTS / "vecenv_throughput.png")


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
