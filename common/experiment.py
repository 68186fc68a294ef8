"""Run plumbing both scripts share: flag checks, the run folder and its writer, start-up and progress lines, one stop
path for SIGINT and SIGTERM, checkpoint files, and evaluation episodes. No hyperparameters and no RL math live here.

    def main(args):
        check_args(args)                                      # FlagError: exit status 2, nothing started
        run_dir = make_run_dir(args)                          # runs/<env>__<exp_name>__<seed>__<time>
        with SubprocVecEnv(...) as envs, open_writer(run_dir, args) as writer, on_stop(save):
            ...                                               # Stopped: save() runs, then writer and envs close

    if __name__ == "__main__":
        run(main, Args, __doc__)

Exit statuses of `run`: 0 done; 1 a failure during the run (one message, no traceback); 2 a bad flag, before
anything started; 128 + signal (130 SIGINT, 143 SIGTERM) when stopped, after saving. Anything else is a bug, and
keeps its traceback.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
import torch.distributed
from gymnasium.wrappers.utils import RunningMeanStd

from common import layout_choice
from common.multiprocessing_env import WorkerError, check_layout

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class FlagError(ValueError):
    """A flag the user must change, in one line that names it: exit status 2."""


class RunError(RuntimeError):
    """A failure during the run that one line explains (unwritable disk, NaN weights, ...): exit status 1."""


class Finished(Exception):
    """Nothing left to do (a resumed run that had already finished): this message, exit status 0."""


class Stopped(KeyboardInterrupt):
    """SIGINT or SIGTERM arrived (`signum` says which), raised wherever the main thread was."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def flag(name: str) -> str:
    """The command-line spelling of an Args field: num_envs -> --num-envs."""
    return "--" + name.replace("_", "-")


def check_flags(args: Any, rules: list[tuple[str, bool, str]]) -> None:
    """FlagError for the first float flag that is NaN or infinite, then for the first flag that breaks a rule: the
    rules of SHARED_FLAGS for the fields args has, then the script's own (field, ok, allowed) rules."""
    for field in dataclasses.fields(args):
        value = getattr(args, field.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise FlagError(f"{flag(field.name)} must be a finite number, got {value}")
    shared = [(name, test(getattr(args, name)), allowed) for name, test, allowed in SHARED_FLAGS if hasattr(args, name)]
    for name, ok, allowed in shared + rules:
        if not ok:
            raise FlagError(f"{flag(name)} must be {allowed}, got {getattr(args, name)}")
    if hasattr(args, "num_workers"):
        try:
            check_layout(args.num_workers, args.step_timeout, args.max_restarts, spell=flag)
        except ValueError as exc:
            raise FlagError(str(exc)) from None


def plain_name(name: str) -> bool:
    """True for a name that stays one folder inside runs/: not empty, no path separator, not '.' or '..'."""
    separators = {"/", "\0", os.sep} | ({os.altsep} if os.altsep else set())
    return name not in ("", ".", "..") and not any(s in name for s in separators)


# The flags both scripts have, and the values they allow: (field, test of its value, what is allowed).
SHARED_FLAGS: list[tuple[str, Callable[[Any], bool], str]] = [
    ("exp_name", plain_name, "a plain name (no '/', not '.' or '..')"),
    ("seed", lambda v: v >= 0, ">= 0"),
    ("num_steps", lambda v: v >= 1, ">= 1"),
    ("num_minibatches", lambda v: v >= 1, ">= 1"),
    ("update_epochs", lambda v: v >= 1, ">= 1"),
    ("total_timesteps", lambda v: v >= 1, ">= 1"),
    ("learning_rate", lambda v: v > 0, "> 0"),
    ("gamma", lambda v: 0 < v <= 1, "in (0, 1]"),
    ("gae_lambda", lambda v: 0 <= v <= 1, "in [0, 1]"),
    ("clip_coef", lambda v: v > 0, "> 0"),
    ("max_grad_norm", lambda v: v > 0, "> 0"),
    ("target_kl", lambda v: v is None or v > 0, "> 0 (or unset)"),
    ("eval_episodes", lambda v: v >= 0, ">= 0"),
    ("checkpoint_interval", lambda v: v >= 0, ">= 0 (0: only when stopped)"),
    ("num_workers", lambda v: v is None or v >= 0, ">= 0 (0: the envs step in the trainer) or unset"),
    ("max_restarts", lambda v: v >= 0, ">= 0"),
    ("step_timeout", lambda v: v is None or 0 < v <= 604800, "in (0, 604800] seconds, a week (or unset: no limit)"),
]


def check_installed(args: Any, needs: dict[str, tuple[str, str]]) -> None:
    """FlagError for a flag that is on while the module it needs is missing: needs = {field: (module, extra)}."""
    import importlib.util

    for name, (module, extra) in needs.items():
        if getattr(args, name) and importlib.util.find_spec(module) is None:
            raise FlagError(f"{flag(name)} needs {module}, which is not installed: pip install -e '.[{extra}]'")


def check_env_id(env_id: str) -> None:
    """Imports the module of a module:EnvId id and checks the id is registered (naming close matches if not);
    FlagError naming --env-id if not."""
    import difflib
    import importlib

    import ale_py

    gym.register_envs(ale_py)  # Atari ids are known, so a script can say which one they are for
    ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)  # no banner on every Atari env built
    module, _, name = env_id.rpartition(":")
    try:
        if module:
            importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - the user's module: say what went wrong in it, in one line
        hint = ""
        if isinstance(exc, ModuleNotFoundError) and exc.name == module.split(".")[0]:
            hint = (f"; {module} must be importable from here: run from the folder that holds it, add that folder to "
                    "PYTHONPATH, or pip install its package")  # fmt: skip
        raise FlagError(f"--env-id {env_id}: importing {module} failed ({type(exc).__name__}: {exc}){hint}") from None
    if name not in gym.registry:
        close = difflib.get_close_matches(name, list(gym.registry), n=3)
        hint = f"; did you mean {' or '.join(close)}?" if close else ""
        raise FlagError(f"--env-id {env_id!r} is not a registered gymnasium env{hint}")


