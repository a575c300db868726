#!/usr/bin/env bash
# One pass on a GPU machine: `epinfer bench attention` (decode and prefill, GQA shapes of Qwen3-30B-A3B and
# GLM-4.5) and its PyTorch peers (bench/attention_peers.py: SDPA's flash and cuDNN backends), with every log
# and result under OUT_DIR (default ./attention_h200_out). A few minutes on an H200.
#
#   bench/run_h200_attention.sh                          # builds build-gpu with CMake (the project's dependencies)
#   BIN_DIR=build-h7-carry bench/run_h200_attention.sh   # or runs a prebuilt epinfer from BIN_DIR
#                                                        # (BIN_DIR/lib is put on LD_LIBRARY_PATH)
# Environment: OUT_DIR, REPEATS (epinfer, default 20), PEER_REPEATS (default 20), CASES (default, decode,
# prefill or mla; default: default), BASE_PROFILE (default profiles/measured/h200_epinfer_2026-12-01.json):
# the run also writes $OUT_DIR/attention_profile.json, that profile with the planner's attention figures
# measured here (bench attention --profile-out; cases without prefill or mla write none).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${OUT_DIR:-attention_h200_out}
mkdir -p "$OUT_DIR"
REPEATS=${REPEATS:-20}
PEER_REPEATS=${PEER_REPEATS:-20}
CASES=${CASES:-default}
BASE_PROFILE=${BASE_PROFILE:-profiles/measured/h200_epinfer_2026-12-01.json}

GPU_BUILD_TARGETS=epinfer
. bench/gpu_bins.sh  # LD_LIBRARY_PATH, EPINFER, TESTS, $OUT_DIR/bench.txt

echo "== bench attention"
PROFILE_ARGS=()
[ "$CASES" != decode ] && PROFILE_ARGS=(--profile-out "$OUT_DIR/attention_profile.json" --base-profile "$BASE_PROFILE")
timeout 300 "$EPINFER" bench attention --cases "$CASES" --repeats "$REPEATS" --json "$OUT_DIR/attention.json" \
    "${PROFILE_ARGS[@]}" >>"$OUT_DIR/bench.txt" 2>&1
echo "bench rc=$?"
cat "$OUT_DIR/bench.txt"

echo "== peers"
if [ -f "$OUT_DIR/attention.json" ]; then
    PYTHONUNBUFFERED=1 timeout 200 python3 bench/attention_peers.py --epinfer-json "$OUT_DIR/attention.json" \
        --repeats "$PEER_REPEATS" --out-json "$OUT_DIR/peers.json" --out-md "$OUT_DIR/peers.md" \
        >"$OUT_DIR/peers.txt" 2>&1
    echo "peers rc=$?"
    awk '/^\| shape/ {exit} {print}' "$OUT_DIR/peers.txt" | tail -40  # per-case lines and refusals
    cat "$OUT_DIR/peers.md" 2>/dev/null
fi
