"""How SubprocVecEnv chooses where its envs step, without running env code in the calling process.

A process round trip costs more than a cheap env step: on 2 cores, 8 CartPoles step faster in the calling process
than in workers. With num_workers=None (and no step_timeout or max_restarts, which need workers):

1. `probe` builds one env (the last: env 0 often records video) in a probe process of its own and times its steps
   there: the real per-step time, bounded like any wait on a worker (a hang is a WorkerTimeout naming the env), in a
   process group that is ended afterwards with any helper the env started. The env is never built or stepped in the
   calling process, and the probe does not import the main script (nor torch): it starts in a fraction of a second.
2. If the time workers would save is large next to any round trip (2 ms a step), workers: one per core.
3. Otherwise, a step of num_envs stand-in envs that take as long (our code only) is timed in this process and in one
   forked worker per core; workers only if they are at least 10% faster (a step in the calling process is easier to
   debug and has no worker to lose).

If the probe cannot build or step the env (an error, a crash, or a registration only the main script makes),
workers are chosen: they report the real failure, if there is one, as a WorkerError naming the env.
"""

from __future__ import annotations

import functools
import math
import os
import pickle
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import cloudpickle
import gymnasium as gym
import numpy as np
from gymnasium.spaces import Box, Discrete

from common.channel import Channel
from common.processes import plural, stop_signals_blocked
from common.worker import error_report

CLEARLY_WORTH = 2e-3  # seconds a step that workers save: far more than a process round trip costs
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the folder that holds common/
_BOOT = (
    "import signal\n"  # stopping is the trainer's (it started us with SIGINT and SIGTERM held back)
    "for signum in (signal.SIGINT, signal.SIGTERM): signal.signal(signum, signal.SIG_IGN)\n"
    "signal.pthread_sigmask(signal.SIG_UNBLOCK, (signal.SIGINT, signal.SIGTERM))\n"
    "import pickle, sys\n"
    "data = pickle.load(sys.stdin.buffer)\n"
    "sys.path[:] = data['path']\n"
    "from common.layout_choice import probe_main\n"
    "probe_main(data)\n"
)


class ProbeFailed(Exception):
    """The probe could not build or step the env: `phase` (make, reset, step) and `summary` say how."""

    def __init__(self, phase: str, summary: str):
        super().__init__(f"{summary} during '{phase}'")
        self.phase, self.summary = phase, summary


def probe(env_fn: Callable[[], gym.Env], bound: float, index: int | None, steps: bool = True,
          interrupt: Any = None) -> dict[str, Any]:  # fmt: skip
    """Builds env_fn() in a probe process, resets it and (with `steps`) times its steps with random actions for
    about 20 ms (at least one step). Returns {"spaces", "make", "step", "length", "final_info"}: the env's spaces,
    seconds to build it, seconds per step (resets included), steps per episode, the info of an episode's end.
    ProbeFailed if env code raised or the probe died; WorkerTimeout (naming env `index` and the phase) past `bound`
    seconds."""
    from common.pools import WorkerTimeout

    parent, child = socket.socketpair()
    data = {"path": [_ROOT, *sys.path], "fd": child.fileno(), "env_fn": cloudpickle.dumps(env_fn), "steps": steps,
            "registry": _registry()}  # fmt: skip
    with stop_signals_blocked():
        proc = subprocess.Popen([sys.executable, "-S", "-c", _BOOT], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, pass_fds=[child.fileno()],
                                start_new_session=True)  # fmt: skip
    child.close()
    conn, phase, deadline = Channel(parent), "make", time.monotonic() + bound
    poller = select.poll()
    poller.register(conn.fd, select.POLLIN)
    if interrupt is not None:  # a stop ends the wait (SubprocVecEnv's `interrupt`)
        poller.register(interrupt.fileno(), select.POLLIN)
    try:
        proc.stdin.write(pickle.dumps(data, pickle.HIGHEST_PROTOCOL))
        proc.stdin.close()
        while True:
            msg = conn.message()
            while msg is None:
                remaining = deadline - time.monotonic()
                events = poller.poll(remaining * 1000) if remaining > 0 else []
                if interrupt is not None and any(fd == interrupt.fileno() for fd, _ in events):
                    interrupt.check()
                if not events:
                    what = "the env" if index is None else f"env {index}"
                    message = f"{what} did not answer '{phase}' within {bound:g} s (in the layout probe)"
                    raise WorkerTimeout(message, [] if index is None else [index], phase)
                open_ = conn.pump()
                msg = conn.message()
                if msg is None and not open_:
                    raise ProbeFailed(phase, f"the probe process ended ({_ended(proc)})")
            kind, value = pickle.loads(msg)
            if kind == "phase":
                phase = value
            elif kind == "error":
                raise ProbeFailed(phase, value[2])
            else:
                return value
    finally:
        _end(proc, conn)


