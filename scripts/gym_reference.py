#!/usr/bin/env python
"""Record Gymnasium classic-control transitions for flotilla-envs' reference tests.

Run with the project venv (gymnasium 1.2.2, numpy 2.x):

    /root/.cache/flotilla/venv/bin/python scripts/gym_reference.py [--out envs/tests/data]

For each case below, the script makes the env with ``gym.make`` (so the registered ``TimeLimit`` is
on), and for many short rollouts: resets, overwrites ``env.unwrapped.state`` with a chosen state
(random, near a termination or clipping boundary, outside the usual ranges) and
``env._elapsed_steps`` (often just below the limit, so truncation happens inside the rollout), then
steps with random actions (continuous ones partly out of range, which Gymnasium clips) and records
what comes back. Rollouts sometimes step on past the end of an episode, which Gymnasium allows
(CartPole then rewards 0; the time limit keeps truncating). ``envs/tests/gym_reference.rs`` replays
every file. Output is deterministic for a given gymnasium/numpy/libm.

File format (text, one record per line, whitespace-separated tokens; ``#`` starts a comment line):

    env <id>
    max_episode_steps <n>
    kwarg <key> <f|i|b> <value>          (zero or more; Rust-side kwargs, b is 0/1)
    rollout <elapsed_steps> <f64|f32> <n> <state_1> ... <state_n>
    step <m> <action_1> ... <action_m> <k> <obs_1> ... <obs_k> <reward> <terminated> <truncated> <n> <state_1> ... <state_n>

``rollout`` starts a rollout: reset, set the state (held as a NumPy array of the given dtype), set the
elapsed step count. Each following ``step`` applies its action (an integer for discrete envs, f32
values otherwise) and gives Gymnasium's observation (f32, shortest round-trip decimal), reward (f64),
``terminated`` and ``truncated`` exactly as the TimeLimit-wrapped env returned them (0/1), and
``env.unwrapped.state`` afterwards (f64, shortest round-trip decimal). States of every env are in
Gymnasium's element order.
"""

import argparse
import logging
import math
import os
import sys
import warnings

import gymnasium as gym
import numpy as np

SEED = 20240607
PI = math.pi


def f64(x):
    """Shortest decimal that round-trips as an f64."""
    return repr(float(x))


def f32(x):
    """Shortest decimal that round-trips as an f32."""
    return str(np.float32(x))


class Case:
    """One reference file: an env id, its kwargs and how to draw states and actions."""

    def __init__(self, name, env_id, rollouts, sample_state, sample_action, make_kwargs=None,
                 rust_kwargs=(), setup=None, max_len=8, f32_state_prob=0.0):
        self.name = name
        self.env_id = env_id
        self.rollouts = rollouts
        self.sample_state = sample_state
        self.sample_action = sample_action
        self.make_kwargs = make_kwargs or {}
        self.rust_kwargs = list(rust_kwargs)
        self.setup = setup
        self.max_len = max_len
        self.f32_state_prob = f32_state_prob


# --------------------------------------------------------------------------------------------------
# States. Each sampler gets the generator and the unwrapped env (for boundary searches).

def mixture(rng, parts):
    """Pick one sampler by weight and call it."""
    weights = np.array([w for w, _ in parts], dtype=float)
    i = rng.choice(len(parts), p=weights / weights.sum())
    return parts[i][1]()


def cartpole_state(rng, env):
    tau = env.tau
    x_thr, th_thr = env.x_threshold, env.theta_threshold_radians

    def typical():
        return [rng.uniform(-2.4, 2.4), rng.uniform(-3, 3), rng.uniform(-0.21, 0.21), rng.uniform(-3, 3)]

    def near_x():
        # x + tau * x_dot lands within 1e-3 of +-2.4 (sometimes exactly on it).
        x_dot = rng.uniform(-2, 2)
        sign = rng.choice([-1.0, 1.0])
        d = 0.0 if rng.random() < 0.2 else rng.uniform(-1e-3, 1e-3)
        return [sign * x_thr - tau * x_dot + d, x_dot, rng.uniform(-0.1, 0.1), rng.uniform(-1, 1)]

    def near_theta():
        th_dot = rng.uniform(-2, 2)
        sign = rng.choice([-1.0, 1.0])
        d = 0.0 if rng.random() < 0.2 else rng.uniform(-1e-3, 1e-3)
        return [rng.uniform(-1, 1), rng.uniform(-1, 1), sign * th_thr - tau * th_dot + d, th_dot]

    def reset_like():
        return list(rng.uniform(-0.05, 0.05, size=4))

    def wide():
        return [rng.uniform(-5, 5), rng.uniform(-10, 10), rng.uniform(-0.5, 0.5), rng.uniform(-10, 10)]

    return mixture(rng, [(4, typical), (1.5, near_x), (1.5, near_theta), (1, reset_like), (2, wide)])


