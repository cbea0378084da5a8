#!/usr/bin/env bash
# Speculative decoding on the code-editing workload, kestrel and llama.cpp side by side in one
# run (CPU): kestrel plain vs prompt lookup, kestrel plain vs the 0.5B draft model, llama.cpp
# plain vs its prompt-lookup decoding on the same prompt tokens.
#
#   bash scripts/bench-spec.sh [MODEL] [DRAFT] [THREADS] [RUNS]
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf}
DRAFT=${2:-models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf}
THREADS=${3:-2}
RUNS=${4:-1}
BIN=${KESTREL:-target/release/kestrel}
OUT=${OUT:-target/bench-spec}
mkdir -p "$OUT"
echo "== $(date -u +%FT%TZ) $(uname -m), $(nproc) cores, $THREADS threads"
echo "== kestrel, prompt lookup"
"$BIN" bench -m "$MODEL" --spec lookup -n 2048 -r "$RUNS" -t "$THREADS" --json | tee "$OUT/lookup.json" | python3 -c 'import json,sys; d=json.loads(sys.stdin.read()); [d.pop(k) for k in ("prompt_ids","tokens")]; print(json.dumps(d))'
echo "== kestrel, draft model $DRAFT"
"$BIN" bench -m "$MODEL" --spec draft --draft-model "$DRAFT" -n 2048 -r "$RUNS" -t "$THREADS" --json | tee "$OUT/draft.json" | python3 -c 'import json,sys; d=json.loads(sys.stdin.read()); [d.pop(k) for k in ("prompt_ids","tokens")]; print(json.dumps(d))'
echo "== llama.cpp, prompt lookup (LlamaPromptLookupDecoding) on the same prompt tokens"
python3 scripts/spec_peer.py "$MODEL" "$OUT/lookup.json" -t "$THREADS" -r "$RUNS"