def _registry() -> bytes | None:
    """gymnasium's registry as this process has it (ids registered by the main script, or by importing ale_py), for
    the probe to make env ids the same way; None if some entry does not pickle."""
    try:
        return cloudpickle.dumps(dict(gym.registry))
    except Exception:  # noqa: BLE001 - the probe then knows the ids its imports register
        return None


def _ended(proc: subprocess.Popen) -> str:
    try:
        code = proc.wait(timeout=1.0)
    except subprocess.TimeoutExpired:
        return "closed its pipe"
    return f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"


def _end(proc: subprocess.Popen, conn: Channel) -> None:
    """Ends the probe and every process its env started (they share its process group)."""
    conn.close()
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=5.0)
    except subprocess.TimeoutExpired:
        pass


def probe_main(data: dict) -> None:
    """The probe process: builds the env, resets it, times its steps, sends what it found, then ends."""
    conn = Channel(socket.socket(fileno=data["fd"]))
    phase, env = "make", None
    try:
        if data["registry"] is not None:
            gym.registry.update(pickle.loads(data["registry"]))
        env_fn = cloudpickle.loads(data["env_fn"])
        start = time.perf_counter()
        env = env_fn()
        result = {"spaces": (env.observation_space, env.action_space), "make": time.perf_counter() - start,
                  "raw_spaces": (env.unwrapped.observation_space, env.unwrapped.action_space)}  # fmt: skip
        result.update(step=None, length=math.inf, final_info={})
        if data["steps"]:
            conn.send(pickle.dumps(("phase", "reset")))
            phase = "reset"
            env.reset(seed=0)
            conn.send(pickle.dumps(("phase", "step")))
            phase = "step"
            result.update(_time_steps(env))
        try:
            payload = pickle.dumps(("result", result), pickle.HIGHEST_PROTOCOL)
        except Exception:  # noqa: BLE001 - an info that does not pickle: the stand-ins end episodes without it
            payload = pickle.dumps(("result", dict(result, final_info={})), pickle.HIGHEST_PROTOCOL)
        conn.send(payload)
    except Exception as exc:  # noqa: BLE001 - env code: reported in one line, the caller decides what it means
        conn.send(pickle.dumps(("error", error_report(0, phase, exc))))
    os._exit(0)  # no env.close(): whatever the env started ends with this process group


def _time_steps(env: gym.Env) -> dict[str, Any]:
    """Seconds per step (resets included) with random actions, over about 20 ms of stepping and at least one step.
    Only the steps are timed, not the drawing of actions: a trainer's actions come from its policy (drawing one from
    a Discrete space takes a fifth of a CartPole step: 2.4 us of 11 us here)."""
    env.action_space.seed(0)
    steps, ends, final_info, stepping = 0, 0, {}, 0.0
    while steps < 200 and (steps < 1 or stepping < 0.02):
        action = env.action_space.sample()
        start = time.perf_counter()
        _, _, terminated, truncated, info = env.step(action)
        if terminated or truncated:
            ends, final_info = ends + 1, info
            env.reset()
        stepping += time.perf_counter() - start
        steps += 1
    return {"step": stepping / steps, "length": steps / ends if ends else math.inf, "final_info": final_info}


