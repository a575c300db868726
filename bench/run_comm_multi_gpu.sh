#!/usr/bin/env bash
# epinfer bench comm across the GPUs of one machine (issue 7 item 2): NCCL all_reduce, all_gather and
# all_to_all_v over message sizes, once with the machine's links as they are (NVLink) and once with NCCL's
# peer-to-peer path disabled (NCCL_P2P_DISABLE=1: traffic through host memory, a stand-in for PCIe boxes
# without P2P). NVLink multicast stays off (NCCL_NVLS_ENABLE=0). Each run also writes a hardware profile
# (the h200_sxm profile with the measured intra-node collectives) for `epinfer plan --hardware`.
#   BIN_DIR=build-cuda-mpi-carry RANKS=2 OUT_DIR=comm_out bench/run_comm_multi_gpu.sh
# BIN_DIR holds epinfer built with -DEPINFER_CUDA=ON -DEPINFER_MPI=ON (bench/pack_bin_dir.sh); mpirun and
# libnccl.so.2 come from the GPU machine.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${OUT_DIR:-comm_out}
RANKS=${RANKS:-$(nvidia-smi -L | wc -l)}
MAX_BYTES=${MAX_BYTES:-256M}
mkdir -p "$OUT_DIR"
for d in /usr/local/cuda/lib64 $(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/*/lib 2>/dev/null); do
    [ -d "$d" ] && LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
done
export LD_LIBRARY_PATH="$PWD/$BIN_DIR/lib:$LD_LIBRARY_PATH"
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export EPINFER_PROFILES_DIR="$PWD/profiles"  # the --base-profile of a carried binary
{
    date -u +"date %Y-%m-%dT%H:%M:%SZ"
    nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv
    nvidia-smi topo -m
    mpirun --version | head -1
    ldd "$BIN_DIR/epinfer" | grep -E "mpi|not found"
} >"$OUT_DIR/env.txt" 2>&1
cat "$OUT_DIR/env.txt"
for links in nvlink no_p2p; do
    p2p=0
    [ "$links" = no_p2p ] && p2p=1
    echo "== bench comm, $RANKS GPUs, $links (NCCL_P2P_DISABLE=$p2p)"
    NCCL_P2P_DISABLE=$p2p timeout 300 mpirun -np "$RANKS" -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE -x NCCL_P2P_DISABLE -x EPINFER_PROFILES_DIR \
        "$BIN_DIR/epinfer" bench comm --device cuda --min-bytes 1K --max-bytes "$MAX_BYTES" --iters 20 \
        --json "$OUT_DIR/comm_$links.json" --profile-out "$OUT_DIR/profile_$links.json" --base-profile h200_sxm \
        >"$OUT_DIR/comm_$links.txt" 2>&1
    echo "rc=$?"
    cat "$OUT_DIR/comm_$links.txt" | tail -40
done
