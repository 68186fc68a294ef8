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
  gamma * V(final_obs) (CleanRL ends all future reward there). GAE reads ends[t] (step t ended its
  episode, either way; the bootstrap is in rewards[t]) where CleanRL reads dones[t + 1].
- Rewards are normalized for every env (CleanRL: Box actions only; values near 100 stall CartPole's
  critic), Box-action observations with one set of statistics for all envs (CleanRL: one per env),
  both in the trainer and in checkpoints (common/normalize.py). Box actions: a diagonal Gaussian.
- Speed: a rollout step only samples actions (`sample`, outside Agent); log-probs and values come
  from one batched pass after the rollout; GAE runs in numpy; Adam is fused.
- Returns are read from gymnasium 1.x's final_info; losses logged are means over the whole update.
- Stops, checkpoints, resume and evaluation go through common/run/ (Ctrl-C saves and exits 130).
"""

import os
import time
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn

from common.multiprocessing_env import SubprocVecEnv
from common.normalize import ObsNormalizer, RewardScaler
from common.run import checkpointing, flags, folder, lifecycle, ranks
from common.run.errors import FlagError


@dataclass
class Args:
    # Experiment
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """the name of this experiment (a plain name: runs/ gets one folder per run)"""
    seed: int = 1
    """seed of the experiment (env i is seeded with seed + i)"""
    cuda: bool = True
    """if toggled, cuda will be enabled by default"""
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
    norm_obs: bool = True
    """Box actions: normalize observations by running statistics over all envs"""
    norm_reward: bool = True
    """rewards / running std of discounted returns (CleanRL: for Box actions only)"""

    # Vector env
    num_workers: int | None = None
    """env worker processes (0: step the envs in the trainer; None: decided, said at start)"""
    max_restarts: int = 0
    """times a crashed, raising or stuck env worker may be replaced (its episodes end truncated)"""
    step_timeout: float | None = None
    """seconds an env step may take before its worker counts as stuck (None: no limit)"""
    num_threads: int = 1
    """torch CPU threads (a 64-unit MLP gains nothing from more; the env workers need the cores)"""


def make_env(args: Args, idx: int, run_dir: Path):
    """A thunk building env `idx`: float32 vectors, raw returns recorded, Box actions clipped."""

    def thunk():
        video = args.capture_video and idx == 0
        env = gym.make(args.env_id, render_mode="rgb_array") if video else gym.make(args.env_id)
        if video:
            env = gym.wrappers.RecordVideo(env, f"{run_dir}/videos")
        env = gym.wrappers.FlattenObservation(env)
        space = env.observation_space
        if isinstance(space, gym.spaces.Box) and space.dtype != np.float32:  # (a Dict's one-hots)
            with np.errstate(over="ignore"):  # bounds past float32's range are its infinities
                low, high = space.low.astype(np.float32), space.high.astype(np.float32)
            box = gym.spaces.Box(low, high, dtype=np.float32)
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


def check_args(args: Args) -> tuple[gym.Space, gym.Space]:
    """Every mistake visible before anything starts, as a FlagError naming the flag; the spaces."""
    flags.check(args, flags.batch_rules(args, "num_envs"))
    probe = make_env(replace(args, capture_video=False), 0, Path())  # built in a process of its own
    found = flags.probe_env(args.env_id, probe, args.step_timeout or 600.0)
    (obs_space, act_space), raw = found["spaces"], found["raw_spaces"][0]
    env = f"--env-id {args.env_id}"
    if not isinstance(obs_space, gym.spaces.Box) or raw.dtype == np.uint8 and len(raw.shape) >= 2:
        raise FlagError(f"{env} has observations {raw}; ppo_vec.py needs ones that flatten to a vector "
                        "(Box, Dict, Tuple, Discrete); for images use ppo_atari_multigpu.py")  # fmt: skip
    if "--norm-obs" in flags.given() and not isinstance(act_space, gym.spaces.Box):
        raise FlagError(f"--norm-obs normalizes the observations of Box-action envs; {env} has "
                        f"{act_space}: drop the flag (Discrete-action envs learn without)")  # fmt: skip
    if not isinstance(act_space, (gym.spaces.Discrete, gym.spaces.Box)) or len(act_space.shape) > 1:
        raise FlagError(f"{env} has action space {act_space}; ppo_vec.py needs Discrete or 1-D Box")
    return obs_space, act_space


def evaluate(args: Args, path: str, device, writer=None) -> list:
    """Raw returns of a checkpoint's greedy policy on one env, printed (and logged if `writer`)."""
    video, env_id = args.capture_video, args.env_id if args.eval_checkpoint else None
    checkpoint, saved = checkpointing.load_for_eval(path, "ppo_vec.py", Args, env_id, capture_video=video)
    env = make_env(saved, 0, Path(path).parent / "eval")()
    agent = Agent(env.observation_space.shape[0], env.action_space).to(device)
    normalize_obs = ObsNormalizer(env.observation_space.shape[0], saved.norm_obs)
    checkpointing.load_state(agent, checkpoint["model"], "--eval-checkpoint", path)
    checkpointing.load_state(normalize_obs, checkpoint["obs_normalizer"], "--eval-checkpoint", path)

    def act(obs):  # normalized as in training, the statistics frozen
        with torch.inference_mode():
            x = torch.as_tensor(normalize_obs(obs[None], update=False), device=device)
            out, _ = agent.get_policy(x)
        return (out[0] if agent.continuous else out[0].argmax()).cpu().numpy()

    return checkpointing.evaluate(env, act, args.eval_episodes, saved.seed + 10_000, writer)  # unseen seeds


