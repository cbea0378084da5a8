#!/usr/bin/env bash
# One call on the GPU host (the device tool's nvidia-h200): check the CUDA backend and time it.
# Runs from the repository root with the bundle made by scripts/gpu/bundle.sh in $B
# (default .gpu-cuda): kestrel.xz (the release binary), llama-src.tar.xz (llama.cpp trimmed to
# build llama-quantize), gguf wheel, make_dense_model.py + vocab. Writes logs under $OUT.
# STAGES (default "check small"): check = op harness + tiny fixtures vs transformers;
# small = Qwen2.5-1.5B-shape Q4_K_M: GPU vs CPU logits, pp512/tg128; big = Qwen3-8B shape;
# hybrid = Qwen3.5: tiny-qwen3_5 (GGUF and folder) against transformers, serve --device cuda
# against --device cpu on it, and the Qwen3.5-0.8B shape (Q4_K_M by kestrel's quantizer, which
# writes llama.cpp's bytes): GPU vs CPU logits, pp512/tg128; HYBRID_SHAPES picks the shapes
# (default qwen35-0.8b; qwen35-9b), SCEN=1 adds the engine's concurrent and agent scenarios,
# SKIP_TINY=1 skips the tiny fixture checks.
set -u
B=${B:-.gpu-cuda}
OUT=${OUT:-/tmp/out}
STAGES=${STAGES:-"check small"}
mkdir -p "$OUT" /tmp/w
export PYTHONUNBUFFERED=1
xz -dc $B/kestrel.xz > /tmp/w/kestrel && chmod +x /tmp/w/kestrel
K=/tmp/w/kestrel
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.used,memory.total --format=csv | tee $OUT/gpu.txt
# llama-quantize (CPU build) in the background while the checks run, when the bundle has it
[ -f $B/llama-src.tar.xz ] && ( mkdir -p /tmp/ll && tar xJf $B/llama-src.tar.xz -C /tmp/ll && cd /tmp/ll/trim && \
  cmake -B build -G Ninja -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_MTMD=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF -DCMAKE_BUILD_TYPE=Release >/tmp/w/cmake.log 2>&1 && \
  cmake --build build --target llama-quantize -j16 >/tmp/w/build.log 2>&1; echo "quantize build rc=$?" ) > /tmp/w/qbuild.txt 2>&1 &
