#!/usr/bin/env bash
# Runs the whole test suite (what CI runs): set-up (idempotent, cached), then every test in release mode —
# the learning tests need optimised code, and one profile means one build.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
bash scripts/setup_pytorch.sh >/dev/null   # PyTorch for cli/tests/export.rs (the exported-policy check)
cargo test --release --workspace
