"""What a run leaves in runs/<env>__<exp_name>__<seed>__<time>/: args.json (the flags, the script's
defaults, what its command line gave, each resume), .lock (held by the one process writing it),
TensorBoard's events and the progress line (Progress), summary.json (how it ended) and checkpoint.pt
(the state at an iteration boundary); and what a run is: its flags."""

from __future__ import annotations

import collections
import dataclasses
import errno
import fcntl
import io
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

from .errors import FlagError, RunError

LOCK = ".lock"
# a launcher's pid: the run stops (and saves) when that process dies
END_WITH_PARENT = "PPO_VEC_END_WITH_PARENT"

# Flags that change nothing a run learns: a resume may give other values, and a sweep reuses a run
# made with others
TOLERATED = frozenset(
    {
        "checkpoint_interval",
        "num_workers",
        "step_timeout",
        "max_restarts",
        "num_threads",
        "cuda",
        "backend",
        "device_ids",
        "track",
        "wandb_project_name",
        "wandb_entity",
        "capture_video",
        "save_model",
        "eval_episodes",
        "eval_checkpoint",
        "resume",
    }
)
SCHEDULED = ("anneal_lr",)  # flags that make a run learn by a schedule over its --total-timesteps


def flag(name: str) -> str:
    """The command-line spelling of an Args field: num_envs -> --num-envs."""
    return "--" + name.replace("_", "-")


