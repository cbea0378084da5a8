#!/usr/bin/env bash
# Qwen3-MoE on the CPU, kestrel and llama.cpp side by side on one random-weight Q4_K_M file of
# Qwen3-30B-A3B's layer shape (hidden 2048, 128 experts of 768, 8 used, 32 q / 4 kv heads of
# 128) with LAYERS of its 48 layers (default 12: 4.6 GiB; both engines fit in 24 GiB together
# with the page cache), the tokenizer of Qwen2.5-Coder-0.5B (fetch-models.sh).
#   bash scripts/bench-moe.sh            # env: LAYERS, R (reps, 3), T (threads, 2)
set -euo pipefail
cd "$(dirname "$0")/.."
LAYERS="${LAYERS:-12}"; R="${R:-3}"; T="${T:-2}"
PEER_BENCH="${PEER_BENCH:-../shared/peers/llamacpp_bench.py}"
PY="${KESTREL_PEERS:-$HOME/.cache/kestrel-peers}/venv/bin/python3"
[ -x target/release/kestrel ] || { echo "build first: cargo build --release -p kestrel-cli" >&2; exit 1; }
[ -x "$PY" ] || { echo "no peers venv: run $PEER_BENCH once (it installs llama-cpp-python)" >&2; exit 1; }
dir="${BENCH_DIR:-target/bench}"; mkdir -p "$dir"
m="$dir/qwen3moe-30b-a3b-shape-${LAYERS}l-q4_k_m.gguf"
[ -f "$m" ] || "$PY" scripts/synth_gguf.py moe models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf "$m" "$LAYERS"
echo "== $(date -u +%FT%TZ) $(uname -m) $(nproc) cores; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
./target/release/kestrel info -m "$m" | grep -E "experts|weights |read/token"
echo "-- kestrel"
./target/release/kestrel bench -m "$m" -p 512 -n 128 -r "$R" -t "$T" --check-tokens 0
for fa in 0 1; do
  echo "-- llama.cpp (flash attention $fa)"
  python3 "$PEER_BENCH" "$m" -p 512 -n 128 -r "$R" -t "$T" --fa "$fa"
done
