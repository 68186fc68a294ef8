"""PPO for flat-observation gymnasium envs, collecting experience from many envs at once (CleanRL style).

    python ppo_vec.py --env-id CartPole-v1 --num-envs 8
    python ppo_vec.py --env-id Pendulum-v1 --num-envs 8 --num-steps 256 --total-timesteps 300000 --gamma 0.9 \\
        --learning-rate 1e-3 --update-epochs 10 --num-minibatches 8 --ent-coef 0 --no-norm-obs --save-model
    python ppo_vec.py --env-id my_package.my_module:MyEnv-v0     # imports my_package.my_module, which registers it
    python ppo_vec.py --env-id CartPole-v1 --eval-checkpoint runs/<run_name>/ppo_vec.cleanrl_model

Envs step in a `common.multiprocessing_env.SubprocVecEnv`, which resets a finished env in the same step and
returns its last observation in `infos["final_obs"]`. A time-limit cut is not an ending: a truncated step is
bootstrapped with `gamma * V(final_obs)`; only a real termination means "no future value".

Discrete actions: categorical policy. Box actions: diagonal Gaussian with a state-independent log-std, clipped to
the action bounds only when stepping the env; each env then also normalizes its observations and rewards (as
CleanRL's ppo_continuous_action.py does; --no-norm-obs, --no-norm-reward turn them off), and a saved model keeps
the observation statistics for evaluation. Pendulum-v1 (observations already in [-8, 8]) learns only without
observation normalization: -223 with the flags above over seeds 1-3, -500 with it.
Episodic returns are logged raw, recorded before any normalization.
"""

import difflib
import importlib
import importlib.util
import os
import random
import signal
import sys
import time
from collections import deque
from dataclasses import asdict, dataclass

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import tyro
from torch.distributions.categorical import Categorical
from torch.distributions.normal import Normal
from torch.utils.tensorboard import SummaryWriter

from common.multiprocessing_env import SubprocVecEnv


@dataclass
class Args:
    # Experiment
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """the name of this experiment"""
    seed: int = 1
    """seed of the experiment (env i is seeded with seed + i)"""
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
    """whether to capture videos of env 0 into runs/{run_name}/videos (pip install moviepy pygame)"""
    save_model: bool = False
    """whether to save the model and its args into runs/{run_name}/, then evaluate it"""
    eval_episodes: int = 10
    """episodes to evaluate the saved model on (with --save-model or --eval-checkpoint)"""
    eval_checkpoint: str | None = None
    """evaluate this saved model for --eval-episodes episodes and exit, instead of training"""

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
    """the target KL divergence threshold"""
    norm_obs: bool = True
    """Box actions: normalize observations by running statistics, as CleanRL (Pendulum-v1 learns without)"""
    norm_reward: bool = True
    """Box actions: scale rewards by a running std of the discounted return, as CleanRL"""

    # Vector env
    envs_per_worker: int | None = None
    """envs stepped by each worker process (default: spread the envs over the CPU cores)"""
    max_restarts: int = 0
    """times a crashed, raising or stuck env worker may be replaced (its envs' episodes end as truncated)"""
    step_timeout: float | None = None
    """seconds an env step may take before its worker counts as stuck (default: no limit)"""
    numpy_rollout: bool = True
    """sample rollout actions with a numpy copy of the actor (fast on CPU; --no-numpy-rollout: torch)"""
    num_threads: int = 1
    """torch CPU threads; the 64-unit MLP gains nothing from more, and the env workers need the cores"""