QB=$!
python3 -m pip install -q --no-index --no-deps --target /tmp/site $B/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site
make_model() {  # make_model SHAPE OUT.gguf
  # llama.cpp's own quantizer when the bundle brought its source, else kestrel's (same bytes)
  local Q="/tmp/ll/trim/build/bin/llama-quantize /tmp/w/$1-f16.gguf $2 Q4_K_M 16"
  [ -x /tmp/ll/trim/build/bin/llama-quantize ] || Q="$K quantize /tmp/w/$1-f16.gguf $2 --type q4_k_m -t 16"
  python3 $B/make_dense_model.py /tmp/w/$1-f16.gguf $1 > /dev/null && $Q > /tmp/w/quant-$1.log 2>&1; local rc=$?
  rm -f /tmp/w/$1-f16.gguf; ls -la $2; return $rc
}
profile() {  # profile MODEL NAME: per-kernel times of eager decode steps (ncu, clocks left alone)
  NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
  $NCU --clock-control none --metrics gpu__time_duration.sum --csv -c ${PROF} $K bench -m $1 -p 0 -n 2 -r 1 --device cuda --no-graphs > /tmp/w/ncu.csv 2>/tmp/w/ncu.err
  python3 - /tmp/w/ncu.csv <<'PY' | tee $OUT/prof-$2.log
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
h = rows[0]; ki = h.index("Kernel Name"); vi = h.index("Metric Value")
t = collections.defaultdict(list)
for r in rows[1:]:
    t[r[ki].split("(")[0]].append(float(r[vi].replace(",", "")))
tot = sum(sum(v) for v in t.values())
print(f"{sum(len(v) for v in t.values())} kernels, {tot/1e3:.1f} us in all")
for k, v in sorted(t.items(), key=lambda kv: -sum(kv[1])):
    print(f"{k:<28} n={len(v):4d} total {sum(v)/1e3:8.1f} us  mean {sum(v)/len(v)/1e3:6.2f} us")
PY
  tail -3 /tmp/w/ncu.err
}
T=testdata/tiny
for s in $STAGES; do
  echo "=== stage $s ($(date +%T))"
  case $s in
  check)
    $K gpu-check --perf -m $T/tiny-llama/llama-f32.gguf -m $T/tiny-qwen2/qwen2-f32.gguf -m $T/tiny-qwen3/qwen3-f32.gguf 2>&1 | tee $OUT/check.log
    # the second start loads the cached kernels
    $K run -m $T/tiny-qwen2/qwen2-f32.gguf --prompt-ids 1,2,3 -n 8 --temp 0 --device cuda 2>&1 | tail -3
    ;;
  serve)  # kestrel serve --device cuda against --device cpu (tiny fixtures: greedy ties are rare there)
    for f in $T/tiny-qwen2/qwen2-f32.gguf $T/tiny-llama/llama-f32.gguf; do
      python3 $B/serve-check.py $K $f 2>&1 | tee -a $OUT/serve.log
    done
    ;;
  hybrid)
    if [ -z "${SKIP_TINY:-}" ]; then
      $K gpu-check -m $T/tiny-qwen3_5/qwen3_5-f32.gguf -m $T/tiny-qwen3_5 2>&1 | grep -v "^ok  " | tee $OUT/check-hybrid.log
      python3 $B/serve-check.py $K $T/tiny-qwen3_5/qwen3_5-f32.gguf 2>&1 | tee $OUT/serve-hybrid.log
    fi
    for SH in ${HYBRID_SHAPES:-qwen35-0.8b}; do
      M=/tmp/w/$SH-q4_k_m.gguf
      python3 $B/make_qwen35_model.py /tmp/w/$SH-f16.gguf $SH > /dev/null && \
        $K quantize /tmp/w/$SH-f16.gguf $M --type q4_k_m -t 16 2>&1 | tail -2; rm -f /tmp/w/$SH-f16.gguf
      [ $SH = qwen35-0.8b ] && $K gpu-check -m $M --prompt-len 64 --gen 32 2>&1 | grep -v "^ok  " | tee $OUT/parity-$SH.log
      $K bench -m $M -p 512 -n 128 -r ${REPS:-3} --device cuda 2>&1 | tee $OUT/bench-$SH.log
      $K bench -m $M -p 0 -n 128 -r 3 --device cuda --no-graphs 2>&1 | tail -1 | tee -a $OUT/bench-$SH.log
      [ -n "${DEPTH:-}" ] && $K bench -m $M -p 4096 -n 128 -d 0,16384 -r 2 --device cuda 2>&1 | grep "| qwen" | tee -a $OUT/bench-$SH.log
      if [ -n "${SCEN:-}" ]; then  # the serving engine on the GPU: batched decode, agent turns
        $K bench -m $M --scenario concurrent -c 8,32 -r 3 --device cuda 2>&1 | tee $OUT/concurrent-$SH.log
        $K bench -m $M --scenario agent --device cuda 2>&1 | tee $OUT/agent-$SH.log
      fi
      [ -n "${PROF:-}" ] && profile $M $SH
      rm -f $M
    done
    ;;
  small|big)
    wait $QB; cat /tmp/w/qbuild.txt
    if [ $s = small ]; then SH=qwen2.5-1.5b; else SH=qwen3-8b; fi
    M=/tmp/w/$SH-q4_k_m.gguf
    make_model $SH $M || { tail -5 /tmp/w/quant-$SH.log; continue; }
    { [ $s = small ] || [ -n "${PARITY_BIG:-}" ]; } && $K gpu-check -m $M --prompt-len 64 --gen 32 2>&1 | grep -v "^ok  matvec\|^ok  rms\|^ok  qkv\|^ok  att\|^ok  embed\|^ok  deq" | tee $OUT/parity-$SH.log
    $K bench -m $M -p 512 -n 128 -r ${REPS:-3} --device cuda 2>&1 | tee $OUT/bench-$SH.log
    $K bench -m $M -p 0 -n 128 -r 3 --device cuda --no-graphs 2>&1 | tail -1 | tee -a $OUT/bench-$SH.log
    [ $s = big ] && [ -n "${DEPTH:-}" ] && $K bench -m $M -p 4096 -n 128 -d 0,16384 -r 2 --device cuda 2>&1 | grep "| qwen" | tee -a $OUT/bench-$SH.log
    [ -n "${PROF:-}" ] && profile $M $SH
    rm -f $M
    ;;
  esac
done
echo "=== summary ($(date +%T))"
grep -h "FAIL\|op harness\|reference prompt\|GPU vs CPU\|perf mat-vec" $OUT/*.log 2>/dev/null | head -40
grep -h "| tg\|| pp" $OUT/bench-*.log 2>/dev/null
