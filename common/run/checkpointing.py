"""Checkpoint files, written once for both scripts: what a checkpoint holds, writing it so that no stop or full disk
leaves a broken one, reading it back without running code, resuming from it, and the envs' running statistics.

A run keeps a snapshot of its state after each iteration (`Checkpoints.snapshot`: a copy, cheap next to an
iteration) and writes that snapshot, whatever the moment of the save: a periodic save, the final one, or the one a
stop or an env failure makes. So a checkpoint is always labelled with the iteration its weights, optimizer,
random generators and statistics come from, and a resumed run neither repeats nor skips one. Only the periodic and
final saves, made between iterations, hold the envs' states too (SubprocVecEnv.save_env_states): resumed from
those, a run continues bit for bit where every env can be saved (common/vecenv/env_state.py), and with fresh
episodes where not.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import errno
import io
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import torch

from common.run import records, stops
from common.run.errors import Finished, FlagError, RunError
from common.run.flags import flag, given, given_fields


def save_checkpoint(path: Path | str, state: dict) -> None:
    """Writes state to path atomically: to memory, then a temp file flushed to disk, then renamed over path. On
    failure the temp file is removed, path keeps its previous contents, and RunError says why in one line (a full disk
    as "no space left on device"). Refuses non-finite tensors."""
    path = Path(path)
    if not all(torch.isfinite(t).all() for t in _tensors(state) if t.is_floating_point()):
        raise RunError(f"{path} was not written: the state holds NaN/Inf values (the previous file is unchanged)")
    buffer = io.BytesIO()
    try:
        torch.save(state, buffer)
    except Exception as exc:  # noqa: BLE001 - something in the state does not pickle
        raise RunError(f"could not write {path} ({exc}); the previous file, if any, is unchanged") from None
    try:
        records.write_atomically(path, buffer.getbuffer())
    except OSError as exc:
        reason = "no space left on device" if exc.errno == errno.ENOSPC else f"{type(exc).__name__}: {exc.strerror}"
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


def load_checkpoint(path: str, flag_name: str, script: str, needs: tuple[str, ...] = ()) -> dict:
    """A checkpoint that `script` wrote, read with weights_only=True (loading never runs code); FlagError naming
    the flag for a missing, unreadable, foreign or incomplete file (`needs`: the entries it must hold)."""
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
    missing = [name for name in ("args", "model", *needs) if name not in checkpoint]
    if missing:
        raise FlagError(f"{flag_name} {path} holds no {' and no '.join(missing)}: not a whole checkpoint of {script} "
                        "(an older version, or a file edited since)")  # fmt: skip
    wrong = [name for name, ok in _FIELDS.items() if name in checkpoint and not ok(checkpoint[name], checkpoint)]
    if wrong:
        raise FlagError(f"{flag_name} {path} holds a {' and a '.join(wrong)} no run of {script} writes: a file edited "
                        "since, or damaged")  # fmt: skip
    return checkpoint


def _is_state(value: Any) -> bool:
    """A numpy random generator's state, as bit_generator.state gives it (a dict naming its bit generator)."""
    return isinstance(value, dict) and isinstance(value.get("bit_generator"), str) and "state" in value


# What each field of a checkpoint may hold: (value, the whole checkpoint) -> ok
_FIELDS: dict[str, Callable[[Any, dict], bool]] = {
    "args": lambda v, c: isinstance(v, dict),
    "model": lambda v, c: isinstance(v, dict),
    "world_size": lambda v, c: type(v) is int and v >= 1,
    "iteration": lambda v, c: type(v) is int and v >= 0,
    "global_step": lambda v, c: type(v) is int and v >= 0,
    "rng": lambda v, c: (  # one per rank (where the world size itself is right), rank 0's known
        isinstance(v, list)
        and bool(v)
        and _is_state(v[0])
        and all(s is None or _is_state(s) for s in v)
        and (len(v) == c.get("world_size", 1) or not _FIELDS["world_size"](c.get("world_size", 1), c))
    ),
    "env_states": lambda v, c: v is None or isinstance(v, list) and all(isinstance(s, torch.Tensor) for s in v),
    "recent_returns": lambda v, c: isinstance(v, list) and all(isinstance(r, (int, float)) for r in v),
}


