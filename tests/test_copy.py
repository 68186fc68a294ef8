"""The copy promise: ppo_vec.py and ppo_atari_multigpu.py with common/ copied under another name
into a project that has a `common` package of its own, only the scripts' import lines changed, work
as they do here: the default layout and its probe, workers, a stop and its exact resume, evaluation,
the Atari pipeline's saved states, the sweep."""

from __future__ import annotations

import ast
import json
import shutil
import signal
import subprocess
import sys

import pytest
import torch

from tests.helpers import ATARI_TINY, REPO, VEC_TINY, only_run_dir, run_command, run_script, start_training, stop

pytestmark = pytest.mark.e2e


@pytest.fixture
def project(tmp_path):
    """my_research/: the user's own common/ (a module and a wrapper of theirs), rl_common/ (ours),
    the two scripts."""
    project = tmp_path / "my_research"
    (project / "common").mkdir(parents=True)
    (project / "common" / "__init__.py").write_text("")
    (project / "common" / "utils.py").write_text("import gymnasium as gym\n\nclass Theirs(gym.Wrapper):\n    pass\n")
    shutil.copytree(REPO / "common", project / "rl_common", ignore=shutil.ignore_patterns("__pycache__"))
    for script in ("ppo_vec.py", "ppo_atari_multigpu.py"):
        text = (REPO / script).read_text()
        assert text.count("from common.") >= 2
        # the import lines alone
        (project / script).write_text(text.replace("from common.", "from rl_common."))
    return project


def run(project, script, args, **kwargs):
    return run_script(project / script, args, project, extra_env={"PYTHONPATH": ""}, **kwargs)


def names_the_package(path) -> bool:
    """True if code in `path` (docstrings aside) imports `common` by that name or writes "common."
    in a string."""
    tree = ast.parse(path.read_text())
    docs = {
        id(n.body[0].value)
        for n in ast.walk(tree)
        if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef)) and n.body and isinstance(n.body[0], ast.Expr)
    }
    return any(
        isinstance(n, ast.ImportFrom)
        and n.level == 0
        and (n.module or "").split(".")[0] == "common"
        or isinstance(n, ast.Import)
        and any(a.name.split(".")[0] == "common" for a in n.names)
        or isinstance(n, ast.Constant)
        and isinstance(n.value, str)
        and id(n) not in docs
        and "common." in n.value
        for n in ast.walk(tree)
    )


def test_a_copy_under_another_name_beside_your_own_common_works_the_same(project):
    assert [p.name for p in (REPO / "common").rglob("*.py") if names_the_package(p)] == []
    # the default layout (its probe imports the package by the name it has), a run to its end, the evaluation
    out = run(project, "ppo_vec.py", [*VEC_TINY, "--total-timesteps", "256", "--save-model", "--eval-episodes", "1"])
    assert out.returncode == 0, out.stderr
    assert "4 envs in this process" in out.stdout and "eval: mean return" in out.stdout and str(REPO) not in out.stderr
    layout = json.loads((only_run_dir(project) / "summary.json").read_text())["layout"]
    assert "gymnasium's CartPoleEnv; one step" in layout  # timed by the probe, not "the probe env failed"
    # workers, a stop, the exact resume: the envs' states saved and put back
    shutil.rmtree(project / "runs")
    args = [*VEC_TINY, "--num-workers", "2", "--total-timesteps", "100000"]
    proc = start_training(project / "ppo_vec.py", args, project, extra_env={"PYTHONPATH": ""})
    assert stop(proc, signal.SIGINT, within=30) and proc.returncode == 130
    checkpoint = only_run_dir(project) / "checkpoint.pt"
    total = torch.load(checkpoint, weights_only=True)["global_step"] + 256
    out = run(project, "ppo_vec.py", [*args[:-1], str(total), "--resume", str(checkpoint)])
    assert out.returncode == 0 and "the envs as they were" in out.stdout, out.stdout + out.stderr
    # Atari: the pipeline's states (a class of rl_common's) are saved with the checkpoint; the
    # user's common is not ours
    out = run(project, "ppo_atari_multigpu.py", [*ATARI_TINY, "--total-timesteps", "32"])
    assert out.returncode == 0, out.stderr
    atari = [p for p in (project / "runs").iterdir() if p.name.startswith("Breakout")][0]
    assert None not in torch.load(atari / "checkpoint.pt", weights_only=True)["env_states"]
    code = "from rl_common.vecenv import env_state; print(env_state.SAFE_MODULES)"
    safe = subprocess.run([sys.executable, "-c", code], cwd=project, capture_output=True, text=True, timeout=60)
    assert safe.stdout.strip() == "('gymnasium.', 'ale_py.', 'rl_common.')", safe.stderr
    # the sweep, as a module of the package under its new name
    cmd = [
        sys.executable,
        "-m",
        "rl_common.sweep",
        "ppo_vec.py",
        "--env-ids",
        "CartPole-v1",
        "--seeds",
        "7",
        "--",
        *VEC_TINY,
        "--total-timesteps",
        "128",
    ]
    out = run_command(cmd, project, timeout=300, extra_env={"PYTHONPATH": ""})
    assert out.returncode == 0 and "CartPole-v1 seed 7: start, exit 0, status done" in out.stdout, out.stderr
