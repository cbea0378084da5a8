#!/usr/bin/env bash
# Packs what scripts/gpu/h200.sh needs into DEST (default: .gpu-cuda in the repository the
# device tool sends, git-ignored through .git/info/exclude): the stripped, xz-compressed
# release binary, llama.cpp trimmed to build llama-quantize (LLAMA_SRC: a trimmed tree; left
# out when unset: kestrel's own quantizer writes the same bytes), the gguf wheel (WHEEL) and
# make_dense_model.py / make_qwen35_model.py with their vocabulary.
set -eu
DEST=${1:-.gpu-cuda}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$DEST"
strip -o /tmp/kestrel-stripped "$ROOT/target/release/kestrel"
xz -T2 -6 -c /tmp/kestrel-stripped > "$DEST/kestrel.xz"
[ -z "${LLAMA_SRC:-}" ] || [ -f "$DEST/llama-src.tar.xz" ] || tar cJf "$DEST/llama-src.tar.xz" -C "$(dirname "$LLAMA_SRC")" "$(basename "$LLAMA_SRC")"
cp "$WHEEL" "$ROOT/scripts/gpu/serve-check.py" "$DEST/"
cp "$ROOT/../shared/peers/gpu/make_dense_model.py" "$ROOT/../shared/peers/gpu/make_qwen35_model.py" \
  "$ROOT/../shared/peers/gpu/ggml-vocab-qwen2.gguf" "$DEST/"
du -sh "$DEST"/*
