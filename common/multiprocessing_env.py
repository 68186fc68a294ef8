"""SubprocVecEnv: a gymnasium ``VectorEnv`` whose envs step in Pipe-connected worker processes.

    envs = SubprocVecEnv([lambda: gym.make("CartPole-v1") for _ in range(8)])
    obs, infos = envs.reset(seed=1)                        # env i is seeded with 1 + i
    obs, rewards, terminations, truncations, infos = envs.step(envs.action_space.sample())
    envs.close()

Results equal ``gymnasium.vector.SyncVectorEnv(env_fns, autoreset_mode=AutoresetMode.SAME_STEP)``:
a finished env is reset within the same step, its last observation and info are returned in
``infos["final_obs"]`` / ``infos["final_info"]`` (masks ``infos["_final_obs"]`` / ``infos["_final_info"]``).

Each worker process steps ``envs_per_worker`` envs per round trip. Observations, actions, rewards and
flags live in one shared-memory block that workers write in place; the pipe carries a one-byte command
and a one-byte reply, plus pickled infos only when an env reports any (or the observation space cannot
live in shared memory). Any failure in a worker (an exception in env code, a crash, a kill) reaches the
caller as ``WorkerError`` naming the env, the command and the remote traceback.
"""

from __future__ import annotations

import mmap
import multiprocessing as mp
import os
import pickle
import select
import signal
import socket
import struct
import sys
import tempfile
import time
import traceback
import warnings
import weakref
from collections.abc import Callable, Sequence
from copy import deepcopy
from typing import Any

import cloudpickle
import gymnasium as gym
import numpy as np
from gymnasium.error import AlreadyPendingCallError, ClosedEnvironmentError, NoAsyncCallError
from gymnasium.spaces import Box, Dict, Discrete, MultiBinary, MultiDiscrete, Tuple
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array, iterate

__all__ = ["SubprocVecEnv", "WorkerError"]

# Wire protocol. Commands are one byte, optionally followed by a pickled argument.
_STEP, _RESET, _CALL, _SET_ATTR, _ATTACH, _CLOSE = b"s", b"r", b"c", b"a", b"m", b"x"
_COMMAND_NAMES = {_STEP: "step", _RESET: "reset", _CALL: "call", _SET_ATTR: "set_attr"}
# Replies are one status byte, optionally followed by a pickled payload.
_OK, _PAYLOAD, _ERROR = b"\x00", b"\x01", b"\x02"
_PICKLE = pickle.HIGHEST_PROTOCOL
_BASE_SPACES = (Box, Discrete, MultiDiscrete, MultiBinary)


class WorkerError(RuntimeError):
    """An env in a worker process raised, or a worker process died. The message says which, where and why."""

    def __init__(self, message: str, env_indices: Sequence[int], command: str, exitcode: int | None = None):
        super().__init__(message)
        self.env_indices = tuple(env_indices)
        self.command = command
        self.exitcode = exitcode


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


def _views(buffer: mmap.mmap, layout: list[tuple]) -> dict[str, np.ndarray]:
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

    Raw os.read/os.write with one read per message in the common case: about half the cost of
    multiprocessing.Connection, which matters when a whole CartPole step costs a few microseconds.
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

    def recv(self) -> bytes:
        """The next whole message; EOFError once the other end is closed."""
        buffer, size = self._buffer, self._HEADER.size
        while True:
            if len(buffer) >= size:
                end = size + self._HEADER.unpack_from(buffer)[0]
                if len(buffer) >= end:
                    self._buffer = buffer[end:]
                    return buffer[size:end]
            chunk = os.read(self.fd, max(1 << 16, (end if len(buffer) >= size else 0) - len(buffer)))
            if not chunk:
                raise EOFError("the other end of the pipe is closed")
            buffer += chunk

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