def acrobot_state(rng, env):
    v1, v2 = env.MAX_VEL_1, env.MAX_VEL_2

    def typical():
        return [rng.uniform(-PI, PI), rng.uniform(-PI, PI), rng.uniform(-v1, v1), rng.uniform(-v2, v2)]

    def reset_like():
        return [float(v) for v in rng.uniform(-0.1, 0.1, size=4).astype(np.float32)]

    def near_goal():
        # Free end within 0.1 of the bar, slow: termination decided by small margins.
        while True:
            t1, t2 = rng.uniform(-PI, PI, size=2)
            if abs(-math.cos(t1) - math.cos(t1 + t2) - 1.0) < 0.1:
                return [t1, t2, rng.uniform(-0.5, 0.5), rng.uniform(-0.5, 0.5)]

    def edges():
        # Angles just outside [-pi, pi] (wrap) and velocities at or beyond the bounds (bound).
        t = [rng.choice([-1, 1]) * (PI + rng.uniform(0, 0.3)) for _ in range(2)]
        return t + [rng.choice([-1, 1]) * (v1 + rng.uniform(-0.5, 2)), rng.choice([-1, 1]) * (v2 + rng.uniform(-0.5, 3))]

    return mixture(rng, [(4, typical), (2, reset_like), (2.5, near_goal), (1.5, edges)])


def mountain_car_state(goal):
    def sample(rng, env):
        def typical():
            return [rng.uniform(-1.2, 0.6), rng.uniform(-0.07, 0.07)]

        def reset_like():
            return [rng.uniform(-0.6, -0.4), 0.0]

        def near_goal():
            p = goal if rng.random() < 0.2 else goal + rng.uniform(-0.01, 0.01)
            return [p, rng.uniform(-0.005, 0.005)]

        def near_wall():
            return [rng.uniform(-1.2, -1.15), rng.uniform(-0.07, 0.0)]

        def fast():
            return [rng.uniform(-1.0, 0.4), rng.choice([-1, 1]) * (0.07 + rng.uniform(-1e-3, 1e-3))]

        return mixture(rng, [(4, typical), (1.5, reset_like), (1.5, near_goal), (1.5, near_wall), (1.5, fast)])

    return sample


def goal_boundary_f32(rng, env, sample_action):
    """A float32 MountainCarContinuous state whose next position lands within a few f32 ulps of the
    goal (0.45 as f32), found by fixed-point iteration on a copy of the env."""
    target = np.float32(env.goal_position)
    p = np.float32(target - 0.002)
    v = np.float32(rng.uniform(0.0005, 0.002))
    action = sample_action(rng)
    probe = type(env)(goal_velocity=env.goal_velocity)
    for _ in range(8):
        probe.state = np.array([p, v], dtype=np.float32)
        obs, *_ = probe.step(action)
        miss = np.float32(obs[0]) - target
        if miss == 0:
            break
        p = np.float32(p - miss)
    ulps = int(rng.integers(-2, 3))
    p = np.nextafter(p, np.float32(np.inf if ulps > 0 else -np.inf), dtype=np.float32) if ulps else p
    return [float(p), float(v)], action


def pendulum_state(rng, env):
    def typical():
        return [rng.uniform(-PI, PI), rng.uniform(-8, 8)]

    def wide():
        return [rng.uniform(-20, 20), rng.uniform(-12, 12)]

    def special():
        return [float(rng.choice([-PI, 0.0, PI, 3 * PI, -2 * PI])), float(rng.choice([-8.0, 0.0, 8.0, 7.99]))]

    def reset_like():
        return [rng.uniform(-PI, PI), rng.uniform(-1, 1)]

    return mixture(rng, [(5, typical), (2.5, wide), (1, special), (1.5, reset_like)])


# --------------------------------------------------------------------------------------------------
# Actions.

def discrete(n):
    return lambda rng: int(rng.integers(0, n))


def continuous(bound, special):
    def sample(rng):
        u = rng.random()
        if u < 0.6:
            a = rng.uniform(-bound, bound)
        elif u < 0.85:
            a = rng.uniform(-3 * bound, 3 * bound)
        else:
            a = rng.choice(special)
        return np.array([a], dtype=np.float32)

    return sample


MCC_ACTION = continuous(1.0, [-1.0, 1.0, 0.0, 1.0000001, -1.0000001, 50.0, -50.0])
PENDULUM_ACTION = continuous(2.0, [-2.0, 2.0, 0.0, 1e-8, 2.0000002, 100.0, -100.0])


def cartpole_physics(env):
    env.gravity = 9.81
    env.masscart = 1.3
    env.masspole = 0.2
    env.total_mass = env.masspole + env.masscart
    env.length = 0.7
    env.polemass_length = env.masspole * env.length
    env.force_mag = 12.0
    env.tau = 0.01


