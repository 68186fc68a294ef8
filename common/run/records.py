"""The run folder, runs/<env>__<exp_name>__<seed>__<time or --run-id>/, and its files: .lock (its one writer),
args.json (the flags, each resume), summary.json (how it ended) and checkpoint.pt (values only)."""

import copy
import dataclasses
import errno
import fcntl
import io
import itertools
import json
import os
import pickle
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .errors import FlagError, RunError

LOCK = ".lock"


def hold(lock: Path) -> int:
    """Holds the lock file `lock` (the kernel lets go however this process ends); its descriptor, or FlagError
    naming its holder."""
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pid = os.read(fd, 32).decode(errors="replace").strip() or "?"  # the holder wrote its pid
        os.close(fd)
        raise FlagError(
            f"{lock.parent} is being written by process {pid}: a run has one writer at a time; "
            "wait for it to end, or stop it"
        ) from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def run_name(args: Any) -> str:
    """The start of a run's folder name: {env_id}__{exp_name}__{seed}."""
    return f"{args.env_id.replace('/', '-').replace(':', '-')}__{args.exp_name}__{args.seed}"


def make_run_dir(args: Any, command_line: Any, steps_per_iteration: int, world_size: int) -> Path:
    """Creates and holds runs/{run_name}__{--run-id or unix time (-2, -3, ... if taken)}, with its args.json
    (a --run-id folder that never saved is made anew)."""
    run_id = getattr(args, "run_id", None)
    base = f"{run_name(args)}__{run_id or int(time.time())}"
    try:
        Path("runs").mkdir(exist_ok=True)
        if run_id is not None and Path("runs", base).exists():
            os.close(hold(Path("runs", base, LOCK)))  # nobody else writes it
            shutil.rmtree(Path("runs", base))
        for k in itertools.count(1):
            path = Path("runs", base if k == 1 else f"{base}-{k}")
            try:
                path.mkdir()  # atomic: two runs starting in the same second never share a folder
            except FileExistsError:
                continue
            hold(path / LOCK)
            write_args(path, args, command_line, steps_per_iteration, world_size)
            return path
    except OSError as exc:  # read-only, full, or `runs` is a file
        why = "a file of that name is in the way" if os.path.isfile("runs") else exc.strerror
        raise RunError(
            f"cannot make the run folder in {os.path.abspath('runs')} ({why}); run from a folder you can write to"
        ) from None


def write_args(run_dir: Path, args: Any, command_line: Any, steps_per_iteration: int, world_size: int, resumed=None):
    """args.json, what a sweep knows the run by: its flags, defaults, the flags first named, and each resume."""
    path, flags = run_dir / "args.json", dataclasses.asdict(args)
    record = {
        "script": command_line.script,
        **flags,
        "defaults": dataclasses.asdict(type(args)()),
        "given": sorted(command_line.named),
        "scheduled": list(getattr(type(args), "SCHEDULED", ())),
        "world_size": world_size,
        "steps_per_iteration": steps_per_iteration,
        "resumes": [],
    }
    if resumed is not None:
        earlier = read_json(path) or {}  # what the run's earlier parts recorded
        changed = {k: [earlier[k], v] for k, v in flags.items() if k != "resume" and k in earlier and earlier[k] != v}
        at = {"at": time.strftime("%Y-%m-%d %H:%M:%S"), "changed": changed}
        at |= {"from_iteration": resumed["iteration"], "from_step": resumed["global_step"]}
        record["given"] = earlier.get("given", record["given"])  # what the run was started with
        record["resumes"] = [*earlier.get("resumes", []), at]
    write_json(path, record)


