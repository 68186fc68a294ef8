"""PPO for Atari, one rank per GPU (or CPU process), gradients averaged by DistributedDataParallel (CleanRL style).

    python ppo_atari_multigpu.py --env-id BreakoutNoFrameskip-v4                   # one rank, no torchrun needed
    torchrun --standalone --nproc_per_node=2 ppo_atari_multigpu.py                  # one rank per GPU (gloo on CPU)
    torchrun --nnodes 2 --nproc_per_node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29400 ppo_atari_multigpu.py
    srun torchrun --nnodes $SLURM_NNODES --nproc_per_node 8 --rdzv-backend c10d \\
        --rdzv-endpoint $(scontrol show hostnames $SLURM_NODELIST | head -n1):29400 ppo_atari_multigpu.py
    python ppo_atari_multigpu.py --checkpoint-interval 100 --resume runs/<run_name>/checkpoint.pt  # continue a run

Each rank steps `local_num_envs` envs in its own SubprocVecEnv, seeded `seed + rank * local_num_envs + i`; the
global batch is world_size x local_num_envs x num_steps and `total_timesteps` counts global env steps. Rank 0
alone writes TensorBoard, prints and saves; episode statistics and SPS cover every rank.

Preprocessing (DeepMind): noop reset (<= 30), frame skip 4 with max-pool, episodic life, fire on reset, reward
clipping to [-1, 1] (= sign for ALE's integer rewards), 84x84 grayscale, 4 stacked frames. Logged returns are raw
full-game scores. `ALE/*-v5` ids keep their sticky actions (repeat_action_probability=0.25); `*NoFrameskip-v4`
ids have none. A time-limit cut is bootstrapped from `V(final_obs)`, as in ppo_vec.py.

With --checkpoint-interval N, every N iterations rank 0 atomically writes model, optimizer, iteration, global
step and every rank's RNG state, and all ranks restart their envs from seeds derived from the iteration, so a
run resumed with the same flags continues exactly as if it had never stopped.
"""

import os

# Set before torch loads OpenMP: idle OpenMP threads then sleep at once instead of spinning for a while, which took
# the env workers' cores after every forward pass (env wait 1.0 s -> 0.5 s per iteration at 8 envs on 2 cores).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import signal
import sys
import time
from collections import deque
from dataclasses import asdict, dataclass, field

import ale_py
import gymnasium as gym
import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import tyro
from torch.distributions.categorical import Categorical
from torch.nn.parallel import DistributedDataParallel
from torch.utils.tensorboard import SummaryWriter

from common.atari_wrappers import EpisodicLifeEnv, FireResetEnv
from common.multiprocessing_env import SubprocVecEnv


@dataclass
class Args:
    # Experiment
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """the name of this experiment"""
    seed: int = 1
    """seed of the experiment (rank r, env i is seeded with seed + r * local_num_envs + i)"""
    torch_deterministic: bool = True
    """if toggled, `torch.backends.cudnn.deterministic=True`"""
    cuda: bool = True
    """if toggled, cuda will be enabled by default"""
    track: bool = False
    """if toggled, this experiment will be tracked with Weights and Biases (pip install wandb)"""
    wandb_project_name: str = "cleanRL"
    """the wandb's project name"""
    wandb_entity: str | None = None
    """the entity (team) of wandb's project"""
    capture_video: bool = False
    """whether to capture videos of rank 0, env 0 into runs/{run_name}/videos (pip install moviepy)"""
    save_model: bool = False
    """whether to save the model and its args into runs/{run_name}/, then evaluate it"""
    eval_episodes: int = 10
    """full games to evaluate the saved model on (with --save-model)"""
    checkpoint_interval: int = 0
    """write runs/{run_name}/checkpoint.pt every this many iterations (0: never)"""
    resume: str | None = None
    """continue the run saved in this checkpoint (same flags and world size)"""

    # Algorithm
    env_id: str = "BreakoutNoFrameskip-v4"
    """the id of the environment"""
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
    """the target KL divergence threshold (averaged over ranks before deciding)"""

    # Distributed
    backend: str | None = None
    """torch.distributed backend (default: nccl with CUDA, gloo without)"""
    device_ids: list[int] = field(default_factory=list)
    """GPU for each local rank (default: GPU i for local rank i)"""
    envs_per_worker: int | None = None
    """envs stepped by each worker process (default: spread the rank's envs over its share of the cores)"""
    num_threads: int | None = None
    """torch CPU threads per rank (default: the rank's share of the cores)"""
    max_restarts: int = 0
    """times a crashed, raising or stuck env worker may be replaced, per rank (its episodes end as truncated)"""
    step_timeout: float | None = None
    """seconds an env step may take before its worker counts as stuck (default: no limit)"""


