"""How far the Nature CNN's bf16 gradients are from its f32 ones on Pong, beside the noise PPO's minibatches have anyway.

    python tests/peers/bf16_gradients.py [MODEL.safetensors] [--frames N] [--seed S]

MODEL: a Flotilla Pong policy (`model.safetensors` of a `flotilla train` run on atari:pong, PPO/A2C layout:
`cnn.conv1…3`, `cnn.fc`, `cnn.out` with 6 logits and a value). Without it the network is freshly initialised as
Flotilla initialises it (orthogonal, gain √2; policy head 0.01, value head 1; zero biases). The data is a PPO
rollout on Pong from EnvPool (`Pong-v5`, CleanRL's settings: no sticky actions, 84×84 grey, 4 stacked): 8 games
played by the network's own sampled actions (f32), N frames in all (default 2,048), with GAE(0.99, 0.95)
advantages and returns from its f32 values, shuffled into minibatches of 256 as PPO's update draws them.

The loss is PPO's (`pong_fast.toml`'s weights) at an update's first minibatch, where the ratio is 1 and the
clipped surrogate's gradient is the policy gradient's: −mean(log π(a|s)·Â) − 0.01·entropy + 0.5·½·mean((V − R)²),
Â normalised in the minibatch. Variants: `bf16` computes the forward pass as Flotilla's `[algorithm.cnn] bf16 =
true` does (frames, activations and a bf16 copy of weights and biases through every layer, the output back to
f32; PyTorch's CPU autocast does the same); `conv1 f32` runs the first convolution in f32; `conv1 split` feeds it
its weights as two bf16 parts (the rounded weight plus its rounding error, two convolutions summed). Printed per
minibatch: |g − g_f32| / |g_f32| over all parameters and per weight, beside |g_f32(the next minibatch) − g_f32| /
|g_f32|, the noise one minibatch's gradient has anyway; a summary (medians); whether bf16's error points the same
way from minibatch to minibatch (the cosine between their errors: ~0 for noise, near 1 for a bias that would add
up over an update); and, in f64 with exactly the bf16 pass's rounding, which of the first convolution's roundings
(its input, its weights, its output) carries the difference.
"""
import argparse

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

LAYERS = (("conv1", 4), ("conv2", 2), ("conv3", 1), ("fc", 0), ("out", 0))
BF16 = {"x", "conv1", "conv2", "conv3", "fc", "out"}


def fresh(seed):
    """Flotilla's Nature-CNN initialisation (algorithms/src/nn/nets.rs), linear weights stored [in, out]."""
    g = torch.Generator().manual_seed(seed)

    def orth(rows, cols, gain):
        return torch.nn.init.orthogonal_(torch.empty(rows, cols), gain, generator=g)

    p = {}
    for name, shape in (("conv1", (32, 4, 8, 8)), ("conv2", (64, 32, 4, 4)), ("conv3", (64, 64, 3, 3))):
        p[f"cnn.{name}.weight"] = orth(shape[0], int(np.prod(shape[1:])), 2**0.5).reshape(shape)
        p[f"cnn.{name}.bias"] = torch.zeros(shape[0])
    p["cnn.fc.weight"] = orth(512, 3136, 2**0.5).T.contiguous()
    p["cnn.fc.bias"] = torch.zeros(512)
    p["cnn.out.weight"] = torch.cat([orth(6, 512, 0.01), orth(1, 512, 1.0)]).T.contiguous()
    p["cnn.out.bias"] = torch.zeros(7)
    return p


def forward(p, frames, low, split=False):
    """The network's 7 outputs in f32; the layers in `low` (and the scaled frames, "x") in bf16."""
    h = frames.to(torch.bfloat16 if "x" in low else torch.float32) / 255.0
    for name, stride in LAYERS:
        kind = torch.bfloat16 if name in low else torch.float32
        w, b = p[f"cnn.{name}.weight"], p[f"cnn.{name}.bias"]
        h, wk, bk = h.to(kind), w.to(kind), b.to(kind)
        if stride:
            z = F.conv2d(h, wk, bk, stride=stride)
            if split and name == "conv1" and kind == torch.bfloat16:
                z = z + F.conv2d(h, (w.detach() - wk.detach().float()).to(kind), stride=stride)
            h = z.relu()
        else:
            h = torch.addmm(bk, h.flatten(1), wk)
            h = h.relu() if name == "fc" else h
    return h.float()


def forward64(p, frames, conv1_rounds):
    """f64 with the bf16 pass's roundings everywhere, the first convolution's only where `conv1_rounds` says
    (x: its input, w: its weights and bias, y: its output)."""
    r = lambda t: t.bfloat16().double()
    h = frames.double() / 255.0
    h = r(h) if "x" in conv1_rounds else h
    w, b = p["cnn.conv1.weight"], p["cnn.conv1.bias"]
    w, b = (r(w), r(b)) if "w" in conv1_rounds else (w, b)
    h = F.conv2d(h, w, b, stride=4).relu()
    h = r(h) if "y" in conv1_rounds else h
    for name, stride in LAYERS[1:3]:
        h = r(F.conv2d(h, r(p[f"cnn.{name}.weight"]), r(p[f"cnn.{name}.bias"]), stride=stride).relu())
    h = r(torch.addmm(r(p["cnn.fc.bias"]), h.flatten(1), r(p["cnn.fc.weight"])).relu())
    return torch.addmm(r(p["cnn.out.bias"]), h, r(p["cnn.out.weight"]))


