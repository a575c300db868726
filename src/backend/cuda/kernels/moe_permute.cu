// MoE permutation plan kernels (see moe_permute.cuh): keys → CUB stable radix sort → slots and offsets →
// counts and the grouped-GEMM schedule.
#include <cub/block/block_scan.cuh>
#include <cub/device/device_radix_sort.cuh>

#include "backend/cuda/kernels/moe_common.cuh"
#include "backend/cuda/kernels/moe_permute.cuh"
#include "backend/cuda/kernels/pdl.cuh"

namespace epinfer::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kFinalizeThreads = 1024;
// Up to this many picks the one-block plan (permute_small_kernel), above it CUB's path: the one block's rank
// loop grows with n² while the path's four kernels stay ~9.6 µs exposed up to 1024 picks (H200, kernel
// timeline, Qwen3-30B-A3B and DeepSeek-V3: one block 7.4 µs at 512 picks, 9.2 at 640, 11.2 at 768, 16.2 at
// 1024; docs/benchmarks/moe_h200.md).
constexpr int64_t kSmallPicks = 640;
constexpr size_t kAlign = 256;

size_t align_up(size_t n) {
    return (n + kAlign - 1) / kAlign * kAlign;
}

// Bits that hold every key in [0, E] (E = the dropped key).
int key_bits(int64_t num_experts) {
    int bits = 1;
    while ((int64_t{1} << bits) <= num_experts) ++bits;
    return bits;
}

struct PermuteWorkspace {
    uint32_t* keys_in;   // [T·K]
    uint32_t* keys_out;  // [T·K]
    int32_t* vals_in;    // [T·K]
    int32_t* vals_out;   // [T·K]
    void* sort_temp;
    size_t sort_temp_bytes;
};

size_t sort_temp_bytes(int64_t num_picks, int64_t num_experts) {
    size_t bytes = 0;
    cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<const uint32_t*>(nullptr),
                                    static_cast<uint32_t*>(nullptr), static_cast<const int32_t*>(nullptr),
                                    static_cast<int32_t*>(nullptr), static_cast<int>(num_picks), 0,
                                    key_bits(num_experts));
    return bytes;
}

PermuteWorkspace carve(void* workspace, int64_t num_picks, size_t temp_bytes) {
    auto* base = static_cast<unsigned char*>(workspace);
    const size_t array_bytes = align_up(static_cast<size_t>(num_picks) * 4);
    PermuteWorkspace ws;
    ws.keys_in = reinterpret_cast<uint32_t*>(base);
    ws.keys_out = reinterpret_cast<uint32_t*>(base + array_bytes);
    ws.vals_in = reinterpret_cast<int32_t*>(base + 2 * array_bytes);
    ws.vals_out = reinterpret_cast<int32_t*>(base + 3 * array_bytes);
    ws.sort_temp = base + 4 * array_bytes;
    ws.sort_temp_bytes = temp_bytes;
    return ws;
}

// keys[i] = id (E when dropped), vals[i] = i; shared-expert rows map to their token.
__global__ void permute_keys_kernel(MoePermuteArgs args, uint32_t* keys, int32_t* vals) {
    pdl_begin();
    const int64_t num_picks = args.num_tokens * args.top_k;
    const int64_t n = num_picks > args.num_tokens ? num_picks : args.num_tokens;
    for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
        if (i < num_picks) {
            const int64_t id = local_expert(args.topk_ids[i], args.first_expert, args.num_experts);
            keys[i] = static_cast<uint32_t>(id >= 0 ? id : args.num_experts);
            vals[i] = static_cast<int32_t>(i);
        }
        if (args.shared_group && i < args.num_tokens) args.token_of_row[num_picks + i] = static_cast<int32_t>(i);
    }
}

