"""Where SubprocVecEnv's envs step by default (`choose`): in the calling process only where they can
neither hang nor kill it (gymnasium's own TRUSTED envs) and are faster there, else in workers; alike
on a busy minute and a quiet one (`decide`), no env code run here (`probe`: a process of its own,
`python -m` this module, importing neither the main script nor torch). The rule: docs/vecenv.md, Layout."""

import contextlib
import inspect
import math
import os
import pickle
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cloudpickle
import gymnasium as gym
import numpy as np

from .env_state import chain
from .errors import WorkerTimeout, error_report
from .messages import Channel
from .process_control import ignore_stop_signals, plural, stop_signals_blocked

TRUSTED = ("gymnasium.envs.classic_control.", "gymnasium.envs.toy_text.", "gymnasium.wrappers.")
# a step of workers costs this many times reference_work() beyond their envs' work (measured by
# benchmarks/layout_thresholds.py)
ROUND_TRIP = 20.0
STEPPING = 0.02  # CPU seconds of steps the probe times (1 to 200 steps, after 5 not timed)
STEP_DECIDE = 2.0  # seconds the timing may take before the choice falls to workers
PROBE_START = 60.0  # seconds the probe may take to start (Python, gymnasium, the env's module)
# the folder our top package lies in, under whatever name it was copied as: the probe's cwd
_ROOT = str(Path(__file__).resolve().parents[__package__.count(".") + 1])


class ProbeFailed(Exception):
    """The probe could not build or step the env (`phase`: start, make, reset, step; api: gym's old API)."""

    def __init__(self, phase: str, summary: str):
        super().__init__(f"{summary} during '{phase}'")
        self.phase, self.summary = phase, summary.strip().splitlines()[0] if summary.strip() else summary
        self.done = {"make": "built", "start": "built", "reset": "reset", "step": "stepped"}.get(phase, phase)


def choose(env_fns: list, num_workers: int | None, bounded: bool, cores: int, found: Any, **probing) -> tuple:
    """The workers for env_fns (0: this process) and the facts `describe` says (`found`: a probe's)."""
    n = len(env_fns)
    if num_workers is not None or bounded:
        return min(cores, n) if num_workers is None else min(num_workers, n), {}
    try:
        return decide(found or probe(env_fns[-1], index=n - 1, **probing), n, cores)
    except ProbeFailed as exc:
        workers, facts = decide(None, n, cores)
        return workers, dict(facts, why=f"the probe env failed ({exc}); {facts['why']}")


