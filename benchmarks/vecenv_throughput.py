"""Env-only throughput (env steps/s, random actions) of SubprocVecEnv against its peers, measured side by side.

    pip install -e ".[bench]"
    python benchmarks/vecenv_throughput.py                 # CartPole-v1 and Breakout, N in 1 4 8 16, 5 repetitions
    python benchmarks/vecenv_throughput.py --quick         # a smoke run: N=8 only, 2 repetitions

Backends: ours (several worker layouts, shared memory on and off), gymnasium SyncVectorEnv and AsyncVectorEnv
(shared memory), SB3 SubprocVecEnv, EnvPool and ale-py's C++ AtariVectorEnv where installed. Breakout gets the
same DeepMind preprocessing everywhere (ppo_atari_multigpu.make_env for the Python backends, the equivalent
options for EnvPool and ale-py). Repetitions run interleaved, A B C A B C ..., so drift on a noisy machine hits
every backend alike; the report gives medians and ratios to SyncVectorEnv at the same N. Writes a markdown table,
a JSON file and a PNG plot into benchmarks/results/.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.report import CORES, MACHINE, RESULTS, pyplot, save  # noqa: E402
from common.multiprocessing_env import SubprocVecEnv  # noqa: E402
from ppo_atari_multigpu import make_env as make_atari_env  # noqa: E402


class Runner:
    """One backend at one N: `step(actions)` advances every env once."""

    def __init__(self, name: str, env, step, close):
        self.name, self.env, self.step, self.close = name, env, step, close


def gym_runner(name, env):
    env.reset(seed=0)
    return Runner(name, env, env.step, env.close)


def builders(env_name: str, n: int) -> dict:
    """name -> zero-argument factory of a Runner, for every backend that is installed."""
    if env_name == "CartPole-v1":
        env_fns = [lambda: gym.make("CartPole-v1") for _ in range(n)]
    else:
        env_fns = [make_atari_env("BreakoutNoFrameskip-v4", i, False, "") for i in range(n)]
    same_step = gym.vector.AutoresetMode.SAME_STEP
    found = {
        "gym Sync": lambda: gym_runner("gym Sync", gym.vector.SyncVectorEnv(env_fns, autoreset_mode=same_step)),
        "gym Async": lambda: gym_runner(
            "gym Async", gym.vector.AsyncVectorEnv(env_fns, shared_memory=True, autoreset_mode=same_step)
        ),
    }
    # Layouts named the same at every N: default (one worker per core), all envs in one worker, one env per worker.
    default = -(-n // min(n, CORES))
    layouts = {"ours (default)": None, "ours 1 worker": n, "ours 1 env/worker": 1}
    seen = set()
    for label, per_worker in layouts.items():
        if (per_worker or default) not in seen:
            seen.add(per_worker or default)
            found[label] = lambda k=per_worker, lb=label: gym_runner(lb, SubprocVecEnv(env_fns, envs_per_worker=k))
    found["ours no-shm"] = lambda: gym_runner("ours no-shm", SubprocVecEnv(env_fns, shared_memory=False))
    try:
        from stable_baselines3.common.vec_env import SubprocVecEnv as SB3SubprocVecEnv

        def sb3():
            env = SB3SubprocVecEnv(env_fns)
            env.reset()

            def step(actions):
                env.step_async(actions)
                return env.step_wait()

            return Runner("SB3 Subproc", env, step, env.close)

        found["SB3 Subproc"] = sb3
    except ImportError:
        pass
    try:
        import envpool

        if env_name == "CartPole-v1":
            kwargs = {}
        else:
            kwargs = dict(episodic_life=True, reward_clip=True, noop_max=30, repeat_action_probability=0.0)
        task = "CartPole-v1" if env_name == "CartPole-v1" else "Breakout-v5"
        found["EnvPool"] = lambda: gym_runner("EnvPool", envpool.make(task, env_type="gymnasium", num_envs=n, **kwargs))
    except ImportError:
        pass
    if env_name != "CartPole-v1":
        try:
            from ale_py import AtariVectorEnv

            found["ale-py Vector"] = lambda: gym_runner(
                "ale-py Vector",
                AtariVectorEnv("breakout", n, episodic_life=True, repeat_action_probability=0.0, noop_max=30),
            )
        except ImportError:
            pass
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


def peak_rss_mb(pids) -> list[float]:
    out = []
    for pid in pids:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                out.append(int(line.split()[1]) / 1024)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--envs", nargs="+", default=["CartPole-v1", "Breakout"])
    parser.add_argument("--num-envs", nargs="+", type=int, default=[1, 4, 8, 16])
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=1.0, help="minimum length of one measurement")
    parser.add_argument("--quick", action="store_true", help="N=8 only, 2 repetitions")
    parser.add_argument("--replot", action="store_true", help="redraw the PNG from the last JSON, measure nothing")
    args = parser.parse_args()
    if args.replot:
        saved = json.loads((RESULTS / "vecenv_throughput.json").read_text())
        plt = pyplot()
        if plt is not None:
            plot(plt, saved["results"], saved["machine"])
        return
    if args.quick:
        args.num_envs, args.repetitions = [8], 2

    results = []  # dicts: env, n, backend, samples (steps/s)
    rss = {}
    for env_name in args.envs:
        for n in args.num_envs:
            runners = {}
            for name, build in builders(env_name, n).items():
                runners[name] = build()
            rng = np.random.default_rng(0)
            action_n = runners["gym Sync"].env.single_action_space.n
            actions = rng.integers(0, action_n, size=(100 if env_name == "CartPole-v1" else 20, n))
            samples = {name: [] for name in runners}
            for rep in range(args.repetitions):
                order = list(runners) if rep % 2 == 0 else list(reversed(runners))  # A B C, then C B A
                for name in order:
                    samples[name].append(measure(runners[name], actions, args.seconds))
            for name, runner in runners.items():
                if isinstance(runner.env, SubprocVecEnv):
                    rss[f"{env_name} N={n} {name}"] = peak_rss_mb(runner.env.worker_pids)
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
    write_report(results, rss, args)


def write_report(results, rss, args) -> None:
    machine = MACHINE
    backends = list(dict.fromkeys(r["backend"] for r in results))
    lines = [
        f"Env steps/s with random actions (median of {args.repetitions} interleaved repetitions), and the ratio",
        f"to gymnasium's SyncVectorEnv at the same N. Machine: {machine}.",
        "Command: `python benchmarks/vecenv_throughput.py`.",
        "ours (default): one worker per core; 1 worker: all envs in one worker process; 1 env/worker: a process each;",
        "no-shm: default layout with observations pickled over the pipe. '-': the layout equals the default there.",
        "",
        "| env | N | " + " | ".join(backends) + " |",
        "|---|---|" + "---|" * len(backends),
    ]
    for env_name, n in dict.fromkeys((r["env"], r["n"]) for r in results):
        row = {r["backend"]: r for r in results if r["env"] == env_name and r["n"] == n}
        cells = [f"{row[b]['median'] / 1000:.1f}k ({row[b]['ratio']:.2f}x)" if b in row else "-" for b in backends]
        lines.append(f"| {env_name} | {n} | " + " | ".join(cells) + " |")
    lines += ["", "Peak RSS per SubprocVecEnv worker (MiB): " + "; ".join(f"{k}: {max(v):.0f}" for k, v in rss.items())]
    plt = save("vecenv_throughput", lines, {"results": results})
    if plt is not None:
        plot(plt, results, machine)


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
    fig.savefig(RESULTS / "vecenv_throughput.png", dpi=110)


if __name__ == "__main__":
    main()
