#!/usr/bin/env bash
# Builds the CUDA emulation (crates/kestrel-cuda/emu: a CUDA device on the CPU, for checking
# the kernels where no GPU is) into DIR (default target/cuda-emu), under the names the backend
# loads: run with LD_LIBRARY_PATH=DIR, `--device cuda` then runs every kernel on the CPU.
# Needs g++ (the emulated NVRTC compiles the kernels with it at run time).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-target/cuda-emu}
inc=$PWD/crates/kestrel-cuda/emu
mkdir -p "$out"
g++ -std=c++17 -O2 -fPIC -shared -Wall -DKESTREL_EMU_INCLUDE="\"$inc\"" \
    crates/kestrel-cuda/emu/driver.cpp -o "$out/libkestrel-cuda-emu.so" -ldl
for n in libcuda.so.1 libcuda.so libnvrtc.so.13 libnvrtc.so libcublas.so.13 libcublas.so libcublasLt.so.13 libcublasLt.so; do
    ln -sfn libkestrel-cuda-emu.so "$out/$n"
done
# the emulation's own checks (shuffle rules, deadlocks and mismatched warp-wide instructions
# reported rather than hung)
g++ -std=c++17 -O1 -w -I "$inc" crates/kestrel-cuda/emu/selftest.cpp -o "$out/selftest" -lpthread
"$out/selftest"
echo "CUDA emulation in $out"
