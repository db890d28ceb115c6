"""Peer for the population benchmarks: Stable-Baselines3 trained with RL Zoo's tuned hyperparameters, one seed after
another (or in --procs parallel processes), each followed by a seeded deterministic 10-episode evaluation.

    python tests/peers/sb3_zoo.py --algo {ppo,ppo_lstm,a2c,dqn,qrdqn,ddpg,td3,sac} [--seeds 0 1 2] [--procs 1] [--steps N] [--threads 1]

Prints one JSON line per seed on stdout, in completion order:
    {"algo", "env", "seed", "train_secs", "final_return", "steps"}
train_secs is the wall time of model construction and model.learn() only: no interpreter or import start-up (each
process also runs a throwaway forward/backward/Adam step first, so torch's lazy initialisation is not charged to
the first seed), no evaluation. final_return is the mean return of 10 deterministic episodes on a fresh env seeded
10_000 + seed. steps is the number of env steps SB3 took (it rounds a budget up to whole rollouts).

The hyperparameters are written out in ZOO below. They were read from rl-baselines3-zoo's hyperparams/{ppo,a2c,dqn,
qrdqn,ddpg,td3,sac}.yml (entries CartPole-v1 / Pendulum-v1) at the zoo's commit 22e3ff2450fd (2026-04-23); everything the zoo
leaves out is SB3's default, as in the zoo. The budget (n_timesteps, n_envs) is the zoo's; the script compares it with
examples/configs/<config>.toml's run.total_env_steps and env.num_envs and prints any difference to stderr.
Installed by `bash scripts/setup_peers.sh --sb3` into $FLOTILLA_CACHE/peers-venv (see tests/peers/README.md).
"""
import argparse
import json
import multiprocessing as mp
import os
import sys
import time
import tomllib

CONFIGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "configs")