def probe_env(env_id: str, make: Callable[[], gym.Env], bound: float) -> dict[str, Any]:
    """Builds the env (`make()`, as the script would) once in a probe process: no env code runs here, the build is
    bounded by `bound` seconds, and whatever the env starts ends with the probe. Returns what the probe found: its
    "spaces", and "raw_spaces", the unwrapped env's (common/layout_choice.py); FlagError naming --env-id if it fails."""
    try:
        return layout_choice.probe(make, bound, None, steps=False)
    except layout_choice.ProbeFailed as exc:  # a missing extra (box2d, mujoco), a broken env, a wrapper refusing it
        raise FlagError(f"--env-id {env_id} cannot be built here: {exc.summary}") from None
    except TimeoutError:
        raise FlagError(f"--env-id {env_id}: building the env did not finish within {bound:g} s") from None


def given_flags() -> set[str]:
    """The flags given on the command line, as spelled there (--norm-obs), whatever their values."""
    return {arg.split("=", 1)[0] for arg in sys.argv[1:] if arg.startswith("--")}


def make_run_dir(args: Any, root: str = "runs") -> Path:
    """Creates runs/{env_id}__{exp_name}__{seed}__{unix time}, with -2, -3, ... appended if that exists already."""
    base = f"{args.env_id.replace('/', '-').replace(':', '-')}__{args.exp_name}__{args.seed}__{int(time.time())}"
    Path(root).mkdir(exist_ok=True)
    for k in range(1, 1_000_000):
        path = Path(root) / (base if k == 1 else f"{base}-{k}")
        with contextlib.suppress(FileExistsError):
            path.mkdir()  # atomic: two runs starting in the same second never share a folder
            return path
    raise RunError(f"no free run folder name under {root}/{base}")


