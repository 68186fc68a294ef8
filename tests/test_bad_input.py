"""Bad input to either script: exit status 2 (1 for the environment itself), one line that says what
to change, no traceback, no runs/ folder, no process left behind."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from filelock import FileLock

from common.run import records
from tests.helpers import REPO, descendants, leftovers, run_command, run_script

# Runs the scripts as users do (the README's test command, not the fast tier).
pytestmark = pytest.mark.e2e

VEC, ATARI = REPO / "ppo_vec.py", REPO / "ppo_atari_multigpu.py"


def write_files(folder):
    """A text file, a checkpoint of each script, and a module that fails to import, in folder."""
    folder.mkdir(parents=True)
    (folder / "notes.txt").write_text("not a checkpoint\n")
    for script in ("ppo_vec.py", "ppo_atari_multigpu.py"):
        state = {"script": script, "args": {}, "model": {"w": torch.zeros(1)}, "iteration": 1}
        records.save_checkpoint(folder / f"{script[:-3]}.pt", state)
    state = {"script": "ppo_vec.py", "model": {"w": torch.zeros(1)}, "iteration": 1}
    records.save_checkpoint(folder / "incomplete.pt", state)  # no "args"
    whole = (folder / "ppo_atari_multigpu.pt").read_bytes()
    # a save cut short (the disk filled, a kill)
    (folder / "truncated.pt").write_bytes(whole[: len(whole) // 2])
    (folder / "tail_cut.pt").write_bytes(whole[: len(whole) * 9 // 10])  # torch says "Invalid argument" there
    torch.save({"script": "ppo_vec.py", "args": {}, "model": Planted()}, folder / "planted.pt")
    (folder / "broken_envs.py").write_text("raise RuntimeError('needs a licence file')\n")
    (folder / "zero.pt").symlink_to("/dev/zero")
    return folder


class Planted:
    """What a tampered checkpoint may hold: loading it would run code (weights_only refuses it)."""

    def __reduce__(self):
        return print, ("this ran",)


CASES = [
    (VEC, ["--eval-checkpoint", "notes.txt"], "--eval-checkpoint notes.txt: not a checkpoint (not a file"),
    (VEC, ["--eval-checkpoint", "ppo_atari_multigpu.pt"], "was written by ppo_atari_multigpu.py; ppo_vec.py reads"),
    (ATARI, ["--eval-checkpoint", "ppo_vec.pt"], "was written by ppo_vec.py; ppo_atari_multigpu.py reads only its own"),
    (VEC, ["--resume", "notes.txt"], "--resume notes.txt: not a checkpoint (not a file that torch.save wrote)"),
    (ATARI, ["--resume", "ppo_vec.pt"], "--resume ppo_vec.pt was written by ppo_vec.py"),
    (ATARI, ["--resume", "truncated.pt"], "--resume truncated.pt: not a readable checkpoint (it is cut short or"),
    (ATARI, ["--resume", "tail_cut.pt"], "--resume tail_cut.pt: not a readable checkpoint (it is cut short or"),
    (VEC, ["--eval-checkpoint", "planted.pt"], "not a readable checkpoint (it holds objects no checkpoint of this"),
    (VEC, ["--num-threads", "0"], "--num-threads must be in [1, 1024], got 0"),
    # a segfault before
    (ATARI, ["--num-threads", "100000"], "--num-threads must be in [1, 1024], got 100000"),
    (
        VEC,
        ["--resume", "ppo_vec.pt", "--eval-checkpoint", "ppo_vec.pt"],
        "--resume trains a run on, --eval-checkpoint evaluates one: give one of them",
    ),
    (
        VEC,
        ["--eval-checkpoint", "ppo_vec.pt", "--eval-episodes", "0"],
        "--eval-episodes must be >= 1 with --eval-checkpoint, got 0",
    ),
    (VEC, ["--seed", str(2**32)], "--seed must be in [0, 2**32), got 4294967296"),
    (VEC, ["--resume", "missing.pt"], "--resume missing.pt: no such file"),
    (
        VEC,
        ["--resume", "ppo_vec.pt"],
        "--resume ppo_vec.pt holds no optimizer and no rng and no reward_scaler and no obs_normalizer: not a whole",
    ),
    (VEC, ["--eval-checkpoint", "incomplete.pt"], "incomplete.pt holds no args: not a whole checkpoint"),
    (
        VEC,
        ["--eval-checkpoint", "ppo_vec.pt"],
        "--eval-checkpoint ppo_vec.pt holds no obs_normalizer: not a whole checkpoint of ppo_vec.py",
    ),
    (VEC, ["--eval-checkpoint", "ppo_vec.pt", "--env-id", "Acrobot-v1"], "a policy for CartPole-v1, not --env-id"),
    (ATARI, ["--capture-video", "True"], "--capture-video is a switch and takes no value (got 'True'): write"),
    (VEC, ["--norm-reward=false"], "--norm-reward is a switch and takes no value (got 'false')"),
    (VEC, ["--exp-name", "x" * 250], "--exp-name must be at most 200 bytes (it names a folder"),
    (VEC, ["--env-id", "broken_envs:Thing-v0"], "importing broken_envs failed (RuntimeError: needs a licence file)"),
    (VEC, ["--env-id", "CartPol-v1"], "'CartPol-v1' is not a registered gymnasium env; did you mean CartPole-v1"),
    (VEC, ["--env-id", "ALE/Breakout-v5"], "(210, 160, 3), uint8); ppo_vec.py needs ones that flatten to a vector"),
    (VEC, ["--env-id", "tests.envs:SequenceObs-v0"], "has observations Sequence(Discrete(3), stack=False); ppo_vec"),
    (VEC, ["--env-id", "CartPole-v1", "--norm-obs"], "observations of Box-action envs; --env-id CartPole-v1 has"),
    (VEC, ["--env-id", "my_envs:MyEnv-v0"], "it is looked for in {cwd}, in the script's folder and on PYTHONPATH: run"),
    (
        VEC,
        ["--env-id", "tests.envs:OldApi-v0"],
        "follows the old gym API (its reset takes no seed); the scripts need "
        "gymnasium's: reset(seed=None, options=None) -> (obs, info), step(action) -> (obs, "
        "reward, terminated, truncated, "
        "info)",
    ),
    (ATARI, ["--env-id", "CartPole-v1"], "--env-id 'CartPole-v1' is not an Atari id (try BreakoutNoFrameskip-v4)"),
    (VEC, ["--step-timeout", "inf"], "--step-timeout must be a finite number, got inf"),
    (ATARI, ["--step-timeout", "1e300"], "--step-timeout must be in (0, 604800] seconds"),
    (VEC, ["--seed", "-1"], "--seed must be in [0, 2**32), got -1"),
    (VEC, ["--ent-coef", "nan"], "--ent-coef must be a finite number, got nan"),
    (ATARI, ["--learning-rate", "-inf"], "--learning-rate must be a finite number, got -inf"),
    (VEC, ["--exp-name", "../elsewhere"], "--exp-name must be a plain name (no '/', not '.' or '..'), got ../else"),
    (ATARI, ["--exp-name", ".."], "--exp-name must be a plain name"),
    (
        VEC,
        ["--num-envs", "8", "--num-steps", "10", "--num-minibatches", "3"],
        "--num-minibatches must be a divisor of the batch of 80 steps (--num-envs 8 x --num-steps 10), got 3",
    ),
    (ATARI, ["--local-num-envs", "0"], "--local-num-envs must be >= 1, got 0"),
    (VEC, ["--total-timesteps", "1000"], "--total-timesteps must be >= one batch of 1024 steps"),
    (ATARI, ["--backend", "nccl", "--no-cuda"], "--backend must be gloo without CUDA (or unset), got nccl"),
    *[
        (
            script,
            ["--cudagraphs", "--no-cuda"],
            "--cudagraphs replays CUDA graphs, and this run has no CUDA device: drop",
        )
        for script in (VEC, ATARI)
    ],
    (
        VEC,
        ["--env-id", "Pendulum-v1", "--overlap"],
        "--overlap steps each step in two groups of envs, which --norm-obs",
    ),
    (
        VEC,
        ["--num-envs", "1", "--num-steps", "16", "--num-minibatches", "16"],
        "--num-minibatches must be at most 8: --norm-adv needs 2 samples a minibatch, got 16",
    ),
    (VEC, ["--resume", ""], "--resume needs a checkpoint file (runs/<run>/checkpoint.pt), got ''"),
    (VEC, ["--resume", "."], "--resume .: a folder: give the checkpoint.pt in it"),
    (ATARI, ["--eval-checkpoint", "zero.pt"], "--eval-checkpoint zero.pt: not a regular file"),
    *[(script, ["--clip-coef", "1e300"], "--clip-coef must be in (0, 10] (the ratio") for script in (VEC, ATARI)],
    (
        VEC,
        ["--num-steps", "1000000000", "--total-timesteps", "8000000000"],
        "--num-steps 1000000000 x --num-envs 8: the rollout's observations alone would take 119.2 GiB, and this",
    ),
    (ATARI, ["--local-num-envs", "100000", "--total-timesteps", "12800000"], "lower --num-steps or --local-num-envs"),
    (VEC, ["--vf-coef", "1e30"], "--vf-coef must be in [0, 1e6] (a float32 loss times it must stay a number)"),
    (ATARI, ["--learning-rate", "2"], "--learning-rate must be in (0, 1] (Adam moves each weight by about"),
    (
        VEC,
        ["--env-id", "tests.envs:ScalarAction-v0"],
        "has action space Box(-inf, inf, (), float32); ppo_vec.py needs Discrete or 1-D Box",
    ),
    (
        VEC,
        ["--env-id", "MyEnv-v0"],
        "not a registered gymnasium env. An env your module registers: --env-id your_module:MyEnv-v0",
    ),
]
if importlib.util.find_spec("moviepy") is None:
    CASES += [(script, ["--capture-video"], "--capture-video needs moviepy") for script in (VEC, ATARI)]
if importlib.util.find_spec("wandb") is None:
    CASES += [
        (script, ["--track"], "--track needs wandb, which is not installed: pip install") for script in (VEC, ATARI)
    ]


IDS = [" ".join([c[0].stem, *c[1]]) for c in CASES]


@pytest.fixture(scope="session")
def outcomes(tmp_path_factory, worker_id):
    """Every case, each in its own folder, run by run_script (a fork of a process that imported torch
    once: each case's time would be mostly importing it): {case id: (completed process, folder)}, and
    the processes alive before. Run once per session: under pytest-xdist the first worker to ask
    runs them and the other reads what it wrote (xdist's own grouping is not relied on: with pytest
    9 it does not keep a group on one worker)."""
    shared = tmp_path_factory.getbasetemp()
    # the session's folder, the same for every worker
    shared = shared.parent if worker_id != "master" else shared
    before = descendants()
    with FileLock(str(shared / "bad_input.lock")):
        record = shared / "bad_input.json"
        if not record.exists():
            base = shared / "bad_input"
            folders = [write_files(base / str(i) / "cwd") for i in range(len(CASES))]

            def run(i):
                out = run_script(CASES[i][0], CASES[i][1], folders[i], timeout=300)
                return IDS[i], [out.returncode, out.stdout, out.stderr, str(folders[i])]

            with ThreadPoolExecutor(max_workers=2) as pool:
                record.write_text(json.dumps(dict(pool.map(run, range(len(CASES))))))
        found = json.loads(record.read_text())
    results = {
        case: (subprocess.CompletedProcess(case, code, out, err), Path(folder))
        for case, (code, out, err, folder) in found.items()
    }
    return results, before


@pytest.mark.parametrize(("script", "flags", "message"), CASES, ids=IDS)
def test_bad_input_is_one_line_and_starts_nothing(outcomes, script, flags, message):
    results, before = outcomes
    out, files = results[" ".join([script.stem, *flags])]
    assert out.returncode == 2, out.stderr
    assert len(out.stderr.splitlines()) == 1 and out.stderr.startswith(f"{script.name}: error: "), out.stderr
    assert message.format(cwd=files) in out.stderr, out.stderr
    assert out.stdout == ""
    assert not (files / "runs").exists()
    assert not leftovers(before)


def test_bad_input_as_its_own_process(tmp_path):
    """One case as a plain `python script.py ...` in a fresh interpreter (the others run in forks of
    a process that imported torch)."""
    out = run_command([sys.executable, VEC, "--env-id", "CartPol-v1"], tmp_path, timeout=120)
    assert out.returncode == 2 and out.stdout == "" and not (tmp_path / "runs").exists()
    assert out.stderr.startswith("ppo_vec.py: error: --env-id 'CartPol-v1' is not a registered gymnasium env; did you")
    assert len(out.stderr.splitlines()) == 1


def test_a_choice_flag_lists_its_choices(tmp_path):
    out = run_script(ATARI, ["--backend", "tcp"], tmp_path, timeout=120)
    assert out.returncode == 2
    assert "--backend" in out.stderr and "nccl" in out.stderr and "gloo" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "runs").exists()


def test_an_old_gymnasium_is_named_with_the_version_needed(tmp_path):
    fake = tmp_path / "site" / "gymnasium"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('__version__ = "0.29.1"\n')
    out = run_script(
        VEC, ["--env-id", "CartPole-v1"], tmp_path, timeout=120, extra_env={"PYTHONPATH": str(fake.parent)}
    )
    assert out.returncode == 1
    assert out.stderr == (
        "ppo-vec: error: it needs gymnasium>=1.1,<2, this Python has 0.29.1: pip install 'gymnasium>=1.1,<2'\n"
    )
    assert not (tmp_path / "runs").exists()