def probe(env_fn: Callable, bound: float, index: int | None = None, interrupt: Any = None, check_api=False):
    """Builds env_fn() in a probe process and, for a trusted env, times its steps: {"spaces", "origin" (the
    classes of the env and its wrappers, outermost first), "trusted", "step" (CPU seconds; None: not timed,
    inf: past STEP_DECIDE), "reference" (reference_work()'s CPU seconds)}. `check_api`: gym's old API fails.
    ProbeFailed if env code raised or the probe died; WorkerTimeout naming env `index` past `bound` s."""
    parent, child = socket.socketpair()
    path = [_ROOT, *map(os.path.abspath, sys.path)]  # the probe's cwd is _ROOT, not ours
    data = {"path": path, "env_fn": cloudpickle.dumps(env_fn), "registry": None}
    data |= {"trusted": TRUSTED, "check_api": check_api}
    with contextlib.suppress(Exception):  # ids the main script registered, where they pickle
        data["registry"] = cloudpickle.dumps(dict(gym.registry))
    errors = tempfile.TemporaryFile()  # what the probe says if it cannot start: a file never fills
    options = {"cwd": _ROOT, "pass_fds": [child.fileno()], "start_new_session": True}
    options |= {"stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL, "stderr": errors}
    with stop_signals_blocked():  # until probe_main ignores them
        proc = subprocess.Popen([sys.executable, "-m", __name__, str(child.fileno())], **options)
    child.close()
    conn, poller, made = Channel(parent), select.poll(), {}
    for fd in [conn.fd] if interrupt is None else [conn.fd, interrupt.fileno()]:
        poller.register(fd, select.POLLIN)
    phase, deadline, ended = "start", time.monotonic() + PROBE_START, False
    try:
        conn.send(pickle.dumps(data, pickle.HIGHEST_PROTOCOL))
        while True:
            msg = conn.message()
            if msg is None and not ended and (left := deadline - time.monotonic()) > 0:
                poller.poll(left * 1000)
                if interrupt is not None:
                    interrupt.check()
                ended = not conn.pump()
                continue
            if msg is None and ended:  # the probe ended with nothing more said
                raise ProbeFailed(phase, f"the probe process ended ({_ended(proc, errors)})")
            if msg is None and phase == "step":
                return dict(made, step=math.inf)  # slower than STEP_DECIDE: not waited for
            if msg is None and phase == "start":
                raise ProbeFailed(phase, f"the probe process did not start within {PROBE_START:g} s")
            if msg is None:
                what = "the env" if index is None else f"env {index}"
                message = f"{what} did not answer '{phase}' within {bound:g} s (in the layout probe)"
                raise WorkerTimeout(message, [] if index is None else [index], phase)
            kind, value = pickle.loads(msg)
            if kind == "error":
                raise ProbeFailed(value[1], value[2])
            if kind == "ready":  # started: from now on the env's own work is timed
                phase, deadline = "make", time.monotonic() + bound
            elif kind == "made" and value["trusted"]:
                made, phase, deadline = value, "step", time.monotonic() + STEP_DECIDE
            else:
                return dict(made, **value) if kind == "stepped" else dict(value, step=None)
    finally:
        conn.close()
        errors.close()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # the probe and every process its env started
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5.0)


def _ended(proc: subprocess.Popen, errors: Any) -> str:
    """How the probe process ended, with the last line it wrote to stderr (a failed import)."""
    try:
        code = proc.wait(timeout=1.0)
    except subprocess.TimeoutExpired:
        return "closed its pipe"
    how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
    errors.seek(0)
    last = (errors.read()[-4096:].decode(errors="replace").strip().splitlines() or [""])[-1]
    return f"{how}: {last}" if last else how


def probe_main() -> None:
    """The probe process: builds the env, says what it is, times its steps if it may, then ends."""
    ignore_stop_signals()
    conn = Channel(socket.socket(fileno=int(sys.argv[1])))
    data = pickle.loads(conn.recv())
    sys.path[:] = data["path"]
    phase = "make"
    try:
        if data["registry"] is not None:
            gym.registry.update(pickle.loads(data["registry"]))
        env_fn = cloudpickle.loads(data["env_fn"])  # imports the env's module: not the env's work
        conn.send(pickle.dumps(("ready", None)))
        env = env_fn()
        made = {"spaces": (env.observation_space, env.action_space)}
        made["origin"] = [f"{type(e).__module__}.{type(e).__qualname__}" for e in chain(env)]
        made["trusted"] = all(type(e).__module__.startswith(data["trusted"]) for e in chain(env))
        phase = "reset"  # _old_api resets the env
        if data["check_api"] and (old := _old_api(env)):
            conn.send(pickle.dumps(("error", (0, "api", old, ""))))
            os._exit(0)
        phase = "make"
        conn.send(pickle.dumps(("made", made), pickle.HIGHEST_PROTOCOL))
        if made["trusted"]:
            phase = "reset"
            env.reset(seed=0)
            phase = "step"
            step, reference = cpu_per_step(env)
            conn.send(pickle.dumps(("stepped", {"step": step, "reference": reference})))
    except Exception as exc:  # noqa: BLE001 - env code: said in one line, the caller decides what it means
        conn.send(pickle.dumps(("error", error_report(0, phase, exc))))
    os._exit(0)  # no env.close(): whatever the env started ends with this process group