def vec_env_options(args: Any, cores: int | None = None) -> dict[str, Any]:
    """SubprocVecEnv's keyword arguments from the flags both scripts share; `cores`: the worker processes to use
    when --num-workers is unset (None: let SubprocVecEnv measure and choose)."""
    num_workers = args.num_workers if args.num_workers is not None else cores
    return {"num_workers": num_workers, "max_restarts": args.max_restarts, "step_timeout": args.step_timeout}


class _NoWriter:
    """What ranks other than 0 log to: nothing."""

    def add_scalar(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __enter__(self) -> _NoWriter:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        pass


def open_writer(run_dir: Path | None, args: Any, purge_step: int | None = None) -> Any:
    """TensorBoard writer for run_dir with the hyperparameter table (mirrored to wandb with --track); a writer of
    nothing for run_dir None (ranks other than 0). A resumed run passes purge_step, its first step, so that its curve
    continues without the points logged after its checkpoint."""
    if run_dir is None:
        return _NoWriter()
    if args.track:
        import wandb

        config = dataclasses.asdict(args)
        wandb.init(project=args.wandb_project_name, entity=args.wandb_entity, sync_tensorboard=True, config=config,
                   name=run_dir.name, monitor_gym=True, save_code=True)  # fmt: skip
    from torch.utils.tensorboard import SummaryWriter

    # max_queue: with the default of 10 pending events, add_scalar waits for the writer thread whenever it fills
    writer = SummaryWriter(str(run_dir), max_queue=1000, purge_step=purge_step)
    table = "\n".join(f"|{key}|{value}|" for key, value in vars(args).items())
    writer.add_text("hyperparameters", f"|param|value|\n|-|-|\n{table}")
    return writer


def announce(what: str, run_dir: Path) -> None:
    """The start-up line: what runs where, and where its results go."""
    print(f"{what}; results in {run_dir} (view with: tensorboard --logdir {run_dir.parent})", flush=True)


def hms(seconds: float) -> str:
    """Seconds as h:mm:ss."""
    seconds = int(max(seconds, 0))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class Progress:
    """Steps per second since the first step, and the console progress line (at most every `every` seconds)."""

    def __init__(self, total_steps: int, first_step: int = 0, every: float = 2.0, speaks: bool = True):
        self.total_steps, self.first_step, self.every, self.speaks = total_steps, first_step, every, speaks
        self.recent_returns = collections.deque(maxlen=20)
        self.start = self.last_print = time.time()

    def sps(self, global_step: int) -> int:
        """Env steps per second since the first step of this process."""
        return int((global_step - self.first_step) / max(time.time() - self.start, 1e-9))

    def line(self, global_step: int, returns: list[float], timings: dict[str, float]) -> str:
        """global_step, SPS, mean recent return, elapsed time and ETA (h:mm:ss), where the iteration's time went."""
        sps = self.sps(global_step)
        mean_return = f"{sum(returns) / len(returns):.1f}" if returns else "n/a"
        eta = (self.total_steps - global_step) / max(sps, 1)
        split = ", ".join(f"{name} {seconds:.2f}s" for name, seconds in timings.items())
        return (
            f"global_step={global_step}/{self.total_steps} SPS={sps} episodic_return={mean_return} "
            f"(last {len(returns)}) elapsed={hms(time.time() - self.start)} ETA={hms(eta)} [{split}]"
        )

    def log(self, writer: Any, global_step: int, episodes: list, timings: dict[str, float], restarts: int) -> None:
        """Logs charts/episodic_return and charts/episodic_length of each finished episode (global step, return,
        length), charts/SPS, perf/{part}_seconds and charts/worker_restarts (every rank's), and prints the progress
        line (mean of the last 20 returns) if `every` seconds have passed since the last one, or at the last step."""
        for step, episodic_return, episodic_length in episodes:
            self.recent_returns.append(episodic_return)
            writer.add_scalar("charts/episodic_return", episodic_return, step)
            writer.add_scalar("charts/episodic_length", episodic_length, step)
        writer.add_scalar("charts/SPS", self.sps(global_step), global_step)
        for name, seconds in timings.items():
            writer.add_scalar(f"perf/{name}_seconds", seconds, global_step)
        writer.add_scalar("charts/worker_restarts", restarts, global_step)
        if self.speaks and (time.time() - self.last_print >= self.every or global_step >= self.total_steps):
            self.last_print = time.time()
            print(self.line(global_step, list(self.recent_returns), timings), flush=True)


@contextlib.contextmanager
def process_group(backend: str, enabled: bool) -> Iterator[None]:
    """torch.distributed's process group for the block (rank and world size from torchrun's variables), if enabled."""
    if not enabled:
        yield
        return
    torch.distributed.init_process_group(backend=backend)
    try:
        yield
    finally:
        torch.distributed.destroy_process_group()


def all_ranks(obj: Any) -> list:
    """obj from every rank, in rank order (a list of one without a process group)."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return [obj]
    gathered = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(gathered, obj)
    return gathered


def mean_over_ranks(tensor: torch.Tensor) -> torch.Tensor:
    """The mean of `tensor` over all ranks (itself without a process group): what every rank must decide on alike."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return tensor
    total = tensor.detach().clone()
    torch.distributed.all_reduce(total)
    return total / torch.distributed.get_world_size()


def mean_losses(stats: dict[str, list[torch.Tensor]]) -> dict[str, float]:
    """{name: mean over the update's minibatches and over ranks} from {name: one value per minibatch}."""
    means = mean_over_ranks(torch.stack([torch.stack(values).mean() for values in stats.values()]))
    return dict(zip(stats, means.tolist(), strict=True))


@contextlib.contextmanager
def on_stop(save: Callable[[], Path] | None) -> Iterator[None]:
    """Calls save() when the block is left by Stopped (SIGINT/SIGTERM) and says where it saved, then lets Stopped go
    on: the one place a stopped run saves. save() must not wait on env workers: they may be why the user stopped."""
    try:
        yield
    except Stopped:
        try:
            if save is not None:
                path = save()
                print(f"checkpoint saved to {path}; continue with --resume {path}", file=sys.stderr, flush=True)
        except RunError as exc:
            print(f"{Path(sys.argv[0]).name}: error: {exc}", file=sys.stderr, flush=True)
        raise


def _stop(signum: int, frame: Any) -> None:
    signal.signal(signum, signal.SIG_DFL)  # a second one ends the process at once
    raise Stopped(signum)


def run(main: Callable[[Any], None], args_type: type, doc: str) -> None:
    """Parses args_type from the command line (--help opens with the first two paragraphs of `doc`: description and
    commands), runs main(args) with SIGINT and SIGTERM raising Stopped, and exits with the status the outcome calls
    for. Under torchrun every rank exits so; rank 0 alone prints."""
    import tyro

    script = Path(sys.argv[0]).name
    speaks = int(os.environ.get("RANK", "0")) == 0

    def fail(status: int, message: str) -> None:
        if speaks:
            print(f"{script}: {message}", file=sys.stderr, flush=True)
        sys.exit(status)

    for signum in _STOP_SIGNALS:
        signal.signal(signum, _stop)
    try:
        main(tyro.cli(args_type, description="\n\n".join(doc.split("\n\n")[:2])))
    except Finished as exc:
        if speaks:
            print(f"{script}: {exc}", flush=True)
    except FlagError as exc:
        fail(2, f"error: {exc}")
    except Stopped as exc:
        fail(128 + exc.signum, f"stopped by {exc}")
    except (RunError, WorkerError, TimeoutError, FloatingPointError) as exc:
        fail(1, f"error: {exc}")
    sys.exit(0)


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM wait until the block is done (in the main thread), so a stop cannot cut a write short."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def save_checkpoint(path: Path | str, state: dict) -> None:
    """Writes state to path atomically: a temp file, flushed to disk, then renamed over path. On failure the temp
    file is removed, path keeps its previous contents, and RunError says why. Refuses non-finite tensors."""
    path = Path(path)
    tensors = [t for t in _tensors(state) if t.is_floating_point()]
    if not all(torch.isfinite(t).all() for t in tensors):
        raise RunError(f"{path} was not written: the state holds NaN/Inf values (the previous file is unchanged)")
    tmp = path.with_name(f"{path.name}.tmp")
    with _signals_held():
        try:
            with open(tmp, "wb") as f:
                torch.save(state, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except Exception as exc:  # noqa: BLE001 - a full disk reaches us as OSError or as torch's RuntimeError
            tmp.unlink(missing_ok=True)
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise RunError(f"could not write {path} ({reason}); the previous file, if any, is unchanged") from None


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)


def load_checkpoint(path: str, flag_name: str, script: str) -> dict:
    """A checkpoint that `script` wrote, read with weights_only=True (loading never runs code); FlagError naming
    the flag for a missing, unreadable or foreign file."""
    if not os.path.isfile(path):
        raise FlagError(f"{flag_name} {path}: no such file")
    with open(path, "rb") as f:
        if f.read(4) != b"PK\x03\x04":  # torch.save writes zip archives
            raise FlagError(f"{flag_name} {path}: not a checkpoint (not a file that torch.save wrote)")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - truncated, corrupted or foreign files all get the same clear error
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise FlagError(f"{flag_name} {path}: not a readable checkpoint ({reason})") from None
    written_by = checkpoint.get("script") if isinstance(checkpoint, dict) else None
    if written_by != script:
        what = f"was written by {written_by}" if isinstance(written_by, str) else "is not a checkpoint of this project"
        raise FlagError(f"{flag_name} {path} {what}; {script} reads only its own checkpoints")
    return checkpoint


def load_resume(path: str, script: str, same: dict[str, Any], num_iterations: int) -> dict:
    """The checkpoint to resume from: FlagError unless it was written with the same values of `same` (sizes a
    resumed run cannot change; "world_size" is the number of ranks); Finished if its run has no iterations left."""
    checkpoint = load_checkpoint(path, "--resume", script)
    for name, value in same.items():
        saved = checkpoint["world_size"] if name == "world_size" else checkpoint["args"].get(name)
        if saved != value:
            spelled = "the number of ranks (world size)" if name == "world_size" else flag(name)
            raise FlagError(f"--resume {path} was written with {spelled} {saved}; resume it with {saved}, not {value}")
    if checkpoint["iteration"] >= num_iterations:
        raise Finished(f"--resume {path}: that run finished its {num_iterations} iterations already; nothing to do "
                       "(a larger --total-timesteps continues it)")  # fmt: skip
    return checkpoint


class Checkpoints:
    """What a run's checkpoints hold, and resuming from one. A checkpoint is a dict: script, args, world_size,
    iteration (the number done), global_step, the state dict of each of `modules`, rng (one state per rank, None
    where unknown) and whatever extras the script adds."""

    def __init__(self, script: str, args: Any, modules: dict[str, Any], steps_per_iteration: int, world_size: int = 1):
        self.script, self.args, self.modules = script, args, modules
        self.steps_per_iteration, self.world_size = steps_per_iteration, world_size

    def save(self, path: Path | str, done: int, rng: np.random.Generator | list, **extras: Any) -> Path | str:
        """Writes the checkpoint after `done` iterations to path (atomically) and returns path. rng: this process's
        generator, or every rank's generator state (None where unknown)."""
        state = {"script": self.script, "args": dataclasses.asdict(self.args), "world_size": self.world_size,
                 "iteration": done, "global_step": done * self.steps_per_iteration, **extras,
                 "rng": [rng.bit_generator.state] if isinstance(rng, np.random.Generator) else rng}  # fmt: skip
        save_checkpoint(path, state | {name: module.state_dict() for name, module in self.modules.items()})
        return path

    def resume(self, path: str, same: dict[str, Any], num_iterations: int) -> dict:
        """Loads checkpoint `path` into the modules and returns it (for rng and extras); FlagError unless it was
        written with the same values of `same` and world size, Finished if its run has no iterations left."""
        checkpoint = load_resume(path, self.script, same | {"world_size": self.world_size}, num_iterations)
        for name, module in self.modules.items():
            if name not in checkpoint:
                raise FlagError(f"--resume {path} holds no {name} (an older version of {self.script} wrote it)")
            load_state(module, checkpoint[name], "--resume", path)
        return checkpoint


def saved_args(checkpoint: dict, args_type: type, **changes: Any) -> Any:
    """The Args a checkpoint was written with (flags this version no longer has are dropped), with `changes`."""
    fields = {f.name for f in dataclasses.fields(args_type)}
    return args_type(**{k: v for k, v in checkpoint["args"].items() if k in fields} | changes)


def load_state(module: Any, state: dict, flag_name: str, path: str) -> None:
    """module.load_state_dict(state), with a mismatch (another env, other sizes) as one FlagError naming the flag."""
    try:
        module.load_state_dict(state)
    except (RuntimeError, ValueError, KeyError) as exc:
        reason = str(exc).strip().splitlines()[0][:200]
        raise FlagError(f"{flag_name} {path} does not fit this run's model ({reason})") from None


def check_finite(losses: dict[str, float], module: torch.nn.Module, where: str) -> None:
    """RunError unless every loss and every weight of module is finite (where: which iteration, for the message)."""
    if not (np.isfinite(list(losses.values())).all() and all(p.isfinite().all() for p in module.parameters())):
        raise RunError(f"{where}: the loss or the weights became NaN/Inf; look for NaN/Inf in observations or "
                       "rewards, or lower --learning-rate")  # fmt: skip


def get_env_stats(envs: Any, names: list[str]) -> dict[str, list]:
    """Each env's running statistics (wrapper attributes holding a RunningMeanStd or an array) as tensors, for a
    checkpoint: {name: [one per env]}."""

    def tensors(value):
        return rms_state(value) if isinstance(value, RunningMeanStd) else torch.as_tensor(value)

    return {name: [tensors(value) for value in envs.get_attr(name)] for name in names}


def rms_state(rms: RunningMeanStd) -> dict:
    """A RunningMeanStd as a checkpoint holds it (merge_rms([state]) gives it back, exactly)."""
    return {"mean": torch.as_tensor(rms.mean), "var": torch.as_tensor(rms.var), "count": rms.count}


def set_env_stats(envs: Any, stats: dict[str, list]) -> None:
    """Gives each env back the statistics get_env_stats read from it (dtypes included, so a resumed run is exact)."""
    for name, values in stats.items():
        envs.set_attr(name, [merge_rms([v]) if isinstance(v, dict) else v.numpy() for v in values])


def merge_rms(stats: list[dict]) -> RunningMeanStd:
    """One RunningMeanStd from several envs' statistics, as get_env_stats wrote them (parallel-variance merge)."""
    counts = np.array([s["count"] for s in stats], dtype=np.float64)
    means, variances = np.stack([s["mean"].numpy() for s in stats]), np.stack([s["var"].numpy() for s in stats])
    weights = (counts / counts.sum()).reshape((-1,) + (1,) * (means.ndim - 1))
    merged = RunningMeanStd(shape=means.shape[1:])
    merged.mean = (weights * means).sum(0).astype(means.dtype)
    merged.var = (weights * (variances + (means - merged.mean) ** 2)).sum(0).astype(variances.dtype)
    merged.count = float(counts.sum())
    return merged


def evaluate(env: gym.Env, act: Callable[[Any], Any], episodes: int, seed: int, writer: Any = None) -> list[float]:
    """Raw returns of `episodes` whole episodes on one env (as RecordEpisodeStatistics reports them), acting with
    act(obs), also logged as eval/episodic_return if a writer is given; closes the env."""
    returns = []
    obs, _ = env.reset(seed=seed)
    while len(returns) < episodes:
        obs, _, terminated, truncated, info = env.step(act(obs))
        if terminated or truncated:
            if "episode" in info:  # absent when only a life ended (Atari): the game goes on
                returns.append(float(info["episode"]["r"]))
            obs, _ = env.reset()
    with contextlib.suppress(Exception):
        env.close()
    if writer is not None:
        for idx, episodic_return in enumerate(returns):
            writer.add_scalar("eval/episodic_return", episodic_return, idx)
    return returns
