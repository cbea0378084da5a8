#!/usr/bin/env bash
# One call on the GPU host (the device tool's nvidia-h200): check the CUDA backend and time it,
# and llama.cpp on the same files. Runs from the repository root with the bundle made by
# scripts/gpu/bundle.sh in $B (default .gpu-cuda): kestrel.xz (the release binary),
# llama-src.tar.xz (llama.cpp trimmed to build llama-bench, llama-batched-bench and
# llama-quantize), gguf wheel, make_dense_model.py / make_qwen35_model.py + vocab. Every
# stage's output goes to stdout too, and all of it to $OUT/summary.txt at the end.
# STAGES (default "check small"): check = op harness + tiny fixtures vs transformers (with
# --perf lines: mat-vec variants, the logits download; PERF=0 without); small = Qwen2.5-1.5B-shape Q4_K_M: GPU
# vs CPU logits, pp512/tg128; big = Qwen3-8B shape; hybrid = Qwen3.5: tiny-qwen3_5 (GGUF and
# folder) against transformers, serve --device cuda against --device cpu on it, and the
# Qwen3.5-0.8B shape: GPU vs CPU logits, pp512/tg128; HYBRID_SHAPES picks the shapes (default
# qwen35-0.8b; qwen35-9b); SCEN=1 adds the engine's concurrent scenario (1/8/32 sequences) to
# every shape and the agent scenario to the hybrid ones; DEPTH=1 adds pp4096 and tg128 at depth
# 16384; SKIP_TINY=1 skips the tiny fixture checks; peer = llama.cpp (CUDA, -fa 1) on every file
# the earlier stages (of this call or an earlier one on the same warm machine) wrote: llama-bench
# pp512/pp4096/tg128, tg128 at depth 16384, llama-batched-bench with kestrel's concurrent
# workload (128-token prompts, 64 new tokens, 1/8/32 sequences; PEER_QUICK=1: llama-bench's
# pp512/pp4096/tg128 alone, PEER_QUICK=depth: and tg128 at depth 16384; PEER_SHAPES: only
# these shapes' files); prefill = pp512/pp4096 of every shape in PREFILL_SHAPES (default
# qwen3-8b qwen35-0.8b qwen2.5-1.5b), with FLASH_AB=1 pp4096 again with KESTREL_CUDA_FLASH=0
# (the split attention kernel instead of the tensor-core prompt kernel), with PREFILL_GEN=128
# tg128 in the same bench, with PROF=N the first N kernels of a 2048-token prompt under ncu;
# AB_ENV="VAR=value,VAR2=value+VAR3=value": tg128 again with each setting (small, big, hybrid;
# KESTREL_CUDA_KERNELS=$B/kernels-REV: another revision's kernels, bundle.sh BASE_KERNELS="REV ...");
# SCEN_AB (same form): the concurrent scenario again with each setting;
# sampled = decode through `kestrel serve --device cuda` with sampling chains (OpenAI's defaults,
# top-k, nucleus) beside greedy, and the host's time picking a token (SAMPLED_SHAPE, default
# qwen3-8b; scripts/gpu/sampled.py); moe = Qwen3-30B-A3B's layer shapes (MOE_LAYERS of its 48,
# default 12; scripts/gpu/make_moe_model.py): pp512/tg128, eager tg128, SCEN=1 the concurrent
# scenario (the peer stage with PEER_SHAPES=qwen3-30b-a3b times llama.cpp on the same file);
# perf = gpu-check --perf PERF_GROUPS (default mmq) with no op harness, for this build's kernels
# and each BASE_KERNELS revision's in the bundle;
# ncu = ncu's detailed sections of decode kernels (NCU_SHAPE, NCU_K, NCU_C); timeline = one
# replayed decode step of each shape in TIMELINE_SHAPES (default qwen3-8b qwen2.5-1.5b) kernel
# by kernel, stamped on the GPU's timer (KESTREL_CUDA_TIMELINE: the CSV and the summary under
# $OUT), beside tg128 unstamped; TIMELINE_AB (AB_ENV's form): stamped again with each setting.
# Every model is written once: random weights of the real shape (F16), quantized to Q4_K_M
# (QUANT: another mixture of `kestrel quantize --type`, e.g. q5_k_m; the peer stage then reads
# those files) by `kestrel quantize` (it writes llama.cpp's bytes, tensor for tensor), kept in $MODELS
# (target/gpu-models, git-ignored, so a later call on the warm machine reuses it); those the
# stages need are written in the background from the start (PREMAKE=0: when first needed). llama.cpp is
# built for sm_90 in the background into $PEER (target/gpu-peer) when the bundle has its source
# and no build is there yet (~4 minutes on 16 cores, while the kestrel stages run).
set -u
B=${B:-.gpu-cuda}
# settings shipped with the bundle (bundle.sh ENV_SH=FILE) override the caller's
[ -f $B/env.sh ] && . $B/env.sh
OUT=${OUT:-/tmp/out}
STAGES=${STAGES:-"check small"}
# each stage's log under $L, all of them in $OUT/summary.txt at the end: the device tool brings
# back at most 8 files from $OUT (what stays there: summary.txt, the timeline CSVs, ncu's detail)
L=/tmp/w/logs
rm -rf $L
mkdir -p "$OUT" /tmp/w $L
# the kernels bundle.sh compiled ahead: loaded instead of compiled (~3 minutes on a fresh host)
mkdir -p /tmp/w/cubins
for f in $B/cubins/*.cubin.xz; do
  [ -f "$f" ] && xz -dc "$f" > /tmp/w/cubins/$(basename "$f" .xz)
done
export KESTREL_CUDA_CUBINS=${KESTREL_CUDA_CUBINS:-/tmp/w/cubins}
export PYTHONUNBUFFERED=1
xz -dc $B/kestrel.xz > /tmp/w/kestrel && chmod +x /tmp/w/kestrel
K=/tmp/w/kestrel
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.used,memory.total --format=csv | tee $L/gpu.txt
MODELS=${MODELS:-target/gpu-models}
PEER=${PEER:-$PWD/target/gpu-peer}
mkdir -p "$MODELS"
if [ -f $B/llama-src.tar.xz ] && [ ! -x $PEER/build/bin/llama-bench ]; then
  mkdir -p $PEER
  ( tar xJf $B/llama-src.tar.xz -C $PEER && cd $PEER/trim && \
    cmake -B $PEER/build -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_MTMD=OFF \
      -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF -DCMAKE_BUILD_TYPE=Release > $PEER/cmake.log 2>&1 && \
    nice cmake --build $PEER/build --target llama-bench llama-batched-bench -j12 > $PEER/build.log 2>&1
    echo "llama.cpp CUDA build rc=$? ($(date +%T))" ) > $PEER/status.txt 2>&1 &
fi
# the kernels compile (NVRTC, ~3 minutes on a fresh machine; none of it when bundle.sh shipped
# them in cubins/) while the first model is written
# (and those of any other revision in the bundle, for AB_ENV's KESTREL_CUDA_KERNELS, beside them)
# (the stamped build of the timeline stage too)
( for d in "" $B/kernels-*/; do
    [ -z "$d" ] || [ -d "$d" ] || continue
    KESTREL_CUDA_KERNELS=$d $K run -m testdata/tiny/tiny-qwen2/qwen2-f32.gguf --prompt-ids 1 -n 1 --device cuda &
  done
  echo " $STAGES " | grep -q " timeline " && KESTREL_CUDA_TIMELINE=/tmp/w/warm-timeline.csv \
    $K run -m testdata/tiny/tiny-qwen2/qwen2-f32.gguf --prompt-ids 1 -n 1 --device cuda &
  wait ) > /tmp/w/warm.log 2>&1 &
