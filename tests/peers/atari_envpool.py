"""Peer for flotilla-bench-atari: EnvPool's Atari envs with random actions, the same settings as Flotilla's
training envs (v5 sticky actions 0.25, frame skip 4, noop reset <= 30, 84x84 grey, 4 stacked frames, life-loss
episodes, clipped rewards), one worker thread.

    python tests/peers/atari_envpool.py GAME NUM_ENVS STEPS SEED

Prints agent steps per second (frames/s = 4x). GAME is ale-py's ROM name (pong, breakout).
"""
import sys
import time

import envpool
import numpy as np

game, n, steps, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
task = "".join(part.capitalize() for part in game.split("_")) + "-v5"
env = envpool.make(
    task, env_type="gymnasium", num_envs=n, batch_size=n, num_threads=1, seed=seed,
    repeat_action_probability=0.25, noop_max=30, frame_skip=4, stack_num=4, img_height=84, img_width=84,
    episodic_life=True, reward_clip=True,
)
env.reset()
actions = np.random.default_rng(seed).integers(0, env.action_space.n, size=(steps, n))
start = time.perf_counter()
for a in actions:
    env.step(a)
print(steps * n / (time.perf_counter() - start))
