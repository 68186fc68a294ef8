"""Stops: the stop signals (process_control.STOP_SIGNALS) are requests the run honours at safe points
(`check`), never exceptions thrown into library code; every wait of the trainer wakes on them (`fileno`).
A thread sees each signal as it arrives (signal.set_wakeup_fd) and bounds the stop (STOP_WITHIN)."""

import ctypes
import os
import select
import signal
import sys
import threading
import time

from ..vecenv.process_control import STOP_SIGNALS

# a launcher's pid: the run stops (and saves) when it dies
END_WITH_PARENT = "PPO_VEC_END_WITH_PARENT"
STOP_WITHIN = 120.0  # seconds a stop may take, saving included, before the process ends regardless
# seconds within which a second SIGINT is the first one forwarded, not a second Ctrl-C
SAME_STOP = 1.0


class Stopped(KeyboardInterrupt):
    """Raised at a safe point once a stop signal was received (`signum` says which)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class StopRequest:
    """A process's stop request, `signum` (None until a stop signal arrives). `install()` (Run.cli's) makes the
    stop signals (not SIGHUP under nohup) requests, and its launcher's death a SIGTERM. With `at_once`, a stop
    ends the process at once (a wait in C code no signal interrupts, before there is anything to save)."""

    def __init__(self, script: str = "python") -> None:
        self.script = script  # what its own lines start with
        self.signum: int | None = None
        self.at_once = False
        # readable once a stop is requested: what waits poll
        self._woken_r, self._woken_w = os.pipe()

    def install(self) -> None:
        signals_r, signals_w = os.pipe()
        os.set_blocking(signals_w, False)
        # the C handler writes each signal's number
        signal.set_wakeup_fd(signals_w, warn_on_full_buffer=False)
        for signum in STOP_SIGNALS - ({signal.SIGHUP} if signal.getsignal(signal.SIGHUP) == signal.SIG_IGN else set()):
            signal.signal(signum, self._record)
        threading.Thread(target=self._watch, args=(signals_r,), name="stop-watch", daemon=True).start()
        # the launcher's death stops this run (and it saves), even while this process was starting
        launcher = os.environ.pop(END_WITH_PARENT, "")  # not passed on to what this run starts
        torchrun = "TORCHELASTIC_RUN_ID" in os.environ  # its agent is the parent
        if (torchrun or launcher.isdigit()) and sys.platform.startswith("linux"):
            parent = os.getppid() if torchrun else int(launcher)
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
            if os.getppid() != parent:  # it died before we asked
                os.kill(os.getpid(), signal.SIGTERM)

    def _record(self, signum: int, frame: object) -> None:
        """The handler: notes the request (the thread wakes the waits and bounds the stop)."""
        if self.signum is None:
            self.signum = signum

    def ask(self, signum: int = signal.SIGTERM) -> None:
        """Requests a stop, as the signal `signum` does, and wakes the waits."""
        self._record(signum, None)
        os.write(self._woken_w, b"!")

    def check(self) -> None:
        if self.signum is not None:
            raise Stopped(self.signum)

    def fileno(self) -> int:
        return self._woken_r

    def wait(self, seconds: float) -> bool:
        """Waits up to `seconds` for a stop request; True if there is one."""
        select.select([self._woken_r], [], [], seconds)
        return self.signum is not None

    def _watch(self, signals_r: int) -> None:
        first = None  # when the stop was requested
        while True:
            timeout = None if first is None else max(0.0, first + STOP_WITHIN - time.monotonic())
            if not select.select([signals_r], [], [], timeout)[0]:
                self._end_now(f"the stop took over {STOP_WITHIN:g} s; ending now", 128 + self.signum)
            for signum in os.read(signals_r, 64):
                if signum not in STOP_SIGNALS:
                    continue
                if first is None:
                    first = time.monotonic()
                    self.ask(signum)
                    if self.at_once:
                        self._end_now(f"stopped by {signal.Signals(signum).name}", 128 + signum)
                elif signum == signal.SIGINT and time.monotonic() - first >= SAME_STOP:
                    self._end_now("a second Ctrl-C: ending now", 128 + signum)

    def _end_now(self, message: str, status: int) -> None:
        print(f"{self.script}: {message}", file=sys.stderr, flush=True)
        os._exit(status)