// Slot s of the sorted picks: maps, and expert_offsets[e] = first slot whose key ≥ e.
__global__ void permute_slots_kernel(MoePermuteArgs args, const uint32_t* keys, const int32_t* vals) {
    pdl_begin();
    const int64_t num_picks = args.num_tokens * args.top_k;
    const int64_t num_experts = args.num_experts;
    for (int64_t s = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; s < num_picks;
         s += int64_t{gridDim.x} * blockDim.x) {
        const int64_t key = keys[s];
        const int32_t pick = vals[s];
        if (key < num_experts) {
            args.token_of_row[s] = static_cast<int32_t>(pick / args.top_k);
            args.k_of_slot[s] = static_cast<int32_t>(pick % args.top_k);
            args.slot_of_token_k[pick] = static_cast<int32_t>(s);
        } else {
            args.slot_of_token_k[pick] = -1;
        }
        const int64_t prev_key = s == 0 ? -1 : static_cast<int64_t>(keys[s - 1]);
        for (int64_t e = prev_key + 1; e <= key; ++e) args.expert_offsets[e] = static_cast<int32_t>(s);
        if (s == num_picks - 1) {
            for (int64_t e = key + 1; e <= num_experts; ++e) args.expert_offsets[e] = static_cast<int32_t>(num_picks);
        }
    }
}

using BlockScan = cub::BlockScan<int32_t, kFinalizeThreads>;

// Exclusive prefix sum of value(i) for i in [0, n) into out[0, n], out[n] = the total, by one block of
// kFinalizeThreads threads (chunks of the block's width, carried across).
template <typename Value>
__device__ void block_prefix_sum(Value value, int64_t n, int32_t* out, BlockScan::TempStorage& storage,
                                 int32_t& carry) {
    if (threadIdx.x == 0) carry = 0;
    __syncthreads();
    for (int64_t base = 0; base < n; base += kFinalizeThreads) {
        const int64_t i = base + threadIdx.x;
        const int32_t v = i < n ? value(i) : 0;
        int32_t prefix = 0, chunk_total = 0;
        BlockScan(storage).ExclusiveSum(v, prefix, chunk_total);
        if (i < n) out[i] = carry + prefix;
        __syncthreads();
        if (threadIdx.x == 0) carry += chunk_total;
        __syncthreads();
    }
    if (threadIdx.x == 0) out[n] = carry;
    __syncthreads();
}

// Counts, group ranges and the tile prefix sum over the G groups, from args.expert_offsets (complete).
__device__ void finalize_groups(const MoePermuteArgs& args, BlockScan::TempStorage& storage, int32_t& carry) {
    const int64_t num_experts = args.num_experts;
    const int64_t num_groups = num_experts + (args.shared_group ? 1 : 0);
    const int32_t num_picks = static_cast<int32_t>(args.num_tokens * args.top_k);
    for (int64_t g = threadIdx.x; g < num_groups; g += kFinalizeThreads) {
        const bool expert = g < num_experts;
        const int32_t begin = expert ? args.expert_offsets[g] : num_picks;
        const int32_t end = expert ? args.expert_offsets[g + 1] : num_picks + static_cast<int32_t>(args.num_tokens);
        if (expert) args.expert_counts[g] = end - begin;
        args.group_row_begin[g] = begin;
        args.group_row_end[g] = end;
    }
    __syncthreads();
    auto tiles = [&](int64_t g) {
        return static_cast<int32_t>(
            ceil_div<int64_t>(args.group_row_end[g] - args.group_row_begin[g], args.tile_rows));
    };
    block_prefix_sum(tiles, num_groups, args.group_tile_offsets, storage, carry);
}

// After the sort and the slots kernel: counts and schedule. With no picks the slots kernel wrote nothing.
__global__ void __launch_bounds__(kFinalizeThreads) permute_finalize_kernel(MoePermuteArgs args) {
    pdl_begin();
    __shared__ BlockScan::TempStorage storage;
    __shared__ int32_t carry;
    if (args.num_tokens * args.top_k == 0) {
        for (int64_t e = threadIdx.x; e <= args.num_experts; e += kFinalizeThreads) args.expert_offsets[e] = 0;
        __syncthreads();
    }
    finalize_groups(args, storage, carry);
}

