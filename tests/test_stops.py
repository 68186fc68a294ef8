"""Stops are requests: a signal handler records them, the run honours them at safe points, every
wait of the trainer wakes on them, and the processes the vec env starts leave stopping to the
trainer."""

from __future__ import annotations

import functools
import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from common.multiprocessing_env import SubprocVecEnv
from common.run.stops import Stopped, StopRequest
from common.vecenv.process_control import STOP_SIGNALS
from tests.envs import CounterEnv, FaultyEnv
from tests.helpers import REPO, alive, descendants, start_program


def ask_later(request: StopRequest, seconds: float) -> None:
    threading.Timer(seconds, request.ask).start()


def timed(fn) -> float:
    start = time.monotonic()
    fn()
    return time.monotonic() - start


class BigReplyEnv(CounterEnv):
    def big(self) -> bytes:
        time.sleep(0.5)
        return bytes(50 << 20)  # more than a socket buffer holds: the worker writes until it is read


def test_a_stop_ends_a_wait_on_the_workers_and_close_leaves_nothing():
    """A step that hangs in a worker: the stop ends the wait within a fraction of a second (as Stopped, the
    interrupt's own exception), and close() ends the worker."""
    request = StopRequest()
    envs = SubprocVecEnv([FaultyEnv, functools.partial(FaultyEnv, "hang", 1)], num_workers=2, interrupt=request)
    envs.reset(seed=0)
    pids = envs.worker_pids
    ask_later(request, 0.3)
    with pytest.raises(Stopped, match="SIGTERM"):
        envs.step(np.zeros(2, np.int64))
    assert request.signum == signal.SIGTERM
    envs.close(timeout=1.0)
    assert not any(alive(pid) for pid in pids)


def test_a_call_a_stop_ended_is_drained_on_close():
    """The stop ends a wait for a large reply (a periodic save's env states): close() reads it, so
    that the worker is not left writing it, and needs no kill."""
    request = StopRequest()
    envs = SubprocVecEnv([BigReplyEnv] * 2, num_workers=2, interrupt=request, close_timeout=30.0)
    ask_later(request, 0.1)
    with pytest.raises(Stopped):
        envs.call("big")
    workers = list(envs._pool.procs)
    # without the drain, a kill: at once for a worker taken as stuck, else after close_timeout (30 s)
    assert timed(envs.close) < 15 and [worker.exitcode for worker in workers] == [0, 0]


def test_a_stop_ends_the_wait_for_the_workers_to_build():
    request = StopRequest()
    ask_later(request, 0.3)
    # hangs in reset: built at once, never answers reset
    env_fns = [functools.partial(FaultyEnv, "hang", 0)] * 2
    with pytest.raises(Stopped):
        with SubprocVecEnv(env_fns, num_workers=2, interrupt=request) as envs:
            envs.reset(seed=0)


def test_the_forkserver_and_the_workers_leave_stopping_to_the_trainer():
    """A scheduler signals every process of a job: each stop signal (SIGINT, SIGTERM, Slurm's
    warnings SIGUSR1 and SIGUSR2, ...) to every process the vec env started leaves them all running,
    and a worker that dies afterwards is still restarted (through the forkserver)."""
    envs = SubprocVecEnv(
        [functools.partial(FaultyEnv, "sigkill", 3), FaultyEnv], num_workers=2, max_restarts=1, context="forkserver"
    )
    envs.reset(seed=0)
    helpers = descendants()
    assert len(helpers - set(envs.worker_pids)) >= 2  # the forkserver and multiprocessing's resource tracker
    commands = {pid: Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ") for pid in helpers}
    for sig in sorted(STOP_SIGNALS):
        for pid in helpers:
            os.kill(pid, sig)
    time.sleep(0.3)
    assert [commands[pid] for pid in helpers if not alive(pid)] == []
    envs.step(np.zeros(2, np.int64))
    envs.step(np.zeros(2, np.int64))
    *_, truncations, _ = envs.step(np.zeros(2, np.int64))  # step 3: worker 0 kills itself, and is rebuilt
    assert truncations.tolist() == [True, False]
    envs.close()


def test_a_ctrl_c_forwarded_by_a_launcher_is_the_same_stop(tmp_path):
    """torchrun forwards the terminal's Ctrl-C to ranks that got it already: two SIGINTs in quick
    succession are one stop, which saves."""
    proc = start_program(tmp_path, "--outcome", "wait")
    proc.send_signal(signal.SIGINT)
    time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 130, stderr
    assert "stopped by SIGINT" in stderr and list(tmp_path.glob("runs/*/checkpoint.pt"))


def test_a_second_ctrl_c_ends_a_stop_that_waits_at_once(tmp_path):
    """A stop waits for the loop's next safe point; env code that never returns holds it there, and
    a second Ctrl-C (a second after the first) ends the process at once."""
    proc = start_program(tmp_path, "--outcome", "stuck")
    proc.send_signal(signal.SIGINT)
    time.sleep(1.5)
    assert proc.poll() is None  # still in "env code": the stop waits
    start = time.monotonic()
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=30)
    # at once, not after the stop's 120 s bound (a loaded machine is slow)
    assert time.monotonic() - start < 20
    assert proc.returncode == 130 and stderr.endswith("prog.py: a second Ctrl-C: ending now\n")


def test_no_signal_handler_of_the_project_raises():
    """The handlers record (and a sweep's passes the signal on to its runs); raising is for the
    safe points."""
    import ast

    handlers, bodies = set(), {}
    for path in (REPO / "common").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "signal" and len(node.args) == 2:
                handlers.add(ast.unparse(node.args[1]).removeprefix("self."))
            if isinstance(node, ast.FunctionDef):
                bodies[node.name] = node
    # submitit's own handler for Slurm's warning, given USR1 as well as USR2 (it stops, saves, requeues)
    handlers -= {"signal.SIG_IGN", "signal.SIG_DFL", "signal.getsignal(signal.SIGUSR2)"}
    assert handlers == {"_record", "_forward"}  # StopRequest's and the sweep's Stop's
    for name in handlers:
        assert not [node for node in ast.walk(bodies[name]) if isinstance(node, ast.Raise)], name
