#!/usr/bin/env bash
# Runs the whole test suite (what CI runs): set-up (idempotent, cached), then every test in release mode —
# the learning tests need optimised code, and one profile means one build — then the tests that compare code
# paths or pin numerics a second time with the CPU dispatch forced down to AVX2 (docs/testing.md).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
bash scripts/setup_pytorch.sh >/dev/null   # PyTorch for cli/tests/export.rs (the exported-policy check)

# Every test binary runs even after a failure, so one run lists every failing test; the exit status is still
# non-zero.
cargo test --release --workspace --no-fail-fast

# The second pass. MKL, oneDNN, libtorch's ATen and the fused host kernels each pick their kernels per CPU, so
# an equivalence (fused vs libtorch, members vs alone, data-parallel vs one learner, acting vs learner, A3C vs
# A2C, resume) that holds only for one CPU's kernels would pass where it was written and fail on the next
# machine. Forcing AVX2 on an AVX-512 CPU runs the other kernels here (on a CPU without AVX-512 it changes
# nothing: that machine already runs them), so such a test fails on every machine.
lower=(ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2 FLOTILLA_HOST_LANES=8)
failed=()
second() {  # cargo test arguments of one package's test targets
  echo "test.sh: with ${lower[*]}: cargo test --release $*" >&2
  env "${lower[@]}" cargo test --release --no-fail-fast "$@" || failed+=("$*")
}
second -p flotilla-algorithms --lib
second -p flotilla-learner --test data_parallel --test local_transport --test transfer
second -p flotilla-tests --test reproducibility
second -p flotilla-cli --test population --test resume
if ((${#failed[@]})); then
  printf 'test.sh: failed with the CPU dispatch forced to AVX2: cargo test --release %s\n' "${failed[@]}" >&2
  exit 1
fi
echo "test.sh: every test passed, and the equivalence tests again with the CPU dispatch forced to AVX2" >&2