def _worker(
    first: int, env_fns_bytes: bytes, sock: socket.socket, parent_sock: socket.socket | None, spin: float
) -> None:
    """Worker process main loop: builds its envs, then answers commands until told to close."""
    if parent_sock is not None:  # fork start: drop the inherited parent end so the parent's death reads as EOF
        parent_sock.close()
    conn = _Channel(sock)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle; it then closes us
    envs: list[gym.Env] = []
    command, k = "make", 0  # what the worker is doing, and to which of its envs: named in any error
    try:
        env_fns = cloudpickle.loads(env_fns_bytes)
        for k in range(len(env_fns)):
            envs.append(env_fns[k]())
        k, n = 0, len(envs)
        spaces = [(env.observation_space, env.action_space) for env in envs]
        conn.send(_PAYLOAD + pickle.dumps((spaces, envs[0].metadata, envs[0].render_mode), _PICKLE))

        command = "attach"  # map the block the parent laid out from those spaces: this worker's rows only
        msg, fd = conn.recv_fd()
        size, layout, obs_in_shm = pickle.loads(memoryview(msg)[1:])
        block = mmap.mmap(fd, size)
        os.close(fd)
        views = {name: view[first : first + n] for name, view in _views(block, layout).items()}
        rewards, terminations, truncations = views["rewards"], views["terminations"], views["truncations"]
        obs_space = envs[0].observation_space
        obs_views = [views[f"obs{j}"] for j in range(len(_leaves(obs_space)))] if obs_in_shm else None
        copy_actions = views["actions"].ndim > 1  # array actions: the parent overwrites the block next step
        conn.send(_OK)

        def store(k: int, obs: Any, obs_list: list) -> None:
            if obs_views is None:
                obs_list.append(obs)
            else:
                for view, leaf in zip(obs_views, _flatten(obs_space, obs), strict=True):
                    view[k] = leaf

        while True:
            conn.spin(spin)
            msg = conn.recv()
            cmd = msg[:1]
            command = _COMMAND_NAMES.get(cmd, "close")
            arg = pickle.loads(memoryview(msg)[1:]) if len(msg) > 1 else None
            if cmd == _STEP:
                actions = views["actions"] if arg is None else arg
                extras, obs_list = [], []
                for k in range(n):
                    action = actions[k].copy() if copy_actions and arg is None else actions[k]
                    obs, reward, terminated, truncated, info = envs[k].step(action)
                    if terminated or truncated:
                        final = (obs, info)
                        obs, info = envs[k].reset()
                        extras.append((k, final, info))
                    elif info:
                        extras.append((k, None, info))
                    rewards[k], terminations[k], truncations[k] = reward, terminated, truncated
                    store(k, obs, obs_list)
                if obs_views is None or extras:
                    conn.send(_PAYLOAD + pickle.dumps((obs_list or None, extras), _PICKLE))
                else:
                    conn.send(_OK)
            elif cmd == _RESET:
                seeds, options, mask = arg
                obs_list, infos = [], []
                for k in range(n):
                    if not mask[k]:
                        obs_list.append(None)
                        continue
                    obs, info = envs[k].reset(seed=seeds[k], options=options)
                    infos.append((k, info))
                    store(k, obs, obs_list)
                conn.send(_PAYLOAD + pickle.dumps((obs_list if obs_views is None else None, infos), _PICKLE))
            elif cmd == _CALL:
                name, args, kwargs = arg
                results = []
                for k in range(n):
                    attr = envs[k].get_wrapper_attr(name)
                    results.append(attr(*args, **kwargs) if callable(attr) else attr)
                conn.send(_PAYLOAD + pickle.dumps(results, _PICKLE))
            elif cmd == _SET_ATTR:
                name, values = arg
                for k in range(n):
                    envs[k].set_wrapper_attr(name, values[k])
                conn.send(_OK)
            else:
                break
    except BaseException as exc:  # noqa: BLE001 - everything must reach the parent, then this process ends
        try:
            summary = f"{type(exc).__qualname__}: {exc}"
        except Exception:  # noqa: BLE001 - an exception whose __str__ fails still gets reported
            summary = type(exc).__qualname__
        try:
            conn.send(_ERROR + pickle.dumps((first + k, command, summary, traceback.format_exc()), _PICKLE))
        except OSError:
            pass
    finally:
        for env in envs:
            try:
                env.close()
            except Exception:  # noqa: BLE001 - closing is best effort; the process is ending anyway
                pass
        conn.close()


