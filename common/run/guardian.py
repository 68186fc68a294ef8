"""A watcher that ends what a run left behind, however the run ended (finished, stopped, failed or SIGKILLed).

Env code that runs in the trainer (the in-process layout, or an env a script builds to evaluate) may start helper
processes: simulators, servers, video encoders. Nothing in a SIGKILLed trainer can end them, so `watch_this_process`
starts a small process (no imports but the standard library) that notes the trainer's descendants every `PERIOD`
seconds (and when asked: `look_now`, as a run ends) and, once the trainer is gone (the pipe it holds closes), kills
those still alive and their descendants. A helper started less than `PERIOD` before a SIGKILL can escape. The watcher
ignores SIGINT and SIGTERM: a scheduler that signals every process of a job must not take it away before the trainer
has ended. Linux only (it reads /proc). Worker processes need none of this: each ends its own helpers (worker.py).

Run as a script by `watch_this_process`: python -S guardian.py TRAINER_PID.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys

PERIOD = 0.5  # seconds between looks at the trainer's descendants
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_started: dict[int, subprocess.Popen] = {}


def watch_this_process() -> None:
    """Starts the watcher of this process, once (a no-op where there is no /proc)."""
    if os.getpid() in _started or not os.path.isdir("/proc/self"):
        return
    _started.clear()  # a forked child's entry belongs to its parent
    held = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)  # until the watcher ignores them
    try:
        _started[os.getpid()] = subprocess.Popen(
            [sys.executable, "-S", os.path.abspath(__file__), str(os.getpid())], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, close_fds=True,
        )  # fmt: skip
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def look_now(timeout: float = 2.0) -> None:
    """Has the watcher note this process's descendants now (a run about to end: what its last moments started)."""
    watcher = _started.get(os.getpid())
    if watcher is None or watcher.poll() is not None:
        return
    try:
        watcher.stdin.write(b"l")
        watcher.stdin.flush()
        if select.select([watcher.stdout], [], [], timeout)[0]:
            watcher.stdout.read(1)
    except OSError:
        pass


def _stat(pid: int) -> tuple[int, int, int] | None:
    """(parent pid, process group, start time in clock ticks since boot) of a live process, or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    if fields[0] == b"Z":
        return None
    return int(fields[1]), int(fields[2]), int(fields[19])


def _table() -> dict[int, tuple[int, int, int]]:
    table = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (entry := _stat(int(name))) is not None:
            table[int(name)] = entry
    return table


def _descendants(root: int, table: dict[int, tuple[int, int, int]]) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, stack = set(), [root]
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in found:
                found.add(child)
                stack.append(child)
    return found


def main(trainer: int) -> None:
    for signum in _STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
    me = os.getpid()
    known: dict[int, int] = {}  # the trainer's descendants seen: pid -> start time
    while True:
        if select.select([0], [], [], PERIOD)[0]:
            if not os.read(0, 1):
                break  # the trainer is gone
            asked = True
        else:
            asked = False
        table = _table()
        known.update({pid: table[pid][2] for pid in _descendants(trainer, table) if pid != me})
        if asked:
            os.write(1, b"k")
    table = _table()  # the trainer's children now have another parent: those seen, if still the same processes
    leftovers = {pid for pid, started in known.items() if table.get(pid, (0, 0, -1))[2] == started}
    for pid in list(leftovers):
        leftovers |= _descendants(pid, table)
    leftovers.discard(me)
    for pid in leftovers:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


if __name__ == "__main__":
    main(int(sys.argv[1]))
