"""common/experiment.py, piece by piece: flag checks, run folders, checkpoint files, the stop path and exit statuses."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import textwrap
import time

import gymnasium as gym
import numpy as np
import pytest
import torch

from common import experiment
from common.experiment import Checkpoints, FlagError, RunError
from tests.envs import HangsWhenBuilt, failing_factory
from tests.helpers import REPO, run_command


@dataclasses.dataclass
class Flags:
    exp_name: str = "exp"
    env_id: str = "CartPole-v1"
    seed: int = 1
    gamma: float = 0.99
    num_envs: int = 4
    num_steps: int = 8
    target_kl: float | None = None


# ---------------------------------------------------------------------------------------------------- flag checks
@pytest.mark.parametrize(
    ("changes", "rules", "message"),
    [
        ({"gamma": float("nan")}, [], "--gamma must be a finite number, got nan"),
        ({"target_kl": float("inf")}, [], "--target-kl must be a finite number, got inf"),
        ({"gamma": 1.5}, [], "--gamma must be in (0, 1], got 1.5"),
        ({"seed": -1}, [], "--seed must be >= 0, got -1"),
        ({"exp_name": "a/b"}, [], "--exp-name must be a plain name (no '/', not '.' or '..'), got a/b"),
        ({"exp_name": ".."}, [], "--exp-name must be a plain name"),
        ({"num_envs": 0}, [("num_envs", False, ">= 1")], "--num-envs must be >= 1, got 0"),
    ],
)
def test_check_flags_names_the_flag_and_what_is_allowed(changes, rules, message):
    with pytest.raises(FlagError) as info:
        experiment.check_flags(Flags(**changes), rules)
    assert str(info.value).startswith(message)


def test_check_flags_passes_good_flags_and_skips_fields_a_script_lacks():
    experiment.check_flags(Flags(), [("num_envs", True, ">= 1")])  # no learning_rate field: its rule is not applied


def test_check_installed_names_the_extra():
    @dataclasses.dataclass
    class WithVideo:
        capture_video: bool = True

    with pytest.raises(FlagError, match=r"--capture-video needs no_such_module_xyz, .*pip install -e '.\[video\]'"):
        experiment.check_installed(WithVideo(), {"capture_video": ("no_such_module_xyz", "video")})
    experiment.check_installed(WithVideo(False), {"capture_video": ("no_such_module_xyz", "video")})


def test_check_env_id(tmp_path, monkeypatch):
    experiment.check_env_id("CartPole-v1")
    with pytest.raises(FlagError, match=r"'CartPol-v1' is not a registered gymnasium env; did you mean CartPole-v1"):
        experiment.check_env_id("CartPol-v1")
    (tmp_path / "broken_envs.py").write_text("import numpy\nraise RuntimeError('missing licence file')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(FlagError) as info:
        experiment.check_env_id("broken_envs:Thing-v0")  # the module's own error, not "did you mean"
    assert (
        str(info.value)
        == "--env-id broken_envs:Thing-v0: importing broken_envs failed (RuntimeError: missing licence file)"
    )
    with pytest.raises(FlagError, match=r"importing my_envs failed \(ModuleNotFoundError: No module named 'my_envs'\); "
                                        "my_envs must be importable from here: run from the folder that holds it"):
        experiment.check_env_id("my_envs:MyEnv-v0")


def test_probe_env_builds_the_env_elsewhere_and_says_why_it_cannot():
    found = experiment.probe_env("CartPole-v1", lambda: gym.wrappers.FlattenObservation(gym.make("CartPole-v1")), 60)
    assert found["spaces"][0].shape == (4,) and found["spaces"][1] == gym.spaces.Discrete(2)
    with pytest.raises(FlagError, match=r"--env-id X-v0 cannot be built here: RuntimeError: factory refused to build"):
        experiment.probe_env("X-v0", failing_factory, 60)
    with pytest.raises(FlagError, match=r"--env-id X-v0: building the env did not finish within 1 s"):
        experiment.probe_env("X-v0", HangsWhenBuilt, 1.0)


# ---------------------------------------------------------------------------------------------------- run folders
def test_run_dirs_are_unique_within_one_second(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(time, "time", lambda: 1_700_000_000.5)
    args = Flags(env_id="ALE/Breakout-v5")
    first, second, third = (experiment.make_run_dir(args) for _ in range(3))
    assert first.name == "ALE-Breakout-v5__exp__1__1700000000"
    assert [second.name, third.name] == [f"{first.name}-2", f"{first.name}-3"]
    assert all(path.is_dir() and path.parent.name == "runs" for path in (first, second, third))


def test_progress_line_shows_elapsed_and_eta_as_hms(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(time, "time", lambda: now[0])
    progress = experiment.Progress(total_steps=1_000_000, first_step=10_000)
    now[0] += 3725.0  # 1 h 2 min 5 s later, 372,500 steps done: 100 steps/s, 6175 s left
    line = progress.line(382_500, [1.0, 2.0], {"env": 0.5, "update": 0.25})
    assert line == (
        "global_step=382500/1000000 SPS=100 episodic_return=1.5 (last 2) elapsed=1:02:05 ETA=1:42:55 "
        "[env 0.50s, update 0.25s]"
    )
    assert experiment.hms(0) == "0:00:00" and experiment.hms(86399) == "23:59:59"


# ---------------------------------------------------------------------------------------------------- checkpoints
def test_checkpoint_round_trip(tmp_path):
    path = tmp_path / "checkpoint.pt"
    state = {"script": "s.py", "model": {"w": torch.arange(4.0)}, "rng": [np.random.default_rng(3).bit_generator.state]}
    experiment.save_checkpoint(path, state)
    loaded = experiment.load_checkpoint(str(path), "--resume", "s.py")
    torch.testing.assert_close(loaded["model"]["w"], torch.arange(4.0))
    assert loaded["rng"] == state["rng"]
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]


class Unpicklable:
    def __reduce__(self):
        raise RuntimeError("cannot pickle this")


def test_a_failed_write_leaves_the_old_checkpoint_and_no_temp_file(tmp_path):
    path = tmp_path / "checkpoint.pt"
    experiment.save_checkpoint(path, {"script": "s.py", "value": torch.ones(3)})
    before = path.read_bytes()
    with pytest.raises(RunError, match=r"could not write .*checkpoint.pt \(cannot pickle this\); the previous file"):
        experiment.save_checkpoint(path, {"script": "s.py", "value": torch.zeros(3), "bad": Unpicklable()})
    with pytest.raises(RunError, match="holds NaN/Inf values"):
        experiment.save_checkpoint(path, {"script": "s.py", "value": torch.tensor([float("nan")])})
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]


def test_a_full_disk_leaves_the_old_checkpoint_and_no_temp_file(tmp_path):
    """A file size limit makes the write fail the way a full disk does (an OSError from write)."""
    code = textwrap.dedent(f"""
        import resource, signal, torch
        from common import experiment
        path = {str(tmp_path / "checkpoint.pt")!r}
        experiment.save_checkpoint(path, {{"script": "s.py", "value": torch.ones(10)}})
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))
        try:
            experiment.save_checkpoint(path, {{"script": "s.py", "value": torch.zeros(1_000_000)}})
        except experiment.RunError as exc:
            print(exc)
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "could not write" in out.stdout and "the previous file, if any, is unchanged" in out.stdout
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]
    assert torch.load(tmp_path / "checkpoint.pt", weights_only=True)["value"].tolist() == [1.0] * 10


