#!/usr/bin/env bash
# Builds (if needed) and runs every CPU test: unit (L0), end-to-end goldens (L1), MPI ranks (MPI),
# then fuzzes the safetensors header parser for a bounded time. With nvcc, also compiles the CUDA backend
# and its test binary in build-cuda/ (scripts/build_cuda.sh; the GPU tests run on a GPU machine).
# Usage: scripts/test.sh [FUZZ_SECONDS, default 30]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh >/dev/null
scripts/build.sh
scripts/build_cuda.sh  # compile check of the CUDA backend (skipped without nvcc)
ctest --test-dir build --output-on-failure -j"$(nproc)" --timeout 600
if [ -x scripts/run_fuzz.sh ]; then
  scripts/run_fuzz.sh "${1:-30}"
fi
