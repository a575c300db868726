#!/usr/bin/env bash
# Packs the binaries a GPU machine runs (bench/run_h200.sh, bench/run_h200_engine.sh with BIN_DIR=...) from a
# CUDA build made here: epinfer and epinfer_test_cuda (and epinfer_mpi_model_test of an -DEPINFER_MPI=ON
# build) without debug info, and in BIN_DIR/lib the shared libraries they need that a bare GPU machine may
# lack (fmt, cpp-httplib and its ssl/crypto/zlib/brotli, Open MPI's C++ bindings). The CUDA runtime is
# linked statically; cuBLAS and NCCL (loaded at run time) and Open MPI come from the GPU machine.
# Usage: bench/pack_bin_dir.sh BUILD_DIR BIN_DIR     e.g. bench/pack_bin_dir.sh build-cuda-h build-cuda-carry
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:?usage: bench/pack_bin_dir.sh BUILD_DIR BIN_DIR}
out=${2:?usage: bench/pack_bin_dir.sh BUILD_DIR BIN_DIR}
mkdir -p "$out/lib"
bins=("$build/tools/epinfer/epinfer" "$build/tests/epinfer_test_cuda")
[ -f "$build/tests/mpi/epinfer_mpi_model_test" ] && bins+=("$build/tests/mpi/epinfer_mpi_model_test")
for bin in "${bins[@]}"; do
  objcopy --strip-debug "$bin" "$out/$(basename "$bin")"
  ldd "$out/$(basename "$bin")" | awk '/=> \// {print $3}' |
    grep -E 'lib(fmt|cpp-httplib|ssl|crypto|z|brotli[a-z]*|mpi_cxx)\.so' || true
done | sort -u | while read -r lib; do cp -L "$lib" "$out/lib/"; done
du -sh "$out"