class Checkpoints:
    """What a run's checkpoints hold, and resuming from one. A checkpoint is a dict: script, args, world_size,
    iteration (the number done), global_step, the state dict of each of `modules`, rng (one generator state per rank,
    None where unknown), env_states (one per rank, bytes as a uint8 tensor, or None) and whatever extras the script
    adds."""

    def __init__(self, script: str, args: Any, modules: dict[str, Any], steps_per_iteration: int, world_size: int = 1):
        self.script, self.args, self.modules = script, args, modules
        self.steps_per_iteration, self.world_size = steps_per_iteration, world_size
        self.last: dict | None = None  # the latest snapshot: what any save writes
        self._written: dict[Path, dict] = {}  # path -> the snapshot last written there
        self._iterations: dict[Path, int] = {}  # path -> the iteration of the checkpoint there (written or read)

    def snapshot(self, done: int, rng: list, **extras: Any) -> None:
        """Notes the state after `done` iterations (copies: training goes on changing the originals). rng: every
        rank's generator state, None where this process does not know it."""
        state = {"script": self.script, "args": dataclasses.asdict(self.args), "world_size": self.world_size,
                 "iteration": done, "global_step": done * self.steps_per_iteration, "rng": rng,
                 "env_states": None, **extras}  # fmt: skip
        state.update({name: copy.deepcopy(module.state_dict()) for name, module in self.modules.items()})
        self.last = state

    def save(self, path: Path | str, env_states: list[bytes | None] | None = None, **changes: Any) -> Path | str:
        """Writes the last snapshot to path (atomically), with the envs' states (one per rank, from
        SubprocVecEnv.save_env_states, None where they could not be saved) and `changes`, which belong to the snapshot
        from now on; returns path."""
        if env_states is not None and all(s is not None for s in env_states):
            self.last["env_states"] = [torch.frombuffer(bytearray(s), dtype=torch.uint8) for s in env_states]
        self.last.update(changes)  # taken at the snapshot's boundary too: a later save of it writes them again
        save_checkpoint(path, self.last)
        self._written[Path(path)], self._iterations[Path(path)] = self.last, self.last["iteration"]
        return path

    def written(self, path: Path | str) -> bool:
        """True if `path` holds the last snapshot already (a stop right after a periodic save has nothing to add)."""
        return self._written.get(Path(path)) is self.last

    def iteration_in(self, path: Path | str) -> int | None:
        """The iteration of the checkpoint in `path` as this run wrote or read it (a failed write leaves the earlier
        one), None if it knows of none."""
        return self._iterations.get(Path(path))

    def resume(self, path: str, num_iterations: int, needs: tuple[str, ...] = ()) -> dict:
        """Loads checkpoint `path` into the modules and returns it (for rng and extras). FlagError unless it holds
        the modules and `needs` and was written with as many ranks (its other sizes come with its flags:
        trained_flags); Finished if its run has no iterations left."""
        checkpoint = load_checkpoint(path, "--resume", self.script, ("iteration", "rng", *self.modules, *needs))
        if checkpoint["world_size"] != self.world_size:
            raise FlagError(f"--resume {path} was written with {checkpoint['world_size']} ranks; resume it with "
                            f"{checkpoint['world_size']}, not {self.world_size}")  # fmt: skip
        if checkpoint["iteration"] >= num_iterations:
            raise Finished(f"--resume {path}: that run finished its {num_iterations} iterations already; nothing to "
                           "do (a larger --total-timesteps continues it)")  # fmt: skip
        for name, module in self.modules.items():
            load_state(module, checkpoint[name], "--resume", path)
        self._iterations[Path(path)] = checkpoint["iteration"]
        return checkpoint