def make_env(env_id: str, idx: int, capture_video: bool, run_name: str):
    def thunk():
        gym.register_envs(ale_py)
        if capture_video and idx == 0:
            env = gym.make(env_id, frameskip=1, render_mode="rgb_array")
            env = gym.wrappers.RecordVideo(env, f"runs/{run_name}/videos")
        else:
            env = gym.make(env_id, frameskip=1)
        env = gym.wrappers.RecordEpisodeStatistics(env)  # below life loss and clipping: raw full-game scores
        env = gym.wrappers.AtariPreprocessing(env, noop_max=30, frame_skip=4, screen_size=84, grayscale_obs=True)
        env = EpisodicLifeEnv(env)
        if env.unwrapped.get_action_meanings()[1:2] == ["FIRE"]:
            env = FireResetEnv(env)
        env = gym.wrappers.ClipReward(env, -1.0, 1.0)
        env = gym.wrappers.FrameStackObservation(env, 4)
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
        # channels_last (NHWC) is the layout oneDNN's and cuDNN's fast convolutions want: updates ~1.5x faster on CPU
        self.to(memory_format=torch.channels_last)

    def hidden(self, x):
        """The CNN's features of uint8 frames (N, 4, 84, 84), scaled to [0, 1] inside the network."""
        return self.network(x.contiguous(memory_format=torch.channels_last) / 255.0)

    def get_value(self, x):
        return self.critic(self.hidden(x))

    def get_action_and_value(self, x, action=None, greedy=False):
        hidden = self.hidden(x)
        logits = self.actor(hidden)
        dist = Categorical(logits=logits, validate_args=False)  # the checks cost more than they catch, every step
        if action is None:
            action = logits.argmax(dim=-1) if greedy else dist.sample()
        return action, dist.log_prob(action), dist.entropy(), self.critic(hidden)

    def forward(self, x, action=None):
        """What DistributedDataParallel calls in the update, so that backward all-reduces the gradients."""
        return self.get_action_and_value(x, action)


def compute_gae(rewards, values, ends, next_value, gamma: float, gae_lambda: float):
    """Generalized advantage estimates, backwards over a rollout. Returns advantages, shape (num_steps, num_envs).

    rewards, values, ends: numpy arrays (num_steps, num_envs); next_value: (num_envs,), V of the observation after
    the last step. ends[t] is 1.0 where step t ended its episode (terminated or truncated): the trace is cut there,
    and the next row belongs to a new episode. Truncation is not termination: for a truncated step the caller has
    already folded `gamma * V(final_obs)` into rewards[t], so after the cut only a real termination has no future.
    (numpy, not torch: this loop is 128 steps of tiny operations, where torch's per-call overhead dominates.)
    """
    advantages = np.zeros_like(rewards)
    lastgaelam = np.zeros_like(next_value)
    for t in reversed(range(rewards.shape[0])):
        nextvalues = next_value if t == rewards.shape[0] - 1 else values[t + 1]
        nextnonterminal = 1.0 - ends[t]
        delta = rewards[t] + gamma * nextvalues * nextnonterminal - values[t]
        advantages[t] = lastgaelam = delta + gamma * gae_lambda * nextnonterminal * lastgaelam
    return advantages