def test_unreadable_or_foreign_files_are_one_line_naming_the_flag(tmp_path):
    good = tmp_path / "good.pt"
    experiment.save_checkpoint(good, {"script": "ppo_vec.py", "iteration": 1})
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    text = tmp_path / "notes.txt"
    text.write_text("hello\n")
    plain = tmp_path / "plain.pt"
    torch.save(torch.ones(2), plain)
    cases = {
        str(tmp_path / "missing.pt"): "no such file",
        str(text): "not a checkpoint (not a file that torch.save wrote)",
        str(truncated): "not a readable checkpoint (",
        str(plain): "is not a checkpoint of this project",
        str(good): "was written by ppo_vec.py; ppo_atari_multigpu.py reads only its own checkpoints",
    }
    for path, message in cases.items():
        with pytest.raises(FlagError) as info:
            experiment.load_checkpoint(path, "--eval-checkpoint", "ppo_atari_multigpu.py")
        assert str(info.value).startswith(f"--eval-checkpoint {path}") and message in str(info.value), str(info.value)
        assert "\n" not in str(info.value)


def test_resume_refuses_other_sizes_and_says_when_a_run_is_finished(tmp_path):
    model = torch.nn.Linear(2, 1)
    checkpoints = Checkpoints("s.py", Flags(), {"model": model}, steps_per_iteration=32, world_size=2)
    path = checkpoints.save(tmp_path / "checkpoint.pt", 5, rng=[None, None])
    with pytest.raises(FlagError, match="was written with --num-envs 4; resume it with 4, not 8"):
        checkpoints.resume(str(path), {"num_envs": 8}, num_iterations=10)
    one_rank = Checkpoints("s.py", Flags(), {"model": model}, steps_per_iteration=16, world_size=1)
    with pytest.raises(FlagError, match=r"the number of ranks \(world size\) 2; resume it with 2, not 1"):
        one_rank.resume(str(path), {"num_envs": 4}, num_iterations=10)
    with pytest.raises(experiment.Finished, match="finished its 5 iterations already"):
        checkpoints.resume(str(path), {"num_envs": 4}, num_iterations=5)
    with torch.no_grad():
        model.weight.zero_()
    checkpoint = checkpoints.resume(str(path), {"num_envs": 4}, num_iterations=10)
    assert checkpoint["iteration"] == 5 and checkpoint["global_step"] == 160 and model.weight.abs().sum() > 0
    with pytest.raises(FlagError, match=r"does not fit this run's model \(Error\(s\) in loading state_dict"):
        Checkpoints("s.py", Flags(), {"model": torch.nn.Linear(3, 1)}, 32, 2).resume(str(path), {}, 10)
    newer = Checkpoints("s.py", Flags(), {"model": model, "scaler": torch.nn.Linear(1, 1)}, 32, 2)
    with pytest.raises(FlagError, match=r"holds no scaler \(an older version of s.py wrote it\)"):
        newer.resume(str(path), {}, 10)


