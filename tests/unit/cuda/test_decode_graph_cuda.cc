// Decode graphs (Model::set_decode_graphs) on the GPU. Twin batches (the same prompts in different KV
// blocks) step together: the first step of a (rows, width) bucket runs its ops directly and records them,
// the twin's step replays the recording with its own tokens, positions and block tables. Replay must give
// the twin exactly the same tokens (greedy, and drawn with top-k / top-p) and the same K/V bits in every
// layer, with a full bucket and a padded one (3 sequences in the bucket of 4), across a block-table width
// bucket change. A full bucket also gives exactly the tokens of the direct path (the same kernels on the
// same rows).
#include <gtest/gtest.h>

#if EPINFER_WITH_CUDA
#include <algorithm>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/gumbel_noise.h"
#include "cuda_test_util.h"
#include "engine/kv_block_pool.h"
#include "models/model.h"

namespace epinfer {
namespace {

class DecodeGraphCudaTest : public test::CudaTest {};

// Sequences with their own blocks in one pool; tokens[s] grows by one each decode step.
struct Batch {
    std::vector<std::vector<int32_t>> tokens;
    std::vector<std::vector<int32_t>> tables;
    std::vector<std::vector<LayerKvCache>> kv;
};

Result<Batch> prefill(Model& model, KvBlockPool& pool, int64_t num_seqs, int64_t blocks_each) {
    Batch b;
    const int64_t V = model.config().vocab_size;
    b.tokens.resize(static_cast<size_t>(num_seqs));
    b.tables.resize(static_cast<size_t>(num_seqs));
    std::vector<SequenceInput> inputs;
    for (int64_t s = 0; s < num_seqs; ++s) {
        for (int64_t j = 0; j < 5 + 3 * s; ++j)
            b.tokens[s].push_back(static_cast<int32_t>((11 * s + 5 * j + 2) % V));
        EPI_RETURN_IF_ERROR(pool.allocate(blocks_each, &b.tables[s]));
        b.kv.push_back(pool.views(b.tables[s], 0));
    }
    for (int64_t s = 0; s < num_seqs; ++s) inputs.push_back({b.tokens[s], b.kv[s]});
    std::vector<float> logits(static_cast<size_t>(num_seqs * V));
    ForwardArgs args;
    args.sequences = inputs;
    args.logits = logits.data();
    EPI_RETURN_IF_ERROR(model.forward(args));
    for (int64_t s = 0; s < num_seqs; ++s) {
        const auto row = logits.begin() + s * V;
        b.tokens[s].push_back(static_cast<int32_t>(std::max_element(row, row + V) - row));
    }
    return b;
}

// Decode step i of the first `num_seqs` sequences; appends the new tokens. Without `draw` every step is
// greedy; with it every third step is, and the others draw (sequence s: temperature 1, top-k 5 for even s,
// top-p 0.9 for odd s, a key of (s, i)), so greedy and drawn buckets both record and replay.
Status step(Model& model, Batch& b, int64_t num_seqs, int64_t i, bool draw = true) {
    std::vector<SequenceInput> inputs;
    for (int64_t s = 0; s < num_seqs; ++s)
        inputs.push_back({std::span<const int32_t>(&b.tokens[s].back(), 1), b.kv[s]});
    std::vector<int32_t> ids(static_cast<size_t>(num_seqs)), non_finite(static_cast<size_t>(num_seqs));
    std::vector<TokenDraw> draws(static_cast<size_t>(num_seqs));
    for (int64_t s = 0; s < num_seqs; ++s) {
        TokenDraw& d = draws[static_cast<size_t>(s)];
        d.noise_key = sampling_noise_key(100 + static_cast<uint64_t>(s), static_cast<uint64_t>(i));
        d.inv_temperature = 1.0f;
        if (s % 2 == 0)
            d.top_k = 5;
        else
            d.top_p = 0.9f;
    }
    ForwardArgs args;
    args.sequences = inputs;
    args.greedy_ids = ids.data();
    args.greedy_non_finite = non_finite.data();
    if (draw && i % 3 != 0) args.sample_draws = draws.data();
    EPI_RETURN_IF_ERROR(model.forward(args));
    for (int64_t s = 0; s < num_seqs; ++s) {
        if (non_finite[s] != 0) return data_loss("non-finite logits");
        b.tokens[s].push_back(ids[s]);
    }
    return Status::ok();
}

// Every layer's cached K rows of sequence s, in position order, as host floats.
std::vector<float> cached_rows(Model& model, const KvBlockPool& pool, const Batch& b, size_t s) {
    std::vector<float> out;
    for (const LayerKvCache& kv : b.kv[s]) {
        const int64_t n = kv.num_tokens, w = pool.shape().k_width;
        auto dev = DeviceBuffer::alloc_f32(model.backend(), n * w);
        EXPECT_TRUE(dev.is_ok());
        EXPECT_TRUE(kv_cache_gather_rows(model.backend(), kv, kv.k_pool, w, n, dev->f32()).is_ok());
        std::vector<float> host(static_cast<size_t>(n * w));
        EXPECT_TRUE(model.backend().copy_to_host(host.data(), dev->data(), host.size() * sizeof(float)).is_ok());
        out.insert(out.end(), host.begin(), host.end());
    }
    return out;
}

TEST_F(DecodeGraphCudaTest, ReplayMatchesTheDirectRunBitForBit) {
    for (const char* fixture : {"qwen3_moe_tiny", "mixtral_tiny"}) {
        SCOPED_TRACE(fixture);
        auto backend = make_cuda_backend();
        ASSERT_TRUE(backend.is_ok()) << backend.status().message();
        auto model = Model::load(std::string(EPINFER_TEST_DATA_DIR) + "/fixtures/" + fixture, **backend);
        ASSERT_TRUE(model.is_ok()) << model.status().message();
        Model& m = **model;
        // Tables of 6 blocks (width bucket 8), grown to 12 (bucket 16) after 60 steps, as the scheduler
        // grows them.
        const int64_t blocks_each = 6, block_size = 16;
        auto pool = KvBlockPool::create(m, 4 * 4 * 2 * blocks_each, block_size);
        ASSERT_TRUE(pool.is_ok()) << pool.status().message();
        Result<Batch> a = prefill(m, *pool, 4, blocks_each), b = prefill(m, *pool, 4, blocks_each);
        Result<Batch> direct = prefill(m, *pool, 4, blocks_each), greedy = prefill(m, *pool, 4, blocks_each);
        ASSERT_TRUE(a.is_ok() && b.is_ok() && direct.is_ok() && greedy.is_ok());
        // 4 sequences (bucket 4, no padding), then 3 sequences (bucket 4 with one padded row).
        const auto grow = [&](Batch& batch) {
            for (size_t s = 0; s < batch.tables.size(); ++s) {
                ASSERT_TRUE(pool->allocate(blocks_each, &batch.tables[s]).is_ok());
                batch.kv[s] = pool->views(batch.tables[s], batch.kv[s][0].num_tokens);
            }
        };
        for (int64_t i = 0; i < 125; ++i) {
            if (i == 60) {
                grow(*a);
                grow(*b);
                grow(*greedy);
            }
            const int64_t n = i < 115 ? 4 : 3;
            ASSERT_TRUE(step(m, *a, n, i).is_ok()) << "step " << i;
            ASSERT_TRUE(step(m, *b, n, i).is_ok()) << "step " << i;
            if (i < 115) {
                ASSERT_TRUE(step(m, *greedy, n, i, false).is_ok()) << "greedy step " << i;
            }
        }
        EXPECT_TRUE(m.decode_graphs_status().is_ok()) << m.decode_graphs_status().message();
        EXPECT_GE(m.num_decode_graphs(), 4);  // (4, 8) and (4, 16), greedy and drawn
        m.set_decode_graphs(false);
        for (int64_t i = 0; i < 115; ++i) {
            if (i == 60) grow(*direct);
            ASSERT_TRUE(step(m, *direct, 4, i).is_ok()) << "direct step " << i;
        }
        for (size_t s = 0; s < 4; ++s) {
            EXPECT_EQ(b->tokens[s], a->tokens[s]) << "sequence " << s;
            EXPECT_EQ(cached_rows(m, *pool, *b, s), cached_rows(m, *pool, *a, s)) << "sequence " << s;
            const std::vector<int32_t> full(a->tokens[s].begin(), a->tokens[s].begin() + direct->tokens[s].size());
            EXPECT_EQ(direct->tokens[s], full) << "sequence " << s;
            EXPECT_NE(direct->tokens[s], greedy->tokens[s]) << "sequence " << s << ": the draws drew nothing";
        }
    }
}

}  // namespace
}  // namespace epinfer
#endif  // EPINFER_WITH_CUDA