def check_args(args: Args, world_size: int, local_world_size: int) -> None:
    """Every user mistake we can see before starting workers: ValueError naming the flag and what is allowed."""
    for name in ("local_num_envs", "num_steps", "num_minibatches", "update_epochs", "total_timesteps"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    for name, value, ok, allowed in [
        ("learning-rate", args.learning_rate, args.learning_rate > 0, "> 0"),
        ("gamma", args.gamma, 0 < args.gamma <= 1, "in (0, 1]"),
        ("gae-lambda", args.gae_lambda, 0 <= args.gae_lambda <= 1, "in [0, 1]"),
        ("clip-coef", args.clip_coef, args.clip_coef > 0, "> 0"),
        ("max-grad-norm", args.max_grad_norm, args.max_grad_norm > 0, "> 0"),
        ("target-kl", args.target_kl, args.target_kl is None or args.target_kl > 0, "> 0 (or unset)"),
        ("eval-episodes", args.eval_episodes, args.eval_episodes >= 0, ">= 0"),
        ("checkpoint-interval", args.checkpoint_interval, args.checkpoint_interval >= 0, ">= 0 (0: never)"),
        ("envs-per-worker", args.envs_per_worker, args.envs_per_worker is None or args.envs_per_worker >= 1, ">= 1"),
        ("num-threads", args.num_threads, args.num_threads is None or args.num_threads >= 1, ">= 1"),
        ("max-restarts", args.max_restarts, args.max_restarts >= 0, ">= 0"),
        (
            "step-timeout",
            args.step_timeout,
            args.step_timeout is None or args.step_timeout > 0,
            "> 0 seconds (or unset)",
        ),
        ("backend", args.backend, args.backend in (None, "nccl", "gloo", "mpi"), "nccl, gloo or mpi"),
    ]:
        if not ok:
            raise ValueError(f"--{name} must be {allowed}, got {value}")
    local_batch_size = args.local_num_envs * args.num_steps
    if local_batch_size % args.num_minibatches:
        raise ValueError(
            f"--num-minibatches {args.num_minibatches} must divide the per-rank batch size {local_batch_size} "
            f"(--local-num-envs {args.local_num_envs} x --num-steps {args.num_steps})"
        )
    if args.total_timesteps < local_batch_size * world_size:
        raise ValueError(
            f"--total-timesteps {args.total_timesteps} is smaller than one global batch of "
            f"{local_batch_size * world_size} steps ({world_size} ranks x --local-num-envs {args.local_num_envs} "
            f"x --num-steps {args.num_steps})"
        )
    use_cuda = args.cuda and torch.cuda.is_available()
    if args.backend == "nccl" and not use_cuda:
        raise ValueError("--backend nccl needs CUDA; use --backend gloo on CPU (or leave --backend unset)")
    if use_cuda and args.device_ids and len(args.device_ids) < local_world_size:
        raise ValueError(f"--device-ids {args.device_ids} names fewer GPUs than the {local_world_size} local ranks")
    if use_cuda and max(args.device_ids or [local_world_size - 1]) >= torch.cuda.device_count():
        raise ValueError(f"--device-ids/local ranks need GPUs that do not exist: {torch.cuda.device_count()} visible")
    if args.resume is not None:
        if not os.path.isfile(args.resume):
            raise ValueError(f"--resume {args.resume!r} is not a file")
        rng = load_checkpoint(args.resume)["rng"]
        ranks = world_size if rng is None else len(rng)  # a checkpoint written on interrupt has no RNG states
        if ranks != world_size:
            raise ValueError(
                f"--resume {args.resume} was written by {ranks} ranks; resume it with {ranks}, not {world_size}"
            )
    gym.register_envs(ale_py)
    if args.env_id not in gym.registry or gym.spec(args.env_id).entry_point != "ale_py.env:AtariEnv":
        raise ValueError(f"--env-id {args.env_id!r} is not an Atari env id (try BreakoutNoFrameskip-v4 or ALE/Pong-v5)")


def all_ranks(obj, distributed: bool) -> list:
    """`obj` from every rank, in rank order (a list of one without a process group)."""
    if not distributed:
        return [obj]
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, obj)
    return gathered


