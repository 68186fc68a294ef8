"""A CleanRL-style PPO loop, written the way CleanRL's ppo.py and ppo_atari.py are, as the speed baseline.

    python benchmarks/cleanrl_reference.py --env-id CartPole-v1 --num-envs 8 --iterations 10
    python benchmarks/cleanrl_reference.py --env-id BreakoutNoFrameskip-v4 --num-envs 8 --iterations 3

Same networks, batch sizes and update as our scripts, with CleanRL's habits that cost time: envs
stepped one after another in gymnasium's SyncVectorEnv, tensors rebuilt with torch.Tensor every
step, torch.no_grad instead of inference_mode, distribution argument checks left on, a .item() per
minibatch, torch's default thread count. Only for measuring SPS: it prints `SPS=<global steps /
seconds since the first step>` and a time breakdown.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
from torch.distributions.categorical import Categorical

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import ppo_atari_multigpu  # noqa: E402
import ppo_vec  # noqa: E402
from benchmarks.peers import EpisodicLifeEnv, FireResetEnv  # noqa: E402


def make_classic_env(env_id):
    return lambda: gym.wrappers.RecordEpisodeStatistics(gym.make(env_id))


def make_atari_env(env_id):
    """gymnasium's own DeepMind stack (an RGB frame copied out per emulated frame, as CleanRL builds it)."""

    def thunk():
        env = gym.wrappers.RecordEpisodeStatistics(gym.make(env_id, frameskip=1))
        env = gym.wrappers.AtariPreprocessing(env, noop_max=30, frame_skip=4, screen_size=84, grayscale_obs=True)
        env = gym.wrappers.ClipReward(FireResetEnv(EpisodicLifeEnv(env)), -1.0, 1.0)
        return gym.wrappers.FrameStackObservation(env, 4)

    return thunk


class MLPAgent(ppo_vec.Agent):
    """ppo_vec.py's network, sampling as CleanRL does: a Categorical with its argument checks on."""

    def get_action_and_value(self, x, action=None):
        probs = Categorical(logits=self.actor(x))
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action), probs.entropy(), self.critic(x)


class CNNAgent(ppo_atari_multigpu.Agent):
    """ppo_atari_multigpu.py's Nature CNN in CleanRL's default memory layout, sampling as CleanRL does."""

    def __init__(self, num_actions):
        super().__init__(num_actions)
        self.to(memory_format=torch.contiguous_format)

    def hidden(self, x):
        return self.network(x / 255.0)

    def get_action_and_value(self, x, action=None):
        hidden = self.hidden(x)
        probs = Categorical(logits=self.actor(hidden))
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action), probs.entropy(), self.critic(hidden)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env-id", default="CartPole-v1")
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--num-steps", type=int, default=128)
    parser.add_argument("--iterations", type=int, default=10)
    args = parser.parse_args()
    atari = "NoFrameskip" in args.env_id or args.env_id.startswith("ALE/")
    clip_coef, num_minibatches, update_epochs, gamma, gae_lambda = (0.1 if atari else 0.2), 4, 4, 0.99, 0.95
    torch.manual_seed(1)
    env_fns = [make_atari_env(args.env_id) if atari else make_classic_env(args.env_id) for i in range(args.num_envs)]
    envs = gym.vector.SyncVectorEnv(env_fns)
    n = envs.single_action_space.n
    obs_dim = int(np.prod(envs.single_observation_space.shape))
    agent = CNNAgent(n) if atari else MLPAgent(obs_dim, envs.single_action_space)
    optimizer = torch.optim.Adam(agent.parameters(), lr=2.5e-4, eps=1e-5)
    shape = (args.num_steps, args.num_envs)
    obs = torch.zeros(shape + envs.single_observation_space.shape)
    actions, logprobs, rewards, dones, values = (torch.zeros(shape) for _ in range(5))
    batch_size = args.num_envs * args.num_steps
    minibatch_size = batch_size // num_minibatches
    next_obs, _ = envs.reset(seed=1)
    next_obs, next_done = torch.Tensor(next_obs), torch.zeros(args.num_envs)
    global_step, start_time, env_time, update_time = 0, time.time(), 0.0, 0.0
    for _ in range(args.iterations):
        for step in range(args.num_steps):
            global_step += args.num_envs
            obs[step], dones[step] = next_obs, next_done
            with torch.no_grad():
                action, logprob, _, value = agent.get_action_and_value(next_obs)
                values[step] = value.flatten()
            actions[step], logprobs[step] = action, logprob
            tick = time.perf_counter()
            next_obs, reward, terminations, truncations, infos = envs.step(action.cpu().numpy())
            env_time += time.perf_counter() - tick
            next_done = np.logical_or(terminations, truncations)
            rewards[step] = torch.tensor(reward).view(-1)
            next_obs, next_done = torch.Tensor(next_obs), torch.Tensor(next_done)
            if "episode" in infos:
                for r in infos["episode"]["r"][infos["_episode"]]:
                    float(r)
        tick = time.perf_counter()
        with torch.no_grad():
            next_value = agent.get_value(next_obs).reshape(1, -1)
            advantages = torch.zeros_like(rewards)  # CleanRL's GAE loop, in torch
            lastgaelam = 0
            for t in reversed(range(args.num_steps)):
                nextnonterminal = 1.0 - (next_done if t == args.num_steps - 1 else dones[t + 1])
                nextvalues = next_value if t == args.num_steps - 1 else values[t + 1]
                delta = rewards[t] + gamma * nextvalues * nextnonterminal - values[t]
                advantages[t] = lastgaelam = delta + gamma * gae_lambda * nextnonterminal * lastgaelam
            returns = advantages + values
        b_obs = obs.reshape((-1,) + envs.single_observation_space.shape)
        b_logprobs, b_actions = logprobs.reshape(-1), actions.reshape(-1)
        b_advantages, b_returns, b_values = advantages.reshape(-1), returns.reshape(-1), values.reshape(-1)
        b_inds = np.arange(batch_size)
        clipfracs = []
        for _ in range(update_epochs):
            np.random.shuffle(b_inds)
            for start in range(0, batch_size, minibatch_size):
                mb_inds = b_inds[start : start + minibatch_size]
                _, newlogprob, entropy, newvalue = agent.get_action_and_value(b_obs[mb_inds], b_actions.long()[mb_inds])
                logratio = newlogprob - b_logprobs[mb_inds]
                ratio = logratio.exp()
                with torch.no_grad():
                    clipfracs += [((ratio - 1.0).abs() > clip_coef).float().mean().item()]
                mb_advantages = b_advantages[mb_inds]
                mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)
                pg_loss = torch.max(
                    -mb_advantages * ratio, -mb_advantages * torch.clamp(ratio, 1 - clip_coef, 1 + clip_coef)
                )
                newvalue = newvalue.view(-1)
                v_clipped = b_values[mb_inds] + torch.clamp(newvalue - b_values[mb_inds], -clip_coef, clip_coef)
                v_loss = (
                    0.5 * torch.max((newvalue - b_returns[mb_inds]) ** 2, (v_clipped - b_returns[mb_inds]) ** 2).mean()
                )
                loss = pg_loss.mean() - 0.01 * entropy.mean() + v_loss * 0.5
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), 0.5)
                optimizer.step()
        update_time += time.perf_counter() - tick
    elapsed = time.time() - start_time
    print(f"SPS={int(global_step / elapsed)} env_seconds={env_time:.2f} update_seconds={update_time:.2f}")
    envs.close()


if __name__ == "__main__":
    main()
