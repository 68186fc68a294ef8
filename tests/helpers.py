"""Assertions and process-table helpers shared by the tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent


def assert_same(actual, expected, path: str = "result") -> None:
    """Deep equality that also checks array dtypes and shapes, dict keys and object-array contents."""
    if isinstance(expected, dict):
        assert isinstance(actual, dict), f"{path}: {type(actual)} is not a dict"
        assert actual.keys() == expected.keys(), f"{path}: keys {sorted(actual)} != {sorted(expected)}"
        for key in expected:
            assert_same(actual[key], expected[key], f"{path}[{key!r}]")
    elif isinstance(expected, (tuple, list)):
        assert type(actual) is type(expected) and len(actual) == len(expected), f"{path}: {actual!r} != {expected!r}"
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            assert_same(a, e, f"{path}[{i}]")
    elif isinstance(expected, np.ndarray):
        assert isinstance(actual, np.ndarray), f"{path}: {type(actual)} is not an ndarray"
        assert actual.dtype == expected.dtype, f"{path}: dtype {actual.dtype} != {expected.dtype}"
        assert actual.shape == expected.shape, f"{path}: shape {actual.shape} != {expected.shape}"
        if expected.dtype == object:
            for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
                assert_same(a, e, f"{path}[{i}]")
        else:
            np.testing.assert_array_equal(actual, expected, err_msg=path)
    else:
        assert type(actual) is type(expected) and actual == expected, f"{path}: {actual!r} != {expected!r}"


def alive(pid: int) -> bool:
    """True if `pid` runs (a zombie counts as dead: it has exited and only waits to be reaped)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def descendants(root: int | None = None) -> set[int]:
    """Live descendants of `root` (default: this process), read from /proc."""
    root = os.getpid() if root is None else root
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (FileNotFoundError, ProcessLookupError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, stack = set(), [root]
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in found and alive(child):
                found.add(child)
                stack.append(child)
    return found


def read_scalars(run_dir) -> dict[str, list[tuple[int, float]]]:
    """Every scalar TensorBoard logged under `run_dir`: tag -> [(step, value), ...]."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def run_script(script, args, cwd, timeout=300, extra_env=None):
    """Runs a script as a user would: a subprocess with a list argv, an absolute path and its own cwd."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", **(extra_env or {}))
    return subprocess.run(
        [sys.executable, str(script), *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def only_run_dir(cwd) -> Path:
    runs = list((Path(cwd) / "runs").iterdir())
    assert len(runs) == 1, runs
    return runs[0]