def make_env(
    env_id: str,
    idx: int,
    capture_video: bool,
    run_name: str,
    gamma: float,
    norm_obs: bool = True,
    norm_reward: bool = True,
    obs_rms=None,
):
    """A thunk building env `idx`. Box-action envs also normalize observations (`norm_obs`; frozen at `obs_rms`
    if given, for evaluation) and rewards (`norm_reward`); RecordEpisodeStatistics sits below both, so returns
    are raw."""

    def thunk():
        if capture_video and idx == 0:
            env = gym.make(env_id, render_mode="rgb_array")
            env = gym.wrappers.RecordVideo(env, f"runs/{run_name}/videos")
        else:
            env = gym.make(env_id)
        env = gym.wrappers.FlattenObservation(env)
        env = gym.wrappers.RecordEpisodeStatistics(env)
        if isinstance(env.action_space, gym.spaces.Box):
            env = gym.wrappers.ClipAction(env)
            if norm_obs:
                env = gym.wrappers.NormalizeObservation(env)
                if obs_rms is not None:
                    env.obs_rms, env.update_running_mean = obs_rms, False
                env = gym.wrappers.TransformObservation(env, lambda obs: np.clip(obs, -10, 10), env.observation_space)
            if norm_reward:
                env = gym.wrappers.NormalizeReward(env, gamma=gamma)
                env = gym.wrappers.TransformReward(env, lambda reward: np.clip(reward, -10, 10))
        return env

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

    def get_action(self, x):
        """Sampled actions only: all a rollout step needs (log-probs and values are computed after the rollout)."""
        out = self.actor(x)
        if self.continuous:
            return Normal(out, self.actor_logstd.expand_as(out).exp(), validate_args=False).sample()
        return Categorical(logits=out, validate_args=False).sample()

    def get_action_and_value(self, x, action=None, greedy=False):
        out = self.actor(x)
        if self.continuous:
            # validate_args=False: the checks cost more than the forward pass of this small net, every step
            dist = Normal(out, self.actor_logstd.expand_as(out).exp(), validate_args=False)
            if action is None:
                action = out if greedy else dist.sample()
            # independent dimensions: joint log-prob and entropy are sums
            return action, dist.log_prob(action).sum(-1), dist.entropy().sum(-1), self.critic(x)
        # Categorical(logits=out)'s log-prob and entropy, written out: same values, a third of its cost per minibatch
        logp = torch.log_softmax(out, dim=-1)
        if action is None:
            action = out.argmax(dim=-1) if greedy else Categorical(logits=out, validate_args=False).sample()
        logprob = logp.gather(-1, action.long().unsqueeze(-1)).squeeze(-1)
        return action, logprob, -(logp.exp() * logp).sum(-1), self.critic(x)


class NumpyPolicy:
    """Samples the agent's actions in numpy, for the rollout; same policy, same distribution as Agent.get_action.

    A rollout step feeds num_envs observations through a 64-unit MLP. In torch that is almost all per-call
    overhead (dispatch, autograd and dtype checks: ~10 us per layer even under inference_mode, and several times
    more right after waiting for the envs, with cold caches); numpy does the same math for a fraction: with the
    batched log-probs and values, a CartPole iteration's non-env rollout time fell from 0.104 s to 0.019 s at 8
    envs (benchmarks/train_speed.py). It reads the actor's weights once per iteration (`sync`): views of the CPU
    parameters, or one copy from a GPU. It knows nn.Linear, nn.Tanh and nn.ReLU; if you give the actor other
    layers, add them here or run with --no-numpy-rollout (torch sampling).
    """

    def __init__(self, agent: Agent, rng: np.random.Generator):
        for layer in agent.actor:
            if not isinstance(layer, (nn.Linear, nn.Tanh, nn.ReLU)):
                raise TypeError(
                    f"NumpyPolicy cannot run a {type(layer).__name__} layer: add it to NumpyPolicy, "
                    "or pass --no-numpy-rollout"
                )
        self.agent, self.rng = agent, rng
        self.sync()

    def sync(self):
        """Reads the actor's current weights (call after every update)."""

        def array(tensor):
            return tensor.detach().cpu().numpy()

        self.layers = [(array(m.weight).T, array(m.bias)) if isinstance(m, nn.Linear) else m for m in self.agent.actor]
        self.std = np.exp(array(self.agent.actor_logstd)) if self.agent.continuous else None

    def act(self, x: np.ndarray) -> np.ndarray:
        for layer in self.layers:
            if isinstance(layer, tuple):
                x = x @ layer[0] + layer[1]
            elif isinstance(layer, nn.Tanh):
                x = np.tanh(x)
            else:
                x = np.maximum(x, 0)
        if self.agent.continuous:
            return x + self.std * self.rng.standard_normal(x.shape)
        # Gumbel-max: the argmax of logits plus Gumbel noise is an exact sample of the categorical distribution
        return np.argmax(x - np.log(-np.log(self.rng.random(x.shape))), axis=-1)


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


