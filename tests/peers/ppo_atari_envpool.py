"""Peer for the Pong speed comparison: PPO on Atari as CleanRL's ppo_atari_envpool.py runs it, in PyTorch with
EnvPool, written here from its description (not a copy): 8 envs x 128 steps, GAE (0.99, 0.95), 4 epochs of 4
minibatches, clipped surrogate 0.1 with value clipping, entropy 0.01, value coefficient 0.5, global grad-norm
clip 0.5, Adam lr 2.5e-4 (eps 1e-5) annealed over the run's budget; the Nature CNN shared by a 0.01-gain policy
head and a 1-gain value head, frames divided by 255 inside the network. Env: EnvPool's Pong-v5 with CleanRL's
settings (no sticky actions, noop reset <= 30, frame skip 4, 84x84 grey, 4 stacked, life loss ends an episode,
rewards clipped, fire reset as EnvPool does).

    python tests/peers/ppo_atari_envpool.py STEPS [--threads T] [--bf16] [--seed S] [--budget B]

STEPS agent steps are trained (rounded up to whole rollouts) with the learning rate annealed over BUDGET agent
steps (default 2.5 M, CleanRL's Pong budget is 10 M: the anneal changes no speed). --threads sets torch's threads
(CleanRL leaves torch's default: one per core). --bf16 runs the forward passes under CPU autocast to bfloat16
(PyTorch's mixed precision on the CPU). Prints one line: agent steps/s over the whole loop (acting, env steps and
updates; start-up excluded), the seconds, and the mean return of the episodes that ended in the last rollouts.
"""
import argparse
import time

import envpool
import numpy as np
import torch
from torch import nn

p = argparse.ArgumentParser()
p.add_argument("steps", type=int)
p.add_argument("--threads", type=int, default=0)
p.add_argument("--bf16", action="store_true")
p.add_argument("--seed", type=int, default=1)
p.add_argument("--budget", type=int, default=2_500_000)
args = p.parse_args()
if args.threads:
    torch.set_num_threads(args.threads)
torch.manual_seed(args.seed)
np.random.seed(args.seed)

n_envs, n_steps, epochs, minibatches = 8, 128, 4, 4
gamma, lam, clip, ent_coef, vf_coef, max_norm, lr0 = 0.99, 0.95, 0.1, 0.01, 0.5, 0.5, 2.5e-4
batch = n_envs * n_steps
mb = batch // minibatches
iterations = -(-args.steps // batch)
total_iterations = max(iterations, args.budget // batch)

envs = envpool.make(
    "Pong-v5", env_type="gymnasium", num_envs=n_envs, batch_size=n_envs, seed=args.seed,
    repeat_action_probability=0.0, noop_max=30, frame_skip=4, stack_num=4, img_height=84, img_width=84,
    episodic_life=True, reward_clip=True,
)
n_actions = envs.action_space.n


def layer(module, std=np.sqrt(2), bias=0.0):
    nn.init.orthogonal_(module.weight, std)
    nn.init.constant_(module.bias, bias)
    return module


class Agent(nn.Module):
    def __init__(self):
        super().__init__()
        self.torso = nn.Sequential(
            layer(nn.Conv2d(4, 32, 8, stride=4)), nn.ReLU(),
            layer(nn.Conv2d(32, 64, 4, stride=2)), nn.ReLU(),
            layer(nn.Conv2d(64, 64, 3, stride=1)), nn.ReLU(),
            nn.Flatten(), layer(nn.Linear(64 * 7 * 7, 512)), nn.ReLU(),
        )
        self.pi = layer(nn.Linear(512, n_actions), std=0.01)
        self.v = layer(nn.Linear(512, 1), std=1.0)

    def heads(self, frames):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
            h = self.torso(frames.float() / 255.0)
            logits, value = self.pi(h), self.v(h)
        return logits.float(), value.float().squeeze(-1)


agent = Agent()
opt = torch.optim.Adam(agent.parameters(), lr=lr0, eps=1e-5)
obs_buf = torch.zeros((n_steps, n_envs, 4, 84, 84), dtype=torch.uint8)
act_buf = torch.zeros((n_steps, n_envs), dtype=torch.long)
logp_buf = torch.zeros((n_steps, n_envs))
rew_buf = torch.zeros((n_steps, n_envs))
done_buf = torch.zeros((n_steps, n_envs))
val_buf = torch.zeros((n_steps, n_envs))

obs, _ = envs.reset()
obs = torch.from_numpy(obs)
done = torch.zeros(n_envs)
returns, running = [], np.zeros(n_envs)
start = time.perf_counter()
for it in range(iterations):
    for g in opt.param_groups:
        g["lr"] = lr0 * (1.0 - it / total_iterations)
    for t in range(n_steps):
        obs_buf[t], done_buf[t] = obs, done
        with torch.no_grad():
            logits, value = agent.heads(obs)
            dist = torch.distributions.Categorical(logits=logits)
            action = dist.sample()
        act_buf[t], logp_buf[t], val_buf[t] = action, dist.log_prob(action), value
        nxt, reward, term, trunc, info = envs.step(action.numpy())
        rew_buf[t] = torch.from_numpy(reward).float()
        obs, done = torch.from_numpy(nxt), torch.from_numpy(np.logical_or(term, trunc)).float()
        running += info["reward"]
        for k in np.nonzero(info["lives"] == 0)[0] if "lives" in info else []:
            if term[k] or trunc[k]:
                returns.append(running[k])
                running[k] = 0.0
    with torch.no_grad():
        _, next_value = agent.heads(obs)
        adv = torch.zeros_like(rew_buf)
        last = torch.zeros(n_envs)
        for t in reversed(range(n_steps)):
            nonterminal = 1.0 - (done if t == n_steps - 1 else done_buf[t + 1])
            v_next = next_value if t == n_steps - 1 else val_buf[t + 1]
            delta = rew_buf[t] + gamma * v_next * nonterminal - val_buf[t]
            last = delta + gamma * lam * nonterminal * last
            adv[t] = last
        ret = adv + val_buf
    b_obs, b_act, b_logp = obs_buf.reshape(batch, 4, 84, 84), act_buf.reshape(-1), logp_buf.reshape(-1)
    b_adv, b_ret, b_val = adv.reshape(-1), ret.reshape(-1), val_buf.reshape(-1)
    for _ in range(epochs):
        perm = torch.randperm(batch)
        for s in range(0, batch, mb):
            i = perm[s:s + mb]
            logits, value = agent.heads(b_obs[i])
            dist = torch.distributions.Categorical(logits=logits)
            ratio = (dist.log_prob(b_act[i]) - b_logp[i]).exp()
            a = b_adv[i]
            a = (a - a.mean()) / (a.std() + 1e-8)
            pg = torch.max(-a * ratio, -a * ratio.clamp(1 - clip, 1 + clip)).mean()
            v_clipped = b_val[i] + (value - b_val[i]).clamp(-clip, clip)
            v_loss = 0.5 * torch.max((value - b_ret[i]) ** 2, (v_clipped - b_ret[i]) ** 2).mean()
            loss = pg - ent_coef * dist.entropy().mean() + vf_coef * v_loss
            opt.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(agent.parameters(), max_norm)
            opt.step()
secs = time.perf_counter() - start
steps = iterations * batch
recent = returns[-20:]
mean = f"{np.mean(recent):+.1f} over the last {len(recent)} games" if recent else "no game ended"
print(f"{steps / secs:.0f} agent steps/s ({steps} steps in {secs:.1f} s; threads {torch.get_num_threads()}, "
      f"{'bf16 autocast' if args.bf16 else 'f32'}; {mean})")
