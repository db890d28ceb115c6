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


def load_recurrent(path):
    """A recurrent policy (metadata "recurrent"): `pre_layers` (observation normalisation or a CNN torso, if any), the core
    (torch.nn.LSTM / GRU, tensors core.*) and `layers` on the core's output; returns a step function
    (observations [B, D] or frames [B, C, H, W], state [B, S]) -> (outputs, state) and the metadata."""
    with safe_open(path, framework="pt") as f:
        meta = f.metadata()
    tensors = load_file(path)
    rec = json.loads(meta["recurrent"])
    build = lambda spec: torch.nn.Sequential(*[getattr(torch.nn, name)(*args) for name, args in json.loads(spec)])
    pre, head = build(meta["pre_layers"]), build(meta["layers"])
    pre.load_state_dict({k[len("pre."):]: v for k, v in tensors.items() if k.startswith("pre.")})
    head.load_state_dict({k: v for k, v in tensors.items() if k[0].isdigit()})
    core = getattr(torch.nn, rec["module"])(*rec["args"])
    core.load_state_dict({k[len("core."):]: v for k, v in tensors.items() if k.startswith("core.")})
    hidden = rec["args"][1]

    def step(obs, state):
        with torch.no_grad():
            x = pre(obs).unsqueeze(0)
            if rec["module"] == "LSTM":
                h0, c0 = state[:, :hidden].unsqueeze(0).contiguous(), state[:, hidden:].unsqueeze(0).contiguous()
                y, (h, c) = core(x, (h0, c0))
                state = torch.cat([h[0], c[0]], 1)
            else:
                y, h = core(x, state.unsqueeze(0).contiguous())
                state = h[0]
            return head(y[0]), state

    return step, meta


def same_actions(meta, got, want):
    if meta["output"] in ("logits", "q_values"):
        return got == want
    return len(got) == len(want) and all(abs(a - b) <= 1e-5 for a, b in zip(got, want))


def main_recurrent(policy_path, obs_path, actions_path):
    """OBS.json: a sequence of batches; ACTIONS.json: flotilla act's {"actions": [per step], "state": rows}."""
    step, meta = load_recurrent(policy_path)
    steps = json.load(open(obs_path))
    want = json.load(open(actions_path))
    rows = len(steps[0])
    shape = json.loads(meta["observation_space"])["shape"]
    state = torch.zeros(rows, len(want["state"][0]))
    for t, obs in enumerate(steps):
        out, state = step(torch.tensor(obs, dtype=torch.float32).reshape([rows, *shape]), state)
        got = (out.argmax(-1) if meta["output"] in ("logits", "q_values") else out).tolist()
        for i, (g, w) in enumerate(zip(got, want["actions"][t])):
            if not same_actions(meta, g, w):
                sys.exit(f"{policy_path}: step {t} row {i}: PyTorch acts {g}, flotilla act {w}")
    diff = (state - torch.tensor(want["state"])).abs().max().item()
    if diff > 1e-4:
        sys.exit(f"{policy_path}: the state after {len(steps)} steps differs from flotilla act's by {diff}")
    print(f"ok: {meta['algorithm']} ({meta['output']}, recurrent), {len(steps)} steps of {rows} rows: PyTorch's "
          f"actions and state equal flotilla's")


def main(policy_path, obs_path, actions_path):
    with safe_open(policy_path, framework="pt") as f:
        if "recurrent" in f.metadata():
            return main_recurrent(policy_path, obs_path, actions_path)
    policy, meta = load_policy(policy_path)
    obs = json.load(open(obs_path))
    obs_space = json.loads(meta["observation_space"])
    batch = torch.tensor(obs, dtype=torch.float32).reshape([len(obs), *obs_space["shape"]])
    got = act(policy, meta, batch).tolist()
    want = json.load(open(actions_path))
    if len(got) != len(want):
        sys.exit(f"{policy_path}: {len(got)} actions from PyTorch, {len(want)} from flotilla act")
    for i, (g, w) in enumerate(zip(got, want)):
        if not same_actions(meta, g, w):
            sys.exit(f"{policy_path}: row {i} {obs[i]}: PyTorch acts {g}, flotilla act {w}")
    print(f"ok: {meta['algorithm']} ({meta['output']}), {len(got)} rows: PyTorch's actions equal flotilla's")


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(*sys.argv[1:])
