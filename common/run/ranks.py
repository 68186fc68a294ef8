"""A run of several ranks under torchrun: what they decide together. RankedRun is Run with a process
group, a stop agreed by all, every rank's generators and envs kept at each boundary (rank 0 writes
them), and episodes, restarts and losses gathered over ranks."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from . import records, stops
from .errors import RunError
from .run import Run
from .stops import Stopped


class RankedRun(Run):
    """Run, as one of `world_size` ranks (torchrun's RANK and WORLD_SIZE); plain `python` is one
    rank without a process group. The model and optimizer are rank 0's (DDP keeps them equal);
    generators and envs are every rank's."""

    def __init__(self, args: Any, rank: int, world_size: int, local_world_size: int):
        super().__init__(args, rank, world_size, local_world_size)
        self.distributed = world_size > 1
        self.keep_next = True  # what the ranks agreed of the next boundary

    @contextlib.contextmanager
    def start(self, device: torch.device, *args: Any) -> Iterator[Any]:
        """Run.start inside torch.distributed's process group (nccl on CUDA, gloo on CPU, or --backend)."""
        if self.distributed:
            # the rendezvous waits for every rank in C++: a stop ends this rank at once
            stops.request.at_once = True
            try:
                stops.request.check()  # (one the thread saw just before)
                dist.init_process_group(backend=self.args.backend or ("nccl" if device.type == "cuda" else "gloo"))
            finally:
                stops.request.at_once = False
        try:
            with super().start(device, *args) as writer:
                yield writer
        except Exception as exc:
            if not self.lost_rank(exc):  # (asked before the group is gone)
                raise
            reason = records.one_line(exc, 300)
            raise RunError(f"lost contact with another rank ({reason}); that rank's own message says why") from None
        finally:
            if self.distributed:
                dist.destroy_process_group()

    def iterations(self) -> Iterator[int]:
        yield from super().iterations()
        model = next(obj for obj in self.state.values() if isinstance(obj, torch.nn.Module))
        checksums = self._gather(sum(p.detach().double().sum().item() for p in model.parameters()))
        if self.is_main and self.distributed:
            print(f"final parameter checksum per rank (equal: the ranks stayed in step): {checksums}", flush=True)

    def stop_requested(self) -> bool:
        return stops.request.signum is not None

    def stop_if_asked(self) -> None:
        """Stopped if any rank was asked to stop: every rank calls it at the same points, so every
        rank stops there and none waits in a collective for one that left. The ranks also agree here
        whether to keep the next boundary's state (if any rank's rule says so)."""
        asked = torch.tensor([stops.request.signum or 0, int(Run._keep(self))], device=self._collective_device())
        if self.distributed:
            dist.all_reduce(asked, op=dist.ReduceOp.MAX)
        self.keep_next = bool(asked[1].item())
        if asked[0].item():
            raise Stopped(int(asked[0].item()))

    def _keep(self) -> bool:
        return self.keep_next if self.distributed else Run._keep(self)

    def mean_over_ranks(self, tensor: torch.Tensor) -> torch.Tensor:
        """The mean of `tensor` over all ranks: what every rank must decide alike (the target_kl
        early stop)."""
        if not self.distributed:
            return tensor
        total = tensor.detach().clone()
        dist.all_reduce(total)
        return total / self.world_size

    def _collective_device(self) -> torch.device:
        return self.device if self.distributed and dist.get_backend() == "nccl" else torch.device("cpu")

    def _num_workers(self) -> int | None:
        return self.args.num_workers if self.args.num_workers is not None else self.cores

    def _interrupt(self) -> Any:
        # ranks stop together, at stop_if_asked: not mid-step
        return None if self.distributed else stops.request

    def _gather(self, obj: Any) -> list:
        """Every rank's `obj`, on rank 0 (which alone logs and saves); [] on the others."""
        if not self.distributed:
            return [obj]
        gathered = [None] * self.world_size if self.is_main else None
        dist.gather_object(obj, gathered, dst=0)
        return gathered or []

    def _gather_episodes(self, episodes: list, restarts: int) -> tuple[list, int]:
        all_ranks = self._gather((episodes, restarts))
        return [episode for e, _ in all_ranks for episode in e], sum(r for _, r in all_ranks)

    def _ranks_note(self, first_seed: int) -> str:
        seeds = self._gather(list(range(first_seed, first_seed + self.envs.num_envs)))
        if not self.distributed:
            return ""
        return f", x {self.world_size} ranks" + ("" if self.args.resume else f", env seeds {seeds}")

    @staticmethod
    def lost_rank(exc: BaseException) -> bool:
        """True for the error a collective raises when another rank is gone (in gloo's or NCCL's words)."""
        if not (dist.is_available() and dist.is_initialized()):
            return False
        text = str(exc).lower()
        return isinstance(exc, dist.DistError) or any(
            s in text for s in ("connection closed by peer", "connection reset by peer", "broken pipe", "nccl")
        )
