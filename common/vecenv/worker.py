"""A SubprocVecEnv's protocol and its worker side: the loop a worker process runs, and EnvGroup,
which steps a worker's envs into their rows of the shared block (also in the calling process).

The life of a step: the trainer writes the actions into the shared block and sends STEP, one byte,
to every worker; each steps its envs, resets those that ended (keeping final_obs and final_info),
writes observations, rewards and flags into its rows, and answers OK, one byte, or pickled infos
when an env gave some; the trainer waits for every answer within a bound (pools.py), then reads the
block. Every message is a Command byte, every answer a Reply byte, each maybe followed by a pickle.
A worker first says it has started, then builds and describes its envs; a failure sends
errors.error_report and ends the worker."""

import contextlib
import enum
import mmap
import os
import pickle
import select
import shutil
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import cloudpickle
import gymnasium as gym
import numpy as np

from . import env_state, process_control, shared_block
from .errors import error_report
from .messages import Channel

PICKLE = pickle.HIGHEST_PROTOCOL
SHORT_SPIN = 300e-6  # seconds: the window after a command that came later than the longest one


class Command(enum.Enum):
    """A message's first byte."""

    ATTACH = b"m"
    STEP = b"s"
    RESET = b"r"
    CALL = b"c"
    SET_ATTR = b"a"
    SAVE_STATES = b"v"
    LOAD_STATES = b"l"
    CLOSE = b"x"


class Reply:
    """The first byte of a worker's answer."""

    OK, PAYLOAD, ERROR = b"\x00", b"\x01", b"\x02"


def encode(command: Command, arg: Any = None) -> bytes:
    return command.value if arg is None else command.value + pickle.dumps(arg, PICKLE)


def decode(msg: bytes) -> tuple[Command, Any]:
    """ValueError for an unknown command byte."""
    return Command(msg[:1]), pickle.loads(memoryview(msg)[1:]) if len(msg) > 1 else None


def describe(envs: list[gym.Env]) -> tuple:
    """What envs say first: each one's spaces (env 0's become the vec env's), env 0's metadata and render mode."""
    return [(env.observation_space, env.action_space) for env in envs], envs[0].metadata, envs[0].render_mode


def close_envs(envs: list[gym.Env]) -> None:
    for env in envs:
        with contextlib.suppress(Exception):  # a failing close must not keep the others open
            env.close()


class EnvGroup:
    """The envs of one worker and their rows of the shared block (`current`: the env under way)."""

    def __init__(self, envs: list[gym.Env], views: dict[str, np.ndarray], obs_in_shm: bool):
        self.envs, self.views, self.current = envs, views, 0
        self.obs_space = envs[0].observation_space
        self.obs_view = views["obs"] if obs_in_shm else None
        # array actions: the block is overwritten next step
        self.copy_actions = views["actions"].ndim > 1

    def run(self, command: Command, arg: Any) -> Any:
        """The method named for the command (STEP: step, ...); AttributeError for ATTACH or CLOSE."""
        return getattr(self, command.name.lower())(arg)

    def _each(self, items: list) -> Iterator[tuple[int, Any]]:
        """(k, env k's item), k `current` until the next is asked for."""
        for k, item in enumerate(items):
            self.current = k
            yield k, item

    def _store(self, k: int, obs: Any, obs_list: list) -> None:
        if self.obs_view is None:
            obs_list.append(obs)
        # numpy would broadcast a scalar into the row silently
        elif np.shape(obs) != self.obs_view.shape[1:]:
            shape = self.obs_view.shape[1:]
            raise ValueError(f"the observation has shape {np.shape(obs)}, but its space {self.obs_space} has {shape}")
        else:
            self.obs_view[k] = obs

    def step(self, actions_arg: list | None) -> tuple | None:
        """Steps every env, resetting those that ended; None if only the block changed."""
        actions = self.views["actions"] if actions_arg is None else actions_arg
        rewards, terminations, truncations = (self.views[k] for k in ("rewards", "terminations", "truncations"))
        extras, obs_list = [], []
        for k, env in enumerate(self.envs):
            self.current = k  # (not _each: the step is the hot path)
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
        return (obs_list or None, extras) if self.obs_view is None or extras else None

    def reset(self, arg: tuple) -> tuple:
        seeds, options, mask = arg
        obs_list, infos = [], []
        for k, env in self._each(self.envs):
            if not mask[k]:
                obs_list.append(None)
                continue
            obs, info = env.reset(seed=seeds[k], options=options)
            infos.append((k, None, info))  # as step's extras: (k, final, info)
            self._store(k, obs, obs_list)
        return obs_list if self.obs_view is None else None, infos

    def call(self, arg: tuple) -> list:
        name, args, kwargs = arg
        attrs = (env.get_wrapper_attr(name) for _, env in self._each(self.envs))
        return [attr(*args, **kwargs) if callable(attr) else attr for attr in attrs]

    def set_attr(self, arg: tuple) -> None:
        name, values = arg
        for k, env in self._each(self.envs):
            env.set_wrapper_attr(name, values[k])

    def save_states(self, arg: None) -> list[dict | None]:
        return [env_state.take(env) for _, env in self._each(self.envs)]

    def load_states(self, states: list) -> list[str | None]:
        """Each env's state set onto it; for one that does not fit, why (that env then as it was)."""
        reasons = []
        for k, state in self._each(states):
            try:
                env_state.put(self.envs[k], state)
                reasons.append(None)
            except Exception as exc:  # noqa: BLE001 - data that does not fit this env, said in a line
                reasons.append(f"{type(exc).__name__}: {exc}"[:300])
        return reasons


