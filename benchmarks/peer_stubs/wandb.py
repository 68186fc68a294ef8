"""A stand-in for wandb, for a peer that calls it on every run (LeanRL's Atari script calls wandb.init
and wandb.log unconditionally): nothing is sent or written; each log call prints one line,
`wandb.log <unix time> <json>`, which benchmarks/gpu_side_by_side.py reads (the time is taken after the
values are read, so the GPU work behind them is done)."""

import json
import time


def init(*args, **kwargs):
    return None


def log(data, step=None, **kwargs):
    values = {name: float(value) for name, value in data.items()}
    print(f"wandb.log {time.time():.6f} {json.dumps({'step': step, **values})}", flush=True)
