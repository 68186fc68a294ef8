"""A run of a training script, as its `main` sees it: one object that owns the flags (a resume's and an evaluation's
come from the checkpoint), the env probed once, the run folder and its writer, the envs, the state at each iteration
boundary, the checkpoints written from it, the stop's safe points, and the one place a run ends, however it ends.

    def main(args):
        run = Run(args)                                     # flags checked, exit 2 on a bad one
        obs_space, action_space = run.probe(make_env)       # one env built in a probe process
        ...                                                 # agent, optimizer, generator
        with run.start(device, num_iterations, batch_size, model=agent, optimizer=optimizer, rng=rng) as writer:
            envs, next_obs = run.make_envs([make_env(run.args, i, run.dir) for i in range(num_envs)])
            for iteration in run.iterations():              # the state kept at each boundary, checkpoints written
                ...                                         # run.stop_if_asked() between minibatches
                run.log(global_step, episodes, timings)

    if __name__ == "__main__":
        Run.cli(main, Args, __doc__)

Exit statuses of `cli`: 0 done; 1 a failure during the run (one line; a bug keeps its traceback); 2 a bad flag or file,
before anything started; 128 + signal (130 SIGINT, 143 SIGTERM) when stopped, after saving.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import dataclasses
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..multiprocessing_env import SubprocVecEnv, WorkerError
from ..vecenv import process_control
from . import flags, records, stops
from .errors import Finished, FlagError, RunError
from .stops import Stopped

_closing_lines: list[tuple[str, bool]] = []  # the closing line a run composed, and whether it goes to stderr


class Run:
    """One run: new, or the one --resume names, or the checkpoint --eval-checkpoint evaluates. `args` holds the flags
    it runs with; `dir` its folder (None on ranks other than 0 and before `start`)."""

    def __init__(self, args: Any, rank: int = 0, world_size: int = 1, local_world_size: int = 1):
        self.script = Path(sys.modules[type(args).__module__].__file__).name
        self.rank, self.world_size, self.is_main = rank, world_size, rank == 0
        self.cores = max(1, process_control.cores() // local_world_size)  # this rank's share
        self.args, self.checkpoint = self._flags(args)
        envs_field = "local_num_envs" if hasattr(args, "local_num_envs") else "num_envs"
        flags.check(self.args, flags.batch_rules(self.args, envs_field, world_size))
        flags.check_env_id(self.args.env_id)  # imports the module of a module:EnvId id
        self.dir: Path | None = None
        self.device: torch.device | None = None
        self.make_env: Callable | None = None
        self.probed: dict[str, Any] = {}
        self.envs: SubprocVecEnv | None = None
        self.writer: Any = None
        self.progress: Progress | None = None
        self.state: dict[str, Any] = {}  # what a checkpoint holds: state dicts, and one generator state per rank
        self.num_iterations = self.steps = 0
        self.start_iteration = 1
        self.last: dict | None = None  # the state at the last iteration boundary: what any save writes
        self.written: dict | None = None  # the snapshot checkpoint.pt holds
        self.on_disk: int | None = None  # the iteration of checkpoint.pt, as this run wrote or read it

    def _flags(self, args: Any) -> tuple[Any, dict | None]:
        """The flags to run with: the command line's, or with --resume the checkpoint's (the command line may change
        only flags that change nothing learned, and --total-timesteps), or with --eval-checkpoint the checkpoint's
        (the command line's for those that change nothing learned)."""
        if args.resume is not None and args.eval_checkpoint is not None:
            raise FlagError("--resume trains a run on, --eval-checkpoint evaluates one: give one of them")
        path = args.resume or args.eval_checkpoint
        if path is None:
            return args, None
        flag_name = "--resume" if args.resume is not None else "--eval-checkpoint"
        checkpoint = records.load_checkpoint(path, flag_name, self.script)
        fields = [f.name for f in dataclasses.fields(args)]
        saved = type(args)(**{k: v for k, v in checkpoint["args"].items() if k in fields})  # older flags dropped
        given_fields = records.given_fields(type(args))
        given = {name: getattr(args, name) for name in fields if name in given_fields}
        if args.eval_checkpoint is not None:
            if "env_id" in given and args.env_id != saved.env_id:
                raise FlagError(
                    f"--eval-checkpoint {path} holds a policy for {saved.env_id}, not --env-id "
                    f"{args.env_id}: drop --env-id (the policy is evaluated on {saved.env_id})"
                )
            if args.eval_episodes < 1:
                raise FlagError(f"--eval-episodes must be >= 1 with --eval-checkpoint, got {args.eval_episodes}")
            return dataclasses.replace(
                saved, **{k: getattr(args, k) for k in records.TOLERATED & set(fields)}
            ), checkpoint
        kept = records.differing(given, dataclasses.asdict(saved))
        if kept:
            listed = ", ".join(f"{records.flag(name)} {before} (not {after})" for name, (after, before) in kept.items())
            raise FlagError(f"--resume {path} continues a run trained with {listed}: a run's results come from one set "
                            "of flags; drop those flags, or start a new run")  # fmt: skip
        return dataclasses.replace(saved, **given | {"resume": path}), checkpoint

    def probe(self, make_env: Callable) -> tuple[Any, Any]:
        """Builds env 0 of make_env(args, idx, run_dir) once in a probe process (no env code runs here; it is reset and
        stepped, and timed if it is one of gymnasium's own): the env's observation and action spaces. The same
        answer decides where the envs step (make_envs). FlagError naming --env-id if it cannot be built."""
        self.make_env = make_env
        env_fn = make_env(dataclasses.replace(self.args, capture_video=False), 0, None)
        self.probed = flags.probe_env(self.args.env_id, env_fn, self.args.step_timeout or 600.0)
        return self.probed["spaces"]

    @contextlib.contextmanager
    def start(self, device: torch.device, num_iterations: int, steps_per_iteration: int, **state: Any) -> Iterator[Any]:
        """The run, from its folder to its closing line, around the block; yields the TensorBoard writer.

        `state` is what a checkpoint holds and a resume puts back: objects with state_dict() (the model, the optimizer,
        normalizers: rank 0's), numpy or torch random generators (every rank's). Anything else the loop must carry
        over a stop (a buffer, another generator) goes here too, as an object with state_dict() and
        load_state_dict(). It is kept at each iteration boundary, with the envs' states; a stop saves that.
        Stopped, an env failure or a lost rank saves the last boundary's state; then summary.json and the closing
        line."""
        self.device, self.num_iterations, self.steps, self.state = device, num_iterations, steps_per_iteration, state
        for name, obj in state.items():
            if not (hasattr(obj, "state_dict") or isinstance(obj, (np.random.Generator, torch.Generator))):
                raise TypeError(f"run.start(): {name} has no state_dict() and is no random generator")
        if self.args.resume is not None:
            self._resume()
        earlier = {}
        if self.is_main and self.args.resume is not None:
            self.dir = Path(self.args.resume).parent
            records.hold(self.dir)
            earlier = records.read_json(self.dir / "summary.json") or {}
            try:
                records.write_args(self.dir, self.args, self.checkpoint, steps_per_iteration)
            except OSError as exc:
                raise RunError(
                    f"cannot write into {self.dir} ({exc.strerror}): a resumed run goes on in its folder"
                ) from None
        elif self.is_main:
            self.dir = records.make_run_dir(self.args, steps_per_iteration=steps_per_iteration)
        first = (self.start_iteration - 1) * steps_per_iteration
        self.progress = Progress(num_iterations * steps_per_iteration, first, speaks=self.is_main,
                                 recent=(self.checkpoint or {}).get("recent_returns", []), earlier=earlier)  # fmt: skip
        self.writer = _open_writer(self.dir, self.args, first) if self.is_main else _NoWriter()
        status = "failed"
        try:
            with contextlib.ExitStack() as self._resources:  # the envs: closed as the run ends, however it ends
                try:
                    yield self.writer
                    status = "done"
                except Stopped as exc:
                    status = f"stopped by {exc}"
                    self._save_on_the_way_out()
                    raise
                except (WorkerError, TimeoutError, RuntimeError) as exc:
                    if isinstance(exc, RuntimeError) and not isinstance(exc, WorkerError) and not self.lost_rank(exc):
                        raise  # a bug, or the script's own RunError (NaN weights): nothing to save
                    stopped = stops.request.wait(1.0)  # a scheduler signals every process: an env may die first
                    status = f"stopped by {signal.Signals(stops.request.signum).name}" if stopped else "failed"
                    self._save_on_the_way_out()
                    if stopped:
                        raise Stopped(stops.request.signum) from None
                    raise
        finally:
            self.writer.close()
            if self.is_main:
                self._close(status)

    def _resume(self) -> None:
        """Puts the checkpoint's state into `state`; FlagError unless it holds it all and was written with as many
        ranks, Finished if its run has no iterations left."""
        checkpoint, path = self.checkpoint, self.args.resume
        missing = [name for name in ("iteration", *self.state) if name not in checkpoint]
        if missing:
            raise FlagError(f"--resume {path} holds no {' and no '.join(missing)}: not a whole checkpoint of "
                            f"{self.script} (an older version, or a file edited since)")  # fmt: skip
        if checkpoint.get("world_size", 1) != self.world_size:
            raise FlagError(f"--resume {path} was written with {checkpoint['world_size']} ranks; resume it with "
                            f"{checkpoint['world_size']}, not {self.world_size}")  # fmt: skip
        done = checkpoint["iteration"]
        if done >= self.num_iterations:
            asked = f" (--total-timesteps {self.args.total_timesteps} asks for {self.num_iterations})"
            raise Finished(f"--resume {path}: that run finished its {done} iterations already"
                           f"{asked if self.num_iterations < done else ''}; nothing to do (a larger --total-timesteps "
                           "continues it)")  # fmt: skip
        for name, obj in self.state.items():
            value = checkpoint[name][self.rank] if _per_rank(obj) else checkpoint[name]
            try:
                if isinstance(obj, np.random.Generator):
                    obj.bit_generator.state = value
                elif isinstance(obj, torch.Generator):
                    obj.set_state(value)
                else:
                    records.load_state(obj, value, "--resume", path)
            except (TypeError, ValueError, IndexError, RuntimeError) as exc:
                raise FlagError(f"--resume {path}: its {name} does not fit this run ({exc})") from None
        self.start_iteration, self.on_disk = done + 1, done
        planned = checkpoint["args"].get("total_timesteps", self.args.total_timesteps) // self.steps
        if self.is_main and planned != self.num_iterations and records.scheduled(vars(self.args)):
            print(f"{self.script}: --total-timesteps {self.args.total_timesteps} moves the end of --anneal-lr's "
                  f"schedule (made for {checkpoint['args']['total_timesteps']} steps): the learning rate goes on from "
                  f"{1.0 - done / self.num_iterations:.2f} x --learning-rate down to 0 at step "
                  f"{self.num_iterations * self.steps}", flush=True)  # fmt: skip

    def make_envs(self, env_fns: list[Callable]) -> tuple[SubprocVecEnv, Any]:
        """A SubprocVecEnv of env_fns, laid out as the probe decided (or --num-workers says), closed when the run ends;
        and the observations to act on first: the envs as the checkpoint left them, or reset with seeds no earlier
        part of the run used."""
        args = self.args
        envs = SubprocVecEnv(env_fns, num_workers=self._num_workers(), max_restarts=args.max_restarts,
                             step_timeout=args.step_timeout, interrupt=stops.request, probe=self.probed)  # fmt: skip
        self.envs = self._resources.enter_context(envs)
        saved = (self.checkpoint or {}).get("env_states") if self.args.resume is not None else None
        restored = bool(saved) and all(states is not None for states in saved)
        first_seed = self.args.seed + (self.rank + self.world_size * (self.start_iteration - 1)) * len(env_fns)
        if restored:
            next_obs = self.envs.load_env_states(saved[self.rank])
        else:
            next_obs, _ = self.envs.reset(seed=first_seed)
        line = f"{self.args.env_id}, {self.envs.placement}, {self.device}"
        line += "" if restored else self._ranks_note(first_seed)
        if self.args.resume is not None:
            line += f"; resuming from iteration {self.start_iteration - 1} (step {self.progress.first_step}), "
            line += "the envs as they were" if restored else "the envs in fresh episodes (they cannot be saved)"
        if self.is_main:
            print(f"{self.script}: {line}; results in {self.dir}", flush=True)
        return self.envs, next_obs

    def iterations(self) -> Iterator[int]:
        """The iterations left to do. Before each, and after the last, the state at that boundary is kept (what a stop
        saves) and written where a save is due: every --checkpoint-interval iterations, and at the end (with
        --save-model, also as <exp-name>.cleanrl_model)."""
        for iteration in range(self.start_iteration, self.num_iterations + 1):
            self._boundary(iteration - 1)
            yield iteration
        self._boundary(self.num_iterations)

    def _boundary(self, done: int) -> None:
        own = {name: _state_of(obj) for name, obj in self.state.items() if _per_rank(obj)}
        everyone = self._gather((own, self.envs.save_env_states() if self.envs is not None else None))
        if not self.is_main:
            return
        self.last = {"script": self.script, "args": dataclasses.asdict(self.args), "world_size": self.world_size,
                     "iteration": done, "global_step": done * self.steps, "env_states": [e for _, e in everyone],
                     "recent_returns": list(self.progress.recent_returns)}  # fmt: skip
        for name, obj in self.state.items():
            self.last[name] = [o[name] for o, _ in everyone] if _per_rank(obj) else copy.deepcopy(obj.state_dict())
        interval = self.args.checkpoint_interval
        if done == self.num_iterations or (done >= self.start_iteration and interval and done % interval == 0):
            self.save()
        if done == self.num_iterations and self.args.save_model:
            path = self.dir / f"{self.args.exp_name}.cleanrl_model"  # CleanRL's file: the same state
            records.save_checkpoint(path, self.last)
            print(f"model saved to {path}", flush=True)

    def save(self, status: str = "running") -> None:
        """Writes the last boundary's state to checkpoint.pt, and summary.json."""
        records.save_checkpoint(self.dir / "checkpoint.pt", self.last)
        self.written, self.on_disk = self.last, self.last["iteration"]
        self._summarize(status)

    def stop_requested(self) -> bool:
        """True once this process was asked to stop (SIGINT or SIGTERM)."""
        return stops.request.signum is not None

    def stop_if_asked(self) -> None:
        """Stopped, if a stop was requested: the run saves the last boundary's state and ends. A safe point."""
        stops.request.check()

    def log(self, global_step: int, episodes: list[tuple], timings: dict[str, float]) -> None:
        """Logs each finished episode (global step, raw return, length), SPS, where the time went and worker restarts,
        and prints the progress line; RunError if a weight became NaN/Inf (nothing of it is saved)."""
        for name, obj in self.state.items():
            if isinstance(obj, torch.nn.Module) and not all(p.isfinite().all() for p in obj.parameters()):
                raise RunError(f"iteration {global_step // self.steps} (global_step {global_step}): the weights of "
                               f"{name} became NaN/Inf; look for NaN/Inf in observations or rewards, or lower "
                               "--learning-rate")  # fmt: skip
        episodes, restarts = self._gather_episodes(episodes, self.envs.restarts)
        self.progress.log(self.writer, global_step, episodes, timings, restarts)

    def evaluate(self, act: Callable[[Any], Any], **state: Any) -> list[float]:
        """Raw returns of --eval-episodes whole episodes (whole games, for Atari) on one env, acting with act(obs) on a
        batch of one; printed, and logged as eval/episodic_return during a run. With --eval-checkpoint, `state` is
        loaded from it first. The env steps where the probe decided (in a worker unless it is gymnasium's own)."""
        if not self.is_main:
            return []
        for name, obj in state.items():
            records.load_state(obj, self.checkpoint[name], "--eval-checkpoint", self.args.eval_checkpoint)
        path = self.args.eval_checkpoint or str(self.dir / "checkpoint.pt")
        args = self.args if self.args.eval_checkpoint else dataclasses.replace(self.args, capture_video=False)
        env_fn = self.make_env(args, 0, Path(path).parent / "eval")
        returns = []
        with SubprocVecEnv([env_fn], num_workers=args.num_workers, interrupt=stops.request, probe=self.probed) as envs:
            obs, _ = envs.reset(seed=args.seed + 10_000)  # seeds training never used
            while len(returns) < args.eval_episodes:
                obs, _, _, _, infos = envs.step(act(obs))
                if infos.get("final_info", {}).get("_episode", [False])[0]:  # not when only a life ended (Atari)
                    returns.append(float(infos["final_info"]["episode"]["r"][0]))
        for idx, episodic_return in enumerate(returns if self.writer is not None else []):
            self.writer.add_scalar("eval/episodic_return", episodic_return, idx)
        print(f"eval: mean return {sum(returns) / len(returns):.2f} over {len(returns)} episodes: {returns}")
        return returns

    # ---------------------------------------------------------------------------------- what ranks do together
    def _num_workers(self) -> int | None:
        return self.args.num_workers

    def _gather(self, obj: Any) -> list:
        return [obj]

    def _gather_episodes(self, episodes: list, restarts: int) -> tuple[list, int]:
        return episodes, restarts

    def _ranks_note(self, first_seed: int) -> str:
        return ""

    @staticmethod
    def lost_rank(exc: BaseException) -> bool:
        return False

    # ------------------------------------------------------------------------------------------------ the end
    def _save_on_the_way_out(self) -> None:
        if not self.is_main or self.last is None or self.written is self.last:
            return
        try:
            self.save("saving")
        except RunError as exc:  # a full disk: said in one line, the previous checkpoint kept
            print(f"{self.script}: error: {exc}", file=sys.stderr, flush=True)

    def _summarize(self, status: str) -> dict[str, Any]:
        on_disk = (self.dir / "checkpoint.pt").exists()
        summary = {"script": self.script, "status": status, **self.progress.figures(),
                   "checkpoint": str(self.dir / "checkpoint.pt") if on_disk else None,
                   "checkpoint_iteration": self.on_disk if on_disk else None,
                   "layout": self.envs.layout if self.envs is not None else None}  # fmt: skip
        records.write_json(self.dir / "summary.json", summary)
        return summary

    def _close(self, status: str) -> None:
        """summary.json, and the closing line for `cli` to print last."""
        summary = self._summarize(status)
        mean = summary["episodic_return_last_20"]
        figures = (f"{summary['global_step']} of {summary['last_step']} steps in {hms(summary['seconds'])} "
                   f"({summary['sps']} SPS), last-20 return {'n/a' if mean is None else f'{mean:.1f}'}")  # fmt: skip
        where = f"results in {self.dir} (tensorboard --logdir {self.dir.parent})"
        if summary["checkpoint"] and status != "done":
            where += f"; continue with: {_command(resume=True)} --resume {summary['checkpoint']}"
        elif summary["checkpoint"]:
            where += f"; evaluate with: {_command()} --eval-checkpoint {summary['checkpoint']}"
        _closing_lines.append((f"{self.script}: {status}: {figures}; {where}", status != "done"))

    @classmethod
    def cli(cls, main: Callable[[Any], Any], args_type: type, doc: str) -> None:
        """Parses args_type from the command line (--help opens with the first two paragraphs of `doc`), runs
        main(args) with SIGINT and SIGTERM as stop requests, and exits with the status the outcome calls for, after the
        closing line. Under torchrun every failing rank prints its own reason; a stop is said by rank 0 alone."""
        import tyro

        script = Path(sys.argv[0]).name
        rank, world_size = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
        me = f"{script}: rank {rank}" if world_size > 1 else script

        def close(status: int, message: str | None = None) -> None:
            if message is not None:
                print(f"{me}: {message}", file=sys.stderr, flush=True)
            for line, to_stderr in _closing_lines:
                print(line, file=sys.stderr if to_stderr else sys.stdout, flush=True)
            stops.request.ignore()  # the run is over: a launcher's forwarded signal must not end the exit itself
            sys.exit(status)

        stops.request.install()
        _end_with_launcher()
        try:
            flags.check_bool_values(args_type, sys.argv[1:])
            try:
                args = tyro.cli(args_type, description="\n\n".join(doc.split("\n\n")[:2]))
            except SystemExit:
                _flush_or_quiet()  # `--help | head` closed the pipe: no BrokenPipeError traceback
                raise
            if getattr(args, "capture_video", False):
                _runtime_dir_for_video()
            main(args)
        except Finished as exc:
            if rank == 0:
                print(f"{script}: {exc}", flush=True)
        except FlagError as exc:
            close(2, f"error: {exc}")
        except Stopped as exc:
            if rank == 0 and not _closing_lines:  # stopped before training started: nothing else to say
                print(f"{script}: stopped by {exc}", file=sys.stderr, flush=True)
            close(128 + exc.signum)
        except (RunError, WorkerError, TimeoutError, FloatingPointError) as exc:
            close(1, f"error: {exc}")
        except Exception as exc:  # noqa: BLE001 - a lost rank is one line; anything else is a bug, with its traceback
            if not cls.lost_rank(exc):
                traceback.print_exc()
                close(1)
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
            close(1, f"error: lost contact with another rank ({reason}); that rank's own message says why")
        close(0)


def _per_rank(obj: Any) -> bool:
    """A random generator: each rank has its own."""
    return isinstance(obj, (np.random.Generator, torch.Generator))


def _state_of(obj: Any) -> Any:
    return obj.bit_generator.state if isinstance(obj, np.random.Generator) else obj.get_state()


class Progress:
    """Steps per second, the progress line (at most every `every` seconds, and for the last iteration), and the
    figures a summary and the closing line give, over every segment of a resumed run."""

    def __init__(self, last_step: int, first_step: int = 0, every: float = 2.0, speaks: bool = True,
                 recent: list | None = None, earlier: dict | None = None):  # fmt: skip
        self.last_step, self.first_step, self.every, self.speaks = last_step, first_step, every, speaks
        self.global_step = first_step
        self.recent_returns = collections.deque(recent or [], maxlen=20)
        self.start = self.last_print = time.time()
        self.earlier_seconds = (earlier or {}).get("seconds", 0.0)  # the run's earlier segments (its summary.json)
        self.segments = earlier.get("segments", 1) + 1 if earlier else 1

    def sps(self, global_step: int) -> int:
        return int((global_step - self.first_step) / max(time.time() - self.start, 1e-9))

    def mean_return(self) -> float | None:
        return sum(self.recent_returns) / len(self.recent_returns) if self.recent_returns else None

    def line(self, global_step: int, timings: dict[str, float]) -> str:
        sps, mean_return = self.sps(global_step), self.mean_return()
        shown = "n/a" if mean_return is None else f"{mean_return:.1f}"
        eta = (self.last_step - global_step) / max(sps, 1)
        split = ", ".join(f"{name} {seconds:.2f}s" for name, seconds in timings.items())
        return (f"global_step={global_step}/{self.last_step} SPS={sps} episodic_return={shown} "
                f"(last {len(self.recent_returns)}) elapsed={hms(time.time() - self.start)} ETA={hms(eta)} "
                f"[{split}]")  # fmt: skip

    def log(self, writer: Any, global_step: int, episodes: list, timings: dict[str, float], restarts: int) -> None:
        """charts/episodic_return and charts/episodic_length of each episode, charts/SPS, perf/{part}_seconds and
        charts/worker_restarts; the progress line."""
        self.global_step = global_step
        for step, episodic_return, episodic_length in episodes:
            self.recent_returns.append(float(episodic_return))
            writer.add_scalar("charts/episodic_return", episodic_return, step)
            writer.add_scalar("charts/episodic_length", episodic_length, step)
        writer.add_scalar("charts/SPS", self.sps(global_step), global_step)
        for name, seconds in timings.items():
            writer.add_scalar(f"perf/{name}_seconds", seconds, global_step)
        writer.add_scalar("charts/worker_restarts", restarts, global_step)
        if self.speaks and (time.time() - self.last_print >= self.every or global_step >= self.last_step):
            self.last_print = time.time()
            print(self.line(global_step, timings), flush=True)

    def figures(self) -> dict[str, Any]:
        seconds = self.earlier_seconds + time.time() - self.start
        done = self.global_step - (0 if self.earlier_seconds else self.first_step)  # steps of the time counted
        return {"global_step": self.global_step, "last_step": self.last_step, "seconds": round(seconds, 1),
                "sps": int(done / max(seconds, 1e-9)), "segments": self.segments,
                "episodic_return_last_20": self.mean_return(),
                "episodes_in_that_mean": len(self.recent_returns)}  # fmt: skip


def hms(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class _NoWriter:
    """What ranks other than 0 log to: nothing."""

    def add_scalar(self, *args: Any, **kwargs: Any) -> None:
        pass

    def close(self) -> None:
        pass


def _open_writer(run_dir: Path, args: Any, first_step: int) -> Any:
    """TensorBoard's writer with the hyperparameter table (mirrored to wandb with --track); a resumed run's curves go
    on from `first_step`, without what its stopped part logged after its checkpoint."""
    if args.track:
        import wandb

        wandb.init(project=args.wandb_project_name, entity=args.wandb_entity, sync_tensorboard=True,
                   config=dataclasses.asdict(args), name=run_dir.name, monitor_gym=True, save_code=True)  # fmt: skip
    from torch.utils.tensorboard import SummaryWriter

    # max_queue: with the default of 10 pending events, add_scalar waits for the writer thread whenever it fills
    writer = SummaryWriter(str(run_dir), max_queue=1000, purge_step=first_step + 1 if args.resume else None)
    table = "\n".join(f"|{key}|{value}|" for key, value in vars(args).items())
    writer.add_text("hyperparameters", f"|param|value|\n|-|-|\n{table}")
    return writer


def _command(resume: bool = False) -> str:
    """How to run this script again from here: its path as typed, under torchrun for a job of several ranks."""
    if resume and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return f"torchrun <the same torchrun options> {sys.argv[0]}"
    return f"python {sys.argv[0]}"


def _end_with_launcher() -> None:
    """Under torchrun, or a launcher that sets END_WITH_PARENT (a sweep): SIGTERM to this run when its launcher dies
    (SIGKILL included), so that the run stops through its stop path (and saves) instead of training on alone."""
    launched = "TORCHELASTIC_RUN_ID" in os.environ or os.environ.get(records.END_WITH_PARENT) == "1"
    if not launched or not sys.platform.startswith("linux"):
        return
    import ctypes

    parent = os.getppid()
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # it died before we asked
        os.kill(os.getpid(), signal.SIGTERM)


def _runtime_dir_for_video() -> None:
    """A private XDG_RUNTIME_DIR where none is usable, before any worker starts: SDL otherwise prints "error:
    XDG_RUNTIME_DIR is invalid" at every env, though nothing is wrong."""
    current = os.environ.get("XDG_RUNTIME_DIR", "")
    if current and os.path.isdir(current) and os.access(current, os.W_OK):
        return
    import atexit
    import shutil
    import tempfile

    os.environ["XDG_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="ppo-vec-runtime-")  # mode 0700, as SDL asks
    atexit.register(shutil.rmtree, os.environ["XDG_RUNTIME_DIR"], ignore_errors=True)


def _flush_or_quiet() -> None:
    """Flushes stdout; if its reader has gone, points it at /dev/null so that the exit does not complain."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
