#!/usr/bin/env bash
# Checks the deployment files without a cluster:
#   * renders each kustomization (deploy/k8s, deploy/k8s/data-parallel, both with components/tls) with
#     `kubectl kustomize` (client-side; skipped with a note where there is no kubectl: the raw manifests are
#     checked instead);
#   * validates every resource against the Kubernetes OpenAPI schemas of 1.28 (the oldest with the
#     apps.kubernetes.io/pod-index label the data-parallel variant uses) and 1.37, strictly (unknown fields
#     fail), with kubernetes-validate (PyPI, pinned, schemas bundled) in a venv under the cache;
#   * checks that the numbers that must agree do: actor replicas = learners x each learner's --actors,
#     WORLD_SIZE = learner replicas = the actors' LEARNERS;
#   * `bash -n` on the Slurm script.
# FLOTILLA_DEPLOY_COMMANDS=FILE also writes every container's command and args there as JSON (cli/tests/deploy.rs
# checks them against the flotilla binary's options).
#   bash deploy/validate.sh        (a few seconds; the first run installs the validator, ~10 s)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
cache="${FLOTILLA_CACHE:-$HOME/.cache/flotilla}"
venv="$cache/k8s-validate-venv"
requirement="kubernetes-validate==1.37.0"
mkdir -p "$cache"
(
  exec 9>"$cache/k8s-validate-venv.lock"
  flock 9
  if [[ "$(cat "$venv/.requirement" 2>/dev/null)" != "$requirement" ]] || [[ ! -x "$venv/bin/kubernetes-validate" ]]; then
    echo "validate: installing $requirement into $venv" >&2
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "$requirement"
    printf '%s' "$requirement" > "$venv/.requirement"
  fi
)

out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
if command -v kubectl >/dev/null 2>&1; then
  # The TLS component on each variant, through overlays that live only for this check.
  for variant in k8s k8s/data-parallel; do
    name="${variant//\//-}"
    kubectl kustomize "deploy/$variant" > "$out/$name.yaml"
    mkdir -p "$out/$name-tls"
    rel="$(realpath --relative-to="$out/$name-tls" "deploy/$variant")"
    comp="$(realpath --relative-to="$out/$name-tls" deploy/k8s/components/tls)"
    printf 'resources:\n  - %s\ncomponents:\n  - %s\n' "$rel" "$comp" > "$out/$name-tls/kustomization.yaml"
    kubectl kustomize "$out/$name-tls" > "$out/$name-tls.yaml"
  done
else
  echo "validate: NOTE: no kubectl, so the kustomizations (patches, components) are not rendered; checking the" \
    "raw manifests only" >&2
  cp deploy/k8s/base/learner.yaml "$out/k8s-learner.yaml"
  cp deploy/k8s/actors.yaml "$out/k8s-actors.yaml"
  cp deploy/k8s/data-parallel/actors.yaml "$out/k8s-data-parallel-actors.yaml"
fi
for version in 1.28.0 1.37.0; do
  "$venv/bin/kubernetes-validate" --strict --quiet -k "$version" "$out"/*.yaml
done

# What must agree across files.
"$venv/bin/python" - "$out" <<'PY'
import glob, json, os, sys
import yaml

problems, commands = [], []
for path in sorted(glob.glob(os.path.join(sys.argv[1], "*.yaml"))):
    name = os.path.basename(path)
    docs = [d for d in yaml.safe_load_all(open(path)) if d]
    for d in docs:
        if d["kind"] in ("Deployment", "StatefulSet"):
            for c in d["spec"]["template"]["spec"]["containers"]:
                commands.append({"file": name, "container": c["name"], "command": c.get("command", []),
                                 "args": c.get("args", [])})
    by = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    learner = by.get(("StatefulSet", "flotilla-learner"))
    actors = by.get(("Deployment", "flotilla-actor")) or by.get(("StatefulSet", "flotilla-actor"))
    if not (learner and actors):
        continue  # a raw manifest alone
    lc = learner["spec"]["template"]["spec"]["containers"][0]
    ac = actors["spec"]["template"]["spec"]["containers"][0]
    args, env = lc["args"], {e["name"]: e.get("value") for e in lc.get("env", [])}
    learners = learner["spec"].get("replicas", 1)
    per_learner = int(args[args.index("--actors") + 1])
    replicas = actors["spec"].get("replicas", 1)
    if replicas != learners * per_learner:
        problems.append(f"{name}: {replicas} actor replicas, but {learners} learner(s) x --actors {per_learner}")
    if learners > 1:
        if env.get("WORLD_SIZE") != str(learners):
            problems.append(f"{name}: WORLD_SIZE {env.get('WORLD_SIZE')} but {learners} learner replicas")
        actor_env = {e["name"]: e.get("value") for e in ac.get("env", [])}
        if actor_env.get("LEARNERS") != str(learners):
            problems.append(f"{name}: actors' LEARNERS {actor_env.get('LEARNERS')} but {learners} learner replicas")
        for var in ("RANK", "MASTER_ADDR", "MASTER_PORT"):
            if var not in env:
                problems.append(f"{name}: the learners set no {var}")
        if "learner.learners=$(WORLD_SIZE)" not in args:
            problems.append(f"{name}: the learners' config does not take learner.learners from WORLD_SIZE")
    if name.endswith("-tls.yaml"):
        for flag in ("--tls-cert", "--tls-key", "--client-ca"):
            if flag not in args:
                problems.append(f"{name}: the learner has no {flag}")
        for flag in ("--tls-ca", "--tls-cert", "--tls-key"):
            if flag not in ac["args"]:
                problems.append(f"{name}: the actors have no {flag}")
        if "--insecure" in args:
            problems.append(f"{name}: the learner is still --insecure")
    elif "--insecure" not in args:
        problems.append(f"{name}: without TLS the learner needs --insecure to listen beyond loopback")
    print(f"validate: {name}: {learners} learner(s) x {per_learner} actors = {replicas} actor pods", file=sys.stderr)
if os.environ.get("FLOTILLA_DEPLOY_COMMANDS"):
    with open(os.environ["FLOTILLA_DEPLOY_COMMANDS"], "w") as f:
        json.dump(commands, f, indent=1)
if problems:
    sys.exit("validate: " + "\nvalidate: ".join(problems))
PY

bash -n deploy/slurm/flotilla.sbatch
echo "validate: ok ($(ls "$out" | grep -c '\.yaml$') manifests against Kubernetes 1.28 and 1.37, Slurm script parses)" >&2
