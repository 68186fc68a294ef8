"""PPO for flat-observation gymnasium envs (Discrete or Box actions), stepping many envs at once.

    python ppo_vec.py --env-id CartPole-v1 --num-envs 8
    python ppo_vec.py --env-id Pendulum-v1 --num-envs 8 --num-steps 256 --gamma 0.9 \\
        --total-timesteps 300000 --learning-rate 1e-3 --update-epochs 10 --num-minibatches 8 \\
        --ent-coef 0 --no-norm-obs
    python ppo_vec.py --env-id my_module:MyEnv-v0        # imports my_module, which registers it
    python ppo_vec.py --resume runs/<run>/checkpoint.pt  # go on with a stopped run, its own flags
    python ppo_vec.py --eval-checkpoint runs/<run>/checkpoint.pt

Where it departs from CleanRL's ppo.py, and why:
- Truncation is not termination: a step cut by a time limit is bootstrapped, its reward plus
  gamma * V(final_obs). GAE reads ends[t] (step t ended its episode) where CleanRL reads dones[t + 1].
- Rewards are normalized for every env (CleanRL: Box actions only; values near 100 stall CartPole's
  critic), Box-action observations with one set of statistics for all envs (CleanRL: one per env),
  in the trainer (common/normalize.py). Box actions: a diagonal Gaussian.
- Speed: a rollout step only samples actions; log-probs and values come from one batched pass after
  the rollout; GAE runs in numpy; Adam is fused; --overlap, --compile, --cudagraphs.
- Returns are read from gymnasium 1.x's final_info; losses logged are means over the whole update.
- Stops, checkpoints, resume and evaluation go through one Run object (common/run/), weight for weight.
"""

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import tyro

from common.normalize import ObsNormalizer, RewardScaler
from common.run import Run
from common.run.errors import FlagError


@dataclass
class Args:
    SCHEDULED: ClassVar[dict[str, str]] = {"anneal_lr": "learning_rate"}  # flag: what it takes to 0 by the end

    # Experiment
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """the name of this experiment (a plain name: runs/ gets one folder per run)"""
    seed: int = 1
    """seed of the experiment (env i is seeded with seed + i)"""
    cuda: bool = True
    """train on the GPU when there is one (--no-cuda: on the CPU)"""
    track: bool = False
    """if toggled, this experiment will be tracked with Weights and Biases (pip install wandb)"""
    wandb_project_name: str = "cleanRL"
    """the wandb's project name"""
    wandb_entity: str | None = None
    """the entity (team) of wandb's project"""
    capture_video: bool = False
    """whether to capture videos of env 0 into runs/{run_name}/videos (needs moviepy)"""
    save_model: bool = False
    """whether to save the final model into runs/{run_name}/, then evaluate it"""
    checkpoint_interval: int = 0
    """write runs/{run_name}/checkpoint.pt every this many iterations (0: only when stopped)"""
    resume: str | None = None
    """continue the run saved in this checkpoint, in its folder, with the flags it was trained on"""
    run_id: str | None = None
    """a name that outlives restarts (a Slurm job's $SLURM_JOB_ID): the same command again resumes that run"""
    eval_checkpoint: str | None = None
    """evaluate this checkpoint or saved model for --eval-episodes episodes instead of training"""
    eval_episodes: int = 10
    """episodes to evaluate on, greedy actions (with --save-model or --eval-checkpoint)"""

    # Algorithm
    env_id: str = "CartPole-v1"
    """the id of the environment (module:EnvId-v0 imports the module first)"""
    total_timesteps: int = 500000
    """total timesteps of the experiments"""
    learning_rate: float = 2.5e-4
    """the learning rate of the optimizer"""
    num_envs: int = 8
    """the number of parallel game environments"""
    num_steps: int = 128
    """the number of steps to run in each environment per policy rollout"""
    anneal_lr: bool = True
    """Toggle learning rate annealing for policy and value networks"""
    gamma: float = 0.99
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda for the general advantage estimation"""
    num_minibatches: int = 4
    """the number of mini-batches"""
    update_epochs: int = 4
    """the K epochs to update the policy"""
    norm_adv: bool = True
    """Toggles advantages normalization"""
    clip_coef: float = 0.2
    """the surrogate clipping coefficient"""
    clip_vloss: bool = True
    """Toggles whether or not to use a clipped loss for the value function, as per the paper."""
    ent_coef: float = 0.01
    """coefficient of the entropy"""
    vf_coef: float = 0.5
    """coefficient of the value function"""
    max_grad_norm: float = 0.5
    """the maximum norm for the gradient clipping"""
    target_kl: float | None = None
    """the target KL divergence threshold (None: no early stop)"""
    norm_obs: tyro.conf.DisallowNone[bool | None] = None
    """normalize observations by running statistics over all envs (None: on for Box actions only)"""
    norm_reward: bool = True
    """rewards / running std of discounted returns (CleanRL: for Box actions only)"""

    # Vector env and speed
    num_workers: int | None = None
    """env worker processes (0: step the envs in the trainer; None: decided, said at start)"""
    max_restarts: int = 0
    """times a crashed, raising or stuck env worker may be replaced (its episodes end truncated)"""
    step_timeout: float | None = None
    """seconds an env step may take before its worker counts as stuck (None: 600 s bounds each wait)"""
    num_threads: int = 1
    """torch CPU threads (a 64-unit MLP gains nothing from more; the env workers need the cores)"""
    overlap: tyro.conf.DisallowNone[bool | None] = None
    """step the envs in two groups of workers, one while the other's actions are drawn (None: with CUDA)"""
    compile: bool = False
    """torch.compile the rollout's policy and the minibatch's losses (LeanRL's flag)"""
    cudagraphs: bool = False
    """also replay them as CUDA graphs (torch.compile's reduce-overhead mode; LeanRL's flag; CUDA only)"""