CASES = [
    Case("CartPole-v1", "CartPole-v1", 400, cartpole_state, discrete(2)),
    Case("CartPole-v1-sutton_barto", "CartPole-v1", 60, cartpole_state, discrete(2),
         make_kwargs={"sutton_barto_reward": True}, rust_kwargs=[("sutton_barto_reward", "b", 1)]),
    Case("CartPole-v1-physics", "CartPole-v1", 60, cartpole_state, discrete(2), setup=cartpole_physics,
         rust_kwargs=[("gravity", "f", 9.81), ("masscart", "f", 1.3), ("masspole", "f", 0.2),
                      ("length", "f", 0.7), ("force_mag", "f", 12.0), ("tau", "f", 0.01)]),
    Case("Acrobot-v1", "Acrobot-v1", 320, acrobot_state, discrete(3)),
    Case("MountainCar-v0", "MountainCar-v0", 270, mountain_car_state(0.5), discrete(3)),
    Case("MountainCar-v0-goal_velocity", "MountainCar-v0", 50, mountain_car_state(0.5), discrete(3),
         make_kwargs={"goal_velocity": 0.001}, rust_kwargs=[("goal_velocity", "f", 0.001)]),
    Case("MountainCarContinuous-v0", "MountainCarContinuous-v0", 300, mountain_car_state(0.45), MCC_ACTION,
         f32_state_prob=0.25),
    Case("MountainCarContinuous-v0-goal_velocity", "MountainCarContinuous-v0", 50, mountain_car_state(0.45),
         MCC_ACTION, make_kwargs={"goal_velocity": 0.001}, rust_kwargs=[("goal_velocity", "f", 0.001)],
         f32_state_prob=0.25),
    Case("Pendulum-v1", "Pendulum-v1", 270, pendulum_state, PENDULUM_ACTION),
    Case("Pendulum-v1-g9.81", "Pendulum-v1", 60, pendulum_state, PENDULUM_ACTION,
         make_kwargs={"g": 9.81}, rust_kwargs=[("g", "f", 9.81)]),
]


def action_tokens(action):
    if isinstance(action, np.ndarray):
        return [str(action.size)] + [f32(a) for a in action]
    return ["1", str(int(action))]


def record(case, rng):
    env = gym.make(case.env_id, disable_env_checker=True, **case.make_kwargs)
    if case.setup is not None:
        case.setup(env.unwrapped)
    limit = env._max_episode_steps
    lines = [
        "# flotilla-envs reference transitions recorded from Python Gymnasium",
        f"# by scripts/gym_reference.py (gymnasium {gym.__version__}, numpy {np.__version__}, seed {SEED});"
        " format documented there",
        f"env {case.env_id}",
        f"max_episode_steps {limit}",
    ]
    lines += [f"kwarg {k} {t} {v}" for k, t, v in case.rust_kwargs]
    transitions = 0
    for r in range(case.rollouts):
        env.reset(seed=SEED + r)
        forced_action = None
        dtype = np.float64
        if case.f32_state_prob and rng.random() < case.f32_state_prob:
            # Gymnasium holds MountainCarContinuous's state as float32 after every step.
            dtype = np.float32
            if rng.random() < 0.6:
                state, forced_action = goal_boundary_f32(rng, env.unwrapped, case.sample_action)
            else:
                state = [float(np.float32(s)) for s in case.sample_state(rng, env.unwrapped)]
        else:
            state = case.sample_state(rng, env.unwrapped)
        env.unwrapped.state = np.array(state, dtype=dtype)
        elapsed = int(rng.integers(0, 20)) if rng.random() < 0.7 else limit - int(rng.integers(1, 5))
        env._elapsed_steps = elapsed
        lines.append(" ".join(["rollout", str(elapsed), "f32" if dtype == np.float32 else "f64", str(len(state))]
                              + [f64(s) for s in state]))
        for t in range(int(rng.integers(1, case.max_len + 1))):
            action = forced_action if (t == 0 and forced_action is not None) else case.sample_action(rng)
            obs, reward, terminated, truncated, _ = env.step(action)
            after = np.asarray(env.unwrapped.state, dtype=np.float64)
            lines.append(" ".join(
                ["step"] + action_tokens(action) + [str(len(obs))] + [f32(o) for o in obs]
                + [f64(reward), str(int(terminated)), str(int(truncated)), str(len(after))]
                + [f64(s) for s in after]))
            transitions += 1
            if (terminated or truncated) and rng.random() < 0.6:
                break
    env.close()
    return lines, transitions


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default_out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "envs", "tests", "data")
    parser.add_argument("--out", default=default_out, help="output folder (default: envs/tests/data)")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    gym.logger.min_level = 50
    rng = np.random.default_rng(SEED)
    for case in CASES:
        lines, transitions = record(case, rng)
        path = os.path.join(args.out, f"{case.name}.txt")
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
        print(f"{path}: {transitions} transitions, {os.path.getsize(path)} bytes", file=sys.stderr)


if __name__ == "__main__":
    main()
