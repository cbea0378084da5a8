#!/usr/bin/env bash
# Makes the trimmed llama.cpp tree that scripts/gpu/bundle.sh takes along (LLAMA_SRC) for the
# peer stage of scripts/gpu/h200.sh: the PyPI sdist of llama-cpp-python 0.3.36 (llama.cpp
# 0c1e570, shared/peers/gpu/README.md), cut to what llama-bench, llama-batched-bench and
# llama-quantize build from (~38 MB, 3.6 MB as xz). Usage: bash scripts/gpu/llama-src.sh DIR
# (writes DIR/trim; needs pip and network access to PyPI).
set -eu
DIR=${1:?usage: llama-src.sh DIR}
mkdir -p "$DIR"
if [ ! -x "$DIR/venv/bin/pip" ]; then
  python3 -m venv "$DIR/venv"
  # building the sdist's metadata needs these; --no-build-isolation keeps pip from compiling cmake
  "$DIR/venv/bin/pip" install -q scikit-build-core cmake ninja
fi
[ -f "$DIR"/llama_cpp_python-0.3.36.tar.gz ] || "$DIR/venv/bin/pip" download -q --no-deps \
  --no-binary :all: --no-build-isolation llama-cpp-python==0.3.36 -d "$DIR"
rm -rf "$DIR/x" "$DIR/trim" && mkdir -p "$DIR/x" "$DIR/trim/tools"
tar xzf "$DIR"/llama_cpp_python-0.3.36.tar.gz -C "$DIR/x"
L=$(ls -d "$DIR"/x/*/vendor/llama.cpp)
for d in ggml src include common cmake vendor CMakeLists.txt; do cp -r "$L/$d" "$DIR/trim/"; done
for t in llama-bench quantize batched-bench; do cp -r "$L/tools/$t" "$DIR/trim/tools/"; done
# tools/CMakeLists.txt names every tool of the tree: keep the three that came along
printf 'find_package(Threads REQUIRED)\nllama_add_compile_flags()\nadd_subdirectory(batched-bench)\nadd_subdirectory(llama-bench)\nadd_subdirectory(quantize)\n' \
  > "$DIR/trim/tools/CMakeLists.txt"
rm -rf "$DIR/x"
du -sh "$DIR/trim"
