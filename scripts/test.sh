#!/usr/bin/env bash
# The whole test suite: fetch the real models (idempotent), then every test in release mode
# (real-model tests would crawl unoptimized). Real-model tests fail, not skip, when models are
# missing, because KESTREL_REQUIRE_MODELS=1.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/fetch-models.sh
export KESTREL_REQUIRE_MODELS=1
# the CUDA backend's tests on the emulated device (crates/kestrel-cuda/emu) fail, not skip, without g++
export KESTREL_REQUIRE_CUDA_EMU=1
# NVRTC from PyPI (no GPU needed): the CUDA kernels are compiled for sm_90 by a test, so a kernel
# that does not build fails here rather than on the GPU host. Without it that test says it skipped.
NVRTC=target/nvrtc
if [[ ! -e $NVRTC/libnvrtc.so.13 ]]; then
    mkdir -p $NVRTC
    if python3 -m pip download --quiet --no-deps --only-binary=:all: --disable-pip-version-check \
        -d $NVRTC/wheel nvidia-cuda-nvrtc==13.5.37 >$NVRTC/pip.log 2>&1; then
        python3 -c "import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); [open(sys.argv[2] + '/' + n.rsplit('/', 1)[1], 'wb').write(z.read(n)) for n in z.namelist() if '/lib/libnvrtc' in n]" $NVRTC/wheel/*.whl $NVRTC
    else
        echo "test.sh: NVRTC could not be fetched (the kernel compile test will skip): $(tail -n 2 $NVRTC/pip.log)"
    fi
fi
LD_LIBRARY_PATH="$PWD/$NVRTC${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" cargo test --release --workspace "$@"
# The kernels' tests again with AVX2 as the detected backend (what an AVX2-only CPU runs: the
# decode and batched-decode dispatch follows the detected backend, so on an AVX-512 machine the
# first run does not reach it).
KESTREL_QUANT_BACKEND=avx2 cargo test --release -p kestrel-quant "$@"
# End-to-end: the server on loopback ports with the real models (needs the release binary).
cargo build --release -p kestrel-cli
bash scripts/e2e.sh
