"""Small deterministic envs for the vec env tests. Module-level so every start method can import them."""

from __future__ import annotations

import faulthandler
import os
import signal
import subprocess
import sys
import threading
import time

import gymnasium as gym
import numpy as np


class CounterEnv(gym.Env):
    """Counts steps. Terminates on step `terminate_at` when the action sum says so, truncates via TimeLimit.

    Infos change type and presence from step to step so that info batching and masks get exercised.
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 30}

    def __init__(self, terminate_at: int = 5, render_mode: str | None = None):
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
        self.action_space = gym.spaces.Discrete(3)
        self.terminate_at = terminate_at
        self.render_mode = render_mode
        self.t = 0
        self.resets = 0
        self.tag = 0

    def _obs(self) -> np.ndarray:
        return np.array([self.t, self.resets, self.np_random.random()], dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self.resets += 1
        info = {"resets": self.resets}
        if options:
            info["options"] = dict(options)
        return self._obs(), info

    def step(self, action):
        self.t += 1
        terminated = self.t >= self.terminate_at and int(action) == 2
        info = {"t": self.t}
        if self.t % 2:
            info["odd"] = True
            info["array"] = np.full(2, self.t, dtype=np.int16)
        if self.t % 3 == 0:
            info["nested"] = {"third": self.t / 3}
        return self._obs(), float(self.t * int(action)), terminated, False, info

    def render(self):
        return np.full((2, 2, 3), self.t, dtype=np.uint8)

    def bump(self, amount: int) -> int:
        self.tag += amount
        return self.tag


def make_counter(terminate_at: int = 5, max_episode_steps: int = 7):
    return gym.wrappers.TimeLimit(CounterEnv(terminate_at), max_episode_steps=max_episode_steps)


class DictObsEnv(CounterEnv):
    """Dict and Tuple observation spaces, with every kind of leaf shared memory can hold."""

    def __init__(self):
        super().__init__(terminate_at=4)
        self.observation_space = gym.spaces.Dict(
            {
                "pos": gym.spaces.Box(-10, 10, (2,), np.float64),
                "mode": gym.spaces.Discrete(4),
                "more": gym.spaces.Tuple((gym.spaces.MultiBinary(3), gym.spaces.MultiDiscrete([5, 5]))),
            }
        )

    def _obs(self):
        r = self.np_random.integers(0, 2, 3).astype(np.int8)
        return {
            "pos": np.array([self.t, self.np_random.random()]),
            "mode": int(self.t % 4),
            "more": (r, np.array([self.t % 5, self.resets % 5])),
        }


class TextObsEnv(CounterEnv):
    """A space shared memory cannot hold: observations must travel over the pipe."""

    def __init__(self):
        super().__init__(terminate_at=3)
        self.observation_space = gym.spaces.Text(8)

    def _obs(self):
        return f"t{self.t}r{self.resets}"


class SequenceObsEnv(CounterEnv):
    """Observations of varying length, which do not flatten to a Box."""

    def __init__(self):
        super().__init__(terminate_at=3)
        self.observation_space = gym.spaces.Sequence(gym.spaces.Discrete(3))

    def _obs(self):
        return tuple(range(self.t % 3))


gym.register("SequenceObs-v0", entry_point=SequenceObsEnv, max_episode_steps=10)
gym.register("DictObs-v0", entry_point=DictObsEnv, max_episode_steps=10)


class OddError(Exception):
    """An exception whose constructor needs two arguments: rebuilding it from one string would fail."""

    def __init__(self, code: int, detail: str):
        super().__init__(code, detail)
        self.code = code
        self.detail = detail


class FaultyEnv(CounterEnv):
    """Fails in a chosen way at a chosen step (0 = in reset)."""

    def __init__(self, fault: str | None = None, at: int = 3, terminate_at: int = 50):
        super().__init__(terminate_at=terminate_at)
        self.fault, self.at = fault, at

    def _maybe_fail(self):
        if self.fault is not None and self.t == self.at:
            self._fail()

    def _fail(self):
        if self.fault == "raise":
            raise ValueError(f"boom at step {self.t}")
        if self.fault == "odd":
            raise OddError(7, "needs two arguments")
        if self.fault == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        if self.fault == "abort":
            faulthandler.disable()  # pytest's faulthandler would print the worker's stack: an abort on purpose
            os.abort()
        if self.fault == "exit":
            os._exit(3)
        if self.fault == "hang":
            time.sleep(3600)
        if self.fault == "slow":
            time.sleep(1)

    def reset(self, *, seed=None, options=None):
        out = super().reset(seed=seed, options=options)
        self._maybe_fail()
        return out

    def step(self, action):
        out = super().step(action)
        self._maybe_fail()
        return out

    def explode(self):
        raise KeyError("called explode")


def failing_factory():
    raise RuntimeError("factory refused to build the env")


class ConstantRewardEnv(gym.Env):
    """Reward 1 every step, never terminates: only the time limit cuts episodes, so V = 1 / (1 - gamma)."""

    observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.observation_space.sample() * 0, {}

    def step(self, action):
        return np.zeros(2, np.float32), 1.0, False, False, {}


# Registered on import: `--env-id tests.envs:ConstantReward-v0` imports this module in the trainer
# and every worker.
gym.register("ConstantReward-v0", entry_point=ConstantRewardEnv, max_episode_steps=5)


class ScriptedFaultEnv(gym.Env):
    """CartPole-sized env for end-to-end fault tests, steered by environment variables (they reach
    every worker):

    PPO_VEC_TEST_PIDS: a folder where each env records the pid of the process it lives in;
    PPO_VEC_TEST_FAULT: "KIND:STEP:MARKER" - at its STEP-th step, the first env to get there (it
    creates the file MARKER) fails: KIND is raise, sigkill, hang or nan (observations turn NaN from
    then on, in every env).
    """

    observation_space = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self):
        if os.environ.get("PPO_VEC_TEST_PIDS"):
            open(os.path.join(os.environ["PPO_VEC_TEST_PIDS"], str(os.getpid())), "w").close()
        kind, step, self.marker = (os.environ.get("PPO_VEC_TEST_FAULT") or "none:0:").split(":", 2)
        self.kind, self.fault_step, self.steps = kind, int(step), 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.np_random.normal(size=4).astype(np.float32), {}

    def step(self, action):
        self.steps += 1
        obs = self.np_random.normal(size=4).astype(np.float32)
        if self.kind == "nan" and self.steps >= self.fault_step:
            obs[:] = np.nan
        elif self.kind != "none" and self.steps == self.fault_step and self._first_to_fail():
            FaultyEnv(self.kind, 0)._fail()
        return obs, float(action), bool(self.np_random.random() < 0.05), False, {}

    def _first_to_fail(self) -> bool:
        try:
            # atomic: exactly one env across workers wins
            os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL))
            return True
        except FileExistsError:
            return False


gym.register("ScriptedFault-v0", entry_point=ScriptedFaultEnv, max_episode_steps=200)


class CloseRaisesEnv(ConstantRewardEnv):
    """An env whose close() raises: closing is best effort everywhere, so a run still ends normally."""

    def close(self):
        raise RuntimeError("close() failed")


gym.register("CloseRaises-v0", entry_point=CloseRaisesEnv, max_episode_steps=20)


class SlowToBuildEnv(ScriptedFaultEnv):
    """ScriptedFaultEnv that takes 3 s to build (a simulator starting up)."""

    def __init__(self):
        super().__init__()
        time.sleep(3)


gym.register("SlowToBuild-v0", entry_point=SlowToBuildEnv, max_episode_steps=200)


class HelperEnv(FaultyEnv):
    """A FaultyEnv that starts a helper process when built, as simulators and env servers do: a
    forked copy of the worker (holding every file it has open, the worker's pipe included) or an
    exec'd program. `helper_pid` says which process it is."""

    def __init__(self, fault: str | None = None, at: int = 3, helper: str = "fork", step_seconds: float = 0.0):
        super().__init__(fault, at)
        self.step_seconds = step_seconds
        if helper == "fork":
            pid = os.fork()
            if pid == 0:  # the helper: sleeps until it is ended
                time.sleep(3600)
                os._exit(0)
            self.helper_pid = pid
        else:
            self.helper_pid = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"]).pid
        if os.environ.get("PPO_VEC_TEST_PIDS"):  # where the end-to-end tests look for what outlived a run
            open(os.path.join(os.environ["PPO_VEC_TEST_PIDS"], f"helper-{self.helper_pid}"), "w").close()

    def step(self, action):
        time.sleep(self.step_seconds)  # a costly step: the default layout spreads such envs over workers
        return super().step(action)


gym.register("HelperExec-v0", entry_point=HelperEnv, kwargs={"helper": "exec"}, max_episode_steps=200)
gym.register("HelperFork-v0", entry_point=HelperEnv, kwargs={"helper": "fork"}, max_episode_steps=200)


class HangsWhenBuilt(CounterEnv):
    """Never finishes building (a simulator that waits forever for a licence server)."""

    def __init__(self):
        time.sleep(3600)


class HangsWhenRebuilt(FaultyEnv):
    """Raises at step 2; every later build of it (a restart's) hangs. MARKER: a path that records
    the first build."""

    def __init__(self, marker: str):
        super().__init__("raise", 2)
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            time.sleep(3600)


class ScalarObsEnv(CounterEnv):
    """Returns a scalar where its space says (3,): an env bug that must not be broadcast away."""

    def _obs(self):
        return np.float32(self.t)


class SlowStepEnv(CounterEnv):
    """Each step takes `seconds` (an env worth stepping in worker processes)."""

    def __init__(self, seconds: float):
        super().__init__(terminate_at=10**9)
        self.seconds = seconds

    def step(self, action):
        time.sleep(self.seconds)
        return super().step(action)


gym.register("SlowStep-v0", entry_point=SlowStepEnv, kwargs={"seconds": 0.002}, max_episode_steps=200)


class Paced(gym.Wrapper):
    """One of gymnasium's envs whose every step takes `seconds` more (it sleeps): a run of it lasts
    as long on a fast machine as on a slow one, and a signal sent while it trains lands before it
    ends. Its state is data, so a checkpoint keeps it."""

    pickle_state = True

    def __init__(self, env: gym.Env, seconds: float = 0.001):
        super().__init__(env)
        self.seconds = seconds

    def step(self, action):
        time.sleep(self.seconds)
        return self.env.step(action)


def paced(name: str, seconds: float = 0.001, **kwargs) -> gym.Env:
    return Paced(gym.make(name, **kwargs).unwrapped, seconds)


gym.register("PacedCartPole-v1", entry_point=paced, kwargs={"name": "CartPole-v1"}, max_episode_steps=500)
# a run of minutes that mostly sleeps: a time limit's test trains a few CPU seconds
SLOW = {"name": "CartPole-v1", "seconds": 0.008}
gym.register("SlowCartPole-v1", entry_point=paced, kwargs=SLOW, max_episode_steps=500)
gym.register("PacedPendulum-v1", entry_point=paced, kwargs={"name": "Pendulum-v1"}, max_episode_steps=200)


class SlowToSample(gym.spaces.Discrete):
    """A Discrete space whose sample() takes a millisecond (a large or structured space in place of
    a trainer's policy): what an env's step is timed with must not count it."""

    def sample(self, *args, **kwargs):
        time.sleep(1e-3)
        return super().sample(*args, **kwargs)


class SlowToSampleEnv(CounterEnv):
    """A CounterEnv whose actions are slow to sample and cheap to step."""

    def __init__(self):
        super().__init__(terminate_at=10**9)
        self.action_space = SlowToSample(3)


class LargeObsEnv(gym.Env):
    """A `size`-byte uint8 observation (an image env's, much larger): construction and steps must
    cost what copying it costs. The observation is filled with the step count."""

    action_space = gym.spaces.Discrete(2)

    def __init__(self, size: int = 50_000_000):
        self.observation_space = gym.spaces.Box(0, 255, (size,), np.uint8)
        self.obs, self.t = np.zeros(size, np.uint8), 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self.obs[:] = 0
        return self.obs, {}

    def step(self, action):
        self.t += 1
        self.obs[:1000] = self.t % 256  # a changing corner is enough to check the copy
        return self.obs, 0.0, False, False, {}


class RecordsWhereEnv(CounterEnv):
    """A CounterEnv that notes the pid of each process it is built in (a file per build in `folder`) and takes
    `step_seconds` per step."""

    def __init__(self, folder: str, step_seconds: float = 0.0, hang: str | None = None):
        if hang == "make":
            time.sleep(3600)
        super().__init__(terminate_at=10**9)
        self.step_seconds, self.hang = step_seconds, hang
        with open(os.path.join(folder, f"{os.getpid()}-{time.monotonic_ns()}"), "w"):
            pass

    def reset(self, *, seed=None, options=None):
        if self.hang == "reset":
            time.sleep(3600)
        return super().reset(seed=seed, options=options)

    def step(self, action):
        time.sleep(3600 if self.hang == "step" else self.step_seconds)
        return super().step(action)


# Breakout on rank 0 and an env that cannot be built on any other rank (torchrun sets RANK): a
# rank-local failure at start-up, which that rank alone can report.
gym.register(
    "BreakoutOnRank0-v0",
    entry_point="ale_py.env:AtariEnv",
    kwargs={
        "game": "breakout" if os.environ.get("RANK", "0") == "0" else "no_such_game",
        "frameskip": 1,
        "repeat_action_probability": 0.0,
        "max_num_frames_per_episode": 108000,
    },
)


class FailsLater(CounterEnv):
    """A cheap env (a CartPole's cost) that fails at the `at`-th step of its life, over episodes:
    long after any probe or first steps would have seen it. `fault`: hang, segfault or exit."""

    def __init__(self, fault: str = "segfault", at: int = 2000):
        super().__init__(terminate_at=50)
        self.fault, self.at, self.life = fault, at, 0

    def step(self, action):
        self.life += 1
        if self.life == self.at:
            if self.fault == "segfault":
                import ctypes

                ctypes.string_at(0)  # reads address 0: SIGSEGV
            FaultyEnv(self.fault, 0)._fail()
        return super().step(action)


for _fault in ("hang", "segfault", "exit"):
    gym.register(f"FailsLater-{_fault}-v0", entry_point=FailsLater, kwargs={"fault": _fault}, max_episode_steps=200)


class OldApiEnv(gym.Env):
    """An env written for gym before 0.26: reset() without a seed, returning the observation alone;
    a 4-tuple step."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self):
        return np.zeros(2, np.float32)

    def step(self, action):
        return np.zeros(2, np.float32), 1.0, False, {}


gym.register("OldApi-v0", entry_point=OldApiEnv, max_episode_steps=10)


class LivesEnv(gym.Env):
    """Every step ends an episode, but only every third one says "episode" (a game over after two
    lost lives)."""

    observation_space, action_space = gym.spaces.Discrete(1), gym.spaces.Discrete(1)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = getattr(self, "t", 0)
        return 0, {}

    def step(self, action):
        self.t += 1
        return 0, 1.0, True, False, {"episode": {"r": float(self.t)}} if self.t % 3 == 0 else {}


gym.register("Lives-v0", entry_point=LivesEnv)


class SavedCounterEnv(CounterEnv):
    """A user's env whose attributes are its whole state, and data: a checkpoint keeps it."""

    pickle_state = True


class SavedDictObsEnv(DictObsEnv):
    pickle_state = True


class HoldsAnObjectEnv(SavedCounterEnv):
    """Says its state is data, but holds an object no checkpoint takes (a simulator of its own)."""

    def __init__(self):
        super().__init__()
        self.world = threading.Lock()


class ScalarActionEnv(CounterEnv):
    """A Box action of shape (): not one ppo_vec.py's policy gives."""

    def __init__(self):
        super().__init__()
        self.action_space = gym.spaces.Box(-1.0, 1.0, (), np.float32)

    def step(self, action):
        return super().step(2)


class ScalarBoxObsEnv(CounterEnv):
    """Observations of shape (): one number."""

    def __init__(self):
        super().__init__()
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (), np.float32)

    def _obs(self):
        return np.float32(self.t)


gym.register("ScalarAction-v0", entry_point=ScalarActionEnv, max_episode_steps=10)
gym.register("ScalarBoxObs-v0", entry_point=ScalarBoxObsEnv, max_episode_steps=10)


class NoneInfoEnv(CounterEnv):
    """Its reset returns (obs, None): an env bug, not the old gym API."""

    def reset(self, *, seed=None, options=None):
        return super().reset(seed=seed)[0], None


gym.register("NoneInfo-v0", entry_point=NoneInfoEnv, max_episode_steps=10)
