"""A run of several ranks under torchrun, RankedRun: what they decide together. The script starts the
process group itself (dist.init_process_group); the end of RankedRun.start destroys it."""

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist

from ..vecenv import process_control
from . import records
from .cli import CommandLine
from .errors import RunError
from .run import Run
from .stops import Stopped


class LostRank(RuntimeError):
    """A collective of this run failed: another rank is gone (or failed)."""


class RankedRun(Run):
    """Run, as rank `rank` of `world_size` (torchrun's RANK and WORLD_SIZE); plain `python` is one
    rank without a process group. The model and optimizer are rank 0's (DDP keeps them equal);
    generators and envs are every rank's (rank 0 gathers and writes them), and so are the episodes
    and restarts it logs. Its methods that every rank must call, at the same points: make_envs,
    iterations, stop_if_asked, mean_over_ranks, log (each holds a collective)."""

    ENVS_FLAG = "local_num_envs"
    SAVED_ON = (*Run.SAVED_ON, LostRank, dist.DistError)  # DistError: NCCL's, from DDP's backward

    def __init__(self, args: Any, command_line: CommandLine | None, rank: int, world_size: int, local_world_size: int):
        self.rank, self.world_size, self.is_main = rank, world_size, rank == 0
        self.distributed = world_size > 1
        self.cores = max(1, process_control.cores() // local_world_size)  # this rank's share
        super().__init__(args, command_line)
        if self.args.num_threads is None:  # its share of the cores (a resume keeps the count)
            self.args.num_threads = self.cores
        self.keep_next = True  # what the ranks agreed of the next boundary
        # until start: the rendezvous waits for every rank in C++, where no signal reaches Python, and
        # there is nothing to save yet: a stop ends this rank at once
        self.stop.at_once = self.distributed

    @contextlib.contextmanager
    def start(self, device: torch.device, *args: Any) -> Iterator[Any]:
        """Run.start on every rank, after dist.init_process_group: a rank lost on the way is a RunError
        on the others (after rank 0 saved); its end destroys the process group."""
        try:
            self.stop.check()  # (one that came during the rendezvous)
            self.stop.at_once = False
            with super().start(device, *args) as writer:
                yield writer
        except (LostRank, dist.DistError) as exc:
            reason = records.one_line(exc, 300)
            raise RunError(f"lost contact with another rank ({reason}); that rank's own message says why") from None
        finally:
            if self.distributed and dist.is_initialized():
                dist.destroy_process_group()

    def _collective(self, collective: Callable, /, *args: Any, **kwargs: Any) -> Any:
        """collective(*args, **kwargs), a RuntimeError taken for a lost rank (LostRank): gloo
        raises a bare one where a peer is gone, NCCL a DistBackendError. DDP's backward is not
        ours: under gloo, a rank lost there ends in its traceback."""
        try:
            return collective(*args, **kwargs)
        except RuntimeError as exc:
            raise LostRank(records.one_line(exc, 300)) from None

    def _build_envs(self, make_env: Callable, num_envs: int, num_workers: int | None, interrupt: Any, groups: int):
        workers = num_workers if num_workers is not None else self.cores
        # ranks stop together, at stop_if_asked: a stop does not end a wait on the envs mid-step
        envs, _ = super()._build_envs(make_env, num_envs, workers, None if self.distributed else interrupt, groups)
        return envs, self._seeds_note

    def _seeds_note(self, first_seed: int) -> str:
        seeds = self._gather(list(range(first_seed, first_seed + self.envs.num_envs)))
        if not self.distributed:
            return ""
        return f", x {self.world_size} ranks" + ("" if self.args.resume else f", env seeds {seeds}")

    def iterations(self) -> Iterator[int]:
        """Run.iterations, then rank 0 prints the model's checksum on every rank (equal: in step)."""
        yield from super().iterations()
        model = next(obj for obj in self.state.values() if isinstance(obj, torch.nn.Module))
        checksums = self._gather(sum(p.detach().double().sum().item() for p in model.parameters()))
        if self.is_main and self.distributed:
            print(f"final parameter checksum per rank (equal: the ranks stayed in step): {checksums}", flush=True)

    def _boundary(self, done: int) -> None:
        keep = self.keep_next if self.distributed else self._keep_due()  # agreed at stop_if_asked
        if self._due(done) or keep:
            self._keep(done, self._gather(self._rank_state()))

    def stop_if_asked(self) -> None:
        """Stopped if any rank was asked to stop: every rank calls it at the same points, so every
        rank stops there and none waits in a collective for one that left. The ranks also agree here
        whether to keep the next boundary's state (if any rank's rule says so)."""
        if not self.distributed:
            return super().stop_if_asked()
        device = self.device if dist.get_backend() == "nccl" else torch.device("cpu")
        asked = torch.tensor([self.stop.signum or 0, int(self._keep_due())], device=device)
        self._collective(dist.all_reduce, asked, op=dist.ReduceOp.MAX)
        self.keep_next = bool(asked[1].item())
        if asked[0].item():
            raise Stopped(int(asked[0].item()))

    def mean_over_ranks(self, tensor: torch.Tensor) -> torch.Tensor:
        """The mean of `tensor` over all ranks: what every rank must decide alike (the target_kl
        early stop)."""
        if not self.distributed:
            return tensor
        total = tensor.detach().clone()
        self._collective(dist.all_reduce, total)
        return total / self.world_size

    def log(self, global_step: int, episodes: list[tuple], timings: dict[str, float]) -> None:
        """Run.log, of every rank's episodes and restarts (rank 0 logs them)."""
        self._check_weights(global_step)
        all_ranks = self._gather((episodes, self.envs.restarts))
        episodes = [episode for ranks_episodes, _ in all_ranks for episode in ranks_episodes]
        self.progress.log(self.writer, global_step, episodes, sum(r for _, r in all_ranks), timings)

    def _gather(self, obj: Any) -> list:
        """Every rank's `obj`, on rank 0 (which alone logs and saves); [] on the others."""
        if not self.distributed:
            return [obj]
        gathered = [None] * self.world_size if self.is_main else None
        self._collective(dist.gather_object, obj, gathered, dst=0)
        return gathered or []