def check_args(args: Args) -> None:
    """Every user mistake we can see before starting workers: ValueError naming the flag and what is allowed."""
    positive = {"num_envs": args.num_envs, "num_steps": args.num_steps, "num_minibatches": args.num_minibatches}
    positive |= {
        "update_epochs": args.update_epochs,
        "total_timesteps": args.total_timesteps,
        "num_threads": args.num_threads,
    }
    for name, value in positive.items():
        if value < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    for name, value, ok, allowed in [
        ("learning-rate", args.learning_rate, args.learning_rate > 0, "> 0"),
        ("gamma", args.gamma, 0 < args.gamma <= 1, "in (0, 1]"),
        ("gae-lambda", args.gae_lambda, 0 <= args.gae_lambda <= 1, "in [0, 1]"),
        ("clip-coef", args.clip_coef, args.clip_coef > 0, "> 0"),
        ("max-grad-norm", args.max_grad_norm, args.max_grad_norm > 0, "> 0"),
        ("target-kl", args.target_kl, args.target_kl is None or args.target_kl > 0, "> 0 (or unset)"),
        ("eval-episodes", args.eval_episodes, args.eval_episodes >= 0, ">= 0"),
        ("envs-per-worker", args.envs_per_worker, args.envs_per_worker is None or args.envs_per_worker >= 1, ">= 1"),
        ("max-restarts", args.max_restarts, args.max_restarts >= 0, ">= 0"),
        (
            "step-timeout",
            args.step_timeout,
            args.step_timeout is None or args.step_timeout > 0,
            "> 0 seconds (or unset)",
        ),
    ]:
        if not ok:
            raise ValueError(f"--{name} must be {allowed}, got {value}")
    batch_size = args.num_envs * args.num_steps
    if batch_size % args.num_minibatches:
        raise ValueError(
            f"--num-minibatches {args.num_minibatches} must divide the batch size {batch_size} "
            f"(--num-envs {args.num_envs} x --num-steps {args.num_steps})"
        )
    if args.total_timesteps < batch_size and args.eval_checkpoint is None:
        raise ValueError(
            f"--total-timesteps {args.total_timesteps} is smaller than one batch of {batch_size} steps "
            f"(--num-envs {args.num_envs} x --num-steps {args.num_steps})"
        )
    if args.eval_checkpoint is not None and not os.path.isfile(args.eval_checkpoint):
        raise ValueError(f"--eval-checkpoint {args.eval_checkpoint!r} is not a file")
    for flag, module, extra in [("capture-video", "moviepy", "video"), ("track", "wandb", "wandb")]:
        if getattr(args, flag.replace("-", "_")) and importlib.util.find_spec(module) is None:
            raise ValueError(f"--{flag} needs {module}: pip install -e '.[{extra}]'")

    module, _, name = args.env_id.rpartition(":")
    try:
        if module:
            importlib.import_module(module)
        gym.spec(name)
    except (ImportError, gym.error.Error):
        import ale_py

        gym.register_envs(ale_py)
        if name in gym.registry:
            raise ValueError(f"--env-id {args.env_id} is an Atari game: use ppo_atari_multigpu.py") from None
        close = difflib.get_close_matches(name, list(gym.registry), n=3)
        hint = f"; did you mean {' or '.join(close)}?" if close else ""
        raise ValueError(f"--env-id {args.env_id!r} is not a registered gymnasium env{hint}") from None
    try:
        probe = gym.make(args.env_id)
    except gym.error.DependencyNotInstalled as exc:
        raise ValueError(f"--env-id {args.env_id} needs a package that is not installed: {exc}") from None
    obs_space, act_space = probe.observation_space, probe.action_space
    probe.close()
    if not isinstance(obs_space, gym.spaces.Box) or (obs_space.dtype == np.uint8 and len(obs_space.shape) >= 2):
        atari = "; for image observations use ppo_atari_multigpu.py" if isinstance(obs_space, gym.spaces.Box) else ""
        raise ValueError(
            f"--env-id {args.env_id} has observation space {obs_space}; ppo_vec.py needs a flat Box{atari}"
        )
    if not isinstance(act_space, (gym.spaces.Discrete, gym.spaces.Box)) or len(act_space.shape) > 1:
        raise ValueError(f"--env-id {args.env_id} has action space {act_space}; ppo_vec.py needs Discrete or a 1-D Box")


