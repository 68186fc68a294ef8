"""SubprocVecEnv: a gymnasium VectorEnv whose envs step in Pipe-connected worker processes (or in
the calling process, where that is safe and faster), with SyncVectorEnv(autoreset_mode=SAME_STEP)'s
results. Its parts are in vecenv/ (vecenv/worker.py: the protocol, and the life of a step).

    envs = SubprocVecEnv([lambda: gym.make("CartPole-v1") for _ in range(8)])
    obs, infos = envs.reset(seed=1)  # env i is seeded with 1 + i
    obs, rewards, terminations, truncations, infos = envs.step(envs.action_space.sample())
"""

import copy
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.error import AlreadyPendingCallError, ClosedEnvironmentError, NoAsyncCallError
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.async_vector_env import AsyncState
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array, iterate

from .vecenv import env_state, layout, process_control, shared_block
from .vecenv.errors import WorkerError, WorkerTimeout, check_arguments, check_reset_mask, check_spaces, first_failure
from .vecenv.pools import InProcessPool, WorkerPool
from .vecenv.worker import Command

__all__ = ["SubprocVecEnv", "WorkerError", "WorkerTimeout"]


class SubprocVecEnv(VectorEnv):
    """A finished env is reset within the step, its last observation and info in infos["final_obs"]
    and infos["final_info"]. Observations, actions, rewards and flags live in shared memory. A
    failure in a worker (an exception, a crash, a kill) is a WorkerError naming the env, the command
    and the remote traceback; every wait on a worker is bounded (a WorkerTimeout past it). Workers
    and what their envs start end soon after the trainer dies, SIGKILL included.

    Args:
        env_fns: zero-argument callables that build one env each (lambdas and closures are fine).
        num_workers: worker processes, each stepping an equal share of the envs; 0: every env in
            this process; None: chosen by vecenv/layout.py (`layout` says where and why).
        context: the start method: "forkserver" (default where available), "spawn", "fork".
        shared_memory: keep observations in shared memory where their space allows.
        max_restarts: times a failed or stuck worker may be replaced (its envs' episodes truncated).
        step_timeout: seconds a step may take before its worker counts as stuck; it then bounds
            every wait on a worker. With it or max_restarts, the envs step in workers.
        max_wait: the bound on every wait on a worker when step_timeout is None.
        close_timeout: seconds `close()` waits for workers to exit before killing them.
        worker_spin: seconds a worker polls for its next command before it sleeps, staying on its
            CPU with caches warm through a rollout. None: 20 ms, or 0 when workers outnumber cores.
        interrupt: its `fileno()` turns readable when every wait should end, and its `check()` then
            raises, the call still pending (the scripts pass their stop request).
        probe: what vecenv.layout.probe found of env_fns[-1], if the caller probed it already.
        groups: the workers in this many groups (`groups`, slices of the envs) that step_async and
            step_wait step one at a time, so that one group steps while the caller computes the next
            group's actions; fewer with fewer workers, one if observations travel pickled.

    Raises:
        ValueError: an argument that cannot work (its message names it and what to change).
        WorkerError: an env raised, or its worker died, while building.
        WorkerTimeout: an env took longer than the bound to build.
    """

    def __init__(
        self,
        env_fns: Sequence[Callable[[], gym.Env]],
        *,
        num_workers: int | None = None,
        context: str | None = None,
        shared_memory: bool = True,
        max_restarts: int = 0,
        step_timeout: float | None = None,
        max_wait: float = 600.0,
        close_timeout: float = 5.0,
        worker_spin: float | None = None,
        interrupt: Any = None,
        probe: dict[str, Any] | None = None,
        groups: int = 1,
    ):
        super().__init__()
        env_fns = list(env_fns)
        seconds = {"step_timeout": step_timeout, "max_wait": max_wait, "close_timeout": close_timeout}
        check_arguments(env_fns, num_workers, context, max_restarts, worker_spin, seconds)
        self.num_envs = n = len(env_fns)
        self.max_restarts, self.close_timeout = max_restarts, close_timeout
        self._bound = step_timeout if step_timeout is not None else max_wait
        self._state = AsyncState.DEFAULT
        self._stepping = 0  # the workers whose step is under way, a bit each
        self._failed: Exception | None = None  # an earlier failure leaves this vec env unusable
        self._closing_on_exception = False
        self._pool: InProcessPool | WorkerPool | None = None
        self._reset_workers: list[int] = []  # the workers a pending reset went to
        self._last_obs: Any = None
        self._env_obs: list[Any] = [None] * n  # observations that came over the pipe

        cores = process_control.cores()
        bounded = step_timeout is not None or max_restarts > 0
        probing = {"bound": self._bound, "interrupt": interrupt}
        workers, facts = layout.choose(env_fns, num_workers, bounded, cores, probe, **probing)
        per_worker = -(-n // workers) if workers else n
        slices = [slice(lo, min(lo + per_worker, n)) for lo in range(0, n, per_worker)]
        self.num_workers = len(slices) if workers else 0
        spin = (0.02 if self.num_workers <= cores else 0.0) if worker_spin is None else worker_spin
        self.worker_spin = spin if workers else 0.0
        self.step_seconds = facts.get("step")  # the probe's CPU seconds a step; None: not timed

        try:
            context = context or process_control.default_context()
            if workers:
                self._pool = WorkerPool(env_fns, slices, context, self.worker_spin, close_timeout, interrupt)
            else:
                self._pool = InProcessPool(env_fns, interrupt)
            spaces, metadata, self.render_mode = self._pool.describe_envs(self._bound)
            self.single_observation_space, self.single_action_space = spaces[0]
            check_spaces(spaces, spaces[0])
            self.observation_space = batch_space(spaces[0][0], n)
            self.action_space = batch_space(spaces[0][1], n)
            self.metadata = dict(metadata, autoreset_mode=AutoresetMode.SAME_STEP)
            offsets, size, self._obs_in_shm, self._actions_in_shm = shared_block.layout(n, *spaces[0], shared_memory)
            self._views = shared_block.views(self._pool.attach(size, offsets, self._obs_in_shm, self._bound), offsets)
        except BaseException:
            self.close(timeout=1.0)
            raise
        count = max(1, min(groups, self.num_workers)) if self._obs_in_shm else 1
        bounds = [slices[len(slices) * k // count].start for k in range(count)] + [n]
        self.groups = [slice(lo, hi) for lo, hi in zip(bounds, bounds[1:], strict=False)]
        self._group_of = {}  # a group's (start, stop, step): it, its workers, its rows of the block, a bit per worker
        for g in [*self.groups, slice(0, n)]:
            workers = [w for w, sl in enumerate(slices) if g.start <= sl.start < g.stop]
            rows = {name: view[g] for name, view in self._views.items()}
            self._group_of[g.start, g.stop, g.step] = g, workers, rows, sum(1 << w for w in workers)
        self._group_of[None] = self._group_of[0, n, None]
        self.placement, reasons = layout.describe(n, self.num_workers, facts, len(self.groups))
        self.layout = f"{self.placement} ({reasons})" if reasons else self.placement

    def reset(self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None):
        """Resets every env, or those in `options["reset_mask"]`.

        Args:
            seed: an int gives env i `seed + i`; a list gives one seed per env (None: unseeded).
            options: passed to each env's reset; `reset_mask` (bool array) picks the envs to reset.

        Returns:
            The batched observations and the infos.

        Raises:
            ValueError: seeds not one per env, or a reset mask of another shape or selecting none.
            TypeError: a reset mask of another type or dtype.
        """
        self.reset_async(seed=seed, options=options)
        return self.reset_wait()

    def reset_async(self, seed: int | list[int | None] | None = None, options: dict | None = None) -> None:
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
        """Waits for reset_async's resets; a WorkerTimeout past `timeout` (default: the bound)."""
        self._check_usable("reset_wait", waiting=AsyncState.WAITING_RESET)
        self._raise_first(self._pool.collect(self._bound if timeout is None else timeout))
        self._state = AsyncState.DEFAULT
        infos: dict[str, Any] = {}
        for w in self._reset_workers:
            infos = self._take_reply(w, self._pool.replies.pop(w), infos)
        self._last_obs = self._observations()
        return self._last_obs, infos

    def step(self, actions):
        """Steps every env; an env that ends is reset in the same step (`step_async`, then `step_wait`).

        Returns:
            observations, rewards, terminations, truncations, infos (`final_obs`, `final_info`).
        """
        self.step_async(actions)
        return self.step_wait()

    def step_async(self, actions, group: slice | None = None) -> None:
        """Sends `actions`, an element of `action_space`, to the envs; `step_wait` takes the results.

        Args:
            actions: one action per env (per env of `group`).
            group: step only these envs, one of `groups(k)`, while another group may be stepping.

        Raises:
            ValueError: not one action per env, or a group that is not one of `groups(k)`.
            TypeError: a scalar action.
            AlreadyPendingCallError: those envs are stepping already.
        """
        group, workers, views, bits = self._group(group)
        self._check_usable("step_async", bits)
        act = views["actions"]
        if self._actions_in_shm:
            actions = np.asarray(actions)
            if actions.ndim == 0:
                raise TypeError(f"step() needs one action per env ({len(act)}), got the scalar {actions}")
        else:
            actions = list(iterate(self.action_space, actions))
        if len(actions) != group.stop - group.start:
            raise ValueError(f"step() got {len(actions)} actions for {group.stop - group.start} envs")
        # Same dtype and shape: written into shared memory. Anything else goes pickled, as given.
        in_shm = self._actions_in_shm and actions.dtype == act.dtype and actions.shape == act.shape
        if in_shm:
            act[...] = actions
        self._state = AsyncState.WAITING_STEP
        self._stepping |= bits
        for w in workers:
            sl = self._pool.slices[w]
            rows = slice(sl.start - group.start, sl.stop - group.start)
            self._pool.send(w, Command.STEP, None if in_shm else actions[rows])

    def step_wait(self, timeout: float | None = None, group: slice | None = None):
        """Waits for the step `step_async` sent. The envs of a worker replaced within `max_restarts`
        report truncated, reward 0, final_obs the last observation, infos["worker_restart"] True.

        Args:
            timeout: seconds to wait (default: the bound on every wait).
            group: the group of envs `step_async` stepped (their results only).

        Returns:
            As `step` (of the group's envs).

        Raises:
            WorkerError: an env raised, a worker died or its rebuild did not answer, past the restart budget.
            WorkerTimeout: some envs did not answer within `timeout` (the step stays pending).
        """
        group, workers, views, bits = self._group(group)
        self._check_usable("step_wait", bits, waiting=AsyncState.WAITING_STEP)
        failures = self._pool.collect(self._bound if timeout is None else timeout, workers=workers)
        restarted = {}
        if failures and self.max_restarts:  # (only workers restart)
            spaces = (self.single_observation_space, self.single_action_space)
            restarted, failures = self._pool.replace(failures, self._bound, spaces, self.max_restarts)
        self._raise_first(failures)
        self._stepping &= ~bits
        self._state = AsyncState.WAITING_STEP if self._stepping else AsyncState.DEFAULT
        infos: dict[str, Any] = {}
        for w in workers:
            if w in restarted:
                infos = self._report_restart(w, restarted[w], infos)
            elif (reply := self._pool.replies.pop(w)) is not None:  # None: only the block changed
                infos = self._take_reply(w, reply, infos)
        if group.stop - group.start == self.num_envs:
            self._last_obs = obs = self._observations()
        else:  # the group's rows, of arrays of every env (groups split only observations in shared memory)
            obs = views["obs"].copy()
            self._last_obs[group], infos = obs, _rows(infos, group)
        return obs, views["rewards"].copy(), views["terminations"].copy(), views["truncations"].copy(), infos

    def _group(self, group: slice | None) -> tuple[slice, list[int], dict[str, np.ndarray], int]:
        """The envs of `group` (None: all), their workers, their rows of the block, a bit per worker."""
        found = self._group_of.get(None if group is None else (group.start, group.stop, group.step))
        if found is None:
            raise ValueError(f"group must be one of envs.groups, {self.groups}, got {group}")
        return found

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Calls method `name(*args, **kwargs)` of every env (or the wrapper that has it), or reads
        attribute `name`.

        Returns:
            One result per env.
        """
        return tuple(self._command("call", Command.CALL, lambda sl: (name, args, kwargs)))

    get_attr = call  # as in gymnasium's vector envs: an attribute that is a method is called

    def set_attr(self, name: str, values: list[Any] | tuple[Any, ...] | Any) -> None:
        """Sets attribute `name` of every env (or the wrapper that has it) to one of `values` (a list
        or tuple: one per env) or to `values` itself.

        Raises:
            ValueError: a list or tuple not one value per env.
        """
        self._check_usable("set_attr")
        if not isinstance(values, (list, tuple)):
            values = [values] * self.num_envs
        if len(values) != self.num_envs:
            raise ValueError(f"set_attr() got {len(values)} values for {self.num_envs} envs")
        self._command("set_attr", Command.SET_ATTR, lambda sl: (name, list(values[sl])))

    def save_env_states(self) -> dict | None:
        """Every env's state and the last observations, as data for a checkpoint
        (vecenv/env_state.py). Not ended by the interrupt: a snapshot is whole or none.

        Returns:
            Values that torch.load(weights_only=True) loads; None if some env cannot be saved.
        """
        states = self._command("save_env_states", Command.SAVE_STATES, lambda sl: None, interruptible=False)
        return None if None in states else {"envs": states, "obs": env_state.value(self._last_obs)}

    def load_env_states(self, saved: dict) -> Any:
        """Sets the states `save_env_states` took onto these envs (built by the same env_fns); nothing
        in `saved` runs code.

        Returns:
            The last observations, as `step` returned them when the states were taken.

        Raises:
            ValueError: saying why, if some state does not fit; every env is then as it was.
        """
        obs, states = env_state.decoded(saved["obs"]), saved["envs"]
        if len(states) != self.num_envs:
            raise ValueError(f"{len(states)} states for {self.num_envs} envs")
        before = self.save_env_states()  # put back if some state does not fit
        reasons = self._command("load_env_states", Command.LOAD_STATES, lambda sl: states[sl])
        if failed := [f"env {i}: {why}" for i, why in enumerate(reasons) if why is not None]:
            if before is not None:
                self._command("load_env_states", Command.LOAD_STATES, lambda sl: before["envs"][sl])
            raise ValueError(failed[0] + (f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""))
        if self._obs_in_shm:
            self._views["obs"][...] = obs
        else:
            self._env_obs = list(iterate(self.observation_space, obs))
        self._last_obs = obs
        return obs

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
        return [proc.pid for proc in self._pool.procs] if isinstance(self._pool, WorkerPool) else []

    @property
    def restarts(self) -> int:
        """Workers replaced so far (at most `max_restarts`)."""
        return self._pool.restarts if isinstance(self._pool, WorkerPool) else 0

    def close_extras(self, timeout: float | None = None, terminate: bool = False, **kwargs: Any) -> None:
        """Stops every worker: asks, waits, then kills them and the processes their envs started.
        Replies under way get as long to arrive, so that no worker is left writing one.

        Args:
            timeout: seconds to wait for the workers (default `close_timeout`).
            terminate: kill them at once.
        """
        timeout = 0.0 if terminate else self.close_timeout if timeout is None else timeout
        if self._state is not AsyncState.DEFAULT and not self._closing_on_exception:
            pending = f"Calling `close` while waiting for a pending call to `{self._state.value}` to complete."
            warnings.warn(pending, UserWarning, stacklevel=3)
        if self._pool is not None:  # (None: the constructor failed before it)
            self._pool.close(timeout)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        self._closing_on_exception = exc_info[0] is not None
        self.close()

    def _command(self, name: str, command: Command, arg_of: Callable, interruptible: bool = True) -> list:
        """Sends `command` with arg_of(its slice) to every worker; the results, env by env."""
        self._check_usable(name)
        for w, sl in enumerate(self._pool.slices):
            self._pool.send(w, command, arg_of(sl))
        self._raise_first(self._pool.collect(self._bound, interruptible))
        replies = [self._pool.replies.pop(w) for w in range(len(self._pool.slices))]
        return [result for reply in replies if reply is not None for result in reply]

    def _check_usable(self, name: str, bits: int = 0, waiting: AsyncState | None = None) -> None:
        """Raises unless `name` may be called now: a wait (`waiting`: its state) after its async
        call; any other call with none pending (a group's, `bits` its workers: or other groups')."""
        if self.closed:
            raise ClosedEnvironmentError(f"SubprocVecEnv.{name}() was called after close(); build a new one")
        if waiting is not None:
            if self._state is not waiting or self._stepping & bits != bits:
                message = f"Calling `{name}` without any prior call to `{waiting.value}_async`."
                raise NoAsyncCallError(message, waiting.value)
        elif self._failed is not None:
            failed = self._failed
            message = f"SubprocVecEnv.{name}() after an earlier failure; close() it and build a new one. "
            exitcode = getattr(failed, "exitcode", None)
            raise WorkerError(message + f"The failure was: {failed}", failed.env_indices, name, exitcode)
        elif self._state is not AsyncState.DEFAULT and not (
            bits and self._state is AsyncState.WAITING_STEP and not self._stepping & bits
        ):
            pending = self._state.value
            message = f"Calling `{name}` while waiting for a pending call to `{pending}` to complete"
            raise AlreadyPendingCallError(f"{message}; call {pending}_wait() first", pending)

    def _raise_first(self, failures: dict[int, Exception]) -> None:
        """Raises the failure first_failure picks, if any; the vec env stays usable only where a wait may take it up."""
        if not failures:
            return
        error = first_failure(failures)
        if isinstance(error, WorkerError):
            self._failed, self._state = error, AsyncState.DEFAULT
        elif self._state is AsyncState.DEFAULT:  # call, set_attr, ...: the late reply would answer the next command
            self._failed = error
        elif hasattr(error, "add_note"):  # (Python 3.11)
            error.add_note(f"call {self._state.value}_wait() again to keep waiting, or close()")
        raise error

    def _report_restart(self, w: int, reply: tuple, infos: dict) -> dict:
        """A restarted worker's envs: truncated, reward 0, final_obs a copy of the last obs."""
        sl, views, mark = self._pool.slices[w], self._views, {"worker_restart": True}
        last_obs = copy.deepcopy(list(iterate(self.observation_space, self._last_obs))[sl])  # only its envs'
        views["rewards"][sl], views["terminations"][sl], views["truncations"][sl] = 0.0, False, True
        extras = [(k, (last_obs[k], dict(mark)), dict(info, **mark)) for k, _, info in reply[1]]
        return self._take_reply(w, (reply[0], extras), infos)

    def _take_reply(self, w: int, reply: tuple, infos: dict) -> dict:
        """`infos` and worker w's (final_obs, final_info too); keeps observations sent pickled."""
        obs_list, extras = reply
        start = self._pool.slices[w].start
        for k, final, info in extras:
            if final is not None:
                infos = self._add_info(infos, {"final_obs": final[0], "final_info": final[1]}, start + k)
            infos = self._add_info(infos, info, start + k)
        for k, obs in enumerate(obs_list or []):
            if obs is not None:
                self._env_obs[start + k] = obs
        return infos

    def _observations(self):
        if self._obs_in_shm:
            return self._views["obs"].copy()
        out = create_empty_array(self.single_observation_space, n=self.num_envs, fn=np.empty)
        return concatenate(self.single_observation_space, self._env_obs, out)


def _rows(infos: dict[str, Any], group: slice) -> dict[str, Any]:
    """The rows of a group's envs in infos (arrays of every env's)."""
    return {key: _rows(value, group) if isinstance(value, dict) else value[group] for key, value in infos.items()}
