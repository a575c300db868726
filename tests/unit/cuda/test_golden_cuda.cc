// Every golden fixture of tests/data/fixtures end to end on the CUDA backend (the MoE block through the
// moe_experts op, the paged KV cache in device memory), against the transformers fp32 goldens and the CPU
// reference backend (which matches the goldens within tolerances.h "logits" and greedy exactly).
//
// The runs are what generate() does, fed the golden tokens (teacher forcing) so that every step's logits
// can be compared: the prompts prefilled together (2·P rows), then one decode forward per step with one
// token of each sequence ("batched"); and each sequence on its own ("alone": prefill of P ≤ 16 rows, decode
// of 1), through paged KV caches of 4-token blocks.
//  - fp32 activations (CudaBackendOptions::fp32_activations): generate()'s greedy tokens equal the goldens
//    exactly, and every step's logits are within "logits_cuda_fp32" of the CPU.
//  - bf16 activations and a bf16 KV cache (the defaults on CUDA): every step's logits within "logits_cuda"
//    of the CPU (fp32 cache), and
//    generate()'s greedy tokens equal the goldens wherever the CPU's top-1 margin exceeds
//    2 · max_rel · max |logit| (no error within the bound can flip the top-1 there) — up to the first
//    routing flip. A routing flip is a token for which some MoE layer picks another expert set on the GPU
//    than on the CPU (probed: the router re-run on each backend on the layer's observed input, exactly as
//    the forward ran it): with near-tied router scores, bf16 rounding upstream legitimately changes the
//    choice, and the outputs of that position and every later one then differ by far more than rounding.
//    Steps from the first flipped position on are not compared; each run prints its flips.
#include <gtest/gtest.h>

#if EPINFER_WITH_CUDA
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/weight_names.h"
#include "common/compare.h"
#include "common/golden.h"
#include "cuda_test_util.h"
#include "engine/generate.h"
#include "engine/kv_block_pool.h"
#include "engine/sampler.h"
#include "models/model.h"

namespace epinfer::test {
namespace {

const char* const kFixtures[] = {
    "deepseek_v3_tiny",
    "qwen3_moe_tiny",
    "mixtral_tiny",
    "kimi_k2_tiny_yarn",
    "deepseek_v2_tiny",
    "deepseek_v2_lite_tiny",
    "glm4_moe_tiny",
    "glm4_moe_qknorm_tiny",
    "olmoe_tiny",
    "qwen2_moe_tiny",
    "qwen3_moe_sparse_step_tiny",
    "mixtral_3l_tiny",
    "olmoe_3l_tiny",
    "qwen2_moe_3l_tiny",
};

using test::Golden;
using test::load_golden;

// The router of every MoE layer on one backend, to re-run it on a layer's observed input.
class RouterProbe {
public:
    static Result<RouterProbe> create(const std::string& dir, const Model& model) {
        RouterProbe probe;
        probe.model_ = &model;
        Backend& backend = model.backend();
        const ModelConfig& c = model.config();
        EPI_ASSIGN_OR_RETURN(probe.checkpoint_, Checkpoint::open(dir));
        for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
            if (!c.layer_is_moe[static_cast<size_t>(l)]) continue;
            const std::string prefix = moe_block_prefix(c, l) + ".gate";
            const Checkpoint::Entry gate = probe.checkpoint_->find(prefix + ".weight");
            if (gate.info == nullptr) return not_found(prefix + ".weight");
            Layer layer;
            layer.dtype = gate.info->dtype;
            EPI_ASSIGN_OR_RETURN(layer.weight, DeviceBuffer::alloc(backend, gate.info->num_bytes()));
            EPI_RETURN_IF_ERROR(
                backend.copy_to_device(layer.weight.data(), gate.data(), gate.info->num_bytes()));
            if (c.router.has_correction_bias) {
                const Checkpoint::Entry bias = probe.checkpoint_->find(prefix + ".e_score_correction_bias");
                if (bias.info == nullptr) return not_found(prefix + ".e_score_correction_bias");
                std::vector<float> host(static_cast<size_t>(bias.info->numel()));
                convert_to_f32(bias.info->dtype, bias.data(), host.data(), host.size());
                EPI_ASSIGN_OR_RETURN(layer.bias,
                                     DeviceBuffer::alloc_f32(backend, static_cast<int64_t>(host.size())));
                EPI_RETURN_IF_ERROR(backend.copy_to_device(layer.bias.data(), host.data(), host.size() * 4));
            }
            probe.layers_.emplace(l, std::move(layer));
        }
        return probe;
    }

