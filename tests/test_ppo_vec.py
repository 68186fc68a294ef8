"""ppo_vec.py end to end (as subprocesses, the way users run it) and its pure helpers."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch

from common.normalize import ObsNormalizer, RewardScaler
from tests.helpers import (
    CLEANRL_TAGS,
    FAULT_ENV,
    LONG,
    REPO,
    VEC,
    VEC_TINY,
    fault_env,
    only_run_dir,
    read_scalars,
    run_command,
    run_script,
)

sys.path.insert(0, str(REPO))
import ppo_vec  # noqa: E402


def test_compute_gae_by_hand():
    """Env 0 terminates after step 1; env 1 is truncated after step 1 with V(final_obs) = 5, folded
    in by the caller."""
    gamma, lam = 0.9, 0.8
    rewards = np.array([[1.0, 0.0], [2.0, 1.0 + gamma * 5.0], [3.0, 0.0], [4.0, 1.0]], dtype=np.float32)
    values = np.array([[0.5, 1.0], [1.0, 1.0], [1.5, 1.0], [2.0, 1.0]], dtype=np.float32)
    ends = np.array([[0.0, 0.0], [1.0, 1.0], [0.0, 0.0], [0.0, 0.0]], dtype=np.float32)
    next_value = np.array([3.0, 2.0], dtype=np.float32)
    advantages = ppo_vec.compute_gae(rewards, values, ends, next_value, gamma, lam)
    # By hand, backwards. Env 0: deltas 4.7, 3.3, 1.0 (no future after the termination), 1.4.
    # Env 1: deltas 1.8, -0.1, 4.5 (= 1 + 0.9 * 5 - 1: the truncated step keeps its future), -0.1.
    expected = [[1.4 + 0.72 * 1.0, -0.1 + 0.72 * 4.5], [1.0, 4.5], [3.3 + 0.72 * 4.7, -0.1 + 0.72 * 1.8], [4.7, 1.8]]
    np.testing.assert_allclose(advantages, expected, rtol=1e-6)
    # Treating the truncation as a termination would have dropped the future: advantage 0 at env 1, step 1.
    rewards[1, 1] = 1.0
    assert ppo_vec.compute_gae(rewards, values, ends, next_value, gamma, lam)[1, 1] == pytest.approx(0.0)


@pytest.mark.parametrize("space", [gym.spaces.Discrete(3), gym.spaces.Box(-2.0, 2.0, (2,))], ids=["discrete", "box"])
def test_sample_draws_from_the_policy_the_update_trains(space):
    """Rollout actions come from the distribution whose log-probs get_action_and_value computes."""
    torch.manual_seed(0)
    agent = ppo_vec.Agent(5, space)
    with torch.no_grad():  # a trained-looking policy, not the near-uniform initial one
        agent.actor[-1].weight.mul_(100.0)
        if agent.continuous:
            agent.actor_logstd.fill_(-1.0)
    x = torch.randn(1, 5).expand(20_000, 5)
    with torch.no_grad():
        actions = ppo_vec.sample(agent.get_policy(x), np.random.default_rng(1))
        _, logprob, _, _ = agent.get_action_and_value(x[:1], torch.as_tensor(actions[:1]))
        out = agent.actor(x[:1])[0].numpy()
    if agent.continuous:
        np.testing.assert_allclose(actions.mean(0), out, atol=0.01)
        np.testing.assert_allclose(actions.std(0), np.exp(-1.0), rtol=0.02)
        density = np.exp(-0.5 * ((actions[0] - out) / np.exp(-1.0)) ** 2) / (np.exp(-1.0) * np.sqrt(2 * np.pi))
        np.testing.assert_allclose(logprob.item(), np.log(density).sum(), rtol=1e-4)
    else:
        probs = np.exp(out - out.max()) / np.exp(out - out.max()).sum()
        assert 0.05 < probs.min() and probs.max() < 0.95  # every action is likely enough to be counted
        np.testing.assert_allclose(np.bincount(actions, minlength=3) / len(actions), probs, atol=0.01)
        np.testing.assert_allclose(logprob.exp().item(), probs[actions[0]], rtol=1e-4)


def test_categorical_log_prob_and_entropy_match_torch_distributions():
    """get_action_and_value writes Categorical's log-prob and entropy out by hand (cheaper); same
    numbers, same gradients, also for a near-deterministic policy whose small probabilities
    underflow."""
    torch.manual_seed(0)
    agent = ppo_vec.Agent(4, gym.spaces.Discrete(3))
    with torch.no_grad():
        agent.actor[-1].weight.mul_(2000.0)
    x, action = torch.randn(64, 4), torch.randint(0, 3, (64,))
    _, logprob, entropy, _ = agent.get_action_and_value(x, action)
    reference = torch.distributions.Categorical(logits=agent.actor(x))
    expected_logprob, expected_entropy = reference.log_prob(action), reference.entropy()
    assert (expected_entropy < 1e-6).any() and torch.isfinite(entropy).all()
    torch.testing.assert_close(logprob, expected_logprob)
    torch.testing.assert_close(entropy, expected_entropy)
    grads = torch.autograd.grad((logprob + entropy).sum(), agent.actor[-1].weight)
    expected_grads = torch.autograd.grad((expected_logprob + expected_entropy).sum(), agent.actor[-1].weight)
    torch.testing.assert_close(grads, expected_grads)


@pytest.mark.e2e
def test_cartpole_tiny_run_logs_cleanrl_tags(tmp_path):
    out = run_script(VEC, [*VEC_TINY, "--total-timesteps", "1024", "--seed", "3"], tmp_path)
    assert out.returncode == 0, out.stderr
    run_dir = only_run_dir(tmp_path)
    assert out.stdout.startswith("ppo_vec.py: CartPole-v1, 4 envs in this process, cpu; results in runs/")
    assert len(out.stdout.splitlines()[0]) <= 160  # the probe's figures are in summary.json's layout
    assert json.loads((run_dir / "summary.json").read_text())["layout"].startswith("4 envs in this process (gymnas")
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    # Discrete actions: not normalized
    assert checkpoint["obs_normalizer"]["count"].item() == pytest.approx(1e-4)
    assert out.stdout.splitlines()[0].endswith(f"; results in runs/{run_dir.name}")
    progress = [line for line in out.stdout.splitlines() if line.startswith("global_step=")]
    assert progress and progress[-1].startswith("global_step=1024/1024 SPS=")
    assert re.search(r"episodic_return=\d+\.\d \(last 20\) elapsed=0:00:\d\d ETA=0:00:00 \[env ", progress[-1])
    scalars = read_scalars(run_dir)
    assert CLEANRL_TAGS <= scalars.keys()
    # 8 iterations
    assert [step for step, _ in scalars["losses/value_loss"]] == [128 * i for i in range(1, 9)]
    assert all(0 < r <= 500 for _, r in scalars["charts/episodic_return"])


@pytest.mark.e2e
def test_a_run_leaves_its_results_and_says_how_it_ended(tmp_path):
    """The quickstart's command with a total that is not a multiple of the batch: the last
    iteration's progress line, the closing line, the run folder's files, and the README's evaluation
    command right after."""
    out = run_script(VEC, [*VEC_TINY, "--total-timesteps", "1000", "--num-workers", "0"], tmp_path)  # 7 x 128
    assert out.returncode == 0, out.stderr
    run_dir = only_run_dir(tmp_path)
    lines = out.stdout.splitlines()
    assert lines[-2].startswith("global_step=896/896 SPS=")
    assert re.fullmatch(
        rf"ppo_vec.py: done: 896 of 896 steps in 0:00:\d\d \(\d+ SPS\), last-20 return \d+\.\d; "
        rf"results in runs/{run_dir.name} \(tensorboard --logdir runs\); evaluate with: python "
        rf"{VEC} --eval-checkpoint runs/{run_dir.name}/checkpoint.pt",
        lines[-1],
    )
    assert {p.name for p in run_dir.iterdir()} >= {"args.json", "summary.json", "checkpoint.pt"}
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "done" and summary["global_step"] == 896 and summary["checkpoint_iteration"] == 7
    recorded = json.loads((run_dir / "args.json").read_text())
    assert recorded["total_timesteps"] == 1000 and recorded["norm_obs"] is False  # what ran: Discrete actions
    evaluate = ["--eval-checkpoint", f"runs/{run_dir.name}/checkpoint.pt", "--eval-episodes", "2"]
    out = run_script(VEC, evaluate, tmp_path)
    assert out.returncode == 0 and "eval: mean return" in out.stdout and "over 2 episodes" in out.stdout, out.stderr


@pytest.mark.e2e
def test_a_failed_run_saves_its_last_iteration_and_says_so(tmp_path):

    args = [*FAULT_ENV, *VEC_TINY, "--total-timesteps", "2048", "--num-workers", "2"]
    out = run_script(VEC, args, tmp_path, extra_env=fault_env(tmp_path, "raise:70"))
    assert out.returncode == 1
    run_dir = only_run_dir(tmp_path)
    # at its 70th step
    assert "ppo_vec.py: error: env " in out.stderr and "raised ValueError: boom" in out.stderr
    assert out.stderr.splitlines()[-1].startswith("ppo_vec.py: failed: 256 of 2048 steps in ")
    resume = f"python {VEC} --resume runs/{run_dir.name}/checkpoint.pt --env-id {FAULT_ENV[1]}"
    assert out.stderr.endswith(f"; continue with: {resume}\n")  # the module env id: the resume imports it
    summary = json.loads((run_dir / "summary.json").read_text())
    saved = torch.load(run_dir / "checkpoint.pt", weights_only=True)["iteration"]
    assert summary["status"] == "failed" and summary["checkpoint_iteration"] == saved  # the file on disk
    assert 0 <= saved <= 2  # the last boundary kept (run.KEEP_EVERY): at most the last whole iteration
    again = run_command(shlex.split(resume.replace("python", sys.executable, 1)), tmp_path, 300, fault_env(tmp_path))
    assert again.returncode == 0 and f"resuming from iteration {saved} " in again.stdout, again.stderr  # as printed


@pytest.mark.parametrize("env_id", ["Pendulum-v1", "CartPole-v1"])
def test_the_envs_pass_observations_and_rewards_raw(env_id):
    """The env a run trains on, against the plain env stepped with the same actions: the same
    observations (as float32 vectors) and rewards, Box actions clipped to their bounds (the trainer
    normalizes: ObsNormalizer, RewardScaler)."""
    env, plain = ppo_vec.make_env(ppo_vec.Args(env_id=env_id), 0, "unused")(), gym.make(env_id)
    (obs, _), (plain_obs, _) = env.reset(seed=3), plain.reset(seed=3)
    box = env_id == "Pendulum-v1"
    # beyond the bounds too: both clip to [-2, 2]
    for action in np.linspace(-3, 3, 20) if box else [0, 1] * 4:
        np.testing.assert_array_equal(obs, plain_obs.astype(np.float32))
        obs, reward, *_ = env.step(np.array([action], dtype=np.float32) if box else action)
        plain_obs, plain_reward, *_ = plain.step(np.clip([action], -2, 2).astype(np.float32) if box else action)
        assert reward == plain_reward


def test_a_dict_observation_is_flattened_to_a_float32_vector():
    env = ppo_vec.make_env(ppo_vec.Args(env_id="tests.envs:DictObs-v0"), 0, "unused")()
    obs, _ = env.reset(seed=0)
    assert env.observation_space.dtype == np.float32 and obs.dtype == np.float32
    assert obs.shape == (19,)  # pos 2, mode one-hot 4, more: 3 bits and two one-hots of 5


def test_obs_normalizer_gives_one_running_mean_std_over_all_envs():
    """ObsNormalizer over batches of 8 envs' observations: the numbers of gymnasium's RunningMeanStd
    updated with the same batches, to the bit, clipped to +-10; off, observations pass unchanged;
    frozen (update=False), none count."""
    from gymnasium.wrappers.utils import RunningMeanStd

    rng, normalize, reference = np.random.default_rng(0), ObsNormalizer(3, True), RunningMeanStd(shape=(3,))
    for _ in range(50):
        batch = rng.normal([1.0, -50.0, 0.0], [1.0, 10.0, 1e-3], (8, 3)).astype(np.float32)
        reference.update(batch)
        expected = np.clip((batch - reference.mean) / np.sqrt(reference.var + 1e-8), -10, 10).astype(np.float32)
        np.testing.assert_array_equal(normalize(batch), expected)
    assert normalize.count.item() == reference.count and (np.abs(normalize(batch * 1e6, update=False)) == 10).any()
    assert normalize.count.item() == reference.count  # a frozen look counts nothing
    off = ObsNormalizer(3, False)
    assert off(batch) is batch and off.count.item() == 1e-4


def test_reward_scaler_gives_gymnasium_normalize_reward_numbers_per_env():
    """RewardScaler over 3 envs at once, against gymnasium's NormalizeReward and a clip to +-10
    wrapped around each env, over episodes that end by termination and by truncation: the same
    numbers, to the bit."""
    envs = [gym.wrappers.TimeLimit(gym.make("CartPole-v1").unwrapped, 15 + 10 * i) for i in range(3)]
    wrapped = [gym.wrappers.ClipReward(gym.wrappers.NormalizeReward(e, gamma=0.95), -10, 10) for e in envs]
    scaler, rng, ended = RewardScaler(3, gamma=0.95), np.random.default_rng(0), [0, 0]
    for i, env in enumerate(wrapped):
        env.reset(seed=i)
    for _ in range(300):
        steps = [env.step(int(rng.integers(2))) for env in wrapped]
        expected, raw = np.array([s[1] for s in steps]), np.array([1.0] * 3)  # CartPole pays 1 per step
        terminations, truncations = np.array([s[2] for s in steps]), np.array([s[3] for s in steps])
        assert np.array_equal(scaler(raw, terminations), expected)
        ended = [ended[0] + terminations.sum(), ended[1] + (truncations & ~terminations).sum()]
        for env, terminated, truncated in zip(wrapped, terminations, truncations, strict=True):
            if terminated or truncated:
                env.reset()
    assert ended[0] > 5 and ended[1] > 5  # both kinds of ends were crossed
    assert not np.allclose(scaler.var.numpy(), scaler.var.numpy()[0])  # each env keeps its own statistics


@pytest.mark.e2e
# --no-norm-obs: -m long (CartPole's runs go without)
@pytest.mark.parametrize("norm_obs", [True, *LONG(False)])
def test_pendulum_tiny_run_saves_and_evaluates(tmp_path, norm_obs):
    args = [*VEC_TINY, "--env-id", "Pendulum-v1", "--total-timesteps", "256", "--save-model", "--eval-episodes", "2"]
    args += ["--num-workers", "0"]  # the layout plays no part
    out = run_script(VEC, [*args, "--norm-obs" if norm_obs else "--no-norm-obs"], tmp_path)
    assert out.returncode == 0, out.stderr
    assert "global_step=256/256" in out.stdout and "eval: mean return" in out.stdout
    run_dir = only_run_dir(tmp_path)
    assert CLEANRL_TAGS - {"charts/episodic_return", "charts/episodic_length"} <= read_scalars(run_dir).keys()
    checkpoint = torch.load(run_dir / "ppo_vec.cleanrl_model", weights_only=True)
    assert checkpoint["args"]["env_id"] == "Pendulum-v1" and checkpoint["iteration"] == 2
    assert checkpoint["reward_scaler"]["count"].tolist() == pytest.approx([64.0001] * 4)  # 64 steps per env
    # the statistics the policy was trained under travel with it
    counted = checkpoint["obs_normalizer"]["count"].item()
    assert counted == pytest.approx(4 * 64 + 1e-4) if norm_obs else counted == 1e-4  # 4 envs, 64 steps each
    assert len(read_scalars(run_dir)["eval/episodic_return"]) == 2
    # Evaluating later, from the file alone.
    out = run_script(VEC, ["--eval-checkpoint", run_dir / "ppo_vec.cleanrl_model", "--eval-episodes", "1"], tmp_path)
    assert out.returncode == 0, out.stderr
    assert "eval: mean return" in out.stdout and "over 1 episodes" in out.stdout


@pytest.mark.e2e
def test_evaluation_uses_the_saved_observation_statistics(tmp_path, monkeypatch):
    """A policy that acts on its (normalized) observation gets different returns once the
    statistics change."""
    out = run_script(
        VEC, [*VEC_TINY, "--env-id", "Pendulum-v1", "--total-timesteps", "256", "--checkpoint-interval", "1"], tmp_path
    )
    assert out.returncode == 0, out.stderr
    path = only_run_dir(tmp_path) / "checkpoint.pt"
    checkpoint = torch.load(path, weights_only=True)
    with torch.no_grad():  # a policy that pushes with its normalized angular velocity
        checkpoint["model"]["actor.4.weight"].zero_()
        checkpoint["model"]["actor.0.weight"].zero_()
        checkpoint["model"]["actor.0.weight"][0, 2] = 1.0
        checkpoint["model"]["actor.4.weight"][0, 0] = 5.0
    torch.save(checkpoint, path)
    argv = ["ppo_vec.py", "--eval-checkpoint", str(path), "--eval-episodes", "1"]
    monkeypatch.setattr(sys, "argv", argv)
    first = ppo_vec.main(ppo_vec.Args(eval_checkpoint=str(path), eval_episodes=1))
    checkpoint["obs_normalizer"]["mean"] += 5.0
    torch.save(checkpoint, path)
    assert ppo_vec.main(ppo_vec.Args(eval_checkpoint=str(path), eval_episodes=1)) != first


@pytest.mark.e2e
def test_same_seed_same_parameters_and_returns(tmp_path):
    results = []
    for run in ("a", "b"):
        cwd = tmp_path / run
        cwd.mkdir()
        args = [*VEC_TINY, "--total-timesteps", "768", "--save-model", "--eval-episodes", "0"]
        out = run_script(VEC, args, cwd, fresh=True)  # each its own interpreter: its own hash seed
        assert out.returncode == 0, out.stderr
        run_dir = only_run_dir(cwd)
        returns = read_scalars(run_dir)["charts/episodic_return"]
        results.append((torch.load(run_dir / "ppo_vec.cleanrl_model", weights_only=True)["model"], returns))
    (params_a, returns_a), (params_b, returns_b) = results
    assert len(returns_a) > 5 and returns_a == returns_b
    for name in params_a:
        torch.testing.assert_close(params_a[name], params_b[name], rtol=0, atol=0)


@pytest.mark.e2e
def test_truncation_is_bootstrapped_not_terminated(tmp_path):
    """Reward 1 per step, episodes only ever cut at 5 steps: V must approach 1 / (1 - gamma) = 20, not ~3."""
    args = ["--env-id", "tests.envs:ConstantReward-v0", "--gamma", "0.95", "--learning-rate", "3e-3", "--no-clip-vloss"]
    args += ["--no-norm-reward"]  # V in raw reward units
    args += [*VEC_TINY, "--total-timesteps", "12800", "--save-model", "--eval-episodes", "0", "--no-anneal-lr"]
    args += ["--num-workers", "0"]  # the layout plays no part
    out = run_script(VEC, args, tmp_path, extra_env={"PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr
    model = torch.load(only_run_dir(tmp_path) / "ppo_vec.cleanrl_model", weights_only=True)["model"]
    agent = ppo_vec.Agent(2, ppo_vec.gym.spaces.Discrete(2))
    agent.load_state_dict(model)
    value = agent.get_value(torch.zeros(1, 2)).item()
    assert 15 < value < 25, f"V = {value:.2f}; about 3 would mean truncation was treated as termination"


@pytest.mark.e2e
def test_an_env_whose_close_raises_does_not_stop_the_run(tmp_path):
    args = [*VEC_TINY, "--env-id", "tests.envs:CloseRaises-v0", "--total-timesteps", "256"]
    out = run_script(VEC, args, tmp_path, extra_env={"PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr and "global_step=256/256" in out.stdout


@pytest.mark.e2e
def test_help_into_a_pipe_closed_early_ends_quietly():
    """`ppo_vec.py --help | head -n 2`: the reader leaves once its lines came (more than a pipe's
    first write); the script ends without a BrokenPipeError."""
    for _ in range(3):
        proc = subprocess.Popen(
            [sys.executable, str(VEC), "--help"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=dict(os.environ, COLUMNS="40"),
        )
        proc.stdout.readline()
        proc.stdout.close()
        assert proc.wait(timeout=60) in (0, 1) and b"BrokenPipe" not in proc.stderr.read()


@pytest.mark.e2e
def test_help_opens_with_the_description_and_commands_and_documents_every_flag():
    env = dict(os.environ, COLUMNS="200")
    out = subprocess.run([sys.executable, str(VEC), "--help"], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0
    assert "PPO for flat-observation gymnasium envs" in out.stdout
    assert "python ppo_vec.py --env-id CartPole-v1 --num-envs 8" in out.stdout
    for field in dataclasses.fields(ppo_vec.Args):
        assert f"--{field.name.replace('_', '-')}" in out.stdout
    for line in out.stdout.splitlines():
        assert line.count("(default") <= 1, line  # each default shown once