WARM=$!
python3 -m pip install -q --no-index --no-deps --target /tmp/site $B/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site
Q=${QUANT:-q4_k_m}
write_model() {  # write_model SHAPE: random weights of SHAPE, quantized to $Q, into $MODELS
  local M=$MODELS/$1-$Q.gguf F=/tmp/w/$1-f16.gguf
  [ -s $M ] && return 0
  case $1 in
  qwen35*) python3 $B/make_qwen35_model.py $F $1 > /dev/null ;;
  qwen3-30b-a3b) python3 $B/make_moe_model.py $F ${MOE_LAYERS:-12} > /dev/null ;;
  *) python3 $B/make_dense_model.py $F $1 > /dev/null ;;
  esac
  $K quantize $F $M.part --type $Q -t 16 > /tmp/w/quant-$1.log 2>&1 && mv $M.part $M
  rm -f $F
}
# The files the stages will read are written in the background from the start (one after
# another, niced, while the kernels compile and the check stage runs: its op harness and
# tiny-model checks are not timed, its --perf lines are GPU time); the first stage that needs a
# model waits until all are written, so no bench runs beside the writer. PREMAKE=0: each when
# its stage first needs it.
PRE=""
for s in $STAGES; do
  case $s in
  small|serve) PRE="$PRE qwen2.5-1.5b" ;;
  big) PRE="$PRE qwen3-8b" ;;
  sampled) PRE="$PRE ${SAMPLED_SHAPE:-qwen3-8b}" ;;
  hybrid) PRE="$PRE ${HYBRID_SHAPES:-qwen35-0.8b}" ;;
  moe) PRE="$PRE qwen3-30b-a3b" ;;
  prefill) PRE="$PRE ${PREFILL_SHAPES:-qwen3-8b qwen35-0.8b qwen2.5-1.5b}" ;;
  ncu) PRE="$PRE ${NCU_SHAPE:-qwen2.5-1.5b}" ;;
  timeline) PRE="$PRE ${TIMELINE_SHAPES:-qwen3-8b qwen2.5-1.5b}" ;;
  esac
