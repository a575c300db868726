// Attention over a bf16 KV cache on the CUDA backend against the CPU backend reading the same bf16 pool:
// the flash-attention kernel (backend/cuda/kernels/flash_attention.cuh: decode and prefill layouts, key
// splits, GQA groups of 1, 8, 12, 20 and 32 query heads, head dims 64 and 128, block sizes 5 and 16,
// sequences whose query tokens straddle a block's token tile) and the CUDA-core kernel it falls back to
// (head dims 72 and MLA's 192/128), the MLA latent kernels (kernels/mla_attention.cuh,
// mla_attention_sm90.cuh), the bf16 kv_cache_store (bit-exact), and the data-dependent errors. Pools hold NaN
// in every row no table names, so a stray read shows. Bounds: tolerances.h "attention_cuda".
#include <gtest/gtest.h>

#if EPINFER_WITH_CUDA
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/kernels/flash_attention.cuh"
#include "backend/cuda/kernels/mla_attention.cuh"
#include "backend/cuda/kernels/sm90a.cuh"
#include "common/compare.h"
#include "cuda_test_util.h"

namespace epinfer::test {
namespace {

constexpr uint16_t kBf16Nan = 0x7fc0;

struct Shape {
    int64_t heads, kv_heads, dqk, dv;
    bool latent = false;  // MLA's latent cache: one pool of dqk-wide rows, V its first dv (v == k)
};

// One batch: per sequence the tokens already cached and the query rows of this step.
struct Batch {
    std::vector<int64_t> cached, new_rows;
};

class AttentionBf16KvTest : public CpuAndCudaTest {
protected:
    // Runs `batch` through the CPU and the GPU backend on one shuffled bf16 pool of block size bs (paged),
    // or contiguous rows when bs is 0 (one sequence). Expects the flash kernel to take the call exactly
    // when `flash` is true (the MLA kernel exactly when shape.latent), and compares the outputs.
    void check(const Shape& shape, const Batch& batch, int64_t bs, bool flash, uint32_t seed) {
        const bool paged = bs > 0;
        const int64_t num_seqs = static_cast<int64_t>(batch.cached.size());
        const int64_t kv_tok = shape.kv_heads * (shape.latent ? shape.dqk : shape.dqk + shape.dv);
        const int64_t out_tok = shape.heads * shape.dv;
        const int64_t v_offset = shape.latent ? 0 : shape.kv_heads * shape.dqk;  // V inside each pool row
        const int64_t block = paged ? bs : batch.cached[0] + batch.new_rows[0];
        int64_t stride = 0, num_blocks = 3;  // 3 blocks no table names
        for (int64_t s = 0; s < num_seqs; ++s) {
            const int64_t n = (batch.cached[s] + batch.new_rows[s] + block - 1) / block;
            stride = std::max(stride, n);
            num_blocks += n;
        }
        std::vector<int32_t> ids(num_blocks);
        std::iota(ids.begin(), ids.end(), 0);
        if (paged) std::shuffle(ids.begin(), ids.end(), std::mt19937(seed));
        std::vector<int32_t> tables(num_seqs * stride, -1), token_sequence, positions;
        std::vector<uint16_t> pool(num_blocks * block * kv_tok, kBf16Nan);
        size_t next = 0;
        for (int64_t s = 0; s < num_seqs; ++s) {
            const int64_t S = batch.cached[s] + batch.new_rows[s];
            for (int64_t b = 0; b < (S + block - 1) / block; ++b) tables[s * stride + b] = ids[next++];
            const std::vector<uint16_t> rows = random_bf16(S * kv_tok, seed + 17 * static_cast<uint32_t>(s), 2.0f);
            for (int64_t j = 0; j < S; ++j)
                std::copy_n(rows.begin() + j * kv_tok, kv_tok,
                            pool.begin() + (tables[s * stride + j / block] * block + j % block) * kv_tok);
            for (int64_t i = 0; i < batch.new_rows[s]; ++i) {
                token_sequence.push_back(static_cast<int32_t>(s));
                positions.push_back(static_cast<int32_t>(batch.cached[s] + i));
            }
        }
        const int64_t T = static_cast<int64_t>(positions.size());
        const std::vector<float> q = random_floats(T * shape.heads * shape.dqk, seed + 1, -2.0f, 2.0f);
        std::vector<float> want(T * out_tok, 0.0f);
        AttentionArgs args;
        args.q = q.data();
        args.k = pool.data();
        args.v = pool.data() + v_offset;
        args.kv_dtype = DType::kBF16;
        if (paged) {
            args.kv_block_tables = tables.data();
            args.token_sequence = token_sequence.data();
            args.num_sequences = num_seqs;
            args.block_table_stride = stride;
            args.kv_block_size = bs;
        }
        args.positions = positions.data();
        args.out = want.data();
        args.num_tokens = T;
        args.num_kv_tokens = paged ? stride * bs : block;
        args.num_heads = shape.heads;
        args.num_kv_heads = shape.kv_heads;
        args.head_dim_qk = shape.dqk;
        args.head_dim_v = shape.dv;
        args.q_token_stride = shape.heads * shape.dqk;
        args.q_head_stride = shape.dqk;
        args.k_token_stride = args.v_token_stride = kv_tok;
        args.k_head_stride = shape.dqk;
        args.v_head_stride = shape.latent ? shape.dqk : shape.dv;
        args.out_token_stride = out_tok;
        args.out_head_stride = shape.dv;
        args.scale = 1.0f / std::sqrt(static_cast<float>(shape.dqk));
        ASSERT_TRUE(cpu_->attention(args).is_ok());

        DeviceBuffer d_q = to_gpu(q), d_pool = to_gpu(pool), d_pos = to_gpu(positions), d_tables = to_gpu(tables);
        DeviceBuffer d_seq = to_gpu(token_sequence);
        DeviceBuffer d_out = to_gpu(std::vector<float>(T * out_tok, std::numeric_limits<float>::quiet_NaN()));
        args.q = d_q.f32();
        args.k = d_pool.data();
        args.v = static_cast<const uint16_t*>(d_pool.data()) + v_offset;
        if (paged) {
            args.kv_block_tables = static_cast<const int32_t*>(d_tables.data());
            args.token_sequence = static_cast<const int32_t*>(d_seq.data());
        }
        args.positions = static_cast<const int32_t*>(d_pos.data());
        args.out = d_out.f32();
        EXPECT_EQ(cuda::flash_attention_supports(args), flash);
        EXPECT_EQ(cuda::mla_attention_supports(args), shape.latent);
        plan_ = flash ? cuda::plan_flash_attention(args, 132, cuda::sm90a_available(0))
                      : cuda::FlashAttentionPlan{};
        const cuda::FlashAttentionPlan& plan = plan_;
        ASSERT_TRUE(gpu_->attention(args).is_ok());
        const std::vector<float> got = from_gpu<float>(d_out, T * out_tok);
        const Diff d = compare<float>(got, want);
        // The flash and MLA kernels round q and the probabilities to bf16 for the MMA; the CUDA-core kernel
        // reads the same bf16 K/V as the CPU and computes in fp32.
        const DType row = flash || shape.latent ? DType::kBF16 : DType::kF32;
        const std::string kernel =
            !flash ? (shape.latent ? "MLA kernel" : "CUDA cores")
            : plan.decode
                ? fmt::format("decode{}, {} splits", plan.long_decode ? " (long)" : "", plan.split.num_splits)
            : plan.sm90 ? std::string("prefill, wgmma")
                        : fmt::format("prefill, {} splits", plan.split.num_splits);
        const std::string what = fmt::format("heads {}/{} D {}/{} bs {} T {} seqs {} ({})", shape.heads,
                                             shape.kv_heads, shape.dqk, shape.dv, bs, T, num_seqs, kernel);
        std::printf("measured attention_cuda %s %s: nmse %.3g max_rel %.3g\n", dtype_name(row), what.c_str(), d.nmse,
                    d.max_rel);
        EXPECT_TRUE(within(d, tolerance("attention_cuda", row))) << what;
        if (shape.latent) check_latent_kernels(args, want, what);
    }