def write_atomically(path: Path, data: bytes | memoryview) -> None:
    """Writes data so that a reader sees the old file or the new one, never a part (on failure: the old)."""
    tmp = path.with_name(f"{path.name}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise


def write_json(path: Path, data: dict[str, Any]) -> None:
    write_atomically(Path(path), (json.dumps(data, indent=1, default=str) + "\n").encode())


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON file's object, or None (missing, unreadable, or not an object)."""
    try:
        data = json.loads(Path(path).read_text()) if Path(path).is_file() else None
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def save_checkpoint(path: Path | str, state: dict) -> None:
    """Writes state atomically; RunError in one line if it cannot, the previous file then unchanged."""
    path = Path(path)
    if not all(torch.isfinite(t).all() for t in _tensors(state) if t.is_floating_point()):
        raise RunError(f"{path} was not written: the state holds NaN/Inf values (the previous file is unchanged)")
    buffer = io.BytesIO()
    try:
        torch.save(state, buffer)
        write_atomically(path, buffer.getbuffer())
    except Exception as exc:  # noqa: BLE001 - a full disk, or something in the state that does not save
        reason = f"{type(exc).__name__}: {exc.strerror}" if isinstance(exc, OSError) else one_line(exc)
        reason = "no space left on device" if getattr(exc, "errno", None) == errno.ENOSPC else reason
        raise RunError(f"could not write {path} ({reason}); the previous file, if any, is unchanged") from None


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else ()
    return [t for item in items for t in _tensors(item)]


def load_checkpoint(path: str, flag_name: str, script: str) -> dict:
    """A checkpoint `script` wrote, read with weights_only=True (loading never runs code); else FlagError."""
    where = f"{flag_name} {path}"
    if not path:
        raise FlagError(f"{flag_name} needs a checkpoint file (runs/<run>/checkpoint.pt), got ''")
    if not os.path.exists(path):
        raise FlagError(f"{where}: no such file")
    if not os.path.isfile(path):
        kind = "a folder: give the checkpoint.pt in it" if os.path.isdir(path) else "not a regular file"
        raise FlagError(f"{where}: {kind}")
    with open(path, "rb") as f:
        if f.read(4) != b"PK\x03\x04":  # torch.save writes zip archives
            raise FlagError(f"{where}: not a checkpoint (not a file that torch.save wrote)")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:  # what weights_only raises for anything but values
        reason = "it holds objects no checkpoint of this project holds, and they were not loaded: only resume what "
        raise FlagError(f"{where}: not a readable checkpoint ({reason}you wrote)") from None
    except Exception:  # noqa: BLE001 - truncated and damaged files alike
        raise FlagError(f"{where}: not a readable checkpoint (it is cut short or damaged)") from None
    written_by = checkpoint.get("script") if isinstance(checkpoint, dict) else None
    if written_by != script:
        what = f"was written by {written_by}" if isinstance(written_by, str) else "is not a checkpoint of this project"
        raise FlagError(f"{where} {what}; {script} reads only its own checkpoints")
    check_fields(checkpoint, ("args", "model"), where, script)
    return checkpoint


def check_fields(checkpoint: dict, names: Any, where: str, script: str) -> None:
    """FlagError unless the checkpoint holds each of `names`."""
    if missing := [name for name in names if name not in checkpoint]:
        raise FlagError(
            f"{where} holds no {' and no '.join(missing)}: not a whole checkpoint of {script} (an older "
            "version, or a file edited since)"
        )


def one_line(exc: BaseException, limit: int = 200) -> str:
    """The first line of an exception's message (else its type's name), at most `limit` long."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:limit]


def copy_state(state: Any) -> Any:
    """A state dict's copy training cannot change: tensors and arrays cloned (deepcopy is slow)."""
    if isinstance(state, (torch.Tensor, np.ndarray)):
        return state.clone() if isinstance(state, torch.Tensor) else state.copy()
    if isinstance(state, dict):
        return {key: copy_state(value) for key, value in state.items()}
    if type(state) in (list, tuple):
        return type(state)(copy_state(value) for value in state)
    return copy.deepcopy(state)


def iteration_of(path: Path) -> int | None:
    """The iteration the checkpoint at `path` holds (None: none there, or it cannot be read)."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)["iteration"]
    except Exception:  # noqa: BLE001 - no readable checkpoint there
        return None
