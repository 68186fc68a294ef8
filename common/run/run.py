"""A run of a training script as its `main` sees it: one object that owns the flags, the env probed
once, the run folder and writer, the envs, the state kept at iteration boundaries and the
checkpoints written from it, the stop's safe points, and the one place a run ends (Run.cli, the
script's entry point, is cli.py's)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..multiprocessing_env import SubprocVecEnv, WorkerError
from ..vecenv import process_control
from . import cli, flags, progress, records, stops
from .errors import Finished, FlagError, RunError
from .stops import Stopped

# a boundary's state is kept once this many times what keeping the last one took has passed
KEEP_EVERY = 50
TORCH_GENERATORS = ("torch_rng", "torch_cuda_rng")  # the generators start() keeps without asking


class Run:
    """A new run, the one --resume (or --run-id) names, or the checkpoint --eval-checkpoint evaluates:
    `args` the flags it runs with (a resumed run's own), `dir` its folder (from `start`, on rank 0).

    Args:
        args: the script's flags (its Args dataclass, as parsed).
        rank, world_size, local_world_size: this process's place among torchrun's ranks.

    Raises:
        FlagError: a flag, an env id or a checkpoint the command line names that cannot be used."""

    cli = staticmethod(cli.run)  # a script's entry point: Run.cli(main, Args, __doc__)

    def __init__(self, args: Any, rank: int = 0, world_size: int = 1, local_world_size: int = 1):
        self.script = Path(sys.modules[type(args).__module__].__file__).name
        self.rank, self.world_size, self.is_main = rank, world_size, rank == 0
        self.cores = max(1, process_control.cores() // local_world_size)  # this rank's share
        self.notes: list[str] = []  # what the start line adds
        self.where = ""  # the flag that named the checkpoint, and the file: messages start with it
        self.args, self.checkpoint = self._flags(args)
        if getattr(self.args, "num_threads", 1) is None:  # this rank's share of the cores, kept by a resume
            self.args.num_threads = self.cores
        self.envs_flag = "local_num_envs" if hasattr(args, "local_num_envs") else "num_envs"  # a rank's envs
        flags.check(self.args, flags.batch_rules(self.args, self.envs_flag, world_size))
        flags.check_env_id(self.args.env_id)  # imports the module of a module:EnvId id
        self.dir: Path | None = None
        self.device = self.envs = self.writer = self.progress = None
        self.probed: dict[str, Any] = {}
        self.state: dict[str, Any] = {}  # what a checkpoint holds
        self.num_iterations = self.steps = 0
        self.start_iteration = 1
        self.last: dict | None = None  # the state of the last boundary kept: what a save writes
        self.last_saved: dict | None = None  # what this run last wrote to checkpoint.pt
        self.saved_iteration: int | None = None  # the iteration checkpoint.pt holds
        # when the last boundary was kept, and what that took
        self.kept_at, self.keeping = None, 0.0

    def _flags(self, args: Any) -> tuple[Any, dict | None]:
        """The flags to run with, and the checkpoint they come from: --resume (or --run-id, of a run that
        saved) goes on with the run's own, but for those the command line may change (TOLERATED ones, and
        --total-timesteps); --eval-checkpoint evaluates with them, the command line's TOLERATED ones."""
        if args.resume is not None and args.eval_checkpoint is not None:
            raise FlagError("--resume trains a run on, --eval-checkpoint evaluates one: give one of them")
        path = args.resume if args.resume is not None else args.eval_checkpoint
        where = self.where = f"{'--resume' if args.resume is not None else '--eval-checkpoint'} {path}"
        run_id = getattr(args, "run_id", None)
        found = Path("runs", f"{records.run_name(args)}__{run_id}", "checkpoint.pt")
        if path is None and run_id is not None and found.exists():  # a requeued job finds its own run
            path = str(found)
            where = self.where = f"--run-id {run_id} ({found})"
        if path is None:
            return args, None
        checkpoint = records.load_checkpoint(path, where.split()[0], self.script)
        names = [f.name for f in dataclasses.fields(args)]
        # flags an older version had and this one has not are left out
        saved = type(args)(**{k: v for k, v in checkpoint["args"].items() if k in names})
        from_command_line = {name: getattr(args, name) for name in names if name in flags.given_fields(type(args))}
        module = saved.env_id.rpartition(":")[0]
        if module and "env_id" not in from_command_line:  # a checkpoint never chooses what is imported
            env = saved.env_id
            raise FlagError(f"{where} is of --env-id {env}, which imports {module}: give --env-id {env} to import it")
        if args.eval_checkpoint is not None:
            if args.env_id != saved.env_id and "env_id" in from_command_line:
                raise FlagError(
                    f"{where} holds a policy for {saved.env_id}, not --env-id {args.env_id}: drop --env-id (it is "
                    f"evaluated on {saved.env_id})"
                )
            if args.eval_episodes < 1:
                raise FlagError(f"--eval-episodes must be >= 1 with --eval-checkpoint, got {args.eval_episodes}")
            tolerated = {name: getattr(args, name) for name in flags.TOLERATED & {*names}}
            return dataclasses.replace(saved, **tolerated), checkpoint
        if refused := flags.differing(from_command_line, dataclasses.asdict(saved)):
            listed = ", ".join(f"{flags.flag(name)} {was} (not {asked})" for name, (asked, was) in refused.items())
            other = "give another --run-id" if where.startswith("--run-id") else "start a new run"
            raise FlagError(
                f"{where} continues a run trained with {listed}: a run's results come from one set of flags; drop "
                f"those flags, or {other}"
            )
        resumed = dataclasses.replace(saved, **from_command_line | {"resume": path})
        trained_with = getattr(saved, "num_threads", None)
        if trained_with not in (None, getattr(resumed, "num_threads", None)):  # torch then sums in another order
            threads = f"--num-threads {resumed.num_threads}, not the {trained_with} it trained with"
            self.notes.append(f"{threads}: its weights will differ from an unstopped run's")
        return resumed, checkpoint

    def probe(self, make_env: Callable) -> tuple[Any, Any]:
        """Builds make_env(args, 0, None)() once in a probe process (no env code runs here), resets
        and steps it, and times it if it is one of gymnasium's own: what decides where the envs step.

        Returns:
            Its observation space and action space.

        Raises:
            FlagError: naming --env-id, if it cannot be built or speaks gym's old API; naming
                --num-steps, if the rollout's observations would not fit in memory."""
        env_fn = make_env(dataclasses.replace(self.args, capture_video=False), 0, None)
        self.probed = flags.probe_env(self.args.env_id, env_fn, self.args.step_timeout or 600.0)
        flags.check_rollout(self.args, self.envs_flag, self.probed["spaces"][0])
        return self.probed["spaces"]

    def load(self, **state: Any) -> None:
        """Puts the state --eval-checkpoint holds into these objects (model=agent, ...), through
        their load_state_dict. FlagError if the checkpoint holds none of one, or one of other sizes."""
        records.check_fields(self.checkpoint, state, self.where, self.script)
        for name, obj in state.items():
            records.load_state(obj, self.checkpoint[name], self.where)

    @contextlib.contextmanager
    def start(self, device: torch.device, num_iterations: int, steps: int, state: dict) -> Iterator[Any]:
        """The run, from its folder to its closing line, around the block: a stop, an env failure or a
        lost rank saves the state of the last boundary kept; then summary.json and the closing line.

        Args:
            device: where the model trains. num_iterations, steps: the iterations, the global steps of each.
            state: what a checkpoint holds and a resume puts back: objects with state_dict() and
                load_state_dict() (model, optimizer, normalizers) and numpy or torch generators (every
                rank's). Whatever else the loop carries over a stop goes here too; torch's own
                generators (dropout, torch.randn) are kept without asking.

        Yields:
            The TensorBoard writer (a silent one on ranks other than 0).

        Raises:
            FlagError: a checkpoint that does not fit `state` or these ranks. Finished: nothing left to do."""
        state = {**state, "torch_rng": torch.default_generator}
        if device.type == "cuda":
            torch.cuda.init()  # (default_generators is empty until then)
            state["torch_cuda_rng"] = torch.cuda.default_generators[torch.cuda.current_device()]
        self.device, self.num_iterations, self.steps, self.state = device, num_iterations, steps, state
        earlier = self._resume() if self.args.resume is not None else {}
        if self.is_main and self.args.resume is None:
            self.dir = records.make_run_dir(self.args, steps, self.world_size)
        first, recent = (self.start_iteration - 1) * steps, (self.checkpoint or {}).get("recent_returns", [])
        self.progress = progress.Progress(num_iterations * steps, first, self.is_main, recent, earlier)
        self.writer = progress.open_writer(self.dir, self.args, first) if self.is_main else progress.NoWriter()
        status = "failed"
        try:
            # the envs, closed as the run ends, however it ends
            with contextlib.ExitStack() as self._resources:
                try:
                    yield self.writer
                    status = "done"
                except Stopped as exc:
                    status = f"stopped by {exc}"
                    self._save_on_the_way_out()
                    raise
                except Exception as exc:
                    if not isinstance(exc, (WorkerError, TimeoutError)) and not self.lost_rank(exc):
                        raise  # a bug, or the script's own RunError (NaN weights): nothing to save
                    # a scheduler signals every process: an env may die first
                    stopped = stops.request.wait(1.0)
                    status = f"stopped by {signal.Signals(stops.request.signum).name}" if stopped else "failed"
                    self._save_on_the_way_out()
                    if stopped:
                        raise Stopped(stops.request.signum) from None
                    raise
        finally:
            self.writer.close()
            if self.is_main:
                self._close(status)

    def _resume(self) -> dict:
        """Puts the checkpoint's state into `state`, then holds the run's folder; its summary so far."""
        checkpoint, path, where = self.checkpoint, self.args.resume, self.where
        names = [name for name in ("iteration", *self.state) if name not in TORCH_GENERATORS]
        records.check_fields(checkpoint, names, where, self.script)
        if (ranks := checkpoint.get("world_size", 1)) != self.world_size:
            raise FlagError(f"{where} was written with {ranks} ranks; resume it with {ranks}, not {self.world_size}")
        done, total, earlier = checkpoint["iteration"], self.args.total_timesteps, {}
        if self.is_main:
            self.dir = Path(path).parent
            earlier = records.read_json(self.dir / "summary.json") or {}
            self.saved_iteration = records.iteration_of(self.dir / "checkpoint.pt")
        if done >= self.num_iterations:
            if self.is_main and self.saved_iteration == done and earlier.get("status") != "done":
                os.close(records.hold(self.dir / records.LOCK))  # all trained: the summary says done
                records.write_json(self.dir / "summary.json", {**earlier, "status": "done"})
                (self.dir / records.LOCK).unlink()
            asked = f" (--total-timesteps {total} asks for {self.num_iterations})" if done > self.num_iterations else ""
            more = "nothing to do (a larger --total-timesteps continues it)"
            raise Finished(f"{where}: that run finished its {done} iterations already{asked}; {more}")
        for name, obj in self.state.items():
            if name not in checkpoint:  # torch's own generators, from a run on another device
                continue
            if isinstance(obj, np.random.Generator):
                obj.bit_generator.state = checkpoint[name][self.rank]
            elif isinstance(obj, torch.Generator):
                obj.set_state(checkpoint[name][self.rank])
            else:
                records.load_state(obj, checkpoint[name], where)
        self.start_iteration = done + 1
        planned = checkpoint["args"].get("total_timesteps", total)
        if self.is_main and planned // self.steps != self.num_iterations and flags.scheduled(vars(self.args)):
            print(
                f"{self.script}: --total-timesteps {total} moves the end of --anneal-lr's schedule (made for "
                f"{planned} steps): the learning rate goes on from {1.0 - done / self.num_iterations:.2f} x "
                f"--learning-rate down to 0 at step {self.num_iterations * self.steps}",
                flush=True,
            )
        if not self.is_main:
            return {}
        records.hold(self.dir / records.LOCK)
        try:
            records.write_args(self.dir, self.args, self.steps, self.world_size, resumed=checkpoint)
            # a kill from now on leaves it running, not as it ended before
            records.write_json(self.dir / "summary.json", {**earlier, "status": "running"})
        except OSError as exc:
            raise RunError(f"cannot write into {self.dir} ({exc.strerror}): a resumed run goes on there") from None
        return earlier

    def make_envs(self, make_env: Callable, num_envs: int, seed: int) -> tuple[SubprocVecEnv, Any]:
        """Builds make_env(args, i, dir) for i < num_envs in a SubprocVecEnv laid out as the probe
        decided (or --num-workers says), closed as the run ends, and prints the start line.

        Returns:
            The envs, and the observations to act on first: the envs' as the checkpoint left them,
            or those of a reset seeding env i with seed + i (after a stop, seeds no earlier part
            of the run used)."""
        args, bounds = self.args, {"max_restarts": self.args.max_restarts, "step_timeout": self.args.step_timeout}
        env_fns = [make_env(args, i, self.dir) for i in range(num_envs)]
        layout = {"num_workers": self._num_workers(), "interrupt": self._interrupt(), "probe": self.probed}
        envs = self.envs = self._resources.enter_context(SubprocVecEnv(env_fns, **layout, **bounds))
        first_seed = seed + self.world_size * (self.start_iteration - 1) * num_envs
        saved = (self.checkpoint or {}).get("env_states", [None] * self.world_size)[self.rank]
        next_obs, why = None, ""
        if saved is None:
            why = "its envs could not be saved: an env class of yours says `pickle_state = True` if its state is data"
        elif isinstance(saved, bytes):
            why = "an older version pickled its env states: they are not loaded, as no pickle is"
        elif args.resume is not None:
            try:
                next_obs = envs.load_env_states(saved)
            except ValueError as exc:
                why = f"its env states do not fit these envs: {records.one_line(exc)}"
        if next_obs is None:
            next_obs = envs.reset(seed=first_seed)[0]
        line = f"{args.env_id}, {envs.placement}, {self.device}{self._ranks_note(first_seed)}"
        if args.resume is not None:
            line += f"; resuming from iteration {self.start_iteration - 1} (step {self.progress.first_step}), "
            line += f"the envs in fresh episodes ({why})" if why else "the envs as they were"
        if self.is_main:
            print(f"{self.script}: {'; '.join([line, *self.notes])}; results in {self.dir}", flush=True)
        return envs, next_obs

    def iterations(self) -> Iterator[int]:
        """Yields the iterations left to do (from 1). Before each and after the last, the state at
        that boundary is kept (a stop saves it) where KEEP_EVERY allows or a save is due: every
        --checkpoint-interval iterations, and at the end (with --save-model, also as
        <exp-name>.cleanrl_model)."""
        for iteration in range(self.start_iteration, self.num_iterations + 1):
            self._boundary(iteration - 1)
            yield iteration
        self._boundary(self.num_iterations)

    def _boundary(self, done: int) -> None:
        interval = self.args.checkpoint_interval
        save_due = done == self.num_iterations or (done >= self.start_iteration and interval and done % interval == 0)
        if not (save_due or self._keep()):
            return
        started = time.perf_counter()
        generators = {name: _rng_state(obj) for name, obj in self.state.items() if _per_rank(obj)}
        all_ranks = self._gather((generators, self.envs.save_env_states() if self.envs is not None else None))
        if self.is_main:
            self.last = {"script": self.script, "args": dataclasses.asdict(self.args), "world_size": self.world_size}
            self.last |= {"iteration": done, "global_step": done * self.steps}
            self.last |= {
                "env_states": [envs for _, envs in all_ranks],
                "recent_returns": [*self.progress.recent_returns],
            }
            for name, obj in self.state.items():
                self.last[name] = (
                    [g[name] for g, _ in all_ranks] if _per_rank(obj) else records.copy_state(obj.state_dict())
                )
        # The first keeping pays for what is done once, so it is not timed: the next one is
        self.keeping = time.perf_counter() - started if self.kept_at is not None else 0.0
        self.kept_at = time.perf_counter()
        if self.is_main and save_due:
            self.save()
        if self.is_main and done == self.num_iterations and self.args.save_model:
            # CleanRL's file: the same state
            path = self.dir / f"{self.args.exp_name}.cleanrl_model"
            records.save_checkpoint(path, self.last)
            print(f"model saved to {path}", flush=True)

    def _keep(self) -> bool:
        """Whether KEEP_EVERY times what keeping the last boundary took has passed since."""
        return self.kept_at is None or time.perf_counter() - self.kept_at >= KEEP_EVERY * self.keeping

    def save(self, status: str = "running") -> None:
        """Writes the state of the last boundary kept to checkpoint.pt, and summary.json."""
        records.save_checkpoint(self.dir / "checkpoint.pt", self.last)
        self.last_saved, self.saved_iteration = self.last, self.last["iteration"]
        self._summarize(status)

    def stop_if_asked(self) -> None:
        """A safe point: raises Stopped if a stop signal came (the run then saves the last boundary
        kept, and ends)."""
        stops.request.check()

    def log(self, global_step: int, episodes: list[tuple], timings: dict[str, float]) -> None:
        """Logs to TensorBoard and prints the progress line (every 2 s).

        Args:
            global_step: the steps done.
            episodes: each episode finished this iteration: (global step, raw return, length).
            timings: seconds of this iteration by part ({"env": ..., "update": ...}): perf/*_seconds.

        Raises:
            RunError: a weight of a model in the state became NaN or infinite."""
        for name, obj in self.state.items():
            if isinstance(obj, torch.nn.Module) and not all(p.isfinite().all() for p in obj.parameters()):
                raise RunError(
                    f"iteration {global_step // self.steps} (global_step {global_step}): the weights of {name} "
                    "became NaN/Inf; look for NaN/Inf in observations or rewards, or lower --learning-rate"
                )
        self.progress.log(self.writer, global_step, *self._gather_episodes(episodes, self.envs.restarts), timings)

    def evaluate(self, act: Callable[[Any], Any], make_env: Callable) -> list[float]:
        """Plays --eval-episodes whole episodes (whole games, for Atari) on env 0 of make_env, where
        the probe decided it steps, acting with act(obs) on a batch of one.

        Returns:
            Their raw returns, also printed and, in a run, logged as eval/episodic_return."""
        if not self.is_main:
            return []
        args = self.args if self.args.eval_checkpoint else dataclasses.replace(self.args, capture_video=False)
        env_fn = make_env(args, 0, Path(args.eval_checkpoint or self.dir / "checkpoint.pt").parent / "eval")
        returns = []
        with SubprocVecEnv([env_fn], num_workers=args.num_workers, interrupt=stops.request, probe=self.probed) as envs:
            obs, _ = envs.reset(seed=args.seed + 10_000)  # seeds training never used
            while len(returns) < args.eval_episodes:
                obs, _, _, _, infos = envs.step(act(obs))
                # (not when only a life ended)
                if infos.get("final_info", {}).get("_episode", [False])[0]:
                    returns.append(float(infos["final_info"]["episode"]["r"][0]))
        for idx, episodic_return in enumerate(returns if self.writer is not None else []):
            self.writer.add_scalar("eval/episodic_return", episodic_return, idx)
        shown = ", ".join(f"{r:.6g}" for r in returns)
        print(f"eval: mean return {sum(returns) / len(returns):.2f} over {len(returns)} episodes: [{shown}]")
        return returns

    # What ranks do together: nothing, with one (ranks.py)
    def _num_workers(self) -> int | None:
        return self.args.num_workers

    def _interrupt(self) -> Any:
        return stops.request  # what ends a wait on the envs: a stop

    def _gather(self, obj: Any) -> list:
        return [obj]

    def _gather_episodes(self, episodes: list, restarts: int) -> tuple[list, int]:
        return episodes, restarts

    def _ranks_note(self, first_seed: int) -> str:
        return ""

    @staticmethod
    def lost_rank(exc: BaseException) -> bool:
        return False

    def _save_on_the_way_out(self) -> None:
        if not self.is_main or self.last is None or self.last_saved is self.last:
            return
        try:
            self.save("saving")
        except RunError as exc:  # a full disk: said in one line, the previous checkpoint kept
            print(f"{self.script}: error: {exc}", file=sys.stderr, flush=True)

    def _summarize(self, status: str) -> dict[str, Any]:
        on_disk = (self.dir / "checkpoint.pt").exists()
        summary = {"script": self.script, "status": status, **self.progress.summary()}
        summary["checkpoint"] = str(self.dir / "checkpoint.pt") if on_disk else None
        summary["checkpoint_iteration"] = self.saved_iteration if on_disk else None
        summary["layout"] = self.envs.layout if self.envs is not None else None
        try:
            records.write_json(self.dir / "summary.json", summary)
        except OSError as exc:
            print(f"{self.script}: cannot write {self.dir / 'summary.json'} ({exc.strerror})", file=sys.stderr)
        return summary

    def _close(self, status: str) -> None:
        """summary.json, the closing line, the folder let go; a run stopped while it evaluates its
        last checkpoint is done."""
        trained = self.saved_iteration == self.num_iterations
        shown = f"done (its evaluation: {status})" if trained and status != "done" else status
        summary, mean = self._summarize("done" if trained else status), self.progress.mean_return()
        line = (
            f"{self.script}: {shown}: {summary['global_step']} of {summary['last_step']} steps in "
            f"{progress.hms(summary['seconds'])} ({summary['sps']} SPS), last-20 return "
            f"{'n/a' if mean is None else f'{mean:.1f}'}; results in {self.dir} (tensorboard "
            f"--logdir {self.dir.parent})"
        )
        if summary["checkpoint"]:
            again = "python" if trained or self.world_size == 1 else "torchrun <the same torchrun options>"
            how, flag = ("evaluate with", "--eval-checkpoint") if trained else ("continue with", "--resume")
            line += f"; {how}: {again} {sys.argv[0]} {flag} {summary['checkpoint']}"
            line += f" --env-id {self.args.env_id}" if ":" in self.args.env_id else ""  # it imports the module
        (self.dir / records.LOCK).unlink(missing_ok=True)  # the lock itself ends with the process
        cli.closing_lines.append((line, shown != "done"))  # cli.run prints it last


def _per_rank(obj: Any) -> bool:
    """A random generator: each rank has its own."""
    return isinstance(obj, (np.random.Generator, torch.Generator))


def _rng_state(generator: Any) -> Any:
    return generator.bit_generator.state if isinstance(generator, np.random.Generator) else generator.get_state()