    // The sorted expert ids of each of the T rows ([T, H] fp32 host: the layer's observed mlp_in), as
    // moe_block_forward computes them on this backend: router matmul over the same T rows, then top-k.
    Result<std::vector<std::vector<int32_t>>> route(int64_t layer, const float* rows,
                                                    int64_t num_rows) const {
        const auto found = layers_.find(layer);
        if (found == layers_.end()) return std::vector<std::vector<int32_t>>{};
        Backend& backend = model_->backend();
        const ModelConfig& c = model_->config();
        const int64_t T = num_rows, H = c.hidden_size, E = c.n_routed_experts,
                      K = c.router.num_experts_per_tok;
        EPI_ASSIGN_OR_RETURN(DeviceBuffer x, DeviceBuffer::alloc_f32(backend, T * H));
        EPI_RETURN_IF_ERROR(
            backend.copy_to_device(x.data(), rows, static_cast<size_t>(T * H) * sizeof(float)));
        EPI_ASSIGN_OR_RETURN(DeviceBuffer logits, DeviceBuffer::alloc_f32(backend, T * E));
        EPI_ASSIGN_OR_RETURN(DeviceBuffer ids, DeviceBuffer::alloc(backend, static_cast<size_t>(T * K) * 4));
        EPI_ASSIGN_OR_RETURN(DeviceBuffer weights, DeviceBuffer::alloc_f32(backend, T * K));
        MatmulArgs m;
        m.x = x.f32();
        m.w = found->second.weight.data();
        m.w_dtype = found->second.dtype;
        m.y = logits.f32();
        m.num_rows = T;
        m.out_features = E;
        m.in_features = H;
        m.x_row_stride = H;
        m.y_row_stride = E;
        EPI_RETURN_IF_ERROR(backend.matmul(m));
        MoeRouterTopkArgs r;
        r.router_logits = logits.f32();
        r.e_score_correction_bias = found->second.bias.f32();
        r.topk_ids = static_cast<int32_t*>(ids.data());
        r.topk_weights = weights.f32();
        r.num_tokens = T;
        r.num_experts = E;
        r.top_k = K;
        r.scoring_func = c.router.scoring_func;
        r.topk_method = c.router.topk_method;
        r.n_group = c.router.n_group;
        r.topk_group = c.router.topk_group;
        r.norm_topk_prob = c.router.norm_topk_prob;
        r.routed_scaling_factor = static_cast<float>(c.router.routed_scaling_factor);
        EPI_RETURN_IF_ERROR(backend.moe_router_topk(r));
        std::vector<int32_t> flat(static_cast<size_t>(T * K));
        EPI_RETURN_IF_ERROR(backend.copy_to_host(flat.data(), ids.data(), flat.size() * sizeof(int32_t)));
        std::vector<std::vector<int32_t>> out(static_cast<size_t>(T));
        for (int64_t t = 0; t < T; ++t) {
            out[t].assign(flat.begin() + t * K, flat.begin() + (t + 1) * K);
            std::sort(out[t].begin(), out[t].end());
        }
        return out;
    }

private:
    struct Layer {
        DeviceBuffer weight;  // [E, H] dtype
        DType dtype = DType::kBF16;
        DeviceBuffer bias;  // [E] fp32, or empty
    };
    const Model* model_ = nullptr;
    std::unique_ptr<Checkpoint> checkpoint_;
    std::map<int64_t, Layer> layers_;
};

// One teacher-forced run: logits [B, N, V] (the logits that chose each golden token) and, with a probe, the
// expert sets of every MoE layer for each (sequence, position): routes[b][p] = the layers' sorted ids in
// layer order.
struct TeacherForced {
    std::vector<float> logits;
    std::vector<std::vector<std::vector<int32_t>>> routes;
};

Result<TeacherForced> teacher_forced_steps(Model& model, const std::vector<std::vector<int32_t>>& sequences,
                                           int64_t prompt_len, int64_t num_steps, const RouterProbe* probe,
                                           DType kv_dtype) {
    const int64_t V = model.config().vocab_size, B = static_cast<int64_t>(sequences.size());
    const int64_t block_size = 4,
                  blocks_per_sequence = (prompt_len + num_steps + block_size - 1) / block_size;
    EPI_ASSIGN_OR_RETURN(KvBlockPool pool,
                         KvBlockPool::create(model, B * blocks_per_sequence, block_size, kv_dtype));
    std::vector<std::vector<int32_t>> tables(static_cast<size_t>(B));
    std::vector<std::vector<LayerKvCache>> kv;
    for (auto& table : tables) {
        EPI_RETURN_IF_ERROR(pool.allocate(blocks_per_sequence, &table));
        kv.push_back(pool.views(table, 0));
    }
    TeacherForced out;
    out.logits.resize(static_cast<size_t>(B * num_steps * V));
    out.routes.assign(static_cast<size_t>(B),
                      std::vector<std::vector<int32_t>>(static_cast<size_t>(prompt_len + num_steps)));
    std::vector<std::pair<int64_t, int64_t>> row_of;  // (sequence, position) of each row of the forward
    Status probe_status = Status::ok();
    const LayerObserver observer = [&](std::string_view what, int64_t layer, const float* rows, int64_t n) {
        if (what != "mlp_in" || !probe_status.is_ok()) return;
        auto routed = probe->route(layer, rows, n);
        if (!routed.is_ok()) {
            probe_status = routed.status();
            return;
        }
        for (size_t r = 0; r < routed->size(); ++r) {
            std::vector<int32_t>& route = out.routes[row_of[r].first][row_of[r].second];
            route.insert(route.end(), (*routed)[r].begin(), (*routed)[r].end());
        }
    };
    std::vector<float> logits(static_cast<size_t>(B * V));
    for (int64_t i = 0; i < num_steps; ++i) {
        std::vector<SequenceInput> inputs;
        row_of.clear();
        for (int64_t b = 0; b < B; ++b) {
            const std::vector<int32_t>& seq = sequences[static_cast<size_t>(b)];
            const int64_t first = i == 0 ? 0 : prompt_len + i - 1, count = i == 0 ? prompt_len : 1;
            inputs.push_back({std::span<const int32_t>(seq.data() + first, static_cast<size_t>(count)),
                              kv[static_cast<size_t>(b)]});
            for (int64_t p = first; p < first + count; ++p) row_of.emplace_back(b, p);
        }
        ForwardArgs args;
        args.sequences = inputs;
        args.logits = logits.data();  // kLastRowPerSequence: [B, V]
        args.observer = probe != nullptr ? &observer : nullptr;
        EPI_RETURN_IF_ERROR(model.forward(args));
        EPI_RETURN_IF_ERROR(probe_status);
        for (int64_t b = 0; b < B; ++b) {
            std::copy(logits.begin() + b * V, logits.begin() + (b + 1) * V,
                      out.logits.begin() + (b * num_steps + i) * V);
        }
    }
    return out;
}

// Each sequence alone (B runs of one) or all together, concatenated as [B, N, V] / routes[b]; the KV cache
// in kv_dtype (fp32: the CPU reference and the fp32-activation GPU run; bf16: the GPU's default cache).
Result<TeacherForced> run(Model& model, const std::vector<std::vector<int32_t>>& sequences,
                          int64_t prompt_len, int64_t num_steps, const RouterProbe* probe, bool batched,
                          DType kv_dtype = DType::kF32) {
    if (batched) return teacher_forced_steps(model, sequences, prompt_len, num_steps, probe, kv_dtype);
    TeacherForced all;
    for (const std::vector<int32_t>& sequence : sequences) {
        EPI_ASSIGN_OR_RETURN(TeacherForced one,
                             teacher_forced_steps(model, {sequence}, prompt_len, num_steps, probe, kv_dtype));
        all.logits.insert(all.logits.end(), one.logits.begin(), one.logits.end());
        all.routes.push_back(std::move(one.routes[0]));
    }
    return all;
}

float top1_margin(std::span<const float> row) {
    float first = -INFINITY, second = -INFINITY;
    for (const float v : row) {
        if (v > first) {
            second = first;
            first = v;
        } else if (v > second) {
            second = v;
        }
    }
    return first - second;
}

float max_abs(std::span<const float> v) {
    float m = 0.0f;
    for (const float x : v) m = std::max(m, std::abs(x));
    return m;
}

class GoldenCudaTest : public CudaTest, public ::testing::WithParamInterface<const char*> {
protected:
    void SetUp() override {
        CudaTest::SetUp();
        if (IsSkipped()) return;
        // EPINFER_TEST_DATA_DIR in the environment overrides the build's path (binaries carried to a GPU
        // machine, where the checkout lives elsewhere).
        const char* data_dir = std::getenv("EPINFER_TEST_DATA_DIR");
        dir_ =
            std::string(data_dir != nullptr ? data_dir : EPINFER_TEST_DATA_DIR) + "/fixtures/" + GetParam();
        cpu_ = make_cpu_backend(2);
        auto cpu_model = Model::load(dir_, *cpu_);
        ASSERT_TRUE(cpu_model.is_ok()) << cpu_model.status().to_string();
        cpu_model_ = std::move(cpu_model).value();
        golden_ = load_golden(dir_);
        ASSERT_EQ(golden_.num_prompts, 2);
        ASSERT_GT(golden_.greedy_len, golden_.prompt_len);
        P_ = golden_.prompt_len;
        N_ = golden_.greedy_len - P_;
        V_ = cpu_model_->config().vocab_size;
    }