def _end(lifeline: socket.socket, tmpdir: str | None, wait: float | None) -> None:
    """Ends this worker and its helpers after `wait` s or (None: the watch thread's) once the trainer is gone."""
    poller = select.poll()
    poller.register(lifeline, select.POLLIN)
    if poller.poll(None if wait is None else wait * 1000) and tmpdir:  # nobody else would remove it
        shutil.rmtree(tmpdir, ignore_errors=True)
    if os.getpgid(0) == os.getpid():
        os.killpg(0, signal.SIGKILL)
    os._exit(1)


def worker_main(
    first: int,
    env_fns_bytes: bytes,
    sock: socket.socket,
    lifeline: socket.socket,
    close_fds: list,
    spin: float,
    tmpdir: str | None,
):
    """A worker: builds and describes its envs, maps the block, answers commands until CLOSE."""
    # fork start: the parent's ends of every pipe, so that its death reads as EOF
    for fd in close_fds:
        with contextlib.suppress(OSError):
            os.close(fd)
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)  # a process group of its own: the helpers its envs start end with it
    process_control.ignore_stop_signals()
    signal.set_wakeup_fd(-1)  # a forked worker's signals are not the trainer's
    threading.Thread(target=_end, args=(lifeline, tmpdir, None), name="watch-trainer", daemon=True).start()
    conn, envs, group = Channel(sock), [], None
    doing, k = "make", 0  # what the worker is doing, and to which of its envs: named in any error
    try:
        env_fns = cloudpickle.loads(env_fns_bytes)  # imports the envs' modules: still starting
        conn.send(Reply.OK)  # started: from now on the parent times the envs' own build
        for k in range(len(env_fns)):
            envs.append(env_fns[k]())
        k = 0
        conn.send(Reply.PAYLOAD + pickle.dumps(describe(envs), PICKLE))

        doing = "attach"  # the block the parent laid out from those spaces: this worker's rows only
        msg, fd = conn.recv_fd()
        size, offsets, obs_in_shm = decode(msg)[1]
        block = mmap.mmap(fd, size)
        os.close(fd)
        views = {name: view[first : first + len(envs)] for name, view in shared_block.views(block, offsets).items()}
        group = EnvGroup(envs, views, obs_in_shm)
        conn.send(Reply.OK)

        window, answered, command = spin, time.perf_counter(), None
        while command is not Command.CLOSE:
            conn.spin(window)
            command, arg = decode(conn.recv())
            doing = command.name.lower()
            window = spin if time.perf_counter() - answered <= spin else min(spin, SHORT_SPIN)
            if command is not Command.CLOSE:
                reply = group.run(command, arg)
                conn.send(Reply.OK if reply is None else Reply.PAYLOAD + pickle.dumps(reply, PICKLE))
                answered = time.perf_counter()
    except (EOFError, ConnectionError):  # the trainer is gone without a word, or died as we replied
        pass
    except BaseException as exc:  # noqa: BLE001 - everything must reach the parent, then this process ends
        index = first + (group.current if group is not None else k)
        with contextlib.suppress(OSError):
            conn.send(Reply.ERROR + pickle.dumps(error_report(index, doing, exc), PICKLE))
    finally:
        close_envs(envs)
        conn.close()
        if doing != "close":  # however the worker got here, its helpers end with it, not after it
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            _end(lifeline, tmpdir, wait=0.1 if tmpdir else 0.0)
