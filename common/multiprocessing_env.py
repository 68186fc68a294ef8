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
default the layout is measured: where a process round trip costs more than the envs it would spread (8 CartPoles
on 2 cores), the envs step in the calling process instead, with the same results, API and errors
(``num_workers=0`` asks for that; it cannot bound or restart a step, so ``step_timeout`` and ``max_restarts``
need workers).

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
"""

from __future__ import annotations

import functools
import math
import mmap
import multiprocessing as mp
import os
import pickle
import select
import shutil
import signal
import socket
import struct
import sys
import tempfile
import threading
import time
import traceback
import warnings
import weakref
from collections.abc import Callable, Sequence
from copy import deepcopy
from multiprocessing import util as mp_util
from typing import Any

import cloudpickle
import gymnasium as gym
import numpy as np
from gymnasium.error import AlreadyPendingCallError, ClosedEnvironmentError, NoAsyncCallError
from gymnasium.spaces import Box, Dict, Discrete, MultiBinary, MultiDiscrete, Tuple
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array, iterate

__all__ = ["SubprocVecEnv", "WorkerError", "WorkerTimeout"]

# Wire protocol. Commands are one byte, optionally followed by a pickled argument.
_STEP, _RESET, _CALL, _SET_ATTR, _ATTACH, _CLOSE = b"s", b"r", b"c", b"a", b"m", b"x"
_COMMAND_NAMES = {_STEP: "step", _RESET: "reset", _CALL: "call", _SET_ATTR: "set_attr", _ATTACH: "attach"}
# Replies are one status byte, optionally followed by a pickled payload.
_OK, _PAYLOAD, _ERROR = b"\x00", b"\x01", b"\x02"
_PICKLE = pickle.HIGHEST_PROTOCOL
_BASE_SPACES = (Box, Discrete, MultiDiscrete, MultiBinary)
_LONGEST_POLL = 3600.0  # seconds; poll() takes an int of milliseconds, so longer waits are made of several


class WorkerError(RuntimeError):
    """An env in a worker process raised, or a worker process died. The message says which, where and why."""

    def __init__(self, message: str, env_indices: Sequence[int], command: str, exitcode: int | None = None):
        super().__init__(message)
        self.env_indices = tuple(env_indices)
        self.command = command
        self.exitcode = exitcode


class WorkerTimeout(TimeoutError, mp.TimeoutError):
    """Workers did not answer within the bound: the builtin TimeoutError, and multiprocessing's, as gymnasium's own
    vector envs raise. `env_indices` and `command` say which and what."""

    def __init__(self, message: str, env_indices: Sequence[int], command: str):
        super().__init__(message)
        self.env_indices = tuple(env_indices)
        self.command = command


def _leaves(space: gym.Space) -> list[gym.Space]:
    """The array-valued spaces of a (nested Dict/Tuple) space, in a fixed order; TypeError if one is not."""
    if isinstance(space, _BASE_SPACES):
        return [space]
    if isinstance(space, (Dict, Tuple)):
        subspaces = space.spaces.values() if isinstance(space, Dict) else space.spaces
        return [leaf for sub in subspaces for leaf in _leaves(sub)]
    raise TypeError(f"{type(space).__name__} cannot live in shared memory")


def _flatten(space: gym.Space, value: Any) -> list[Any]:
    """One observation as its list of leaves, in `_leaves` order."""
    if isinstance(space, Dict):
        return [leaf for key, sub in space.spaces.items() for leaf in _flatten(sub, value[key])]
    if isinstance(space, Tuple):
        return [leaf for sub, item in zip(space.spaces, value, strict=True) for leaf in _flatten(sub, item)]
    return [value]


def _unflatten(space: gym.Space, leaves: Any) -> Any:
    """Inverse of `_flatten` over an iterator of leaves: rebuilds the Dict/Tuple structure."""
    if isinstance(space, Dict):
        return {key: _unflatten(sub, leaves) for key, sub in space.spaces.items()}
    if isinstance(space, Tuple):
        return tuple(_unflatten(sub, leaves) for sub in space.spaces)
    return next(leaves)


def _layout(fields: list[tuple[str, tuple[int, ...], np.dtype]]) -> tuple[list[tuple], int]:
    """Offsets of named arrays in one block, each 64-byte aligned so workers never share a cache line."""
    layout, offset = [], 0
    for name, shape, dtype in fields:
        layout.append((name, offset, shape, np.dtype(dtype).str))
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        offset += -(-nbytes // 64) * 64
    return layout, max(offset, 64)


def _views(buffer: Any, layout: list[tuple]) -> dict[str, np.ndarray]:
    return {name: np.ndarray(shape, dtype, buffer=buffer, offset=offset) for name, offset, shape, dtype in layout}


def _anonymous_file(size: int) -> int:
    """A file descriptor of `size` zero bytes that no path names: nothing to leak, even if we crash."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("subprocvecenv")
    else:
        fd, path = tempfile.mkstemp(prefix="subprocvecenv-")
        os.unlink(path)
    os.ftruncate(fd, size)
    return fd