    // A model on a CUDA backend with the given activations.
    void load_gpu(bool fp32_activations) {
        CudaBackendOptions options;
        options.fp32_activations = fp32_activations;
        auto gpu = make_cuda_backend(options);
        ASSERT_TRUE(gpu.is_ok()) << gpu.status().message();
        gpu_ = std::move(gpu).value();
        auto model = Model::load(dir_, *gpu_);
        ASSERT_TRUE(model.is_ok()) << model.status().to_string();
        gpu_model_ = std::move(model).value();
    }

    Result<GenerateOutput> generate_golden_prompts(Model& model, DType kv_dtype) const {
        std::vector<GenerateRequest> requests;
        for (const auto& sequence : golden_.greedy) {
            GenerateRequest r;
            r.prompt_ids.assign(sequence.begin(), sequence.begin() + P_);
            r.max_new_tokens = N_;
            r.ignore_eos = true;  // the goldens do not stop at EOS
            requests.push_back(r);
        }
        GenerateKvCache kv_cache;
        kv_cache.dtype = kv_dtype;
        return generate(model, requests, kv_cache);
    }

    std::string dir_;
    std::unique_ptr<Backend> cpu_, gpu_;
    std::unique_ptr<Model> cpu_model_, gpu_model_;
    Golden golden_;
    int64_t P_ = 0, N_ = 0, V_ = 0;
};

TEST_P(GoldenCudaTest, Fp32ActivationsMatchTheGoldensExactly) {
    load_gpu(/*fp32_activations=*/true);
    auto generated = generate_golden_prompts(*gpu_model_, DType::kF32);
    ASSERT_TRUE(generated.is_ok()) << generated.status().to_string();
    for (int64_t b = 0; b < golden_.num_prompts; ++b) {
        const std::vector<int32_t>& sequence = golden_.greedy[static_cast<size_t>(b)];
        EXPECT_EQ(generated->output_ids[static_cast<size_t>(b)],
                  std::vector<int32_t>(sequence.begin() + P_, sequence.end()))
            << "prompt " << b;
    }
    auto want = run(*cpu_model_, golden_.greedy, P_, N_, nullptr, true);
    ASSERT_TRUE(want.is_ok()) << want.status().to_string();
    for (const bool batched : {true, false}) {
        auto got = run(*gpu_model_, golden_.greedy, P_, N_, nullptr, batched);
        ASSERT_TRUE(got.is_ok()) << got.status().to_string();
        const Diff d = compare(std::span<const float>(got->logits), std::span<const float>(want->logits));
        std::printf("measured logits_cuda_fp32 %s (%s): nmse %.3g max_rel %.3g\n", GetParam(),
                    batched ? "batched" : "alone", d.nmse, d.max_rel);
        EXPECT_TRUE(within(d, tolerance("logits_cuda_fp32", DType::kBF16)))
            << (batched ? "batched" : "alone");
    }
}

TEST_P(GoldenCudaTest, Bf16LogitsAndGreedyTokensMatchUpToTheFirstRoutingFlip) {
    load_gpu(/*fp32_activations=*/false);
    auto cpu_probe = RouterProbe::create(dir_, *cpu_model_);
    ASSERT_TRUE(cpu_probe.is_ok()) << cpu_probe.status().to_string();
    auto gpu_probe = RouterProbe::create(dir_, *gpu_model_);
    ASSERT_TRUE(gpu_probe.is_ok()) << gpu_probe.status().to_string();
    const Tolerance& tol = tolerance("logits_cuda", DType::kBF16);
    // The GPU runs as the engine does by default on CUDA: bf16 activations and a bf16 KV cache.
    auto generated = generate_golden_prompts(*gpu_model_, DType::kBF16);
    ASSERT_TRUE(generated.is_ok()) << generated.status().to_string();
    int64_t compared_steps = 0, compared_tokens = 0;
    for (const bool batched : {true, false}) {
        const char* mode = batched ? "batched" : "alone";
        auto want = run(*cpu_model_, golden_.greedy, P_, N_, &*cpu_probe, batched);
        ASSERT_TRUE(want.is_ok()) << want.status().to_string();
        auto got = run(*gpu_model_, golden_.greedy, P_, N_, &*gpu_probe, batched, DType::kBF16);
        ASSERT_TRUE(got.is_ok()) << got.status().to_string();
        for (int64_t b = 0; b < golden_.num_prompts; ++b) {
            const std::vector<int32_t>& sequence = golden_.greedy[static_cast<size_t>(b)];
            // The first position whose expert sets differ in some layer; steps reading it are not compared.
            int64_t flip = P_ + N_;
            for (int64_t p = 0; p < P_ + N_ - 1; ++p) {
                if (got->routes[b][p] != want->routes[b][p]) {
                    flip = p;
                    break;
                }
            }
            // Step i chooses token P + i from position P − 1 + i, which reads every position ≤ P − 1 + i.
            const int64_t steps = std::clamp<int64_t>(flip - (P_ - 1), 0, N_);
            if (flip < P_ + N_) {
                std::printf(
                    "routing flip %s (%s) prompt %lld at position %lld: %lld of %lld steps compared\n",
                    GetParam(), mode, static_cast<long long>(b), static_cast<long long>(flip),
                    static_cast<long long>(steps), static_cast<long long>(N_));
            }
            if (steps == 0) continue;
            const size_t first = static_cast<size_t>(b * N_ * V_), count = static_cast<size_t>(steps * V_);
            const std::span<const float> got_rows(got->logits.data() + first, count);
            const std::span<const float> want_rows(want->logits.data() + first, count);
            const Diff d = compare(got_rows, want_rows);
            std::printf("measured logits_cuda %s (%s) prompt %lld, %lld steps: nmse %.3g max_rel %.3g\n",
                        GetParam(), mode, static_cast<long long>(b), static_cast<long long>(steps), d.nmse,
                        d.max_rel);
            EXPECT_TRUE(within(d, tol)) << mode << " prompt " << b;
            compared_steps += steps;
            if (!batched) continue;
            // generate() runs the batched steps; its tokens equal the golden ones while the margins allow.
            const float threshold = 2.0f * static_cast<float>(tol.max_rel) * max_abs(want_rows);
            const std::vector<int32_t>& tokens = generated->output_ids[static_cast<size_t>(b)];
            ASSERT_EQ(static_cast<int64_t>(tokens.size()), N_);
            for (int64_t i = 0; i < steps; ++i) {
                const int32_t golden_token = sequence[static_cast<size_t>(P_ + i)];
                const std::span<const float> row =
                    want_rows.subspan(static_cast<size_t>(i * V_), static_cast<size_t>(V_));
                ASSERT_EQ(argmax_token(row), golden_token)
                    << "the CPU disagrees with the golden at step " << i;
                const float margin = top1_margin(row);
                if (margin > threshold) {
                    EXPECT_EQ(tokens[static_cast<size_t>(i)], golden_token)
                        << "prompt " << b << " step " << i << ": margin " << margin << " > " << threshold;
                    ++compared_tokens;
                    continue;
                }
                std::printf("low margin %s prompt %lld step %lld: %.3g ≤ %.3g, token %s\n", GetParam(),
                            static_cast<long long>(b), static_cast<long long>(i), margin, threshold,
                            tokens[static_cast<size_t>(i)] == golden_token ? "equal" : "differs");
                if (tokens[static_cast<size_t>(i)] != golden_token)
                    break;  // a different context from here on
            }
        }
    }
    RecordProperty("compared_steps", static_cast<int>(compared_steps));
    RecordProperty("compared_tokens", static_cast<int>(compared_tokens));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GoldenCudaTest, ::testing::ValuesIn(kFixtures),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                             return std::string(info.param);
                         });

}  // namespace
}  // namespace epinfer::test
#endif  // EPINFER_WITH_CUDA