def make_env(args: Args, idx: int, run_dir: Path | None):
    """A thunk building env `idx`: float32 vectors, raw returns recorded, Box actions clipped."""

    def thunk():
        video = args.capture_video and idx == 0 and run_dir is not None
        env = gym.make(args.env_id, render_mode="rgb_array") if video else gym.make(args.env_id)
        if video:
            env = gym.wrappers.RecordVideo(env, f"{run_dir}/videos")
        space = env.observation_space
        if not space.is_np_flattenable or (space.dtype == np.uint8 and len(space.shape) >= 2):
            raise ValueError(
                f"{args.env_id} has observations {space}; ppo_vec.py needs ones that flatten to a "
                "vector (Box, Dict, Tuple, Discrete); for images use ppo_atari_multigpu.py"
            )
        if not (isinstance(space, gym.spaces.Box) and len(space.shape) == 1):
            env = gym.wrappers.FlattenObservation(env)
        space = env.observation_space
        if isinstance(space, gym.spaces.Box) and space.dtype != np.float32:  # a Dict's one-hots
            with np.errstate(over="ignore"):  # bounds past float32's range are its infinities
                box = gym.spaces.Box(space.low.astype(np.float32), space.high.astype(np.float32))
            env = gym.wrappers.TransformObservation(env, lambda obs: obs.astype(np.float32), box)
        env = gym.wrappers.RecordEpisodeStatistics(env)
        return gym.wrappers.ClipAction(env) if isinstance(env.action_space, gym.spaces.Box) else env

    return thunk


def layer_init(layer, std=2**0.5, bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    def __init__(self, obs_dim: int, action_space: gym.Space):
        super().__init__()
        self.continuous = isinstance(action_space, gym.spaces.Box)
        out_dim = int(np.prod(action_space.shape)) if self.continuous else int(action_space.n)
        self.critic = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 1), std=1.0),
        )
        self.actor = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, out_dim), std=0.01),
        )
        if self.continuous:
            self.actor_logstd = nn.Parameter(torch.zeros(1, out_dim))

    def get_value(self, x):
        return self.critic(x)

    def get_policy(self, x):
        """The action distribution at x: (logits, None) or (mean, std)."""
        out = self.actor(x)
        return (out, self.actor_logstd.expand_as(out).exp()) if self.continuous else (out, None)

    def get_action_and_value(self, x, action):
        """Log-prob and entropy of `action` under the policy at x, and V(x) (`sample` draws)."""
        out, std = self.get_policy(x)
        if self.continuous:  # independent dimensions: joint log-prob and entropy are sums
            dist = torch.distributions.Normal(out, std, validate_args=False)
            return action, dist.log_prob(action).sum(-1), dist.entropy().sum(-1), self.critic(x)
        # Categorical(logits=out)'s log-prob and entropy, written out: a third of its cost
        logp = torch.log_softmax(out, dim=-1)
        logprob = logp.gather(-1, action.long().unsqueeze(-1)).squeeze(-1)
        return action, logprob, -(logp.exp() * logp).sum(-1), self.critic(x)


