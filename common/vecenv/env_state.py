"""An env's state as data, for checkpoints: taken from a live env (`take`) and set onto one the same
make_env built again (`put`), so that a resumed run's episodes go on exactly where they were. A
state holds values only (numbers, strings, bytes, arrays, numpy generators' states, and lists,
tuples and dicts of these): nothing in it names a class or a function, so loading it never runs
code, and torch.load(weights_only=True) loads it. Envs whose every class (env and wrappers) is gymnasium's,
ale_py's, ours, or says `pickle_state = True`; any other is not saved (None). What is taken: docs/vecenv.md."""

import collections
import contextlib
import functools
import types
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.registration import EnvSpec

# ours, under any name
SAFE_MODULES = ("gymnasium.", "ale_py.", __package__.rpartition(".")[0] + ".")
CODE = (type, types.FunctionType, types.BuiltinFunctionType, types.MethodType, functools.partial)
REBUILT = (gym.Env, gym.Space, EnvSpec, types.ModuleType, *CODE)  # what make_env builds again
# Constants of what make_env built, or objects it rebuilds: not state
NOT_TAKEN = {"_saved_kwargs", "_ezpickle_args", "_ezpickle_kwargs", "spec", "metadata", "_action_set", "render_mode"}
NOT_TAKEN |= {"frame_skip", "_frameskip", "noop_max", "action_set", "screen", "clock", "mujoco_renderer"}
RAW = (type(None), bool, int, float, str)
KEEP = object()  # an attribute left as make_env built it


class Unsaveable(Exception):
    """A value that is not data."""


def chain(env: gym.Env) -> list[gym.Env]:
    """The env and every wrapper around it, outermost first."""
    envs = [env]
    while isinstance(envs[-1], gym.Wrapper):
        envs.append(envs[-1].env)
    return envs


def take(env: gym.Env) -> dict | None:
    """The env's state as data, or None if it holds something else."""
    layers = chain(env)[::-1]
    if not all(type(e).__module__.startswith(SAFE_MODULES) or getattr(type(e), "pickle_state", False) for e in layers):
        return None
    seen: dict[int, tuple] = {}
    try:
        return {"classes": [type(e).__qualname__ for e in layers], "layers": [_fields(e, seen) for e in layers]}
    except Unsaveable:
        return None


def put(env: gym.Env, state: Any) -> None:
    """Sets a state `take` gave onto an env the same make_env built; ValueError, before any is set, if it won't fit."""
    layers = chain(env)[::-1]
    classes = [type(e).__qualname__ for e in layers]
    if state["classes"] != classes:
        raise ValueError(f"it was taken from {' < '.join(state['classes'])}, these are {' < '.join(classes)}")
    seen: list = []
    plan = [(e, _unfields(e, fields, seen)) for e, fields in zip(layers, state["layers"], strict=True)]
    for obj, values in plan:
        _assign(obj, values)


def value(obj: Any, seen: dict[int, tuple] | None = None) -> Any:
    """`obj` (an env's attribute, or an observation) as data; Unsaveable if it is not."""
    seen = {} if seen is None else seen
    if type(obj) in RAW:
        return obj
    if type(obj) is bytes:
        return obj or ("bytes", None)  # weights_only=True cannot load an empty bytes
    if id(obj) in seen:  # one object, held twice: it stays one
        return ("same", seen[id(obj)][0])
    seen[id(obj)] = (len(seen), obj)  # holding obj keeps its id no other's while this lasts
    if isinstance(obj, (np.ndarray, np.generic)) and not obj.dtype.hasobject:
        kind = "array" if isinstance(obj, np.ndarray) else "scalar"
        return (kind, obj.dtype.str, list(np.shape(obj)), np.ascontiguousarray(obj).tobytes() or None)
    if isinstance(obj, np.random.Generator):
        return ("rng", obj.bit_generator.state)
    if isinstance(obj, (list, tuple, collections.deque)):
        items = [value(item, seen) for item in obj]
        return ("deque", obj.maxlen, items) if isinstance(obj, collections.deque) else (type(obj).__name__, items)
    if type(obj) is dict:
        return ("dict", [[value(k, seen), value(v, seen)] for k, v in obj.items()])
    module, name = type(obj).__module__, type(obj).__name__
    if module.startswith("ale_py") and name == "ALEInterface":
        return ("ale", obj.cloneState(include_rng=True).serialize())
    if module.startswith("mujoco") and name == "MjData":
        import mujoco

        state = np.empty(mujoco.mj_stateSize(obj.model, mujoco.mjtState.mjSTATE_INTEGRATION))
        mujoco.mj_getState(obj.model, obj, state, mujoco.mjtState.mjSTATE_INTEGRATION)
        derived = [[key, value(array, seen)] for key, array in _mujoco_arrays(obj).items()]
        return ("mujoco", value(state, seen), derived)
    if module.startswith("gymnasium.") and hasattr(obj, "__dict__"):
        return ("object", name, _fields(obj, seen))
    raise Unsaveable(f"{module}.{name}")


