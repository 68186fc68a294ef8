"""How a SubprocVecEnv is built with its default layout (num_workers=None): no env code runs in the
calling process before the user asks, every wait in construction is bounded, the choice is said,
scripts without a main guard get one clear message, and large observations cost what copying them
costs."""

from __future__ import annotations

import functools
import math
import os
import subprocess
import sys
import time

import gymnasium as gym
import numpy as np
import pytest

from common.multiprocessing_env import SubprocVecEnv, WorkerError, WorkerTimeout
from common.vecenv import layout, pools, process_control
from tests.envs import FailsLater, FaultyEnv, LargeObsEnv, RecordsWhereEnv, SlowToSampleEnv, failing_factory
from tests.helpers import REPO, alive, descendants, descendants_with_helpers_running


def built_in(folder) -> list[int]:
    """The pids of the processes the envs were built in, one per build, in the order of the builds."""
    builds = sorted((int(name.split("-")[1]), int(name.split("-")[0])) for name in os.listdir(folder))
    return [pid for _, pid in builds]


@pytest.fixture
def two_cores(monkeypatch):
    """The layout is decided for 2 cores (this machine's, and CI's), whatever the machine running
    the test has."""
    monkeypatch.setattr(process_control, "cores", lambda: 2)


def test_an_env_from_elsewhere_is_built_in_a_probe_and_stepped_in_workers(tmp_path, two_cores):
    """Not one of gymnasium's own envs: built once in a probe process (never here), not stepped
    there, and stepped in one worker per core."""
    env_fns = [functools.partial(RecordsWhereEnv, str(tmp_path))] * 4
    with SubprocVecEnv(env_fns) as envs:
        assert envs.num_workers == 2 and envs.step_seconds is None
        assert envs.placement == "4 envs in 2 worker processes"
        assert "RecordsWhereEnv, not one of gymnasium's own envs; workers bound its waits" in envs.layout
        probe, *builds = built_in(tmp_path)
        assert probe != os.getpid() and not alive(probe) and set(builds) == set(envs.worker_pids)


def test_gymnasiums_own_cheap_envs_step_here(two_cores):
    with SubprocVecEnv([lambda: gym.make("CartPole-v1")] * 8) as envs:
        assert envs.num_workers == 0 and envs.placement == "8 envs in this process"
        assert envs.step_seconds < 1e-3 and "workers would save" in envs.layout
        assert "(gymnasium's CartPoleEnv; one step" in envs.layout and "us of CPU in a probe process" in envs.layout


def test_gymnasiums_own_envs_get_workers_where_they_save_more_than_their_round_trip(two_cores, monkeypatch):
    monkeypatch.setattr(layout, "ROUND_TRIP", 1e-9)
    with SubprocVecEnv([lambda: gym.make("CartPole-v1")] * 8) as envs:
        assert envs.num_workers == 2 and "workers save" in envs.layout


@pytest.mark.parametrize(
    ("trusted", "step", "n", "cores", "workers"),
    [
        # workers would save 4 steps of 1 unit (10 us of the 10 us reference): under 20 units
        (True, 10e-6, 8, 2, 0),
        (True, 10e-6, 8, 1, 0),  # one core: nothing to spread
        (True, 10e-6, 1, 2, 0),  # one env: nothing to spread
        (True, 60e-6, 8, 2, 2),  # 4 steps of 6 units saved: over 20 units, workers
        (True, 1e-3, 8, 2, 2),  # 4 steps of 100 units saved: workers
        # a step slower than the probe waits for: a worker per env, at most one per core
        (True, math.inf, 8, 16, 8),
        (False, None, 8, 2, 2),  # not gymnasium's own: workers, however cheap
        (False, None, 1, 1, 1),  # ... even one env on one core
    ],
)
def test_the_decision_rule(trusted, step, n, cores, workers):
    assert layout.decide({"trusted": trusted, "step": step, "reference": 10e-6}, n, cores)[0] == workers
    assert layout.decide(None, n, cores)[0] == min(n, cores)  # the probe failed: workers report it


def test_the_probe_times_the_step_not_the_drawing_of_actions():
    """A trainer's actions come from its policy: an env whose space takes 1 ms to sample and no time
    to step is timed at its step (well under 1 ms), not at 1 ms a step, which would make stepping it
    in workers look worth it."""
    assert layout.cpu_per_step(SlowToSampleEnv())[0] < 0.3e-3


def test_a_build_that_hangs_in_the_probe_is_a_timeout_naming_the_env(tmp_path):
    before = descendants_with_helpers_running()
    start = time.monotonic()
    with pytest.raises(WorkerTimeout, match=r"env 2 did not answer 'make' within 1.5 s \(in the layout probe\)"):
        SubprocVecEnv([functools.partial(RecordsWhereEnv, str(tmp_path), hang="make")] * 3, max_wait=1.5)
    # the probe's start (bounded at 60 s) and the 1.5 s make bound; under the suite's load the start
    # alone took 4 s
    assert time.monotonic() - start < 30
    assert not descendants() - before  # the probe is gone


