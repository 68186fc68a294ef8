"""PPO for Atari, one rank per GPU (or CPU process) under torchrun, gradients averaged by DDP.

    python ppo_atari_multigpu.py --env-id BreakoutNoFrameskip-v4      # one rank, no torchrun
    torchrun --standalone --nproc_per_node=2 ppo_atari_multigpu.py     # a rank per GPU (or CPU)
    torchrun --nnodes 2 --nproc_per_node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29400 \\
        ppo_atari_multigpu.py
    sbatch slurm/ppo_atari_multigpu.sbatch    # Slurm: a job that comes back until its run is done
    python ppo_atari_multigpu.py --resume runs/<run>/checkpoint.pt       # go on with a stopped run
    python ppo_atari_multigpu.py --eval-checkpoint runs/<run>/checkpoint.pt

Each rank steps `local_num_envs` envs, seeded `seed + rank * local_num_envs + i`;
`total_timesteps` counts the steps of all ranks; rank 0 alone logs and saves. DeepMind's
preprocessing is one wrapper, AtariPipeline (noop reset, frame skip 4 with max-pool, episodic life,
fire on reset, clipped rewards, 84x84 gray, 4 frames); returns logged are raw full-game scores.

Where it departs from CleanRL's ppo_atari_multigpu.py, and why:
- Truncation is not termination (as in ppo_vec.py): a time-limit cut is bootstrapped with
  gamma * V(final_obs); GAE reads ends[t] where CleanRL reads dones[t + 1].
- DDP averages the gradients (CleanRL all-reduces them by hand); the target_kl early stop is
  decided on the mean over ranks (one rank stopping alone hangs the others); env seeds never
  overlap across ranks.
- Speed: a rollout step only samples actions; log-probs and values come from one batched pass
  after it; the ALE is driven frame by frame in one wrapper, not seven (the same numbers, tested).
- Stops, checkpoints, resume and evaluation go through common/run/; ranks agree on a stop once an
  iteration. A run resumed from a --checkpoint-interval save goes on bit for bit.
"""

import os

# Before torch loads OpenMP: idle OpenMP threads then sleep, not spin on the env workers' cores.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

import ale_py
import gymnasium as gym
import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import tyro
from torch.nn.parallel import DistributedDataParallel

from common.atari_wrappers import AtariPipeline
from common.run.errors import FlagError
from common.run.ranks import RankedRun


