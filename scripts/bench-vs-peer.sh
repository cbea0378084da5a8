#!/usr/bin/env bash
# kestrel and llama.cpp side by side, back to back, on the same GGUF files and threads.
#   bash scripts/bench-vs-peer.sh [MODEL.gguf ...]
# The peer side is shared/peers/llamacpp_bench.py (llama.cpp through llama-cpp-python; its
# first run compiles llama.cpp, ~10 minutes on 2 cores). Set PEER_BENCH to point elsewhere.
# Env: P (prompt, default 512), N (gen, 128), R (reps, 3), T (threads, 2), D (depths, "0 4096").
set -euo pipefail
cd "$(dirname "$0")/.."
PEER_BENCH="${PEER_BENCH:-../shared/peers/llamacpp_bench.py}"
P="${P:-512}"; N="${N:-128}"; R="${R:-3}"; T="${T:-2}"; D="${D:-0 4096}"
[ -x target/release/kestrel ] || { echo "build first: cargo build --release -p kestrel-cli" >&2; exit 1; }
[ -f "$PEER_BENCH" ] || { echo "peer bench not found at $PEER_BENCH (set PEER_BENCH)" >&2; exit 1; }
models=("$@")
[ ${#models[@]} -gt 0 ] || models=(models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf)
echo "== $(date -u +%FT%TZ) $(uname -m) $(nproc) cores; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
for m in "${models[@]}"; do
  for d in $D; do
    p=$P; [ "$d" != 0 ] && p=0   # at depth, llama-bench's tg-at-depth figure
    echo "== $m depth $d"
    echo "-- kestrel"
    ./target/release/kestrel bench -m "$m" -p "$p" -n "$N" -d "$d" -r "$R" -t "$T" --check-tokens 16
    for fa in 0 1; do
      echo "-- llama.cpp (flash attention $fa)"
      python3 "$PEER_BENCH" "$m" -p "$p" -n "$N" -d "$d" -r "$R" -t "$T" --fa "$fa"
    done
  done
done
