#!/usr/bin/env bash
# Packs the binaries a GPU machine runs (bench/run_h200.sh, bench/run_h200_engine.sh with BIN_DIR=...) from a
# CUDA build made here: epinfer and epinfer_test_cuda without debug info, and in BIN_DIR/lib the shared
# libraries they need that a bare GPU machine may lack (fmt, cpp-httplib and its ssl/crypto/zlib/brotli).
# The CUDA runtime is linked statically; cuBLAS and NCCL (loaded at run time) come from the GPU machine.
# Usage: bench/pack_bin_dir.sh BUILD_DIR BIN_DIR     e.g. bench/pack_bin_dir.sh build-cuda-h build-cuda-carry
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:?usage: bench/pack_bin_dir.sh BUILD_DIR BIN_DIR}
out=${2:?usage: bench/pack_bin_dir.sh BUILD_DIR BIN_DIR}
mkdir -p "$out/lib"
for bin in "$build/tools/epinfer/epinfer" "$build/tests/epinfer_test_cuda"; do
  objcopy --strip-debug "$bin" "$out/$(basename "$bin")"
done
for bin in "$out/epinfer" "$out/epinfer_test_cuda"; do
  ldd "$bin" | awk '/=> \// {print $3}' | grep -E 'lib(fmt|cpp-httplib|ssl|crypto|z|brotli[a-z]*)\.so' || true
done | sort -u | while read -r lib; do cp -L "$lib" "$out/lib/"; done
du -sh "$out"
