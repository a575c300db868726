#!/usr/bin/env bash
# The parallel layouts across the GPUs of one machine (issue 7 items 1 and 4), in steps (STEPS):
#   tests    the golden fixtures under each of TEST_LAYOUTS on RANKS GPUs (tests/mpi/model/layout_test.cc
#            with EPINFER_TEST_DEVICE=cuda: fp32 activations, NCCL groups): prefill logits against one GPU
#            and the goldens, greedy tokens equal to one GPU's and to the goldens; and MoeExpertsCuda* of
#            epinfer_test_cuda on one GPU;
#   generate `epinfer generate` on tiny fixtures with --device cuda (bf16 activations) on one GPU and under
#            each of TEST_LAYOUTS: the tokens, side by side;
#   ep       `epinfer bench ep --device cuda` (issue 7 item 3): EP dispatch and combine of T = 128 and 4096
#            tokens per rank (H 7168, E 256, top-8) against all_to_all_v of the same rows, with each of LINKS;
#   serving  `epinfer bench` (closed loop, 128/128 tokens, greedy) on a random-weight model at the real
#            shapes of SERVING_CONFIG, on one GPU and under each of SERVING_LAYOUTS, with each of LINKS:
#            nvlink (the machine's links as they are) and no_p2p (NCCL_P2P_DISABLE=1: NCCL's traffic through
#            host memory, a stand-in for PCIe boxes without P2P). NVLink multicast stays off.
#   BIN_DIR=build-cuda-mpi-carry OUT_DIR=layouts_out bench/run_multi_gpu_layouts.sh
# BIN_DIR: epinfer, epinfer_test_cuda and epinfer_mpi_model_test of a -DEPINFER_CUDA=ON -DEPINFER_MPI=ON
# build (bench/pack_bin_dir.sh); mpirun, cuBLAS and libnccl.so.2 come from the GPU machine.
# Environment: RANKS (default: every GPU); STEPS (default "tests generate ep serving"); TEST_LAYOUTS
# (";"-separated flag sets, default "--tp 2;--ep 2;--pp 2;--dp 2 --ep 2"); SERVING_LAYOUTS (default
# "1gpu;--tp 2;--ep 2;--pp 2"; 1gpu runs without mpirun, once, with the first of LINKS); LINKS (default
# "nvlink no_p2p"); SERVING_CONFIG (default tests/data/configs/qwen3_30b_a3b.json); LEVELS (default
# 1,8,64,256,1024) and PROMPTS (requests per level, default 4,16,128,256,1024); SERVING_EXTRA (more bench
# flags, e.g. "--num-layers 8"); SERVING_TIMEOUT_S per run (default 300).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${OUT_DIR:-layouts_out}
BIN_DIR=${BIN_DIR:?BIN_DIR: the packed binaries (bench/pack_bin_dir.sh)}
RANKS=${RANKS:-$(nvidia-smi -L | wc -l)}
STEPS=${STEPS:-tests generate ep serving}
TEST_LAYOUTS=${TEST_LAYOUTS:---tp 2;--ep 2;--pp 2;--dp 2 --ep 2}
SERVING_LAYOUTS=${SERVING_LAYOUTS:-1gpu;--tp 2;--ep 2;--pp 2}
LINKS=${LINKS:-nvlink no_p2p}
SERVING_CONFIG=${SERVING_CONFIG:-tests/data/configs/qwen3_30b_a3b.json}
LEVELS=${LEVELS:-1,8,64,256,1024}
PROMPTS=${PROMPTS:-4,16,128,256,1024}
mkdir -p "$OUT_DIR"
for d in /usr/local/cuda/lib64 $(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/*/lib 2>/dev/null); do
    [ -d "$d" ] && LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
done
export LD_LIBRARY_PATH="$PWD/$BIN_DIR/lib:$LD_LIBRARY_PATH"
export NCCL_NVLS_ENABLE=0 NCCL_P2P_DISABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export EPINFER_PROFILES_DIR="$PWD/profiles" EPINFER_TEST_DATA_DIR="$PWD/tests/data" EPINFER_COMM_TIMEOUT_S=120
MPIRUN=(mpirun -np "$RANKS" --bind-to none -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE -x NCCL_P2P_DISABLE
        -x EPINFER_PROFILES_DIR -x EPINFER_TEST_DATA_DIR -x EPINFER_COMM_TIMEOUT_S -x EPINFER_TEST_DEVICE
        -x EPINFER_TEST_LAYOUT)
# "--tp 2 --ep 2" → "tp2_ep2"
name_of() { echo "$1" | sed -e 's/--//g' -e 's/ \([0-9]\)/\1/g' -e 's/ /_/g'; }
{
    date -u +"date %Y-%m-%dT%H:%M:%SZ"
    nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv
    nvidia-smi topo -m
    mpirun --version | head -1
} >"$OUT_DIR/env.txt" 2>&1
cat "$OUT_DIR/env.txt"

if [[ " $STEPS " == *" tests "* ]]; then
    echo "== epinfer_test_cuda MoeExpertsCuda* (one GPU)"
    timeout 300 "$BIN_DIR/epinfer_test_cuda" --gtest_filter='*MoeExperts*' >"$OUT_DIR/test_cuda.txt" 2>&1
    echo "rc=$?"; grep -E "^\[  (PASSED|FAILED) |^\[  FAILED" "$OUT_DIR/test_cuda.txt"
    IFS=';' read -ra layouts <<<"$TEST_LAYOUTS"
    for flags in "${layouts[@]}"; do
        name=$(name_of "$flags")
        echo "== golden fixtures under '$flags' on $RANKS GPUs"
        EPINFER_TEST_DEVICE=cuda EPINFER_TEST_LAYOUT="$flags" timeout 600 "${MPIRUN[@]}" \
            "$BIN_DIR/epinfer_mpi_model_test" --gtest_filter='*LayoutTest.SameTokensAndLogitsAsOneRank*' \
            >"$OUT_DIR/test_layout_$name.txt" 2>&1
        echo "rc=$?"
        grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED|logits vs one rank|Failure" "$OUT_DIR/test_layout_$name.txt" |
            sort | uniq -c | head -40
    done
fi

if [[ " $STEPS " == *" generate "* ]]; then
    for fixture in tests/data/fixtures/qwen3_moe_tiny tests/data/fixtures/deepseek_v3_tiny; do
        fname=$(basename "$fixture")
        args=(generate --model "$fixture" --device cuda --prompt-ids 1,2,3,4,5,6,7,8,9,10,11 --max-new-tokens 16
              --ignore-eos --json)
        timeout 120 "$BIN_DIR/epinfer" "${args[@]}" >"$OUT_DIR/generate_${fname}_1gpu.json" 2>"$OUT_DIR/generate_${fname}_1gpu.err"
        echo "generate $fname 1gpu rc=$?: $(cat "$OUT_DIR/generate_${fname}_1gpu.json")"
        IFS=';' read -ra layouts <<<"$TEST_LAYOUTS"
        for flags in "${layouts[@]}"; do
            name=$(name_of "$flags")
            # shellcheck disable=SC2086
            timeout 180 "${MPIRUN[@]}" "$BIN_DIR/epinfer" "${args[@]}" $flags \
                >"$OUT_DIR/generate_${fname}_$name.json" 2>"$OUT_DIR/generate_${fname}_$name.err"
            echo "generate $fname $name rc=$?: $(cat "$OUT_DIR/generate_${fname}_$name.json") $(tail -1 "$OUT_DIR/generate_${fname}_$name.err")"
        done
    done
fi

if [[ " $STEPS " == *" ep "* ]]; then
    for link in $LINKS; do
        export NCCL_P2P_DISABLE=0
        [ "$link" = no_p2p ] && export NCCL_P2P_DISABLE=1
        echo "== bench ep on $RANKS GPUs, $link (NCCL_P2P_DISABLE=$NCCL_P2P_DISABLE)"
        timeout 300 "${MPIRUN[@]}" "$BIN_DIR/epinfer" bench ep --device cuda --tokens 128,4096 \
            >"$OUT_DIR/bench_ep_$link.txt" 2>&1
        echo "rc=$?"; cat "$OUT_DIR/bench_ep_$link.txt" | tail -5
    done
fi

if [[ " $STEPS " == *" serving "* ]]; then
    IFS=';' read -ra layouts <<<"$SERVING_LAYOUTS"
    first_link=${LINKS%% *}
    for link in $LINKS; do
        export NCCL_P2P_DISABLE=0
        [ "$link" = no_p2p ] && export NCCL_P2P_DISABLE=1
        for flags in "${layouts[@]}"; do
            name=$(name_of "$flags")
            args=(bench --config "$SERVING_CONFIG" --random-weights --device cuda --max-running 1024
                  --concurrency "$LEVELS" --num-prompts "$PROMPTS" --input-len 128 --output-len 128
                  ${SERVING_EXTRA:-})
            out="$OUT_DIR/bench_${name}_$link"
            if [ "$flags" = 1gpu ]; then
                [ "$link" = "$first_link" ] || continue
                out="$OUT_DIR/bench_1gpu"
                echo "== bench $(basename "$SERVING_CONFIG") on one GPU"
                timeout "${SERVING_TIMEOUT_S:-300}" "$BIN_DIR/epinfer" "${args[@]}" --json "$out.json" >"$out.txt" 2>&1
            else
                echo "== bench $(basename "$SERVING_CONFIG") '$flags' on $RANKS GPUs, $link (NCCL_P2P_DISABLE=$NCCL_P2P_DISABLE)"
                # shellcheck disable=SC2086
                timeout "${SERVING_TIMEOUT_S:-300}" "${MPIRUN[@]}" "$BIN_DIR/epinfer" "${args[@]}" $flags \
                    --json "$out.json" >"$out.txt" 2>&1
            fi
            echo "rc=$?"
            grep -E "ready in|error" "$out.txt" | head -3
            tail -8 "$out.txt"
        done
    done
fi
