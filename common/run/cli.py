"""A script's process around its `main`: the command line, stop signals as requests, the closing line
and the exit status: 0 done; 1 a failure (one line, but a bug keeps its traceback); 2 a bad flag or
file, nothing started; 128 + signal when stopped, after saving."""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..multiprocessing_env import WorkerError
from . import flags, stops
from .errors import Finished, FlagError, RunError
from .stops import Stopped

# the closing line a run composed, and whether it goes to stderr
closing_lines: list[tuple[str, bool]] = []


def run(main: Callable[[Any], Any], args_type: type, doc: str) -> None:
    """Parses args_type from the command line (--help opens with `doc`'s first two paragraphs), runs
    main(args) with stop signals as stop requests, and exits with the status its outcome calls for,
    after the closing line. Under torchrun every failing rank says why; rank 0 alone says a stop."""
    import tyro

    script = Path(sys.argv[0]).name
    rank, world_size = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    me = f"{script}: rank {rank}" if world_size > 1 else script

    def close(status: int, message: str | None = None) -> None:
        if message is not None:
            print(f"{me}: {message}", file=sys.stderr, flush=True)
        for line, to_stderr in closing_lines:
            print(line, file=sys.stderr if to_stderr else sys.stdout, flush=True)
        # the run is over: a launcher's forwarded signal must not end the exit
        stops.request.ignore()
        sys.exit(status)

    stops.request.install()
    stops.end_with_launcher()
    try:
        flags.check_bool_values(args_type, sys.argv[1:])
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
        main(args)
    except Finished as exc:
        if rank == 0:
            print(f"{script}: {exc}", flush=True)
    except FlagError as exc:
        close(2, f"error: {exc}")
    except Stopped as exc:
        # stopped before training started: nothing else to say
        if rank == 0 and not closing_lines:
            print(f"{script}: stopped by {exc}", file=sys.stderr, flush=True)
        close(128 + exc.signum)
    except (RunError, WorkerError, TimeoutError, FloatingPointError) as exc:
        bound = "; --step-timeout sets that bound, --max-restarts N replaces a stuck worker"
        close(1, f"error: {exc}{bound if isinstance(exc, TimeoutError) else ''}")
    except Exception:  # noqa: BLE001 - a bug: its traceback
        traceback.print_exc()
        close(1)
    close(0)