@dataclass
class Args:
    SCHEDULED: ClassVar[dict[str, str]] = {"anneal_lr": "learning_rate"}  # flag: what it takes to 0 by the end

    # Experiment
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """the name of this experiment (a plain name: runs/ gets one folder per run)"""
    seed: int = 1
    """seed of the experiment (rank r, env i is seeded with seed + r * local_num_envs + i)"""
    torch_deterministic: bool = True
    """if toggled, `torch.backends.cudnn.deterministic=True`"""
    cuda: bool = True
    """train on the GPUs when there are some (--no-cuda: on the CPU)"""
    track: bool = False
    """if toggled, this experiment will be tracked with Weights and Biases (pip install wandb)"""
    wandb_project_name: str = "cleanRL"
    """the wandb's project name"""
    wandb_entity: str | None = None
    """the entity (team) of wandb's project"""
    capture_video: bool = False
    """whether to capture videos of rank 0, env 0 into runs/{run_name}/videos (needs moviepy)"""
    save_model: bool = False
    """whether to save the final model into runs/{run_name}/, then evaluate it"""
    checkpoint_interval: int = 0
    """write runs/{run_name}/checkpoint.pt every this many iterations (0: only when stopped)"""
    resume: str | None = None
    """continue the run saved in this checkpoint, in its folder, with its flags (as many ranks)"""
    run_id: str | None = None
    """a name that outlives restarts (a Slurm job's $SLURM_JOB_ID): the same command again resumes that run"""
    eval_checkpoint: str | None = None
    """evaluate this checkpoint or saved model for --eval-episodes full games instead of training"""
    eval_episodes: int = 10
    """full games to evaluate on, greedy actions (with --save-model or --eval-checkpoint)"""

    # Algorithm
    env_id: str = "BreakoutNoFrameskip-v4"
    """the id of the environment (module:EnvId-v0 imports the module first)"""
    total_timesteps: int = 10000000
    """total timesteps of the experiments, over all ranks"""
    learning_rate: float = 2.5e-4
    """the learning rate of the optimizer"""
    local_num_envs: int = 8
    """the number of parallel game environments per rank"""
    num_steps: int = 128
    """the number of steps to run in each environment per policy rollout"""
    anneal_lr: bool = True
    """Toggle learning rate annealing for policy and value networks"""
    gamma: float = 0.99
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda for the general advantage estimation"""
    num_minibatches: int = 4
    """the number of mini-batches (per rank)"""
    update_epochs: int = 4
    """the K epochs to update the policy"""
    norm_adv: bool = True
    """Toggles advantages normalization"""
    clip_coef: float = 0.1
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
    """the target KL divergence threshold, on the mean over ranks (None: no early stop)"""

    # Distributed
    backend: Literal["nccl", "gloo", "mpi"] | None = None
    """torch.distributed backend (None: nccl with CUDA, gloo without)"""
    device_ids: list[int] = field(default_factory=list)
    """GPU for each local rank (empty: GPU i for local rank i)"""
    num_threads: int | None = None
    """torch CPU threads per rank (None: the rank's share of the cores; a resume keeps the count)"""
    num_workers: int | None = None
    """env worker processes per rank (0: envs step in the trainer; None: its share of the cores)"""
    max_restarts: int = 0
    """times a crashed, raising or stuck env worker may be replaced, per rank (episodes: truncated)"""
    step_timeout: float | None = None
    """seconds an env step may take before its worker counts as stuck (None: 600 s bounds each wait)"""

    # Speed
    overlap: tyro.conf.DisallowNone[bool | None] = None
    """step the envs in two groups of workers, one while the other's actions are drawn (None: with CUDA)"""
    compile: bool = False
    """torch.compile the rollout's policy and the minibatch's losses (LeanRL's flag)"""
    cudagraphs: bool = False
    """also replay them as CUDA graphs (torch.compile's reduce-overhead mode; LeanRL's flag; CUDA only)"""


def make_env(args: Args, idx: int, run_dir: Path | None, noop_max: int = 30):
    """A thunk building env `idx` with DeepMind's preprocessing (common/atari_wrappers.py): noops,
    frame skip 4 with max-pooling, 84x84 gray, a lost life ends the episode, fire on reset, rewards
    clipped, 4 frames; the returns it reports are raw full-game scores. Video: env 0 of rank 0."""

    def thunk():
        gym.register_envs(ale_py)
        ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)  # no banner from every env
        video = args.capture_video and idx == 0 and run_dir is not None
        # obs_type="ram": no RGB frame copied out per frame (the preprocessing reads the screen)
        env = gym.make(args.env_id, frameskip=1, obs_type="ram", render_mode="rgb_array" if video else None)
        env = AtariPipeline(env, noop_max)
        if video:  # a frame per agent step: 4 emulator frames
            fps = env.metadata.get("render_fps", 60) // 4
            env = gym.wrappers.RecordVideo(env, f"{run_dir}/videos", fps=fps)
        return env

    return thunk


