"""Peer for the population benchmarks: PPO on CartPole-v1 in JAX on the CPU, organised the way PureJaxRL's ppo.py
is (written for this repository, not copied): gymnax's CartPole-v1, the whole training run one jitted function of
an RNG key (env stepping in jax.lax.scan, GAE as a reverse scan, epochs x minibatches as nested scans, Adam with
global-norm gradient clipping through optax, linear learning-rate annealing), and many seeds trained at once by
jax.vmap over keys.

    python tests/peers/jax_ppo.py [--seeds N] [--steps 100000]

One core, as the other peers are measured (XLA otherwise uses every core through Eigen's thread pool):
    taskset -c 0 env XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1" \\
        python tests/peers/jax_ppo.py --seeds 16

Prints one JSON line: compile_secs (tracing, lowering and compiling the vmapped training function:
jit(...).lower(keys).compile()), train_secs (one call of the compiled function, blocked with block_until_ready),
per-seed final_return (mean over the 8 envs of each env's last completed episode return at the end of training, as
PureJaxRL's logging reports it), eval_return (mean of 10 deterministic, argmax-action gymnax episodes per seed, a
separately jitted function not counted in either time), steps per seed, and the hyperparameters.

Hyperparameters: RL Zoo's tuned CartPole-v1 PPO, the same as examples/configs/cartpole_ppo.toml: 8 envs, n_steps 32,
one minibatch of 256 per epoch, 20 epochs, gamma 0.98, GAE lambda 0.8, Adam lr 1e-3 (eps 1e-5, SB3's) annealed
linearly to 0, clip range 0.2 annealed linearly to 0 as well, ent_coef 0, vf_coef 0.5, max_grad_norm 0.5,
separate 64-64 tanh actor and critic (orthogonal init, gains sqrt(2) / 0.01 policy head / 1 value head),
advantages normalised per minibatch, no value clipping (SB3's default), 100 K env steps rounded up to whole
rollouts (391 updates, 100,096 steps) as SB3 does. An episode cut by the 500-step limit bootstraps from the value of
its final observation (gymnax 1.0 returns it in info), as SB3 does; PureJaxRL treats it as terminal.
Seed i uses jax.random.PRNGKey(i), whatever N is.
Installed by `bash scripts/setup_peers.sh --jax` into $FLOTILLA_CACHE/peers-jax-venv (tests/peers/README.md).
"""
import argparse
import json
import math
import time

import flax.linen as nn
import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import optax

HP = dict(num_envs=8, n_steps=32, batch_size=256, n_epochs=20, gamma=0.98, gae_lambda=0.8, learning_rate=1e-3,
          adam_eps=1e-5, clip_range=0.2, anneal_lr=True, anneal_clip=True, ent_coef=0.0, vf_coef=0.5,
          max_grad_norm=0.5, hidden=64)


class Mlp(nn.Module):
    out: int
    out_gain: float
    hidden: int = 64

    @nn.compact
    def __call__(self, x):
        for _ in range(2):
            x = nn.tanh(nn.Dense(self.hidden, kernel_init=nn.initializers.orthogonal(math.sqrt(2.0)),
                                 bias_init=nn.initializers.zeros)(x))
        return nn.Dense(self.out, kernel_init=nn.initializers.orthogonal(self.out_gain),
                        bias_init=nn.initializers.zeros)(x)


