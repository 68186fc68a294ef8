"""Assertions and process-table helpers shared by the tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np

from common.results import read_scalars  # noqa: F401 - the tests read runs as the sweep's report does

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


def run_command(cmd: list[str], cwd, timeout: float = 300, extra_env: dict | None = None):
    """Runs cmd in its own session: on timeout its whole process group is killed (a hung job leaves nothing behind),
    and the TimeoutExpired carries what it printed."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", **(extra_env or {}))
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        raise subprocess.TimeoutExpired(cmd, timeout, stdout, stderr) from None
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


def run_script(script, args, cwd, timeout=300, extra_env=None):
    """Runs a script as a user would: a subprocess with a list argv, an absolute path and its own cwd."""
    return run_command([sys.executable, str(script), *map(str, args)], cwd, timeout, extra_env)


def only_run_dir(cwd) -> Path:
    runs = list((Path(cwd) / "runs").iterdir())
    assert len(runs) == 1, runs
    return runs[0]


def become_subreaper() -> None:
    """Makes this process adopt its orphaned descendants (Linux), so that `descendants()` sees a grandchild whose
    parent exited: a test then finds every process a run left behind, not only its direct children's."""
    import ctypes

    PR_SET_CHILD_SUBREAPER = 36
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def leftovers(before: set[int], within: float = 5.0) -> set[int]:
    """Descendants of this process, not in `before`, still alive after up to `within` seconds."""
    import time

    deadline = time.monotonic() + within
    while (left := descendants() - before) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left
