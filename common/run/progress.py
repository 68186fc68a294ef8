"""What a run says as it goes: the progress line, the numbers of its summary, and the TensorBoard
writer its numbers go to (mirrored to wandb with --track; ranks other than 0 write nothing)."""

import collections
import dataclasses
import time
from pathlib import Path
from typing import Any


class Progress:
    """SPS, the progress line (every 2 s), and a summary's numbers over a resumed run's parts (`earlier`'s)."""

    def __init__(self, last_step: int, first_step: int, prints: bool, recent: list, earlier: dict):
        self.last_step, self.first_step, self.global_step = last_step, first_step, first_step
        self.prints = prints
        self.recent_returns = collections.deque(recent, maxlen=20)
        self.start = self.last_print = time.time()
        self.first_logged: tuple[int, float] | None = None  # the first iteration's end: where the ETA counts from
        self.earlier_seconds = earlier.get("seconds", 0.0)
        self.segments = earlier.get("segments", 1) + 1 if "seconds" in earlier else 1

    def sps(self, global_step: int) -> int:
        return int((global_step - self.first_step) / max(time.time() - self.start, 1e-9))

    def mean_return(self) -> float | None:
        return sum(self.recent_returns) / len(self.recent_returns) if self.recent_returns else None

    def line(self, global_step: int, timings: dict[str, float]) -> str:
        sps, mean = self.sps(global_step), self.mean_return()
        split = ", ".join(f"{name} {seconds:.2f}s" for name, seconds in timings.items())
        # from the iterations after the first (which pays for start-up): none on the first line
        step, start = self.first_logged or (global_step, time.time())
        eta = ""
        if global_step > step:
            eta = f" ETA={hms((self.last_step - global_step) * (time.time() - start) / (global_step - step))}"
        return (
            f"global_step={global_step}/{self.last_step} SPS={sps} episodic_return="
            f"{'n/a' if mean is None else f'{mean:.1f}'} (last {len(self.recent_returns)}) elapsed="
            f"{hms(time.time() - self.start)}{eta} [{split}]"
        )

    def log(self, writer: Any, global_step: int, episodes: list, restarts: int, timings: dict) -> None:
        """charts/episodic_return and _length, charts/SPS, perf/*_seconds, charts/worker_restarts."""
        self.global_step = global_step
        for step, episodic_return, episodic_length in episodes:
            self.recent_returns.append(float(episodic_return))
            writer.add_scalar("charts/episodic_return", episodic_return, step)
            writer.add_scalar("charts/episodic_length", episodic_length, step)
        writer.add_scalar("charts/SPS", self.sps(global_step), global_step)
        for name, seconds in timings.items():
            writer.add_scalar(f"perf/{name}_seconds", seconds, global_step)
        writer.add_scalar("charts/worker_restarts", restarts, global_step)
        print_now = self.first_logged is None or time.time() - self.last_print >= 2.0
        if self.prints and (print_now or global_step >= self.last_step):
            self.last_print = time.time()
            print(self.line(global_step, timings), flush=True)
        self.first_logged = self.first_logged or (global_step, time.time())

    def summary(self) -> dict[str, Any]:
        seconds = self.earlier_seconds + time.time() - self.start
        done = self.global_step - (0 if self.earlier_seconds else self.first_step)  # the steps of that time
        return {
            "global_step": self.global_step,
            "last_step": self.last_step,
            "seconds": round(seconds, 1),
            "sps": int(done / max(seconds, 1e-9)),
            "segments": self.segments,
            "episodic_return_last_20": self.mean_return(),
            "episodes_in_that_mean": len(self.recent_returns),
        }


def hms(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class NoWriter:
    """What ranks other than 0 log to: nothing."""

    def add_scalar(self, *args: Any, **kwargs: Any) -> None:
        pass

    def close(self) -> None:
        pass


def open_writer(run_dir: Path, args: Any, first_step: int) -> Any:
    """TensorBoard's writer (and wandb with --track); a resumed run's curves go on from `first_step`."""
    if args.track:
        import wandb

        config = dataclasses.asdict(args)
        project, entity = args.wandb_project_name, args.wandb_entity
        wandb.init(project=project, entity=entity, sync_tensorboard=True, config=config, name=run_dir.name)
    from torch.utils.tensorboard import SummaryWriter

    # max_queue: with the default of 10 pending, add_scalar waits for the writer thread
    writer = SummaryWriter(str(run_dir), max_queue=1000, purge_step=first_step + 1 if args.resume else None)
    table = "\n".join(f"|{key}|{value}|" for key, value in vars(args).items())
    writer.add_text("hyperparameters", f"|param|value|\n|-|-|\n{table}")
    return writer