class StandInEnv(gym.Env):
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


def measure_layout(n: int, step: float, length: float, info: dict, **layout: Any) -> float:
    """Median seconds of one step of `n` stand-in envs (`step` seconds each, episodes of `length` steps ending with
    `info`) in the given layout, from about 0.2 s of stepping: commands, wake-ups, replies and infos included, and how
    well workers really run side by side here, which is not always as well as there are cores."""
    from common.multiprocessing_env import SubprocVecEnv

    env_fns = [functools.partial(StandInEnv, step, round(length) if length < math.inf else math.inf, info, i * 7)
               for i in range(n)]  # fmt: skip
    with SubprocVecEnv(env_fns, max_wait=10.0, **layout) as envs:
        envs.reset(seed=0)
        actions, samples, start = np.zeros(n, np.int64), [], time.perf_counter()
        while len(samples) < 200 and (len(samples) < 10 or time.perf_counter() - start < 0.2):
            tick = time.perf_counter()
            envs.step(actions)
            samples.append(time.perf_counter() - tick)
    return float(np.median(samples[len(samples) // 4 :]))  # the first steps wake processes that were just started


def choose(env_fns: list, workers: int, spin: float, bound: float, interrupt: Any = None) -> tuple[int, dict[str, Any]]:
    """The number of workers to use (0: this process) and the figures the choice was made from."""
    n = len(env_fns)
    figures: dict[str, Any] = {"step": None, "in_process": None, "workers": None, "why": None}
    if workers <= 1:
        return 0, dict(figures, why="one core or one env: nothing to spread")
    try:
        found = probe(env_fns[-1], bound, n - 1, interrupt=interrupt)
    except ProbeFailed as exc:
        return workers, dict(figures, why=f"the probe env failed ({exc}); workers report it")
    step = figures["step"] = found["step"]
    if step * (n - -(-n // workers)) >= CLEARLY_WORTH:
        return workers, dict(figures, why="workers save far more than a round trip")
    like_the_probe = (step, found["length"], found["final_info"])
    figures["in_process"] = measure_layout(n, *like_the_probe, num_workers=0)
    try:
        figures["workers"] = measure_layout(n, *like_the_probe, num_workers=workers, context="fork", worker_spin=spin)
    except Exception as exc:  # noqa: BLE001 - stand-ins that cannot be timed in workers: this process it is
        return 0, dict(figures, why=f"stand-in workers failed ({type(exc).__name__}: {exc})")
    if figures["workers"] > 0.9 * figures["in_process"]:
        return 0, dict(figures, why="workers are not clearly faster")  # easier to debug, no worker to lose
    return workers, dict(figures, why="workers are clearly faster")


def describe(n: int, num_workers: int, figures: dict[str, Any], workers_measured: int) -> str:
    """The layout in words, with the figures the choice was made from: "8 envs in this process (...)"."""
    envs = "1 env" if n == 1 else f"{n} envs"
    text = f"{envs} in " + ("this process" if num_workers == 0 else plural(num_workers, "worker process"))
    notes = []
    if figures.get("step") is not None:
        notes.append(f"one env step {figures['step'] * 1e6:.0f} us, timed in a probe process")
    if figures.get("in_process") is not None:
        timed = f"a step of {envs} like it: {figures['in_process'] * 1e6:.0f} us in this process"
        if figures.get("workers") is not None:
            timed += f", {figures['workers'] * 1e6:.0f} us in {plural(workers_measured, 'worker')}"
        notes.append(timed)
    if figures.get("why"):
        notes.append(figures["why"])
    return text + (f" ({'; '.join(notes)})" if notes else "")
