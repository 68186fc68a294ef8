"""A run's flags: those that change what it learns, and their checks before anything starts."""

import dataclasses
import difflib
import importlib
import importlib.util
import itertools
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from ..vecenv.errors import check_layout
from ..vecenv.layout import ProbeFailed, probe
from . import records
from .errors import FlagError

# Flags a resume may change and a sweep reuse a run made with others: where and how it computes, saves, logs
# (another num_threads, cuda, backend or compile sums floats in another order: the weights then differ a little)
TOLERATED = frozenset(
    "checkpoint_interval num_workers step_timeout max_restarts num_threads cuda backend device_ids track "
    "wandb_project_name wandb_entity capture_video save_model eval_episodes eval_checkpoint resume run_id overlap "
    "compile cudagraphs".split()
)


def flag(name: str) -> str:
    """The command-line spelling of an Args field: num_envs -> --num-envs."""
    return "--" + name.replace("_", "-")


def differing(flags: dict[str, Any], other: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """{field: (in flags, in other)} for the flags that change what a run learns and differ."""
    return {
        name: (value, other.get(name))
        for name, value in flags.items()
        if name not in TOLERATED and name != "total_timesteps" and other.get(name) != value
    }


def schedules(args: Any) -> dict[str, str]:
    """The SCHEDULED flags on: {"anneal_lr": "learning_rate"}, the value it takes linearly to 0."""
    return {name: value for name, value in getattr(type(args), "SCHEDULED", {}).items() if getattr(args, name, False)}


def to_run_with(args: Any, named: frozenset[str], script: str) -> tuple[Any, dict | None, str, list[str]]:
    """The flags a run goes with, and the checkpoint they come from.

    --resume (or --run-id, of a run that saved) goes on with the run's own flags, but for those the command
    line may change (TOLERATED ones, and --total-timesteps); --eval-checkpoint evaluates with them and the
    command line's TOLERATED ones.

    Args:
        args: the flags as parsed.
        named: the fields the command line named.
        script: the script's file name, for messages.

    Returns:
        The flags to run with.
        The checkpoint (None for a new run).
        Where it came from ("--resume <file>"; messages start with it).
        Notes for the start line.

    Raises:
        FlagError: the checkpoint is missing or damaged, or the command line asks what it cannot change.
    """
    if args.resume is not None and args.eval_checkpoint is not None:
        raise FlagError("--resume trains a run on, --eval-checkpoint evaluates one: give one of them")
    path = args.resume if args.resume is not None else args.eval_checkpoint
    where = f"{'--resume' if args.resume is not None else '--eval-checkpoint'} {path}"
    run_id = getattr(args, "run_id", None)
    found = Path("runs", f"{records.run_name(args)}__{run_id}", "checkpoint.pt")
    if path is None and run_id is not None and found.exists():  # a requeued job finds its own run
        path = str(found)
        where = f"--run-id {run_id} ({found})"
    if path is None:
        return args, None, "", []
    checkpoint = records.load_checkpoint(path, where.split()[0], script)
    names = [f.name for f in dataclasses.fields(args)]
    # flags an older version had and this one has not are left out
    saved = type(args)(**{k: v for k, v in checkpoint["args"].items() if k in names})
    from_command_line = {name: getattr(args, name) for name in names if name in named}
    module = saved.env_id.rpartition(":")[0]
    if module and "env_id" not in from_command_line:  # a checkpoint never chooses what is imported
        env = saved.env_id
        raise FlagError(f"{where} is of --env-id {env}, which imports {module}: give --env-id {env} to import it")
    if args.eval_checkpoint is not None:
        if args.env_id != saved.env_id and "env_id" in from_command_line:
            raise FlagError(
                f"{where} holds a policy for {saved.env_id}, not --env-id {args.env_id}: drop --env-id (it is "
                f"evaluated on {saved.env_id})"
            )
        if args.eval_episodes < 1:
            raise FlagError(f"--eval-episodes must be >= 1 with --eval-checkpoint, got {args.eval_episodes}")
        tolerated = {name: getattr(args, name) for name in TOLERATED & {*names}}
        return dataclasses.replace(saved, **tolerated), checkpoint, where, []
    if refused := differing(from_command_line, dataclasses.asdict(saved)):
        listed = ", ".join(f"{flag(name)} {was} (not {asked})" for name, (asked, was) in refused.items())
        other = "give another --run-id" if where.startswith("--run-id") else "start a new run"
        raise FlagError(
            f"{where} continues a run trained with {listed}: a run's results come from one set of flags; drop "
            f"those flags, or {other}"
        )
    notes: list[str] = []
    resumed = dataclasses.replace(saved, **from_command_line | {"resume": path})
    trained_with = getattr(saved, "num_threads", None)
    if trained_with not in (None, getattr(resumed, "num_threads", None)):  # torch may then sum in another order
        threads = f"--num-threads {resumed.num_threads}, not the {trained_with} it trained with"
        notes.append(f"{threads}: its weights may differ from an unstopped run's")
    return resumed, checkpoint, where, notes


def spellings(args_type: type) -> dict[str, str]:
    """Each field's spellings on a command line: {"--num-envs": "num_envs", "--no-x": "x", ...}."""
    spelled = {}
    for f in dataclasses.fields(args_type):
        for name in {f.name.replace("_", "-"), f.name}:
            spelled[f"--{name}"] = spelled[f"--no-{name}"] = spelled[f"--no_{name}"] = f.name
    return spelled


def named_fields(args_type: type, argv: list[str]) -> frozenset[str]:
    """The fields of args_type a command line names (--norm-obs, --no-norm-obs: norm_obs)."""
    spelled = spellings(args_type)
    return frozenset(spelled[word] for word in (w.split("=", 1)[0] for w in argv) if word in spelled)


def plain_name(name: str) -> bool:
    """A name that stays one folder inside runs/: not empty, no path separator, not '.' or '..'."""
    return name not in ("", ".", "..") and not any(s in name for s in {"/", "\0", os.sep, os.altsep or "/"})


# The flags both scripts have: (field, test of its value, what is allowed)
SHARED_FLAGS: list[tuple[str, Callable[[Any], bool], str]] = [
    ("exp_name", plain_name, "a plain name (no '/', not '.' or '..')"),
    ("exp_name", lambda v: len(v.encode()) <= 200, "at most 200 bytes (it names a folder with the env id)"),
    ("run_id", lambda v: v is None or plain_name(v) and len(v.encode()) <= 40, "a plain name of at most 40 bytes"),
    ("seed", lambda v: 0 <= v < 2**32, "in [0, 2**32)"),
    ("num_steps", lambda v: v >= 1, ">= 1"),
    ("num_minibatches", lambda v: v >= 1, ">= 1"),
    ("update_epochs", lambda v: v >= 1, ">= 1"),
    ("total_timesteps", lambda v: v >= 1, ">= 1"),
    ("learning_rate", lambda v: 0 < v <= 1, "in (0, 1] (Adam moves each weight by about this much a step)"),
    ("gamma", lambda v: 0 < v <= 1, "in (0, 1]"),
    ("gae_lambda", lambda v: 0 <= v <= 1, "in [0, 1]"),
    ("clip_coef", lambda v: 0 < v <= 10, "in (0, 10] (the ratio is clipped to 1 +- it: 0.1 to 0.3 is usual)"),
    ("vf_coef", lambda v: 0 <= v <= 1e6, "in [0, 1e6] (a float32 loss times it must stay a number)"),
    ("ent_coef", lambda v: abs(v) <= 1e6, "in [-1e6, 1e6] (a float32 loss times it must stay a number)"),
    ("max_grad_norm", lambda v: v > 0, "> 0"),
    ("target_kl", lambda v: v is None or v > 0, "> 0 (or unset)"),
    ("eval_episodes", lambda v: v >= 0, ">= 0"),
    ("checkpoint_interval", lambda v: v >= 0, ">= 0 (0: only when stopped)"),
    ("num_workers", lambda v: v is None or v >= 0, ">= 0 (0: the envs step in the trainer) or unset"),
    ("max_restarts", lambda v: v >= 0, ">= 0"),
    ("step_timeout", lambda v: v is None or 0 < v <= 604800, "in (0, 604800] seconds, a week (or unset)"),
    # torch crashes making 100000
    ("num_threads", lambda v: v is None or 1 <= v <= 1024, "in [1, 1024]"),
]


def check(args: Any, rules: list[tuple[str, bool, str]]) -> None:
    """FlagError for the first flag that is NaN or infinite, or breaks SHARED_FLAGS or `rules` (field, ok, allowed)."""
    for field in dataclasses.fields(args):
        value = getattr(args, field.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise FlagError(f"{flag(field.name)} must be a finite number, got {value}")
    shared = [(name, test(getattr(args, name)), allowed) for name, test, allowed in SHARED_FLAGS if hasattr(args, name)]
    for name, ok, allowed in shared + rules:
        if not ok:
            raise FlagError(f"{flag(name)} must be {allowed}, got {getattr(args, name)}")
    if getattr(args, "cudagraphs", False) and not (args.cuda and torch.cuda.is_available()):
        raise FlagError("--cudagraphs replays CUDA graphs, and this run has no CUDA device: drop it (--compile works)")
    for name, package in {"capture_video": "moviepy", "track": "wandb"}.items():
        if getattr(args, name, False) and importlib.util.find_spec(package) is None:
            raise FlagError(f"{flag(name)} needs {package}, which is not installed: pip install {package}")
    try:
        if hasattr(args, "num_workers"):
            check_layout(args.num_workers, args.step_timeout, args.max_restarts, spell=flag)
    except ValueError as exc:
        raise FlagError(str(exc)) from None


def batch_rules(args: Any, envs: str, world_size: int = 1) -> list[tuple[str, bool, str]]:
    """The rules of a batch, `envs` (a rank's envs) x --num-steps, split into --num-minibatches."""
    n = getattr(args, envs)
    batch_size = n * args.num_steps
    batch = f"batch of {batch_size} steps ({flag(envs)} {n} x --num-steps {args.num_steps})"
    least = f">= one {batch}" if world_size == 1 else f">= {world_size} x a {batch}"
    pairs = not getattr(args, "norm_adv", False) or batch_size >= 2 * args.num_minibatches
    return [
        (envs, n >= 1, ">= 1"),
        ("num_minibatches", batch_size % max(args.num_minibatches, 1) == 0, f"a divisor of the {batch}"),
        ("num_minibatches", pairs, f"at most {batch_size // 2}: --norm-adv needs 2 samples a minibatch"),
        ("total_timesteps", args.total_timesteps >= batch_size * world_size, least),
    ]


def check_rollout(args: Any, envs: str, obs_space: gym.Space) -> None:
    """FlagError for a rollout whose observations alone would not fit in this machine's memory."""
    steps, n, memory = args.num_steps, getattr(args, envs), os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    if (need := steps * n * int(np.prod(obs_space.shape)) * obs_space.dtype.itemsize) > memory:
        raise FlagError(
            f"--num-steps {steps} x {flag(envs)} {n}: the rollout's observations alone would take {need / 2**30:.1f} "
            f"GiB, and this machine has {memory / 2**30:.1f} GiB; lower --num-steps or {flag(envs)}"
        )


def check_words(args_type: type, argv: list[str], script: str) -> None:
    """FlagError for a word that names no flag of args_type, and for a switch given a value (`--capture-video
    True`, CleanRL's old spelling): here `--flag` or `--no-flag`. Other errors are the parser's own box."""
    spelled = spellings(args_type)
    switches = {name for name, field in spelled.items() if "bool" in str(args_type.__dataclass_fields__[field].type)}
    for word, value in itertools.zip_longest(argv, argv[1:], fillvalue=""):
        name = word.split("=", 1)[0]
        if name.startswith("--") and name not in spelled and name != "--help":
            negated = name.startswith("--no")  # (--no-x is offered for a word that starts so)
            spelled_so = [s for s in spelled if "_" not in s and s.startswith("--no-") == negated]
            close = difflib.get_close_matches(name, spelled_so, n=2)
            hint = f"did you mean {' or '.join(close)}?" if close else f"python {script} --help lists them"
            raise FlagError(f"{name} is not a flag of {script}: {hint}")
        if name in switches and ("=" in word or value.lower() in ("true", "false", "1", "0", "yes", "no")):
            value = word.split("=", 1)[1] if "=" in word else value
            positive = "--" + name.removeprefix("--").removeprefix("no-").removeprefix("no_").replace("_", "-")
            raise FlagError(
                f"{name} is a switch and takes no value (got {value!r}): write {positive} to turn it on, "
                f"--no-{positive[2:]} to turn it off"
            )


def check_env_id(env_id: str) -> None:
    """Imports the module of a module:EnvId id; FlagError unless the id is registered."""
    import ale_py

    gym.register_envs(ale_py)  # Atari ids are known, so a script can say which ones are for it
    ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)  # no banner on every Atari env built
    module, _, name = env_id.rpartition(":")
    # a module beside you, as `python -m` finds it (workers too)
    if module and os.getcwd() not in sys.path:
        sys.path.insert(1, os.getcwd())
    try:
        if module:
            importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - the user's module: what went wrong in it, in one line
        hint = ""
        if isinstance(exc, ModuleNotFoundError) and exc.name == module.split(".")[0]:
            hint = (
                f"; it is looked for in {os.getcwd()}, in the script's folder and on PYTHONPATH: run from "
                "the folder that holds it, add that folder to PYTHONPATH, or pip install its package"
            )
        raise FlagError(f"--env-id {env_id}: importing {module} failed ({type(exc).__name__}: {exc}){hint}") from None
    if name not in gym.registry:
        close = difflib.get_close_matches(name, list(gym.registry), n=3)
        hint = f"; did you mean {' or '.join(close)}?" if close else "."
        hint += "" if module else f" An env your module registers: --env-id your_module:{name}"
        raise FlagError(f"--env-id {env_id!r} is not a registered gymnasium env{hint}")


def probe_env(env_id: str, make: Callable[[], gym.Env], bound: float, interrupt: Any) -> dict[str, Any]:
    """What vecenv/layout.py's probe finds of the env (in a process of its own), or FlagError naming --env-id."""
    try:
        return probe(make, bound, interrupt=interrupt, check_api=True)
    except ProbeFailed as exc:
        if exc.phase == "api":
            raise FlagError(
                f"--env-id {env_id} follows the old gym API ({exc.summary}); the scripts need gymnasium's: "
                "reset(seed=None, options=None) -> (obs, info), step(action) -> (obs, reward, terminated, "
                "truncated, info)"
            ) from None
        if exc.phase == "start":  # the probe itself, before any env code: not the env's fault
            why = f"the process that builds it to look at it could not start ({exc.summary})"
            raise FlagError(f"--env-id {env_id}: {why}") from None
        raise FlagError(f"--env-id {env_id} cannot be {exc.done} here: {exc.summary}") from None
    except TimeoutError:
        raise FlagError(f"--env-id {env_id}: building the env did not finish within {bound:g} s") from None
