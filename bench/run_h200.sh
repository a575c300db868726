#!/usr/bin/env bash
# One pass on a GPU machine: the CUDA op tests, `epinfer bench moe` (all shapes, both routings) and the
# PyTorch peers, with every log and result under OUT_DIR (default ./moe_h200_out).
#
#   bench/run_h200.sh                      # builds build-gpu with CMake (needs the project's dependencies)
#   BIN_DIR=build-h7-carry bench/run_h200.sh  # or runs prebuilt epinfer and epinfer_test_cuda from BIN_DIR
#                                             # (BIN_DIR/lib is put on LD_LIBRARY_PATH)
# Environment: OUT_DIR, REPEATS (epinfer, default 15), PEER_REPEATS (default 10), TOKENS (default all sizes).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${OUT_DIR:-moe_h200_out}
mkdir -p "$OUT_DIR"
REPEATS=${REPEATS:-15}
PEER_REPEATS=${PEER_REPEATS:-10}
TOKENS=${TOKENS:-1,8,64,256,1024,4096,16384}

. bench/gpu_bins.sh  # LD_LIBRARY_PATH, EPINFER, TESTS, $OUT_DIR/bench.txt

echo "== tests"
timeout 100 "$TESTS" --gtest_output=xml:"$OUT_DIR/tests.xml" >"$OUT_DIR/tests.txt" 2>&1
echo "tests rc=$?"
grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED|tests ran|Failure|error" "$OUT_DIR/tests.txt" | head -40

echo "== bench moe"
timeout 240 "$EPINFER" bench moe --tokens "$TOKENS" --repeats "$REPEATS" --json "$OUT_DIR/moe.json" \
    >>"$OUT_DIR/bench.txt" 2>&1
echo "bench rc=$?"
cat "$OUT_DIR/bench.txt"

echo "== peers"
if [ -f "$OUT_DIR/moe.json" ]; then
    PYTHONUNBUFFERED=1 timeout 200 python3 bench/moe_peers.py --epinfer-json "$OUT_DIR/moe.json" \
        --repeats "$PEER_REPEATS" --out-json "$OUT_DIR/peers.json" --out-md "$OUT_DIR/peers.md" \
        >"$OUT_DIR/peers.txt" 2>&1
    echo "peers rc=$?"
    tail -5 "$OUT_DIR/peers.txt"
    cat "$OUT_DIR/peers.md" 2>/dev/null
fi
