"""A script's process around its `main`: the command line, stop signals as requests, the closing line
and the exit status: 0 done; 1 a failure (one line, but a bug keeps its traceback); 2 a bad flag or
file, nothing started; 128 + signal when stopped, after saving."""

import contextlib
import dataclasses
import os
import sys
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..multiprocessing_env import WorkerError
from ..vecenv.process_control import ignore_stop_signals
from . import flags
from .errors import Finished, FlagError, RunError
from .stops import Stopped, StopRequest


@dataclasses.dataclass
class CommandLine:
    """What Run.cli parsed, for `main` and Run: the words as typed (a printed command starts with argv[0]), the
    flags they name (what a resume may change), the stop request, and the closing line (line, to stderr)."""

    argv: list[str]
    named: frozenset[str]
    stop: StopRequest
    closing: tuple[str, bool] | None = None

    @property
    def script(self) -> str:
        return Path(self.argv[0]).name

    @classmethod
    def of(cls, args: Any) -> "CommandLine":
        """A script's main called from Python: no flag named, no signal handled."""
        path = sys.modules[type(args).__module__].__file__
        return cls([path], frozenset(), StopRequest(Path(path).name))


def run(main: Callable[[Any, CommandLine], Any], args_type: type, doc: str) -> None:
    """Parses args_type from the command line (--help opens with `doc`'s first two paragraphs), runs
    main(args, command_line) with stop signals as stop requests, and exits with the status its outcome
    calls for, after the closing line. Under torchrun every failing rank says why; rank 0 alone says a
    stop."""
    import tyro

    script = Path(sys.argv[0]).name
    rank, world_size = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    me = f"{script}: rank {rank}" if world_size > 1 else script
    command_line = CommandLine(list(sys.argv), frozenset(), StopRequest(script))

    def close(status: int, message: str | None = None) -> None:
        if message is not None:
            print(f"{me}: {message}", file=sys.stderr, flush=True)
        if command_line.closing is not None:
            line, to_stderr = command_line.closing
            print(line, file=sys.stderr if to_stderr else sys.stdout, flush=True)
        # the run is over: a launcher's forwarded signal must not end the exit
        ignore_stop_signals()
        sys.exit(status)

    command_line.stop.install()
    threading.excepthook = _quiet_writer_thread
    try:
        flags.check_words(args_type, sys.argv[1:], script)
        try:
            args = tyro.cli(args_type, description="\n\n".join(doc.split("\n\n")[:2]))
        except (SystemExit, BrokenPipeError) as exc:  # --help (tyro exits), maybe into `| head`
            with contextlib.suppress(BrokenPipeError):
                sys.stdout.flush()
                if not isinstance(exc, BrokenPipeError):
                    raise
            # the reader left: no complaint
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise SystemExit(0) from None
        command_line.named = flags.named_fields(args_type, sys.argv[1:])
        main(args, command_line)
    except Finished as exc:
        if rank == 0:
            print(f"{script}: {exc}", flush=True)
    except FlagError as exc:
        close(2, f"error: {exc}")
    except Stopped as exc:
        # stopped before training started: nothing else to say
        if rank == 0 and command_line.closing is None:
            print(f"{script}: stopped by {exc}", file=sys.stderr, flush=True)
        close(128 + exc.signum)
    except (RunError, WorkerError, TimeoutError, FloatingPointError) as exc:
        bound = "; --step-timeout sets that bound, --max-restarts N replaces a stuck worker"
        close(1, f"error: {exc}{bound if isinstance(exc, TimeoutError) else ''}")
    except OSError as exc:  # the disk (full, read-only) or the machine, not the code: what and where
        close(1, f"error: {exc.strerror or exc}{f': {exc.filename}' if exc.filename else ''}")
    except Exception:  # noqa: BLE001 - a bug: its traceback
        traceback.print_exc()
        close(1)
    close(0)


def _quiet_writer_thread(hook_args: Any) -> None:
    """No traceback of TensorBoard's writer thread's OSError (a full disk): the run's next write says it in one line."""
    if not (issubclass(hook_args.exc_type, OSError) and "tensorboard" in type(hook_args.thread).__module__):
        threading.__excepthook__(hook_args)