    // Both MLA latent kernels launched directly (the backend runs the one its device plans): the mma.sync
    // kernel, and the wgmma kernel where it runs (sm_90a), that one also with q and out one float off
    // their 16-byte alignment (its scalar load and store paths). args on the device; want from the CPU.
    void check_latent_kernels(const AttentionArgs& args, const std::vector<float>& want,
                              const std::string& what) {
        for (const auto& [sm90, shifted] :
             {std::pair{false, false}, std::pair{true, false}, std::pair{true, true}}) {
            if (sm90 && !cuda::sm90a_available(0)) continue;
            const LatentRun run = run_latent_kernel(args, sm90, want.size(), shifted);
            EXPECT_EQ(run.error_flag, 0);
            const Diff d = compare<float>(run.out, want);
            const std::string kernel = fmt::format("{} kernel{}, {} splits", sm90 ? "wgmma" : "mma.sync",
                                                   shifted ? " (q, out misaligned)" : "", run.num_splits);
            std::printf("measured attention_cuda bf16 %s [%s]: nmse %.3g max_rel %.3g\n", what.c_str(),
                        kernel.c_str(), d.nmse, d.max_rel);
            EXPECT_TRUE(within(d, tolerance("attention_cuda", DType::kBF16))) << what << " " << kernel;
        }
    }

