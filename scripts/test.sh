#!/usr/bin/env bash
# Runs the whole test suite (what CI runs): set-up (idempotent, cached), then every test in release mode —
# the learning tests need optimised code, and one profile means one build — then the tests that compare code
# paths or pin numerics a second time with the CPU dispatch forced down to AVX2 (docs/testing.md).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
bash scripts/setup_pytorch.sh >/dev/null   # PyTorch for cli/tests/export.rs (the exported-policy check)

# Lints first (seconds once the cache holds a check build): every target of the workspace, warnings as errors
# on the toolchain the code was last made lint-free with. A newer clippy can bring new lints: there they are
# printed (fix them with the next change and move `linted_with` on) but do not fail the run.
linted_with=1.95
if ! cargo clippy --version >/dev/null 2>&1; then
  rustup component add clippy
fi
deny=()
if [[ $(rustc --version) == "rustc $linted_with."* ]]; then
  deny=(-D warnings)
else
  echo "test.sh: rustc is not $linted_with: clippy's warnings are printed, not failures" >&2
fi
cargo clippy --release --workspace --all-targets -- "${deny[@]}"

# Every test binary runs even after a failure, so one run lists every failing test; the exit status is still
# non-zero.
cargo test --release --workspace --no-fail-fast

# The second pass. MKL, oneDNN, libtorch's ATen and the fused host kernels each pick their kernels per CPU, so
# an equivalence (fused vs libtorch, members vs alone, data-parallel vs one learner, acting vs learner, A3C vs
# A2C, resume) that holds only for one CPU's kernels would pass where it was written and fail on the next
# machine. Forcing AVX2 on an AVX-512 CPU runs the other kernels here (on a CPU without AVX-512 it changes
# nothing: that machine already runs them), so such a test fails on every machine.
lower=(ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2 FLOTILLA_HOST_LANES=8)
# One invocation over the workspace: the same packages and features as the first pass, so nothing is rebuilt.
echo "test.sh: again with ${lower[*]}" >&2
if ! env "${lower[@]}" cargo test --release --workspace --no-fail-fast --lib \
  --test data_parallel --test local_transport --test transfer --test reproducibility --test population --test resume
then
  echo "test.sh: the tests above failed with the CPU dispatch forced to AVX2" >&2
  exit 1
fi
echo "test.sh: every test passed, and the equivalence tests again with the CPU dispatch forced to AVX2" >&2
