"""Where a SubprocVecEnv's envs live, seen from the calling process: WorkerPool (worker processes,
each stepping a slice of the envs) or InProcessPool (every env here), both driven by `send`, then
`collect`. A worker's death is seen from its process (a pidfd), not from its pipe (an env's helper may
hold it open) nor multiprocessing's sentinel (a dying forkserver makes all of them readable)."""

import contextlib
import logging
import mmap
import os
import pickle
import select
import socket
import time
import weakref
from collections.abc import Callable
from multiprocessing import util as mp_util
from typing import Any

import cloudpickle
import gymnasium as gym

from . import process_control
from .errors import WorkerError, WorkerTimeout, check_spaces, error_report, first_failure, remote_error
from .messages import Channel, poll_without_sleeping
from .shared_block import anonymous_file, views
from .worker import Command, EnvGroup, Reply, close_envs, describe, encode, worker_main

STARTING = 60.0  # seconds a worker may take to start (a process, the main script's imports)


class InProcessPool:
    """Every env here, stepped at `collect` as SyncVectorEnv does: nothing bounds or restarts it."""

    def __init__(self, env_fns: list[Callable[[], gym.Env]], interrupt: Any = None):
        self.slices, self.envs, self.interrupt = [slice(0, len(env_fns))], [], interrupt
        try:
            for fn in env_fns:
                self.envs.append(fn())
        except Exception as exc:  # noqa: BLE001 - env code: reported as a worker's failure would be
            close_envs(self.envs)
            raise remote_error(error_report(len(self.envs), "make", exc), "in this process") from None
        self.group: EnvGroup | None = None
        self.pending: dict[int, tuple[Command, Any]] = {}
        self.replies: dict[int, Any] = {}

    def describe_envs(self, timeout: float) -> tuple:
        return describe(self.envs)

    def attach(self, size: int, offsets: list, obs_in_shm: bool, timeout: float) -> Any:
        buffer = bytearray(size)
        self.group = EnvGroup(self.envs, views(buffer, offsets), obs_in_shm)
        return buffer

    def send(self, w: int, command: Command, arg: Any = None) -> None:
        self.pending[w] = (command, arg)

    def collect(self, timeout: float, interruptible: bool = True, workers=None) -> dict[int, Exception]:
        """Runs the command sent; an env raising fails worker 0. The interrupt raises first."""
        if self.interrupt is not None and interruptible:
            self.interrupt.check()
        failures: dict[int, Exception] = {}
        pending, self.pending = self.pending, {}
        for w, (command, arg) in pending.items():
            try:
                self.replies[w] = self.group.run(command, arg)
            except Exception as exc:  # noqa: BLE001 - env code: reported as a worker's failure would be
                report = error_report(self.group.current, command.name.lower(), exc)
                failures[w] = remote_error(report, "in this process")
        return failures

    def close(self, timeout: float) -> None:
        close_envs(self.envs)