def load_checkpoint(path: str) -> dict:
    """A checkpoint of this script, or ValueError saying why not. weights_only: loading can never run code."""
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - truncated, corrupted or foreign files all get the same clear error
        raise ValueError(f"--resume {path}: not a readable checkpoint ({type(exc).__name__}: {exc})") from None
    missing = {"model", "optimizer", "rng", "iteration", "global_step"} - set(checkpoint)
    if missing:
        raise ValueError(f"--resume {path}: not a checkpoint of this script (missing {sorted(missing)})")
    return checkpoint


def save_checkpoint(path: str, state: dict) -> None:
    """Write-then-rename: a crash mid-write never replaces the last good checkpoint with a partial one."""
    torch.save(state, path + ".tmp")
    os.replace(path + ".tmp", path)


def evaluate(agent: Agent, env_id: str, eval_episodes: int, seed: int, device) -> list[float]:
    """Greedy-action raw scores over `eval_episodes` full games (a lost life does not end a game here)."""
    env = make_env(env_id, 0, False, "")()
    returns = []
    obs, _ = env.reset(seed=seed)
    while len(returns) < eval_episodes:
        with torch.inference_mode():
            action, *_ = agent.get_action_and_value(torch.as_tensor(np.asarray(obs), device=device)[None], greedy=True)
        obs, _, terminated, truncated, info = env.step(action.item())
        if terminated or truncated:
            if "episode" in info:
                returns.append(float(info["episode"]["r"]))
            obs, _ = env.reset()
    env.close()
    return returns