def test_env_stats_round_trip_and_merge():
    from gymnasium.wrappers.utils import RunningMeanStd

    class FakeEnvs:
        def __init__(self, values):
            self.values = values

        def get_attr(self, name):
            return tuple(self.values[name])

        def set_attr(self, name, values):
            self.values[name] = list(values)

    rng = np.random.default_rng(0)
    batches = [rng.normal(i, i + 1, (50 * (i + 1), 3)) for i in range(3)]
    stats = []
    for batch in batches:
        rms = RunningMeanStd(shape=(3,))
        rms.update(batch)
        stats.append(rms)
    envs = FakeEnvs({"obs_rms": stats, "discounted_reward": [np.array([0.5]), np.array([1.5]), np.array([2.5])]})
    saved = experiment.get_env_stats(envs, ["obs_rms", "discounted_reward"])
    restored = FakeEnvs({})
    experiment.set_env_stats(restored, saved)
    for before, after in zip(stats, restored.values["obs_rms"], strict=True):
        np.testing.assert_array_equal(after.mean, before.mean)
        np.testing.assert_array_equal(after.var, before.var)
        assert after.count == before.count
    assert [d.tolist() for d in restored.values["discounted_reward"]] == [[0.5], [1.5], [2.5]]
    merged = experiment.merge_rms(saved["obs_rms"])
    everything = np.concatenate(batches)
    np.testing.assert_allclose(merged.mean, everything.mean(0), rtol=1e-6)
    np.testing.assert_allclose(merged.var, everything.var(0), rtol=1e-3)  # each count starts at 1e-4