@pytest.mark.parametrize("trusted", [False, True])
def test_an_env_whose_step_takes_an_hour_lets_the_constructor_return(tmp_path, trusted, monkeypatch, two_cores):
    """The probe never waits for a step to finish: an env it does not trust is not stepped there,
    and one it trusts (tests.envs counted as gymnasium's own here) is given STEP_DECIDE seconds,
    then gets workers."""
    if trusted:
        monkeypatch.setattr(layout, "TRUSTED", (*layout.TRUSTED, "tests.envs"))
        monkeypatch.setattr(layout, "STEP_DECIDE", 1.0)
    before = descendants_with_helpers_running()
    start = time.monotonic()
    envs = SubprocVecEnv([functools.partial(RecordsWhereEnv, str(tmp_path), hang="step")] * 2)
    assert time.monotonic() - start < 15 and envs.num_workers == 2
    assert ("a step took over 1 s in a probe process" in envs.layout) == trusted
    probe = built_in(tmp_path)[0]
    assert probe not in envs.worker_pids and not alive(probe)  # ended, in the middle of its step
    envs.close(timeout=0.5)
    assert not descendants() - before  # the probe, the workers, the forkserver: all gone


@pytest.mark.parametrize(
    ("fault", "message"), [("raise", "env 1 raised ValueError: boom at step 3"), ("sigkill", "was killed by SIGKILL")]
)
def test_an_env_that_fails_steps_in_a_worker_and_fails_there(fault, message):
    env_fns = [FaultyEnv, functools.partial(FaultyEnv, fault, 3)]
    with SubprocVecEnv(env_fns) as envs:
        assert envs.num_workers >= 1
        envs.reset(seed=0)
        envs.step(np.zeros(2, np.int64))
        envs.step(np.zeros(2, np.int64))
        with pytest.raises(WorkerError, match=message):
            envs.step(np.zeros(2, np.int64))


@pytest.mark.parametrize(
    ("fault", "error", "message"),
    [
        ("hang", WorkerTimeout, r"envs \[2, 3\] did not answer 'step' within 3 s \(worker 1\)"),
        ("segfault", WorkerError, r"worker 1 \(pid \d+, envs \[2, 3\]\) was killed by SIGSEGV"),
        ("exit", WorkerError, r"worker 1 \(pid \d+, envs \[2, 3\]\) exited with code 3"),
    ],
)
def test_an_env_of_yours_that_fails_late_is_named_never_a_hang_or_a_crash_here(fault, error, message, two_cores):
    """A cheap env of yours, with default arguments: it steps in workers, so a hang at its 2000th
    step is a timeout and a segfault or an exit a named WorkerError, and this process goes on."""
    env_fns = [FaultyEnv] * 3 + [functools.partial(FailsLater, fault, 2000)]
    with SubprocVecEnv(env_fns, max_wait=3.0) as envs:
        envs.reset(seed=0)
        with pytest.raises(error, match=message):
            for _ in range(2000):
                envs.step(np.zeros(4, np.int64))


def test_an_env_the_probe_cannot_build_fails_in_the_workers_with_its_own_error():
    with pytest.raises(WorkerError, match="env 0 raised RuntimeError: factory refused to build the env"):
        SubprocVecEnv([failing_factory] * 2)


def test_a_worker_that_starts_and_fails_in_one_breath_is_named(monkeypatch):
    """This process wakes late (a loaded machine): a worker's "started" and its build's error are
    read together."""
    wait = pools.WorkerPool._wait_for_events

    def late(self, deadline, spin):
        time.sleep(0.3)
        return wait(self, deadline, spin)

    monkeypatch.setattr(pools.WorkerPool, "_wait_for_events", late)
    with pytest.raises(WorkerError, match="env [01] raised RuntimeError: factory refused to build the env"):
        SubprocVecEnv([failing_factory] * 2, num_workers=2)


SCRIPT = """
import sys
sys.path.insert(0, {repo!r})
from common.multiprocessing_env import SubprocVecEnv
from tests.envs import make_counter
{body}
"""
UNGUARDED = "envs = SubprocVecEnv([make_counter] * 2, num_workers=2{context})\nprint(envs.reset(seed=0)[0].shape)"
GUARDED = "def main():\n    " + UNGUARDED.replace("\n", "\n    ") + "\n\nif __name__ == '__main__':\n    main()"