def main(args: Args) -> int | None:
    """Trains; returns the exit status 128 + signal number when stopped by SIGINT or SIGTERM."""
    # torchrun sets these; plain `python` is one rank with no process group.
    rank, local_rank = int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0))
    world_size, local_world_size = int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    is_main, distributed = rank == 0, world_size > 1
    local_batch_size = args.local_num_envs * args.num_steps
    local_minibatch_size = local_batch_size // args.num_minibatches
    batch_size = local_batch_size * world_size
    num_iterations = args.total_timesteps // batch_size
    use_cuda = args.cuda and torch.cuda.is_available()
    device = torch.device(f"cuda:{(args.device_ids or range(local_world_size))[local_rank]}" if use_cuda else "cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    torch.set_num_threads(args.num_threads or max(1, cores // local_world_size))
    if distributed:
        dist.init_process_group(backend=args.backend or ("nccl" if use_cuda else "gloo"))
    run_name = f"{args.env_id.replace('/', '-')}__{args.exp_name}__{args.seed}__{int(time.time())}"
    writer = None
    envs = None

    # Ctrl-C and SIGTERM (torchrun forwards them to every rank) stop training: save what there is, close, exit.
    received = []

    def stop(signum, frame):
        received.append(signum)
        signal.signal(signum, signal.SIG_DFL)  # a second one ends the process at once
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    try:
        if is_main:
            if args.track:
                import wandb

                wandb.init(
                    project=args.wandb_project_name,
                    entity=args.wandb_entity,
                    sync_tensorboard=True,
                    config=vars(args),
                    name=run_name,
                    monitor_gym=True,
                    save_code=True,
                )
            # max_queue: with the default of 10 pending events, add_scalar waits for the writer thread each time
            # the queue fills (~110 us per call here, when many short episodes end at once)
            writer = SummaryWriter(f"runs/{run_name}", max_queue=1000)
            writer.add_text(
                "hyperparameters",
                "|param|value|\n|-|-|\n" + "\n".join(f"|{key}|{value}|" for key, value in vars(args).items()),
            )
        torch.backends.cudnn.deterministic = args.torch_deterministic

        # Env seeds: seed + rank * local_num_envs + i at the start; a fresh block after each checkpoint.
        def env_seed(iteration: int) -> int:
            return args.seed + (iteration * world_size + rank) * args.local_num_envs

        workers = max(1, min(args.local_num_envs, cores // local_world_size))  # this rank's share of the cores
        envs = SubprocVecEnv(
            [make_env(args.env_id, i, args.capture_video and is_main, run_name) for i in range(args.local_num_envs)],
            envs_per_worker=args.envs_per_worker or -(-args.local_num_envs // workers),
            max_restarts=args.max_restarts,
            step_timeout=args.step_timeout,
        )

        torch.manual_seed(args.seed)  # the same initial weights on every rank (DDP also broadcasts rank 0's)
        agent = Agent(envs.single_action_space.n).to(device)
        optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)  # one kernel
        start_iteration, global_step = 1, 0
        if args.resume is not None:
            checkpoint = load_checkpoint(args.resume)
            if len(checkpoint["rng"]) != world_size:
                raise ValueError(
                    f"--resume {args.resume} was written by {len(checkpoint['rng'])} ranks, not {world_size}"
                )
            agent.load_state_dict(checkpoint["model"])
            optimizer.load_state_dict(checkpoint["optimizer"])
            start_iteration, global_step = checkpoint["iteration"] + 1, checkpoint["global_step"]
            if checkpoint["rng"] is None:  # written on interrupt: the run goes on, though not bit for bit
                torch.manual_seed(args.seed + rank + start_iteration * world_size)
            else:
                torch.set_rng_state(checkpoint["rng"][rank][0])
                if use_cuda and checkpoint["rng"][rank][1] is not None:
                    torch.cuda.set_rng_state(checkpoint["rng"][rank][1])
        else:
            torch.manual_seed(args.seed + rank)  # action sampling and minibatch order differ across ranks
        ddp_agent = DistributedDataParallel(agent, device_ids=[device] if use_cuda else None) if distributed else agent
        checkpoint_path, model_path = f"runs/{run_name}/checkpoint.pt", f"runs/{run_name}/{args.exp_name}.cleanrl_model"

        def write_checkpoint(done: int, rng: list | None) -> None:
            """Rank 0: the state after `done` iterations (rng None: written on interrupt, resumes not bit for bit)."""
            state = {"model": agent.state_dict(), "optimizer": optimizer.state_dict(), "rng": rng, "args": asdict(args)}
            save_checkpoint(checkpoint_path, state | {"iteration": done, "global_step": done * batch_size})

        obs_shape = envs.single_observation_space.shape
        first_seed = env_seed(start_iteration - 1)
        seeds = all_ranks(list(range(first_seed, first_seed + args.local_num_envs)), distributed)
        checksum = sum(p.detach().double().sum().item() for p in agent.parameters())
        if is_main:
            print(f"{world_size} rank(s); env seeds per rank: {seeds}; initial parameter checksum {checksum!r}")

        # Rollout storage, allocated once
        obs = torch.zeros((args.num_steps, args.local_num_envs) + obs_shape, dtype=torch.uint8, device=device)
        actions = torch.zeros((args.num_steps, args.local_num_envs), dtype=torch.int64, device=device)
        logprobs = torch.zeros((args.num_steps, args.local_num_envs), device=device)
        rewards = torch.zeros((args.num_steps, args.local_num_envs), device=device)
        ends = torch.zeros((args.num_steps, args.local_num_envs), device=device)
        values = torch.zeros((args.num_steps, args.local_num_envs), device=device)

        start_time = last_print = time.time()
        start_step = global_step
        recent_returns = deque(maxlen=20)
        next_obs, _ = envs.reset(seed=first_seed)
        next_obs = torch.as_tensor(next_obs, device=device)

        iteration = start_iteration - 1
        try:
            for iteration in range(start_iteration, num_iterations + 1):
                if args.anneal_lr:
                    frac = 1.0 - (iteration - 1.0) / num_iterations
                    optimizer.param_groups[0]["lr"] = frac * args.learning_rate
                env_time, rollout_start, local_episodes = 0.0, time.perf_counter(), []

                # ROLLOUT
                for step in range(args.num_steps):
                    global_step += args.local_num_envs * world_size
                    with torch.inference_mode():
                        obs[step] = next_obs
                        action, logprob, _, value = agent.get_action_and_value(next_obs)
                        values[step] = value.flatten()
                        actions[step] = action
                        logprobs[step] = logprob
                        env_actions = action.cpu().numpy()
                    env_start = time.perf_counter()
                    next_obs_np, reward, terminations, truncations, infos = envs.step(env_actions)
                    env_time += time.perf_counter() - env_start
                    # from_numpy shares memory; the buffer write converts the dtype (and copies to the device)
                    rewards[step] = torch.from_numpy(reward).to(device)
                    ends[step] = torch.from_numpy(terminations | truncations).to(device)
                    next_obs = torch.from_numpy(next_obs_np).to(device)

                    # A time-limit cut still has a future: bootstrap it from the observation the env ended on.
                    cut = np.flatnonzero(truncations & ~terminations)
                    if cut.size:
                        final_obs = torch.as_tensor(np.stack(infos["final_obs"][cut]), device=device)
                        with torch.inference_mode():
                            rewards[step, cut] += args.gamma * agent.get_value(final_obs).flatten()

                    if "final_info" in infos and "episode" in infos["final_info"]:
                        episode, mask = infos["final_info"]["episode"], infos["final_info"]["_episode"]
                        local_episodes += [(float(episode["r"][i]), int(episode["l"][i])) for i in np.flatnonzero(mask)]

                # GAE
                update_start = time.perf_counter()
                inference_time = update_start - rollout_start - env_time  # policy forward passes and bookkeeping
                with torch.no_grad():
                    next_value = agent.get_value(next_obs).flatten()
                arrays = [tensor.cpu().numpy() for tensor in (rewards, values, ends, next_value)]
                advantages = torch.from_numpy(compute_gae(*arrays, args.gamma, args.gae_lambda)).to(device)
                returns = advantages + values

                # UPDATE
                b_obs = obs.reshape((-1,) + obs_shape)
                b_logprobs = logprobs.reshape(-1)
                b_actions = actions.reshape(-1)
                b_advantages = advantages.reshape(-1)
                b_returns = returns.reshape(-1)
                b_values = values.reshape(-1)

                sums = torch.zeros(6, device=device)  # pg, v, entropy, old_approx_kl, approx_kl, clipfrac: update means
                num_updates = 0
                for _ in range(args.update_epochs):
                    b_inds = torch.randperm(local_batch_size, device=device)
                    for start in range(0, local_batch_size, local_minibatch_size):
                        mb_inds = b_inds[start : start + local_minibatch_size]
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

                        optimizer.zero_grad()
                        loss.backward()  # under DDP, gradients arrive here averaged over all ranks
                        nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm, foreach=True)
                        optimizer.step()
                        sums += torch.stack(
                            [pg_loss, v_loss, entropy_loss, old_approx_kl, approx_kl, clipfrac]
                        ).detach()
                        num_updates += 1

                    if args.target_kl is not None:
                        # Decide on the mean over ranks: a rank that stopped alone would hang the others' all-reduce.
                        kl = approx_kl.detach().clone()
                        if distributed:
                            dist.all_reduce(kl)
                            kl /= world_size
                        if kl > args.target_kl:
                            break
                update_time = time.perf_counter() - update_start
                if not (torch.isfinite(sums).all() and all(torch.isfinite(p).all() for p in agent.parameters())):
                    # Parameters are identical on every rank, so every rank stops here, together.
                    raise FloatingPointError(
                        f"iteration {iteration} (global_step {global_step}): the loss or the parameters became "
                        f"NaN/Inf; no checkpoint was written after the last good one. Lower --learning-rate "
                        f"(now {args.learning_rate}) or resume from the last checkpoint"
                    )

                # LOGGING
                if distributed:
                    dist.all_reduce(sums)
                    sums /= world_size
                episodes = [
                    episode for rank_episodes in all_ranks(local_episodes, distributed) for episode in rank_episodes
                ]
                if args.checkpoint_interval and iteration % args.checkpoint_interval == 0:
                    rng = all_ranks(
                        (torch.get_rng_state(), torch.cuda.get_rng_state() if use_cuda else None), distributed
                    )
                    if is_main:
                        write_checkpoint(iteration, rng)
                    next_obs = torch.as_tensor(envs.reset(seed=env_seed(iteration))[0], device=device)
                if not is_main:
                    continue
                y_pred, y_true = b_values.cpu().numpy(), b_returns.cpu().numpy()
                var_y = np.var(y_true)
                explained_var = np.nan if var_y == 0 else 1 - np.var(y_true - y_pred) / var_y
                pg_loss, v_loss, entropy_loss, old_approx_kl, approx_kl, clipfrac = (sums / num_updates).tolist()
                sps = int((global_step - start_step) / (time.time() - start_time))
                for episodic_return, episodic_length in episodes:
                    recent_returns.append(episodic_return)
                    writer.add_scalar("charts/episodic_return", episodic_return, global_step)
                    writer.add_scalar("charts/episodic_length", episodic_length, global_step)
                writer.add_scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], global_step)
                writer.add_scalar("losses/value_loss", v_loss, global_step)
                writer.add_scalar("losses/policy_loss", pg_loss, global_step)
                writer.add_scalar("losses/entropy", entropy_loss, global_step)
                writer.add_scalar("losses/old_approx_kl", old_approx_kl, global_step)
                writer.add_scalar("losses/approx_kl", approx_kl, global_step)
                writer.add_scalar("losses/clipfrac", clipfrac, global_step)
                writer.add_scalar("losses/explained_variance", explained_var, global_step)
                writer.add_scalar("charts/SPS", sps, global_step)
                writer.add_scalar("perf/env_seconds", env_time, global_step)
                writer.add_scalar("perf/inference_seconds", inference_time, global_step)
                writer.add_scalar("perf/update_seconds", update_time, global_step)
                writer.add_scalar("charts/worker_restarts", envs.restarts, global_step)
                if time.time() - last_print > 2 or iteration == num_iterations:
                    last_print = time.time()
                    mean_return = f"{np.mean(recent_returns):.1f}" if recent_returns else "n/a"
                    eta = (args.total_timesteps - global_step) / max(sps, 1)
                    print(
                        f"global_step={global_step}/{args.total_timesteps} SPS={sps} "
                        f"episodic_return={mean_return} (last {len(recent_returns)}) ETA={eta:.0f}s "
                        f"[rank 0: env {env_time:.2f}s, inference {inference_time:.2f}s, update {update_time:.2f}s]",
                        flush=True,
                    )

        except KeyboardInterrupt:
            if is_main:
                name = signal.Signals(received[0]).name if received else "KeyboardInterrupt"
                print(f"stopped by {name} at global_step={global_step}", file=sys.stderr, flush=True)
            if is_main and all(torch.isfinite(p).all() for p in agent.parameters()):
                # No collective calls here: other ranks may be gone. Rank 0's weights are everyone's weights.
                write_checkpoint(iteration - 1, None)  # the iteration under way is dropped; the next run redoes it
                print(f"checkpoint saved to {checkpoint_path} (resume with --resume)", file=sys.stderr)
                if args.save_model:
                    torch.save({"model": agent.state_dict(), "args": asdict(args)}, model_path)
            return 128 + received[0] if received else 130

        checksums = all_ranks(sum(p.detach().double().sum().item() for p in agent.parameters()), distributed)
        if is_main:
            print(f"final parameter checksum per rank: {checksums}")
            if args.save_model:
                torch.save({"model": agent.state_dict(), "args": asdict(args)}, model_path)
                print(f"model saved to {model_path}")
                if args.eval_episodes:
                    episodic_returns = evaluate(agent, args.env_id, args.eval_episodes, args.seed + 10_000, device)
                    for idx, episodic_return in enumerate(episodic_returns):
                        writer.add_scalar("eval/episodic_return", episodic_return, idx)
                    print(f"eval: mean return {np.mean(episodic_returns):.2f} over {len(episodic_returns)} games")
    finally:
        if envs is not None:
            envs.close()
        if writer is not None:
            writer.close()
        if distributed and dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    args = tyro.cli(Args)
    try:
        check_args(args, int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("LOCAL_WORLD_SIZE", 1)))
    except ValueError as exc:
        if int(os.environ.get("RANK", 0)) == 0:
            print(f"ppo_atari_multigpu.py: error: {exc}", file=sys.stderr)
        sys.exit(2)
    try:
        sys.exit(main(args))
    except FloatingPointError as exc:
        sys.exit(f"ppo_atari_multigpu.py: error: {exc}")
