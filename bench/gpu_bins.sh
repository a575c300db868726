# Sourced by bench/run_h200.sh and bench/run_h200_attention.sh (from the repository root, OUT_DIR made):
# puts the CUDA toolkit's and PyTorch's NVIDIA libraries on LD_LIBRARY_PATH, sets EPINFER and TESTS to
# prebuilt binaries in BIN_DIR (BIN_DIR/lib first on LD_LIBRARY_PATH), or builds build-gpu with CMake
# (targets: $GPU_BUILD_TARGETS, default epinfer epinfer_test_cuda), exports EPINFER_CLI (the epinfer the
# tests' CLI runs use, tests/common/cli_runner.h), and writes the date, commit and GPU state to
# $OUT_DIR/bench.txt.
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
         $(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/cu*/lib 2>/dev/null); do
    [ -d "$d" ] && LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
done
if [ -n "${BIN_DIR:-}" ]; then
    LD_LIBRARY_PATH="$PWD/$BIN_DIR/lib:$LD_LIBRARY_PATH"
    EPINFER="$BIN_DIR/epinfer"
    TESTS="$BIN_DIR/epinfer_test_cuda"
else
    cmake -S . -B build-gpu -G Ninja -DEPINFER_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DEPINFER_MPI=OFF \
        >"$OUT_DIR/build.txt" 2>&1 &&
        ninja -C build-gpu -j16 ${GPU_BUILD_TARGETS:-epinfer epinfer_test_cuda} >>"$OUT_DIR/build.txt" 2>&1 \
        || { tail -30 "$OUT_DIR/build.txt"; exit 1; }
    EPINFER=build-gpu/tools/epinfer/epinfer
    TESTS=build-gpu/tests/epinfer_test_cuda
fi
# The CLI tests inside epinfer_test_cuda run this epinfer, not the path they were built with.
EPINFER_CLI="$PWD/$EPINFER"
export LD_LIBRARY_PATH EPINFER_CLI

{
    date -u +"date %Y-%m-%dT%H:%M:%SZ"
    git rev-parse HEAD 2>/dev/null | sed 's/^/commit /'
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv
} >"$OUT_DIR/bench.txt" 2>&1