    // One launch of an MLA latent kernel (launch_mla_attention with the plan of the wgmma kernel or not)
    // into a poisoned output of out_size floats (shifted: q copied to, and out written at, one float past
    // an allocation): the output, the error flag, the key splits.
    struct LatentRun {
        std::vector<float> out;
        int32_t error_flag = -1;
        int num_splits = 0;
    };
    LatentRun run_latent_kernel(AttentionArgs args, bool sm90, size_t out_size, bool shifted = false) {
        const cuda::MlaAttentionPlan plan = cuda::plan_mla_attention(args, 132, sm90);
        const size_t off = shifted ? 1 : 0;
        cuda::CudaBuffer out = poisoned<float>(out_size + off);
        cuda::CudaBuffer q_shifted;
        if (shifted) {
            std::vector<float> q = download<float>(args.q, args.num_tokens * args.q_token_stride);
            q.insert(q.begin(), 0.0f);
            q_shifted = upload(q);
            args.q = static_cast<const float*>(q_shifted.data()) + 1;
        }
        cuda::CudaBuffer flag = upload(std::vector<int32_t>{0});
        auto workspace = cuda::CudaBuffer::alloc(std::max<size_t>(plan.split.workspace_bytes, 16));
        EXPECT_TRUE(workspace.is_ok());
        if (!workspace.is_ok()) return {};
        args.out = static_cast<float*>(out.data()) + off;
        EXPECT_EQ(cuda::launch_mla_attention(args, plan, workspace->data(),
                                             static_cast<int32_t*>(flag.data()), nullptr),
                  cudaSuccess);
        std::vector<float> got = download<float>(out.data(), out_size + off);
        got.erase(got.begin(), got.begin() + static_cast<std::ptrdiff_t>(off));
        return {std::move(got), download<int32_t>(flag.data(), 1)[0], plan.split.num_splits};
    }