class _Channel:
    """Length-prefixed messages over one end of a socketpair (what multiprocessing.Pipe builds on Unix).

    Raw reads and writes with one read per message in the common case: about half the cost of
    multiprocessing.Connection, which matters when a whole CartPole step costs a few microseconds. The worker
    reads with blocking `recv`; the parent only reads what is there (`pump`), so no read can outlast a bound.
    """

    _HEADER = struct.Struct("!Q")

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.fd = sock.fileno()
        self._buffer = b""
        self._poller = select.poll()  # for spin()
        self._poller.register(self.fd, select.POLLIN)

    def send(self, data: bytes) -> None:
        view = memoryview(self._HEADER.pack(len(data)) + data)
        while view:
            view = view[os.write(self.fd, view) :]

    def message(self) -> bytes | None:
        """The next whole message if it has arrived already, else None."""
        buffer, size = self._buffer, self._HEADER.size
        if len(buffer) >= size:
            end = size + self._HEADER.unpack_from(buffer)[0]
            if len(buffer) >= end:
                self._buffer = buffer[end:]
                return buffer[size:end]
        return None

    def pump(self) -> bool:
        """Reads whatever has arrived, without waiting; False once the other end is closed."""
        while True:
            try:
                chunk = self.sock.recv(1 << 20, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                return True
            except OSError:
                return False
            if not chunk:
                return False
            self._buffer += chunk

    def recv(self) -> bytes:
        """The next whole message, waiting as long as it takes; EOFError once the other end is closed."""
        while (msg := self.message()) is None:
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                raise EOFError("the other end of the pipe is closed")
            self._buffer += chunk
        return msg

    def send_fd(self, data: bytes, fd: int) -> None:
        """One message with a file descriptor attached (SCM_RIGHTS): how a worker gets the shared block."""
        socket.send_fds(self.sock, [self._HEADER.pack(len(data)) + data], [fd])

    def recv_fd(self) -> tuple[bytes, int]:
        data, fds, _, _ = socket.recv_fds(self.sock, 1 << 16, 1)
        if not fds:
            raise EOFError("expected a file descriptor from the other end of the pipe")
        self._buffer += data
        return self.recv(), fds[0]

    def spin(self, seconds: float) -> None:
        """Polls for a message for up to `seconds`, yielding the CPU in between, before the caller's blocking read:
        a message that arrives within the window is read without this process going to sleep and being woken."""
        if seconds <= 0 or self._buffer:
            return
        end = time.perf_counter() + seconds
        while not self._poller.poll(0) and time.perf_counter() < end:
            os.sched_yield()

    def close(self) -> None:
        self.sock.close()


class _EnvGroup:
    """The envs of one worker, writing their results into their rows of the shared arrays. The same code runs in a
    worker process and, for the in-process layout, in the calling process. `current` is the env (index within the
    group) under way, for error reports."""

    def __init__(self, envs: list[gym.Env], views: dict[str, np.ndarray], obs_in_shm: bool):
        self.envs, self.views, self.current = envs, views, 0
        self.obs_space = envs[0].observation_space
        leaves = _leaves(self.obs_space) if obs_in_shm else []
        self.obs_views = [views[f"obs{j}"] for j in range(len(leaves))] if obs_in_shm else None
        self.one_leaf = self.obs_views[0] if obs_in_shm and len(leaves) == 1 else None  # the common case, made quick
        self.copy_actions = views["actions"].ndim > 1  # array actions: the parent overwrites the block next step

    def _store(self, k: int, obs: Any, obs_list: list) -> None:
        if self.obs_views is None:
            obs_list.append(obs)
            return
        if self.one_leaf is not None and getattr(obs, "shape", None) == self.one_leaf.shape[1:]:
            self.one_leaf[k] = obs
            return
        for view, leaf in zip(self.obs_views, _flatten(self.obs_space, obs), strict=True):
            if np.shape(leaf) != view.shape[1:]:  # numpy would broadcast a scalar into the row without a word
                raise ValueError(
                    f"the observation has shape {np.shape(leaf)}, but its space {self.obs_space} has {view.shape[1:]}"
                )
            view[k] = leaf

    def step(self, actions_arg: list | None) -> tuple | None:
        """Steps every env, resetting finished ones in the same step; None when nothing but the arrays changed."""
        actions = self.views["actions"] if actions_arg is None else actions_arg
        rewards, terminations, truncations = (
            self.views["rewards"],
            self.views["terminations"],
            self.views["truncations"],
        )
        extras, obs_list = [], []
        for k, env in enumerate(self.envs):
            self.current = k
            action = actions[k].copy() if self.copy_actions and actions_arg is None else actions[k]
            obs, reward, terminated, truncated, info = env.step(action)
            if terminated or truncated:
                final = (obs, info)
                obs, info = env.reset()
                extras.append((k, final, info))
            elif info:
                extras.append((k, None, info))
            rewards[k], terminations[k], truncations[k] = reward, terminated, truncated
            self._store(k, obs, obs_list)
        return (obs_list or None, extras) if self.obs_views is None or extras else None

    def reset(self, arg: tuple) -> tuple:
        seeds, options, mask = arg
        obs_list, infos = [], []
        for k, env in enumerate(self.envs):
            self.current = k
            if not mask[k]:
                obs_list.append(None)
                continue
            obs, info = env.reset(seed=seeds[k], options=options)
            infos.append((k, info))
            self._store(k, obs, obs_list)
        return obs_list if self.obs_views is None else None, infos

    def call(self, arg: tuple) -> list:
        name, args, kwargs = arg
        results = []
        for k, env in enumerate(self.envs):
            self.current = k
            attr = env.get_wrapper_attr(name)
            results.append(attr(*args, **kwargs) if callable(attr) else attr)
        return results

    def set_attr(self, arg: tuple) -> None:
        name, values = arg
        for k, env in enumerate(self.envs):
            self.current = k
            env.set_wrapper_attr(name, values[k])

    def run(self, cmd: bytes, arg: Any) -> Any:
        return {_STEP: self.step, _RESET: self.reset, _CALL: self.call, _SET_ATTR: self.set_attr}[cmd](arg)

    def close(self) -> None:
        _close_envs(self.envs)


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}es" if noun.endswith("s") else f"{count} {noun}s"


def _close_envs(envs: list[gym.Env]) -> None:
    for env in envs:
        try:
            env.close()
        except Exception:  # noqa: BLE001 - closing is best effort; what matters is that it ends
            pass


def _error_report(index: int, command: str, exc: BaseException) -> tuple:
    """What a failure sends to the parent: env index, command, one-line summary and formatted traceback."""
    try:
        summary = f"{type(exc).__qualname__}: {exc}"
    except Exception:  # noqa: BLE001 - an exception whose __str__ fails still gets reported
        summary = type(exc).__qualname__
    return index, command, summary, "".join(traceback.format_exception(exc))


