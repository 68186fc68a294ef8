"""A run of a training script as its `main` sees it (Run: one process; RankedRun, ranks.py: under
torchrun): the flags, the run folder and writer, the envs, the checkpoints, the stop's safe points."""

import contextlib
import dataclasses
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..multiprocessing_env import SubprocVecEnv, WorkerError
from . import cli, flags, progress, records
from .cli import CommandLine
from .errors import Finished, FlagError, RunError
from .stops import Stopped

# a boundary's state is kept once this many times what keeping the last one took has passed
KEEP_EVERY = 50
# seconds a failed env waits for the stop signal that may be on its way
SIGNAL_LAG = 1.0
TORCH_GENERATORS = ("torch_rng", "torch_cuda_rng")  # the generators start() keeps without asking
RNG_TYPES = (np.random.Generator, torch.Generator)  # random generators: each rank has its own


class Run:
    """A new run, the one --resume (or --run-id) names, or the checkpoint --eval-checkpoint evaluates.

    `args` are the flags it runs with (a resumed run's own), `dir` its folder (from `start`).

    Args:
        args: the script's flags (its Args dataclass, as parsed).
        command_line: what Run.cli parsed (None: a main called from Python, no flag named).

    Raises:
        FlagError: a flag, an env id or a checkpoint the command line names that cannot be used.
    """

    cli = staticmethod(cli.run)  # a script's entry point: Run.cli(main, Args, __doc__)
    rank, world_size, is_main = 0, 1, True
    ENVS_FLAG = "num_envs"  # the flag of the envs this process steps
    SAVED_ON = (WorkerError, TimeoutError)  # the failures after which the last boundary kept is saved

    def __init__(self, args: Any, command_line: CommandLine | None = None):
        self.command_line = command_line or CommandLine.of(args)
        self.script, self.stop = self.command_line.script, self.command_line.stop
        named = self.command_line.named
        self.args, self.checkpoint, self.where, self.notes = flags.to_run_with(args, named, self.script)
        flags.check(self.args, flags.batch_rules(self.args, self.ENVS_FLAG, self.world_size))
        flags.check_env_id(self.args.env_id)  # imports the module of a module:EnvId id
        trained = (self.checkpoint or {}).get("iteration", 0) if self.args.resume is not None else 0
        self.start_iteration = trained + 1
        self.dir: Path | None = None
        self.device = self.envs = self.writer = self.progress = None
        self.probed: dict[str, Any] = {}
        self.state: dict[str, Any] = {}  # what a checkpoint holds
        self.num_iterations = self.steps = 0
        self.last: dict | None = None  # the state of the last boundary kept: what a save writes
        self.last_saved: dict | None = None  # what this run last wrote to checkpoint.pt
        self.saved_iteration: int | None = None  # the iteration checkpoint.pt holds
        self.kept_at, self.keeping = None, 0.0  # when the last boundary was kept, and what that took

    def probe(self, make_env: Callable) -> tuple[Any, Any]:
        """Builds make_env(args, 0, None)() once in a probe process (no env code runs here), resets
        and steps it, and times it if it is one of gymnasium's own: what decides where the envs step.

        Returns:
            Its observation space and action space.

        Raises:
            FlagError: naming --env-id, if it cannot be built or speaks gym's old API.
            FlagError: naming --num-steps, if the rollout's observations would not fit in memory.
        """
        env_fn = make_env(dataclasses.replace(self.args, capture_video=False), 0, None)
        self.probed = flags.probe_env(self.args.env_id, env_fn, self.args.step_timeout or 600.0, self.stop)
        flags.check_rollout(self.args, self.ENVS_FLAG, self.probed["spaces"][0])
        return self.probed["spaces"]

    def load(self, /, **state: Any) -> None:
        """Puts the state the checkpoint holds into these objects (model=agent, ...), through their
        load_state_dict (generators: this rank's state).

        Raises:
            FlagError: the checkpoint holds none of one (torch's generators aside), or one of other sizes.
        """
        names = [name for name in state if name not in TORCH_GENERATORS]
        records.check_fields(self.checkpoint, names, self.where, self.script)
        for name, obj in state.items():
            if name not in self.checkpoint:  # torch's own generators, from a run on another device
                continue
            if isinstance(obj, np.random.Generator):
                obj.bit_generator.state = self.checkpoint[name][self.rank]
            elif isinstance(obj, torch.Generator):
                obj.set_state(self.checkpoint[name][self.rank])
            else:
                try:
                    obj.load_state_dict(self.checkpoint[name])
                except (RuntimeError, ValueError, KeyError, TypeError) as exc:
                    what = "model" if isinstance(obj, torch.nn.Module) else type(obj).__name__
                    why = " ".join(str(exc).split()).removeprefix("Error(s) in loading state_dict for ")
                    fits = f"does not fit this run's {what} ({why[:300]}): another env, or other sizes?"
                    raise FlagError(f"{self.where} {fits}") from None

    @contextlib.contextmanager
    def start(self, device: torch.device, num_iterations: int, steps: int, state: dict) -> Iterator[Any]:
        """The run, from its folder to its closing line, around the block: a stop, an env failure
        (or, under torchrun, a lost rank) saves the state of the last boundary kept; then
        summary.json and the closing line, and the envs are closed.

        Args:
            device: where the model trains.
            num_iterations: the iterations of the whole run.
            steps: the global steps of each.
            state: what a checkpoint holds and a resume puts back: objects with state_dict() and
                load_state_dict() (model, optimizer, normalizers) and numpy or torch generators (every
                rank's). Whatever else the loop carries over a stop goes here too; torch's own
                generators (dropout, torch.randn) are kept without asking.

        Yields:
            The TensorBoard writer (a silent one on ranks other than 0).

        Raises:
            FlagError: a checkpoint that does not fit `state` or these ranks.
            Finished: nothing left to do.
        """
        state = {**state, "torch_rng": torch.default_generator}
        if device.type == "cuda":
            torch.cuda.init()  # (default_generators is empty until then)
            state["torch_cuda_rng"] = torch.cuda.default_generators[torch.cuda.current_device()]
        self.device, self.num_iterations, self.steps, self.state = device, num_iterations, steps, state
        earlier = self._resume() if self.args.resume is not None else {}
        if self.is_main and self.args.resume is None:
            self.dir = records.make_run_dir(self.args, self.command_line, steps, self.world_size)
        first, recent = (self.start_iteration - 1) * steps, (self.checkpoint or {}).get("recent_returns", [])
        self.progress = progress.Progress(num_iterations * steps, first, self.is_main, recent, earlier)
        self.writer = progress.open_writer(self.dir, self.args, first) if self.is_main else progress.NoWriter()
        status = "failed"
        try:
            yield self.writer
            status = "done"
        except (Stopped, *self.SAVED_ON) as exc:
            # a scheduler signals every process: an env (or a rank) may fail before the signal comes here
            stopped = exc if isinstance(exc, Stopped) else None
            if stopped is None and self.stop.wait(SIGNAL_LAG):
                stopped = Stopped(self.stop.signum)
            status = f"stopped by {stopped}" if stopped else "failed"
            if self.is_main and self.last is not None and self.last_saved is not self.last:
                try:
                    self.save("saving")
                except RunError as error:  # a full disk: one line, and the previous checkpoint kept
                    print(f"{self.script}: error: {error}", file=sys.stderr, flush=True)
            if stopped is None or stopped is exc:
                raise
            raise stopped from None
        finally:
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
        self.load(**self.state)  # (a finished run's checkpoint need not fit: nothing is loaded above)
        planned = checkpoint["args"].get("total_timesteps", total)
        if self.is_main and planned // self.steps != self.num_iterations:
            for name, value in flags.schedules(self.args).items():
                print(
                    f"{self.script}: --total-timesteps {total} moves the end of {flags.flag(name)}'s schedule (made "
                    f"for {planned} steps): {flags.flag(value)} goes on from {1.0 - done / self.num_iterations:.2f} x "
                    f"its value down to 0 at step {self.num_iterations * self.steps}",
                    flush=True,
                )
        if not self.is_main:
            return {}
        records.hold(self.dir / records.LOCK)
        try:
            records.write_args(self.dir, self.args, self.command_line, self.steps, self.world_size, checkpoint)
            # a kill from now on leaves it running, not as it ended before
            records.write_json(self.dir / "summary.json", {**earlier, "status": "running"})
        except OSError as exc:  # a full disk names no file: say where
            raise RunError(f"cannot write into {self.dir} ({exc.strerror}): a resumed run goes on there") from None
        return earlier

    def make_envs(self, make_env: Callable, num_envs: int, seed: int, groups: int = 1) -> tuple[SubprocVecEnv, Any]:
        """Builds make_env(args, i, dir) for i < num_envs in a SubprocVecEnv laid out as the probe
        decided (or --num-workers says), its workers in `groups` groups (SubprocVecEnv's), and
        prints the start line. Inside `start` only: the envs write into the run's folder (videos)
        and are closed as the run ends.

        Returns:
            The envs.
            The observations to act on first: the envs' as the checkpoint left them, or those of a
            reset seeding env i with seed + i (after a stop, seeds no earlier part of the run used).
        """
        if self.progress is None:
            raise RuntimeError("run.make_envs is called inside `with run.start(...)`: the envs close with the run")
        envs, note = self._build_envs(make_env, num_envs, self.args.num_workers, self.stop, groups)
        first_seed = seed + self.world_size * (self.start_iteration - 1) * num_envs
        next_obs, why = self._load_env_states(envs) if self.args.resume is not None else (None, "")
        if next_obs is None:
            next_obs = envs.reset(seed=first_seed)[0]
        line = f"{self.args.env_id}, {envs.placement}, {self.device}{note(first_seed)}"
        if self.args.resume is not None:
            line += f"; resuming from iteration {self.start_iteration - 1} (step {self.progress.first_step}), "
            line += f"the envs in fresh episodes ({why})" if why else "the envs as they were"
        if self.is_main:
            print(f"{self.script}: {'; '.join([line, *self.notes])}; results in {self.dir}", flush=True)
        return envs, next_obs

    def _build_envs(self, make_env: Callable, num_envs: int, num_workers: int | None, interrupt: Any, groups: int):
        """The envs, and what the start line says of the ranks (nothing, with one: ranks.py's)."""
        env_fns = [make_env(self.args, i, self.dir) for i in range(num_envs)]
        bounds = {"max_restarts": self.args.max_restarts, "step_timeout": self.args.step_timeout}
        placed = {"num_workers": num_workers, "groups": groups, "probe": self.probed}
        self.envs = SubprocVecEnv(env_fns, interrupt=interrupt, **placed, **bounds)
        return self.envs, lambda first_seed: ""

    def _load_env_states(self, envs: SubprocVecEnv) -> tuple[Any, str]:
        """The observations of the envs as the checkpoint left them, or None and why not."""
        saved = self.checkpoint.get("env_states", [None] * self.world_size)[self.rank]
        if saved is None:
            why = "an env class of yours says `pickle_state = True` if its state is data"
            return None, f"its envs could not be saved: {why}"
        if isinstance(saved, bytes):
            return None, "an older version pickled its env states: they are not loaded, as no pickle is"
        try:
            return envs.load_env_states(saved), ""
        except ValueError as exc:
            return None, f"its env states do not fit these envs: {records.one_line(exc)}"

    def iterations(self) -> Iterator[int]:
        """Yields the iterations left to do (from 1).

        Before each and after the last, the state at that boundary is kept (a stop saves it) where
        KEEP_EVERY allows or a save is due: every --checkpoint-interval iterations, and at the end
        (with --save-model, also as <exp-name>.cleanrl_model).
        """
        for iteration in range(self.start_iteration, self.num_iterations + 1):
            self._boundary(iteration - 1)
            yield iteration
        self._boundary(self.num_iterations)

    def _due(self, done: int) -> bool:
        """Whether a save is due after `done` iterations: the last, or a --checkpoint-interval's."""
        interval = self.args.checkpoint_interval
        return done == self.num_iterations or (done >= self.start_iteration and interval and done % interval == 0)

    def _keep_due(self) -> bool:
        """Whether KEEP_EVERY times what keeping the last boundary took has passed since."""
        return self.kept_at is None or time.perf_counter() - self.kept_at >= KEEP_EVERY * self.keeping

    def _boundary(self, done: int) -> None:
        if self._due(done) or self._keep_due():
            self._keep(done, [self._rank_state()])

    def _rank_state(self) -> tuple[dict, Any]:
        """What each rank keeps of its own: its generators' states and its envs'."""
        generators = {name: _rng_state(obj) for name, obj in self.state.items() if isinstance(obj, RNG_TYPES)}
        return generators, self.envs.save_env_states() if self.envs is not None else None

    def _keep(self, done: int, all_ranks: list[tuple[dict, Any]]) -> None:
        """Keeps the state after `done` iterations (all_ranks: each rank's own); saves it if due."""
        started = time.perf_counter()
        if self.is_main:
            self.last = {"script": self.script, "args": dataclasses.asdict(self.args), "world_size": self.world_size}
            self.last |= {"iteration": done, "global_step": done * self.steps}
            self.last["env_states"] = [envs for _, envs in all_ranks]
            self.last |= {"recent_returns": [*self.progress.recent_returns]}
            for name, obj in self.state.items():
                is_rng = isinstance(obj, RNG_TYPES)
                self.last[name] = [g[name] for g, _ in all_ranks] if is_rng else records.copy_state(obj.state_dict())
        # The first keeping pays for what is done once, so it is not timed: the next one is
        self.keeping = time.perf_counter() - started if self.kept_at is not None else 0.0
        self.kept_at = time.perf_counter()
        if self.is_main and self._due(done):
            self.save()
        if self.is_main and done == self.num_iterations and self.args.save_model:
            path = self.dir / f"{self.args.exp_name}.cleanrl_model"  # CleanRL's file: the same state
            records.save_checkpoint(path, self.last)
            print(f"model saved to {path}", flush=True)

    def save(self, status: str = "running") -> None:
        """Writes the state of the last boundary kept to checkpoint.pt, and summary.json."""
        records.save_checkpoint(self.dir / "checkpoint.pt", self.last)
        self.last_saved, self.saved_iteration = self.last, self.last["iteration"]
        self._summarize(status)

    def stop_requested(self) -> bool:
        """Whether a stop signal came (the rollout may end early: stop_if_asked then stops)."""
        return self.stop.signum is not None

    def stop_if_asked(self) -> None:
        """A safe point: raises Stopped if a stop signal came (the run then saves the last boundary
        kept, and ends)."""
        self.stop.check()

    def log(self, global_step: int, episodes: list[tuple], timings: dict[str, float]) -> None:
        """Logs to TensorBoard and prints the progress line (every 2 s).

        Args:
            global_step: the steps done.
            episodes: each episode finished this iteration: (global step, raw return, length).
            timings: seconds of this iteration by part ({"env": ..., "update": ...}): perf/*_seconds.

        Raises:
            RunError: a weight of a model in the state became NaN or infinite.
        """
        self._check_weights(global_step)
        self.progress.log(self.writer, global_step, episodes, self.envs.restarts, timings)

    def _check_weights(self, global_step: int) -> None:
        for name, obj in self.state.items():
            if isinstance(obj, torch.nn.Module) and not all(p.isfinite().all() for p in obj.parameters()):
                raise RunError(
                    f"iteration {global_step // self.steps} (global_step {global_step}): the weights of {name} "
                    "became NaN/Inf; look for NaN/Inf in observations or rewards, or lower --learning-rate"
                )

    def evaluate(self, act: Callable[[Any], Any], make_env: Callable) -> list[float]:
        """Plays --eval-episodes whole episodes (whole games, for Atari) on env 0 of make_env, where
        the probe decided it steps, acting with act(obs) on a batch of one. A stop ends it early: the
        episodes played are its result.

        Returns:
            Their raw returns, also printed and, in a run, logged as eval/episodic_return.
        """
        if not self.is_main:
            return []
        args = self.args if self.args.eval_checkpoint else dataclasses.replace(self.args, capture_video=False)
        env_fn = make_env(args, 0, Path(args.eval_checkpoint or self.dir / "checkpoint.pt").parent / "eval")
        returns, stopped = [], ""
        try:
            with SubprocVecEnv([env_fn], num_workers=args.num_workers, interrupt=self.stop, probe=self.probed) as envs:
                obs, _ = envs.reset(seed=args.seed + 10_000)  # seeds training never used
                while len(returns) < args.eval_episodes:
                    obs, _, _, _, infos = envs.step(act(obs))
                    # (not when only a life ended)
                    if infos.get("final_info", {}).get("_episode", [False])[0]:
                        returns.append(float(infos["final_info"]["episode"]["r"][0]))
        except Stopped as exc:
            if self.args.eval_checkpoint:  # evaluating was all this process did: it stopped
                raise
            stopped = f" (stopped by {exc} after {len(returns)} of {args.eval_episodes})"
        for idx, episodic_return in enumerate(returns if self.writer is not None else []):
            self.writer.add_scalar("eval/episodic_return", episodic_return, idx)
        mean = f"{sum(returns) / len(returns):.2f}" if returns else "n/a"
        shown = ", ".join(f"{r:.6g}" for r in returns)
        print(f"eval: mean return {mean} over {len(returns)} episodes{stopped}: [{shown}]", flush=True)
        return returns

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
        """Closes the envs; rank 0 writes summary.json and leaves the closing line for Run.cli."""
        if self.envs is not None:
            self.envs.__exit__(*sys.exc_info())  # (with the failure that ends the run, if one does)
        with contextlib.suppress(OSError):  # a full or read-only disk: the run's own line says so
            self.writer.close()
        if not self.is_main:
            return
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
            line += f"; {how}: {again} {self.command_line.argv[0]} {flag} {summary['checkpoint']}"
            line += f" --env-id {self.args.env_id}" if ":" in self.args.env_id else ""  # it imports the module
        with contextlib.suppress(OSError):  # the lock itself ends with the process
            (self.dir / records.LOCK).unlink(missing_ok=True)
        self.command_line.closing = (line, shown != "done")


def _rng_state(generator: Any) -> Any:
    return generator.bit_generator.state if isinstance(generator, np.random.Generator) else generator.get_state()
