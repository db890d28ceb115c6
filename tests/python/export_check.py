"""Check a policy written by `flotilla export` against `flotilla act`.

    python tests/python/export_check.py POLICY.safetensors OBS.json ACTIONS.json

Rebuilds the torch.nn.Sequential from the file alone (the README's "Taking a policy to PyTorch" snippet, kept
between the markers below: cli/tests/export.rs checks the README shows exactly these lines), computes the
deterministic actions on the observation rows of OBS.json, and compares them with ACTIONS.json (what
`flotilla act` printed for the same rows): discrete actions must be identical, continuous ones within 1e-5.
Exits 1, naming the first row that differs, if they are not.
"""
import json
import sys

# --- README snippet start ---
import json
import torch
from safetensors import safe_open
from safetensors.torch import load_file


def load_policy(path):
    """The exported policy as a torch.nn.Sequential, and the file's metadata."""
    with safe_open(path, framework="pt") as f:
        meta = f.metadata()
    layers = [getattr(torch.nn, name)(*args) for name, args in json.loads(meta["layers"])]
    policy = torch.nn.Sequential(*layers)
    policy.load_state_dict({k: v for k, v in load_file(path).items() if k != "log_std"})
    return policy.eval(), meta


def act(policy, meta, obs):
    """Deterministic actions for a batch of observations (Atari frames: floats 0-255, [B, C, H, W])."""
    with torch.no_grad():
        out = policy(torch.as_tensor(obs, dtype=torch.float32))
    return out.argmax(-1) if meta["output"] in ("logits", "q_values") else out
# --- README snippet end ---


def main(policy_path, obs_path, actions_path):
    policy, meta = load_policy(policy_path)
    obs = json.load(open(obs_path))
    obs_space = json.loads(meta["observation_space"])
    batch = torch.tensor(obs, dtype=torch.float32).reshape([len(obs), *obs_space["shape"]])
    got = act(policy, meta, batch).tolist()
    want = json.load(open(actions_path))
    if len(got) != len(want):
        sys.exit(f"{policy_path}: {len(got)} actions from PyTorch, {len(want)} from flotilla act")
    for i, (g, w) in enumerate(zip(got, want)):
        if meta["output"] in ("logits", "q_values"):
            same = g == w
        else:
            same = len(g) == len(w) and all(abs(a - b) <= 1e-5 for a, b in zip(g, w))
        if not same:
            sys.exit(f"{policy_path}: row {i} {obs[i]}: PyTorch acts {g}, flotilla act {w}")
    print(f"ok: {meta['algorithm']} ({meta['output']}), {len(got)} rows: PyTorch's actions equal flotilla's")


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(*sys.argv[1:])
