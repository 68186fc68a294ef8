"""What ppo_atari_multigpu.py should do on GPUs: a model of its SPS on 1, 2 and 8 GPUs and on 4
nodes x 8 GPUs.

    python benchmarks/scaling_model.py                    # the model from its stated parameters
    # measure this machine's parts first (about a minute)
    python benchmarks/scaling_model.py --measure
    python benchmarks/scaling_model.py --measure --device cuda   # what benchmarks/gpu_check.sh runs

A PREDICTION, not a measurement. One iteration of a rank (the script is synchronous: rollout, then
update) takes

    num_steps x (env step of its local_num_envs + inference) + update + all-reduces,

and the job's SPS is ranks x local_num_envs x num_steps / that. The env step: the rank's envs are
spread over min(envs, cores per GPU - 1) workers (the trainer keeps a core), each stepping its share
one after another at the per-core rate of our Atari pipeline, plus SubprocVecEnv's round trip. The
all-reduces: update_epochs x num_minibatches per iteration, each of the Nature CNN's gradient,
costed as a ring (2 (p-1)/p x bytes / bus bandwidth + 2 (p-1) x latency), with no overlap with the
backward pass (DDP overlaps some: the model errs slow). Every number is a named parameter below with
where it comes from; `--measure` replaces those marked "measured" with this machine's own figures
(on --device cuda the inference and update are the GPU's).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, fields
from pathlib import Path

import gymnasium as gym
import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def param(default, source: str):
    return field(default=default, metadata={"source": source})


@dataclass
class Parameters:
    ale_steps_per_core: float = param(2100.0, "measured (--measure): one Breakout of make_env, random actions")
    roundtrip_seconds: float = param(150e-6, "measured (--measure): SubprocVecEnv step of do-nothing 4x84x84 envs")
    inference_seconds: float = param(
        0.6e-3, "per rollout step on a GPU; ASSUMED: launch-bound CNN forward of 8 stacks, ~20 kernels + 2 copies"
    )
    update_seconds: float = param(
        0.10, "per iteration on a GPU; ASSUMED: 16 minibatches of 256 at ~6 ms (forward, backward, Adam)"
    )
    gradient_bytes: float = param(4 * 1_686_693, "counted: the Nature CNN's parameters (4 actions), float32")
    allreduces: int = param(16, "per iteration: update_epochs 4 x num_minibatches 4, the script's defaults")
    nvlink_busbw: float = param(100e9, "bytes/s in a node; ASSUMED: NVLink nccl-tests bus bandwidth at ~7 MB")
    network_busbw: float = param(12e9, "bytes/s across nodes; ASSUMED: one 100 Gb/s NIC per node")
    latency_seconds: float = param(20e-6, "per ring step; ASSUMED: NCCL small-message latency")
    cores_per_gpu: int = param(12, "ASSUMED: 96 vCPUs for 8 GPUs (AWS p4d.24xlarge; a DGX H100 has 224 threads)")
    local_num_envs: int = param(8, "the script's default")
    num_steps: int = param(128, "the script's default")


MEASURED = ("ale_steps_per_core", "roundtrip_seconds", "inference_seconds", "update_seconds")


def allreduce_seconds(p: Parameters, ranks: int, nodes: int) -> float:
    if ranks == 1:
        return 0.0
    busbw = p.nvlink_busbw if nodes == 1 else p.network_busbw
    one = 2 * (ranks - 1) / ranks * p.gradient_bytes / busbw + 2 * (ranks - 1) * p.latency_seconds
    return p.allreduces * one


def iteration(p: Parameters, ranks: int = 1, nodes: int = 1, cores: int | None = None) -> dict[str, float]:
    """Seconds per iteration of one rank, by part."""
    cores = p.cores_per_gpu if cores is None else cores
    workers = max(1, min(p.local_num_envs, cores - 1))
    env_step = math.ceil(p.local_num_envs / workers) / p.ale_steps_per_core + p.roundtrip_seconds
    return {
        "env": p.num_steps * env_step,
        "inference": p.num_steps * p.inference_seconds,
        "update": p.update_seconds,
        "all-reduce": allreduce_seconds(p, ranks, nodes),
    }


def predict(p: Parameters) -> list[dict]:
    rows = []
    for label, ranks, nodes in (
        ("1 GPU", 1, 1),
        ("2 GPUs, one node", 2, 1),
        ("8 GPUs, one node", 8, 1),
        ("4 nodes x 8 GPUs", 32, 4),
    ):
        parts = iteration(p, ranks, nodes)
        sps = ranks * p.local_num_envs * p.num_steps / sum(parts.values())
        rows.append({"label": label, "ranks": ranks, "parts": parts, "sps": sps})
    for row in rows:
        row["speedup"] = row["sps"] / rows[0]["sps"]
        row["efficiency"] = row["speedup"] / row["ranks"]
    return rows


class Blank(gym.Env):
    """A do-nothing env with Breakout's observation (4x84x84 uint8): what SubprocVecEnv alone
    costs per step."""

    observation_space = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    action_space = gym.spaces.Discrete(4)
    frame = np.zeros((4, 84, 84), np.uint8)

    def reset(self, *, seed=None, options=None):
        return self.frame, {}

    def step(self, action):
        return self.frame, 0.0, False, False, {}


def timed_rate(step, seconds: float) -> float:
    """Calls per second of step(), median of 3 stretches of `seconds`."""
    rates = []
    for _ in range(3):
        count, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            step()
            count += 1
        rates.append(count / (time.perf_counter() - start))
    return statistics.median(rates)


def measure(p: Parameters, device: str, iterations: int) -> dict[str, float]:
    """This machine's figures for the MEASURED parameters, and the run the inference and update come from."""
    from common.multiprocessing_env import SubprocVecEnv
    from common.sweep.report import read_scalars
    from ppo_atari_multigpu import Args, make_env

    env = make_env(Args(), 0, None)()
    env.reset(seed=0)
    rng = np.random.default_rng(0)

    def one_step():
        if any(env.step(int(rng.integers(4)))[2:4]):
            env.reset()

    found = {"ale_steps_per_core": timed_rate(one_step, 2.0)}
    env.close()
    workers = max(1, min(p.local_num_envs, os.cpu_count() or 1))
    with SubprocVecEnv([Blank] * p.local_num_envs, num_workers=workers) as envs:
        envs.reset(seed=0)
        actions = np.zeros(p.local_num_envs, np.int64)
        found["roundtrip_seconds"] = 1.0 / timed_rate(lambda: envs.step(actions), 1.0)

    with tempfile.TemporaryDirectory() as cwd:
        batch = p.local_num_envs * p.num_steps
        cmd = [sys.executable, str(REPO / "ppo_atari_multigpu.py"), "--total-timesteps", str(batch * iterations)]
        cmd += ["--local-num-envs", str(p.local_num_envs), "--num-steps", str(p.num_steps)]
        cmd += [] if device == "cuda" else ["--no-cuda"]
        subprocess.run(cmd, cwd=cwd, check=True, stdout=subprocess.DEVNULL, timeout=900)
        scalars = read_scalars(next((Path(cwd) / "runs").iterdir()))
    part = {name: [v for _, v in scalars[f"perf/{name}_seconds"]][1:] for name in ("env", "inference", "update")}
    found["inference_seconds"] = statistics.median(part["inference"]) / p.num_steps
    found["update_seconds"] = statistics.median(part["update"])
    found["run_env_seconds"] = statistics.median(part["env"])  # what the model's env part is checked against
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--measure", action="store_true", help="replace the measured parameters by this machine's")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where --measure runs the agent")
    parser.add_argument("--iterations", type=int, default=6, help="of the measuring run (the first is not counted)")
    for f in fields(Parameters):
        parser.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=f.default)
    args = parser.parse_args()
    p = Parameters(**{f.name: getattr(args, f.name) for f in fields(Parameters)})
    source = {f.name: f.metadata["source"] for f in fields(Parameters)}
    if args.measure:
        found = measure(p, args.device, args.iterations)
        used = MEASURED if args.device == "cuda" else MEASURED[:2]  # a CPU's update says nothing of a GPU's
        for name in used:
            setattr(p, name, found[name])
            source[name] = f"measured here ({args.device}, {os.cpu_count()} cores)"
        here = iteration(p, cores=os.cpu_count() or 1)["env"]
        unused = "" if args.device == "cuda" else " (not used: the model is for GPUs)"
        print(
            f"this machine ({os.cpu_count()} cores, agent on {args.device}): inference "
            f"{found['inference_seconds']:.4f} s per step, update {found['update_seconds']:.3f} s "
            f"an iteration{unused};"
            f" the model's env part {here:.3f} s per iteration, the measuring run's "
            f"{found['run_env_seconds']:.3f} s"
        )

    print("parameters:")
    for f in fields(Parameters):
        print(f"  {f.name} = {getattr(p, f.name):.4g}  ({source[f.name]})")
    print(f"\nPREDICTED SPS of ppo_atari_multigpu.py, {p.cores_per_gpu} cores per GPU (a model, not a measurement):\n")
    print("| GPUs | env s | inference s | update s | all-reduce s | SPS | speedup | efficiency |")
    print("|---|---|---|---|---|---|---|---|")
    for row in predict(p):
        parts = row["parts"]
        print(
            f"| {row['label']} | {parts['env']:.3f} | {parts['inference']:.3f} | {parts['update']:.3f} | "
            f"{parts['all-reduce']:.4f} | {row['sps']:,.0f} | {row['speedup']:.1f}x | "
            f"{row['efficiency']:.0%} |"
        )


if __name__ == "__main__":
    main()
