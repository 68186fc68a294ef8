"""The run folder, runs/<env>__<exp_name>__<seed>__<time>/, and the files a run keeps in it: .lock
(held by the one process that writes the folder), args.json (the flags, the script's defaults, what
its command line gave, each resume), summary.json (how it ended) and checkpoint.pt (the state at an
iteration boundary: values only, read back with weights_only=True)."""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import io
import json
import os
import reprlib
import sys
import time
from pathlib import Path
from typing import Any

import torch

from .errors import FlagError, RunError
from .flags import given_fields

LOCK = ".lock"
# a launcher's pid: the run stops (and saves) when it dies
END_WITH_PARENT = "PPO_VEC_END_WITH_PARENT"


def lock_holder(lock: Path) -> int | None:
    """The pid of the live process that holds the lock file `lock` (-1: one that wrote no pid),
    or None."""
    try:
        fd = os.open(lock, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return None
    except BlockingIOError:
        pid = os.read(fd, 32).split()[:1]
        return int(pid[0]) if pid and pid[0].isdigit() else -1
    finally:
        os.close(fd)


def hold(lock: Path) -> int:
    """Makes this process the holder of the lock file `lock` (the kernel lets go however it
    ends); its descriptor. FlagError naming the process that holds it already."""
    try:
        # (a link planted there: refused)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as exc:
        raise FlagError(
            f"{lock} cannot be this run's lock ({exc.strerror}): remove it, or resume another run"
        ) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise FlagError(
            f"{lock.parent} is being written by process {lock_holder(lock)}: a run has one writer at a time; "
            "wait for it to end, or stop it"
        ) from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def make_run_dir(args: Any, steps_per_iteration: int, world_size: int) -> Path:
    """Creates and holds runs/{env_id}__{exp_name}__{seed}__{unix time} (-2, -3, ... if taken)
    with its args.json; RunError in one line if it cannot be made here."""
    base = f"{args.env_id.replace('/', '-').replace(':', '-')}__{args.exp_name}__{args.seed}__{int(time.time())}"
    try:
        Path("runs").mkdir(exist_ok=True)
        for k in range(1, 1_000_000):
            path = Path("runs", base if k == 1 else f"{base}-{k}")
            try:
                path.mkdir()  # atomic: two runs starting in the same second never share a folder
            except FileExistsError:
                continue
            hold(path / LOCK)
            write_args(path, args, steps_per_iteration, world_size)
            return path
    except OSError as exc:  # read-only, full, or `runs` is a file
        why = "a file of that name is in the way" if os.path.isfile("runs") else exc.strerror
        raise RunError(
            f"cannot make the run folder in {os.path.abspath('runs')} ({why}); run from a folder you can write to"
        ) from None
    raise RunError(f"no free run folder name under runs/{base}")


def write_args(run_dir: Path, args: Any, steps_per_iteration: int, world_size: int, resumed: dict | None = None):
    """args.json: the flags the run is trained with, the script's defaults and the fields its
    first command line gave (together, what it was asked for: its identity to a sweep), its ranks
    and the steps of an iteration of them all, and each resume: when, from which iteration and
    step, and which flags it changed. FlagError if a resume finds one edited out of shape."""
    path, flags = run_dir / "args.json", dataclasses.asdict(args)
    record = {
        "script": Path(sys.argv[0]).name,
        **flags,
        "defaults": dataclasses.asdict(type(args)()),
        "given": sorted(given_fields(type(args))),
        "world_size": world_size,
        "steps_per_iteration": steps_per_iteration,
        "resumes": [],
    }
    if resumed is not None:
        # (no record at all: written anew)
        earlier = read_args(path) if read_json(path) is not None else {}
        # a record edited out of shape: refused, so that its history is not lost
        if earlier is None:
            raise FlagError(
                f"{path} is not an args.json a run writes (edited since?): put it back, or remove it to have "
                "it written anew from the checkpoint"
            )
        changed = {k: [earlier[k], v] for k, v in flags.items() if k != "resume" and k in earlier and earlier[k] != v}
        at = {"at": time.strftime("%Y-%m-%d %H:%M:%S"), "changed": changed}
        at |= {"from_iteration": resumed["iteration"], "from_step": resumed["global_step"]}
        record["given"] = earlier.get("given", record["given"])  # what the run was started with
        record["resumes"] = [*earlier.get("resumes", []), at]
    write_json(path, record)


def read_args(path: Path) -> dict[str, Any] | None:
    """args.json as runs write it (what it was asked for: defaults and given; each resume and the
    flags it changed), or None (missing, unreadable, or edited out of shape)."""
    record = read_json(path)
    if record is None or not isinstance(record.get("defaults"), dict) or not isinstance(record.get("given"), list):
        return None
    resumes = record.get("resumes", [])
    if not isinstance(resumes, list) or not isinstance(record.get("world_size", 1), int):
        return None
    changes = [r.get("changed") if isinstance(r, dict) else None for r in resumes]
    if not all(isinstance(c, dict) and all(isinstance(v, list) and len(v) == 2 for v in c.values()) for c in changes):
        return None
    return record if all(isinstance(g, str) for g in record["given"]) else None


def write_atomically(path: Path, data: bytes | memoryview) -> None:
    """Writes data so that a reader sees the old file or the new one, never a part: a temp file
    beside it, flushed to disk, renamed over it. On failure the temp file is removed, path left
    as it was."""
    tmp = path.with_name(f"{path.name}.tmp")
    try:
        tmp.unlink(missing_ok=True)  # a file, or a link planted there: written anew, never through
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644), "wb") as f:
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
    """A JSON file's object, or None (missing, unreadable, not a regular file, or another kind of
    value)."""
    try:
        data = json.loads(Path(path).read_text()) if Path(path).is_file() else None
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def save_checkpoint(path: Path | str, state: dict) -> None:
    """Writes state atomically; RunError in one line if it cannot (a full disk, NaN/Inf in a tensor,
    something torch cannot save), the previous file then unchanged."""
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
    """A checkpoint `script` wrote, read with weights_only=True (loading never runs code); FlagError
    naming the flag for a missing, unreadable, foreign or damaged file."""
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
    except Exception as exc:  # noqa: BLE001 - truncated, damaged and foreign files alike
        reason = "it is cut short or damaged"
        if "Weights only load failed" in str(exc):
            reason = "it holds objects no checkpoint of this project holds, and they were not loaded: only "
            reason += "resume what you wrote"
        raise FlagError(f"{where}: not a readable checkpoint ({reason})") from None
    written_by = checkpoint.get("script") if isinstance(checkpoint, dict) else None
    if written_by != script:
        what = f"was written by {written_by}" if isinstance(written_by, str) else "is not a checkpoint of this project"
        raise FlagError(f"{where} {what}; {script} reads only its own checkpoints")
    check_fields(checkpoint, ("args", "model"), where, script)
    return checkpoint