def sample(policy: tuple, rng: np.random.Generator) -> np.ndarray:
    """One action per row of Agent.get_policy's output, drawn with rng (in checkpoints)."""
    out, std = (None if p is None else p.cpu().numpy() for p in policy)
    if std is not None:
        return out + std * rng.standard_normal(out.shape)
    return np.argmax(out + rng.gumbel(size=out.shape), axis=-1)  # Gumbel-max: a categorical sample


def compute_gae(rewards, values, ends, next_value, gamma: float, gae_lambda: float):
    """GAE over a rollout of (num_steps, num_envs) arrays: ends[t] is 1.0 where step t ended its
    episode, next_value is V after the last step. Truncation is not termination: the caller added
    gamma * V(final_obs) to the reward of a truncated step."""
    advantages = np.zeros_like(rewards)
    lastgaelam = np.zeros_like(next_value)
    for t in reversed(range(rewards.shape[0])):
        nextvalues = next_value if t == rewards.shape[0] - 1 else values[t + 1]
        nextnonterminal = 1.0 - ends[t]
        delta = rewards[t] + gamma * nextvalues * nextnonterminal - values[t]
        advantages[t] = lastgaelam = delta + gamma * gae_lambda * nextnonterminal * lastgaelam
    return advantages


def check_args(args: Args, action_space: gym.Space) -> None:
    """The flags only this script has, and those that depend on the env's spaces, as FlagErrors."""
    env, box = f"--env-id {args.env_id}", isinstance(action_space, gym.spaces.Box)
    if not (box and len(action_space.shape) == 1 or isinstance(action_space, gym.spaces.Discrete)):
        raise FlagError(f"{env} has action space {action_space}; ppo_vec.py needs Discrete or 1-D Box")
    if args.overlap and (box if args.norm_obs is None else args.norm_obs):
        raise FlagError("--overlap steps each step in two groups of envs, which --norm-obs cannot: add --no-norm-obs")
    if args.norm_obs and not box:
        raise FlagError(
            f"--norm-obs normalizes the observations of Box-action envs; {env} has {action_space}: "
            "drop the flag (Discrete-action envs learn without)"
        )


