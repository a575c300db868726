// MLA's two forms of attention (layers/attention_mla.h): the absorbed form over the paged latent cache gives
// the expanded form's output (the same sums reassociated), for decode rows, short and long chunks and
// batches that mix both forms, on the CPU reference with random weights and a paged fp32 cache.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "common/compare.h"
#include "common/tolerances.h"
#include "layers/attention_mla.h"
#include "layers/kv_cache.h"
#include "../backend_cpu/op_test_util.h"

namespace epinfer {
namespace {

using test::random_floats;
using test::store_as;
using test::StoredTensor;

constexpr int64_t kHidden = 20, kHeads = 3, kRank = 16, kNope = 8, kRope = 4, kV = 6;
constexpr int64_t kLatent = kRank + kRope, kBlockSize = 4, kNumBlocks = 24;

struct MlaFixture {
    std::unique_ptr<Backend> backend = make_cpu_backend(2);
    StoredTensor q_proj = store_as(DType::kBF16, random_floats(kHeads * (kNope + kRope) * kHidden, 1, -0.3f, 0.3f));
    StoredTensor kv_a = store_as(DType::kBF16, random_floats(kLatent * kHidden, 2, -0.3f, 0.3f));
    StoredTensor kv_a_norm = store_as(DType::kBF16, random_floats(kRank, 3, 0.5f, 1.5f));
    StoredTensor kv_b = store_as(DType::kBF16, random_floats(kHeads * (kNope + kV) * kRank, 4, -0.4f, 0.4f));
    StoredTensor o_proj = store_as(DType::kBF16, random_floats(kHidden * kHeads * kV, 5, -0.3f, 0.3f));
    std::vector<float> inv_freq;
    MlaAttentionWeights weights;
    MlaAttentionParams params;

    MlaFixture() {
        for (int64_t i = 0; i < kRope / 2; ++i)
            inv_freq.push_back(static_cast<float>(std::pow(10000.0, -2.0 * static_cast<double>(i) / kRope)));
        weights.q_proj = {q_proj.data(), DType::kBF16, nullptr, DType::kBF16, kHeads * (kNope + kRope), kHidden};
        weights.kv_a_proj_with_mqa = {kv_a.data(), DType::kBF16, nullptr, DType::kBF16, kLatent, kHidden};
        weights.kv_a_layernorm = {kv_a_norm.data(), DType::kBF16, kRank, 1e-6f};
        weights.kv_b_proj = {kv_b.data(), DType::kBF16, nullptr, DType::kBF16, kHeads * (kNope + kV), kRank};
        weights.o_proj = {o_proj.data(), DType::kBF16, nullptr, DType::kBF16, kHidden, kHeads * kV};
        params.num_heads = kHeads;
        params.kv_lora_rank = kRank;
        params.qk_nope_head_dim = kNope;
        params.qk_rope_head_dim = kRope;
        params.v_head_dim = kV;
        params.rope_interleaved = true;
        params.inv_freq = inv_freq.data();
        params.softmax_scale = static_cast<float>(1.0 / std::sqrt(double(kNope + kRope)));
    }

