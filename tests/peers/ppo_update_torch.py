"""Peer for flotilla-bench-atari's learner table: the same PPO update in PyTorch, CleanRL's ppo_atari network
and loss (Nature CNN torso, shared by a 0.01-gain policy head and a 1-gain value head; clipped surrogate, clipped
value loss, entropy bonus, global grad-norm clip 0.5, Adam lr 2.5e-4 eps 1e-5), on a rollout of 8 x 128 random
u8 frames: 4 epochs of 4 minibatches of 256, frames divided by 255 inside the network as CleanRL does.

    python tests/peers/ppo_update_torch.py THREADS ROUNDS [VARIANT] [DEVICE]

VARIANT: "default", "channels_last" (model and frames in NHWC memory format), "bf16" (autocast to bfloat16) or
"fp16" (autocast to float16 with a GradScaler, PyTorch's AMP recipe; CUDA only). DEVICE: "cpu" (default) or
"cuda" (timed after torch.cuda.synchronize()). Prints samples per second (each sample counted once per epoch), the median over ROUNDS updates after
a warm-up.
"""
import statistics
import sys
import time

import numpy as np
import torch
from torch import nn

threads, rounds = int(sys.argv[1]), int(sys.argv[2])
variant = sys.argv[3] if len(sys.argv) > 3 else "default"
device = sys.argv[4] if len(sys.argv) > 4 else "cpu"
if variant == "fp16" and device != "cuda":
    sys.exit("fp16 autocast is for cuda")
torch.set_num_threads(threads)
torch.manual_seed(1)


def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    def __init__(self, n_actions):
        super().__init__()
        self.network = nn.Sequential(
            layer_init(nn.Conv2d(4, 32, 8, stride=4)), nn.ReLU(),
            layer_init(nn.Conv2d(32, 64, 4, stride=2)), nn.ReLU(),
            layer_init(nn.Conv2d(64, 64, 3, stride=1)), nn.ReLU(),
            nn.Flatten(),
            layer_init(nn.Linear(64 * 7 * 7, 512)), nn.ReLU(),
        )
        self.actor = layer_init(nn.Linear(512, n_actions), std=0.01)
        self.critic = layer_init(nn.Linear(512, 1), std=1)

    def forward(self, x):
        hidden = self.network(x / 255.0)
        return self.actor(hidden), self.critic(hidden).squeeze(1)


n_envs, n_steps, epochs, minibatch, n_actions = 8, 128, 4, 256, 6
n = n_envs * n_steps
agent = Agent(n_actions).to(device)
obs = torch.randint(0, 256, (n, 4, 84, 84), dtype=torch.uint8, device=device)
if variant == "channels_last":
    agent = agent.to(memory_format=torch.channels_last)
    obs = obs.contiguous(memory_format=torch.channels_last)
optimizer = torch.optim.Adam(agent.parameters(), lr=2.5e-4, eps=1e-5)
actions = torch.randint(0, n_actions, (n,), device=device)
old_log_probs = torch.full((n,), -np.log(n_actions), dtype=torch.float32, device=device)
advantages = torch.randn(n, device=device)
returns = torch.randn(n, device=device)
old_values = torch.randn(n, device=device)
amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(variant)
scaler = torch.amp.GradScaler(device, enabled=variant == "fp16")
clip, ent_coef, vf_coef = 0.1, 0.01, 0.5


def update():
    for _ in range(epochs):
        order = torch.randperm(n, device=device)
        for start in range(0, n, minibatch):
            idx = order[start:start + minibatch]
            with torch.autocast(device, dtype=amp_dtype or torch.bfloat16, enabled=amp_dtype is not None):
                logits, values = agent(obs[idx])
            logits, values = logits.float(), values.float()
            dist = torch.distributions.Categorical(logits=logits)
            log_prob = dist.log_prob(actions[idx])
            ratio = (log_prob - old_log_probs[idx]).exp()
            adv = advantages[idx]
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
            pg_loss = torch.max(-adv * ratio, -adv * ratio.clamp(1 - clip, 1 + clip)).mean()
            v_clipped = old_values[idx] + (values - old_values[idx]).clamp(-clip, clip)
            v_loss = 0.5 * torch.max((values - returns[idx]) ** 2, (v_clipped - returns[idx]) ** 2).mean()
            loss = pg_loss - ent_coef * dist.entropy().mean() + vf_coef * v_loss
            optimizer.zero_grad()
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            nn.utils.clip_grad_norm_(agent.parameters(), 0.5)
            scaler.step(optimizer)
            scaler.update()


def sync():
    if device == "cuda":
        torch.cuda.synchronize()


update()
times = []
for _ in range(rounds):
    sync()
    start = time.perf_counter()
    update()
    sync()
    times.append(time.perf_counter() - start)
print(epochs * n / statistics.median(times))