def main(args: Args, command_line=None) -> list[float] | None:  # the evaluation's returns with --eval-checkpoint
    run = Run(args, command_line)  # with --resume or --eval-checkpoint, the flags the run was trained with
    args = run.args
    obs_space, action_space = run.probe(make_env)  # env 0, built in a process of its own
    check_args(args, action_space)
    continuous = isinstance(action_space, gym.spaces.Box)
    if args.norm_obs is None:  # on for Box actions; run.start records what ran in args.json
        args.norm_obs = continuous
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    if args.overlap is None:  # on with a GPU, which leaves the cores to the envs
        args.overlap = device.type == "cuda" and not args.norm_obs
    torch.set_num_threads(args.num_threads)
    batch_size = args.num_envs * args.num_steps
    minibatch_size = batch_size // args.num_minibatches
    num_iterations = args.total_timesteps // batch_size
    obs_shape, action_shape = obs_space.shape, action_space.shape

    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)  # rollout sampling and minibatch order
    agent = Agent(obs_shape[0], action_space).to(device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)
    scale_rewards = RewardScaler(args.num_envs, args.gamma)
    normalize_obs = ObsNormalizer(obs_shape[0], args.norm_obs)

    def to_torch(array):  # shares memory on CPU; to a GPU from pinned memory, without waiting
        return torch.from_numpy(array).to(device, non_blocking=True)

    def greedy(obs):  # the policy evaluated: observations normalized as in training, statistics frozen
        with torch.inference_mode():
            out, _ = agent.get_policy(to_torch(normalize_obs(obs, update=False)))
        return (out if continuous else out.argmax(-1)).cpu().numpy()

    if args.eval_checkpoint is not None:
        run.load(model=agent, obs_normalizer=normalize_obs)  # the checkpoint's weights and statistics
        return run.evaluate(greedy, make_env)

    # What a checkpoint holds, kept at iteration boundaries: a stopped run, resumed, goes on weight for weight
    state = {"model": agent, "optimizer": optimizer, "rng": rng}
    state |= {"reward_scaler": scale_rewards, "obs_normalizer": normalize_obs}
    # the run folder (or the resumed one, its state put back); a stop or an env failure in the block saves the
    # last boundary kept; its end closes the envs and writes summary.json and the closing line
    with run.start(device, num_iterations, batch_size, state) as writer:
        # env i: seed + i, or as saved; with --overlap in two groups of workers (envs.groups)
        envs, next_obs = run.make_envs(make_env, args.num_envs, seed=args.seed, groups=2 if args.overlap else 1)
        # Rollout storage, allocated once (what a GPU copies from, pinned); the update reads it as torch tensors
        pinned, action_type = device.type == "cuda", torch.float32 if continuous else torch.int64
        obs = torch.zeros((args.num_steps, args.num_envs) + obs_shape, pin_memory=pinned).numpy()
        actions = torch.zeros(obs.shape[:2] + action_shape, dtype=action_type, pin_memory=pinned).numpy()
        rewards = np.zeros((args.num_steps, args.num_envs), dtype=np.float32)
        ends = np.zeros_like(rewards)  # 1.0: step t ended its episode (terminated or truncated)

        def minibatch_losses(mb_inds):  # the update's losses on a minibatch of the rollout (b_*, below)
            _, newlogprob, entropy, newvalue = agent.get_action_and_value(b_obs[mb_inds], b_actions[mb_inds])
            logratio = newlogprob - b_logprobs[mb_inds]
            ratio = logratio.exp()

            with torch.no_grad():
                # calculate approx_kl http://joschu.net/blog/kl-approx.html
                old_approx_kl = (-logratio).mean()
                approx_kl = ((ratio - 1) - logratio).mean()
                clipfrac = ((ratio - 1.0).abs() > args.clip_coef).float().mean()

            mb_advantages = b_advantages[mb_inds]
            if args.norm_adv:
                mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)

            # Policy loss
            pg_loss1 = -mb_advantages * ratio
            pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
            pg_loss = torch.max(pg_loss1, pg_loss2).mean()

            # Value loss
            newvalue = newvalue.view(-1)
            if args.clip_vloss:
                v_loss_unclipped = (newvalue - b_returns[mb_inds]) ** 2
                v_clipped = b_values[mb_inds] + torch.clamp(
                    newvalue - b_values[mb_inds], -args.clip_coef, args.clip_coef
                )
                v_loss_clipped = (v_clipped - b_returns[mb_inds]) ** 2
                v_loss = 0.5 * torch.max(v_loss_unclipped, v_loss_clipped).mean()
            else:
                v_loss = 0.5 * ((newvalue - b_returns[mb_inds]) ** 2).mean()

            entropy_loss = entropy.mean()
            loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef
            return loss, torch.stack((pg_loss, v_loss, entropy_loss, old_approx_kl, approx_kl, clipfrac)).detach()

        # --compile: torch.compile's kernels for the policy and the losses; --cudagraphs: each replayed as a
        # CUDA graph too (LeanRL's flags). The weights then differ from eager's in the last bits
        policy = agent.get_policy
        if args.compile or args.cudagraphs:
            policy = torch.compile(policy, mode="reduce-overhead" if args.cudagraphs else None)
            minibatch_losses = torch.compile(minibatch_losses, mode="reduce-overhead" if args.cudagraphs else None)

        for iteration in run.iterations():  # from 1 (or where a resumed run stopped); saves when due
            if args.anneal_lr:
                frac = 1.0 - (iteration - 1.0) / num_iterations
                optimizer.param_groups[0]["lr"] = frac * args.learning_rate
            rollout_start, env_time, cuts, episodes = time.perf_counter(), 0.0, [], []

            # ROLLOUT: the policy is fixed until the update, so a step only samples actions. Each group of envs (two
            # with --overlap) steps while the next one's actions are drawn: round `step` takes its results of step - 1
            for step in range(args.num_steps + 1):
                global_step = (iteration - 1) * batch_size + step * args.num_envs
                for group in envs.groups:
                    if step > 0:
                        env_start = time.perf_counter()
                        next_obs[group], reward, terminations, truncations, infos = envs.step_wait(group=group)
                        env_time += time.perf_counter() - env_start
                        if args.norm_reward:  # updates each env's statistics
                            reward = scale_rewards(reward, terminations, group)
                        rewards[step - 1, group] = reward
                        ends[step - 1, group] = terminations | truncations
                        # A time-limit cut still has a future: keep its last observation, for V(final_obs)
                        for i in np.flatnonzero(truncations & ~terminations):
                            cuts.append((step - 1, group.start + i, infos["final_obs"][i]))
                        if "episode" in infos.get("final_info", {}):
                            episode = infos["final_info"]["episode"]
                            for i in np.flatnonzero(infos["final_info"]["_episode"]):
                                episodes.append((global_step, episode["r"][i], episode["l"][i]))
                    if step < args.num_steps:
                        obs[step, group] = normalize_obs(next_obs[group])  # updates its statistics first
                        with torch.inference_mode():
                            actions[step, group] = sample(policy(to_torch(obs[step, group])), rng)
                        envs.step_async(actions[step, group], group)

            # LOG-PROBS, VALUES AND THE TRUNCATION BOOTSTRAP: one batched pass over the rollout
            update_start = time.perf_counter()
            b_obs = to_torch(obs).view((-1,) + obs_shape)
            b_actions = to_torch(actions).view((-1,) + action_shape)
            with torch.no_grad():
                _, b_logprobs, _, b_values = agent.get_action_and_value(b_obs, b_actions)
                b_values = b_values.flatten()
                values = b_values.view(rewards.shape).cpu().numpy()
                if cuts:
                    cut_steps, cut_envs, final_obs = zip(*cuts, strict=True)
                    final_obs = normalize_obs(np.stack(final_obs), update=False)
                    final_values = agent.get_value(to_torch(final_obs)).flatten().cpu().numpy()
                    rewards[cut_steps, cut_envs] += args.gamma * final_values
                next_value = agent.get_value(to_torch(normalize_obs(next_obs, update=False))).flatten().cpu().numpy()

            # GAE
            advantages = compute_gae(rewards, values, ends, next_value, args.gamma, args.gae_lambda)
            returns = advantages + values
            b_advantages, b_returns = to_torch(advantages).flatten(), to_torch(returns).flatten()

            # UPDATE
            stats = []  # each minibatch's losses, averaged for the log
            for _epoch in range(args.update_epochs):
                b_inds = rng.permutation(batch_size)
                for start in range(0, batch_size, minibatch_size):
                    run.stop_if_asked()  # a stop ends the run here, and saves the last iteration boundary
                    loss, losses = minibatch_losses(to_torch(b_inds[start : start + minibatch_size]))
                    optimizer.zero_grad()
                    loss.backward()
                    nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm, foreach=True)
                    optimizer.step()
                    stats.append(losses.clone())  # (a CUDA graph overwrites its outputs on the next call)

                if args.target_kl is not None and losses[4] > args.target_kl:  # losses[4]: approx_kl
                    break
            update_time = time.perf_counter() - update_start

            # LOGGING
            var_y = np.var(returns)
            explained_var = np.nan if var_y == 0 else 1 - np.var(returns - values) / var_y
            writer.add_scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], global_step)
            names = ("policy_loss", "value_loss", "entropy", "old_approx_kl", "approx_kl", "clipfrac")
            for name, value in zip(names, torch.stack(stats).mean(0).tolist(), strict=True):
                writer.add_scalar(f"losses/{name}", value, global_step)  # the mean over the update
            writer.add_scalar("losses/explained_variance", explained_var, global_step)
            inference = update_start - rollout_start - env_time
            # the episodes (of every rank, gathered), SPS and perf/*_seconds to TensorBoard, the progress line
            run.log(global_step, episodes, {"env": env_time, "inference": inference, "update": update_time})

        if args.save_model and args.eval_episodes:  # the <exp-name>.cleanrl_model saved at the end: evaluate it
            run.evaluate(greedy, make_env)


if __name__ == "__main__":
    Run.cli(main, Args, __doc__)  # parses Args, runs main with signals as stop requests, exits with its status
