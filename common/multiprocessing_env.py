"""SubprocVecEnv: a gymnasium ``VectorEnv`` whose envs step in Pipe-connected worker processes, or in the calling
process when that is faster.

    envs = SubprocVecEnv([lambda: gym.make("CartPole-v1") for _ in range(8)])
    obs, infos = envs.reset(seed=1)                        # env i is seeded with 1 + i
    obs, rewards, terminations, truncations, infos = envs.step(envs.action_space.sample())
    envs.close()

Results equal ``gymnasium.vector.SyncVectorEnv(env_fns, autoreset_mode=AutoresetMode.SAME_STEP)``:
a finished env is reset within the same step, its last observation and info are returned in
``infos["final_obs"]`` / ``infos["final_info"]`` (masks ``infos["_final_obs"]`` / ``infos["_final_info"]``).

Layout: each worker process steps ``envs_per_worker`` envs per round trip. Observations, actions, rewards and flags
live in one shared-memory block that workers write in place; the pipe carries a one-byte command and a one-byte
reply, plus pickled infos only when an env reports any (or the observation space cannot live in shared memory). By
default the layout is decided (common/vecenv/layout.py): gymnasium's own pure-Python envs step in the calling
process where a process round trip would cost more than the workers save (8 CartPoles on 2 cores), with the same
results, API and errors; every other env steps in workers, where it can neither hang nor kill the caller
(``num_workers=0`` asks for the calling process; it cannot bound or restart a step, so ``step_timeout`` and
``max_restarts`` need workers).

Failures: any failure in a worker (an exception in env code, a crash, a kill) reaches the caller as ``WorkerError``
naming the env, the command and the remote traceback. Every wait on a worker is bounded: by ``step_timeout`` when
it is set, else by ``max_wait`` (600 s: long enough for a slow simulator to start), after which a
``WorkerTimeout`` (both ``TimeoutError`` and ``multiprocessing.TimeoutError``) names the envs and the command. A
worker's death is seen from its process, even while a helper process its env started keeps the pipe open. Workers
lead their own process group: helper processes their envs fork or exec end with them (unless a helper moves to
another process group or session). Workers exit within a second or so of the trainer's death (SIGKILL included),
even while inside env code, as long as that code releases the GIL now and then (a sleeping or waiting simulator
does; C code that holds the GIL for minutes delays it until it returns), and remove the folder multiprocessing's
forkserver left in the temp dir.

Its parts are private to it, in common/vecenv/ (its __init__ lists them).
"""

from __future__ import annotations

import enum
import logging
import pickle
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.error import AlreadyPendingCallError, ClosedEnvironmentError, NoAsyncCallError
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import concatenate, create_empty_array, iterate

from common.vecenv import layout, process_control, shared_block
from common.vecenv.arguments import check_arguments, check_layout, check_reset_mask
from common.vecenv.batching import BatchedSpace, add_info
from common.vecenv.env_hosts import InProcessPool, WorkerError, WorkerPool, WorkerTimeout, first_failure
from common.vecenv.worker import Command, space_from_key

__all__ = ["SubprocVecEnv", "WorkerError", "WorkerTimeout", "check_layout"]

_log = logging.getLogger(__name__)
DEFAULT_SPIN = 0.02  # seconds a worker polls for its next command, while commands come within it (worker_spin)


class AsyncState(enum.Enum):
    """What a SubprocVecEnv waits for: nothing, or the replies to a reset_async or a step_async."""

    DEFAULT = "default"
    WAITING_RESET = "reset"
    WAITING_STEP = "step"