def _watch_trainer(lifeline: socket.socket, tmpdir: str | None) -> None:
    """Ends this worker and the helper processes its envs started once the trainer is gone, however it died: its end
    of the lifeline closes, and ours reads EOF (nothing is ever sent on it). Runs in a thread, so it wakes while the
    main thread is busy in env code (as long as that code releases the GIL)."""
    poller = select.poll()
    poller.register(lifeline, select.POLLIN)
    while not poller.poll():
        pass
    if tmpdir:  # the folder a trainer's forkserver keeps in the temp dir; nobody else would remove it
        shutil.rmtree(tmpdir, ignore_errors=True)
    if os.getpgid(0) == os.getpid():  # this worker leads its group: its envs' helpers go with it
        os.killpg(0, signal.SIGKILL)
    os._exit(1)


def _worker(
    first: int,
    env_fns_bytes: bytes,
    sock: socket.socket,
    lifeline: socket.socket,
    close_fds: list[int],
    spin: float,
    tmpdir: str | None,
) -> None:
    """Worker process main loop: builds its envs, then answers commands until told to close."""
    for fd in close_fds:  # fork start: the parent's ends of every pipe, so that its death reads as EOF
        try:
            os.close(fd)
        except OSError:
            pass
    try:
        os.setpgid(0, 0)  # a process group of its own: the helpers its envs start can be ended with it
    except OSError:
        pass
    threading.Thread(target=_watch_trainer, args=(lifeline, tmpdir), name="watch-trainer", daemon=True).start()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle; it then closes us
    conn = _Channel(sock)
    envs: list[gym.Env] = []
    group = None
    command, k = "make", 0  # what the worker is doing, and to which of its envs: named in any error
    try:
        env_fns = cloudpickle.loads(env_fns_bytes)
        for k in range(len(env_fns)):
            envs.append(env_fns[k]())
        k = 0
        spaces = [(env.observation_space, env.action_space) for env in envs]
        conn.send(_PAYLOAD + pickle.dumps((spaces, envs[0].metadata, envs[0].render_mode), _PICKLE))

        command = "attach"  # map the block the parent laid out from those spaces: this worker's rows only
        msg, fd = conn.recv_fd()
        size, layout, obs_in_shm = pickle.loads(memoryview(msg)[1:])
        block = mmap.mmap(fd, size)
        os.close(fd)
        views = {name: view[first : first + len(envs)] for name, view in _views(block, layout).items()}
        group = _EnvGroup(envs, views, obs_in_shm)
        conn.send(_OK)

        while True:
            conn.spin(spin)
            msg = conn.recv()
            cmd = msg[:1]
            if cmd not in _COMMAND_NAMES:
                break
            command = _COMMAND_NAMES[cmd]
            reply = group.run(cmd, pickle.loads(memoryview(msg)[1:]) if len(msg) > 1 else None)
            conn.send(_OK if reply is None else _PAYLOAD + pickle.dumps(reply, _PICKLE))
    except BaseException as exc:  # noqa: BLE001 - everything must reach the parent, then this process ends
        index = first + (group.current if group is not None else k)
        try:
            conn.send(_ERROR + pickle.dumps(_error_report(index, command, exc), _PICKLE))
        except OSError:
            pass
    finally:
        _close_envs(envs)
        conn.close()


def _kill_group(pid: int) -> None:
    """SIGKILL to the process group a worker leads: the helper processes its envs started, once it has exited."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, OSError):
        pass


def _shutdown(procs: list, conns: list, stuck: set[int], timeout: float) -> None:
    """Ask workers to exit, wait up to `timeout`, then terminate and kill whatever is left, helpers included."""
    for w, conn in enumerate(conns):
        if w not in stuck:
            try:
                conn.send(_CLOSE)
            except (OSError, ValueError):
                pass
    for w in stuck:
        procs[w].terminate()
    deadline = time.monotonic() + timeout
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))
    for sig_method in ("terminate", "kill"):
        alive = [proc for proc in procs if proc.exitcode is None]
        for proc in alive:
            getattr(proc, sig_method)()
        for proc in alive:
            proc.join(1.0)
    for proc in procs:
        _kill_group(proc.pid)
    for conn in conns:
        conn.close()
    procs.clear()
    conns.clear()


# Imported once in the forkserver when the trainer has them, so that workers fork with them loaded. Workers re-run
# the main script on start (spawn semantics), and CPython's forkserver never preloads it (it looks for a
# "main_path" key that get_preparation_data does not set): a script importing torch cost every worker seconds.
_FORKSERVER_PRELOAD = ("torch", "torch.utils.tensorboard", "tyro", "gymnasium", "ale_py", "cv2", "numpy", "cloudpickle")


def _default_context() -> str:
    # forkserver: fast starts without fork's hazards (threads, CUDA or locks held by the parent).
    return "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"


def _describe_exit(exitcode: int | None) -> str:
    if exitcode is None:
        return "closed its pipe without exiting"
    if exitcode < 0:
        try:
            return f"was killed by {signal.Signals(-exitcode).name} (exit code {exitcode})"
        except ValueError:
            return f"was killed by signal {-exitcode} (exit code {exitcode})"
    return f"exited with code {exitcode}"


_lifelines: dict[int, tuple[socket.socket, socket.socket]] = {}


def _lifeline() -> tuple[socket.socket, socket.socket]:
    """This process's lifeline, made once: it keeps the first end open until it dies; workers watch the second."""
    if os.getpid() not in _lifelines:
        _lifelines.clear()  # a forked child's copy belongs to its parent
        _lifelines[os.getpid()] = socket.socketpair()
    return _lifelines[os.getpid()]