# RL Zoo's tuned entries (rl-baselines3-zoo hyperparams/*.yml at 22e3ff2450fd). "lin_X" in the zoo is a learning
# rate / clip range annealed linearly from X to 0 over training: written here as ("lin", X).
ZOO = {
    # ppo.yml, CartPole-v1 ("# Tuned"): SB3 defaults otherwise (vf_coef 0.5, max_grad_norm 0.5, 64-64 tanh separate
    # actor and critic, Adam eps 1e-5, advantages normalised per minibatch, no value clipping).
    "ppo": dict(env="CartPole-v1", config="cartpole_ppo.toml", n_envs=8, n_timesteps=100_000,
                kwargs=dict(n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20, ent_coef=0.0,
                            learning_rate=("lin", 1e-3), clip_range=("lin", 0.2))),
    # a2c.yml, CartPole-v1: SB3's A2C defaults (n_steps 5, gamma 0.99, gae_lambda 1, lr 7e-4, RMSprop alpha 0.99
    # eps 1e-5, vf_coef 0.5, max_grad_norm 0.5, no advantage normalisation) with 8 envs and no entropy bonus.
    "a2c": dict(env="CartPole-v1", config="cartpole_a2c.toml", n_envs=8, n_timesteps=500_000,
                kwargs=dict(ent_coef=0.0)),
    # dqn.yml, CartPole-v1 ("# Almost Tuned").
    "dqn": dict(env="CartPole-v1", config="cartpole_dqn.toml", n_envs=1, n_timesteps=50_000,
                kwargs=dict(learning_rate=2.3e-3, batch_size=64, buffer_size=100_000, learning_starts=1000,
                            gamma=0.99, target_update_interval=10, train_freq=256, gradient_steps=128,
                            exploration_fraction=0.16, exploration_final_eps=0.04,
                            policy_kwargs=dict(net_arch=[256, 256]))),
    # qrdqn.yml, CartPole-v1 ("# Tuned"): SB3-contrib's QRDQN (Adam eps 0.01 / batch_size, no gradient clipping).
    "qrdqn": dict(env="CartPole-v1", config="cartpole_qrdqn.toml", n_envs=1, n_timesteps=50_000, module="sb3_contrib",
                  kwargs=dict(learning_rate=2.3e-3, batch_size=64, buffer_size=100_000, learning_starts=1000,
                              gamma=0.99, target_update_interval=10, train_freq=256, gradient_steps=128,
                              exploration_fraction=0.16, exploration_final_eps=0.04,
                              policy_kwargs=dict(net_arch=[256, 256], n_quantiles=10))),
    # ppo_lstm.yml, CartPoleNoVel-v1: SB3-contrib's RecurrentPPO, MlpLstmPolicy (ortho_init False, ReLU,
    # lstm_hidden_size 64, enable_critic_lstm True, net_arch pi=[64] vf=[64]), VecNormalize(norm_obs=True,
    # norm_reward=False). CartPoleNoVel is CartPole-v1 keeping observation components 0 and 2 (cart position, pole
    # angle), as our `[env] observe = [0, 2]` does.
    "ppo_lstm": dict(env="CartPole-v1", config="cartpole_masked_ppo_lstm.toml", n_envs=8, n_timesteps=100_000,
                     module="sb3_contrib", cls="RecurrentPPO", policy="MlpLstmPolicy", observe=[0, 2],
                     normalize=dict(norm_obs=True, norm_reward=False),
                     kwargs=dict(n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20, ent_coef=0.0,
                                 learning_rate=("lin", 1e-3), clip_range=("lin", 0.2),
                                 policy_kwargs=dict(ortho_init=False, activation_fn="relu", lstm_hidden_size=64,
                                                    enable_critic_lstm=True, net_arch=dict(pi=[64], vf=[64])))),
    # ddpg.yml, Pendulum-v1 (SB3's DDPG: TD3 with one critic, no policy delay, no target smoothing; batch 256, tau
    # 0.005 are SB3 defaults). noise_std is in the [-1, 1] units SB3 adds noise in.
    "ddpg": dict(env="Pendulum-v1", config="pendulum_ddpg.toml", n_envs=1, n_timesteps=20_000, noise_std=0.1,
                 kwargs=dict(gamma=0.98, buffer_size=200_000, learning_starts=10_000, gradient_steps=1,
                             train_freq=1, learning_rate=1e-3, policy_kwargs=dict(net_arch=[400, 300]))),
    # td3.yml, Pendulum-v1 (policy_delay 2, target_policy_noise 0.2, target_noise_clip 0.5, batch 256, tau 0.005
    # are SB3 defaults).
    "td3": dict(env="Pendulum-v1", config="pendulum_td3.toml", n_envs=1, n_timesteps=20_000, noise_std=0.1,
                kwargs=dict(gamma=0.98, buffer_size=200_000, learning_starts=10_000, gradient_steps=1,
                            train_freq=1, learning_rate=1e-3, policy_kwargs=dict(net_arch=[400, 300]))),
    # sac.yml, Pendulum-v1: learning_rate 1e-3, SB3's SAC defaults otherwise (buffer 1 M, learning_starts 100,
    # batch 256, tau 0.005, gamma 0.99, train_freq 1, gradient_steps 1, ent_coef "auto", 256-256 ReLU).
    "sac": dict(env="Pendulum-v1", config="pendulum_sac.toml", n_envs=1, n_timesteps=20_000,
                kwargs=dict(learning_rate=1e-3)),
}


def compare_with_config(algo):
    """Print to stderr where the zoo's budget differs from our example config's."""
    zoo = ZOO[algo]
    path = os.path.join(CONFIGS, zoo["config"])
    try:
        with open(path, "rb") as f:
            cfg = tomllib.load(f)
    except OSError as e:
        print(f"sb3_zoo: cannot read {path} ({e}); using the zoo's budget", file=sys.stderr)
        return
    ours = {"n_timesteps": cfg["run"]["total_env_steps"], "n_envs": cfg["env"]["num_envs"]}
    for key, value in ours.items():
        if value != zoo[key]:
            print(f"sb3_zoo: {algo}: zoo {key}={zoo[key]} but {zoo['config']} has {value}; using the zoo's",
                  file=sys.stderr)


def resolve(value):
    if isinstance(value, tuple) and value[0] == "lin":
        # The zoo's lin_X: X * progress_remaining (SB3 passes 1 at the start, 0 at the end).
        return lambda progress_remaining, x=value[1]: progress_remaining * x
    return value