def main(args: Args) -> list[float] | None:  # the evaluation's returns with --eval-checkpoint
    args = checkpointing.trained_flags(args, "ppo_vec.py")  # --resume: the run's own flags
    obs_space, action_space = check_args(args)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    torch.set_num_threads(args.num_threads)
    if args.eval_checkpoint is not None:
        return evaluate(args, args.eval_checkpoint, device)
    batch_size = args.num_envs * args.num_steps
    minibatch_size = batch_size // args.num_minibatches
    num_iterations = args.total_timesteps // batch_size
    obs_shape, action_shape, continuous = obs_space.shape, action_space.shape, bool(action_space.shape)
    args = replace(args, norm_obs=args.norm_obs and continuous)  # as args.json records it

    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)  # rollout sampling and minibatch order
    agent = Agent(obs_shape[0], action_space).to(device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)
    scale_rewards = RewardScaler(args.num_envs, args.gamma)
    normalize_obs = ObsNormalizer(obs_shape[0], args.norm_obs)
    modules = {"model": agent, "optimizer": optimizer, "reward_scaler": scale_rewards}
    modules["obs_normalizer"] = normalize_obs
    checkpoints = checkpointing.Checkpoints("ppo_vec.py", args, modules, batch_size)
    checkpoint, start_iteration, run_dir, progress = lifecycle.begin(checkpoints, args, num_iterations)
    if checkpoint:  # None for a new run
        rng.bit_generator.state = checkpoint["rng"][0]
    global_step = progress.first_step

    def to_torch(array):  # shares memory on CPU, one copy to a GPU
        return torch.from_numpy(array).to(device)

    env_fns = [make_env(args, i, run_dir) for i in range(args.num_envs)]
    with (
        SubprocVecEnv(env_fns, **flags.vec_env_options(args)) as envs,
        lifecycle.ending("ppo_vec.py", run_dir, checkpoints, progress, envs.layout) as run,
        folder.open_writer(run_dir, args, first_step=global_step) as writer,
    ):
        folder.announce(f"{args.env_id}, {envs.placement}, agent on {device}", run_dir, checkpoint)
        # the envs as the checkpoint left them, or fresh episodes with seeds this run has not used
        seed = args.seed + global_step // args.num_steps
        next_obs, fresh = checkpointing.start_envs(envs, checkpoint, 0, seed)
        next_obs = normalize_obs(next_obs, update=fresh)  # (a run continued exactly counted these)
        run.snapshot(start_iteration - 1, [rng.bit_generator.state])  # what a stop saves
        obs = np.zeros((args.num_steps, args.num_envs) + obs_shape, dtype=np.float32)  # storage
        action_type = np.float32 if continuous else np.int64
        actions = np.zeros((args.num_steps, args.num_envs) + action_shape, action_type)
        rewards = np.zeros((args.num_steps, args.num_envs), dtype=np.float32)
        ends = np.zeros_like(rewards)  # 1.0: step t ended its episode (terminated or truncated)

        for iteration in range(start_iteration, num_iterations + 1):
            if args.anneal_lr:
                optimizer.param_groups[0]["lr"] = (1.0 - (iteration - 1.0) / num_iterations) * args.learning_rate
            rollout_start, env_time, cuts, episodes = time.perf_counter(), 0.0, [], []

            # ROLLOUT: the policy is fixed until the update, so a step only samples actions
            for step in range(args.num_steps):
                if run.stop_requested():
                    break  # the iteration is dropped: a stop saves the last whole one
                global_step += args.num_envs
                obs[step] = next_obs
                with torch.inference_mode():
                    actions[step] = sample(agent.get_policy(to_torch(next_obs)), rng)
                env_start = time.perf_counter()
                next_obs, reward, terminations, truncations, infos = envs.step(actions[step])
                env_time += time.perf_counter() - env_start
                rewards[step] = scale_rewards(reward, terminations) if args.norm_reward else reward
                next_obs = normalize_obs(next_obs)  # (a cut episode's final_obs: when it is valued)
                ends[step] = terminations | truncations
                # A time-limit cut still has a future: keep its last observation, for V(final_obs)
                cuts += [(step, i, infos["final_obs"][i]) for i in np.flatnonzero(truncations & ~terminations)]
                if "episode" in infos.get("final_info", {}):
                    episode, mask = infos["final_info"]["episode"], infos["final_info"]["_episode"]
                    episodes += [(global_step, episode["r"][i], episode["l"][i]) for i in np.flatnonzero(mask)]

            run.stop_if_asked()  # (under torchrun: if any rank was asked)

            # LOG-PROBS, VALUES AND THE TRUNCATION BOOTSTRAP: one batched pass over the rollout
            update_start = time.perf_counter()
            b_obs, b_actions = to_torch(obs).view((-1,) + obs_shape), to_torch(actions).view((-1,) + action_shape)
            with torch.no_grad():
                _, b_logprobs, _, b_values = agent.get_action_and_value(b_obs, b_actions)
                b_values = b_values.flatten()
                values = b_values.view(rewards.shape).cpu().numpy()
                if cuts:
                    cut_steps, cut_envs, final_obs = zip(*cuts, strict=True)
                    final_obs = normalize_obs(np.stack(final_obs), update=False)
                    final_values = agent.get_value(to_torch(final_obs)).flatten().cpu().numpy()
                    rewards[cut_steps, cut_envs] += args.gamma * final_values
                next_value = agent.get_value(to_torch(next_obs)).flatten().cpu().numpy()

            # GAE
            advantages = compute_gae(rewards, values, ends, next_value, args.gamma, args.gae_lambda)
            returns = advantages + values
            b_advantages, b_returns = to_torch(advantages).flatten(), to_torch(returns).flatten()

            # UPDATE
            stats = defaultdict(list)  # loss name -> one value per minibatch, averaged for the log
            for _epoch in range(args.update_epochs):
                b_inds = rng.permutation(batch_size)
                for start in range(0, batch_size, minibatch_size):
                    run.stop_if_asked()
                    mb_inds = to_torch(b_inds[start : start + minibatch_size])
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

                    optimizer.zero_grad()
                    loss.backward()
                    nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm, foreach=True)
                    optimizer.step()
                    for name, value in [("policy_loss", pg_loss), ("value_loss", v_loss),
                                        ("entropy", entropy_loss), ("old_approx_kl", old_approx_kl),
                                        ("approx_kl", approx_kl), ("clipfrac", clipfrac)]:  # fmt: skip
                        stats[name].append(value.detach())

                if args.target_kl is not None and ranks.mean_over_ranks(approx_kl) > args.target_kl:
                    break  # on the mean over ranks: one rank stopping alone would hang the others
            update_time = time.perf_counter() - update_start
            losses = ranks.mean_losses(stats)
            ranks.check_finite(losses, agent, f"iteration {iteration} (global_step {global_step})")

            # LOGGING
            var_y = np.var(returns)
            explained_var = np.nan if var_y == 0 else 1 - np.var(returns - values) / var_y
            writer.add_scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], global_step)
            for name, value in losses.items():
                writer.add_scalar(f"losses/{name}", value, global_step)
            writer.add_scalar("losses/explained_variance", explained_var, global_step)
            inference = update_start - rollout_start - env_time
            timings = {"env": env_time, "inference": inference, "update": update_time}
            progress.log(writer, global_step, episodes, timings, envs.restarts)  # episodes, SPS

            run.snapshot(iteration, [rng.bit_generator.state])
            if iteration == num_iterations or run.periodic(iteration, args.checkpoint_interval):
                run.save(env_states=[envs.save_env_states()])  # between iterations: the envs' too

        if args.save_model and args.eval_episodes:  # CleanRL's file, saved and evaluated
            evaluate(replace(args, capture_video=False), run.save_model(args.exp_name), device, writer)
        elif args.save_model:
            run.save_model(args.exp_name)


if __name__ == "__main__":
    lifecycle.run(main, Args, __doc__)