def merge_obs_rms(stats):
    """One RunningMeanStd from each env's observation statistics (parallel-variance merge)."""
    counts = np.array([s.count for s in stats])
    means, variances = np.stack([s.mean for s in stats]), np.stack([s.var for s in stats])
    mean = (counts[:, None] * means).sum(0) / counts.sum()
    var = (counts[:, None] * (variances + (means - mean) ** 2)).sum(0) / counts.sum()
    merged = gym.wrappers.utils.RunningMeanStd(shape=mean.shape)
    merged.mean, merged.var, merged.count = mean, var, float(counts.sum())
    return merged


def evaluate(model_path: str, eval_episodes: int, run_name: str, device, capture_video: bool = False):
    """Greedy-action returns of a saved model over `eval_episodes` episodes, on one env."""
    checkpoint = torch.load(model_path, map_location=device, weights_only=True)
    saved = checkpoint["args"]
    obs_rms = None
    if checkpoint["obs_rms"] is not None:
        obs_rms = gym.wrappers.utils.RunningMeanStd(shape=tuple(checkpoint["obs_rms"]["mean"].shape))
        obs_rms.mean, obs_rms.var = checkpoint["obs_rms"]["mean"].numpy(), checkpoint["obs_rms"]["var"].numpy()
    # Rewards are not normalized here: the returns reported are raw either way, and nothing learns from them.
    norm_obs = saved.get("norm_obs", True)  # checkpoints from before --norm-obs existed were normalized
    env = make_env(saved["env_id"], 0, capture_video, f"{run_name}-eval", saved["gamma"], norm_obs, False, obs_rms)()
    agent = Agent(int(np.prod(env.observation_space.shape)), env.action_space).to(device)
    agent.load_state_dict(checkpoint["model"])
    returns = []
    obs, _ = env.reset(seed=saved["seed"] + 10_000)  # seeds the training envs never used
    while len(returns) < eval_episodes:
        with torch.inference_mode():
            action, *_ = agent.get_action_and_value(torch.as_tensor(obs, device=device).float()[None], greedy=True)
        obs, _, terminated, truncated, info = env.step(action[0].cpu().numpy())
        if terminated or truncated:
            returns.append(float(info["episode"]["r"]))
            obs, _ = env.reset()
    env.close()
    return returns


