#!/bin/bash
# Side-by-side prefill/decode timing on a model-shaped GGUF with random weights (see
# scripts/synth_gguf.py), for machines the real model files cannot reach: kestrel with AMX off
# (KESTREL_AMX=0) and on, then llama.cpp (flash attention off and on), alternating per round.
#
#   scripts/bench-synthetic.sh HEADER_DIR [KESTREL_BIN]
#
# HEADER_DIR: from `python3 scripts/synth_gguf.py extract MODEL.gguf HEADER_DIR`.
# Environment: P, N, R, ROUNDS (default 512, 32, 3, 2), THREADS (2), PY (python3 with numpy),
# PEER (llamacpp_bench.py; default ../shared/peers/llamacpp_bench.py; skipped if absent),
# SYNTH (where the model is written; default /tmp/kestrel-synth.gguf).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
dir="${1:?usage: bench-synthetic.sh HEADER_DIR [KESTREL_BIN]}"
kestrel="${2:-$here/../target/release/kestrel}"
PY="${PY:-python3}"
PEER="${PEER:-$here/../../shared/peers/llamacpp_bench.py}"
SYNTH="${SYNTH:-/tmp/kestrel-synth.gguf}"
P="${P:-512}"; N="${N:-32}"; R="${R:-3}"; ROUNDS="${ROUNDS:-2}"; T="${THREADS:-2}"
grep -m1 "model name" /proc/cpuinfo || true
"$PY" "$here/synth_gguf.py" build "$dir" "$SYNTH"
for r in $(seq "$ROUNDS"); do
  for amx in 0 1; do
    echo "== round $r: kestrel, AMX $([ $amx = 1 ] && echo 'on where present' || echo off)"
    KESTREL_AMX=$amx "$kestrel" bench -m "$SYNTH" -p "$P" -n "$N" -r "$R" -t "$T" --check-tokens 0 2>&1 \
      | grep -E "kernels|machine|prompt-eval|decode tok|decode %|peak"
  done
  if [ -f "$PEER" ]; then
    for fa in 0 1; do
      echo "== round $r: llama.cpp, flash attention $fa"
      "$PY" "$PEER" "$SYNTH" -p "$P" -n "$N" -r "$R" -t "$T" --fa $fa 2>&1 | tail -3
    done
  fi
done