@pytest.mark.parametrize(
    ("body", "context", "ok"), [(UNGUARDED, "", False), (GUARDED, "", True), (UNGUARDED, ", context='fork'", True)]
)
def test_a_script_without_a_main_guard_is_told_what_to_change(tmp_path, body, context, ok):
    """Workers started by forkserver or spawn import the main script again: top-level code that
    builds a vec env would fail in each of them, each printing a traceback. Such a script is told
    before any worker starts, in a few lines whose last says what to change; with fork, it runs."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(repo=str(REPO), body=body.format(context=context)))
    out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    if ok:
        assert out.returncode == 0 and out.stdout.strip() == "(2, 3)", out.stderr
        return
    assert out.returncode == 1 and len(out.stderr.splitlines()) <= 15, out.stderr  # one traceback, the trainer's
    assert out.stderr.strip().splitlines()[-1] == (
        f'common.vecenv.errors.WorkerError: no worker was started: {script} has no `if __name__ == "__main__":` '
        "and worker processes start by importing it: put the code that builds the envs under that line, or give "
        "context='fork' (docs/vecenv.md)"
    )


@pytest.mark.parametrize("shared_memory", [True, False])
def test_a_large_observation_steps_exactly(shared_memory):
    """20 MB observations (their space's bounds alone pickle as 80 MB): built and stepped, in
    workers, both ways."""
    env_fns = [functools.partial(LargeObsEnv, 20_000_000)] * 2
    with SubprocVecEnv(env_fns, num_workers=2, shared_memory=shared_memory) as envs:
        assert envs.single_observation_space.shape == (20_000_000,)
        obs, _ = envs.reset(seed=0)
        for _ in range(3):
            obs, *_ = envs.step(np.zeros(2, np.int64))
        assert obs.shape == (2, 20_000_000) and (obs[:, :1000] == 3).all() and not obs[:, 1000:].any()
        assert envs.observation_space.shape == (2, 20_000_000)


def test_mismatched_large_spaces_are_named():
    env_fns = [functools.partial(LargeObsEnv, 1000), functools.partial(LargeObsEnv, 1001)]
    with pytest.raises(RuntimeError, match=r"env 1 has observation space Box\(0, 255, \(1001,\), uint8\)"):
        SubprocVecEnv(env_fns, num_workers=2)


# A trainer that builds a vec env with default arguments in a fresh process and says where its envs step.
PLACEMENT = """
import sys
sys.path.insert(0, {repo!r})
import gymnasium as gym
from common.multiprocessing_env import SubprocVecEnv
from tests.envs import SlowStepEnv

if __name__ == "__main__":
    cartpole = sys.argv[1] == "cartpole"
    env_fns = [lambda: gym.make("CartPole-v1")] * 16 if cartpole else [lambda: SlowStepEnv(0.002)] * 8
    with SubprocVecEnv(env_fns) as envs:
        print(envs.placement)
"""


@pytest.mark.e2e
def test_the_same_envs_get_the_same_layout_on_a_loaded_machine(tmp_path):
    """Two busy loops load the machine, as on a shared node: 16 CartPoles, and 8 envs of yours whose
    step sleeps 2 ms, each built in 5 fresh processes, step in the same place every time."""
    (tmp_path / "placement.py").write_text(PLACEMENT.format(repo=str(REPO)))
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        for case in ("cartpole", "sleeper"):
            runs = [
                subprocess.run(
                    [sys.executable, "placement.py", case], cwd=tmp_path, capture_output=True, text=True, timeout=120
                )
                for _ in range(5)
            ]
            assert {run.stdout for run in runs} == {runs[0].stdout} and runs[0].returncode == 0, runs[0].stderr
            workers = min(8, len(os.sched_getaffinity(0)))
            expected = "16 envs in this process" if case == "cartpole" else f"8 envs in {workers} worker processes"
            assert runs[0].stdout.strip() == expected
    finally:
        for loop in loops:
            loop.kill()


# A trainer stepping envs that each run a helper program, until it is killed.
STEPPING = """
import sys
sys.path.insert(0, {repo!r})
import functools
import numpy as np
from common.multiprocessing_env import SubprocVecEnv
from tests.envs import HelperEnv

if __name__ == "__main__":
    env_fns = [functools.partial(HelperEnv, helper="exec", step_seconds=0.001)] * 2
    envs = SubprocVecEnv(env_fns, num_workers=2)
    envs.reset(seed=0)
    print(*envs.get_attr("helper_pid"), flush=True)
    while True:
        envs.step(np.zeros(2, np.int64))
"""


@pytest.mark.e2e
def test_the_helpers_of_a_killed_trainers_workers_end_every_time(tmp_path):
    """SIGKILL to a trainer while its workers step (and reply): whatever a worker was doing, it ends
    with its env's helper program, 20 times out of 20."""
    (tmp_path / "stepping.py").write_text(STEPPING.format(repo=str(REPO)))
    rng = np.random.default_rng(0)
    leaked = []
    for _ in range(20):
        proc = subprocess.Popen([sys.executable, "stepping.py"], cwd=tmp_path, stdout=subprocess.PIPE, text=True)
        helpers = [int(pid) for pid in proc.stdout.readline().split()]
        time.sleep(rng.uniform(0.05, 0.3))
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 5
        while [pid for pid in helpers if alive(pid)] and time.monotonic() < deadline:
            time.sleep(0.05)
        leaked += [pid for pid in helpers if alive(pid)]
    for pid in leaked:
        os.kill(pid, 9)
    assert leaked == []