// The whole plan in one block for up to kSmallPicks picks (decode sizes): a counting sort whose rank of
// pick i among the picks of its expert is the number of earlier picks with that expert (stable, so the
// slot order is (expert, t, k)). Dynamic shared memory: keys [n] int32 and counts [E] int32.
__global__ void __launch_bounds__(kFinalizeThreads) permute_small_kernel(MoePermuteArgs args) {
    pdl_begin();
    extern __shared__ int32_t smem[];
    __shared__ BlockScan::TempStorage storage;
    __shared__ int32_t carry;
    const int64_t num_picks = args.num_tokens * args.top_k;
    const int64_t num_experts = args.num_experts;
    int32_t* keys = smem;                // [n]
    int32_t* counts = smem + num_picks;  // [E]
    for (int64_t e = threadIdx.x; e < num_experts; e += kFinalizeThreads) counts[e] = 0;
    __syncthreads();
    for (int64_t i = threadIdx.x; i < num_picks; i += kFinalizeThreads) {
        const int64_t id = local_expert(args.topk_ids[i], args.first_expert, num_experts);
        const bool valid = id >= 0;
        keys[i] = valid ? static_cast<int32_t>(id) : static_cast<int32_t>(num_experts);
        if (valid) atomicAdd(&counts[id], 1);
    }
    if (args.shared_group) {
        for (int64_t t = threadIdx.x; t < args.num_tokens; t += kFinalizeThreads) {
            args.token_of_row[num_picks + t] = static_cast<int32_t>(t);
        }
    }
    __syncthreads();
    block_prefix_sum([&](int64_t e) { return counts[e]; }, num_experts, args.expert_offsets, storage, carry);
    for (int64_t i = threadIdx.x; i < num_picks; i += kFinalizeThreads) {
        const int32_t key = keys[i];
        if (key >= num_experts) {
            args.slot_of_token_k[i] = -1;
            continue;
        }
        int32_t rank = 0;
        for (int64_t j = 0; j < i; ++j) rank += keys[j] == key;
        const int32_t slot = args.expert_offsets[key] + rank;
        args.token_of_row[slot] = static_cast<int32_t>(i / args.top_k);
        args.k_of_slot[slot] = static_cast<int32_t>(i % args.top_k);
        args.slot_of_token_k[i] = slot;
    }
    finalize_groups(args, storage, carry);
}

unsigned grid_for(int64_t n) {
    const int64_t blocks = ceil_div<int64_t>(n > 0 ? n : 1, kThreads);
    return static_cast<unsigned>(blocks < 4096 ? blocks : 4096);
}

}  // namespace

size_t moe_permute_workspace_bytes(const MoePermuteArgs& args) {
    const int64_t num_picks = args.num_tokens * args.top_k;
    return 4 * align_up(static_cast<size_t>(num_picks) * 4) + align_up(sort_temp_bytes(num_picks, args.num_experts));
}

cudaError_t launch_moe_permute(const MoePermuteArgs& args, void* workspace, size_t workspace_bytes,
                               cudaStream_t stream) {
    if (workspace_bytes < moe_permute_workspace_bytes(args)) return cudaErrorInvalidValue;
    const int64_t num_picks = args.num_tokens * args.top_k;
    if (num_picks > 0 && num_picks <= kSmallPicks) {
        const size_t smem = static_cast<size_t>(num_picks + args.num_experts) * sizeof(int32_t);
        cudaError_t err = cudaFuncSetAttribute(permute_small_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(smem));
        if (err != cudaSuccess) return err;
        return launch_pdl(permute_small_kernel, dim3(1), dim3(kFinalizeThreads), smem, stream, args);
    }
    const size_t temp_bytes = sort_temp_bytes(num_picks, args.num_experts);
    PermuteWorkspace ws = carve(workspace, num_picks, temp_bytes);
    const int64_t n = num_picks > args.num_tokens ? num_picks : args.num_tokens;
    if (n > 0) {
        cudaError_t err = launch_pdl(permute_keys_kernel, dim3(grid_for(n)), dim3(kThreads), 0, stream, args,
                                     ws.keys_in, ws.vals_in);
        if (err != cudaSuccess) return err;
    }
    if (num_picks > 0) {
        size_t temp = ws.sort_temp_bytes;
        cudaError_t err = cub::DeviceRadixSort::SortPairs(ws.sort_temp, temp, ws.keys_in, ws.keys_out, ws.vals_in,
                                                          ws.vals_out, static_cast<int>(num_picks), 0,
                                                          key_bits(args.num_experts), stream);
        if (err != cudaSuccess) return err;
        err = launch_pdl(permute_slots_kernel, dim3(grid_for(num_picks)), dim3(kThreads), 0, stream, args,
                         ws.keys_out, ws.vals_out);
        if (err != cudaSuccess) return err;
    }
    return launch_pdl(permute_finalize_kernel, dim3(1), dim3(kFinalizeThreads), 0, stream, args);
}

}  // namespace epinfer::cuda
