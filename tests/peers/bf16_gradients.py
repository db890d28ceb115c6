"""How far the Nature CNN's bf16 gradients are from its f32 ones on Pong frames, and where the difference comes from.

    python tests/peers/bf16_gradients.py [MODEL.safetensors] [--frames N] [--seed S]

MODEL: a Flotilla Pong policy (`model.safetensors` of a `flotilla train` run on atari:pong, PPO/A2C layout:
`cnn.conv1…3`, `cnn.fc`, `cnn.out` with 6 logits and a value). Without it the network is freshly initialised as
Flotilla initialises it (orthogonal, gain √2; policy head 0.01, value head 1; zero biases). The frames are Pong
frames from EnvPool (`Pong-v5`, CleanRL's settings: no sticky actions, 84×84 grey, 4 stacked), 8 games played by
the model's own sampled actions (f32), N of them in all (default 2,048).

Every variant computes the forward pass as Flotilla's `[algorithm.cnn] bf16 = true` does (frames, activations
and a bf16 copy of weights and biases through every layer, the output back to f32; PyTorch's CPU autocast does
the same) except where it says: `conv1 f32` runs the first convolution in f32; `conv1 split` feeds that
convolution its weights as two bf16 parts (the rounded weight plus its rounding error, two convolutions summed).
The loss has PPO's shape on each minibatch of 256 shuffled frames: −mean(log π(a|s)·A) + ½·mean((V(s) − R)²),
with the sampled actions a, and A ~ N(0, 1), R ~ N(0, 1) clipped to [−1, 1] drawn once (fixed seed), so every
variant differentiates the same function of the same minibatch. Printed per minibatch: |g − g_f32| / |g_f32| over
all parameters and per weight, beside |g_f32(this minibatch) − g_f32(the next)| / |g_f32|, the minibatch noise an
update lives with. Then whether the bf16 error points the same way from minibatch to minibatch (the cosine
between minibatches' errors: ~0 for noise, near 1 for a bias that adds up over updates), and, in f64 with
exactly the rounding of the bf16 pass, which of the first convolution's roundings (its input, its weights, its
output) carries the difference.
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


def pong_frames(p, n, seed):
    import envpool

    env = envpool.make("Pong-v5", env_type="gymnasium", num_envs=8, seed=seed, repeat_action_probability=0.0)
    obs, _ = env.reset()
    frames = []
    g = torch.Generator().manual_seed(seed)
    while len(frames) * 8 < n:
        x = torch.from_numpy(np.asarray(obs))
        frames.append(x)
        with torch.no_grad():
            logits = forward(p, x, set())[:, :6]
        action = torch.multinomial(logits.softmax(1), 1, generator=g)[:, 0]
        obs, *_ = env.step(action.numpy())
    return torch.cat(frames)[:n]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model", nargs="?")
    parser.add_argument("--frames", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(1)
    p = load_file(args.model) if args.model else fresh(args.seed)
    p = {k: v.float() for k, v in p.items()}
    frames = pong_frames(p, args.frames, args.seed)
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        actions = torch.multinomial(forward(p, frames, set())[:, :6].softmax(1), 1, generator=g)[:, 0]
    adv = torch.randn(len(frames), generator=g)
    ret = torch.randn(len(frames), generator=g).clamp(-1, 1)
    order = torch.randperm(len(frames), generator=g)
    batches = [order[i : i + 256] for i in range(0, len(frames) - 255, 256)]

    def grads(idx, run, f64=False):
        q = {k: (v.double() if f64 else v.clone()).requires_grad_(True) for k, v in p.items()}
        y = run(q, frames[idx])
        logp = y[:, :6].log_softmax(1).gather(1, actions[idx, None])[:, 0]
        loss = -(logp * adv[idx].to(y.dtype)).mean() + 0.5 * ((y[:, 6] - ret[idx].to(y.dtype)) ** 2).mean()
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
    for i, idx in enumerate(batches):
        ref = grads(idx, lambda q, x: forward(q, x, set()))
        nxt = grads(batches[(i + 1) % len(batches)], lambda q, x: forward(q, x, set()))
        print(f"| {i} | f32, the next minibatch | {rel(whole(nxt), whole(ref)):.3f} | " + " | ".join(f"{rel(nxt[k], ref[k]):.3f}" for k in weights) + " |")
        for name, run in variants.items():
            d = grads(idx, run)
            if name == "bf16":
                errors.append(whole(d) - whole(ref))
            print(f"| {i} | {name} | {rel(whole(d), whole(ref)):.3f} | " + " | ".join(f"{rel(d[k], ref[k]):.3f}" for k in weights) + " |")
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
