#!/usr/bin/env bash
# Packs what scripts/gpu/h200.sh needs into DEST (default: .gpu-cuda in the repository the
# device tool sends, git-ignored through .git/info/exclude): the stripped, xz-compressed
# release binary, llama.cpp trimmed to build llama-quantize (LLAMA_SRC: a trimmed tree; left
# out when unset: kestrel's own quantizer writes the same bytes), the gguf wheel (WHEEL) and
# make_dense_model.py / make_qwen35_model.py with their vocabulary. BASE_KERNELS="REV ..." adds
# each REV's kernel sources as kernels-REV/ (files REV lacks from the working tree, or from
# revision FILL_FROM):
# h200.sh's AB_ENV="KESTREL_CUDA_KERNELS=.gpu-cuda/kernels-REV" then times them against the
# binary's own in the same call (same host code: the kernels' names and arguments must match); every kernel set is compiled ahead into cubins/ (below).
# ENV_SH=FILE ships FILE as env.sh, which h200.sh sources
# after the caller's settings (a call already queued with other settings then runs these).
set -eu
DEST=${1:-.gpu-cuda}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$DEST"
strip -o /tmp/kestrel-stripped "$ROOT/target/release/kestrel"
xz -T2 -6 -c /tmp/kestrel-stripped > "$DEST/kestrel.xz"
[ -z "${LLAMA_SRC:-}" ] || [ -f "$DEST/llama-src.tar.xz" ] || tar cJf "$DEST/llama-src.tar.xz" -C "$(dirname "$LLAMA_SRC")" "$(basename "$LLAMA_SRC")"
rm -rf "$DEST"/kernels-*  # h200.sh compiles every kernels-* folder it finds
for REV in ${BASE_KERNELS:-}; do
  git -C "$ROOT" rev-parse --verify --quiet "$REV^{commit}" > /dev/null ||
    { echo "bundle.sh: BASE_KERNELS: $REV is not a revision" >&2; exit 1; }
  K="$DEST/kernels-$(echo "$REV" | tr '/' '-')"
  mkdir -p "$K"
  FILES=$(git -C "$ROOT" ls-tree --name-only "$REV" crates/kestrel-cuda/src/kernels/)
  for f in $FILES; do
    git -C "$ROOT" show "$REV:$f" > "$K/$(basename "$f")"
  done
  # a kernel file added after REV (moe.cu) comes from the working tree (the binary names it),
  # or from revision FILL_FROM where the tree's copy needs what REV's other files lack
  for f in "$ROOT"/crates/kestrel-cuda/src/kernels/*; do
    b=$(basename "$f")
    [ -e "$K/$b" ] && continue
    if [ -n "${FILL_FROM:-}" ]; then
      git -C "$ROOT" show "$FILL_FROM:crates/kestrel-cuda/src/kernels/$b" > "$K/$b"
    else
      cp "$f" "$K/"
    fi
  done
done
rm -f "$DEST/env.sh"
[ -z "${ENV_SH:-}" ] || cp "$ENV_SH" "$DEST/env.sh"
cp "$WHEEL" "$ROOT/scripts/gpu/serve-check.py" "$ROOT/scripts/gpu/sampled.py" "$ROOT/scripts/gpu/make_moe_model.py" "$DEST/"
cp "$ROOT/../shared/peers/gpu/make_dense_model.py" "$ROOT/../shared/peers/gpu/make_qwen35_model.py" \
  "$ROOT/../shared/peers/gpu/ggml-vocab-qwen2.gguf" "$DEST/"
# The kernels compiled ahead for sm_90 (the binary's own and each kernels-REV/), so that a fresh
# GPU host loads them instead of spending ~3 minutes of device time in NVRTC: h200.sh points
# KESTREL_CUDA_CUBINS at $DEST/cubins (a kernel set missing there, or one the host's driver
# refuses, is compiled there as before). Needs NVRTC in target/nvrtc (scripts/test.sh fetches
# it); CUBINS=0 leaves them out.
rm -rf "$DEST/cubins"
if [ "${CUBINS:-1}" != 0 ] && [ -e "$ROOT/target/nvrtc/libnvrtc.so.13" ]; then
  for d in "" "$DEST"/kernels-*/; do
    [ -z "$d" ] || [ -d "$d" ] || continue
    KESTREL_CUDA_KERNELS=$d LD_LIBRARY_PATH="$ROOT/target/nvrtc" \
      "$ROOT/target/release/kestrel" gpu-check --compile-only sm_90 --out "$DEST/cubins"
  done
  xz -T2 -6 "$DEST"/cubins/*.cubin  # ~13 MB -> 1.5 MB each
fi
du -sh "$DEST"/*
