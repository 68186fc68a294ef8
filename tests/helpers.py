"""Assertions and process-table helpers shared by the tests."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

from common.sweep.report import read_scalars  # noqa: F401 - the tests read runs as the sweep's report does

REPO = Path(__file__).resolve().parent.parent


def assert_same(actual, expected, path: str = "result") -> None:
    """Deep equality that also checks array dtypes and shapes, dict keys and object-array contents."""
    if isinstance(expected, dict):
        assert isinstance(actual, dict), f"{path}: {type(actual)} is not a dict"
        assert actual.keys() == expected.keys(), f"{path}: keys {sorted(actual)} != {sorted(expected)}"
        for key in expected:
            assert_same(actual[key], expected[key], f"{path}[{key!r}]")
    elif isinstance(expected, (tuple, list)):
        assert type(actual) is type(expected) and len(actual) == len(expected), f"{path}: {actual!r} != {expected!r}"
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            assert_same(a, e, f"{path}[{i}]")
    elif isinstance(expected, np.ndarray):
        assert isinstance(actual, np.ndarray), f"{path}: {type(actual)} is not an ndarray"
        assert actual.dtype == expected.dtype, f"{path}: dtype {actual.dtype} != {expected.dtype}"
        assert actual.shape == expected.shape, f"{path}: shape {actual.shape} != {expected.shape}"
        if expected.dtype == object:
            for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
                assert_same(a, e, f"{path}[{i}]")
        else:
            np.testing.assert_array_equal(actual, expected, err_msg=path)
    else:
        assert type(actual) is type(expected) and actual == expected, f"{path}: {actual!r} != {expected!r}"


def learning_curves(run_dir: Path) -> dict:
    """Every scalar a run logged but those that time it (SPS, perf/*)."""
    return {tag: values for tag, values in read_scalars(run_dir).items() if tag != "charts/SPS" and "perf/" not in tag}


def LONG(*values) -> list:  # noqa: N802 - reads as a marker in a parametrize list
    """Parameters of an end-to-end test that repeat its case at other timings or fault kinds: `-m
    long` runs them (the README's test command runs the first one of each)."""
    import pytest

    return [pytest.param(value, marks=pytest.mark.long) for value in values]


def parent_pid(pid: int) -> int:
    """The parent of `pid`, from /proc/<pid>/stat (OSError if it is gone)."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def alive(pid: int) -> bool:
    """True if `pid` runs (a zombie counts as dead: it has exited and only waits to be reaped)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def descendants(root: int | None = None) -> set[int]:
    """Live descendants of `root` (default: this process), read from /proc."""
    root = os.getpid() if root is None else root
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = parent_pid(int(entry.name))
            except (FileNotFoundError, ProcessLookupError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, stack = set(), [root]
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in found and alive(child):
                found.add(child)
                stack.append(child)
    return found - {Preloaded.pid()}  # run_script's server, not a run's


def descendants_with_helpers_running() -> set[int]:
    """descendants() once multiprocessing's own long-lived helpers (the resource tracker, the
    forkserver) run: the baseline a test compares with, whichever test happens to start them first."""
    from common.vecenv import process_control

    process_control.start_context(process_control.default_context())
    return descendants()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now, for a rendezvous of ranks, chosen below the
    kernel's ephemeral range: a port bind(0) gave could be given again (to a gloo rank of a test beside
    this one) before the rendezvous binds it, which then waits a minute on a listener that never answers."""
    lowest_ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = [p for p in range(max(1024, lowest_ephemeral - 8000), lowest_ephemeral) if not 29400 <= p < 30400]
    for port in random.sample(ports, 100):  # not torchrun's 29500 or the batch scripts' 29400 + job id % 1000
        with socket.socket() as s, contextlib.suppress(OSError):
            s.bind(("127.0.0.1", port))
            return port
    raise RuntimeError(f"no free port below {lowest_ephemeral}")


def spawn(cmd: list, cwd, extra_env: dict | None = None, session: bool = True) -> subprocess.Popen:
    """cmd started with text pipes, unbuffered, in a session of its own (a failed test kills its whole
    process group) unless `session` is False."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(extra_env or {})}
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    return subprocess.Popen([str(c) for c in cmd], cwd=cwd, env=env, **pipes, start_new_session=session)


def run_command(cmd: list[str], cwd, timeout: float = 300, extra_env: dict | None = None):
    """Runs cmd in its own session (see `ended`)."""
    return ended(spawn(cmd, cwd, extra_env), timeout)


def ended(proc: subprocess.Popen | Forked, timeout: float) -> subprocess.CompletedProcess:
    """What `proc`, a session of its own, printed and its exit status once it ended: on timeout its whole
    process group is killed (a hung job leaves nothing behind), and the TimeoutExpired carries what it printed."""
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):  # it may have ended meanwhile
            os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        raise subprocess.TimeoutExpired(proc.args, timeout, stdout, stderr) from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def run_script(script, args, cwd, timeout=300, extra_env=None, fresh=False):
    """Runs a script as a user would: a process of its own with a list argv, an absolute path, its own
    cwd and session, and its exit status (see `start_script`)."""
    return ended(start_script(script, args, cwd, extra_env, fresh), timeout)


def start_script(script, args, cwd, extra_env=None, fresh=False) -> subprocess.Popen | Forked:
    """`python script args` started with text pipes, in a session of its own: in a fork of the tests'
    preloaded process where `forkable` (`fresh`: never, for runs compared with each other, since the forks
    share the server's hash seed)."""
    command = [sys.executable, str(script), *map(str, args)]
    if fresh or not forkable(script, extra_env):
        return spawn(command, cwd, extra_env)
    return Preloaded.start(command, cwd, extra_env)


def forkable(script, extra_env: dict | None) -> bool:
    """True if a run of `script` can start as a fork of Preloaded's process (which imported torch, the
    optimizer's torch._dynamo and the scripts: 5 of the 7 CPU seconds a tiny run costs) and be the run
    `python script.py ...` is: one of the scripts here, with extra environment variables that the run
    reads as it goes (the tests' own PPO_VEC_TEST_*), or the repository as PYTHONPATH. PPO_VEC_TESTS_PLAIN=1:
    never (a fresh interpreter for every run)."""
    return (
        Path(script).parent == REPO
        and not os.environ.get("PPO_VEC_TESTS_PLAIN")
        and all(
            key.startswith("PPO_VEC_TEST_") or (key, value) == ("PYTHONPATH", str(REPO))
            for key, value in (extra_env or {}).items()
        )
    )


# Serves Preloaded.start: forks itself for each script run asked over its socket (with the pipes for its
# stdout and stderr), replies the fork's pid, then its exit status. The fork leaves the loop and runs the
# script at the top level, so that an exception or SystemExit ends it as it ends `python script.py`
# (atexit, threads joined, the same status).
_SERVER = r"""
import contextlib, json, os, random, runpy, select, socket, sys, numpy, torch
torch.optim.SGD([torch.zeros(1, requires_grad=True)])  # its first optimizer imports torch._dynamo
import gc, ppo_atari_multigpu, ppo_vec
gc.freeze()  # what was imported stays out of each fork's collections: they and its exit copy no page of it

def receive(connection):
    data, pipes = socket.recv_fds(connection, 1 << 16, 2)[:2]
    try:
        while not data.endswith(b"\n") and (more := connection.recv(1 << 16)):
            data += more
        return json.loads(data), pipes
    except BaseException:
        for fd in pipes:
            os.close(fd)
        raise

def serve(server):
    forks = {}  # pid: the connection that waits for its status
    while True:
        readable = select.select([server, sys.stdin], [], [], 0.05)[0]
        if sys.stdin in readable:  # the tests' process ended
            sys.exit(0)
        if server in readable:
            connection = server.accept()[0]
            connection.settimeout(30)  # a test interrupted before it asked holds up no other
            try:
                request, pipes = receive(connection)
            except (OSError, ValueError):
                connection.close()
                continue
            connection.settimeout(None)
            pid = os.fork()
            if pid == 0:
                server.close()
                for other in [connection, *forks.values()]:
                    other.close()
                return request, pipes
            for fd in pipes:
                os.close(fd)
            connection.sendall(b"%d\n" % pid)
            forks[pid] = connection
        while forks and (ended := os.waitpid(-1, os.WNOHANG))[0]:
            with forks.pop(ended[0]) as connection, contextlib.suppress(OSError):  # gone if its test timed out
                connection.sendall(b"%d\n" % os.waitstatus_to_exitcode(ended[1]))

server = socket.socket(socket.AF_UNIX)
server.bind("\0" + sys.argv[1])  # Linux's abstract namespace: no file left behind
server.listen()
print("ready", flush=True)
(argv, cwd, env), pipes = serve(server)
os.setsid()
os.chdir(cwd)
os.environ.clear()
os.environ.update(env)
sys.path[0] = os.path.dirname(argv[0])
sys.path[1:1] = [path for path in env.get("PYTHONPATH", "").split(os.pathsep) if path and path not in sys.path]
devnull = os.open(os.devnull, os.O_RDONLY)
for fd, opened in ((0, devnull), (1, pipes[0]), (2, pipes[1])):
    os.dup2(opened, fd)
    os.close(opened)
random.seed()  # fresh states, as a new interpreter's (torch's own generator starts from its fixed seed anyway)
numpy.random.seed()
sys.argv = argv
del argv, cwd, env, pipes, devnull, server, serve, receive
runpy.run_path(sys.argv[0], run_name="__main__")
"""


class Preloaded:
    """The process _SERVER runs, one for each process of the tests, started at its first use."""

    proc: subprocess.Popen | None = None
    path = ""
    starting = threading.Lock()  # a test's threads may ask at once

    @classmethod
    def pid(cls) -> int | None:
        return cls.proc.pid if cls.proc else None

    @classmethod
    def serve(cls) -> None:
        cls.path = f"ppo-vec-tests-{os.getpid()}-{time.monotonic_ns()}"
        proc = subprocess.Popen(
            [sys.executable, "-c", _SERVER, cls.path],
            cwd=REPO,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        import select

        started = select.select([proc.stdout], [], [], 300)[0] and proc.stdout.readline() == "ready\n"
        assert started, "the tests' preloaded process did not start within 300 s"
        cls.proc = proc

    @classmethod
    def start(cls, command: list[str], cwd, extra_env: dict | None = None) -> Forked:
        """`command` (python, a script here, its flags) started in a fork, with its pipes (see Forked)."""
        import json

        with cls.starting:
            if cls.proc is None or cls.proc.poll() is not None:
                cls.serve()
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **(extra_env or {})}
        connection = socket.socket(socket.AF_UNIX)
        out, err = os.pipe(), os.pipe()
        try:
            connection.connect("\0" + cls.path)
            request = json.dumps([[str(c) for c in command[1:]], str(cwd), env]).encode() + b"\n"
            socket.send_fds(connection, [request], [out[1], err[1]])
        except BaseException:
            connection.close()
            os.close(out[0])
            os.close(err[0])
            raise
        finally:  # the fork's now: its end is the pipes' end
            os.close(out[1])
            os.close(err[1])
        return Forked(command, connection, open(out[0], errors="replace"), open(err[0], errors="replace"))


class Forked:
    """A run in a fork of Preloaded's process, with what the tests use of a Popen: pid (its session's
    once it runs), args, stdout and stderr (text pipes), returncode, poll, wait, communicate, send_signal, kill."""

    def __init__(self, args: list, connection: socket.socket, stdout, stderr):
        self.args, self.stdout, self.stderr, self.returncode = args, stdout, stderr, None
        replies = connection.makefile()
        connection.settimeout(60)
        try:
            self.pid = int(replies.readline())
        except (OSError, ValueError) as exc:
            for opened in (replies, connection, stdout, stderr):
                opened.close()
            raise AssertionError(f"the tests' preloaded process did not start {args}: {exc!r}") from None
        connection.settimeout(None)
        self.exited = threading.Event()
        self.readers: list[threading.Thread] = []
        self.output: dict[str, str] = {}

        def status() -> None:  # the server writes it once the fork has ended
            with connection, replies:
                line = replies.readline()
            self.returncode = int(line) if line else -signal.SIGKILL  # no line: the server itself died
            self.exited.set()

        threading.Thread(target=status, daemon=True).start()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self.exited.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        """Reads stdout and stderr to their ends, then waits for the run's end, within `timeout`."""
        deadline = None if timeout is None else time.monotonic() + timeout

        def left() -> float | None:
            return None if deadline is None else max(0.0, deadline - time.monotonic())

        if not self.readers:
            self.readers = [
                threading.Thread(target=self._read, args=(name,), daemon=True) for name in ("stdout", "stderr")
            ]
            for reader in self.readers:
                reader.start()
        for reader in self.readers:
            reader.join(left())
            if reader.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout)
        self.wait(left())
        return self.output["stdout"], self.output["stderr"]

    def _read(self, name: str) -> None:
        with getattr(self, name) as stream:
            self.output[name] = stream.read()

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):  # ended, its status on its way
                os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def only_run_dir(cwd) -> Path:
    runs = list((Path(cwd) / "runs").iterdir())
    assert len(runs) == 1, runs
    return runs[0]


def become_subreaper() -> None:
    """Makes this process adopt its orphaned descendants (Linux), so that `descendants()` sees a
    grandchild whose parent exited: a test then finds every process a run left behind, not only its
    direct children's."""
    import ctypes

    PR_SET_CHILD_SUBREAPER = 36
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def leftovers(before: set[int], within: float = 5.0) -> set[int]:
    """Descendants of this process, not in `before`, still alive after up to `within` seconds."""
    import time

    deadline = time.monotonic() + within
    while (left := descendants() - before) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


# The two scripts, and flags that make a run of either take seconds.
VEC = REPO / "ppo_vec.py"
ATARI = REPO / "ppo_atari_multigpu.py"
VEC_TINY = ["--num-envs", "4", "--num-steps", "32", "--num-minibatches", "2", "--update-epochs", "2"]
ATARI_TINY = ["--local-num-envs", "2", "--num-steps", "8", "--num-minibatches", "2", "--update-epochs", "2"]
# an env a test makes fail (fault_env) at a step it picks
FAULT_ENV = ["--env-id", "tests.envs:ScriptedFault-v0"]
CLEANRL_TAGS = {
    "charts/episodic_return",
    "charts/episodic_length",
    "charts/learning_rate",
    "charts/SPS",
    "losses/value_loss",
    "losses/policy_loss",
    "losses/entropy",
    "losses/old_approx_kl",
    "losses/approx_kl",
    "losses/clipfrac",
    "losses/explained_variance",
}


def wait_until(what: str, ready, timeout: float = 300.0, every: float = 0.5):
    """ready()'s first true answer, asked every `every` seconds; AssertionError naming `what` past `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if answer := ready():
            return answer
        time.sleep(every)
    raise AssertionError(f"{what}: not within {timeout:g} s")


def all_gone(pids, within: float = 5.0) -> bool:
    """True once none of `pids` is alive, waiting up to `within` seconds."""
    deadline = time.monotonic() + within
    while [pid for pid in pids if alive(pid)] and time.monotonic() < deadline:
        time.sleep(0.05)
    return not [pid for pid in pids if alive(pid)]


def fault_env(tmp_path, fault: str | None = None) -> dict:
    """The environment variables for FAULT_ENV: where its processes write their pids, and the
    fault to inject."""
    pids = tmp_path / "pids"
    pids.mkdir(exist_ok=True)
    env = {"PYTHONPATH": str(REPO), "PPO_VEC_TEST_PIDS": str(pids)}
    if fault:
        env["PPO_VEC_TEST_FAULT"] = f"{fault}:{tmp_path / 'fault-marker'}"
    return env


def start_training(script, args, cwd, extra_env=None) -> subprocess.Popen | Forked:
    """Starts a run (in a fork where `forkable`) and returns once it has printed its first progress line
    (training is under way)."""
    proc = start_script(script, args, cwd, extra_env)
    for line in proc.stdout:
        if line.startswith("global_step="):
            return proc
    raise AssertionError(f"the run never started training: {proc.communicate()}")


def stop(proc: subprocess.Popen, sig: signal.Signals, within: float) -> str:
    """Sends sig; returns what the run printed on stderr once it exited (within `within` seconds)."""
    start = time.monotonic()
    proc.send_signal(sig)
    try:
        _, stderr = proc.communicate(timeout=within + 30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    assert time.monotonic() - start < within, "took too long to stop"
    return stderr


def start_torchrun(tmp_path, extra=(), total: int = 10_000_000):
    """A two-rank Atari job under torchrun, returned once it trains."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(ATARI)]
    cmd += [*ATARI_TINY, "--total-timesteps", str(total), *extra]
    proc = spawn(cmd, tmp_path)
    for line in proc.stdout:
        if line.startswith("global_step="):  # rank 0 trains; so does rank 1, in lockstep
            return proc
    raise AssertionError(f"torchrun never started training: {proc.communicate()}")


def rank_pid(launcher: int, rank: int) -> int:
    """The process of `rank`: a child of the torchrun launcher (its own workers, forked later, share
    its variables)."""
    for pid in descendants(launcher):
        try:
            environ = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
            parent = parent_pid(pid)
        except OSError:
            continue
        if f"RANK={rank}".encode() in environ and parent == launcher:
            return pid
    raise AssertionError(f"no process of rank {rank}")


# The smallest script on the run plumbing: one CartPole in the trainer, a model that does not learn,
# ten iterations of ten steps, the state of every boundary kept (iterations this short are otherwise
# kept some of the time: run.KEEP_EVERY). --outcome says how it ends: at iteration 4 it fails, raises
# a bug, finishes, or waits in a loop that stops at its safe points ("wait"), or in "env code" that
# never returns ("stuck").
PROGRAM = r"""
import dataclasses, time, gymnasium as gym, torch
import common.run.run
from common.run import Run
from common.run.errors import FlagError, RunError

common.run.run.KEEP_EVERY = 0

@dataclasses.dataclass
class Args:
    exp_name: str = "prog"
    env_id: str = "CartPole-v1"
    seed: int = 1
    total_timesteps: int = 100
    num_envs: int = 1
    num_steps: int = 10
    num_minibatches: int = 1
    num_workers: int | None = 0
    max_restarts: int = 0
    step_timeout: float | None = None
    checkpoint_interval: int = 0
    save_model: bool = False
    capture_video: bool = False
    track: bool = False
    resume: str | None = None
    eval_checkpoint: str | None = None
    eval_episodes: int = 0
    outcome: str = "done"

def make_env(args, idx, run_dir):
    return lambda: gym.make(args.env_id)

def main(args, command_line):
    if args.outcome == "flag":
        raise FlagError("--thing must be > 0, got 0")
    run = Run(args, command_line)
    run.probe(make_env)
    with run.start(torch.device("cpu"), 10, 10, {"model": torch.nn.Linear(1, 1)}):
        run.make_envs(make_env, 1, seed=args.seed)
        for iteration in run.iterations():
            if iteration == 4 and args.outcome != "done":
                if args.outcome == "fail":
                    raise RunError("the disk is full")
                if args.outcome == "raise":
                    raise ValueError("a bug keeps its traceback")
                print("ready", flush=True)
                while True:
                    time.sleep(0.01)  # a step
                    if args.outcome == "wait":
                        run.stop_if_asked()
            run.log(iteration * 10, [], {})

if __name__ == "__main__":
    Run.cli(main, Args, "A test program.\n\n    python prog.py --outcome wait\n\nMore text.")
"""


def start_program(tmp_path, *argv) -> subprocess.Popen:
    """PROGRAM as tmp_path/prog.py, started; returns once it waits at iteration 4."""
    (tmp_path / "prog.py").write_text(PROGRAM)
    proc = spawn([sys.executable, "prog.py", *argv], tmp_path, {"PYTHONPATH": str(REPO)}, session=False)
    for line in proc.stdout:
        if line == "ready\n":
            return proc
    raise AssertionError(f"the program never got to iteration 4: {proc.communicate(timeout=60)}")


def run_program(tmp_path, *argv) -> subprocess.CompletedProcess:
    (tmp_path / "prog.py").write_text(PROGRAM)
    return run_command([sys.executable, "prog.py", *argv], tmp_path, timeout=120, extra_env={"PYTHONPATH": str(REPO)})