def layer_init(layer, std=2**0.5, bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    def __init__(self, num_actions: int):
        super().__init__()
        self.network = nn.Sequential(
            layer_init(nn.Conv2d(4, 32, 8, stride=4)),
            nn.ReLU(),
            layer_init(nn.Conv2d(32, 64, 4, stride=2)),
            nn.ReLU(),
            layer_init(nn.Conv2d(64, 64, 3, stride=1)),
            nn.ReLU(),
            nn.Flatten(),
            layer_init(nn.Linear(64 * 7 * 7, 512)),
            nn.ReLU(),
        )
        self.actor = layer_init(nn.Linear(512, num_actions), std=0.01)
        self.critic = layer_init(nn.Linear(512, 1), std=1)
        self.to(memory_format=torch.channels_last)  # what fast convolutions want (oneDNN, cuDNN)

    def hidden(self, x):
        """The CNN's features of uint8 frames (N, 4, 84, 84), scaled to [0, 1] in the network."""
        return self.network(x.contiguous(memory_format=torch.channels_last) / 255.0)

    def get_value(self, x):
        return self.critic(self.hidden(x))

    def get_policy(self, x, hidden=None):
        """The action distribution at x (logits, None), from the features `hidden` if at hand."""
        return self.actor(self.hidden(x) if hidden is None else hidden), None

    def get_action_and_value(self, x, action):
        """Log-prob and entropy of `action` under the policy at x, and V(x) (`sample` draws)."""
        hidden = self.hidden(x)
        logp = torch.log_softmax(self.get_policy(x, hidden)[0], dim=-1)  # Categorical's, by hand
        logprob = logp.gather(-1, action.long().unsqueeze(-1)).squeeze(-1)
        return action, logprob, -(logp.exp() * logp).sum(-1), self.critic(hidden)

    def forward(self, x, action):
        """What DDP calls in the update, so that backward all-reduces the gradients."""
        return self.get_action_and_value(x, action)


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


def check_args(args: Args, local_world_size: int) -> None:
    """The flags only this script has, as FlagErrors naming the flag, before the env is built."""
    gpus = torch.cuda.device_count() if args.cuda else 0
    ids = args.device_ids or range(local_world_size)
    if args.backend == "nccl" and not gpus:
        raise FlagError("--backend must be gloo without CUDA (or unset), got nccl")
    if gpus and (len(ids) < local_world_size or max(ids) >= gpus):
        raise FlagError(f"--device-ids must be one of {gpus} GPUs for each local rank, got {args.device_ids}")
    if gym.spec(args.env_id.rpartition(":")[2]).entry_point != "ale_py.env:AtariEnv":
        raise FlagError(f"--env-id {args.env_id!r} is not an Atari id (try BreakoutNoFrameskip-v4)")


def main(args: Args, command_line=None) -> list[float] | None:  # the evaluation's returns with --eval-checkpoint
    # torchrun sets these; plain `python` is one rank with no process group
    rank = int(os.environ.get("RANK", 0))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    run = RankedRun(args, command_line, rank, world_size, local_world_size)  # with --resume, the run's own flags
    args = run.args
    check_args(args, local_world_size)
    _, action_space = run.probe(make_env)  # env 0, built in a process of its own
    use_cuda = args.cuda and torch.cuda.is_available()
    device_id = (args.device_ids or range(local_world_size))[local_rank]
    device = torch.device(f"cuda:{device_id}" if use_cuda else "cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    if args.overlap is None:  # on with a GPU, which leaves the cores to the envs; run.start records what ran
        args.overlap = use_cuda
    torch.set_num_threads(args.num_threads)
    local_batch_size = args.local_num_envs * args.num_steps
    local_minibatch_size = local_batch_size // args.num_minibatches
    batch_size = local_batch_size * world_size
    num_iterations = args.total_timesteps // batch_size

    torch.manual_seed(args.seed)  # the same initial weights on every rank; DDP broadcasts rank 0's anyway
    torch.backends.cudnn.deterministic = args.torch_deterministic
    rng = np.random.default_rng([args.seed, rank])  # sampling and minibatch order: a rank's own
    agent = Agent(int(action_space.n)).to(device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)

    def to_torch(array):  # shares memory on CPU; to a GPU from pinned memory, without waiting
        return torch.from_numpy(array).to(device, non_blocking=True)

    def greedy(obs):  # the policy evaluated
        with torch.inference_mode():
            return agent.get_policy(to_torch(obs))[0].argmax(-1).cpu().numpy()

    if args.eval_checkpoint is not None:
        run.load(model=agent)  # the checkpoint's weights
        return run.evaluate(greedy, make_env)

    # What a checkpoint holds, kept at iteration boundaries (every rank's rng and envs): stops resume exactly
    state = {"model": agent, "optimizer": optimizer, "rng": rng}
    if world_size > 1:  # every rank waits here for the others: the process group of the DDP update and run.*
        dist.init_process_group(backend=args.backend or ("nccl" if use_cuda else "gloo"))
    # Every rank enters the run (rank 0 alone makes its folder and writes): a stop, an env failure or a lost rank
    # in the block saves the last boundary kept; its end closes the envs, writes the closing line and destroys
    # the process group. Each run.* call below is one every rank makes at the same point (they hold collectives).
    with run.start(device, num_iterations, batch_size, state) as writer:
        ddp_agent = agent  # what the update calls: with DDP, backward averages gradients over ranks
        if world_size > 1:
            ddp_agent = DistributedDataParallel(agent, device_ids=[device] if use_cuda else None)
        first_seed = args.seed + rank * args.local_num_envs  # env i of this rank: first_seed + i
        # with --overlap the envs step in two groups of workers (envs.groups); gathers the seeds
        envs, next_obs = run.make_envs(make_env, args.local_num_envs, seed=first_seed, groups=2 if args.overlap else 1)
        # Rollout storage, allocated once (what a GPU copies from, pinned); the update reads it as torch tensors
        obs_shape, action_shape = envs.single_observation_space.shape, ()  # Discrete actions
        obs = torch.zeros((args.num_steps, args.local_num_envs) + obs_shape, dtype=torch.uint8, pin_memory=use_cuda)
        actions = torch.zeros((args.num_steps, args.local_num_envs), dtype=torch.int64, pin_memory=use_cuda)
        obs, actions = obs.numpy(), actions.numpy()
        rewards = np.zeros((args.num_steps, args.local_num_envs), dtype=np.float32)
        ends = np.zeros_like(rewards)  # 1.0: step t ended its episode (terminated or truncated)

        def minibatch_losses(mb_inds):  # the update's losses on a minibatch of the rollout (b_*, below)
            _, newlogprob, entropy, newvalue = ddp_agent(b_obs[mb_inds], b_actions[mb_inds])
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

        # at each boundary rank 0 gathers every rank's generators and envs, and saves when due
        for iteration in run.iterations():  # from 1 (or where a resumed run stopped); saves when due
            if args.anneal_lr:
                frac = 1.0 - (iteration - 1.0) / num_iterations
                optimizer.param_groups[0]["lr"] = frac * args.learning_rate
            rollout_start, env_time, cuts, episodes = time.perf_counter(), 0.0, [], []

            # ROLLOUT: the policy is fixed until the update, so a step only samples actions. Each group of envs (two
            # with --overlap) steps while the next one's actions are drawn: round `step` takes its results of step - 1
            for step in range(args.num_steps + 1):
                if run.stop_requested():
                    break  # the iteration is dropped (its steps under way too): the ranks agree on the stop below
                global_step = (iteration - 1) * batch_size + step * args.local_num_envs * world_size
                for group in envs.groups:
                    if step > 0:
                        env_start = time.perf_counter()
                        next_obs[group], reward, terminations, truncations, infos = envs.step_wait(group=group)
                        env_time += time.perf_counter() - env_start
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
                        obs[step, group] = next_obs[group]
                        with torch.inference_mode():
                            actions[step, group] = sample(policy(to_torch(obs[step, group])), rng)
                        envs.step_async(actions[step, group], group)

            run.stop_if_asked()  # if any rank was asked: every rank stops here, together

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
                    final_values = agent.get_value(to_torch(np.stack(final_obs))).flatten().cpu().numpy()
                    rewards[cut_steps, cut_envs] += args.gamma * final_values
                next_value = agent.get_value(to_torch(next_obs)).flatten().cpu().numpy()

            # GAE
            advantages = compute_gae(rewards, values, ends, next_value, args.gamma, args.gae_lambda)
            returns = advantages + values
            b_advantages, b_returns = to_torch(advantages).flatten(), to_torch(returns).flatten()

            # UPDATE
            stats = []  # each minibatch's losses, averaged for the log
            for _epoch in range(args.update_epochs):
                b_inds = rng.permutation(local_batch_size)
                for start in range(0, local_batch_size, local_minibatch_size):
                    if world_size == 1:  # ranks agree once per rollout, above: no collective per minibatch
                        run.stop_if_asked()
                    loss, losses = minibatch_losses(to_torch(b_inds[start : start + local_minibatch_size]))
                    optimizer.zero_grad()
                    loss.backward()
                    nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm, foreach=True)
                    optimizer.step()
                    stats.append(losses.clone())  # (a CUDA graph overwrites its outputs on the next call)

                # losses[4]: approx_kl, on the mean over ranks (one rank stopping alone would hang the others)
                if args.target_kl is not None and run.mean_over_ranks(losses[4]) > args.target_kl:
                    break
            update_time = time.perf_counter() - update_start

            # LOGGING
            var_y = np.var(returns)
            explained_var = np.nan if var_y == 0 else 1 - np.var(returns - values) / var_y
            writer.add_scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], global_step)
            means = run.mean_over_ranks(torch.stack(stats).mean(0))  # over minibatches and ranks
            names = ("policy_loss", "value_loss", "entropy", "old_approx_kl", "approx_kl", "clipfrac")
            for name, value in zip(names, means.tolist(), strict=True):
                writer.add_scalar(f"losses/{name}", value, global_step)
            writer.add_scalar("losses/explained_variance", explained_var, global_step)
            inference = update_start - rollout_start - env_time
            # the episodes (of every rank, gathered), SPS and perf/*_seconds to TensorBoard, the progress line
            run.log(global_step, episodes, {"env": env_time, "inference": inference, "update": update_time})

        if args.save_model and args.eval_episodes:  # CleanRL's file was saved at the end: evaluate it
            run.evaluate(greedy, make_env)


if __name__ == "__main__":
    RankedRun.cli(main, Args, __doc__)  # parses Args, runs main with signals as stop requests, exits