def test_evaluate_counts_whole_episodes_only():
    """An episode ending without 'episode' info (a life lost, in Atari) does not count: the game goes on."""

    class LivesEnv(gym.Env):
        observation_space, action_space = gym.spaces.Discrete(1), gym.spaces.Discrete(1)

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self.t = getattr(self, "t", 0)
            return 0, {}

        def step(self, action):
            self.t += 1
            info = {"episode": {"r": float(self.t)}} if self.t % 3 == 0 else {}
            return 0, 1.0, True, False, info

    assert experiment.evaluate(LivesEnv(), lambda obs: 0, episodes=2, seed=0) == [3.0, 6.0]


def test_mean_over_ranks_is_the_same_on_every_rank(tmp_path):
    """Each rank holds a different local value; all must get their mean (what decides the early stop on every rank)."""
    (tmp_path / "ranks.py").write_text(
        "import os, torch, torch.distributed as dist\n"
        "from common import experiment\n"
        "dist.init_process_group('gloo')\n"
        "mean = experiment.mean_over_ranks(torch.tensor([1.0 + 2.0 * dist.get_rank()])).item()\n"
        "os.write(1, f'{mean}\\n'.encode())  # one write: the ranks' lines do not interleave\n"
        "dist.destroy_process_group()\n"
    )
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "ranks.py"]
    out = run_command(cmd, tmp_path, timeout=120, extra_env={"PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["2.0", "2.0"]
    assert experiment.mean_over_ranks(torch.tensor([5.0])).item() == 5.0  # one process, no group: itself


# ---------------------------------------------------------------------------------------------------- stop path
SCRIPT = r"""
import dataclasses, time
from common import experiment
from common.experiment import FlagError, RunError

@dataclasses.dataclass
class Args:
    outcome: str = "wait"

def main(args):
    if args.outcome == "flag":
        raise FlagError("--thing must be > 0, got 0")
    if args.outcome == "fail":
        raise RunError("the disk is full")
    if args.outcome == "finished":
        raise experiment.Finished("that run finished already")
    with experiment.on_stop(lambda: "ck.pt"):
        if args.outcome == "raise":
            raise ValueError("a bug keeps its traceback")
        print("ready", flush=True)
        time.sleep(60)

if __name__ == "__main__":
    experiment.run(main, Args, "A test program.\n\n    python prog.py --outcome wait\n\nMore text.")
"""


def run_prog(tmp_path, *argv):
    (tmp_path / "prog.py").write_text(SCRIPT)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    cmd = [sys.executable, "prog.py", *argv]
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(
    ("outcome", "status", "stderr"),
    [
        ("flag", 2, "prog.py: error: --thing must be > 0, got 0\n"),
        ("fail", 1, "prog.py: error: the disk is full\n"),
        ("finished", 0, ""),
    ],
)
def test_exit_statuses(tmp_path, outcome, status, stderr):
    out = run_prog(tmp_path, "--outcome", outcome)
    assert (out.returncode, out.stderr) == (status, stderr)
    if outcome == "finished":
        assert out.stdout == "prog.py: that run finished already\n"


def test_a_bug_keeps_its_traceback_and_saves_nothing(tmp_path):
    out = run_prog(tmp_path, "--outcome", "raise")
    assert out.returncode == 1 and "Traceback" in out.stderr and "ValueError: a bug keeps its traceback" in out.stderr
    assert "checkpoint saved" not in out.stderr


def test_help_opens_with_the_description_and_the_commands(tmp_path):
    out = run_prog(tmp_path, "--help")
    assert out.returncode == 0
    assert "A test program.\n" in out.stdout and "python prog.py --outcome wait" in out.stdout
    assert "More text" not in out.stdout


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_saves_then_exits_128_plus_its_number(tmp_path, sig):
    (tmp_path / "prog.py").write_text(SCRIPT)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    cmd = [sys.executable, "prog.py", "--outcome", "wait"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "ready\n"
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 128 + sig
    assert stderr == (
        f"checkpoint saved to ck.pt; continue with --resume ck.pt\nprog.py: stopped by {signal.Signals(sig).name}\n"
    )
