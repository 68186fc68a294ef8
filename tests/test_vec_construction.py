"""How a SubprocVecEnv is built with its default layout (num_workers=None): no env code runs in the calling process
before the user asks, every wait in construction is bounded, the choice is said, scripts without a main guard get one
clear message, and large observations cost what copying them costs."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from common import layout_choice
from common.multiprocessing_env import SubprocVecEnv, WorkerError, WorkerTimeout
from tests.envs import FaultyEnv, LargeObsEnv, RecordsWhereEnv, SlowToSampleEnv
from tests.helpers import REPO, alive, descendants


def built_in(folder) -> list[int]:
    """The pids of the processes the envs were built in, one per build, in the order of the builds."""
    builds = sorted((int(name.split("-")[1]), int(name.split("-")[0])) for name in os.listdir(folder))
    return [pid for _, pid in builds]


def test_a_costly_env_is_timed_in_a_probe_and_stepped_in_workers(tmp_path):
    """The layout is chosen from the real env's step, timed in a probe process: never built in this process, the
    probe gone once the choice is made, the real step time said, and a 0.5 s step costs the choice about two steps."""
    env_fns = [functools.partial(RecordsWhereEnv, str(tmp_path), 0.5)] * 4
    start = time.monotonic()
    workers, figures = layout_choice.choose(env_fns, 2, 0.0, 60.0)
    assert time.monotonic() - start < 2.5  # the probe's start, a build, a reset and one 0.5 s step
    assert workers == 2 and 0.5 <= figures["step"] < 0.7 and figures["in_process"] is None  # no stand-ins needed
    (probe,) = built_in(tmp_path)
    assert probe != os.getpid() and not alive(probe)
    with SubprocVecEnv(env_fns) as envs:
        assert envs.num_workers == 2 and "one env step 5" in envs.layout and "timed in a probe process" in envs.layout
        assert os.getpid() not in built_in(tmp_path) and set(envs.worker_pids) <= set(built_in(tmp_path))


def test_the_probe_times_the_step_not_the_drawing_of_actions():
    """A trainer's actions come from its policy: an env whose space takes 1 ms to sample and no time to step is timed
    at its step (well under 1 ms), not at 1 ms a step, which would make stepping it in workers look worth it."""
    found = layout_choice.probe(SlowToSampleEnv, 60.0, 0)
    assert found["step"] < 0.3e-3


@pytest.mark.parametrize(("in_process", "in_workers", "chosen"), [(100e-6, 95e-6, 0), (100e-6, 85e-6, 2)])
def test_workers_only_when_clearly_faster(tmp_path, monkeypatch, in_process, in_workers, chosen):
    """Cheap envs: stand-ins like the probed env are timed in both layouts; workers need to be 10% faster. The
    timings are fixed here (what a busy machine measures must not decide a test)."""
    timed = {0: in_process, 2: in_workers}
    monkeypatch.setattr(layout_choice, "measure_layout", lambda n, *like, num_workers, **kw: timed[num_workers])
    with SubprocVecEnv([functools.partial(RecordsWhereEnv, str(tmp_path))] * 4) as envs:
        assert envs.num_workers == chosen and envs.in_process_seconds == in_process
        probe, *builds = built_in(tmp_path)
        assert probe != os.getpid()
        assert (builds == [os.getpid()] * 4) if chosen == 0 else (os.getpid() not in builds)  # only here if here


@pytest.mark.parametrize("phase", ["make", "reset", "step"])
def test_a_hang_in_the_probe_is_a_timeout_naming_the_env(tmp_path, phase):
    before = descendants()
    start = time.monotonic()
    with pytest.raises(WorkerTimeout, match=rf"env 2 did not answer '{phase}' within 1.5 s \(in the layout probe\)"):
        SubprocVecEnv([functools.partial(RecordsWhereEnv, str(tmp_path), hang=phase)] * 3, max_wait=1.5)
    assert time.monotonic() - start < 5
    assert not descendants() - before  # the probe is gone


@pytest.mark.parametrize(("fault", "message"), [("raise", "env 1 raised ValueError: boom at step 3"),
                                                ("sigkill", "was killed by SIGKILL")])  # fmt: skip
def test_an_env_that_fails_early_fails_in_a_worker_not_here(fault, message):
    """The probe steps the env past step 3, where it fails: the choice falls to workers, where the failure is reported
    as any other (this process neither raises nor dies while choosing)."""
    env_fns = [FaultyEnv, functools.partial(FaultyEnv, fault, 3)]
    with SubprocVecEnv(env_fns) as envs:
        assert envs.num_workers == 2 and "the probe env failed" in envs.layout
        envs.reset(seed=0)
        envs.step(np.zeros(2, np.int64))
        envs.step(np.zeros(2, np.int64))
        with pytest.raises(WorkerError, match=message):
            envs.step(np.zeros(2, np.int64))


SCRIPT = """
import sys
sys.path.insert(0, {repo!r})
from common.multiprocessing_env import SubprocVecEnv
from tests.envs import make_counter
{body}
"""
UNGUARDED = "envs = SubprocVecEnv([make_counter] * 2, num_workers=2{context})\nprint(envs.reset(seed=0)[0].shape)"
GUARDED = "def main():\n    " + UNGUARDED.replace("\n", "\n    ") + "\n\nif __name__ == '__main__':\n    main()"


@pytest.mark.parametrize(("body", "context", "ok"), [(UNGUARDED, "", False), (GUARDED, "", True),
                                                     (UNGUARDED, ", context='fork'", True)])  # fmt: skip
def test_a_script_without_a_main_guard_is_told_what_to_change(tmp_path, body, context, ok):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(repo=str(REPO), body=body.format(context=context)))
    out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    if ok:
        assert out.returncode == 0 and out.stdout.strip() == "(2, 3)", out.stderr
        return
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("RuntimeError: train.py, line 6: this top-level code builds a SubprocVecEnv")
    assert 'under `if __name__ == "__main__":` (or pass context="fork")' in last
    assert "WorkerError" not in out.stderr and out.stderr.count("Traceback") == 1


@pytest.mark.parametrize("shared_memory", [True, False])
def test_a_large_observation_steps_exactly(shared_memory):
    """20 MB observations (their space's bounds alone pickle as 80 MB): built and stepped, in workers, both ways."""
    env_fns = [functools.partial(LargeObsEnv, 20_000_000)] * 2
    with SubprocVecEnv(env_fns, num_workers=2, shared_memory=shared_memory) as envs:
        assert envs.single_observation_space.shape == (20_000_000,)
        obs, _ = envs.reset(seed=0)
        for _ in range(3):
            obs, *_ = envs.step(np.zeros(2, np.int64))
        assert obs.shape == (2, 20_000_000) and (obs[:, :1000] == 3).all() and not obs[:, 1000:].any()
        assert envs.observation_space.shape == (2, 20_000_000)  # batched when first asked for


def test_mismatched_large_spaces_are_named():
    env_fns = [functools.partial(LargeObsEnv, 1000), functools.partial(LargeObsEnv, 1001)]
    with pytest.raises(RuntimeError, match=r"env 1 has observation space Box\(0, 255, \(1001,\), uint8\)"):
        SubprocVecEnv(env_fns, num_workers=2)