class SubprocVecEnv(VectorEnv):
    """Vector env stepping its envs in worker processes (or in this one); same results as
    SyncVectorEnv(autoreset_mode=SAME_STEP).

    Args:
        env_fns: zero-argument callables that build one env each (lambdas and closures are fine).
        num_workers: worker processes; 0 steps every env in this process. None: chosen (common/vecenv/layout.py):
            this process only for gymnasium's own pure-Python envs, and only where workers would not save more
            than their round trip costs; else one worker per CPU core (at most one per env). Where and why are in
            `placement`, `layout` and `step_seconds`. Workers are used whenever `step_timeout` or `max_restarts` is
            set.
        envs_per_worker: envs stepped by each worker per round trip (instead of num_workers).
        context: multiprocessing start method, "forkserver" (default where available), "spawn" or "fork".
        shared_memory: keep observations in shared memory (no pickling). Spaces that cannot live there
            (Text, Graph, ...) go over the pipe either way.
        max_restarts: times a crashed, raising or stuck worker may be replaced (its envs' episodes end truncated).
        step_timeout: seconds a step may take before its worker counts as stuck; when set, it bounds every other
            wait on a worker too (building, reset, call, get_attr, set_attr, render, a restart's rebuild).
        max_wait: seconds any wait on a worker may last when step_timeout is None (600: long enough for a slow
            simulator to start, finite so that nothing hangs).
        close_timeout: seconds `close()` waits for workers to exit before killing them.
        interrupt: ends waits early: an object whose `fileno()` turns readable when the caller wants every wait on
            the workers (building, the layout probe, reset, step, ...) to end, and whose `check()` then raises the
            caller's exception (the scripts pass their stop request, common/run/stops.py). A wait it ends leaves the
            call pending; close() still ends the workers.
        step_trace: called in each worker after each step of its envs with the step's start and end
            (time.monotonic()): for benchmarks that time the workers (it must pickle; none in this process).
        worker_spin: the longest a worker keeps polling for its next command (yielding the CPU) before it
            sleeps. While the trainer's commands come within it (a rollout), the worker never sleeps: no wake-up
            per step, and its caches stay warm (Breakout: 11-15% less time per env step, where_time_goes.py);
            after a command that came later (an update phase), it polls only 300 us (or this, if shorter) until
            one comes within it again.
            0 sleeps at once. None: 20 ms, or 0 when workers outnumber the usable cores (then a polling worker
            takes CPU time from one with work to do).
    """

    observation_space = BatchedSpace("single_observation_space")
    action_space = BatchedSpace("single_action_space")

    def __init__(
        self,
        env_fns: Sequence[Callable[[], gym.Env]],
        *,
        num_workers: int | None = None,
        envs_per_worker: int | None = None,
        context: str | None = None,
        shared_memory: bool = True,
        max_restarts: int = 0,
        step_timeout: float | None = None,
        max_wait: float = 600.0,
        close_timeout: float = 5.0,
        worker_spin: float | None = None,
        interrupt: Any = None,
        step_trace: Callable[[float, float], None] | None = None,
    ):
        super().__init__()
        env_fns = list(env_fns)
        seconds = {"step_timeout": step_timeout, "max_wait": max_wait, "close_timeout": close_timeout}
        check_arguments(env_fns, num_workers, envs_per_worker, context, max_restarts, worker_spin, seconds)
        self.num_envs = n = len(env_fns)
        self.max_restarts, self.restarts, self.step_timeout = max_restarts, 0, step_timeout
        self.max_wait, self.close_timeout = max_wait, close_timeout
        self._bound = step_timeout if step_timeout is not None else max_wait  # of every wait on a worker
        self._state = AsyncState.DEFAULT
        self._failed: WorkerError | None = None  # an earlier failure leaves this vec env unusable
        self._closing_on_exception = False
        self._pool: InProcessPool | WorkerPool | None = None
        self._reset_workers: list[int] = []  # the workers a pending reset went to
        self._last_obs: Any = None
        self._observation_space = self._action_space = None  # batched: made when first asked for (BatchedSpace)
        self._space_keys: tuple = ()  # env 0's, which every env's must equal

        # Layout: asked for, workers when steps must be bounded or restarted, else decided (common/vecenv/layout.py)
        context = context or process_control.default_context()
        if num_workers != 0:
            process_control.check_main_guard(context)
        cores = process_control.cores()
        workers, figures = min(cores, n) if num_workers is None else min(num_workers, n), {}
        if envs_per_worker is not None:
            workers = -(-n // envs_per_worker)
        elif num_workers is None and step_timeout is None and not max_restarts:
            workers, figures = layout.choose(env_fns, cores, self._bound, interrupt)
        self.envs_per_worker = envs_per_worker or (-(-n // workers) if workers else n)
        slices = [slice(lo, min(lo + self.envs_per_worker, n)) for lo in range(0, n, self.envs_per_worker)]
        self.num_workers = len(slices) if workers else 0
        default_spin = DEFAULT_SPIN if self.num_workers <= cores else 0.0  # a polling worker would take a busy core
        self.worker_spin = (default_spin if worker_spin is None else worker_spin) if workers else 0.0
        self.step_seconds = figures.get("step")
        self.layout = layout.describe(n, self.num_workers, figures)
        self.placement = self.layout.split(" (")[0]  # "8 envs in this process", "8 envs in 2 worker processes"

        try:
            if workers:
                self._pool = WorkerPool(env_fns, slices, context, self.worker_spin, close_timeout, interrupt,
                                        step_trace)  # fmt: skip
            else:
                self._pool = InProcessPool(env_fns)
            self._set_spaces(*self._pool.hello(self._bound), shared_memory)
        except BaseException:
            self.close(timeout=1.0)
            raise

    # ----------------------------------------------------------------------------------------------- reset
    def reset(self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None):
        """Resets every env (or those in `options["reset_mask"]`); an int seed gives env i the seed `seed + i`."""
        self.reset_async(seed=seed, options=options)
        return self.reset_wait()

    def reset_async(self, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None) -> None:
        """Sends the resets and returns at once (see reset)."""
        self._check_usable("reset_async")
        if seed is None:
            seed = [None] * self.num_envs
        elif isinstance(seed, int):
            seed = [seed + i for i in range(self.num_envs)]
        if len(seed) != self.num_envs:
            raise ValueError(f"reset(seed=...) got a list of {len(seed)} seeds for {self.num_envs} envs")
        mask = np.ones(self.num_envs, dtype=np.bool_)
        if options is not None and "reset_mask" in options:
            options = dict(options)
            mask = check_reset_mask(options.pop("reset_mask"), self.num_envs)
        self._reset_workers = [w for w, sl in enumerate(self._pool.slices) if mask[sl].any()]
        self._state = AsyncState.WAITING_RESET
        for w in self._reset_workers:
            sl = self._pool.slices[w]
            self._pool.send(w, Command.RESET, (seed[sl], options, mask[sl]))

    def reset_wait(self, timeout: float | None = None):
        """Waits for the resets sent by reset_async; after `timeout` seconds (default: the bound of every wait) a
        WorkerTimeout names the envs that did not answer."""
        self._check_waiting(AsyncState.WAITING_RESET)
        failures = self._pool.collect(self._bound if timeout is None else timeout)
        if failures:
            self._raise(failures)
        self._state = AsyncState.DEFAULT
        infos: dict[str, Any] = {}
        for w in self._reset_workers:
            obs_list, env_infos = self._pool.replies.pop(w)
            for k, info in env_infos:
                infos = self._add_info(infos, info, self._pool.slices[w].start + k)
            self._store_obs(w, obs_list)
        self._last_obs = self._observations()
        return self._last_obs, infos

    # ------------------------------------------------------------------------------------------------ step
    def step(self, actions):
        self.step_async(actions)
        return self.step_wait()

    def step_async(self, actions) -> None:
        """Sends one action per env to the workers and returns at once."""
        self._check_usable("step_async")
        act = self._views["actions"]
        if self._actions_in_shm:
            actions = np.asarray(actions)
            if actions.ndim == 0:
                raise TypeError(f"step() needs one action per env ({self.num_envs}), got the scalar {actions}")
            if actions.shape[:1] != (self.num_envs,):
                raise ValueError(f"step() got {len(actions)} actions for {self.num_envs} envs")
        else:
            actions = list(iterate(self.action_space, actions))
            if len(actions) != self.num_envs:
                raise ValueError(f"step() got {len(actions)} actions for {self.num_envs} envs")
        # Same dtype and shape: written once into shared memory. Anything else goes pickled, exactly as given.
        in_shm = self._actions_in_shm and actions.dtype == act.dtype and actions.shape == act.shape
        if in_shm:
            act[...] = actions
        self._state = AsyncState.WAITING_STEP
        for w, sl in enumerate(self._pool.slices):
            self._pool.send(w, Command.STEP, None if in_shm else list(actions[sl]))

    def step_wait(self, timeout: float | None = None):
        """Waits for the step sent by `step_async`. After `timeout` seconds (default: `step_timeout`, else
        `max_wait`) a WorkerTimeout names the slow envs, unless the restart budget allows replacing their workers.

        A crashed, raising or stuck worker within the `max_restarts` budget is replaced and its envs reset:
        their step reports truncated=True, reward 0, `final_obs` = the last observation returned, and
        `infos["worker_restart"]` (and `final_info["worker_restart"]`) True.
        """
        self._check_waiting(AsyncState.WAITING_STEP)
        failures = self._pool.collect(self._bound if timeout is None else timeout)
        if failures and not (self.max_restarts and self.restarts + len(failures) <= self.max_restarts):
            self._raise(failures)
        restarted = self._restart(failures) if failures else {}
        self._state = AsyncState.DEFAULT
        last_obs = list(iterate(self.observation_space, self._last_obs)) if restarted else None
        infos: dict[str, Any] = {}
        for w, sl in enumerate(self._pool.slices):
            if w in restarted:
                infos = self._report_restart(w, restarted[w], last_obs, infos)
                continue
            reply = self._pool.replies.pop(w)
            if reply is None:
                continue
            obs_list, extras = reply
            for k, final, info in extras:
                if final is not None:
                    infos = self._add_info(infos, {"final_obs": final[0], "final_info": final[1]}, sl.start + k)
                infos = self._add_info(infos, info, sl.start + k)
            self._store_obs(w, obs_list)
        self._last_obs = self._observations()
        views = self._views
        return self._last_obs, views["rewards"].copy(), views["terminations"].copy(), views["truncations"].copy(), infos

    # ---------------------------------------------------------------------------------- call, attributes, render
    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Calls `name(*args, **kwargs)` on every env (or reads it, if not callable); one result per env."""
        self._check_usable("call")
        for w in range(len(self._pool.slices)):
            self._pool.send(w, Command.CALL, (name, args, kwargs))
        self._collect_or_raise()
        return tuple(result for w in range(len(self._pool.slices)) for result in self._pool.replies.pop(w))

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """An attribute of every env, as SyncVectorEnv.get_attr (a callable attribute is called)."""
        return self.call(name)

    def set_attr(self, name: str, values: list[Any] | tuple[Any, ...] | Any) -> None:
        """Sets attribute `name` on every env: one value each from a list/tuple, else the same value for all."""
        self._check_usable("set_attr")
        if not isinstance(values, (list, tuple)):
            values = [values] * self.num_envs
        if len(values) != self.num_envs:
            raise ValueError(f"set_attr() got {len(values)} values for {self.num_envs} envs")
        for w, sl in enumerate(self._pool.slices):
            self._pool.send(w, Command.SET_ATTR, (name, list(values[sl])))
        self._collect_or_raise()
        self._pool.replies.clear()

    def save_env_states(self) -> bytes | None:
        """Every env's whole state, and the last observations, as bytes for a checkpoint; None if some env cannot be
        saved (common/vecenv/env_state.py says which can). Runs env code (pickling), bounded like any command."""
        self._check_usable("save_env_states")
        for w in range(len(self._pool.slices)):
            self._pool.send(w, Command.SAVE_STATES)
        self._collect_or_raise()
        states = [state for w in range(len(self._pool.slices)) for state in self._pool.replies.pop(w)]
        if any(state is None for state in states):
            return None
        return pickle.dumps({"envs": states, "obs": self._last_obs, "env_obs": self._env_obs}, pickle.HIGHEST_PROTOCOL)

    def load_env_states(self, saved: bytes) -> Any:
        """Puts back the envs `save_env_states` saved, in the state they were; returns their last observations (the
        ones to act on next). Unpickles: load only what you saved."""
        self._check_usable("load_env_states")
        data = pickle.loads(saved)
        if len(data["envs"]) != self.num_envs:
            raise ValueError(f"load_env_states() got the states of {len(data['envs'])} envs for {self.num_envs}")
        for w, sl in enumerate(self._pool.slices):
            self._pool.send(w, Command.LOAD_STATES, data["envs"][sl])
        self._collect_or_raise()
        self._pool.replies.clear()
        self._last_obs, self._env_obs = data["obs"], data["env_obs"]
        return self._last_obs

    def render(self) -> tuple[Any, ...]:
        return self.call("render")

    @property
    def np_random_seed(self) -> tuple[int, ...]:
        return self.get_attr("np_random_seed")

    @property
    def np_random(self) -> tuple[np.random.Generator, ...]:
        return self.get_attr("np_random")

    @property
    def worker_pids(self) -> list[int]:
        """Process ids of the live workers, in worker order (none in the in-process layout)."""
        return list(self._pool.pids) if isinstance(self._pool, WorkerPool) else []

    # ----------------------------------------------------------------------------------------------- close
    def close_extras(self, timeout: float | None = None, terminate: bool = False, **kwargs: Any) -> None:
        """Stops every worker: asks politely, waits up to `timeout` (default `close_timeout`; 0 with terminate),
        then kills them and the processes their envs started. Replies under way (a pending step or reset, or a
        call an interrupt ended) get up to that long to arrive, so that no worker is left writing one (a pending step
        or reset with a warning, unless the vec env is closed by leaving a `with` block on an exception)."""
        timeout = 0.0 if terminate else self.close_timeout if timeout is None else timeout
        if self._pool is None:
            return
        if self._state is not AsyncState.DEFAULT and not self._closing_on_exception:
            warnings.warn(f"Calling `close` while waiting for a pending call to `{self._state.value}` to complete.",
                          UserWarning, stacklevel=3)  # fmt: skip
        self._pool.drain(timeout)
        self._state = AsyncState.DEFAULT
        self._pool.close(timeout)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        self._closing_on_exception = exc_info[0] is not None
        self.close()

    # ---------------------------------------------------------------------------------------------- private
    def _set_spaces(self, keys: list, first: tuple | None, metadata: dict, render_mode: str | None,
                    shared_memory: bool) -> None:  # fmt: skip
        """Spaces and metadata from env 0, every env checked against them; then the shared block, in every worker."""
        self._space_keys = keys[0]
        first = first or tuple(space_from_key(key) for key in keys[0])
        self.single_observation_space, self.single_action_space = first
        self._check_spaces(0, keys)
        self.metadata = dict(metadata, autoreset_mode=AutoresetMode.SAME_STEP)
        self.render_mode = render_mode
        fields, self._obs_in_shm, self._actions_in_shm = shared_block.block_fields(
            self.num_envs, self.single_observation_space, self.single_action_space, shared_memory
        )
        placed, size = shared_block.layout(fields)
        self._views = shared_block.views(self._pool.attach(size, placed, self._obs_in_shm, self._bound), placed)
        self._obs_views = [view for name, view in self._views.items() if name.startswith("obs")]
        self._env_obs: list[Any] = [None] * self.num_envs  # observations that came over the pipe

    def _check_spaces(self, first: int, keys: list) -> None:
        for i, key in enumerate(keys, start=first):
            if key != self._space_keys:
                obs_space, act_space = (space_from_key(k) for k in key)
                raise RuntimeError(
                    f"env {i} has observation space {obs_space} and action space {act_space}, but env 0 has "
                    f"{self.single_observation_space} and {self.single_action_space}; all envs must match"
                )

    def _check_usable(self, name: str) -> None:
        if self.closed:
            raise ClosedEnvironmentError(f"SubprocVecEnv.{name}() was called after close(); build a new one")
        if self._failed is not None:
            raise WorkerError(
                f"SubprocVecEnv.{name}() after an earlier failure; close() it and build a new one. "
                f"The failure was: {self._failed}",
                self._failed.env_indices,
                name,
                self._failed.exitcode,
            )
        if self._state is not AsyncState.DEFAULT:
            waiting = self._state.value
            raise AlreadyPendingCallError(
                f"Calling `{name}` while waiting for a pending call to `{waiting}` to complete; call "
                f"{waiting}_wait() first",
                waiting,
            )

    def _check_waiting(self, state: AsyncState) -> None:
        if self.closed:
            raise ClosedEnvironmentError(f"SubprocVecEnv.{state.value}_wait() was called after close(); build anew")
        if self._state is not state:
            raise NoAsyncCallError(
                f"Calling `{state.value}_wait` without any prior call to `{state.value}_async`.", state.value
            )

    def _collect_or_raise(self) -> None:
        failures = self._pool.collect(self._bound)
        if failures:
            self._raise(failures)

    def _raise(self, failures: dict[int, Exception]) -> None:
        """Raises the failure of the lowest env index, naming the others. A worker that failed leaves this vec env
        unusable; one that was only slow can still be waited for, if nothing else failed."""
        ordered = sorted(failures.values(), key=lambda e: e.env_indices)
        worker_errors = [e for e in ordered if isinstance(e, WorkerError)]
        error = first_failure(failures)
        if worker_errors:
            self._failed, self._state = worker_errors[0], AsyncState.DEFAULT
        elif self._state is not AsyncState.DEFAULT:
            error.args = (f"{error.args[0]}; call {self._state.value}_wait() again to keep waiting, or close()",)
        raise error

    def _restart(self, failures: dict[int, Exception]) -> dict[int, tuple]:
        """Replaces the failed workers with fresh ones, together, and resets their envs; returns each one's reset reply.
        Each restart says so in one line (logging). A rebuild that fails, or does not answer within the bound, uses
        up another restart, until the budget is spent."""
        replies: dict[int, tuple] = {}
        while failures:
            for w, error in sorted(failures.items()):
                self.restarts += 1
                _log.warning(f"SubprocVecEnv: restarting worker {w} (envs {self._pool.envs_of(w)}), restart "
                             f"{self.restarts} of {self.max_restarts}: {str(error).splitlines()[0]}")  # fmt: skip
            rebuilt, failures = self._pool.restart(sorted(failures), self._bound, self._check_spaces)
            replies.update(rebuilt)
            if failures and self.restarts + len(failures) > self.max_restarts:
                self._raise(failures)
        return replies

    def _report_restart(self, w: int, reply: tuple, last_obs: list, infos: dict) -> dict:
        """A restarted worker's envs: truncated, reward 0, the last observation as final_obs, worker_restart."""
        obs_list, reset_infos = reply
        sl = self._pool.slices[w]
        views = self._views
        for i in range(sl.start, sl.stop):
            views["rewards"][i], views["terminations"][i], views["truncations"][i] = 0.0, False, True
            infos = self._add_info(infos, {"final_obs": last_obs[i], "final_info": {"worker_restart": True}}, i)
            infos = self._add_info(infos, dict(reset_infos[i - sl.start][1], worker_restart=True), i)
        self._store_obs(w, obs_list)
        return infos

    def _add_info(self, vector_infos: dict[str, Any], env_info: dict[str, Any], env_num: int) -> dict[str, Any]:
        return add_info(vector_infos, env_info, env_num, self.num_envs)

    def _store_obs(self, w: int, obs_list: list | None) -> None:
        """Observations that came over the pipe (spaces shared memory cannot hold); None where none was sent."""
        for k, obs in enumerate(obs_list or []):
            if obs is not None:
                self._env_obs[self._pool.slices[w].start + k] = obs

    def _observations(self):
        if self._obs_in_shm:
            return shared_block.unflatten(self.single_observation_space, (view.copy() for view in self._obs_views))
        # A fresh batch each time (for custom spaces, such as Text or Graph, a tuple of what the envs sent)
        out = create_empty_array(self.single_observation_space, n=self.num_envs, fn=np.empty)
        return concatenate(self.single_observation_space, self._env_obs, out)