def main(args: Args) -> int | None:
    """Trains (or evaluates); returns the exit status 128 + signal number when stopped by SIGINT or SIGTERM."""
    batch_size = args.num_envs * args.num_steps
    minibatch_size = batch_size // args.num_minibatches
    num_iterations = args.total_timesteps // batch_size
    run_name = f"{args.env_id.replace('/', '-').replace(':', '-')}__{args.exp_name}__{args.seed}__{int(time.time())}"
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    torch.set_num_threads(args.num_threads)
    if args.eval_checkpoint is not None:
        returns = evaluate(args.eval_checkpoint, args.eval_episodes, run_name, device, args.capture_video)
        print(f"eval: mean return {np.mean(returns):.2f} over {len(returns)} episodes: {returns}")
        return

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
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic

    # Ctrl-C and SIGTERM (schedulers, `kill`) stop training the same way: save what there is, close, exit.
    received = []

    def stop(signum, frame):
        received.append(signum)
        signal.signal(signum, signal.SIG_DFL)  # a second one ends the process at once
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)

    envs = SubprocVecEnv(
        [
            make_env(args.env_id, i, args.capture_video, run_name, args.gamma, args.norm_obs, args.norm_reward)
            for i in range(args.num_envs)
        ],
        envs_per_worker=args.envs_per_worker,
        max_restarts=args.max_restarts,
        step_timeout=args.step_timeout,
    )
    try:
        obs_dim = int(np.prod(envs.single_observation_space.shape))
        agent = Agent(obs_dim, envs.single_action_space).to(device)
        optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)  # one kernel

        # Rollout storage, allocated once. The rollout works in numpy, as the envs do; the update reads it as
        # torch tensors (shared memory on CPU, one copy per iteration to a GPU).
        action_shape = envs.single_action_space.shape
        shape = (args.num_steps, args.num_envs)
        obs = np.zeros(shape + (obs_dim,), dtype=np.float32)
        actions = np.zeros(shape + action_shape, dtype=np.float32 if agent.continuous else np.int64)
        rewards = np.zeros(shape, dtype=np.float32)
        ends = np.zeros(shape, dtype=np.float32)  # 1.0: step t ended its episode (terminated or truncated)
        final_obs = np.zeros(shape + (obs_dim,), dtype=np.float32)  # the last observation of a truncated episode
        cut = np.zeros(shape, dtype=bool)  # step t was truncated, not terminated: its future still has value
        if args.numpy_rollout:
            policy = NumpyPolicy(agent, np.random.default_rng(args.seed))
            act = policy.act
        else:

            def act(x):
                with torch.inference_mode():
                    return agent.get_action(torch.from_numpy(x).to(device)).cpu().numpy()

        def to_torch(array):
            return torch.from_numpy(array).to(device)

        global_step = 0
        start_time = last_print = time.time()
        recent_returns = deque(maxlen=20)
        next_obs, _ = envs.reset(seed=args.seed)

        try:
            for iteration in range(1, num_iterations + 1):
                if args.anneal_lr:
                    frac = 1.0 - (iteration - 1.0) / num_iterations
                    optimizer.param_groups[0]["lr"] = frac * args.learning_rate
                if args.numpy_rollout:
                    policy.sync()
                env_time, rollout_start = 0.0, time.perf_counter()

                # ROLLOUT. The policy does not change until the update, so a step only samples actions; the
                # log-probs and values of the whole batch come from one forward pass after the rollout.
                cut[:] = False
                for step in range(args.num_steps):
                    global_step += args.num_envs
                    obs[step] = next_obs.reshape(args.num_envs, obs_dim)
                    actions[step] = act(obs[step])
                    env_start = time.perf_counter()
                    next_obs, reward, terminations, truncations, infos = envs.step(actions[step])
                    env_time += time.perf_counter() - env_start
                    if not (np.isfinite(next_obs).all() and np.isfinite(reward).all()):
                        bad = ~(np.isfinite(next_obs.reshape(args.num_envs, -1)).all(1) & np.isfinite(reward))
                        raise FloatingPointError(
                            f"iteration {iteration} (global_step {global_step}): envs {np.flatnonzero(bad).tolist()} "
                            "returned NaN/Inf observations or rewards, so nothing was saved"
                        )
                    rewards[step] = reward
                    ends[step] = terminations | truncations

                    # A time-limit cut still has a future: keep the observation the env ended on, for V(final_obs)
                    cut[step] = truncations & ~terminations
                    if cut[step].any():
                        final_obs[step, cut[step]] = np.stack(infos["final_obs"][cut[step]]).reshape(-1, obs_dim)

                    if "final_info" in infos and "episode" in infos["final_info"]:
                        episode, mask = infos["final_info"]["episode"], infos["final_info"]["_episode"]
                        for i in np.flatnonzero(mask):
                            recent_returns.append(float(episode["r"][i]))
                            writer.add_scalar("charts/episodic_return", episode["r"][i], global_step)
                            writer.add_scalar("charts/episodic_length", episode["l"][i], global_step)

                # LOG-PROBS, VALUES, TRUNCATION BOOTSTRAP, GAE
                update_start = time.perf_counter()
                inference_time = update_start - rollout_start - env_time  # action sampling and bookkeeping
                b_obs, b_actions = to_torch(obs).view(-1, obs_dim), to_torch(actions).view((-1,) + action_shape)
                with torch.no_grad():
                    _, b_logprobs, _, b_values = agent.get_action_and_value(b_obs, b_actions)
                    b_values = b_values.flatten()
                    values = b_values.cpu().numpy().reshape(shape)
                    rewards[cut] += args.gamma * agent.get_value(to_torch(final_obs[cut])).cpu().numpy().flatten()
                    next_value = agent.get_value(to_torch(next_obs.reshape(args.num_envs, obs_dim)).float())
                next_value = next_value.cpu().numpy().flatten()
                advantages = compute_gae(rewards, values, ends, next_value, args.gamma, args.gae_lambda)
                returns = advantages + values
                b_advantages, b_returns = to_torch(advantages).flatten(), to_torch(returns).flatten()

                # UPDATE
                b_inds = np.arange(batch_size)
                sums = torch.zeros(6, device=device)  # pg, v, entropy, old_approx_kl, approx_kl, clipfrac: update means
                num_updates = 0
                for _ in range(args.update_epochs):
                    np.random.shuffle(b_inds)
                    for start in range(0, batch_size, minibatch_size):
                        mb_inds = to_torch(b_inds[start : start + minibatch_size])  # one conversion, 8 lookups
                        _, newlogprob, entropy, newvalue = agent.get_action_and_value(
                            b_obs[mb_inds], b_actions[mb_inds]
                        )
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
                        stats = (pg_loss, v_loss, entropy_loss, old_approx_kl, approx_kl, clipfrac)
                        sums += torch.stack([s.detach() for s in stats])
                        num_updates += 1

                    if args.target_kl is not None and approx_kl > args.target_kl:
                        break
                update_time = time.perf_counter() - update_start
                if not (torch.isfinite(sums).all() and all(torch.isfinite(p).all() for p in agent.parameters())):
                    raise FloatingPointError(
                        f"iteration {iteration} (global_step {global_step}): the loss or the parameters became "
                        f"NaN/Inf, so nothing was saved; look for NaN/Inf in observations or rewards, or lower "
                        f"--learning-rate (now {args.learning_rate})"
                    )

                # LOGGING
                y_pred, y_true = values.flatten(), returns.flatten()
                var_y = np.var(y_true)
                explained_var = np.nan if var_y == 0 else 1 - np.var(y_true - y_pred) / var_y
                pg_loss, v_loss, entropy_loss, old_approx_kl, approx_kl, clipfrac = (sums / num_updates).tolist()
                sps = int(global_step / (time.time() - start_time))
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
                        f"[iteration: env {env_time:.2f}s, inference {inference_time:.2f}s, update {update_time:.2f}s]",
                        flush=True,
                    )

        except KeyboardInterrupt:
            name = signal.Signals(received[0]).name if received else "KeyboardInterrupt"
            print(f"stopped by {name} at global_step={global_step}; shutting down", file=sys.stderr, flush=True)

        if args.save_model:
            model_path = f"runs/{run_name}/{args.exp_name}.cleanrl_model"
            obs_rms = None
            if agent.continuous and args.norm_obs:
                if received:
                    try:
                        envs.step_wait()  # an interrupted step may still be in flight
                    except gym.error.NoAsyncCallError:
                        pass
                merged = merge_obs_rms(envs.get_attr("obs_rms"))
                obs_rms = {"mean": torch.as_tensor(merged.mean), "var": torch.as_tensor(merged.var)}
            torch.save({"model": agent.state_dict(), "args": asdict(args), "obs_rms": obs_rms}, model_path)
            print(f"model saved to {model_path}")
            if args.eval_episodes and not received:
                episodic_returns = evaluate(model_path, args.eval_episodes, run_name, device)
                for idx, episodic_return in enumerate(episodic_returns):
                    writer.add_scalar("eval/episodic_return", episodic_return, idx)
                print(f"eval: mean return {np.mean(episodic_returns):.2f} over {len(episodic_returns)} episodes")
    finally:
        envs.close()
        writer.close()
    return 128 + received[0] if received else None


if __name__ == "__main__":
    args = tyro.cli(Args)
    try:
        check_args(args)
    except ValueError as exc:
        sys.exit(f"ppo_vec.py: error: {exc}")
    try:
        sys.exit(main(args))
    except FloatingPointError as exc:
        sys.exit(f"ppo_vec.py: error: {exc}")