def decoded(data: Any, current: Any = None, seen: list | None = None) -> Any:
    """What `value` made data of (`current`: what make_env built in its place); else ValueError."""
    seen = [] if seen is None else seen
    if type(data) in (*RAW, bytes):
        return data
    kind, *rest = data
    if kind == "bytes":
        return b""
    if kind == "same":
        earlier = seen[rest[0]]
        return KEEP if callable(earlier) else earlier
    index = len(seen)
    seen.append(None)
    if kind in ("array", "scalar"):
        dtype, shape, raw = rest
        array = np.frombuffer(raw or b"", dtype=np.dtype(dtype)).reshape(shape).copy()
        result = array if kind == "array" else array[()]
    elif kind == "rng":
        bits = type(current.bit_generator) if isinstance(current, np.random.Generator) else np.random.PCG64
        result = np.random.Generator(bits())
        result.bit_generator.state = rest[0]  # ValueError: another kind of generator, or damaged
    elif kind in ("list", "tuple"):
        seen[index] = result = []
        result += [decoded(item, None, seen) for item in rest[0]]
        result = tuple(result) if kind == "tuple" else result
    elif kind == "deque":
        result = collections.deque([decoded(item, None, seen) for item in rest[1]], rest[0])
    elif kind == "dict":
        result = {decoded(k, None, seen): decoded(v, None, seen) for k, v in rest[0]}
    elif kind in ("ale", "mujoco", "object"):
        result = _setter(kind, rest, current, seen)
    else:
        raise ValueError(f"a value of kind {kind!r}")
    seen[index] = result
    return result


def _setter(kind: str, rest: list, current: Any, seen: list) -> Callable[[], None]:
    """What sets a simulator's state or a helper object's fields into `current` (ValueError: not its kind)."""
    module = type(current).__module__
    if kind == "ale" and module.startswith("ale_py"):
        import ale_py

        return functools.partial(current.restoreState, ale_py.ALEState(rest[0]))
    if kind == "object" and type(current).__name__ == rest[0] and module.startswith("gymnasium."):
        return functools.partial(_assign, current, _unfields(current, rest[1], seen))
    if kind != "mujoco" or not module.startswith("mujoco"):
        raise ValueError(f"a state of kind {kind!r} for {type(current).__name__}")
    import mujoco

    state, integration = decoded(rest[0], None, seen), mujoco.mjtState.mjSTATE_INTEGRATION
    if np.shape(state) != (mujoco.mj_stateSize(current.model, integration),):
        raise ValueError("MuJoCo's state has another size: another model")
    derived = {key: decoded(data, None, seen) for key, data in rest[1]}

    def set_state() -> None:  # what the last step derived (where it fits), then the state
        for key, array in _mujoco_arrays(current).items():
            if np.shape(derived.get(key)) == array.shape:
                np.copyto(array, derived[key])
        mujoco.mj_setState(current.model, current, state, integration)

    return set_state


def _mujoco_arrays(data: Any) -> dict[str, np.ndarray]:
    """MjData's float arrays (its state and what the last step derived from it, which an env may read), never its
    index arrays: numbers from a file must never index memory."""
    arrays = {}
    for key in dir(data):
        with contextlib.suppress(Exception):  # some properties raise where unused
            if not key.startswith("_") and getattr(data, key).dtype.kind == "f":
                arrays[key] = getattr(data, key)
    return arrays


def _fields(obj: Any, seen: dict[int, tuple]) -> list:
    """[name, value] of each attribute that is state, not a constant or what make_env builds."""
    return [
        [name, value(field, seen)] for name, field in vars(obj).items() if name not in NOT_TAKEN and not _rebuilt(field)
    ]


def _unfields(obj: Any, fields: list, seen: list) -> dict[str, Any]:
    """The values `fields` gives obj's attributes."""
    return {name: decoded(data, vars(obj).get(name, getattr(type(obj), name, None)), seen) for name, data in fields}


def _rebuilt(value: Any) -> bool:
    return isinstance(value, REBUILT) or type(value).__name__ == "MjModel"


def _assign(obj: Any, values: dict[str, Any]) -> None:
    for name, field in values.items():
        if callable(field):  # a state set in place (`_setter`)
            field()
        elif field is not KEEP:
            vars(obj)[name] = field