def check_fields(checkpoint: dict, names: Any, where: str, script: str) -> None:
    """FlagError unless the checkpoint holds each of `names`, and each field it holds as FIELDS
    says."""
    missing = [name for name in names if name not in checkpoint]
    if missing:
        raise FlagError(
            f"{where} holds no {' and no '.join(missing)}: not a whole checkpoint of {script} (an older "
            "version, or a file edited since)"
        )
    wrong = [name for name, ok in FIELDS.items() if name in checkpoint and not ok(checkpoint[name], checkpoint)]
    if wrong:
        raise FlagError(
            f"{where} holds a {' and a '.join(wrong)} no run of {script} writes: a file edited since, or damaged"
        )


def _rng_state(value: Any) -> bool:
    """A random generator's state: numpy's bit_generator.state, or torch's get_state()."""
    if isinstance(value, torch.Tensor):
        return value.dtype == torch.uint8
    return isinstance(value, dict) and isinstance(value.get("bit_generator"), str) and "state" in value


def _each_rank(ok: Any) -> Any:
    """A field holding one value per rank, each `ok`."""
    ranks = lambda c: c.get("world_size", 1)  # noqa: E731 - (a wrong world_size is said once, as itself)
    return lambda v, c: (
        isinstance(v, list) and all(map(ok, v)) and (len(v) == ranks(c) or not FIELDS["world_size"](ranks(c), c))
    )


# What each field of a checkpoint may hold: (value, the whole checkpoint) -> ok
FIELDS: dict[str, Any] = {
    "args": lambda v, c: isinstance(v, dict),
    "model": lambda v, c: isinstance(v, dict),
    "world_size": lambda v, c: type(v) is int and v >= 1,
    "iteration": lambda v, c: type(v) is int and v >= 0,
    "global_step": lambda v, c: type(v) is int and v >= 0,
    "recent_returns": lambda v, c: isinstance(v, list) and all(type(r) in (int, float) for r in v),
    "rng": _each_rank(_rng_state),
    "env_states": _each_rank(lambda s: s is None or isinstance(s, (dict, bytes))),  # bytes: pickled, not read
}


