#!/usr/bin/env bash
# Configures and builds epinfer into build/ (Release, CPU backend). Extra arguments go to CMake configure.
# Usage: scripts/build.sh [-DEPINFER_CUDA=ON ...]
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build -j"$(nproc)"
