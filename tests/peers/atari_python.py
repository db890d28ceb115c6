"""Peer for flotilla-bench-atari: ale-py's AtariVectorEnv driven from Python with random actions.

    python tests/peers/atari_python.py GAME NUM_ENVS STEPS SEED [AUTORESET_MODE]

Same settings as Flotilla's AtariVecEnv in training (v5 sticky actions, frame skip 4, max-pool, 84x84 grey,
4 stacked frames, noop reset, fire reset, one emulator thread); Gymnasium's default next-step auto-reset, or
AUTORESET_MODE=SameStep (what Flotilla's VectorEnv contract asks of ale-py, so the ratio isolates the bridge).
Prints agent steps per second (frames/s = 4x).
"""
import sys
import time

import numpy as np
from ale_py.vector_env import AtariVectorEnv

game, n, steps, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
mode = sys.argv[5] if len(sys.argv) > 5 else "NextStep"
env = AtariVectorEnv(
    game, n, num_threads=1, repeat_action_probability=0.25, reward_clipping=False, autoreset_mode=mode
)
env.reset(seed=seed)
actions = np.random.default_rng(seed).integers(0, env.single_action_space.n, size=(steps, n))
start = time.perf_counter()
for a in actions:
    env.step(a)
print(steps * n / (time.perf_counter() - start))