class _StandInEnv(gym.Env):
    """An env that keeps the CPU busy for `seconds` per step and ends an episode every `length` steps with `info`:
    what a layout is timed with, in place of the real envs (which must not be stepped before the user resets them)."""

    observation_space = Box(-1.0, 1.0, (1,), np.float32)
    action_space = Discrete(2)

    def __init__(self, seconds: float = 0.0, length: float = math.inf, info: dict | None = None, offset: int = 0):
        self.seconds, self.length, self.info, self.t = seconds, length, info or {}, offset

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        return np.zeros(1, np.float32), {}

    def step(self, action):
        end = time.perf_counter() + self.seconds
        while time.perf_counter() < end:
            pass
        self.t += 1
        done = self.t % self.length < 1
        return np.zeros(1, np.float32), 0.0, done, False, self.info if done else {}


def _measure_layout(n: int, step: float, length: float, info: dict, **layout: Any) -> float:
    """Median seconds of one step of `n` stand-in envs like the probe (`step` seconds, episodes of `length` steps
    ending with `info`) in the given layout, from about 0.2 s of stepping: commands, wake-ups, replies and infos
    included, and how well workers really run side by side here, which is not always as well as there are cores."""
    env_fns = [functools.partial(_StandInEnv, step, round(length) if length < math.inf else math.inf, info, i * 7)
               for i in range(n)]  # fmt: skip
    with SubprocVecEnv(env_fns, **layout) as envs:
        envs.reset(seed=0)
        actions, samples, start = np.zeros(n, np.int64), [], time.perf_counter()
        while len(samples) < 200 and (len(samples) < 10 or time.perf_counter() - start < 0.2):
            tick = time.perf_counter()
            envs.step(actions)
            samples.append(time.perf_counter() - tick)
    return float(np.median(samples[len(samples) // 4 :]))  # the first steps wake processes that were just started


def _measure_step(env_fn: Callable[[], gym.Env]) -> tuple[float, float, dict]:
    """Mean seconds of one env step (resets included, with random actions), steps per episode, and the info of an
    episode's end, from a probe env built here."""
    env = env_fn()
    try:
        env.action_space.seed(0)
        actions = [env.action_space.sample() for _ in range(200)]
        env.reset(seed=0)
        steps, ends, final_info, start = 0, 0, {}, time.perf_counter()
        while steps < len(actions) and (steps < 10 or time.perf_counter() - start < 0.02):
            _, _, terminated, truncated, info = env.step(actions[steps])
            if terminated or truncated:
                ends, final_info = ends + 1, info
                env.reset()
            steps += 1
        return (time.perf_counter() - start) / steps, steps / max(ends, 1) if ends else math.inf, final_info
    finally:
        try:
            env.close()
        except Exception:  # noqa: BLE001 - a probe's close is best effort
            pass


class SubprocVecEnv(VectorEnv):
    """Vector env stepping its envs in worker processes (or in this one); same results as
    SyncVectorEnv(autoreset_mode=SAME_STEP).

    Args:
        env_fns: zero-argument callables that build one env each (lambdas and closures are fine).
        num_workers: worker processes; 0 steps every env in this process. None: time one env step (in a probe env
            built here), then a step of num_envs stand-in envs that take that long, in this process and in one
            worker per CPU core (at most one per env); workers if they are at least 10% faster. The figures and
            the choice are in `layout`, `step_seconds`, `in_process_seconds` and `workers_seconds`. Workers are
            used whenever `step_timeout` or `max_restarts` is set.
        envs_per_worker: envs stepped by each worker per round trip (instead of num_workers).
        context: multiprocessing start method, "forkserver" (default where available), "spawn" or "fork".
        shared_memory: keep observations in shared memory (no pickling). Spaces that cannot live there
            (Text, Graph, ...) go over the pipe either way.
        max_restarts: times a crashed, raising or stuck worker may be replaced (its envs' episodes end truncated).
        step_timeout: seconds a step may take before its worker counts as stuck; when set, it bounds every other
            wait on a worker too (building, reset, call, get_attr, set_attr, render, a restart's rebuild).
        max_wait: seconds any wait on a worker may last when step_timeout is None (600: long enough for a slow
            simulator to start, finite so that nothing hangs).
        close_timeout: seconds `close()` waits for workers to exit before terminating them.
        worker_spin: seconds a worker keeps polling for its next command (yielding the CPU) before it sleeps.
            The trainer's next step usually comes within it, and skipping the sleep saves a process wake-up per
            step. Costs at most this much CPU per command; 0 sleeps at once. None: 300 us, or 0 when workers
            outnumber the usable cores (then a polling worker takes CPU time from one with work to do).
    """

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
    ):
        super().__init__()
        env_fns = list(env_fns)
        if not env_fns or not all(callable(fn) for fn in env_fns):
            raise ValueError("env_fns must be a non-empty sequence of zero-argument callables that build an env")
        self.num_envs = n = len(env_fns)
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        if num_workers is not None and (not isinstance(num_workers, int) or num_workers < 0):
            raise ValueError(f"num_workers must be an int >= 0 (0: in this process) or None, got {num_workers!r}")
        if envs_per_worker is not None and (not isinstance(envs_per_worker, int) or envs_per_worker < 1):
            raise ValueError(f"envs_per_worker must be a positive int (or None), got {envs_per_worker!r}")
        if num_workers is not None and envs_per_worker is not None:
            raise ValueError("give num_workers or envs_per_worker, not both")
        if context is not None and context not in mp.get_all_start_methods():
            raise ValueError(f"context must be one of {mp.get_all_start_methods()}, got {context!r}")
        if max_restarts < 0:
            raise ValueError(f"max_restarts must be >= 0, got {max_restarts}")
        if worker_spin is not None and not 0 <= worker_spin < math.inf:
            raise ValueError(f"worker_spin must be >= 0 seconds (or None), got {worker_spin}")
        for name, value in (("step_timeout", step_timeout), ("max_wait", max_wait), ("close_timeout", close_timeout)):
            if value is not None and not 0 < value < math.inf:
                raise ValueError(f"{name} must be a finite number of seconds > 0, got {value}")
        if num_workers == 0 and (step_timeout is not None or max_restarts):
            raise ValueError("step_timeout and max_restarts need worker processes: a step in this process can be "
                             "neither interrupted nor restarted (use num_workers >= 1)")  # fmt: skip
        self.max_restarts, self.restarts, self.step_timeout = max_restarts, 0, step_timeout
        self.max_wait, self.close_timeout = max_wait, close_timeout
        self._wait_bound = step_timeout if step_timeout is not None else max_wait
        workers = min(cores, n) if num_workers is None else min(num_workers, n)
        if envs_per_worker is not None:
            workers = -(-n // envs_per_worker)

        def spin(workers: int) -> float:
            return (300e-6 if workers <= cores else 0.0) if worker_spin is None else worker_spin

        # Layout: measured, asked for, or workers when steps must be bounded or restarted
        context = context or _default_context()
        self.step_seconds = self.in_process_seconds = self.workers_seconds = None
        if envs_per_worker is None and num_workers is None and step_timeout is None and not max_restarts:
            step, length, info = _measure_step(env_fns[-1])  # the last env: env 0 often records video
            like_the_probe = (min(step, 0.002), length, info)  # costlier steps only favour workers more
            self.step_seconds, self.in_process_seconds = step, _measure_layout(n, *like_the_probe, num_workers=0)
            if workers > 1:
                layout = {"num_workers": workers, "context": context, "worker_spin": spin(workers)}
                self.workers_seconds = _measure_layout(n, *like_the_probe, **layout)
            if workers == 1 or self.workers_seconds > 0.9 * self.in_process_seconds:
                workers = 0  # workers must be clearly faster: a step in this process is easier to debug, can't crash
        self.envs_per_worker = envs_per_worker or (-(-n // workers) if workers else n)
        self._slices = [slice(lo, min(lo + self.envs_per_worker, n)) for lo in range(0, n, self.envs_per_worker)]
        self.num_workers = len(self._slices) if workers else 0
        self.worker_spin = spin(self.num_workers) if workers else 0.0
        envs = "1 env" if n == 1 else f"{n} envs"
        self.layout = f"{envs} in " + ("this process" if workers == 0 else _plural(self.num_workers, "worker process"))
        if self.step_seconds is not None:
            self.layout += f" (measured: one env step {self.step_seconds * 1e6:.0f} us; one step of {envs}"
            self.layout += f" {self.in_process_seconds * 1e6:.0f} us in this process"
            if self.workers_seconds is not None:
                self.layout += f", {self.workers_seconds * 1e6:.0f} us in {_plural(min(cores, n), 'worker')}"
            self.layout += ")"

        self._procs: list = []
        self._conns: list = []
        self._stuck: set[int] = set()  # workers that failed to answer in time: terminated, not asked, on close
        self._finalizer = weakref.finalize(self, _shutdown, self._procs, self._conns, self._stuck, close_timeout)
        self._poller = select.poll()  # every worker's socket and process sentinel (readable once it exits)
        self._fd_owner: dict[int, tuple[int, bool]] = {}  # fd -> (worker, is its sentinel)
        self._pending: dict[int, str] = {}  # worker -> command awaiting its reply
        self._replies: dict[int, Any] = {}
        self._failed: WorkerError | None = None
        self._waiting: str | None = None  # "step" or "reset" between *_async and *_wait
        self._shm_fd: int | None = None
        self._inline: _EnvGroup | None = None
        self._closing_on_exception = False
        try:
            if self.num_workers == 0:
                self._setup_inline(env_fns, shared_memory)
            else:
                self._env_fns_bytes = [cloudpickle.dumps(env_fns[sl]) for sl in self._slices]  # to rebuild crashed envs
                self._ctx, self._fork = mp.get_context(context), context == "fork"
                if context == "forkserver":  # only takes effect before this process's forkserver first starts
                    self._ctx.set_forkserver_preload(
                        ["__main__", *(m for m in _FORKSERVER_PRELOAD if m in sys.modules)]
                    )
                self._tmpdir = mp_util.get_temp_dir() if context == "forkserver" else None
                for w in range(self.num_workers):
                    self._start_worker(w)
                self._setup(shared_memory)
        except BaseException:
            self.close(timeout=1.0)
            raise

    # ------------------------------------------------------------------ workers
    def _start_worker(self, w: int) -> None:
        """Starts worker `w` (afresh after a crash) and watches its socket and sentinel; it answers with spaces."""
        parent_sock, child_sock = socket.socketpair()
        keep, give = _lifeline()
        inherited = [c.fd for c in self._conns if c.fd >= 0] + [parent_sock.fileno(), keep.fileno()]
        proc = self._ctx.Process(
            target=_worker,
            name=f"SubprocVecEnv-worker-{w}",
            args=(
                self._slices[w].start,
                self._env_fns_bytes[w],
                child_sock,
                give,
                inherited if self._fork else [],
                self.worker_spin,
                self._tmpdir,
            ),
            daemon=True,
        )
        proc.start()
        child_sock.close()
        conn = _Channel(parent_sock)
        if w < len(self._procs):
            self._procs[w], self._conns[w] = proc, conn
        else:
            self._procs.append(proc)
            self._conns.append(conn)
        self._poller.register(conn.fd, select.POLLIN)
        self._poller.register(proc.sentinel, select.POLLIN)
        self._fd_owner[conn.fd], self._fd_owner[proc.sentinel] = (w, False), (w, True)
        self._pending[w] = "make"

    def _unwatch(self, w: int) -> None:
        """Takes worker `w`'s socket and sentinel out of the poll set: its exit is known, not news."""
        for fd in (self._conns[w].fd, self._procs[w].sentinel):
            if self._fd_owner.pop(fd, None) is not None:
                self._poller.unregister(fd)

    def _forget(self, w: int) -> None:
        """Stops watching worker `w` and makes sure it is gone, helpers included."""
        self._unwatch(w)
        self._conns[w].close()
        self._procs[w].kill()
        self._procs[w].join(2.0)
        _kill_group(self._procs[w].pid)
        self._pending.pop(w, None)
        self._replies.pop(w, None)
        self._stuck.discard(w)

    def _check_spaces(self, first: int, spaces: list) -> None:
        for i, (obs_space, act_space) in enumerate(spaces, start=first):
            if obs_space != self.single_observation_space or act_space != self.single_action_space:
                raise RuntimeError(
                    f"env {i} has observation space {obs_space} and action space {act_space}, but env 0 has "
                    f"{self.single_observation_space} and {self.single_action_space}; all envs must match"
                )

    def _set_spaces(self, spaces: list, metadata: dict, render_mode: str | None, shared_memory: bool) -> list:
        """Spaces and metadata from env 0, every env checked against them; returns the block's fields."""
        self.single_observation_space, self.single_action_space = spaces[0]
        self._check_spaces(0, spaces)
        self.metadata = dict(metadata, autoreset_mode=AutoresetMode.SAME_STEP)
        self.render_mode = render_mode
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        n = self.num_envs
        fields = [("rewards", (n,), np.float64), ("terminations", (n,), np.bool_), ("truncations", (n,), np.bool_)]
        act = self.single_action_space
        self._actions_in_shm = isinstance(act, _BASE_SPACES)
        fields.append(("actions", (n, *act.shape) if self._actions_in_shm else (0,), act.dtype or np.uint8))
        try:
            obs_leaves = _leaves(self.single_observation_space) if shared_memory else []
            self._obs_in_shm = bool(obs_leaves)
        except TypeError:
            obs_leaves, self._obs_in_shm = [], False
        fields += [(f"obs{j}", (n, *leaf.shape), leaf.dtype) for j, leaf in enumerate(obs_leaves)]
        return fields

    def _use_block(self, buffer: Any, layout: list) -> dict[str, np.ndarray]:
        views = _views(buffer, layout)
        self._rewards, self._terminations = views["rewards"], views["terminations"]
        self._truncations, self._action_buffer = views["truncations"], views["actions"]
        self._obs_views = [v for name, v in views.items() if name.startswith("obs")] if self._obs_in_shm else None
        if not self._obs_in_shm:
            self._env_obs: list[Any] = [None] * self.num_envs
            self._obs_buffer = create_empty_array(self.single_observation_space, n=self.num_envs, fn=np.zeros)
        return views

    def _setup(self, shared_memory: bool) -> None:
        """Checks every env's spaces against env 0's, then maps one shared block into every worker."""
        self._collect(self._wait_bound)
        replies = [self._replies.pop(w) for w in range(self.num_workers)]
        spaces = [space for reply in replies for space in reply[0]]
        fields = self._set_spaces(spaces, replies[0][1], replies[0][2], shared_memory)
        layout, size = _layout(fields)
        self._attach_message = _ATTACH + pickle.dumps((size, layout, self._obs_in_shm), _PICKLE)
        self._shm_fd = _anonymous_file(size)
        self._shm = mmap.mmap(self._shm_fd, size)
        for w in range(self.num_workers):
            self._attach(w)
        self._collect(self._wait_bound)
        self._replies.clear()
        self._use_block(self._shm, layout)

    def _setup_inline(self, env_fns: list, shared_memory: bool) -> None:
        """The in-process layout: the same arrays and the same step code as a worker's, in this process."""
        envs = []
        try:
            for fn in env_fns:
                envs.append(fn())
        except Exception as exc:  # noqa: BLE001 - env code: reported as a worker's failure would be
            _close_envs(envs)
            raise self._error(0, _error_report(len(envs), "make", exc)) from None
        fields = self._set_spaces(
            [(e.observation_space, e.action_space) for e in envs], envs[0].metadata, envs[0].render_mode, shared_memory
        )
        layout, size = _layout(fields)
        views = self._use_block(bytearray(size), layout)
        self._inline = _EnvGroup(envs, views, self._obs_in_shm)

    def _attach(self, w: int) -> None:
        try:
            self._conns[w].send_fd(self._attach_message, self._shm_fd)
        except OSError:
            pass  # a dead worker: _collect reports it
        self._pending[w] = "attach"

    # ------------------------------------------------------------------ messaging
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
        if self._waiting is not None:
            raise AlreadyPendingCallError(
                f"Calling `{name}` while waiting for a pending call to `{self._waiting}` to complete; call "
                f"{self._waiting}_wait() first",
                self._waiting,
            )

    def _send(self, w: int, cmd: bytes, arg: Any = None) -> None:
        if self._inline is not None:  # the command runs now; _collect finds its reply waiting
            try:
                self._replies[w] = self._inline.run(cmd, arg)
            except Exception as exc:  # noqa: BLE001 - env code: reported as a worker's failure would be
                self._failed, self._waiting = (
                    self._error(w, _error_report(self._inline.current, _COMMAND_NAMES[cmd], exc)),
                    None,
                )
                raise self._failed from None
            return
        try:
            self._conns[w].send(cmd if arg is None else cmd + pickle.dumps(arg, _PICKLE))
        except OSError:
            pass  # a dead worker: its sentinel is readable, and _collect reports it
        self._pending[w] = _COMMAND_NAMES[cmd]

    def _send_all(self, cmd: bytes, arg: Any = None) -> None:
        for w in range(len(self._slices)):
            self._send(w, cmd, arg)

    def _envs_of(self, w: int) -> list[int]:
        return list(range(self.num_envs)[self._slices[w]])

    def _wait_for_events(self, deadline: float) -> list[tuple[int, int]]:
        """poll() until something is ready or the deadline passes (in pieces: poll takes an int of milliseconds)."""
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return self._poller.poll(0)
            events = self._poller.poll(min(remaining, _LONGEST_POLL) * 1000)
            if events:
                return events

    def _collect(self, timeout: float, restart: bool = False) -> dict[int, Exception]:
        """Waits up to `timeout` seconds for the reply of every pending worker, into `self._replies`; raises the
        first failure (death, error or timeout). With `restart`, failures that fit in the restart budget are
        returned instead, for the caller to replace those workers.

        All replies on their way are still collected after a failure, then the failure of the lowest env index
        is raised, so the report does not depend on who answered first.
        """
        deadline = time.monotonic() + timeout
        failures: dict[int, Exception] = {}
        while self._pending:
            events = self._wait_for_events(deadline)
            if not events:
                stuck = sorted(self._pending)
                command = self._pending[stuck[0]]
                envs = [i for w in stuck for i in self._envs_of(w)]
                message = f"envs {envs} did not answer '{command}' within {timeout:g} s (workers {stuck})"
                self._stuck.update(stuck)  # never asked politely again: terminated on restart or close
                for w in stuck:  # still pending: a retried wait takes their replies, a restart forgets them
                    failures[w] = WorkerTimeout(message, self._envs_of(w), command)
                break
            for fd, _ in events:
                if fd not in self._fd_owner:
                    continue
                w, is_sentinel = self._fd_owner[fd]
                conn = self._conns[w]
                open_ = conn.pump()
                msg = conn.message()
                if msg is None and (is_sentinel or not open_):  # exited, or closed its pipe, without a reply
                    failures[w] = self._death(w)
                    self._pending.pop(w, None)
                    continue
                if msg is None:  # part of a reply: the rest is on its way
                    continue
                if w not in self._pending:  # a reply to nobody: a protocol fault
                    failures[w] = self._death(w)
                    continue
                del self._pending[w]
                self._stuck.discard(w)
                status = msg[:1]
                payload = None if status == _OK else pickle.loads(memoryview(msg)[1:])
                if status == _ERROR:
                    failures[w] = self._error(w, payload)
                    self._unwatch(w)  # it exits after this reply
                self._replies[w] = payload
        if failures and not (restart and self.restarts + len(failures) <= self.max_restarts):
            self._raise(failures)
        for w in failures:
            self._pending.pop(w, None)
        return failures

    def _raise(self, failures: dict[int, Exception]) -> None:
        """Raises the failure of the lowest env index, naming the others. A worker that failed leaves this vec env
        unusable; one that was only slow can still be waited for, if nothing else failed."""
        ordered = sorted(failures.items(), key=lambda item: item[1].env_indices)
        error = ordered[0][1]
        if len(ordered) > 1:
            error.args = (f"{error.args[0]}\n(envs {[i for _, e in ordered[1:] for i in e.env_indices]} failed too)",)
        worker_errors = [e for _, e in ordered if isinstance(e, WorkerError)]
        if worker_errors:
            self._failed, self._waiting = worker_errors[0], None
        elif self._waiting is not None:
            error.args = (f"{error.args[0]}; call {self._waiting}_wait() again to keep waiting, or close()",)
        raise error

    def _error(self, w: int, payload: tuple) -> WorkerError:
        env_index, command, summary, remote_tb = payload
        where = "in this process" if self.num_workers == 0 else f"worker {w}, pid {self._procs[w].pid}"
        return WorkerError(
            f"env {env_index} raised {summary} during '{command}' ({where}).\nWorker traceback:\n{remote_tb}",
            [env_index],
            command,
        )

    def _death(self, w: int) -> WorkerError:
        proc, command = self._procs[w], self._pending.get(w, "?")
        self._unwatch(w)
        proc.join(2.0)  # its sentinel or pipe says it ended: collect the exit code it has, or is about to have
        _kill_group(proc.pid)  # a helper its env started may still hold the pipe open
        return WorkerError(
            f"worker {w} (pid {proc.pid}, envs {self._envs_of(w)}) {_describe_exit(proc.exitcode)} during "
            f"'{command}'; close() this SubprocVecEnv and build a new one",
            self._envs_of(w),
            command,
            proc.exitcode,
        )

    def _restart(self, w: int, error: Exception) -> tuple:
        """Replaces failed worker `w` with a fresh one and resets its envs; returns the reset reply. A rebuild that
        fails, or does not answer within the bound, uses up the next restart, until the budget is spent."""
        n = len(self._envs_of(w))
        while True:
            self.restarts += 1
            reason = str(error).splitlines()[0]
            warnings.warn(
                f"SubprocVecEnv: restarting worker {w} (envs {self._envs_of(w)}), restart {self.restarts} of "
                f"{self.max_restarts}, after: {reason}",
                RuntimeWarning,
                stacklevel=4,
            )
            self._forget(w)
            self._start_worker(w)
            try:
                for command, arg in (("make", None), ("attach", None), ("reset", ([None] * n, None, [True] * n))):
                    if command == "attach":
                        self._attach(w)
                    elif command == "reset":
                        self._send(w, _RESET, arg)
                    failures = self._collect(self._wait_bound, restart=True)
                    if failures:
                        raise failures[w]
                    reply = self._replies.pop(w)
                    if command == "make":
                        self._check_spaces(self._slices[w].start, reply[0])
                return reply
            except (WorkerError, WorkerTimeout) as exc:
                if self.restarts >= self.max_restarts:
                    self._raise({w: exc})
                error = exc

    # ------------------------------------------------------------------ VectorEnv API
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
            mask = options.pop("reset_mask")
            if not isinstance(mask, np.ndarray):
                raise TypeError(f"`options['reset_mask']` must be a numpy array, got {type(mask)}")
            if mask.shape != (self.num_envs,):
                raise ValueError(f"`options['reset_mask']` must have shape `({self.num_envs},)`, got {mask.shape}")
            if mask.dtype != np.bool_:
                raise TypeError(f"`options['reset_mask']` must have `dtype=np.bool_`, got {mask.dtype}")
            if not mask.any():
                raise ValueError(f"`options['reset_mask']` must select at least one env, got reset_mask={mask}")
        self._reset_workers = [w for w, sl in enumerate(self._slices) if mask[sl].any()]
        self._waiting = "reset"
        for w in self._reset_workers:
            sl = self._slices[w]
            self._send(w, _RESET, (seed[sl], options, mask[sl]))

    def reset_wait(self, timeout: float | None = None):
        """Waits for the resets sent by reset_async; after `timeout` seconds (default: the bound of every wait) a
        WorkerTimeout names the envs that did not answer."""
        self._check_waiting("reset")
        self._collect(self._wait_bound if timeout is None else timeout)
        self._waiting = None
        infos: dict[str, Any] = {}
        for w in self._reset_workers:
            obs_list, env_infos = self._replies.pop(w)
            for k, info in env_infos:
                infos = self._add_info(infos, info, self._slices[w].start + k)
            self._store_obs(w, obs_list)
        self._last_obs = self._observations()
        return self._last_obs, infos

    def _check_waiting(self, name: str) -> None:
        if self.closed:
            raise ClosedEnvironmentError(f"SubprocVecEnv.{name}_wait() was called after close(); build a new one")
        if self._waiting != name:
            raise NoAsyncCallError(f"Calling `{name}_wait` without any prior call to `{name}_async`.", name)

    def _store_obs(self, w: int, obs_list: list | None) -> None:
        """Observations that came over the pipe (spaces shared memory cannot hold); None where none was sent."""
        for k, obs in enumerate(obs_list or []):
            if obs is not None:
                self._env_obs[self._slices[w].start + k] = obs

    def step(self, actions):
        self.step_async(actions)
        return self.step_wait()

    def step_async(self, actions) -> None:
        """Sends one action per env to the workers and returns at once."""
        self._check_usable("step_async")
        act = self._action_buffer
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
        # Same dtype and shape: write once into shared memory. Anything else goes pickled, exactly as given.
        in_shm = self._actions_in_shm and actions.dtype == act.dtype and actions.shape == act.shape
        if in_shm:
            act[...] = actions
        self._waiting = "step"
        for w, sl in enumerate(self._slices):
            self._send(w, _STEP, None if in_shm else list(actions[sl]))

    def step_wait(self, timeout: float | None = None):
        """Waits for the step sent by `step_async`. After `timeout` seconds (default: `step_timeout`, else
        `max_wait`) a WorkerTimeout names the slow envs, unless the restart budget allows replacing their workers.

        A crashed, raising or stuck worker within the `max_restarts` budget is replaced and its envs reset:
        their step reports truncated=True, reward 0, `final_obs` = the last observation returned, and
        `infos["worker_restart"]` (and `final_info["worker_restart"]`) True.
        """
        self._check_waiting("step")
        failures = self._collect(self._wait_bound if timeout is None else timeout, restart=self.max_restarts > 0)
        restarted = {w: self._restart(w, error) for w, error in sorted(failures.items())}
        self._waiting = None
        last_obs = list(iterate(self.observation_space, self._last_obs)) if restarted else None
        infos: dict[str, Any] = {}
        for w, sl in enumerate(self._slices):
            if w in restarted:
                obs_list, reset_infos = restarted[w]
                for i in range(sl.start, sl.stop):
                    self._rewards[i], self._terminations[i], self._truncations[i] = 0.0, False, True
                    infos = self._add_info(infos, {"final_obs": last_obs[i], "final_info": {"worker_restart": True}}, i)
                    infos = self._add_info(infos, dict(reset_infos[i - sl.start][1], worker_restart=True), i)
                self._store_obs(w, obs_list)
                continue
            reply = self._replies.pop(w)
            if reply is None:
                continue
            obs_list, extras = reply
            for k, final, info in extras:
                if final is not None:
                    infos = self._add_info(infos, {"final_obs": final[0], "final_info": final[1]}, sl.start + k)
                infos = self._add_info(infos, info, sl.start + k)
            self._store_obs(w, obs_list)
        self._last_obs = self._observations()
        return (
            self._last_obs,
            self._rewards.copy(),
            self._terminations.copy(),
            self._truncations.copy(),
            infos,
        )

    def _observations(self):
        if self._obs_in_shm:
            return _unflatten(self.single_observation_space, (view.copy() for view in self._obs_views))
        # Returns `out` filled in for array spaces, a fresh tuple for custom ones (Text, Graph, ...).
        return deepcopy(concatenate(self.single_observation_space, self._env_obs, self._obs_buffer))

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Calls `name(*args, **kwargs)` on every env (or reads it, if not callable); one result per env."""
        self._check_usable("call")
        self._send_all(_CALL, (name, args, kwargs))
        self._collect(self._wait_bound)
        return tuple(result for w in range(len(self._slices)) for result in self._replies.pop(w))

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
        for w, sl in enumerate(self._slices):
            self._send(w, _SET_ATTR, (name, list(values[sl])))
        self._collect(self._wait_bound)
        self._replies.clear()

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
        return [proc.pid for proc in self._procs]

    def close_extras(self, timeout: float | None = None, terminate: bool = False, **kwargs: Any) -> None:
        """Stops every worker: asks politely, waits up to `timeout` (default `close_timeout`; 0 with terminate),
        then kills them and the processes their envs started. A pending step or reset gets up to that long to
        finish (with a warning, unless the vec env is closed by leaving a `with` block on an exception)."""
        timeout = 0.0 if terminate else self.close_timeout if timeout is None else timeout
        if self._waiting is not None:
            if not self._closing_on_exception:
                warnings.warn(f"Calling `close` while waiting for a pending call to `{self._waiting}` to complete.",
                              UserWarning, stacklevel=3)  # fmt: skip
            deadline = time.monotonic() + timeout
            while set(self._pending) - self._stuck and time.monotonic() < deadline:  # not those known to be stuck
                try:
                    self._collect(deadline - time.monotonic())
                except (WorkerError, WorkerTimeout):
                    pass
            self._stuck.update(self._pending)
            self._waiting = None
        self._finalizer.detach()
        _shutdown(self._procs, self._conns, self._stuck, timeout)
        if self._inline is not None:
            self._inline.close()
        if self._shm_fd is not None:
            os.close(self._shm_fd)
            self._shm_fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        self._closing_on_exception = exc_info[0] is not None
        self.close()