def warm_up_torch():
    import torch
    net = torch.nn.Sequential(torch.nn.Linear(4, 64), torch.nn.Tanh(), torch.nn.Linear(64, 2))
    opt = torch.optim.Adam(net.parameters())
    loss = net(torch.randn(64, 4)).pow(2).mean()
    loss.backward()
    opt.step()


def run_seed(algo, seed, steps, threads):
    import numpy as np
    import torch
    import stable_baselines3 as sb3
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.noise import NormalActionNoise

    torch.set_num_threads(threads)
    zoo = ZOO[algo]
    kwargs = {k: resolve(v) for k, v in zoo["kwargs"].items()}

    if "policy_kwargs" in kwargs and kwargs["policy_kwargs"].get("activation_fn") == "relu":
        kwargs["policy_kwargs"] = dict(kwargs["policy_kwargs"], activation_fn=torch.nn.ReLU)
    wrapper = None
    if "observe" in zoo:
        import gymnasium as gym

        keep = zoo["observe"]

        def wrapper(e):
            low, high = e.observation_space.low[keep], e.observation_space.high[keep]
            space = gym.spaces.Box(low, high, dtype=e.observation_space.dtype)
            return gym.wrappers.TransformObservation(e, lambda o: o[keep], space)

    def make(n, s):
        from stable_baselines3.common.vec_env import VecNormalize
        venv = make_vec_env(zoo["env"], n_envs=n, seed=s, wrapper_class=wrapper)
        return VecNormalize(venv, gamma=kwargs.get("gamma", 0.99), **zoo["normalize"]) if "normalize" in zoo else venv

    t0 = time.perf_counter()
    env = make(zoo["n_envs"], seed)
    if "noise_std" in zoo:
        n = env.action_space.shape[0]
        kwargs["action_noise"] = NormalActionNoise(mean=np.zeros(n), sigma=zoo["noise_std"] * np.ones(n))
    if zoo.get("module") == "sb3_contrib":
        import sb3_contrib
        cls = getattr(sb3_contrib, zoo.get("cls", algo.upper()))
    else:
        cls = getattr(sb3, algo.upper())
    model = cls(zoo.get("policy", "MlpPolicy"), env, seed=seed, device="cpu", verbose=0, **kwargs)
    model.learn(total_timesteps=steps, progress_bar=False)
    train_secs = time.perf_counter() - t0

    eval_env = make(1, 10_000 + seed)
    if "normalize" in zoo:
        # Evaluate with the training statistics, frozen (as RL Zoo's enjoy/eval does).
        eval_env.obs_rms = env.obs_rms
        eval_env.training = False
    returns, _ = evaluate_policy(model, eval_env, n_eval_episodes=10, deterministic=True, return_episode_rewards=True)
    return {"algo": algo, "env": zoo["env"], "seed": seed, "train_secs": round(train_secs, 3),
            "final_return": float(np.mean(returns)), "steps": int(model.num_timesteps)}


_warm = False


def worker_pooled(job):
    # One warm-up per pool process, not per seed.
    global _warm
    if not _warm:
        import torch
        torch.set_num_threads(job[3])
        warm_up_torch()
        _warm = True
    return run_seed(*job)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--algo", required=True, choices=sorted(ZOO))
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--procs", type=int, default=1, help="parallel processes (default 1: seeds run in this one)")
    p.add_argument("--steps", type=int, default=None, help="env steps per seed (default: the zoo's n_timesteps)")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads in each process")
    args = p.parse_args()

    compare_with_config(args.algo)
    steps = args.steps if args.steps is not None else ZOO[args.algo]["n_timesteps"]
    if steps != ZOO[args.algo]["n_timesteps"]:
        print(f"sb3_zoo: {args.algo}: --steps {steps} overrides the zoo's {ZOO[args.algo]['n_timesteps']}",
              file=sys.stderr)
    jobs = [(args.algo, seed, steps, args.threads) for seed in args.seeds]
    if args.procs <= 1:
        import torch
        torch.set_num_threads(args.threads)
        warm_up_torch()
        for job in jobs:
            print(json.dumps(run_seed(*job)), flush=True)
    else:
        with mp.get_context("spawn").Pool(args.procs) as pool:
            for result in pool.imap_unordered(worker_pooled, jobs):
                print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