def differing(flags: dict[str, Any], other: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """{field: (its value in flags, in other)} for each flag that changes results (neither TOLERATED
    nor total_timesteps) and has another value in `other`."""
    return {
        name: (value, other.get(name))
        for name, value in flags.items()
        if name not in TOLERATED and name != "total_timesteps" and other.get(name) != value
    }


def scheduled(flags: dict[str, Any]) -> bool:
    return any(flags.get(name) for name in SCHEDULED)


def given_fields(args_type: type, argv: list[str] | None = None) -> set[str]:
    """The fields of args_type whose flags the command line gives (--norm-obs and --no-norm-obs both
    give norm_obs)."""
    spelled = {flag(f.name): f.name for f in dataclasses.fields(args_type)}
    spelled |= {"--no-" + name[2:]: field for name, field in spelled.items()}
    words = (word.split("=", 1)[0] for word in (sys.argv[1:] if argv is None else argv))
    return {spelled[word] for word in words if word in spelled}


# -------------------------------------------------------------------------------------------------
# the folder
def writer(run_dir: Path) -> int | None:
    """The pid of the live process that writes run_dir (it holds its .lock), or None."""
    try:
        fd = os.open(Path(run_dir) / LOCK, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return None
    except BlockingIOError:
        pid = os.read(fd, 32).split()[:1]
        # -1: held, by a process that wrote no pid
        return int(pid[0]) if pid and pid[0].isdigit() else -1
    finally:
        os.close(fd)


_held: list[int] = []  # the locks this process holds: released by the kernel however it ends


def hold(run_dir: Path) -> None:
    """Makes this process the one writer of run_dir; FlagError naming the process that holds it
    already."""
    fd = os.open(run_dir / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise FlagError(
            f"{run_dir} is being written by process {writer(run_dir)}: a run has one writer at a time; "
            "wait for it to end, or stop it"
        ) from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    _held.append(fd)


def make_run_dir(
    args: Any, root: str = "runs", steps_per_iteration: int | None = None, world_size: int = 1
) -> Path:
    """Creates and holds runs/{env_id}__{exp_name}__{seed}__{unix time} (-2, -3, ... if taken) with
    its args.json; RunError in one line if it cannot be made here."""
    base = (
        f"{args.env_id.replace('/', '-').replace(':', '-')}__{args.exp_name}__{args.seed}__{int(time.time())}"
    )
    try:
        Path(root).mkdir(exist_ok=True)
        for k in range(1, 1_000_000):
            path = Path(root) / (base if k == 1 else f"{base}-{k}")
            try:
                path.mkdir()  # atomic: two runs starting in the same second never share a folder
            except FileExistsError:
                continue
            hold(path)
            write_args(path, args, steps_per_iteration=steps_per_iteration, world_size=world_size)
            return path
    except OSError as exc:  # read-only, full, or `runs` is a file
        why = "a file of that name is in the way" if os.path.isfile(root) else exc.strerror
        raise RunError(
            f"cannot make the run folder in {os.path.abspath(root)} ({why}); run from a folder you can "
            "write to"
        ) from None
    raise RunError(f"no free run folder name under {root}/{base}")


def write_args(
    run_dir: Path,
    args: Any,
    resumed: dict | None = None,
    steps_per_iteration: int | None = None,
    world_size: int = 1,
) -> None:
    """args.json: the flags the run is trained with, the script's defaults and the fields its first
    command line gave (together, what it was asked for: its identity to a sweep), its ranks and the
    steps of one iteration of them all, and each resume: when, from which iteration and step, and
    which flags it changed."""
    path = run_dir / "args.json"
    flags = dataclasses.asdict(args)
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
        earlier = read_json(path) or {}
        earlier = earlier if isinstance(earlier, dict) else {}
        record["given"] = earlier.get("given", record["given"])  # what the run was started with
        changed = {
            name: [earlier.get(name), value]
            for name, value in flags.items()
            if name != "resume" and name in earlier and earlier[name] != value
        }
        record["resumes"] = [
            *earlier.get("resumes", []),
            {
                "at": time.strftime("%Y-%m-%d %H:%M:%S"),
                "from_iteration": resumed["iteration"],
                "from_step": resumed["global_step"],
                "changed": changed,
            },
        ]
    write_json(path, record)


def write_atomically(path: Path, data: bytes | memoryview) -> None:
    """Writes data so that a reader sees the old file or the new one, never a part: a temp file
    beside it, flushed to disk, renamed over it. On failure the temp file is removed and path is as
    it was (OSError raised)."""
    tmp = path.with_name(f"{path.name}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise


def write_json(path: Path, data: dict[str, Any]) -> None:
    write_atomically(Path(path), (json.dumps(data, indent=1, default=str) + "\n").encode())


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON file's contents if they are an object, else None (missing, unreadable, or another kind
    of value)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


# ----------------------------------------------------------------------------------------------
# checkpoints
def save_checkpoint(path: Path | str, state: dict) -> None:
    """Writes state atomically (write_atomically); RunError in one line if it cannot (a full disk,
    something that does not pickle, NaN/Inf in a tensor), the previous file then unchanged."""
    path = Path(path)
    if not all(torch.isfinite(t).all() for t in _tensors(state) if t.is_floating_point()):
        raise RunError(
            f"{path} was not written: the state holds NaN/Inf values (the previous file is unchanged)"
        )
    buffer = io.BytesIO()
    try:
        torch.save(state, buffer)
        write_atomically(path, buffer.getbuffer())
    except OSError as exc:
        reason = (
            "no space left on device"
            if exc.errno == errno.ENOSPC
            else f"{type(exc).__name__}: {exc.strerror}"
        )
        raise RunError(
            f"could not write {path} ({reason}); the previous file, if any, is unchanged"
        ) from None
    except Exception as exc:  # noqa: BLE001 - something in the state does not pickle
        raise RunError(f"could not write {path} ({exc}); the previous file, if any, is unchanged") from None


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    return [t for item in value for t in _tensors(item)] if isinstance(value, (list, tuple)) else []


def load_checkpoint(path: str, flag_name: str, script: str) -> dict:
    """A checkpoint that `script` wrote, read with weights_only=True (loading never runs code);
    FlagError naming the flag for a missing, unreadable, foreign or damaged file."""
    if not os.path.isfile(path):
        raise FlagError(f"{flag_name} {path}: no such file")
    with open(path, "rb") as f:
        if f.read(4) != b"PK\x03\x04":  # torch.save writes zip archives
            raise FlagError(f"{flag_name} {path}: not a checkpoint (not a file that torch.save wrote)")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - truncated, corrupted or foreign files all get the same clear error
        reason = (
            "it holds objects no checkpoint of this project holds, and they were not loaded: only "
            "resume what "
            "you wrote"
            if "Weights only load failed" in str(exc)
            else "it is cut short or damaged"
        )
        raise FlagError(f"{flag_name} {path}: not a readable checkpoint ({reason})") from None
    written_by = checkpoint.get("script") if isinstance(checkpoint, dict) else None
    if written_by != script:
        what = (
            f"was written by {written_by}"
            if isinstance(written_by, str)
            else "is not a checkpoint of this project"
        )
        raise FlagError(f"{flag_name} {path} {what}; {script} reads only its own checkpoints")
    missing = [name for name in ("args", "model") if name not in checkpoint]
    if missing:
        raise FlagError(
            f"{flag_name} {path} holds no {' and no '.join(missing)}: not a whole checkpoint of {script} "
            "(an older version, or a file edited since)"
        )
    wrong = [
        name for name, ok in FIELDS.items() if name in checkpoint and not ok(checkpoint[name], checkpoint)
    ]
    if wrong:
        raise FlagError(
            f"{flag_name} {path} holds a {' and a '.join(wrong)} no run of {script} writes: a file edited "
            "since, or damaged"
        )
    return checkpoint


def rng_state(value: Any) -> bool:
    """A random generator's state: numpy's bit_generator.state, or torch's get_state()."""
    if isinstance(value, torch.Tensor):
        return value.dtype == torch.uint8
    return isinstance(value, dict) and isinstance(value.get("bit_generator"), str) and "state" in value


def _each_rank(ok: Any) -> Any:
    """A field holding one value per rank, each `ok`."""
    world_size = FIELDS["world_size"]
    size = lambda c: c.get("world_size", 1)  # noqa: E731
    return lambda v, c: (
        isinstance(v, list) and all(ok(s) for s in v) and (len(v) == size(c) or not world_size(size(c), c))
    )


# What each field of a checkpoint may hold: (value, the whole checkpoint) -> ok
FIELDS: dict[str, Any] = {
    "args": lambda v, c: isinstance(v, dict),
    "model": lambda v, c: isinstance(v, dict),
    "world_size": lambda v, c: type(v) is int and v >= 1,
    "iteration": lambda v, c: type(v) is int and v >= 0,
    "global_step": lambda v, c: type(v) is int and v >= 0,
    "recent_returns": lambda v, c: isinstance(v, list) and all(isinstance(r, (int, float)) for r in v),
}
FIELDS["rng"] = _each_rank(rng_state)
FIELDS["env_states"] = _each_rank(lambda s: s is None or isinstance(s, (dict, bytes)))  # bytes: pickled


def load_state(obj: Any, state: Any, flag_name: str, path: str) -> None:
    """obj.load_state_dict(state), a mismatch as one FlagError naming the flag (for a model, the
    first tensor that differs and both shapes: a checkpoint of another env, or of other sizes)."""
    if isinstance(obj, torch.nn.Module) and isinstance(state, dict):
        own = obj.state_dict()
        for name in [*own, *state]:
            if name not in own or name not in state:
                where = "this run's model has" if name in own else "the checkpoint has"
                raise FlagError(
                    f"{flag_name} {path} does not fit this run's model: {where} {name}, the other not"
                )
            if tuple(own[name].shape) != tuple(state[name].shape):
                raise FlagError(
                    f"{flag_name} {path} does not fit this run's model: {name} has shape "
                    f"{tuple(state[name].shape)} there, {tuple(own[name].shape)} here (another env, or "
                    "other sizes?)"
                )
    try:
        obj.load_state_dict(state)
    except (RuntimeError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise FlagError(
            f"{flag_name} {path} does not fit this run's {type(obj).__name__} ({one_line(exc)})"
        ) from None


def one_line(exc: BaseException, limit: int = 200) -> str:
    """The first line of an exception's message (its type's name if it has none), at most `limit`
    characters."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:limit]


# ---------------------------------------------------------------------------------- what a run says
# as it runs
class Progress:
    """SPS, the progress line (at most every `every` seconds, and at the last step), and the figures
    of a summary, over every segment of a resumed run (`earlier`: its summary.json)."""

    def __init__(
        self,
        last_step: int,
        first_step: int = 0,
        speaks: bool = True,
        recent: list | None = None,
        earlier: dict | None = None,
        every: float = 2.0,
    ):
        self.last_step, self.first_step, self.global_step, self.speaks = (
            last_step,
            first_step,
            first_step,
            speaks,
        )
        self.recent_returns = collections.deque(recent or [], maxlen=20)
        self.start = self.last_print = time.time()
        # a summary edited by hand
        earlier = {k: v for k, v in (earlier or {}).items() if type(v) in (int, float)}
        self.every, self.earlier_seconds = every, earlier.get("seconds", 0.0)
        self.segments = earlier.get("segments", 1) + 1 if "seconds" in earlier else 1
        self.logged = False

    def sps(self, global_step: int) -> int:
        return int((global_step - self.first_step) / max(time.time() - self.start, 1e-9))

    def mean_return(self) -> float | None:
        return sum(self.recent_returns) / len(self.recent_returns) if self.recent_returns else None

    def line(self, global_step: int, timings: dict[str, float]) -> str:
        sps, mean = self.sps(global_step), self.mean_return()
        split = ", ".join(f"{name} {seconds:.2f}s" for name, seconds in timings.items())
        eta = hms((self.last_step - global_step) / max(sps, 1))
        return (
            f"global_step={global_step}/{self.last_step} SPS={sps} episodic_return="
            f"{'n/a' if mean is None else f'{mean:.1f}'} (last {len(self.recent_returns)}) elapsed="
            f"{hms(time.time() - self.start)} ETA={eta} [{split}]"
        )

    def log(
        self, writer: Any, global_step: int, episodes: list, restarts: int, timings: dict[str, float]
    ) -> None:
        """charts/episodic_return and charts/episodic_length of each episode, charts/SPS,
        perf/{part}_seconds, charts/worker_restarts; the progress line."""
        self.global_step = global_step
        for step, episodic_return, episodic_length in episodes:
            self.recent_returns.append(float(episodic_return))
            writer.add_scalar("charts/episodic_return", episodic_return, step)
            writer.add_scalar("charts/episodic_length", episodic_length, step)
        writer.add_scalar("charts/SPS", self.sps(global_step), global_step)
        for name, seconds in timings.items():
            writer.add_scalar(f"perf/{name}_seconds", seconds, global_step)
        writer.add_scalar("charts/worker_restarts", restarts, global_step)
        first, self.logged = not self.logged, True  # the first iteration's line says the run trains
        if self.speaks and (
            first or time.time() - self.last_print >= self.every or global_step >= self.last_step
        ):
            self.last_print = time.time()
            print(self.line(global_step, timings), flush=True)

    def figures(self) -> dict[str, Any]:
        seconds = self.earlier_seconds + time.time() - self.start
        # the steps of the time counted
        done = self.global_step - (0 if self.earlier_seconds else self.first_step)
        return {
            "global_step": self.global_step,
            "last_step": self.last_step,
            "seconds": round(seconds, 1),
            "sps": int(done / max(seconds, 1e-9)),
            "segments": self.segments,
            "episodic_return_last_20": self.mean_return(),
            "episodes_in_that_mean": len(self.recent_returns),
        }


def hms(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class NoWriter:
    """What ranks other than 0 log to: nothing."""

    def add_scalar(self, *args: Any, **kwargs: Any) -> None:
        pass

    def close(self) -> None:
        pass


def open_writer(run_dir: Path, args: Any, first_step: int) -> Any:
    """TensorBoard's writer with the hyperparameters (mirrored to wandb with --track); a resumed
    run's curves go on from `first_step`, without what its stopped part logged after its
    checkpoint."""
    if args.track:
        import wandb

        wandb.init(
            project=args.wandb_project_name,
            entity=args.wandb_entity,
            sync_tensorboard=True,
            config=dataclasses.asdict(args),
            name=run_dir.name,
            monitor_gym=True,
            save_code=True,
        )
    from torch.utils.tensorboard import SummaryWriter

    # max_queue: with the default of 10 pending events, add_scalar waits for the writer thread
    # whenever it fills
    writer = SummaryWriter(str(run_dir), max_queue=1000, purge_step=first_step + 1 if args.resume else None)
    table = "\n".join(f"|{key}|{value}|" for key, value in vars(args).items())
    writer.add_text("hyperparameters", f"|param|value|\n|-|-|\n{table}")
    return writer