def rollout(p, n, seed):
    """n frames (8 games × n/8 steps) played by the network's own sampled actions (f32), with PPO's targets:
    GAE(γ 0.99, λ 0.95) advantages and returns from its f32 values, as `pong_fast.toml`'s PPO computes them."""
    import envpool

    env = envpool.make("Pong-v5", env_type="gymnasium", num_envs=8, seed=seed, repeat_action_probability=0.0)
    obs, _ = env.reset()
    g = torch.Generator().manual_seed(seed)
    frames, actions, rewards, dones, values = [], [], [], [], []
    for _ in range(n // 8):
        x = torch.from_numpy(np.asarray(obs))
        with torch.no_grad():
            y = forward(p, x, set())
        a = torch.multinomial(y[:, :6].softmax(1), 1, generator=g)[:, 0]
        obs, r, term, trunc, _ = env.step(a.numpy())
        frames.append(x), actions.append(a), values.append(y[:, 6])
        rewards.append(torch.as_tensor(r, dtype=torch.float32))
        dones.append(torch.as_tensor(np.logical_or(term, trunc), dtype=torch.float32))
    with torch.no_grad():
        next_value = forward(p, torch.from_numpy(np.asarray(obs)), set())[:, 6]
    adv, last = torch.zeros(len(frames), 8), torch.zeros(8)
    for t in reversed(range(len(frames))):
        v_next = next_value if t + 1 == len(frames) else values[t + 1]
        live = 1.0 - dones[t]
        delta = rewards[t] + 0.99 * v_next * live - values[t]
        last = delta + 0.99 * 0.95 * live * last
        adv[t] = last
    returns = adv + torch.stack(values)
    return torch.cat(frames), torch.cat(actions), adv.flatten(), returns.flatten()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model", nargs="?")
    parser.add_argument("--frames", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(1)
    p = load_file(args.model) if args.model else fresh(args.seed)
    p = {k: v.float() for k, v in p.items()}
    frames, actions, adv, ret = rollout(p, args.frames, args.seed)
    g = torch.Generator().manual_seed(7)
    order = torch.randperm(len(frames), generator=g)
    batches = [order[i : i + 256] for i in range(0, len(frames) - 255, 256)]

    def grads(idx, run, f64=False):
        q = {k: (v.double() if f64 else v.clone()).requires_grad_(True) for k, v in p.items()}
        y = run(q, frames[idx])
        logp_all = y[:, :6].log_softmax(1)
        logp = logp_all.gather(1, actions[idx, None])[:, 0]
        a = adv[idx].to(y.dtype)
        a = (a - a.mean()) / (a.std() + 1e-8)
        entropy = -(logp_all.exp() * logp_all).sum(1).mean()
        # PPO's loss at the first minibatch of an update (ratio 1: the clipped surrogate's gradient is the policy
        # gradient's), CleanRL's weights: entropy 0.01, value 0.5 × ½(V − R)².
        loss = -(logp * a).mean() - 0.01 * entropy + 0.5 * 0.5 * ((y[:, 6] - ret[idx].to(y.dtype)) ** 2).mean()
        loss.backward()
        return {k: t.grad.double().flatten() for k, t in q.items()}

    whole = lambda d: torch.cat(list(d.values()))
    rel = lambda a, b: ((a - b).norm() / b.norm()).item()
    variants = {
        "bf16": lambda q, x: forward(q, x, BF16),
        "conv1 f32": lambda q, x: forward(q, x, BF16 - {"x", "conv1"}),
        "conv1 split": lambda q, x: forward(q, x, BF16, split=True),
    }
    print(f"model: {args.model or f'fresh (seed {args.seed})'}; {len(frames)} Pong frames, {len(batches)} minibatches of 256\n")
    weights = [k for k in p if k.endswith("weight")]
    print("| minibatch | variant | all parameters | " + " | ".join(k[4:-7] for k in weights) + " |")
    print("|---:|---|---:|" + "---:|" * len(weights))
    errors = []
    summary = {"f32, the next minibatch": [], **{name: [] for name in variants}}
    for i, idx in enumerate(batches):
        ref = grads(idx, lambda q, x: forward(q, x, set()))
        nxt = grads(batches[(i + 1) % len(batches)], lambda q, x: forward(q, x, set()))
        summary["f32, the next minibatch"].append(rel(whole(nxt), whole(ref)))
        print(f"| {i} | f32, the next minibatch | {rel(whole(nxt), whole(ref)):.3f} | " + " | ".join(f"{rel(nxt[k], ref[k]):.3f}" for k in weights) + " |")
        for name, run in variants.items():
            d = grads(idx, run)
            summary[name].append(rel(whole(d), whole(ref)))
            if name == "bf16":
                errors.append(whole(d) - whole(ref))
            print(f"| {i} | {name} | {rel(whole(d), whole(ref)):.3f} | " + " | ".join(f"{rel(d[k], ref[k]):.3f}" for k in weights) + " |")
    print("\nmedians over the minibatches, all parameters: " + ", ".join(f"{k} {100 * np.median(v):.1f} %" for k, v in summary.items()))
    cos = [
        (errors[i] @ errors[j] / (errors[i].norm() * errors[j].norm())).item()
        for i in range(len(errors))
        for j in range(i + 1, len(errors))
    ]
    print(f"\nbf16's error, cosine between minibatches: mean {np.mean(cos):.2f} (min {min(cos):.2f}, max {max(cos):.2f})")
    print("\nf64 with the bf16 pass's rounding, the first convolution's roundings only where named: |g − g_f32| / |g_f32|")
    for i, idx in enumerate(batches[:3]):
        ref = grads(idx, lambda q, x: forward(q, x, set()))
        cells = []
        for rounds in ("", "x", "w", "y", "xwy"):
            d = grads(idx, lambda q, x, rounds=rounds: forward64(q, x, rounds), f64=True)
            cells.append(f"{rounds or 'none'} {rel(whole(d), whole(ref)):.3f}")
        print(f"  minibatch {i}: " + ", ".join(cells))


if __name__ == "__main__":
    main()
