#!/usr/bin/env bash
# Packs what a side-by-side benchmark needs on a machine with no network and a small upload
# (the lent GPU host: 64 MiB per call) into one folder, DIR (default target/offline-bench):
# the stripped kestrel binary, the header of each real model (scripts/synth_gguf.py extract;
# the weights are rebuilt there at random, same shapes and types), the benchmark scripts, and
# the peer (llama-cpp-python's package from the peers venv, its libgomp, and its pure-Python
# dependencies). On that machine:
#
#   bash DIR/run.sh check                        # quant unit tests (AMX where present) + AMX on/off logits
#   bash DIR/run.sh bench qwen05 2 0             # bench_vs_peer.py: model, reps, depths
#   bash DIR/run.sh bench qwen15 1 4096
#   bash DIR/run.sh ab qwen15 0 KESTREL_WEIGHT_PREFETCH 0 4096   # kestrel alone, decode at a depth,
#                                                # once per value of an environment variable
#   bash DIR/run.sh mv KESTREL_WEIGHT_PREFETCH 0 1024 4096     # decode kernels alone (matvec_bench)
#   bash DIR/run.sh attn 1,0 2,1                 # decode attention alone (1.5B shape, depth 4096,
#                                                # K/V cold), per KESTREL_KV_PREFETCH setting
#
# Results go to $OUT (or /tmp) as JSON lines. Needs: the models fetched, the peers venv
# (python3 ../shared/peers/llamacpp_bench.py installs it), numpy on the target's python3 (or PY=...).
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:-target/offline-bench}"
venv="${KESTREL_PEERS:-$HOME/.cache/kestrel-peers}/venv"
site=$(echo "$venv"/lib/python3*/site-packages)
[ -d "$site/llama_cpp" ] || { echo "no llama_cpp in $site (run ../shared/peers/llamacpp_bench.py once)"; exit 1; }
rm -rf "$dir" && mkdir -p "$dir/pysite"
cargo build --release -p kestrel-cli
cargo test --release -p kestrel-quant --lib --no-run 2>&1 | tee /tmp/pack-tests.log >/dev/null
tests=$(grep -o 'target/release/deps/kestrel_quant-[0-9a-f]*' /tmp/pack-tests.log | head -1)
cargo build --release -p kestrel-models --example attention_decode
cargo build --release -p kestrel-quant --example matvec_bench
cp target/release/kestrel "$dir/kestrel" && cp "$tests" "$dir/quant-tests"
cp target/release/examples/attention_decode target/release/examples/matvec_bench "$dir/"
strip "$dir/kestrel" "$dir/quant-tests" "$dir/attention_decode" "$dir/matvec_bench"
cp scripts/synth_gguf.py scripts/bench_vs_peer.py ../shared/peers/llamacpp_bench.py "$dir/"
for m in qwen05:qwen2.5-coder-0.5b-instruct-q4_k_m qwen15:qwen2.5-coder-1.5b-instruct-q4_k_m; do
  python3 scripts/synth_gguf.py extract "models/${m#*:}.gguf" "$dir/${m%%:*}" >/dev/null
done
# The peer: real files only (links dropped), then the shared-library names recreated there.
cp -rL "$site/llama_cpp" "$site/jinja2" "$site/markupsafe" "$site/diskcache" \
  "$site/typing_extensions.py" "$dir/pysite/"
find "$dir/pysite/llama_cpp/lib" -type l -delete
find "$dir/pysite/llama_cpp/lib" -name '*.so' -o -name '*.so.0' | xargs -r rm -f
gomp=$(ldconfig -p | awk '/libgomp.so.1 /{p = $NF} END {print p}')
cp "$gomp" "$dir/pysite/libgomp.so.1"
cat > "$dir/run.sh" <<'RUN'
#!/bin/bash
# run.sh check | bench MODEL REPS DEPTHS [CHECK_TOKENS] | ab MODEL DEPTH VAR VALUES.. | mv VAR VALUES.. | attn SETTINGS..  (see scripts/pack-offline-bench.sh)
cd "$(dirname "$0")"
out="${OUT:-/tmp}"
PY="${PY:-python3}"  # needs numpy
L=pysite/llama_cpp/lib
for f in $L/*.so.*.*; do b=$(basename "$f"); n=${b%%.so.*}; ln -sf "$b" "$L/$n.so"; ln -sf "$b" "$L/$n.so.0"; done
export LD_LIBRARY_PATH=$PWD/pysite:${LD_LIBRARY_PATH:-} PYTHONPATH=$PWD/pysite KESTREL_PEERS_CHILD=1
synth() { [ -f "/tmp/$1.gguf" ] || "$PY" synth_gguf.py build "$1" "/tmp/$1.gguf" >/dev/null || exit 1; }
case "$1" in
check)
  grep -m1 "model name" /proc/cpuinfo
  echo "LLC: $(cat /sys/devices/system/cpu/cpu0/cache/index3/size 2>/dev/null)"
  ./quant-tests 2>&1 | grep -E "test result|panicked|FAILED"
  synth qwen15
  ids=$("$PY" -c "import random; r=random.Random(5); print(','.join(str(r.randrange(1000, 100000)) for _ in range(100)))")
  for amx in 0 1; do KESTREL_AMX=$amx ./kestrel logits -m /tmp/qwen15.gguf -t 2 --prompt-ids "$ids" --out "/tmp/logits$amx.st" 2>&1 | tail -1; done
  cmp /tmp/logits0.st /tmp/logits1.st && echo "logits: AMX on and off bit-identical (100-token prompt)"
  ;;
bench)
  synth "$2"
  "$PY" bench_vs_peer.py "/tmp/$2.gguf" --kestrel "$PWD/kestrel" --peer "$PWD/llamacpp_bench.py" \
    --rounds 1 -r "$3" --depths "$4" --check-tokens "${5:-0}" --log "$out/$2-d$4-$(date +%H%M%S).jsonl"
  ;;
attn)
  shift
  for s in "$@"; do
    echo "KESTREL_KV_PREFETCH=$s: $(KESTREL_KV_PREFETCH=$s KESTREL_COLD=${COLD:-33} ./attention_decode 4096 28 12 2 128 ${THREADS:-2} 64)"
  done
  ;;
ab)
  synth "$2"
  m=$2 d=$3 var=$4; shift 4
  for s in "$@"; do
    f="$out/ab-$m-d$d-$s-$(date +%H%M%S).txt"
    env "$var=$s" ./kestrel bench -m "/tmp/$m.gguf" -p 0 -n 64 -d "$d" -r 2 -t 2 --check-tokens 0 >"$f" 2>&1
    echo "$(date +%T) $var=$s decode tok/s, bandwidth GB/s: $(grep -E '^(decode tok|read bandwidth GB)' "$f" | awk '{printf "%s ", $(NF-2)}')"
  done
  ;;
mv)
  var=$2; shift 2
  for s in "$@"; do echo "$var=$s"; env "$var=$s" ./matvec_bench Q4_K Q6_K --no-prefill --backend avx512 | grep repacked; done
  ;;
*) echo "usage: run.sh check | bench MODEL REPS DEPTHS [CHECK_TOKENS] | ab MODEL DEPTH VAR VALUES.. | mv VAR VALUES.. | attn SETTINGS.."; exit 2 ;;
esac
RUN
chmod +x "$dir/run.sh"
du -sh "$dir"