    cuda::FlashAttentionPlan plan_;  // the flash plan of the last check()
};

const Shape kFlashShapes[] = {{32, 4, 128, 128}, {24, 2, 64, 64}, {4, 4, 128, 128}, {64, 2, 128, 128},
                              {40, 2, 64, 64}};

// Every sequence one new token: the decode layout, with key splits for the long caches.
TEST_F(AttentionBf16KvTest, FlashDecode) {
    const Batch batch{{0, 37, 5, 1200, 16, 3000, 63, 64}, {1, 1, 1, 1, 1, 1, 1, 1}};
    uint32_t seed = 100;
    for (const Shape& shape : kFlashShapes) {
        for (const int64_t bs : {int64_t{16}, int64_t{5}}) check(shape, batch, bs, true, seed++);
    }
    check({32, 4, 128, 128}, Batch{{4000}, {1}}, 16, true, seed++);  // one sequence: every split busy
    EXPECT_FALSE(plan_.long_decode);
    check({32, 4, 128, 128}, Batch{{200}, {1}}, 16, true, seed++);   // one short sequence
    // Enough sequences of long caches that a block walks every key of its sequence (≥ 1024, one split): the
    // deeper pipeline (3 stages, 2 blocks per SM).
    for (const auto& [shape, num_seqs] :
         {std::pair{Shape{32, 4, 128, 128}, 64}, std::pair{Shape{24, 2, 64, 64}, 128}}) {
        Batch many;
        for (int i = 0; i < num_seqs; ++i) {
            many.cached.push_back(1030 + (i * 37) % 500);
            many.new_rows.push_back(1);
        }
        check(shape, many, 16, true, seed++);
        EXPECT_TRUE(plan_.long_decode) << "D " << shape.dqk;
    }
}

// Prompt chunks next to decode rows: the prefill layout, tiles holding tokens of several sequences.
TEST_F(AttentionBf16KvTest, FlashPrefillAndMixedBatches) {
    uint32_t seed = 200;
    const Batch mixed{{0, 37, 5, 200, 16, 1}, {9, 1, 1, 1, 70, 1}};
    const Batch prompts{{0, 100}, {300, 129}};
    for (const Shape& shape : kFlashShapes) {
        check(shape, mixed, 16, true, seed++);
        check(shape, prompts, 5, true, seed++);
    }
    check({32, 4, 128, 128}, Batch{{0}, {77}}, 0, true, seed++);    // contiguous K/V, a prompt
    check({24, 2, 64, 64}, Batch{{999}, {1}}, 0, true, seed++);      // contiguous K/V, one query
}

// Prompts on the wgmma prefill kernel (flash_prefill_sm90.cuh; H100/H200 with sm_90a in the build): GQA
// groups of 1, 8, 12 and 32 heads (heads per CTA 1, 8, 4, 16), several 128-key tiles, cached prefixes,
// block sizes 16 and 5 and contiguous rows, two prompts in one tile, a tile straddling two sequences.
TEST_F(AttentionBf16KvTest, FlashPrefillWgmma) {
    if (!cuda::sm90a_available(0))
        GTEST_SKIP() << "the wgmma kernel needs an sm_90a build on a compute 9.0 GPU";
    uint32_t seed = 400;
    const Batch chunked{{300}, {333}};         // a prompt chunk after 300 cached tokens
    const Batch prompts{{0, 129}, {257, 64}};  // two prompts, one with a prefix
    for (const Shape& shape :
         {Shape{32, 4, 128, 128}, Shape{4, 4, 128, 128}, Shape{64, 2, 128, 128}, Shape{24, 2, 128, 128}}) {
        for (const auto& [batch, bs] : {std::pair{chunked, int64_t{16}}, std::pair{prompts, int64_t{5}},
                                        std::pair{prompts, int64_t{16}}}) {
            check(shape, batch, bs, true, seed++);
            EXPECT_TRUE(plan_.sm90);
        }
    }
    check({32, 4, 128, 128}, Batch{{0}, {201}}, 0, true, seed++);  // contiguous K/V
    EXPECT_TRUE(plan_.sm90);
}

// Decode key splits that fill whole waves, pinned to hand counts of ⌈blocks · s / wave⌉ · (keys per split +
// overhead) (a host function: needs no GPU).
TEST(WholeWaveSplits, PinnedToHandCounts) {
    struct Case {
        int64_t blocks, keys, wave, min_keys, tile, overhead;
        int want_splits;
        int64_t want_keys_per_split;
    };
    // 256 blocks over 4096 keys, waves of 396: s = 3 costs 2 · (1408 + 128) = 3072, s = 4 3 · 1152 = 3456,
    // s = 6 4 · 832 = 3328, s = 1 4224. 32 blocks over 32768: s = 12 is one wave of 384 blocks, 2752 + 128
    // = 2880; s = 13 spills into a second wave. MLA-like (tiles of 32, wave 132): 64 blocks over 4096 keys
    // take 2 splits (one wave, 2112) over 4 (two waves, 2176). 2048 prefill-like blocks: s = 1 (8 · 4224 =
    // 33792 < 16 · 2176). 4 blocks over 256 keys, a split at least one tile of 64: s = 4 is one wave of 64 +
    // 128 = 192, s = 2 256, s = 1 384.
    for (const Case& c :
         {Case{256, 4096, 396, 256, 64, 128, 3, 1408}, Case{32, 32768, 396, 256, 64, 128, 12, 2752},
          Case{64, 4096, 132, 128, 32, 64, 2, 2048}, Case{2048, 4096, 264, 256, 64, 128, 1, 4096},
          Case{4, 256, 396, 64, 64, 128, 4, 64}}) {
        AttentionArgs args;
        args.num_tokens = 64;
        args.num_heads = 32;
        args.head_dim_v = 128;
        args.num_kv_tokens = c.keys;
        const cuda::KeySplitPlan plan =
            cuda::plan_whole_wave_splits(args, c.blocks, {c.wave, c.min_keys, c.tile, c.overhead});
        EXPECT_EQ(plan.num_splits, c.want_splits) << c.blocks << " blocks, " << c.keys << " keys";
        EXPECT_EQ(plan.keys_per_split, c.want_keys_per_split) << c.blocks << " blocks, " << c.keys << " keys";
        EXPECT_EQ(plan.workspace_bytes > 0, c.want_splits > 1);
    }
}

// Shapes the flash kernel does not take run on the CUDA-core kernel reading bf16.
TEST_F(AttentionBf16KvTest, CudaCoreKernelReadsBf16) {
    const Batch mixed{{0, 37, 5, 200}, {9, 1, 1, 30}};
    check({6, 3, 72, 72}, mixed, 16, false, 300);
    check({5, 5, 192, 128}, mixed, 16, false, 301);   // MLA's expanded heads
    check({4, 1, 576, 512}, mixed, 16, false, 302);   // MLA's latent widths
}

// MLA's absorbed attention over the latent cache (kernels/mla_attention.cuh, and on sm_90a
// mla_attention_sm90.cuh; each case runs both): 64 heads per block, so 16, 20 (a partial block), 64 and 128
// heads; decode rows with key splits, prompt chunks, both block sizes, contiguous rows, a sequence of 64·k +
// 1 keys (one key in its last 64-key tile).
TEST_F(AttentionBf16KvTest, MlaLatentKernel) {
    const Batch decode{{0, 37, 5, 1200, 16, 3000, 63, 64}, {1, 1, 1, 1, 1, 1, 1, 1}};
    const Batch mixed{{0, 37, 5, 200}, {9, 1, 1, 30}};
    uint32_t seed = 400;
    for (const int64_t heads : {16, 20, 64, 128}) {
        const Shape shape{heads, 1, 576, 512, true};
        for (const int64_t bs : {int64_t{16}, int64_t{5}}) {
            check(shape, decode, bs, false, seed++);
            check(shape, mixed, bs, false, seed++);
        }
    }
    check({64, 1, 576, 512, true}, Batch{{999}, {1}}, 0, false, seed++);  // contiguous rows, one query
    check({128, 1, 576, 512, true}, Batch{{4000}, {1}}, 16, false, seed++);  // one sequence: every split
    check({64, 1, 576, 512, true}, Batch{{128, 2}, {1, 1}}, 16, false, seed++);  // 129 keys; 3 keys
}

TEST_F(AttentionBf16KvTest, KvCacheStoreRoundsToNearestEvenLikeTheCpu) {
    const int64_t T = 37, width = 136, stride = 140, pool_rows = 101;
    std::vector<float> src = random_floats(T * stride, 990, -3.0f, 3.0f);
    src[0] = std::numeric_limits<float>::quiet_NaN();
    src[1] = std::numeric_limits<float>::infinity();
    src[2] = 1.00390625f;  // halfway between two bf16 values: ties to even (1.0)
    src[3] = 1.01171875f;  // halfway: ties to even (1.015625)
    std::vector<int64_t> slots(pool_rows);
    std::iota(slots.begin(), slots.end(), 0);
    std::shuffle(slots.begin(), slots.end(), std::mt19937(991));
    slots.resize(T);
    std::vector<uint16_t> want = random_bf16(pool_rows * width, 992, 1.0f);
    DeviceBuffer d_src = to_gpu(src), d_pool = to_gpu(want), d_slots = to_gpu(slots);
    KvCacheStoreArgs args;
    args.src = src.data();
    args.pool = want.data();
    args.pool_dtype = DType::kBF16;
    args.slot_mapping = slots.data();
    args.num_tokens = T;
    args.width = width;
    args.src_row_stride = stride;
    args.num_pool_rows = pool_rows;
    ASSERT_TRUE(cpu_->kv_cache_store(args).is_ok());
    EXPECT_EQ(want[slots[0] * width + 2], f32_to_bf16(1.0f));
    EXPECT_EQ(want[slots[0] * width + 3], f32_to_bf16(1.015625f));
    args.src = d_src.f32();
    args.pool = d_pool.data();
    args.slot_mapping = static_cast<const int64_t*>(d_slots.data());
    ASSERT_TRUE(gpu_->kv_cache_store(args).is_ok());
    const std::vector<uint16_t> got = from_gpu<uint16_t>(d_pool, pool_rows * width);
    EXPECT_EQ(got, want);
}

// The flash kernels report a query position outside the cache and a negative block id it reaches, with a
// block size of 4 (a block-table lookup per key) and 16 (one per thread's 8 keys, read a tile ahead): one
// query (decode) and 16 queries of one sequence (prefill; the wgmma kernel on sm_90a).
TEST_F(AttentionBf16KvTest, FlashErrorsFailAtSynchronize) {
    const int64_t D = 128;
    for (const int64_t T : {int64_t{1}, int64_t{16}}) {
        const std::vector<float> q = random_floats(T * 8 * D, 1);
        DeviceBuffer d_q = to_gpu(q), d_out = to_gpu(std::vector<float>(T * 8 * D));
        for (const int64_t bs : {int64_t{4}, int64_t{16}}) {
            const std::vector<uint16_t> pool = random_bf16(8 * bs * 2 * D, 2, 1.0f);  // 8 blocks, K and V
            DeviceBuffer d_pool = to_gpu(pool);
            for (const bool bad_position : {true, false}) {
                std::vector<int32_t> positions(T, static_cast<int32_t>(bs + 1));  // in block 1
                if (bad_position) positions.back() = static_cast<int32_t>(2 * bs);
                DeviceBuffer d_pos = to_gpu(positions);
                DeviceBuffer d_table = to_gpu(std::vector<int32_t>{1, bad_position ? 2 : -1});
                AttentionArgs args;
                args.q = d_q.f32();
                args.k = d_pool.data();
                args.v = static_cast<const uint16_t*>(d_pool.data()) + D;
                args.kv_dtype = DType::kBF16;
                args.positions = static_cast<const int32_t*>(d_pos.data());
                args.out = d_out.f32();
                args.num_tokens = T;
                args.num_kv_tokens = 2 * bs;
                args.num_heads = 8;
                args.num_kv_heads = 1;
                args.head_dim_qk = args.head_dim_v = D;
                args.q_token_stride = 8 * D;
                args.q_head_stride = args.k_head_stride = args.v_head_stride = args.out_head_stride = D;
                args.k_token_stride = args.v_token_stride = 2 * D;
                args.out_token_stride = 8 * D;
                args.kv_block_tables = static_cast<const int32_t*>(d_table.data());
                args.num_sequences = 1;
                args.block_table_stride = 2;
                args.kv_block_size = bs;
                ASSERT_TRUE(cuda::flash_attention_supports(args));
                ASSERT_TRUE(gpu_->attention(args).is_ok());
                const Status st = gpu_->synchronize();
                EXPECT_EQ(st.code(), StatusCode::kInvalidArgument)
                    << "T " << T << " bs " << bs << " bad position " << bad_position;
            }
        }
    }
}

// Both MLA latent kernels report a query position outside the cache and a negative block id its keys reach
// (block sizes 4 and 16; the wgmma kernel where it runs), and leave the flag alone for a good query.
TEST_F(AttentionBf16KvTest, MlaLatentErrorsSetTheFlag) {
    const int64_t Dqk = 576, Dv = 512, H = 64;
    const std::vector<float> q = random_floats(H * Dqk, 5);
    DeviceBuffer d_q = to_gpu(q);
    for (const int64_t bs : {int64_t{4}, int64_t{16}}) {
        const std::vector<uint16_t> pool = random_bf16(4 * bs * Dqk, 6, 1.0f);  // 4 blocks
        DeviceBuffer d_pool = to_gpu(pool);
        // bad: 0 good (block 1 then 2), 1 position past the cache, 2 its second block id negative.
        for (int bad = 0; bad < 3; ++bad) {
            DeviceBuffer d_pos =
                to_gpu(std::vector<int32_t>{static_cast<int32_t>(bad == 1 ? 2 * bs : bs + 1)});
            DeviceBuffer d_table = to_gpu(std::vector<int32_t>{1, bad == 2 ? -1 : 2});
            AttentionArgs args;
            args.q = d_q.f32();
            args.k = args.v = d_pool.data();
            args.kv_dtype = DType::kBF16;
            args.positions = static_cast<const int32_t*>(d_pos.data());
            args.num_tokens = 1;
            args.num_kv_tokens = 2 * bs;
            args.num_heads = H;
            args.num_kv_heads = 1;
            args.head_dim_qk = Dqk;
            args.head_dim_v = Dv;
            args.q_token_stride = H * Dqk;
            args.q_head_stride = args.k_head_stride = args.v_head_stride = Dqk;
            args.k_token_stride = args.v_token_stride = Dqk;
            args.out_token_stride = H * Dv;
            args.out_head_stride = Dv;
            args.kv_block_tables = static_cast<const int32_t*>(d_table.data());
            args.num_sequences = 1;
            args.block_table_stride = 2;
            args.kv_block_size = bs;
            args.scale = 0.05f;
            ASSERT_TRUE(cuda::mla_attention_supports(args));
            for (const bool sm90 : {false, true}) {
                if (sm90 && !cuda::sm90a_available(0)) continue;
                EXPECT_EQ(run_latent_kernel(args, sm90, H * Dv).error_flag, bad == 0 ? 0 : 1)
                    << "bs " << bs << " case " << bad << (sm90 ? " wgmma" : " mma.sync");
            }
        }
    }
}

}  // namespace
}  // namespace epinfer::test

#endif  // EPINFER_WITH_CUDA