done
PREPID=""
if [ "${PREMAKE:-1}" != 0 ] && [ -n "$PRE" ]; then
  ( renice -n 10 -p $BASHPID; for sh in $PRE; do write_model $sh; done ) > /dev/null 2>&1 &
  PREPID=$!
fi
model() {  # model SHAPE: the $Q file of SHAPE in $MODELS (written once)
  local M=$MODELS/$1-$Q.gguf
  # the background writer done (every file: nothing timed runs beside it); a file it did not
  # write (it failed, or none ran) is written here
  while [ -n "$PREPID" ] && kill -0 $PREPID 2>/dev/null; do sleep 2; done
  write_model $1
  [ -s $M ] || { tail -5 /tmp/w/quant-$1.log >&2; return 1; }
  while kill -0 $WARM 2>/dev/null; do sleep 1; done  # the kernels compiled
  echo $M
}
ab() {  # ab MODEL: tg128 again with each comma-separated setting of $AB_ENV (A/B in one call;
  # DEPTH_AB=1: tg128 at depth 16384 too)
  local e
  for e in $(echo "${AB_ENV:-}" | tr ',' ' '); do
    # the setting after each line (awk: a setting may hold a path, which sed's s/// would cut)
    env $(echo $e | tr '+' ' ') $K bench -m $1 -p 0 -n 128 -r 3 --device cuda 2>&1 | grep "| tg" | awk -v e="$e" '{print $0 " (" e ")"}'
    [ -n "${DEPTH_AB:-}" ] && env $(echo $e | tr '+' ' ') $K bench -m $1 -p 0 -n 128 -d 16384 -r 2 --device cuda 2>&1 | grep "| tg" | awk -v e="$e" '{print $0 " (" e ")"}'
  done
  return 0
}
concurrent() {  # concurrent MODEL SHAPE: aggregate decode of 1/8/32 sequences through the engine
  # (again with each setting of $SCEN_AB, as AB_ENV)
  $K bench -m $1 --scenario concurrent -c 1,8,32 -r 3 --device cuda 2>&1 | tee $L/concurrent-$2.log
  local e
  for e in $(echo "${SCEN_AB:-}" | tr ',' ' '); do
    echo "--- $e" | tee -a $L/concurrent-$2.log
    env $(echo $e | tr '+' ' ') $K bench -m $1 --scenario concurrent -c 1,8,32 -r 3 --device cuda 2>&1 | tee -a $L/concurrent-$2.log
  done
}
profile() {  # profile MODEL NAME [BENCH ARGS]: per-kernel times (ncu, clocks left alone) of the
  # first $PROF kernels of a bench, by default eager decode steps
  NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
  $NCU --clock-control none --metrics gpu__time_duration.sum --csv -c ${PROF} $K bench -m $1 ${3:--p 0 -n 2 --no-graphs} -r 1 --device cuda > /tmp/w/ncu.csv 2>/tmp/w/ncu.err
  python3 - /tmp/w/ncu.csv <<'PY' | tee $L/prof-$2.log
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
    $K gpu-check $([ "${PERF:-1}" = 1 ] && echo --perf) -m $T/tiny-llama/llama-f32.gguf -m $T/tiny-qwen2/qwen2-f32.gguf -m $T/tiny-qwen3/qwen3-f32.gguf -m $T/tiny-qwen3_moe/qwen3_moe-f32.gguf 2>&1 | tee $L/check.log
    # the second start loads the cached kernels
    $K run -m $T/tiny-qwen2/qwen2-f32.gguf --prompt-ids 1,2,3 -n 8 --temp 0 --device cuda 2>&1 | tail -3
    ;;
  perf)  # gpu-check --perf PERF_GROUPS (default mmq) alone, no op harness: this build's kernels,
    # then each other revision's in the bundle (bundle.sh BASE_KERNELS), side by side
    while kill -0 $WARM 2>/dev/null; do sleep 1; done
    for d in "" $B/kernels-*/; do
      [ -z "$d" ] || [ -d "$d" ] || continue
      echo "--- kernels: ${d:-built in}" | tee -a $L/perf.log
      KESTREL_CUDA_KERNELS=$d $K gpu-check --ops none --perf ${PERF_GROUPS:-mmq} 2>&1 | tee -a $L/perf.log
    done
    ;;
  serve)  # kestrel serve --device cuda against --device cpu (tiny fixtures: greedy ties are rare there),
    # then on the Qwen2.5-1.5B shape (texts not compared: near-ties; SERVE_EXACT=0)
    for f in $T/tiny-qwen2/qwen2-f32.gguf $T/tiny-llama/llama-f32.gguf; do
      python3 $B/serve-check.py $K $f 2>&1 | tee -a $L/serve.log
    done
    M=$(model qwen2.5-1.5b) && SERVE_EXACT=0 python3 $B/serve-check.py $K $M 2>&1 | grep -v "INFO\|WARN" | tee -a $L/serve.log
    ;;
  hybrid)
    if [ -z "${SKIP_TINY:-}" ]; then
      $K gpu-check -m $T/tiny-qwen3_5/qwen3_5-f32.gguf -m $T/tiny-qwen3_5 2>&1 | grep -v "^ok  " | tee $L/check-hybrid.log
      python3 $B/serve-check.py $K $T/tiny-qwen3_5/qwen3_5-f32.gguf 2>&1 | tee $L/serve-hybrid.log
    fi
    for SH in ${HYBRID_SHAPES:-qwen35-0.8b}; do
      M=$(model $SH) || continue
      [ $SH = qwen35-0.8b ] && $K gpu-check -m $M --prompt-len 64 --gen 32 2>&1 | grep -v "^ok  " | tee $L/parity-$SH.log
      $K bench -m $M -p 512 -n 128 -r ${REPS:-3} --device cuda 2>&1 | tee $L/bench-$SH.log
      $K bench -m $M -p 0 -n 128 -r 3 --device cuda --no-graphs 2>&1 | tail -1 | tee -a $L/bench-$SH.log
      ab $M | tee -a $L/bench-$SH.log
      [ -n "${DEPTH:-}" ] && $K bench -m $M -p 4096 -n 128 -d 0,16384 -r 2 --device cuda 2>&1 | grep "| qwen" | tee -a $L/bench-$SH.log
      if [ -n "${SCEN:-}" ]; then  # the serving engine on the GPU: batched decode, agent turns
        concurrent $M $SH
        $K bench -m $M --scenario agent --device cuda 2>&1 | tee $L/agent-$SH.log
      fi
      [ -n "${PROF:-}" ] && profile $M $SH
    done
    ;;
  moe)  # Qwen3-30B-A3B's layer shapes, MOE_LAYERS (12) of its 48 layers (make_moe_model.py):
    # prompt and decode speed (SCEN=1: batched decode); PEER_SHAPES=qwen3-30b-a3b for llama.cpp
    M=$(model qwen3-30b-a3b) || continue
    $K bench -m $M -p 512 -n 128 -r ${REPS:-3} --device cuda 2>&1 | tee $L/bench-qwen3-30b-a3b.log
    $K bench -m $M -p 0 -n 128 -r 3 --device cuda --no-graphs 2>&1 | tail -1 | tee -a $L/bench-qwen3-30b-a3b.log
    [ -n "${SCEN:-}" ] && concurrent $M qwen3-30b-a3b
    ;;
  small|big)
    if [ $s = small ]; then SH=qwen2.5-1.5b; else SH=qwen3-8b; fi
    M=$(model $SH) || continue
    { [ $s = small ] || [ -n "${PARITY_BIG:-}" ]; } && $K gpu-check -m $M --prompt-len 64 --gen 32 2>&1 | grep -v "^ok  matvec\|^ok  rms\|^ok  qkv\|^ok  att\|^ok  embed\|^ok  deq" | tee $L/parity-$SH.log
    $K bench -m $M -p 512 -n 128 -r ${REPS:-3} --device cuda 2>&1 | tee $L/bench-$SH.log
    $K bench -m $M -p 0 -n 128 -r 3 --device cuda --no-graphs 2>&1 | tail -1 | tee -a $L/bench-$SH.log
    ab $M | tee -a $L/bench-$SH.log
    [ -n "${DEPTH:-}" ] && $K bench -m $M -p 4096 -n 128 -d 0,16384 -r 2 --device cuda 2>&1 | grep "| qwen" | tee -a $L/bench-$SH.log
    [ -n "${SCEN:-}" ] && concurrent $M $SH
    [ -n "${PROF:-}" ] && profile $M $SH
    ;;
  prefill)  # prompt speed of every shape in PREFILL_SHAPES, the prompt attention kernel on and off
    for SH in ${PREFILL_SHAPES:-qwen3-8b qwen35-0.8b qwen2.5-1.5b}; do
      M=$(model $SH) || continue
      $K bench -m $M -p 512,4096 -n ${PREFILL_GEN:-0} -r ${REPS:-3} --device cuda 2>&1 | tee $L/prefill-$SH.log
      [ -n "${FLASH_AB:-}" ] && KESTREL_CUDA_FLASH=0 $K bench -m $M -p 4096 -n 0 -r 2 --device cuda 2>&1 | grep "| qwen" | sed 's/$/ (KESTREL_CUDA_FLASH=0)/' | tee -a $L/prefill-$SH.log
      [ -n "${PROF:-}" ] && profile $M $SH-prefill "-p 2048 -n 0 --check-tokens 0"
    done
    ;;
  ncu)  # NCU_SHAPE's (default qwen2.5-1.5b) first NCU_C (12) kernels matching NCU_K (the
    # decode step's mat-vecs, norms and attention) of eager decode steps, with ncu's
    # throughput, memory, occupancy and warp-stall sections
    M=$(model ${NCU_SHAPE:-qwen2.5-1.5b}) || continue
    NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
    $NCU --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
      --section WarpStateStats --section SchedulerStats --section LaunchStats -k "regex:${NCU_K:-^(mv|rms|attn)}" \
      -c ${NCU_C:-12} $K bench -m $M -p 0 -n 2 --no-graphs -r 1 --device cuda > $OUT/ncu-detail.log 2>&1
    grep -c "Section: Memory" $OUT/ncu-detail.log
    ;;
  timeline)  # where a replayed decode step's time goes, kernel by kernel (crate::timeline)
    for SH in ${TIMELINE_SHAPES:-qwen3-8b qwen2.5-1.5b}; do
      M=$(model $SH) || continue
      $K bench -m $M -p 0 -n 128 -r 2 --device cuda 2>&1 | grep "| tg" | sed 's/$/ (unstamped)/' | tee $L/timeline-$SH.log
      KESTREL_CUDA_TIMELINE=$OUT/timeline-$SH.csv $K bench -m $M -p 0 -n 128 -r 2 --device cuda 2>&1 | grep -v "^ok  " | tee -a $L/timeline-$SH.log
      i=0
      for e in $(echo "${TIMELINE_AB:-}" | tr ',' ' '); do  # again with each setting (AB_ENV's form)
        i=$((i + 1))
        echo "--- $e" | tee -a $L/timeline-$SH.log
        env $(echo $e | tr '+' ' ') KESTREL_CUDA_TIMELINE=$OUT/timeline-$SH-ab$i.csv $K bench -m $M -p 0 -n 128 -r 2 --device cuda 2>&1 | grep -v "^ok  " | tee -a $L/timeline-$SH.log
      done
    done
    ;;
  sampled)  # decode through `kestrel serve --device cuda` with sampling chains (scripts/gpu/sampled.py)
    M=$(model ${SAMPLED_SHAPE:-qwen3-8b}) || continue
    python3 $B/sampled.py $K $M 2>&1 | tee $L/sampled.log
    ;;
  peer)  # llama.cpp on the same files, flash attention on, all layers on the GPU
    while [ ! -s $PEER/status.txt ] && [ -d $PEER/trim ]; do sleep 5; done
    cat $PEER/status.txt 2>/dev/null | tee $L/peer-build.txt
    LB=$PEER/build/bin
    [ -x $LB/llama-bench ] || { echo "no llama.cpp build (bundle without llama-src?)"; tail -20 $PEER/build.log 2>/dev/null; continue; }
    for M in $MODELS/*-$Q.gguf; do
      SH=$(basename $M -$Q.gguf)
      [ -n "${PEER_SHAPES:-}" ] && ! echo " $PEER_SHAPES " | grep -q " $SH " && continue
      $LB/llama-bench -m $M -ngl 99 -fa 1 -p 512,4096 -n 128 -r ${REPS:-3} 2>&1 | grep "^|" | tee $L/peer-$SH.log
      [ -n "${PEER_QUICK:-}" ] && [ "$PEER_QUICK" != depth ] && continue
      $LB/llama-bench -m $M -ngl 99 -fa 1 -p 0 -n 128 -d 16384 -r 1 2>&1 | grep "^| [a-z]" | tail -1 | tee -a $L/peer-$SH.log
      [ -n "${PEER_QUICK:-}" ] && continue
      $LB/llama-batched-bench -m $M -ngl 99 -fa 1 -c 8192 -b 2048 -ub 512 -npp 128 -ntg 64 -npl 1,8,32 2>&1 | grep "^|" | tee -a $L/peer-$SH.log
    done
    ;;
  esac
done
echo "=== summary ($(date +%T))"
# failures first and never cut (a FAIL line past the perf lines was lost to head before)
grep -H "FAIL" $L/*.log 2>/dev/null
grep -h "serve check\|op harness\|reference prompt\|GPU vs CPU\|perf decode\|perf prompt\|dequantize" $L/*.log 2>/dev/null | head -40
grep -h "perf mat-vec" $L/*.log 2>/dev/null | grep "decode's\|read floor" | head -40
grep -h "| tg\|| pp" $L/bench-*.log $L/prefill-*.log 2>/dev/null
grep -h "timeline\|in the kernels\|| tg" $L/timeline-*.log 2>/dev/null
grep -h "tok/s\|^---" $L/concurrent-*.log 2>/dev/null
grep -h "^sampled" $L/sampled.log 2>/dev/null
grep -h "tok/s\|^|" $L/peer-*.log 2>/dev/null
# everything in one file
for f in $L/gpu.txt $L/perf.log $L/check.log $L/prof-*.log $L/sampled.log $L/parity-*.log $L/check-hybrid.log $L/serve*.log $L/bench-*.log $L/prefill-*.log $L/concurrent-*.log $L/agent-*.log $L/timeline-*.log $L/peer*; do
  [ -f "$f" ] && { echo "=== $(basename $f)"; cat "$f"; }
done > $OUT/summary.txt 2>/dev/null
