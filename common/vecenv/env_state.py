"""Env states for checkpoints: an env pickled whole (its wrappers, their statistics, its random
generators and the simulator's own state), so that a run resumed from a checkpoint continues its
episodes exactly where they were.

Which envs: those whose every class (the env and each wrapper) comes from gymnasium, ale_py or this
package, or declares `pickle_state = True` (a user env that pickles with its whole state: plain
Python and numpy). Simulators that gymnasium pickles by their constructor arguments (EzPickle:
MuJoCo, ALE) are pickled by their state instead: MuJoCo's model and data pickle whole; an ALE env is
rebuilt from its arguments and given back its emulator's state, random generator included. `dumps`
gives None for anything else (Box2D's worlds, a wrapper from another package, an env that does not
pickle): such an env cannot be saved, and a run resumed from the checkpoint starts fresh episodes.

Loading unpickles: only resume from checkpoints you wrote.
"""

from __future__ import annotations

import copyreg
import io
import pickle
from typing import Any

import cloudpickle
import gymnasium as gym
from gymnasium.utils.ezpickle import EzPickle

# ours, under whatever name it has
SAFE_MODULES = ("gymnasium.", "ale_py.", __package__.rpartition(".")[0] + ".")


def chain(env: gym.Env) -> list[Any]:
    """The env and every wrapper around it, outermost first."""
    found = [env]
    while isinstance(found[-1], gym.Wrapper):
        found.append(found[-1].env)
    return found


def saveable(env: gym.Env) -> bool:
    """True if every class of the env's chain is one whose pickle keeps the whole state (see the
    module's text)."""
    return all(
        type(e).__module__.startswith(SAFE_MODULES) or getattr(type(e), "pickle_state", False)
        for e in chain(env)
    )


def dumps(env: gym.Env) -> bytes | None:
    """The env's whole state as bytes, or None if it cannot be saved."""
    if not saveable(env):
        return None
    try:
        import ale_py
    except ImportError:  # no Atari here: nothing of ALE's to find
        ale_py = None
    owners = {id(e.ale): e for e in chain(env) if ale_py is not None and isinstance(e, ale_py.env.AtariEnv)}
    # pickle's own first: a run keeps this at every iteration
    for pickler in (_StatePickler, _CloudStatePickler):
        buffer = io.BytesIO()
        try:
            pickler(buffer, owners).dump(env)
            return buffer.getvalue()
        except Exception:  # noqa: BLE001 - a lambda needs cloudpickle; what neither pickles cannot be saved
            continue
    return None


def loads(data: bytes) -> gym.Env:
    """The env `dumps` saved, in the state it had."""
    return pickle.loads(data)


def _set_dict(obj: Any, state: dict) -> None:
    obj.__dict__.update(state)


def _new_atari(args: tuple, kwargs: dict) -> Any:
    from ale_py.env import AtariEnv

    # the ROM loaded and the emulator set up as the saved env had it
    return AtariEnv(*args, **kwargs)


def _set_atari(env: Any, state: tuple) -> None:
    ale_state, attrs = state
    env.__dict__.update(attrs)
    env.ale.restoreState(ale_state)


class _StatePickler(pickle.Pickler):
    """Pickles EzPickle objects by their state rather than their constructor arguments, and ALE envs
    by their emulator's state (an ALEInterface held by a wrapper is its env's, rebuilt with it)."""

    def __init__(self, file: io.BytesIO, ale_owners: dict[int, Any]):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.ale_owners = ale_owners

    def reducer_override(self, obj: Any) -> Any:
        if id(obj) in self.ale_owners:  # the ALEInterface of an env in the chain
            return getattr, (self.ale_owners[id(obj)], "ale")
        if type(obj).__module__ == "ale_py.env" and hasattr(obj, "ale") and id(obj.ale) in self.ale_owners:
            attrs = {key: value for key, value in vars(obj).items() if key != "ale"}
            state = (obj.ale.cloneState(include_rng=True), attrs)
            return _new_atari, (obj._ezpickle_args, obj._ezpickle_kwargs), state, None, None, _set_atari
        if isinstance(obj, EzPickle):
            return copyreg.__newobj__, (type(obj),), vars(obj), None, None, _set_dict
        return NotImplemented


class _CloudStatePickler(cloudpickle.Pickler):
    """_StatePickler with cloudpickle's reach: functions and classes defined at run time, pickled by
    value."""

    def __init__(self, file: io.BytesIO, ale_owners: dict[int, Any]):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.ale_owners = ale_owners

    def reducer_override(self, obj: Any) -> Any:
        reduced = _StatePickler.reducer_override(self, obj)
        return super().reducer_override(obj) if reduced is NotImplemented else reduced
