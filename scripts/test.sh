#!/usr/bin/env bash
# Runs the whole test suite (what CI runs): set-up (idempotent, cached), then every test in release mode —
# the learning tests need optimised code, and one profile means one build.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
cargo test --release --workspace
