"""What the gradient all-reduce of ppo_atari_multigpu.py costs per iteration, measured under torchrun.

    torchrun --standalone --nproc_per_node 2 benchmarks/allreduce.py             # gloo on CPU
    torchrun --standalone --nproc_per_node 2 benchmarks/allreduce.py --backend nccl

All-reduces one buffer the size of the Nature CNN's gradients (DDP's buckets carry the same bytes),
`--repeats` times after a warm-up, and prints the median per all-reduce and per iteration
(update_epochs x num_minibatches all-reduces: 16 with the default flags).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import ppo_atari_multigpu  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="gloo")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--per-iteration", type=int, default=16, help="update_epochs x num_minibatches")
    args = parser.parse_args()
    dist.init_process_group(args.backend)
    try:
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if args.backend == "nccl" else torch.device("cpu")
        numel = sum(p.numel() for p in ppo_atari_multigpu.Agent(4).parameters())
        grads = torch.ones(numel, device=device)
        times = []
        for i in range(args.repeats + 3):
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            dist.all_reduce(grads)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if i >= 3:
                times.append(time.perf_counter() - start)
        median = float(np.median(times))
        if dist.get_rank() == 0:
            print(
                f"{args.backend}, {dist.get_world_size()} ranks, {numel * 4 / 1e6:.1f} MB of gradients: "
                f"{median * 1e3:.1f} ms per all-reduce (median of {args.repeats}), "
                f"{median * args.per_iteration:.3f} s per iteration ({args.per_iteration} all-reduces)"
            )
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