    // Runs the steps (new rows per sequence, a step per entry) through one fresh paged cache with the given
    // absorb_max_rows and returns every step's output rows, concatenated.
    std::vector<float> run(const std::vector<std::vector<int64_t>>& steps, int64_t absorb_max_rows) {
        params.absorb_max_rows = absorb_max_rows;
        std::vector<float> pool(kNumBlocks * kBlockSize * kLatent, std::numeric_limits<float>::quiet_NaN());
        const std::vector<std::vector<int32_t>> tables = {{5, 0, 17, 9, 2, 12, 15}, {11, 3, 20}, {7, 14, 1, 23}};
        std::vector<LayerKvCache> kv(tables.size());
        for (size_t s = 0; s < tables.size(); ++s) {
            kv[s].k_pool = pool.data();
            kv[s].block_table = tables[s];
            kv[s].num_blocks = kNumBlocks;
            kv[s].block_size = kBlockSize;
        }
        std::vector<float> out;
        uint32_t seed = 100;
        for (const std::vector<int64_t>& rows : steps) {
            std::vector<AttentionSequence> seqs;
            std::vector<int32_t> positions;
            int64_t T = 0;
            for (size_t s = 0; s < rows.size(); ++s) {
                if (rows[s] == 0) continue;
                seqs.push_back({T, rows[s], &kv[s]});
                for (int64_t i = 0; i < rows[s]; ++i) positions.push_back(static_cast<int32_t>(kv[s].num_tokens + i));
                T += rows[s];
            }
            const std::vector<float> x = random_floats(T * kHidden, seed++);
            std::vector<float> y(T * kHidden);
            Result<KvBatchMetadata> meta = build_kv_batch_metadata(*backend, seqs, T);
            EXPECT_TRUE(meta.is_ok()) << meta.status().message();
            const AttentionBatch batch{positions.data(), seqs, &meta.value()};
            const Status st = mla_attention_forward(*backend, weights, params, batch, x.data(), T, y.data());
            EXPECT_TRUE(st.is_ok()) << st.message();
            for (size_t s = 0; s < rows.size(); ++s) kv[s].num_tokens += rows[s];
            out.insert(out.end(), y.begin(), y.end());
        }
        return out;
    }
};

constexpr int64_t kNever = 0, kAlways = std::numeric_limits<int64_t>::max();

// Prefill of two sequences, then a batch of a decode row, a 3-row chunk and a third sequence's 9-row
// prefill, then a decode row each.
const std::vector<std::vector<int64_t>> kSteps = {{13, 6, 0}, {1, 3, 9}, {1, 1, 1}};

TEST(MlaAttention, AbsorbedFormEqualsTheExpandedForm) {
    MlaFixture f;
    const std::vector<float> expanded = f.run(kSteps, kNever);
    const std::vector<float> absorbed = f.run(kSteps, kAlways);
    EXPECT_TRUE(test::within(test::compare<float>(absorbed, expanded), test::tolerance("mla_absorbed", DType::kF32)));
    double largest = 0.0;
    for (const float v : expanded) largest = std::max(largest, std::abs(double(v)));
    EXPECT_GT(largest, 0.01) << "the outputs are near zero: the comparison would prove little";
}

// absorb_max_rows 3: sequences of ≤ 3 new rows absorbed (one call per run of them), longer ones expanded.
TEST(MlaAttention, BatchesMixingBothFormsEqualTheExpandedForm) {
    MlaFixture f;
    const std::vector<float> expanded = f.run(kSteps, kNever);
    const std::vector<float> mixed = f.run({{13, 6, 0}, {3, 1, 9}, {9, 1, 2}}, 3);
    const std::vector<float> expanded_mixed_steps = f.run({{13, 6, 0}, {3, 1, 9}, {9, 1, 2}}, kNever);
    EXPECT_TRUE(test::within(test::compare<float>(mixed, expanded_mixed_steps),
                             test::tolerance("mla_absorbed", DType::kF32)));
    EXPECT_EQ(expanded.size(), size_t{(19 + 13 + 3) * kHidden});
}

TEST(MlaAttention, AbsorbMaxRowsIsWhereTheAbsorbedFormStopsBeingCheaper) {
    MlaAttentionParams p;
    p.kv_lora_rank = 512;  // DeepSeek-V3 / Kimi K2: n · (1024 − 256) < 512 · 256 → n ≤ 170
    p.qk_nope_head_dim = 128;
    p.qk_rope_head_dim = 64;
    p.v_head_dim = 128;
    EXPECT_EQ(mla_absorb_max_rows(p), 170);
    p.kv_lora_rank = 16;  // the fixtures above: n · (32 − 14) < 16 · 14 → n ≤ 12
    p.qk_nope_head_dim = kNope;
    p.v_head_dim = kV;
    EXPECT_EQ(mla_absorb_max_rows(p), 12);
    p.kv_lora_rank = 7;  // 2R ≤ Dn + Dv: the absorbed form is never the dearer
    EXPECT_EQ(mla_absorb_max_rows(p), kAlways);
}

}  // namespace
}  // namespace epinfer
