// Every fixture with goldens under one parallel layout (EPINFER_TEST_LAYOUT, e.g. "--dp 2 --ep 2"), on the
// ranks of this mpirun: the prefill logits of the golden prompts and the greedy continuation (6 new tokens,
// EOS ignored) against the same model on one rank and against the goldens. One mpirun per layout runs
// every fixture (tests/mpi/CMakeLists.txt). A layout the fixture cannot take is checked to be rejected by
// validate_layout with its numbers and reported as skipped with that message.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint/hf_config.h"
#include "checkpoint/safetensors.h"
#include "common/compare.h"
#include "common/golden.h"
#include "engine/generate.h"
#include "engine/kv_block_pool.h"
#include "layers/parallel_context.h"
#include "models/model.h"
#include "model_layout_util.h"
#include "mpi_test_world.h"

namespace epinfer {
namespace {

constexpr int64_t kNumNewTokens = 6;

std::vector<std::string> fixtures_with_goldens() {
    std::vector<std::string> names;
    const std::filesystem::path dir = std::filesystem::path(EPINFER_TEST_DATA_DIR) / "fixtures";
    for (const auto& entry : std::filesystem::directory_iterator(dir))
        if (std::filesystem::exists(entry.path() / "golden.safetensors"))
            names.push_back(entry.path().filename());
    std::sort(names.begin(), names.end());
    return names;
}

using test::Golden;
using test::load_golden;

std::vector<GenerateRequest> greedy_requests(const Golden& g) {
    std::vector<GenerateRequest> requests;
    for (const auto& p : g.prompts) {
        GenerateRequest r;
        r.prompt_ids = p;
        r.max_new_tokens = kNumNewTokens;
        r.ignore_eos = true;
        requests.push_back(r);
    }
    return requests;
}

class LayoutTest : public ::testing::TestWithParam<std::string> {};

TEST_P(LayoutTest, SameTokensAndLogitsAsOneRank) {
    Communicator& world = mpi_test::world();
    const std::string dir = std::string(EPINFER_TEST_DATA_DIR) + "/fixtures/" + GetParam();
    const char* layout_text = std::getenv("EPINFER_TEST_LAYOUT");
    ASSERT_NE(layout_text, nullptr) << "EPINFER_TEST_LAYOUT is not set";
    auto layout = layout_from_flags(layout_flags_from_env());
    ASSERT_TRUE(layout.is_ok()) << layout.status().to_string();
    auto config = load_hf_config(dir);
    ASSERT_TRUE(config.is_ok()) << config.status().to_string();
    const LayoutModelDims dims = layout_model_dims(*config);
    const Status valid = validate_layout(*layout, dims, world.size());
    if (!valid.is_ok()) {
        // Rejected before any weight is read, with the numbers: report it as skipped with that reason.
        EXPECT_NE(valid.message().find("parallel layout"), std::string::npos) << valid.message();
        GTEST_SKIP() << "layout '" << layout_text << "' is invalid for " << GetParam() << ": "
                     << valid.message();
    }
    auto rank_backend = test_rank_backend(world);
    ASSERT_TRUE(rank_backend.is_ok()) << rank_backend.status().to_string();
    Backend* backend = rank_backend->backend.get();
    auto ctx = create_parallel_context(world, *layout, dims, rank_backend->device_world.get());
    ASSERT_TRUE(ctx.is_ok()) << ctx.status().to_string();
    if (layout->attn_dp > 1 && layout->attn_tp % layout->moe_tp != 0 && !backend->host_accessible()) {
        // DP attention that gathers the stage's tokens runs on host memory only: refused before any weight
        // is read, naming the flag.
        auto refused = Model::load(dir, *backend, ctx->get());
        ASSERT_FALSE(refused.is_ok());
        EXPECT_EQ(refused.status().code(), StatusCode::kNotSupported) << refused.status().to_string();
        EXPECT_NE(refused.status().message().find("--dp"), std::string::npos) << refused.status().to_string();
        GTEST_SKIP() << refused.status().message();
    }
    auto ref = Model::load(dir, *backend);
    ASSERT_TRUE(ref.is_ok()) << ref.status().to_string();
    auto par = Model::load(dir, *backend, ctx->get());
    ASSERT_TRUE(par.is_ok()) << par.status().to_string();
    EXPECT_GT((*par)->weight_bytes(), 0);
    // Sharded loading: every layout of more than one rank splits something (layers, heads, experts or I).
    if (world.size() > 1) {
        EXPECT_LT((*par)->weight_bytes(), (*ref)->weight_bytes());
    }
    const Golden golden = load_golden(dir);
    ASSERT_EQ(golden.prompts.size(), 2u);

    // The KV pool holds storage for this rank's pipeline stage only; other layers get empty views.
    {
        auto pool = KvBlockPool::create(**par, 2, 4);
        ASSERT_TRUE(pool.is_ok()) << pool.status().to_string();
        std::vector<int32_t> table;
        ASSERT_TRUE(pool->allocate(1, &table).is_ok());
        const std::vector<LayerKvCache> views = pool->views(table, 3);
        const ShardRange stage = (*ctx)->pipeline_stage.layers;
        ASSERT_EQ(static_cast<int64_t>(views.size()), config->num_hidden_layers);
        for (int64_t l = 0; l < config->num_hidden_layers; ++l) {
            const LayerKvCache& kv = views[static_cast<size_t>(l)];
            const bool on_stage = l >= stage.begin && l < stage.end();
            EXPECT_EQ(kv.k_pool != nullptr, on_stage) << "layer " << l;
            EXPECT_EQ(kv.capacity(), on_stage ? 4 : 0) << "layer " << l;
            EXPECT_EQ(kv.num_tokens, 3) << "layer " << l;
        }
        if (layout->pp > 1) {
            EXPECT_LT(pool->storage_bytes(), KvBlockPool::create(**ref, 2, 4)->storage_bytes());
        }
    }

    // Prefill logits of this rank's prompts (every rank calls forward once, also with none).
    const RankCoords& rc = (*ctx)->coords;
    std::vector<std::vector<int32_t>> own;
    std::vector<float> golden_rows;
    const int64_t V = config->vocab_size;
    int64_t golden_row = 0;
    for (size_t i = 0; i < golden.prompts.size(); ++i) {
        const auto& p = golden.prompts[i];
        if (static_cast<int>(i) % layout->attn_dp == rc.attn_dp_rank) {
            own.push_back(p);
            golden_rows.insert(golden_rows.end(), golden.logits.begin() + golden_row * V,
                               golden.logits.begin() + (golden_row + static_cast<int64_t>(p.size())) * V);
        }
        golden_row += static_cast<int64_t>(p.size());
    }
    auto got = prefill_logits(**par, own);
    ASSERT_TRUE(got.is_ok()) << got.status().to_string();
    if (layout->attn_dp == 1) {
        // Every rank holds the same prompts: the logits must be the same bits on every rank (the routers of
        // the replicated-token MoE path see the same inputs everywhere).
        uint64_t hash = 0;
        for (const float v : *got) {
            uint32_t bits = 0;
            std::memcpy(&bits, &v, sizeof(bits));
            hash = hash * 1000003 + bits;
        }
        int64_t lo = static_cast<int64_t>(hash >> 1), hi = lo;
        ASSERT_TRUE(world.all_reduce(&lo, &lo, 1, DType::kI64, ReduceOp::kMin).is_ok());
        ASSERT_TRUE(world.all_reduce(&hi, &hi, 1, DType::kI64, ReduceOp::kMax).is_ok());
        EXPECT_EQ(lo, hi) << "ranks disagree on the logits bits";
    }
    if (!own.empty()) {
        auto want = prefill_logits(**ref, own);
        ASSERT_TRUE(want.is_ok()) << want.status().to_string();
        const test::Diff vs_one_rank =
            test::compare(std::span<const float>(*got), std::span<const float>(*want));
        const test::Diff vs_golden =
            test::compare(std::span<const float>(*got), std::span<const float>(golden_rows));
        EXPECT_TRUE(test::within(vs_one_rank, test::tolerance("logits_multi_rank", DType::kBF16)));
        EXPECT_TRUE(test::within(vs_golden, test::tolerance("logits", DType::kBF16)));
        std::printf(
            "[rank %d] %s '%s': logits vs one rank nmse %.3g max_rel %.3g; vs golden nmse %.3g max_rel "
            "%.3g\n",
            world.rank(), GetParam().c_str(), layout_text, vs_one_rank.nmse, vs_one_rank.max_rel,
            vs_golden.nmse, vs_golden.max_rel);
    }

    // Greedy continuation of both prompts, through the KV caches.
    const std::vector<GenerateRequest> requests = greedy_requests(golden);
    auto par_out = generate(**par, requests);
    ASSERT_TRUE(par_out.is_ok()) << par_out.status().to_string();
    auto ref_out = generate(**ref, requests);
    ASSERT_TRUE(ref_out.is_ok()) << ref_out.status().to_string();
    for (size_t i = 0; i < requests.size(); ++i) {
        const std::vector<int32_t> want(
            golden.greedy[i].begin() + static_cast<int64_t>(golden.prompts[i].size()),
            golden.greedy[i].end());
        EXPECT_EQ(par_out->output_ids[i], ref_out->output_ids[i]) << "prompt " << i;
        EXPECT_EQ(par_out->output_ids[i], want) << "prompt " << i << " vs golden greedy";
    }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, LayoutTest, ::testing::ValuesIn(fixtures_with_goldens()),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
}  // namespace epinfer