def _old_api(env: gym.Env) -> str | None:
    """How the env answers as gym's old API did, None if as gymnasium's; other errors raise."""
    base = env.unwrapped  # below gymnasium's checking wrappers, which only warn of old answers
    with contextlib.suppress(TypeError, ValueError):  # a reset written in C has no signature: asked
        parameters = inspect.signature(base.reset).parameters.values()
        if not any(p.name == "seed" or p.kind is p.VAR_KEYWORD for p in parameters):
            return "its reset takes no seed"
    answer = base.reset(seed=0)
    if not (isinstance(answer, tuple) and len(answer) == 2):
        return "its reset returned an observation alone, not (obs, info)"
    if not isinstance(answer[1], dict):
        raise TypeError(f"its reset returned (obs, {type(answer[1]).__name__}): gymnasium's info is a dict")
    answer = base.step(base.action_space.sample())
    if not (isinstance(answer, tuple) and len(answer) == 5):
        return f"its step returned {len(answer) if isinstance(answer, tuple) else 'no'} values, not 5"
    return None


def reference_work() -> float:
    """Work like a small env's step, timed beside the probe's: a round trip costs ROUND_TRIP times its CPU."""
    total = 0.0
    for i in range(60):  # about a CartPole step of CPU
        total += math.sin(i) * 0.5
    state = np.array((total, 1.0, 2.0, 3.0), dtype=np.float32)
    return float(state.sum()) if state[0] < 1e9 else 0.0


def cpu_per_step(env: gym.Env) -> tuple[float, float]:
    """CPU seconds of a step and of reference_work() after it: medians, as the load inflates some steps' CPU."""
    env.action_space.seed(0)
    times: list[float] = []
    references: list[float] = []
    while len(times) < 205 and (len(times) < 6 or sum(times[5:]) < STEPPING):
        action = env.action_space.sample()
        start = time.thread_time()
        _, _, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            env.reset()
        times.append(time.thread_time() - start)
        start = time.thread_time()
        reference_work()
        references.append(time.thread_time() - start)
    return float(np.median(times[5:])), max(float(np.median(references[5:])), 1e-9)


def decide(found: dict[str, Any] | None, n: int, cores: int) -> tuple[int, dict[str, Any]]:
    """The workers (0: this process) for n envs like the one `probe` found (None: failed), and why."""
    w = max(1, min(cores, n))
    facts = {key: found.get(key) for key in ("origin", "trusted", "step")} if found else {}
    if found is None or not found["trusted"]:
        why = "workers bound its waits and outlive its crashes" if found else "workers report the probe's failure"
        return w, dict(facts, why=why)
    if w == 1:
        return 0, dict(facts, why="one core or one env: nothing to spread")
    if not math.isfinite(found["step"]):  # a step outlasted STEP_DECIDE
        return w, dict(facts, why="workers save more than they cost")
    saved_us = found["step"] * (n - math.ceil(n / w)) * 1e6  # CPU a step spread over w workers saves
    round_trip_us = ROUND_TRIP * found["reference"] * 1e6
    round_trip = f"their round trip, {round_trip_us:.0f} us"
    if saved_us < round_trip_us:
        return 0, dict(facts, why=f"workers would save {saved_us:.0f} us of CPU a step, under {round_trip}")
    return w, dict(facts, why=f"workers save {saved_us:.0f} us of CPU a step, over {round_trip}")


def describe(n: int, num_workers: int, facts: dict[str, Any], groups: int = 1) -> tuple[str, str]:
    """Where the envs step ("8 envs in this process") and why ("gymnasium's CartPoleEnv; ...")."""
    notes, step, env = [], facts.get("step"), (facts.get("origin") or ["?"])[-1].rsplit(".", 1)[-1]
    if facts.get("origin"):
        notes.append(f"gymnasium's {env}" if facts["trusted"] else f"{env}, not one of gymnasium's own envs")
    if step is not None and math.isfinite(step):
        notes.append(f"one step {step * 1e6:.0f} us of CPU in a probe process")
    elif step is not None:
        notes.append(f"a step took over {STEP_DECIDE:g} s in a probe process")
    notes += [facts["why"]] if facts.get("why") else []
    where = "this process" if num_workers == 0 else plural(num_workers, "worker process")
    where += f", stepped in {groups} groups" if groups > 1 else ""
    return f"{plural(n, 'env')} in {where}", "; ".join(notes)


if __name__ == "__main__":
    probe_main()
