#!/usr/bin/env bash
# The whole test suite: fetch the real models (idempotent), then every test in release mode
# (real-model tests would crawl unoptimized). Real-model tests fail, not skip, when models are
# missing, because KESTREL_REQUIRE_MODELS=1.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/fetch-models.sh
export KESTREL_REQUIRE_MODELS=1
cargo test --release --workspace "$@"
# End-to-end: the server on loopback ports with the real models (needs the release binary).
cargo build --release -p kestrel-cli
bash scripts/e2e.sh