class WorkerPool:
    """Worker processes, worker w stepping the envs of `slices[w]`: started, sent commands, awaited
    within a bound, replaced when they fail, and stopped with the helpers their envs started."""

    def __init__(
        self, env_fns: list, slices: list[slice], context: str, spin: float, close_timeout: float, interrupt=None
    ):
        self.slices, self.spin, self.interrupt = slices, spin, interrupt
        if context != "fork" and (unguarded := process_control.unguarded_main()):  # each worker would fail at start
            raise WorkerError(f"no worker was started: {unguarded}", range(slices[-1].stop), "start")
        self.env_fns_bytes = [cloudpickle.dumps(env_fns[sl]) for sl in slices]
        self.ctx, self.fork = process_control.start_context(context), context == "fork"
        self.tmpdir = mp_util.get_temp_dir() if context == "forkserver" else None
        self.procs: list = []
        self.conns: list[Channel] = []
        self.timed_out: set[int] = set()  # silent past the bound: killed, not asked, on close
        self.poller = select.poll()  # every worker's socket and process fd
        self.fd_owner: dict[int, tuple[int, bool]] = {}  # fd -> (worker, is it the process fd)
        self.exit_fds: list[int] = []  # readable once worker w has exited (_exit_fd)
        self.pending: dict[int, str] = {}  # worker -> what its next reply answers: make, step...
        self.replies: dict[int, Any] = {}
        self.failed: dict[int, Exception] = {}  # failures seen while waiting for other workers
        self.restarts = 0  # workers replaced so far
        self.block_fd: int | None = None
        self.attach_message = b""
        self.finalizer = weakref.finalize(self, _shutdown, self.procs, self.conns, self.timed_out, close_timeout)
        for w in range(len(slices)):
            self._start(w)

    def envs_of(self, w: int) -> list[int]:
        return list(range(self.slices[w].start, self.slices[w].stop))

    def describe_envs(self, timeout: float) -> tuple:
        """Every env's spaces, env 0's metadata and render mode (worker.describe)."""
        if failures := self.collect(timeout):
            raise first_failure(failures)
        replies = [self.replies.pop(w) for w in range(len(self.slices))]
        return [spaces for reply in replies for spaces in reply[0]], *replies[0][1:]

    def attach(self, size: int, offsets: list, obs_in_shm: bool, timeout: float) -> Any:
        """Maps one shared block of `size` bytes here and in every worker (each writes its rows)."""
        self.attach_message = encode(Command.ATTACH, (size, offsets, obs_in_shm))
        self.block_fd = anonymous_file(size)
        block = mmap.mmap(self.block_fd, size)
        for w in range(len(self.slices)):
            self._attach(w)
        if failures := self.collect(timeout):
            raise first_failure(failures)
        self.replies.clear()
        return block

    def _attach(self, w: int) -> None:
        with contextlib.suppress(OSError):  # a dead worker: collect reports it
            self.conns[w].send_fd(self.attach_message, self.block_fd)
        self.pending[w] = "attach"

    def _start(self, w: int) -> None:
        """Starts worker `w` (afresh after a failure) and watches its socket and process."""
        parent_sock, child_sock = socket.socketpair()
        keep, give = process_control.lifeline()
        # With fork, the parent's ends of the other pipes that are open: a closed one's number may be reused
        inherited = [c.sock.fileno() for c in self.conns if c.sock.fileno() >= 0]
        inherited += [parent_sock.fileno(), keep.fileno()]
        start, fns = self.slices[w].start, self.env_fns_bytes[w]
        args = (start, fns, child_sock, give, inherited if self.fork else [], self.spin, self.tmpdir)
        proc = self.ctx.Process(target=worker_main, name=f"SubprocVecEnv-worker-{w}", args=args, daemon=True)
        with process_control.stop_signals_blocked():  # until the worker ignores them
            proc.start()
        child_sock.close()
        conn, exit_fd = Channel(parent_sock), _exit_fd(proc)
        if w < len(self.procs):  # a restart: in place, in the lists the finalizer holds
            self.procs[w], self.conns[w], self.exit_fds[w] = proc, conn, exit_fd
        else:
            self.procs.append(proc)
            self.conns.append(conn)
            self.exit_fds.append(exit_fd)
        for fd, is_exit in ((conn.fd, False), (exit_fd, True)):
            self.poller.register(fd, select.POLLIN)
            self.fd_owner[fd] = (w, is_exit)
        self.pending[w] = "start"

    def send(self, w: int, command: Command, arg: Any = None) -> None:
        with contextlib.suppress(OSError):  # a dead worker: its process fd tells collect
            self.conns[w].send(encode(command, arg))
        self.pending[w] = command.name.lower()

    def _wait_for_events(self, deadline: float, spin: float) -> list[tuple[int, int]]:
        """poll() until something is ready or the deadline, the first `spin` seconds awake."""
        if spin and (events := poll_without_sleeping(self.poller, min(spin, deadline - time.monotonic()))):
            return events
        return self.poller.poll(max(0.0, min(deadline - time.monotonic(), 3600.0)) * 1000)

    def collect(self, timeout: float, interruptible: bool = True, workers=None) -> dict[int, Exception]:
        """Waits up to `timeout` s for the pending workers' (`workers`') replies, into `replies`; returns the
        failures by worker. One timed out stays pending (a retry takes its reply); others' replies and failures
        are kept for their own wait; the interrupt (if `interruptible`) raises."""
        watched = self.interrupt.fileno() if self.interrupt is not None and interruptible else None
        if watched is not None:
            self.poller.register(watched, select.POLLIN)
        awaited = set(self.pending if workers is None else workers)
        earlier = {w: self.failed.pop(w) for w in awaited & set(self.failed)}
        for w in earlier:  # seen dead at another wait: nothing more comes from it
            self.pending.pop(w, None)
        try:
            failures = self._collect(timeout, watched, awaited)
        finally:
            if watched is not None:
                self.poller.unregister(watched)
        self.failed.update({w: error for w, error in failures.items() if w not in awaited})
        return earlier | {w: error for w, error in failures.items() if w in awaited}

    def _bound(self, w: int, timeout: float) -> float:
        """A worker yet to start gets STARTING; its envs' build is timed once it has started."""
        return max(timeout, STARTING) if self.pending[w] == "start" else timeout

    def _collect(self, timeout: float, watched: int | None, awaited: set[int]) -> dict[int, Exception]:
        now, failures, overdue = time.monotonic(), {}, set()
        deadlines = {w: now + self._bound(w, timeout) for w in self.pending}
        waiting_for = len(awaited & set(self.pending))
        while len(awaited & set(self.pending)) > len(overdue):
            # once one worker has answered, the others are awaited without sleeping, up to `spin`
            waiting = [w for w in self.pending if w in awaited and w not in overdue]
            deadline = min(deadlines[w] for w in waiting)
            events = self._wait_for_events(deadline, self.spin if len(waiting) < waiting_for else 0.0)
            if not events:
                for w in [w for w in waiting if deadlines[w] <= time.monotonic()]:
                    overdue.add(w)
                    self.timed_out.add(w)
                    envs = self.envs_of(w)
                    message = f"envs {envs} did not answer '{self.pending[w]}' within {self._bound(w, timeout):g} s"
                    failures[w] = WorkerTimeout(f"{message} (worker {w})", envs, self.pending[w])
            for fd, _ in events:
                if fd == watched:
                    self.interrupt.check()
                elif fd in self.fd_owner:
                    w, is_exit = self.fd_owner[fd]
                    if self._read(w, is_exit, failures) and w in self.pending:  # started: its build timed now
                        deadlines[w] = time.monotonic() + timeout
        return failures

    def _read(self, w: int, is_exit: bool, failures: dict[int, Exception]) -> bool:
        """Takes worker w's whole replies, or notes its death; True if it said it has started."""
        conn = self.conns[w]
        open_, started, replied = conn.pump(), False, False
        while (msg := conn.message()) is not None:
            if w not in self.pending:  # a reply to nobody: a protocol fault
                failures[w] = self._death(w)
                return started
            if self.pending[w] == "start":  # its first word: started, and building its envs now
                self.pending[w], started = "make", True
                continue
            del self.pending[w]
            self.timed_out.discard(w)
            replied = True
            payload = None if msg[:1] == Reply.OK else pickle.loads(memoryview(msg)[1:])
            if msg[:1] == Reply.ERROR:
                failures[w] = remote_error(payload, f"worker {w}, pid {self.procs[w].pid}")
                self._unwatch(w)  # it exits after this reply
            self.replies[w] = payload
        if not replied and (is_exit or not open_):  # exited, or closed its pipe, without a reply
            failures[w] = self._death(w)
            self.pending.pop(w, None)
        return started

    def _death(self, w: int) -> WorkerError:
        proc, doing = self.procs[w], self.pending.get(w)
        self._unwatch(w)
        # its exit code; a helper may hold the pipe open
        process_control.end_processes([proc], grace=2.0)
        how = process_control.describe_exit(proc.exitcode)
        when = f"during '{doing}'" if doing else "between commands"
        message = f"worker {w} (pid {proc.pid}, envs {self.envs_of(w)}) {how} {when}"
        return WorkerError(message, self.envs_of(w), doing or "?", proc.exitcode)

    def _unwatch(self, w: int) -> None:
        """Takes worker w's socket and process fd out of the poll set: its end is known."""
        for fd in (self.conns[w].fd, self.exit_fds[w]):
            if self.fd_owner.pop(fd, None) is not None:
                self.poller.unregister(fd)

    def replace(self, failures: dict, timeout: float, expected: tuple, max_restarts: int) -> tuple:
        """Replaces the failed workers while `max_restarts` allows (a failed rebuild uses a restart) and resets
        their envs, spaces checked against `expected`: ({w: reset reply}, the failures left)."""
        replies: dict[int, tuple] = {}
        while failures and self.restarts + len(failures) <= max_restarts:
            ws = sorted(failures)
            for w in ws:
                self.restarts += 1
                first_line = str(failures[w]).splitlines()[0]
                logging.getLogger(__name__).warning(
                    f"SubprocVecEnv: restarting worker {w} (envs {self.envs_of(w)}), restart "
                    f"{self.restarts} of {max_restarts}: {first_line}"
                )
                self._unwatch(w)
                self.conns[w].close()
                _close_exit_fd(self.exit_fds[w], self.procs[w])
                self.pending.pop(w, None)
                self.replies.pop(w, None)
                self.timed_out.discard(w)
            process_control.end_processes([self.procs[w] for w in ws], grace=0.0)
            for w in ws:
                self._start(w)
            failures = {}
            for w in self._rebuilt(ws, timeout, failures):
                check_spaces(self.replies.pop(w)[0], expected, first=self.slices[w].start)
                self._attach(w)
            for w in self._rebuilt(ws, timeout, failures):
                n = len(self.envs_of(w))
                self.send(w, Command.RESET, ([None] * n, None, [True] * n))
            replies.update({w: self.replies.pop(w) for w in self._rebuilt(ws, timeout, failures)})
        return replies, failures

    def _rebuilt(self, ws: list[int], timeout: float, failures: dict[int, Exception]) -> list[int]:
        """Waits for the rebuilt workers, into `failures`; those of `ws` that have not failed."""
        for w, failure in self.collect(timeout, workers=ws).items():
            self.pending.pop(w, None)
            if isinstance(failure, WorkerTimeout):  # a worker left half-built: no wait can take it up again
                failure = WorkerError(str(failure), failure.env_indices, failure.command)
            failures[w] = failure
        return [w for w in ws if w not in failures]

    def close(self, timeout: float) -> None:
        """Lets the replies under way arrive, asks every worker to exit, then kills what is left."""
        deadline = time.monotonic() + timeout
        while set(self.pending) - self.timed_out and time.monotonic() < deadline:
            self.collect(deadline - time.monotonic(), interruptible=False)
        self.timed_out.update(self.pending)
        self.finalizer.detach()
        for fd, proc in zip(self.exit_fds, self.procs, strict=True):
            _close_exit_fd(fd, proc)
        _shutdown(self.procs, self.conns, self.timed_out, timeout)
        if self.block_fd is not None:
            os.close(self.block_fd)
            self.block_fd = None


def _exit_fd(proc: Any) -> int:
    """A file descriptor readable once `proc` has exited: a pidfd (Linux 5.3+), else a sentinel."""
    try:
        return os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        return proc.sentinel


def _close_exit_fd(fd: int, proc: Any) -> None:
    if fd != proc.sentinel:  # multiprocessing closes its own
        os.close(fd)


def _shutdown(procs: list, conns: list, timed_out: set[int], timeout: float) -> None:
    """Asks workers to exit, waits, kills what is left; also at exit, for a vec env never closed."""
    for w, conn in enumerate(conns):
        if w not in timed_out:
            with contextlib.suppress(OSError, ValueError):
                conn.send(encode(Command.CLOSE))
    process_control.end_processes([proc for w, proc in enumerate(procs) if w in timed_out], grace=0.0)
    process_control.end_processes(procs, grace=timeout)
    for conn in conns:
        conn.close()
    procs.clear()
    conns.clear()