def trained_flags(args: Any, script: str) -> Any:
    """With --resume: the flags the run was trained with (its checkpoint's), the command line's only where a run may
    change them (records.TOLERATED, and --total-timesteps, which extends or ends it sooner). FlagError naming each
    other flag given on the command line with another value than the run's, and both values. Without: args."""
    if args.resume is None:
        return args
    saved = saved_args(load_checkpoint(args.resume, "--resume", script), type(args))
    fields = given_fields(type(args))
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(args) if f.name in fields}  # in flags' order
    kept = records.differing(given, dataclasses.asdict(saved))
    if kept:
        listed = ", ".join(f"{flag(name)} {before} (not {after})" for name, (after, before) in kept.items())
        raise FlagError(f"--resume {args.resume} continues a run trained with {listed}: a run's results come from one "
                        "set of flags; drop those flags, or start a new run")  # fmt: skip
    return dataclasses.replace(saved, **given | {"resume": args.resume})  # the others given equal the run's own


def env_states_of(checkpoint: dict, rank: int = 0) -> bytes | None:
    """The envs' states a checkpoint holds for `rank` (bytes for SubprocVecEnv.load_env_states), or None."""
    states = checkpoint.get("env_states")
    return None if states is None else states[rank].numpy().tobytes()


def load_for_eval(path: str, script: str, args_type: type, env_id: str | None, **changes: Any) -> tuple[dict, Any]:
    """The checkpoint to evaluate, and the Args it was trained with (with `changes`). FlagError if --env-id was given
    and names another env than the one the policy was trained on (evaluate that one: drop --env-id)."""
    checkpoint = load_checkpoint(path, "--eval-checkpoint", script)
    saved = saved_args(checkpoint, args_type, **changes)
    if env_id is not None and "--env-id" in given() and env_id != saved.env_id:
        raise FlagError(f"--eval-checkpoint {path} holds a policy for {saved.env_id}, not --env-id {env_id}: drop "
                        f"--env-id (the policy is evaluated on {saved.env_id})")  # fmt: skip
    return checkpoint, saved


def saved_args(checkpoint: dict, args_type: type, **changes: Any) -> Any:
    """The Args a checkpoint was written with (flags this version no longer has are dropped), with `changes`."""
    fields = {f.name for f in dataclasses.fields(args_type)}
    return args_type(**{k: v for k, v in checkpoint["args"].items() if k in fields} | changes)


def load_state(module: Any, state: dict, flag_name: str, path: str) -> None:
    """module.load_state_dict(state), with a mismatch as one FlagError naming the flag, and for a model the first
    tensor that differs and both shapes (a checkpoint of another env, or of other sizes)."""
    if isinstance(module, torch.nn.Module):
        own = module.state_dict()
        for name in [*own, *state]:
            if name not in own or name not in state:
                where = "this run's model has" if name in own else "the checkpoint has"
                raise FlagError(f"{flag_name} {path} does not fit this run's model: {where} {name}, the other not")
            if tuple(own[name].shape) != tuple(state[name].shape):
                raise FlagError(f"{flag_name} {path} does not fit this run's model: {name} has shape "
                                f"{tuple(state[name].shape)} there, {tuple(own[name].shape)} here (another env, or "
                                "other sizes?)")  # fmt: skip
    try:
        module.load_state_dict(state)
    except (RuntimeError, ValueError, KeyError) as exc:
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise FlagError(f"{flag_name} {path} does not fit this run's {type(module).__name__} ({reason})") from None


def start_envs(envs: Any, checkpoint: dict | None, rank: int, seed: int) -> tuple[Any, bool]:
    """The envs as a run starts them: put back as they were, if the checkpoint holds their states (a periodic or
    final save), else reset with `seed`. Returns the observations to act on first, and whether they are fresh ones
    (not seen before by the run)."""
    saved = env_states_of(checkpoint, rank) if checkpoint is not None else None
    if saved is not None:
        return envs.load_env_states(saved), False
    return envs.reset(seed=seed)[0], True


def evaluate(env: gym.Env, act: Callable[[Any], Any], episodes: int, seed: int, writer: Any = None) -> list[float]:
    """Raw returns of `episodes` whole episodes (whole games, for Atari) on one env, as RecordEpisodeStatistics reports
    them, acting with act(obs); printed, and logged as eval/episodic_return if a writer is given; closes the env."""
    returns = []
    obs, _ = env.reset(seed=seed)
    while len(returns) < episodes:
        stops.request.check()  # the env steps in this process: a stop is honoured between its steps
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
    print(f"eval: mean return {sum(returns) / max(len(returns), 1):.2f} over {len(returns)} episodes: {returns}")
    return returns