def make_train(total_steps, hp=HP):
    env, env_params = gymnax.make("CartPole-v1")
    n_actions = env.action_space(env_params).n
    obs_dim = env.observation_space(env_params).shape[0]
    actor = Mlp(n_actions, 0.01, hp["hidden"])
    critic = Mlp(1, 1.0, hp["hidden"])
    num_envs, n_steps = hp["num_envs"], hp["n_steps"]
    rollout = num_envs * n_steps
    num_updates = -(-total_steps // rollout)  # ceil, as SB3's learn loop
    num_minibatches = rollout // hp["batch_size"]
    steps_per_update = hp["n_epochs"] * num_minibatches

    def frac_remaining(update):
        # SB3's progress_remaining after the rollout of update `update` (0-based): 1 - env steps so far / budget;
        # SB3 lets it go slightly negative on the rounded-up last rollout, here it stops at 0.
        return jnp.maximum(0.0, 1.0 - (update + 1) * rollout / total_steps)

    def lr_schedule(count):  # count = optimizer steps taken so far
        if not hp["anneal_lr"]:
            return hp["learning_rate"]
        return hp["learning_rate"] * frac_remaining(count // steps_per_update)

    tx = optax.chain(optax.clip_by_global_norm(hp["max_grad_norm"]),
                     optax.adam(lr_schedule, eps=hp["adam_eps"]))
    v_reset = jax.vmap(env.reset, in_axes=(0, None))
    v_step = jax.vmap(env.step, in_axes=(0, 0, 0, None))

    def train(key):
        key, ka, kc, kr = jax.random.split(key, 4)
        dummy = jnp.zeros((obs_dim,))
        params = {"actor": actor.init(ka, dummy), "critic": critic.init(kc, dummy)}
        opt_state = tx.init(params)
        obs, env_state = v_reset(jax.random.split(kr, num_envs), env_params)
        ep_ret = jnp.zeros(num_envs)
        last_ret = jnp.zeros(num_envs)  # each env's last completed episode return

        def env_step(carry, _):
            params, obs, env_state, ep_ret, last_ret, key = carry
            key, ka, ks = jax.random.split(key, 3)
            logits = actor.apply(params["actor"], obs)
            value = critic.apply(params["critic"], obs)[:, 0]
            action = jax.random.categorical(ka, logits)
            logp = jnp.take_along_axis(jax.nn.log_softmax(logits), action[:, None], 1)[:, 0]
            next_obs, env_state, reward, terminated, truncated, info = v_step(
                jax.random.split(ks, num_envs), env_state, action, env_params)
            done = jnp.logical_or(terminated, truncated)
            ep_ret = ep_ret + reward
            last_ret = jnp.where(done, ep_ret, last_ret)
            ep_ret = jnp.where(done, 0.0, ep_ret)
            # SB3's time-limit handling: an episode cut at 500 steps bootstraps from its final observation.
            final_value = critic.apply(params["critic"], info["final_observation"])[:, 0]
            cut = jnp.logical_and(truncated, jnp.logical_not(terminated))
            learn_reward = reward + hp["gamma"] * jnp.where(cut, final_value, 0.0)
            transition = (obs, action, logp, value, learn_reward, done.astype(jnp.float32))
            return (params, next_obs, env_state, ep_ret, last_ret, key), transition

        def loss_fn(params, batch, clip):
            obs, action, old_logp, adv, ret = batch
            logits = actor.apply(params["actor"], obs)
            log_probs = jax.nn.log_softmax(logits)
            logp = jnp.take_along_axis(log_probs, action[:, None], 1)[:, 0]
            entropy = -(jnp.exp(log_probs) * log_probs).sum(-1).mean()
            value = critic.apply(params["critic"], obs)[:, 0]
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
            ratio = jnp.exp(logp - old_logp)
            pg_loss = -jnp.minimum(ratio * adv, jnp.clip(ratio, 1.0 - clip, 1.0 + clip) * adv).mean()
            v_loss = ((ret - value) ** 2).mean()
            return pg_loss + hp["vf_coef"] * v_loss - hp["ent_coef"] * entropy

        grad_fn = jax.grad(loss_fn)

        def update_step(carry, update):
            params, opt_state, obs, env_state, ep_ret, last_ret, key = carry
            (params, obs, env_state, ep_ret, last_ret, key), traj = jax.lax.scan(
                env_step, (params, obs, env_state, ep_ret, last_ret, key), None, n_steps)
            t_obs, t_action, t_logp, t_value, t_reward, t_done = traj  # each [n_steps, num_envs, ...]
            last_value = critic.apply(params["critic"], obs)[:, 0]

            def gae_step(carry, x):
                gae, next_value = carry
                value, reward, done = x
                delta = reward + hp["gamma"] * next_value * (1.0 - done) - value
                gae = delta + hp["gamma"] * hp["gae_lambda"] * (1.0 - done) * gae
                return (gae, value), gae

            _, adv = jax.lax.scan(gae_step, (jnp.zeros(num_envs), last_value), (t_value, t_reward, t_done),
                                  reverse=True)
            ret = adv + t_value
            flat = jax.tree_util.tree_map(lambda x: x.reshape((rollout,) + x.shape[2:]),
                                          (t_obs, t_action, t_logp, adv, ret))
            clip = hp["clip_range"] * (frac_remaining(update) if hp["anneal_clip"] else 1.0)

            def epoch(carry, _):
                params, opt_state, key = carry
                key, kp = jax.random.split(key)
                perm = jax.random.permutation(kp, rollout)
                minibatches = jax.tree_util.tree_map(
                    lambda x: x[perm].reshape((num_minibatches, hp["batch_size"]) + x.shape[1:]), flat)

                def minibatch(carry, batch):
                    params, opt_state = carry
                    grads = grad_fn(params, batch, clip)
                    updates, opt_state = tx.update(grads, opt_state, params)
                    return (optax.apply_updates(params, updates), opt_state), None

                (params, opt_state), _ = jax.lax.scan(minibatch, (params, opt_state), minibatches)
                return (params, opt_state, key), None

            (params, opt_state, key), _ = jax.lax.scan(epoch, (params, opt_state, key), None, hp["n_epochs"])
            return (params, opt_state, obs, env_state, ep_ret, last_ret, key), None

        carry = (params, opt_state, obs, env_state, ep_ret, last_ret, key)
        carry, _ = jax.lax.scan(update_step, carry, jnp.arange(num_updates))
        params, last_ret = carry[0], carry[5]
        return params, last_ret.mean()

    return train, num_updates * rollout


def make_eval(episodes=10):
    """Deterministic (argmax) evaluation: `episodes` gymnax CartPole-v1 envs side by side for one episode each."""
    env, env_params = gymnax.make("CartPole-v1")
    actor = Mlp(env.action_space(env_params).n, 0.01, HP["hidden"])
    horizon = env_params.max_steps_in_episode
    v_reset = jax.vmap(env.reset, in_axes=(0, None))
    v_step = jax.vmap(env.step, in_axes=(0, 0, 0, None))

    def evaluate(params, key):
        key, kr = jax.random.split(key)
        obs, state = v_reset(jax.random.split(kr, episodes), env_params)

        def step(carry, _):
            obs, state, total, alive, key = carry
            key, ks = jax.random.split(key)
            action = jnp.argmax(actor.apply(params["actor"], obs), -1)
            obs, state, reward, terminated, truncated, _ = v_step(jax.random.split(ks, episodes), state, action,
                                                                  env_params)
            done = jnp.logical_or(terminated, truncated)
            total = total + reward * alive
            alive = alive * (1.0 - done.astype(jnp.float32))
            return (obs, state, total, alive, key), None

        init = (obs, state, jnp.zeros(episodes), jnp.ones(episodes), key)
        (_, _, total, _, _), _ = jax.lax.scan(step, init, None, horizon)
        return total.mean()

    return evaluate


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=1, help="seeds 0..N-1, trained at once with jax.vmap")
    p.add_argument("--steps", type=int, default=100_000, help="env steps per seed (rounded up to whole rollouts)")
    args = p.parse_args()

    train, steps = make_train(args.steps)
    keys = jnp.stack([jax.random.PRNGKey(i) for i in range(args.seeds)])
    t0 = time.perf_counter()
    compiled = jax.jit(jax.vmap(train)).lower(keys).compile()
    compile_secs = time.perf_counter() - t0
    t0 = time.perf_counter()
    params, final = jax.block_until_ready(compiled(keys))
    train_secs = time.perf_counter() - t0

    eval_keys = jnp.stack([jax.random.PRNGKey(10_000 + i) for i in range(args.seeds)])
    eval_returns = jax.jit(jax.vmap(make_eval()))(params, eval_keys)
    print(json.dumps({
        "impl": "jax_ppo", "env": "CartPole-v1", "seeds": args.seeds, "steps": steps,
        "compile_secs": round(compile_secs, 3), "train_secs": round(train_secs, 3),
        "final_return": [float(x) for x in np.asarray(final)],
        "eval_return": [float(x) for x in np.asarray(eval_returns)],
        "jax": jax.__version__, "backend": jax.default_backend(), "hyperparameters": HP,
    }), flush=True)


if __name__ == "__main__":
    main()
