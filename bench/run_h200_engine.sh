#!/usr/bin/env bash
# One pass of the engine on a GPU machine: the CUDA tests (every op against the CPU reference, the
# moe_experts op, the matmul paths, the stream-ordered pool, NCCL at world size 1, every golden fixture end
# to end on the GPU), then `epinfer generate` on fixtures with --device cpu and --device cuda (to compare),
# then (SERVING=1) `epinfer bench` on a random-weight model at the real shapes of SERVING_CONFIG, one run per
# concurrency level, with every log under OUT_DIR (default ./engine_h200_out).
#
#   bench/run_h200_engine.sh                             # builds build-gpu with CMake (needs the project's
#                                                        # dependencies and a CUDA toolkit)
#   BIN_DIR=build-cuda-carry bench/run_h200_engine.sh    # or runs prebuilt epinfer and epinfer_test_cuda from
#                                                        # BIN_DIR (BIN_DIR/lib on LD_LIBRARY_PATH), packed on
#                                                        # the build machine by bench/pack_bin_dir.sh
# Environment: OUT_DIR; FIXTURES (default: qwen3_moe_tiny and deepseek_v3_tiny of tests/data/fixtures);
# PROMPT_IDS (default 1,2,...,11); MAX_NEW_TOKENS (default 8); GTEST_FILTER (default *); TEST_TIMEOUT_S
# (default 400); SERVING (default 1); SERVING_CONFIG (default tests/data/configs/qwen3_30b_a3b.json);
# SERVING_LEVELS: concurrency:num_prompts pairs (default 1:4 8:16 32:64 64:128 256:256 1024:1024);
# SERVING_TIMEOUT_S per level (default 240); SERVING_DIRECT_LEVELS: levels run again with --no-decode-graphs
# (every op issued directly), written as bench_direct_c*.json (default: none).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${OUT_DIR:-engine_h200_out}
mkdir -p "$OUT_DIR"
FIXTURES=${FIXTURES:-tests/data/fixtures/qwen3_moe_tiny tests/data/fixtures/deepseek_v3_tiny}
PROMPT_IDS=${PROMPT_IDS:-1,2,3,4,5,6,7,8,9,10,11}
MAX_NEW_TOKENS=${MAX_NEW_TOKENS:-8}
GTEST_FILTER=${GTEST_FILTER:-*}
TEST_TIMEOUT_S=${TEST_TIMEOUT_S:-400}

# cuBLAS from the CUDA toolkit or PyTorch's wheels; libnccl.so.2 (loaded at run time by the NCCL
# communicator) from PyTorch's nvidia-nccl wheel when the machine has no other.
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
         $(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/*/lib 2>/dev/null); do
    [ -d "$d" ] && LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
done
if [ -n "${BIN_DIR:-}" ]; then
    LD_LIBRARY_PATH="$PWD/$BIN_DIR/lib:${LD_LIBRARY_PATH:-}"
    EPINFER="$BIN_DIR/epinfer"
    TESTS="$BIN_DIR/epinfer_test_cuda"
else
    cmake -S . -B build-gpu -G Ninja -DEPINFER_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DEPINFER_MPI=OFF \
        >"$OUT_DIR/build.txt" 2>&1 && ninja -C build-gpu -j16 epinfer epinfer_test_cuda >>"$OUT_DIR/build.txt" 2>&1 \
        || { tail -30 "$OUT_DIR/build.txt"; exit 1; }
    EPINFER=build-gpu/tools/epinfer/epinfer
    TESTS=build-gpu/tests/epinfer_test_cuda
fi
export LD_LIBRARY_PATH
# The fixtures of this checkout (a carried test binary holds the build machine's path).
export EPINFER_TEST_DATA_DIR="$PWD/tests/data"

{
    date -u +"date %Y-%m-%dT%H:%M:%SZ"
    git rev-parse HEAD 2>/dev/null | sed 's/^/commit /'
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem,temperature.gpu,power.draw \
        --format=csv
    echo "libnccl.so.2: $( (ldconfig -p 2>/dev/null | grep -m1 libnccl.so.2) || \
        (for d in ${LD_LIBRARY_PATH//:/ }; do ls "$d"/libnccl.so.2 2>/dev/null; done | head -1) || echo none)"
    echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
} >"$OUT_DIR/env.txt" 2>&1
cat "$OUT_DIR/env.txt"

echo "== tests ($GTEST_FILTER)"
timeout "$TEST_TIMEOUT_S" "$TESTS" --gtest_filter="$GTEST_FILTER" --gtest_output=xml:"$OUT_DIR/tests.xml" \
    >"$OUT_DIR/tests.txt" 2>&1
echo "tests rc=$?"
grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED|tests ran|Failure|Skipped|error" "$OUT_DIR/tests.txt" | head -60
grep -E "^measured|^low margin" "$OUT_DIR/tests.txt" >"$OUT_DIR/measured.txt"
echo "measured lines: $(wc -l <"$OUT_DIR/measured.txt") (measured.txt)"

for fixture in $FIXTURES; do
    name=$(basename "$fixture")
    echo "== generate $fixture: cpu, then cuda"
    for device in cpu cuda; do
        timeout 120 "$EPINFER" generate --model "$fixture" --device "$device" --prompt-ids "$PROMPT_IDS" \
            --max-new-tokens "$MAX_NEW_TOKENS" --ignore-eos --json >"$OUT_DIR/generate_${name}_$device.json" \
            2>"$OUT_DIR/generate_${name}_$device.err"
        echo "generate $device rc=$?: $(cat "$OUT_DIR/generate_${name}_$device.json")"
        tail -3 "$OUT_DIR/generate_${name}_$device.err"
    done
done

if [ "${SERVING:-1}" = 1 ]; then
    SERVING_CONFIG=${SERVING_CONFIG:-tests/data/configs/qwen3_30b_a3b.json}
    SERVING_LEVELS=${SERVING_LEVELS:-1:4 8:16 32:64 64:128 256:256 1024:1024}
    for level in $SERVING_LEVELS; do
        c=${level%%:*}; n=${level##*:}
        echo "== bench $(basename "$SERVING_CONFIG") random weights, concurrency $c, $n prompts, 128/128"
        timeout "${SERVING_TIMEOUT_S:-240}" "$EPINFER" bench --config "$SERVING_CONFIG" --random-weights \
            --device cuda --max-running "$c" --concurrency "$c" --num-prompts "$n" --input-len 128 \
            --output-len 128 --json "$OUT_DIR/bench_c$c.json" >"$OUT_DIR/bench_c$c.txt" 2>&1
        echo "bench rc=$?"
        tail -4 "$OUT_DIR/bench_c$c.txt"
    done
    for level in ${SERVING_DIRECT_LEVELS:-}; do
        c=${level%%:*}; n=${level##*:}
        echo "== bench $(basename "$SERVING_CONFIG") random weights, concurrency $c, $n prompts, --no-decode-graphs"
        timeout "${SERVING_TIMEOUT_S:-240}" "$EPINFER" bench --config "$SERVING_CONFIG" --random-weights \
            --device cuda --max-running "$c" --concurrency "$c" --num-prompts "$n" --input-len 128 \
            --output-len 128 --no-decode-graphs --json "$OUT_DIR/bench_direct_c$c.json" \
            >"$OUT_DIR/bench_direct_c$c.txt" 2>&1
        echo "bench rc=$?"
        tail -1 "$OUT_DIR/bench_direct_c$c.txt"
    done
fi
