#!/usr/bin/env bash
# The CUDA compile step of CI: configures build-cuda/ with -DEPINFER_CUDA=ON and builds the CUDA backend
# library and the CUDA test binary (which links every library, the NCCL communicator included), when nvcc
# exists; without nvcc it says so and succeeds. No GPU is needed: the CUDA tests skip without one.
# Architectures: EPINFER_CI_CUDA_ARCHS (default 90a: one SASS keeps the step short on a 2-core machine;
# the project's default build, without this override, compiles 80, 90a and 120).
# Usage: scripts/build_cuda.sh [extra CMake configure arguments]
set -euo pipefail
cd "$(dirname "$0")/.."
nvcc_path=$(command -v nvcc || true)
if [ -z "$nvcc_path" ] && [ -x /usr/local/cuda/bin/nvcc ]; then nvcc_path=/usr/local/cuda/bin/nvcc; fi
if [ -z "$nvcc_path" ]; then
  echo "build_cuda: no nvcc on PATH or in /usr/local/cuda: CUDA compile step skipped"
  exit 0
fi
start=$(date +%s)
cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DEPINFER_CUDA=ON \
  -DCMAKE_CUDA_COMPILER="$nvcc_path" -DCMAKE_CUDA_ARCHITECTURES="${EPINFER_CI_CUDA_ARCHS:-90a}" "$@" >/dev/null
cmake --build build-cuda -j"$(nproc)" --target epinfer_backend_cuda epinfer_test_cuda
echo "build_cuda: CUDA compile step took $(( $(date +%s) - start )) s"