def _shutdown(procs: list, conns: list, stuck: set[int], timeout: float) -> None:
    """Ask workers to exit, wait up to `timeout`, then terminate and kill whatever is left."""
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
    for conn in conns:
        conn.close()
    procs.clear()
    conns.clear()


# Imported once in the forkserver when the trainer has them, so that workers fork with them loaded. Workers re-run
# the main script on start (spawn semantics), and CPython's forkserver never preloads it (it looks for a
# "main_path" key that get_preparation_data does not set): a script importing torch cost every worker 1.3 s here.
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


class SubprocVecEnv(VectorEnv):
    """Vector env stepping its envs in worker processes; same results as SyncVectorEnv(autoreset_mode=SAME_STEP).

    Args:
        env_fns: zero-argument callables that build one env each (lambdas and closures are fine).
        envs_per_worker: envs stepped by each worker process per round trip. None: spread the envs
            over as many workers as there are usable CPU cores.
        context: multiprocessing start method, "forkserver" (default where available), "spawn" or "fork".
        shared_memory: keep observations in shared memory (no pickling). Spaces that cannot live there
            (Text, Graph, ...) go over the pipe either way.
        close_timeout: seconds `close()` waits for workers to exit before terminating them.
        worker_spin: seconds a worker keeps polling for its next command (yielding the CPU) before it sleeps.
            The trainer's next step usually comes within it, and skipping the sleep saves a process wake-up per
            step (ppo_vec.py, CartPole, 8 envs on 2 cores: 13-25% less env wait). Costs at most this much CPU
            per command; 0 sleeps at once. None: 300 us, or 0 when workers outnumber the usable cores (then
            a polling worker takes CPU time from one with work to do).
    """

    def __init__(
        self,
        env_fns: Sequence[Callable[[], gym.Env]],
        *,
        envs_per_worker: int | None = None,
        context: str | None = None,
        shared_memory: bool = True,
        max_restarts: int = 0,
        step_timeout: float | None = None,
        close_timeout: float = 5.0,
        worker_spin: float | None = None,
    ):
        super().__init__()
        env_fns = list(env_fns)
        if not env_fns or not all(callable(fn) for fn in env_fns):
            raise ValueError("env_fns must be a non-empty sequence of zero-argument callables that build an env")
        self.num_envs = len(env_fns)
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        if envs_per_worker is None:
            envs_per_worker = -(-self.num_envs // min(cores, self.num_envs))
        if not isinstance(envs_per_worker, int) or envs_per_worker < 1:
            raise ValueError(f"envs_per_worker must be a positive int (or None), got {envs_per_worker!r}")
        context = context or _default_context()
        if context not in mp.get_all_start_methods():
            raise ValueError(f"context must be one of {mp.get_all_start_methods()}, got {context!r}")
        if max_restarts < 0:
            raise ValueError(f"max_restarts must be >= 0, got {max_restarts}")
        if worker_spin is not None and worker_spin < 0:
            raise ValueError(f"worker_spin must be >= 0 seconds (or None), got {worker_spin}")
        if step_timeout is not None and step_timeout <= 0:
            raise ValueError(f"step_timeout must be > 0 seconds (or None), got {step_timeout}")
        self.envs_per_worker = envs_per_worker
        self.max_restarts, self.restarts, self.step_timeout = max_restarts, 0, step_timeout
        self.close_timeout = close_timeout
        self._slices = [
            slice(lo, min(lo + envs_per_worker, self.num_envs)) for lo in range(0, self.num_envs, envs_per_worker)
        ]
        self.num_workers = len(self._slices)
        self.worker_spin = (300e-6 if self.num_workers <= cores else 0.0) if worker_spin is None else worker_spin
        self._env_fns_bytes = [cloudpickle.dumps(env_fns[sl]) for sl in self._slices]  # kept to rebuild crashed envs
        self._ctx, self._fork = mp.get_context(context), context == "fork"
        if context == "forkserver":  # only takes effect before this process's forkserver first starts
            self._ctx.set_forkserver_preload(["__main__", *(m for m in _FORKSERVER_PRELOAD if m in sys.modules)])
        self._procs: list = []
        self._conns: list = []
        self._stuck: set[int] = set()  # workers that failed to answer in time: terminated, not asked, on close
        self._finalizer = weakref.finalize(self, _shutdown, self._procs, self._conns, self._stuck, close_timeout)
        self._poller = select.poll()  # every worker's socket and process sentinel (readable once it exits)
        self._fd_owner: dict[int, int] = {}
        self._pending: dict[int, str] = {}  # worker -> command awaiting its reply
        self._replies: dict[int, Any] = {}
        self._failed: WorkerError | None = None
        self._waiting_step = False
        self._shm_fd: int | None = None
        try:
            for w in range(self.num_workers):
                self._start_worker(w)
            self._setup(shared_memory)
        except BaseException:
            self.close(timeout=1.0)
            raise

    def _start_worker(self, w: int) -> None:
        """Starts worker `w` (afresh after a crash) and watches its socket and sentinel; it answers with spaces."""
        parent_sock, child_sock = socket.socketpair()
        proc = self._ctx.Process(
            target=_worker,
            name=f"SubprocVecEnv-worker-{w}",
            args=(
                self._slices[w].start,
                self._env_fns_bytes[w],
                child_sock,
                parent_sock if self._fork else None,
                self.worker_spin,
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
        for fd in (conn.fd, proc.sentinel):
            self._poller.register(fd, select.POLLIN)
            self._fd_owner[fd] = w
        self._pending[w] = "make"

    def _unwatch(self, w: int) -> None:
        """Takes worker `w`'s socket and sentinel out of the poll set: its exit is known, not news."""
        for fd in (self._conns[w].fd, self._procs[w].sentinel):
            if self._fd_owner.pop(fd, None) is not None:
                self._poller.unregister(fd)

    def _forget(self, w: int) -> None:
        """Stops watching worker `w` and makes sure it is gone."""
        self._unwatch(w)
        self._conns[w].close()
        self._procs[w].kill()
        self._procs[w].join(2.0)
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

    def _setup(self, shared_memory: bool) -> None:
        """Checks every env's spaces against env 0's, then maps one shared block into every worker."""
        self._collect(None)
        replies = [self._replies.pop(w) for w in range(self.num_workers)]
        self.single_observation_space, self.single_action_space = replies[0][0][0]
        for w, (spaces, _, _) in enumerate(replies):
            self._check_spaces(self._slices[w].start, spaces)
        self.metadata = dict(replies[0][1], autoreset_mode=AutoresetMode.SAME_STEP)
        self.render_mode = replies[0][2]
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)

        n = self.num_envs
        fields = [("rewards", (n,), np.float64), ("terminations", (n,), np.bool_), ("truncations", (n,), np.bool_)]
        act = self.single_action_space
        self._actions_in_shm = isinstance(act, _BASE_SPACES)
        act_shape, act_dtype = ((n, *act.shape), act.dtype) if self._actions_in_shm else ((0,), np.uint8)
        fields.append(("actions", act_shape, act_dtype))
        try:
            obs_leaves = _leaves(self.single_observation_space) if shared_memory else None
        except TypeError:
            obs_leaves = None
        self._obs_in_shm = obs_leaves is not None
        for j, leaf in enumerate(obs_leaves or []):
            fields.append((f"obs{j}", (n, *leaf.shape), leaf.dtype))
        layout, size = _layout(fields)
        self._attach_message = _ATTACH + pickle.dumps((size, layout, self._obs_in_shm), _PICKLE)
        self._shm_fd = _anonymous_file(size)
        self._shm = mmap.mmap(self._shm_fd, size)
        for w in range(self.num_workers):
            self._attach(w)
        self._collect(None)
        self._replies.clear()
        views = _views(self._shm, layout)
        self._rewards, self._terminations = views["rewards"], views["terminations"]
        self._truncations, self._action_buffer = views["truncations"], views["actions"]
        self._obs_views = [views[f"obs{j}"] for j in range(len(obs_leaves))] if self._obs_in_shm else None
        if not self._obs_in_shm:
            self._env_obs: list[Any] = [None] * n
            self._obs_buffer = create_empty_array(self.single_observation_space, n=n, fn=np.zeros)

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
        if self._waiting_step:
            raise AlreadyPendingCallError(
                f"SubprocVecEnv.{name}() was called while a step_async() is pending; call step_wait() first", "step"
            )

    def _send(self, w: int, cmd: bytes, arg: Any = None) -> None:
        try:
            self._conns[w].send(cmd if arg is None else cmd + pickle.dumps(arg, _PICKLE))
        except OSError:
            pass  # a dead worker: its sentinel is readable, and _collect reports it
        self._pending[w] = _COMMAND_NAMES[cmd]

    def _send_all(self, cmd: bytes, arg: Any = None) -> None:
        for w in range(self.num_workers):
            self._send(w, cmd, arg)

    def _envs_of(self, w: int) -> list[int]:
        return list(range(self.num_envs)[self._slices[w]])

    def _collect(self, timeout: float | None, restart: bool = False) -> dict[int, WorkerError]:
        """Waits for the reply of every pending worker into `self._replies`; raises on death, error or timeout.

        All replies on their way are still collected after a failure, then the failure of the lowest env index
        is raised, so the report does not depend on who answered first. With `restart`, failures that fit in
        the restart budget are returned instead, for the caller to restart those workers.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        failures: dict[int, WorkerError] = {}
        while self._pending:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic()) * 1000
            ready = {self._fd_owner[fd] for fd, _ in self._poller.poll(remaining)}
            if not ready:
                stuck = sorted(self._pending)
                command = self._pending[stuck[0]]
                envs = [i for w in stuck for i in self._envs_of(w)]
                message = f"envs {envs} did not answer '{command}' within {timeout} s (workers {stuck})"
                self._stuck.update(stuck)  # never asked politely again: terminated on restart or close
                if restart and self.restarts + len(failures) + len(stuck) <= self.max_restarts:
                    for w in stuck:
                        failures[w] = WorkerError(message, self._envs_of(w), command)
                        del self._pending[w]
                    break
                raise TimeoutError(f"{message}; call step_wait() again to keep waiting, or close()")
            for w in sorted(ready):
                if w not in self._pending:  # an idle worker is readable only once it has died
                    failures[w] = self._death(w)
                    continue
                try:
                    msg = self._conns[w].recv()
                except (EOFError, OSError):
                    failures[w] = self._death(w)
                    del self._pending[w]
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
            ordered = sorted(failures.items(), key=lambda item: item[1].env_indices)
            error = ordered[0][1]
            if len(ordered) > 1:
                error.args = (
                    f"{error.args[0]}\n(envs {[i for _, e in ordered[1:] for i in e.env_indices]} failed too)",
                )
            self._failed = error
            raise error
        return failures

    def _error(self, w: int, payload: tuple) -> WorkerError:
        env_index, command, summary, remote_tb = payload
        return WorkerError(
            f"env {env_index} raised {summary} during '{command}' (worker {w}, pid {self._procs[w].pid}).\n"
            f"Worker traceback:\n{remote_tb}",
            [env_index],
            command,
        )

    def _death(self, w: int) -> WorkerError:
        proc, command = self._procs[w], self._pending.get(w, "?")
        proc.join(2.0)  # it closed its pipe: collect the exit code it is about to have
        self._unwatch(w)
        return WorkerError(
            f"worker {w} (pid {proc.pid}, envs {self._envs_of(w)}) {_describe_exit(proc.exitcode)} during "
            f"'{command}'; close() this SubprocVecEnv and build a new one",
            self._envs_of(w),
            command,
            proc.exitcode,
        )

    def _restart(self, w: int, error: WorkerError) -> tuple:
        """Replaces crashed worker `w` with a fresh one and resets its envs; returns the reset reply."""
        self.restarts += 1
        reason = str(error).splitlines()[0]
        warnings.warn(
            f"SubprocVecEnv: restarting worker {w} (envs {self._envs_of(w)}), restart {self.restarts} of "
            f"{self.max_restarts}, after: {reason}",
            RuntimeWarning,
            stacklevel=3,
        )
        self._forget(w)
        self._start_worker(w)
        self._collect(None)
        self._check_spaces(self._slices[w].start, self._replies.pop(w)[0])
        self._attach(w)
        self._collect(None)
        n = len(self._envs_of(w))
        self._send(w, _RESET, ([None] * n, None, np.ones(n, dtype=np.bool_)))
        self._collect(None)
        return self._replies.pop(w)

    # ------------------------------------------------------------------ VectorEnv API
    def reset(self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None):
        """Resets every env (or those in `options["reset_mask"]`); an int seed gives env i the seed `seed + i`."""
        self._check_usable("reset")
        if seed is None:
            seed = [None] * self.num_envs
        elif isinstance(seed, int):
            seed = [seed + i for i in range(self.num_envs)]
        if len(seed) != self.num_envs:
            raise ValueError(f"reset(seed=...) got a list of {len(seed)} seeds for {self.num_envs} envs")
        mask = np.ones(self.num_envs, dtype=np.bool_)
        if options is not None and "reset_mask" in options:
            mask = options.pop("reset_mask")
            if not isinstance(mask, np.ndarray) or mask.shape != (self.num_envs,) or mask.dtype != np.bool_:
                raise ValueError(f"options['reset_mask'] must be a bool numpy array of shape ({self.num_envs},)")
            if not mask.any():
                raise ValueError("options['reset_mask'] must select at least one env")
        workers = [w for w, sl in enumerate(self._slices) if mask[sl].any()]
        for w in workers:
            sl = self._slices[w]
            self._send(w, _RESET, (seed[sl], options, mask[sl]))
        self._collect(None)
        infos: dict[str, Any] = {}
        for w in workers:
            obs_list, env_infos = self._replies.pop(w)
            for k, info in env_infos:
                infos = self._add_info(infos, info, self._slices[w].start + k)
            self._store_obs(w, obs_list)
        self._last_obs = self._observations()
        return self._last_obs, infos

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
            if actions.shape[:1] != (self.num_envs,):
                raise ValueError(f"step() got {len(actions) if actions.ndim else 0} actions for {self.num_envs} envs")
        else:
            actions = list(iterate(self.action_space, actions))
            if len(actions) != self.num_envs:
                raise ValueError(f"step() got {len(actions)} actions for {self.num_envs} envs")
        # Same dtype and shape: write once into shared memory. Anything else goes pickled, exactly as given.
        in_shm = self._actions_in_shm and actions.dtype == act.dtype and actions.shape == act.shape
        if in_shm:
            act[...] = actions
        for w, sl in enumerate(self._slices):
            self._send(w, _STEP, None if in_shm else list(actions[sl]))
        self._waiting_step = True

    def step_wait(self, timeout: float | None = None):
        """Waits for the step sent by `step_async`. After `timeout` seconds (default: `step_timeout`) a
        TimeoutError names the slow envs, unless the restart budget allows replacing their workers.

        A crashed, raising or stuck worker within the `max_restarts` budget is replaced and its envs reset:
        their step reports truncated=True, reward 0, `final_obs` = the last observation returned, and
        `infos["worker_restart"]` (and `final_info["worker_restart"]`) True.
        """
        if self.closed:
            raise ClosedEnvironmentError("SubprocVecEnv.step_wait() was called after close(); build a new one")
        if not self._waiting_step:
            raise NoAsyncCallError("step_wait() was called without a pending step_async()", "step")
        failures = self._collect(self.step_timeout if timeout is None else timeout, restart=self.max_restarts > 0)
        restarted = {w: self._restart(w, error) for w, error in sorted(failures.items())}
        self._waiting_step = False
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
        self._collect(None)
        return tuple(result for w in range(self.num_workers) for result in self._replies.pop(w))

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
        self._collect(None)
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
        """Process ids of the live workers, in worker order."""
        return [proc.pid for proc in self._procs]

    def close_extras(self, timeout: float | None = None, **kwargs: Any) -> None:
        """Stops every worker: asks politely, waits up to `timeout` (default `close_timeout`), then kills."""
        self._finalizer.detach()
        _shutdown(self._procs, self._conns, self._stuck, self.close_timeout if timeout is None else timeout)
        if self._shm_fd is not None:
            os.close(self._shm_fd)
            self._shm_fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