def load_state(obj: Any, state: Any, where: str) -> None:
    """obj.load_state_dict(state) once state is checked to hold what obj's own does (the same
    names; tensors of the same shape and dtype; for an optimizer, the moments one step of it makes
    and its settings): a mismatch is one FlagError (for a model, the first tensor that differs and
    both shapes: a checkpoint of another env, or of other sizes), never a load that would write
    past a tensor."""
    what = "model" if isinstance(obj, torch.nn.Module) else type(obj).__name__
    try:
        if isinstance(obj, torch.optim.Optimizer):
            why = _optimizer_misfit(obj, state)
        else:
            why = _misfit(obj.state_dict(), state, "")
            why = why and why + (" (another env, or other sizes?)" if " has shape " in why else "")
    except Exception as exc:  # noqa: BLE001 - a state edited out of any shape
        why = f"it holds no state of one ({one_line(exc)})"
    if why:
        raise FlagError(f"{where} does not fit this run's {what}: {why}")
    try:
        obj.load_state_dict(state)
    except (RuntimeError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise FlagError(f"{where} does not fit this run's {what} ({one_line(exc)})") from None


def _misfit(own: Any, theirs: Any, name: str) -> str | None:
    """Where `theirs` is not shaped like `own` (a state dict, nested), in words; None if it is."""
    if isinstance(own, torch.Tensor):
        if not isinstance(theirs, torch.Tensor):
            return f"{name} is a {type(theirs).__name__} there, a tensor here"
        if theirs.shape != own.shape:
            return f"{name} has shape {tuple(theirs.shape)} there, {tuple(own.shape)} here"
        return f"{name} is {theirs.dtype} there, {own.dtype} here" if theirs.dtype != own.dtype else None
    if isinstance(own, dict):
        if not isinstance(theirs, dict):
            return f"{name or 'it'} is a {type(theirs).__name__} there, a dict here"
        for key in [k for k in [*own, *theirs] if k not in own or k not in theirs][:1]:
            return (
                f"{'this run has' if key in own else 'the checkpoint has'} {f'{name}.{key}'.strip('.')}, the other not"
            )
        return next((why for k in own if (why := _misfit(own[k], theirs[k], f"{name}.{k}".strip(".")))), None)
    if isinstance(own, (list, tuple)):
        if type(theirs) is not type(own) or len(theirs) != len(own):
            return f"{name} holds {len(theirs) if isinstance(theirs, (list, tuple)) else 'no'} items, not {len(own)}"
        pairs = enumerate(zip(own, theirs, strict=True))
        return next((why for k, (a, b) in pairs if (why := _misfit(a, b, f"{name}[{k}]"))), None)
    kinds = {int: (int, float), float: (int, float), type(None): (type(None), bool)}.get(type(own), (type(own),))
    here = "None" if own is None else f"a {type(own).__name__}"
    return None if type(theirs) in kinds else f"{name} is {reprlib.repr(theirs)} there, {here} here"


def _optimizer_misfit(optimizer: torch.optim.Optimizer, theirs: Any) -> str | None:
    """An optimizer's state checked against what one step of a copy of it makes: each parameter's
    moments, of that shape and dtype (a fused step would write past one that is not), and its
    settings, the same but for a learning rate that anneals (a finite one). A setting this torch
    added since the checkpoint may be missing (torch fills it in)."""
    own = _stepped(optimizer)
    if not isinstance(theirs, dict) or set(theirs) != {"state", "param_groups"}:
        return "it is not an optimizer's state"
    groups, state = theirs["param_groups"], theirs["state"]
    if not isinstance(groups, list) or len(groups) != len(own["param_groups"]) or not isinstance(state, dict):
        return "its parameter groups are others"
    for k, (mine, their) in enumerate(zip(own["param_groups"], groups, strict=True)):
        if not isinstance(their, dict) or their.keys() - mine.keys():
            extra = sorted(their.keys() - mine.keys()) if isinstance(their, dict) else "none"
            return f"param_groups[{k}] holds settings this torch's {type(optimizer).__name__} has not: {extra}"
        for key in their.keys() - {"lr"}:
            if not (type(their[key]) is type(mine[key]) and their[key] == mine[key]):
                return f"param_groups[{k}].{key} is {reprlib.repr(their[key])} there, {mine[key]!r} here"
        if not (type(their["lr"]) in (int, float) and 0 <= their["lr"] < float("inf")):
            return f"param_groups[{k}].lr is {reprlib.repr(their['lr'])} there, a learning rate here"
    return _misfit({i: own["state"][i] for i in state if i in own["state"]}, state, "state")


def _stepped(optimizer: torch.optim.Optimizer) -> dict:
    """The state_dict of a copy of `optimizer` after one step on zero gradients: the moments of each
    parameter, their shapes and dtypes."""
    groups = [
        {**group, "params": [torch.zeros_like(p, requires_grad=True) for p in group["params"]]}
        for group in optimizer.param_groups
    ]
    for p in (p for group in groups for p in group["params"]):
        p.grad = torch.zeros_like(p)
    copy = type(optimizer)(groups)
    copy.step()
    return copy.state_dict()


def one_line(exc: BaseException, limit: int = 200) -> str:
    """The first line of an exception's message (its type's name if it has none), at most `limit`
    long."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:limit]
