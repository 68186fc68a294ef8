"""Run plumbing both scripts share: flag checks, the run folder and its writer, start-up and progress lines, the
one way a run ends (saving on a stop or an env failure, then its summary, curve and closing line), and the ranks.
No hyperparameters and no RL math live here; checkpoint files are in common/checkpointing.py, the run folder's other
files in common/results.py.

    def main(args):
        check_args(args)                                      # FlagError: exit status 2, nothing started
        run_dir = make_run_dir(args)                          # runs/<env>__<exp_name>__<seed>__<time>, args.json
        with SubprocVecEnv(...) as envs, ending(...) as run, open_writer(run_dir, args) as writer:
            ...                                               # run.snapshot() each iteration, run.save() to save
                                                              # Stopped: the snapshot saved, writer and envs closed
    if __name__ == "__main__":
        run(main, Args, __doc__)

Exit statuses of `run`: 0 done; 1 a failure during the run (one message, no traceback; every failing rank says its
own); 2 a bad flag, before anything started; 128 + signal (130 SIGINT, 143 SIGTERM) when stopped, after saving.
Anything else is a bug, and keeps its traceback. Every run that started training ends with one closing line: how it
ended, steps, wall time, SPS, last-20 return, and where its results are.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import fcntl
import itertools
import math
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
import torch.distributed

from common import guardian, layout_choice, results, stops
from common.multiprocessing_env import WorkerError, check_layout
from common.stops import Stopped


class FlagError(ValueError):
    """A flag the user must change, in one line that names it: exit status 2."""


class RunError(RuntimeError):
    """A failure during the run that one line explains (unwritable disk, NaN weights, ...): exit status 1."""


class Finished(Exception):
    """Nothing left to do (a resumed run that had already finished): this message, exit status 0."""


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
    check_installed(args, {"capture_video": "moviepy", "track": "wandb"})
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
    ("exp_name", lambda v: len(v.encode()) <= 200, "at most 200 bytes (it names a folder with the env id and seed)"),
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


def given_fields(args_type: type, argv: list[str] | None = None) -> set[str]:
    """The fields of args_type whose flags the command line gives (--norm-obs and --no-norm-obs both give norm_obs)."""
    spelled = {flag(f.name): f.name for f in dataclasses.fields(args_type)}
    spelled |= {"--no-" + name[2:]: field for name, field in spelled.items()}
    return {spelled[word.split("=", 1)[0]] for word in (sys.argv[1:] if argv is None else argv) if
            word.split("=", 1)[0] in spelled}  # fmt: skip


def check_bool_values(args_type: type, argv: list[str]) -> None:
    """FlagError for a bool flag given a value (`--capture-video True`, CleanRL's old spelling): bool flags are
    switches here, `--flag` or `--no-flag`."""
    switches = {flag(f.name) for f in dataclasses.fields(args_type) if f.type in (bool, "bool")}
    for given, value in itertools.zip_longest(argv, argv[1:], fillvalue=""):  # each word with the one after it
        name = given.split("=", 1)[0]
        if name in switches and ("=" in given or value.lower() in ("true", "false", "1", "0", "yes", "no")):
            value = given.split("=", 1)[1] if "=" in given else value
            off = "--no-" + name[2:]
            raise FlagError(f"{name} is a switch and takes no value (got {value!r}): write {name} to turn it on, "
                            f"{off} to turn it off")  # fmt: skip


def check_installed(args: Any, needs: dict[str, str]) -> None:
    """FlagError for a flag that is on while the package it needs is missing: needs = {field: package}."""
    import importlib.util

    for name, package in needs.items():
        if getattr(args, name, False) and importlib.util.find_spec(package) is None:
            raise FlagError(f"{flag(name)} needs {package}, which is not installed: pip install {package}")


def check_env_id(env_id: str) -> None:
    """Imports the module of a module:EnvId id and checks the id is registered (naming close matches if not);
    FlagError naming --env-id if not."""
    import difflib
    import importlib

    import ale_py

    gym.register_envs(ale_py)  # Atari ids are known, so a script can say which one they are for
    ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)  # no banner on every Atari env built
    module, _, name = env_id.rpartition(":")
    if module and os.getcwd() not in sys.path:  # the working directory too, as `python -m` would: a module beside you
        sys.path.insert(1, os.getcwd())  # (sys.path[0] is the script's folder; workers and the probe get this path)
    try:
        if module:
            importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - the user's module: say what went wrong in it, in one line
        hint = ""
        if isinstance(exc, ModuleNotFoundError) and exc.name == module.split(".")[0]:
            hint = (f"; it is looked for in {os.getcwd()}, in the script's folder and on PYTHONPATH: run from the "
                    "folder that holds it, add that folder to PYTHONPATH, or pip install its package")  # fmt: skip
        raise FlagError(f"--env-id {env_id}: importing {module} failed ({type(exc).__name__}: {exc}){hint}") from None
    if name not in gym.registry:
        close = difflib.get_close_matches(name, list(gym.registry), n=3)
        hint = f"; did you mean {' or '.join(close)}?" if close else ""
        raise FlagError(f"--env-id {env_id!r} is not a registered gymnasium env{hint}")


def probe_env(env_id: str, make: Callable[[], gym.Env], bound: float) -> dict[str, Any]:
    """check_env_id, then builds the env (`make()`, as the script would) once in a probe process: no env code runs
    here, the build is bounded by `bound` seconds, and whatever the env starts ends with the probe. Returns what the
    probe found: its "spaces", and "raw_spaces", the unwrapped env's (common/layout_choice.py); FlagError naming
    --env-id if it fails."""
    check_env_id(env_id)
    try:
        return layout_choice.probe(make, bound, None, steps=False, interrupt=stops.request, check_api=True)
    except layout_choice.OldApi as exc:
        raise FlagError(f"--env-id {env_id} follows the old gym API ({exc}); the scripts need gymnasium's: "
                        "reset(seed=None, options=None) -> (obs, info), step(action) -> (obs, reward, terminated, "
                        "truncated, info)") from None  # fmt: skip
    except layout_choice.ProbeFailed as exc:  # a missing extra (box2d, mujoco), a broken env, a wrapper refusing it
        raise FlagError(f"--env-id {env_id} cannot be {exc.done} here: {exc.summary}") from None
    except TimeoutError:
        raise FlagError(f"--env-id {env_id}: building the env did not finish within {bound:g} s") from None


def given_flags() -> set[str]:
    """The flags given on the command line, as spelled there (--norm-obs), whatever their values."""
    return {arg.split("=", 1)[0] for arg in sys.argv[1:] if arg.startswith("--")}


def make_run_dir(args: Any, root: str = "runs") -> Path:
    """Creates runs/{env_id}__{exp_name}__{seed}__{unix time}, with -2, -3, ... appended if that exists already, holds
    it (`hold`) and writes the flags into it (args.json); RunError in one line if the folder cannot be made here."""
    base = f"{args.env_id.replace('/', '-').replace(':', '-')}__{args.exp_name}__{args.seed}__{int(time.time())}"
    try:
        Path(root).mkdir(exist_ok=True)
        for k in range(1, 1_000_000):
            path = Path(root) / (base if k == 1 else f"{base}-{k}")
            with contextlib.suppress(FileExistsError):
                path.mkdir()  # atomic: two runs starting in the same second never share a folder
                hold(path)
                write_args(path, args)
                return path
    except OSError as exc:  # read-only, full, or `runs` is a file
        why = "a file of that name is in the way" if os.path.isfile(root) else exc.strerror
        raise RunError(f"cannot make the run folder in {os.path.abspath(root)} ({why}); run from a folder you can "
                       "write to") from None  # fmt: skip
    raise RunError(f"no free run folder name under {root}/{base}")


_held: list[int] = []  # the lock of the run folder this process writes: held until the process ends, however


def hold(run_dir: Path) -> None:
    """Makes this process the one writer of run_dir: an exclusive lock on run_dir/.lock, which the kernel releases
    however the process ends. FlagError naming the process that holds it already (nothing is started)."""
    fd = os.open(run_dir / results.LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise FlagError(f"{run_dir} is being written by process {results.writer(run_dir)}: a run has one writer at "
                        "a time; wait for it to end, or stop it") from None  # fmt: skip
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    _held.append(fd)


def begin(checkpoints: Any, args: Any, same: dict[str, Any], num_iterations: int, is_main: bool = True) -> tuple:
    """A new run, or the one --resume names: (the checkpoint resumed from, its modules loaded, or None; the first
    iteration to do; the run folder, None on ranks other than 0; the Progress counter). `same`: the sizes a resumed
    run cannot change (Checkpoints.resume)."""
    checkpoint = checkpoints.resume(args.resume, same, num_iterations) if args.resume else None
    start_iteration = checkpoint["iteration"] + 1 if checkpoint else 1
    run_dir = run_folder(args, checkpoint) if is_main else None
    earlier = (results.read_json(run_dir / "summary.json") or {}) if checkpoint and run_dir else {}
    steps = checkpoints.steps_per_iteration
    progress = Progress(num_iterations * steps, (start_iteration - 1) * steps, speaks=is_main, resumed=checkpoint,
                        earlier=earlier)  # fmt: skip
    return checkpoint, start_iteration, run_dir, progress


def run_folder(args: Any, checkpoint: dict | None = None) -> Path:
    """The run's folder: a new one (make_run_dir), or with --resume the checkpoint's, held (`hold`), its args.json
    rewritten with this resume recorded."""
    if args.resume is None:
        return make_run_dir(args)
    run_dir = Path(args.resume).parent
    hold(run_dir)
    try:
        write_args(run_dir, args, checkpoint)
    except OSError as exc:
        raise RunError(f"cannot write into {run_dir} ({exc.strerror}): a resumed run goes on in its folder") from None
    return run_dir


def write_args(run_dir: Path, args: Any, resumed: dict | None = None) -> None:
    """args.json: the flags the run is trained with (the same on every resume but TOLERATED ones and a larger
    --total-timesteps; as they took effect: ppo_vec.py's norm_obs is false for Discrete actions), the script's
    defaults, the fields its first command line gave (with the defaults, what the run was asked for: its identity,
    results.asked), and each resume: when, from which iteration and step, and which flags it changed."""
    path = run_dir / "args.json"
    flags = dataclasses.asdict(args)
    record = {"script": Path(sys.argv[0]).name, **flags, "defaults": dataclasses.asdict(type(args)()),
              "given": sorted(given_fields(type(args))), "resumes": []}  # fmt: skip
    if resumed is not None:
        earlier = results.read_json(path) or {}
        record["given"] = earlier.get("given", record["given"])  # what the run was started with
        changed = {name: [earlier.get(name), value] for name, value in flags.items()
                   if name != "resume" and name in earlier and earlier[name] != value}  # fmt: skip
        record["resumes"] = [*earlier.get("resumes", []), {
            "at": time.strftime("%Y-%m-%d %H:%M:%S"), "from_iteration": resumed["iteration"],
            "from_step": resumed["global_step"], "changed": changed}]  # fmt: skip
    results.write_json(path, record)


def vec_env_options(args: Any, cores: int | None = None) -> dict[str, Any]:
    """SubprocVecEnv's keyword arguments from the flags both scripts share; `cores`: the worker processes to use
    when --num-workers is unset (None: let SubprocVecEnv measure and choose)."""
    num_workers = args.num_workers if args.num_workers is not None else cores
    return {"num_workers": num_workers, "max_restarts": args.max_restarts, "step_timeout": args.step_timeout,
            "interrupt": stops.request}  # fmt: skip


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


def announce(what: str, run_dir: Path, resumed: dict | None = None) -> None:
    """The start-up line: what runs where, where its results go, and where a resumed run goes on from."""
    if resumed is not None:
        what += f"; resuming from iteration {resumed['iteration']} (step {resumed['global_step']})"
    print(f"{what}; results in {run_dir}", flush=True)


def hms(seconds: float) -> str:
    """Seconds as h:mm:ss."""
    seconds = int(max(seconds, 0))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class Progress:
    """Steps per second since the first step, the console progress line (at most every `every` seconds, and always
    for the last iteration), and the figures a run's summary and closing line give. `last_step`: the global step the
    run ends at (whole iterations: --total-timesteps rounded down to a multiple of the batch)."""

    def __init__(self, last_step: int, first_step: int = 0, every: float = 2.0, speaks: bool = True,
                 resumed: dict | None = None, earlier: dict | None = None):  # fmt: skip
        self.last_step, self.first_step, self.every, self.speaks = last_step, first_step, every, speaks
        self.global_step = first_step
        self.recent_returns = collections.deque((resumed or {}).get("recent_returns", []), maxlen=20)  # a checkpoint's
        self.start = self.last_print = time.time()
        # the run's earlier segments (a resumed run: its summary.json), for figures over the whole run
        self.earlier_seconds = (earlier or {}).get("seconds", 0.0)
        self.segments = earlier.get("segments", 1) + 1 if earlier else 1

    def sps(self, global_step: int) -> int:
        """Env steps per second since the first step of this process."""
        return int((global_step - self.first_step) / max(time.time() - self.start, 1e-9))

    def mean_return(self) -> float | None:
        return sum(self.recent_returns) / len(self.recent_returns) if self.recent_returns else None

    def line(self, global_step: int, timings: dict[str, float]) -> str:
        """global_step, SPS, mean recent return, elapsed time and ETA (h:mm:ss), where the iteration's time went."""
        sps, mean_return = self.sps(global_step), self.mean_return()
        shown = "n/a" if mean_return is None else f"{mean_return:.1f}"
        eta = (self.last_step - global_step) / max(sps, 1)
        split = ", ".join(f"{name} {seconds:.2f}s" for name, seconds in timings.items())
        return (
            f"global_step={global_step}/{self.last_step} SPS={sps} episodic_return={shown} "
            f"(last {len(self.recent_returns)}) elapsed={hms(time.time() - self.start)} ETA={hms(eta)} [{split}]"
        )

    def log(self, writer: Any, global_step: int, episodes: list, timings: dict[str, float], restarts: int) -> None:
        """Logs charts/episodic_return and charts/episodic_length of each finished episode (global step, return,
        length), charts/SPS, perf/{part}_seconds and charts/worker_restarts (every rank's), and prints the progress
        line (mean of the last 20 returns) if `every` seconds have passed since the last one, or at the last step."""
        self.global_step = global_step
        for step, episodic_return, episodic_length in episodes:
            self.recent_returns.append(float(episodic_return))
            writer.add_scalar("charts/episodic_return", episodic_return, step)
            writer.add_scalar("charts/episodic_length", episodic_length, step)
        writer.add_scalar("charts/SPS", self.sps(global_step), global_step)
        for name, seconds in timings.items():
            writer.add_scalar(f"perf/{name}_seconds", seconds, global_step)
        writer.add_scalar("charts/worker_restarts", restarts, global_step)
        if self.speaks and (time.time() - self.last_print >= self.every or global_step >= self.last_step):
            self.last_print = time.time()
            print(self.line(global_step, timings), flush=True)

    def figures(self) -> dict[str, Any]:
        """What a summary and the closing line say, over all the run's segments (it was resumed segments - 1 times):
        steps, wall time, SPS, the last-20 return."""
        seconds = self.earlier_seconds + time.time() - self.start
        done = self.global_step - (0 if self.earlier_seconds else self.first_step)  # steps of the time counted
        return {
            "global_step": self.global_step,
            "last_step": self.last_step,
            "seconds": round(seconds, 1),
            "sps": int(done / max(seconds, 1e-9)),
            "segments": self.segments,
            "episodic_return_last_20": self.mean_return(),
            "episodes_in_that_mean": len(self.recent_returns),
        }


@contextlib.contextmanager
def process_group(backend: str, enabled: bool) -> Iterator[None]:
    """torch.distributed's process group for the block (rank and world size from torchrun's variables), if enabled."""
    if not enabled:
        yield
        return
    with stops.request.at_once():  # the rendezvous waits for every rank, in C++: a stop then ends the rank at once
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


def check_finite(losses: dict[str, float], module: torch.nn.Module, where: str) -> None:
    """RunError unless every loss and every weight of module is finite (where: which iteration, for the message)."""
    if not (np.isfinite(list(losses.values())).all() and all(p.isfinite().all() for p in module.parameters())):
        raise RunError(f"{where}: the loss or the weights became NaN/Inf; look for NaN/Inf in observations or "
                       "rewards, or lower --learning-rate")  # fmt: skip


_closing: list[tuple[str, bool]] = []  # the closing line `ending` composed, and whether it goes to stderr


def _lost_rank(exc: BaseException) -> bool:
    """True for the error a collective raises when another rank is gone (gloo and NCCL say so in their own words)."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return False
    text = str(exc).lower()
    return isinstance(exc, torch.distributed.DistError) or any(
        s in text for s in ("connection closed by peer", "connection reset by peer", "broken pipe", "nccl")
    )


def max_over_ranks(value: int) -> int:
    """The largest of `value` over all ranks (itself without a process group)."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return value
    on_gpu = torch.distributed.get_backend() == "nccl"
    tensor = torch.tensor([value], device=torch.device("cuda", torch.cuda.current_device()) if on_gpu else "cpu")
    torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.MAX)
    return int(tensor.item())


class Run:
    """What `ending` gives the loop: snapshots of its state after each iteration, saving the last one as checkpoint.pt
    with summary.json (rank 0 alone writes; other ranks' calls do nothing), and the stop request's safe points."""

    def __init__(self, script: str, run_dir: Path | None, checkpoints: Any, progress: Progress):
        self.script, self.run_dir, self.checkpoints, self.progress = script, run_dir, checkpoints, progress
        self.checkpoint = None if run_dir is None else run_dir / "checkpoint.pt"
        self.layout: str | None = None  # where the envs step, and why (SubprocVecEnv.layout): in summary.json

    def stop_requested(self) -> bool:
        """True once this process was asked to stop (SIGINT or SIGTERM): the rollout ends early."""
        return stops.request.signum is not None

    def stop_if_asked(self) -> None:
        """Stopped if this process was asked to stop, or, under torchrun, any rank was (one small all-reduce: every
        rank calls it at the same point, so every rank stops there and none waits in a collective for one that
        left)."""
        signum = max_over_ranks(stops.request.signum or 0)
        if signum:
            raise Stopped(signum)

    def snapshot(self, done: int, rng: list, **extras: Any) -> None:
        """The state after `done` iterations, kept for any save until the next snapshot (Checkpoints.snapshot)."""
        self.checkpoints.snapshot(done, rng, recent_returns=list(self.progress.recent_returns), **extras)

    def save(self, status: str = "running", **state: Any) -> Path | None:
        """Writes the last snapshot to checkpoint.pt (with `state`, e.g. env_states) and summary.json."""
        if self.checkpoint is None:
            return None
        self.checkpoints.save(self.checkpoint, **state)
        self.summarize(status)
        return self.checkpoint

    def save_model(self, exp_name: str) -> str:
        """--save-model: the last snapshot as runs/<run>/<exp_name>.cleanrl_model (CleanRL's name); its path."""
        path = self.checkpoints.save(self.run_dir / f"{exp_name}.cleanrl_model")
        print(f"model saved to {path}", flush=True)
        return str(path)

    def summarize(self, status: str) -> dict[str, Any]:
        on_disk = self.checkpoint.exists()
        summary = {"script": self.script, "status": status, **self.progress.figures(),
                   "checkpoint": str(self.checkpoint) if on_disk else None,
                   "checkpoint_iteration": self.checkpoints.iteration_in(self.checkpoint) if on_disk else None,
                   "layout": self.layout}  # fmt: skip
        results.write_json(self.run_dir / "summary.json", summary)
        return summary


@contextlib.contextmanager
def ending(script: str, run_dir: Path | None, checkpoints: Any, progress: Progress, layout: str | None = None
           ) -> Iterator[Run]:  # fmt: skip
    """The one place a run ends, however it ends. Stopped (at a safe point, after SIGINT/SIGTERM), an env failure or a
    lost rank: the last snapshot is saved, unless checkpoint.pt holds it already (an env failure first waits up to a
    second for a stop: a scheduler signals every process of a job, and the env's helper it killed may make the env
    fail a moment before the trainer's own signal arrives). Then, on rank 0 (run_dir not None): summary.json,
    curve.png and the closing line, which `run` prints last. Put it before the writer in the `with`, so the events are
    flushed when the curve is drawn. Saving waits on no env worker. `layout`: where the envs step (summary.json)."""
    run, status = Run(script, run_dir, checkpoints, progress), "failed"
    run.layout = layout
    try:
        yield run
        status = "done"
    except Stopped as exc:
        status = f"stopped by {exc}"
        _save_on_the_way_out(run)
        raise
    except (WorkerError, TimeoutError, RuntimeError) as exc:
        if isinstance(exc, RuntimeError) and not isinstance(exc, WorkerError) and not _lost_rank(exc):
            raise  # a bug, or a RunError of the script's own (NaN weights): nothing to save
        stopped = stops.request.wait(1.0)
        status = f"stopped by {signal.Signals(stops.request.signum).name}" if stopped else "failed"
        _save_on_the_way_out(run)
        if stopped:
            raise Stopped(stops.request.signum) from None
        raise
    finally:
        if run_dir is not None:
            _close_run(run, status)


def _save_on_the_way_out(run: Run) -> None:
    if run.checkpoints.last is None or run.checkpoint is None or run.checkpoints.written(run.checkpoint):
        return
    try:
        run.save("saving")
    except RunError as exc:  # a full disk: said in one line, the previous checkpoint kept
        print(f"{run.script}: error: {exc}", file=sys.stderr, flush=True)


def _close_run(run: Run, status: str) -> None:
    """summary.json, curve.png, and the closing line for `run` to print."""
    summary = run.summarize(status)
    try:
        results.plot_curve(run.run_dir, f"{run.script}: {run.run_dir.name}")
    except Exception as exc:  # noqa: BLE001 - a plot must never hide how the run ended
        print(f"{run.script}: no curve.png ({type(exc).__name__}: {exc})", file=sys.stderr, flush=True)
    steps = f"{summary['global_step']} of {summary['last_step']} steps"
    mean = summary["episodic_return_last_20"]
    figures = (f"{steps} in {hms(summary['seconds'])} ({summary['sps']} SPS), last-20 return "
               f"{'n/a' if mean is None else f'{mean:.1f}'}")  # fmt: skip
    where = f"results in {run.run_dir} (tensorboard --logdir {run.run_dir.parent})"
    if summary["checkpoint"] and status != "done":
        where += f"; continue with: {command(resume=True)} --resume {summary['checkpoint']}"
    elif summary["checkpoint"]:
        where += f"; evaluate with: {command()} --eval-checkpoint {summary['checkpoint']}"
    _closing.append((f"{run.script}: {status}: {figures}; {where}", status != "done"))


def command(resume: bool = False) -> str:
    """How to run this script again from here: its path as it was typed (a copied script, another folder), under
    torchrun for a job of several ranks that goes on (`resume`)."""
    path = sys.argv[0]
    if resume and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return f"torchrun <the same torchrun options> {path}"
    return f"python {path}"


def _end_with_launcher() -> None:
    """Under torchrun, or a launcher that sets END_WITH_PARENT (a sweep): SIGTERM to this run when its launcher dies
    (SIGKILL included), so the run stops through the normal path (and saves) instead of training on alone. Linux
    only."""
    launched = "TORCHELASTIC_RUN_ID" in os.environ or os.environ.get(results.END_WITH_PARENT) == "1"
    if not launched or not sys.platform.startswith("linux"):
        return
    import ctypes

    PR_SET_PDEATHSIG = 1
    parent = os.getppid()
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:  # it died before we asked
        os.kill(os.getpid(), signal.SIGTERM)


def _runtime_dir_for_video() -> None:
    """A private XDG_RUNTIME_DIR where none is set, before any worker starts: the video stack (SDL) otherwise prints
    "error: XDG_RUNTIME_DIR is invalid" at every env, though nothing is wrong. Removed at exit."""
    current = os.environ.get("XDG_RUNTIME_DIR", "")
    if current and os.path.isdir(current) and os.access(current, os.W_OK):
        return
    import atexit
    import shutil
    import tempfile

    os.environ["XDG_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="ppo-vec-runtime-")  # mode 0700, as SDL asks
    atexit.register(shutil.rmtree, os.environ["XDG_RUNTIME_DIR"], ignore_errors=True)


def run(main: Callable[[Any], None], args_type: type, doc: str) -> None:
    """Parses args_type from the command line (--help opens with the first two paragraphs of `doc`: description and
    commands), runs main(args) with SIGINT and SIGTERM as stop requests (common/stops.py), and exits with the status
    the outcome calls for, after the closing line. Under torchrun every rank exits so; every rank that fails prints
    its own reason, with its rank; a stop is said by rank 0 alone."""
    import tyro

    script = Path(sys.argv[0]).name
    rank, world_size = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    me = f"{script}: rank {rank}" if world_size > 1 else script

    def fail(status: int, message: str) -> None:
        print(f"{me}: {message}", file=sys.stderr, flush=True)
        close(status)

    def close(status: int) -> None:
        for line, to_stderr in _closing:
            print(line, file=sys.stderr if to_stderr else sys.stdout, flush=True)
        guardian.look_now()
        stops.request.ignore()  # the run is over: a launcher's forwarded signal must not end the exit itself
        sys.exit(status)

    stops.request.install()
    _end_with_launcher()
    guardian.watch_this_process()
    try:
        check_bool_values(args_type, sys.argv[1:])
        args = tyro.cli(args_type, description="\n\n".join(doc.split("\n\n")[:2]))
        if getattr(args, "capture_video", False):
            _runtime_dir_for_video()
        main(args)
    except Finished as exc:
        if rank == 0:
            print(f"{script}: {exc}", flush=True)
    except FlagError as exc:
        fail(2, f"error: {exc}")
    except Stopped as exc:
        if rank == 0 and not _closing:  # stopped before training started: nothing else to say
            print(f"{script}: stopped by {exc}", file=sys.stderr, flush=True)
        close(128 + exc.signum)
    except (RunError, WorkerError, TimeoutError, FloatingPointError) as exc:
        fail(1, f"error: {exc}")
    except Exception as exc:  # noqa: BLE001 - a lost rank is one line; anything else is a bug, with its traceback
        if not _lost_rank(exc):
            traceback.print_exc()
            close(1)
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        fail(1, f"error: lost contact with another rank ({reason}); that rank's own message says why")
    close(0)
