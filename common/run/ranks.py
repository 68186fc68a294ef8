"""What ranks under torchrun decide together: the process group, values gathered or averaged over all ranks, a stop
agreed by all, and the checks every rank makes alike."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
import torch.distributed

from common.run import stops
from common.run.errors import RunError


@contextlib.contextmanager
def process_group(backend: str, enabled: bool) -> Iterator[None]:
    """torch.distributed's process group for the block (rank and world size from torchrun's variables), if enabled."""
    if not enabled:
        yield
        return
    with stops.request.at_once():  # the rendezvous waits for every rank, in C++: a stop then ends the rank at once
        torch.distributed.init_process_group(backend=backend)
    try:
        yield
    finally:
        torch.distributed.destroy_process_group()


def all_ranks(obj: Any) -> list:
    """obj from every rank, in rank order (a list of one without a process group)."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return [obj]
    gathered = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(gathered, obj)
    return gathered


def mean_over_ranks(tensor: torch.Tensor) -> torch.Tensor:
    """The mean of `tensor` over all ranks (itself without a process group): what every rank must decide on alike."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return tensor
    total = tensor.detach().clone()
    torch.distributed.all_reduce(total)
    return total / torch.distributed.get_world_size()


def max_over_ranks(value: int) -> int:
    """The largest of `value` over all ranks (itself without a process group)."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return value
    on_gpu = torch.distributed.get_backend() == "nccl"
    tensor = torch.tensor([value], device=torch.device("cuda", torch.cuda.current_device()) if on_gpu else "cpu")
    torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.MAX)
    return int(tensor.item())


def mean_losses(stats: dict[str, list[torch.Tensor]]) -> dict[str, float]:
    """{name: mean over the update's minibatches and over ranks} from {name: one value per minibatch}."""
    means = mean_over_ranks(torch.stack([torch.stack(values).mean() for values in stats.values()]))
    return dict(zip(stats, means.tolist(), strict=True))


def check_finite(losses: dict[str, float], module: torch.nn.Module, where: str) -> None:
    """RunError unless every loss and every weight of module is finite (where: which iteration, for the message)."""
    if not (np.isfinite(list(losses.values())).all() and all(p.isfinite().all() for p in module.parameters())):
        raise RunError(f"{where}: the loss or the weights became NaN/Inf; look for NaN/Inf in observations or "
                       "rewards, or lower --learning-rate")  # fmt: skip


def lost_rank(exc: BaseException) -> bool:
    """True for the error a collective raises when another rank is gone (gloo and NCCL say so in their own words)."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return False
    text = str(exc).lower()
    return isinstance(exc, torch.distributed.DistError) or any(
        s in text for s in ("connection closed by peer", "connection reset by peer", "broken pipe", "nccl")
    )
