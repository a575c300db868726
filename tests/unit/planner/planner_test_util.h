// Hand-built ModelConfigs and a round-number hardware profile for the planner tests.
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "checkpoint/hf_config.h"
#include "checkpoint/model_config.h"
#include "planner/cost_model.h"
#include "planner/hardware_profile.h"
#include "planner/model_costs.h"

namespace epinfer::planner::testing {

// The costs of tests/data/configs/`name` (a config.json); a parse failure fails the test.
inline ModelCosts config_file_costs(const std::string& name) {
    const std::string path = std::string(EPINFER_TEST_DATA_DIR) + "/configs/" + name;
    std::ifstream in(path, std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    auto config = parse_hf_config(text.str(), path);
    EXPECT_TRUE(config.is_ok()) << config.status().message();
    return config.is_ok() ? model_costs(*config) : ModelCosts{};
}

// Kimi K2 Instruct 0905 as its config.json (tests/data/configs/kimi_k2_instruct_0905.json) describes it.
inline ModelConfig kimi_k2_config() {
    ModelConfig c;
    c.architecture = Architecture::kDeepseekV3;
    c.model_type = "kimi_k2";
    c.vocab_size = 163840;
    c.hidden_size = 7168;
    c.num_hidden_layers = 61;
    c.attention = AttentionKind::kMla;
    c.num_attention_heads = 64;
    c.num_key_value_heads = 64;
    c.head_dim = 192;
    c.q_lora_rank = 1536;
    c.kv_lora_rank = 512;
    c.qk_nope_head_dim = 128;
    c.qk_rope_head_dim = 64;
    c.v_head_dim = 128;
    c.intermediate_size = 18432;
    c.n_routed_experts = 384;
    c.moe_intermediate_size = 2048;
    c.n_shared_experts = 1;
    c.router.num_experts_per_tok = 8;
    c.router.has_correction_bias = true;
    c.layer_is_moe.assign(61, true);
    c.layer_is_moe[0] = false;  // first_k_dense_replace = 1
    c.quant_method = "fp8";
    return c;
}

// A small GQA MoE model with round numbers: H 1024, 8 heads of 128 (8 KV heads), 4 MoE layers of 8 experts
// (top-2, width 512), vocab 1000.
inline ModelConfig tiny_gqa_config() {
    ModelConfig c;
    c.architecture = Architecture::kQwen3Moe;
    c.model_type = "qwen3_moe";
    c.vocab_size = 1000;
    c.hidden_size = 1024;
    c.num_hidden_layers = 4;
    c.attention = AttentionKind::kGqa;
    c.num_attention_heads = 8;
    c.num_key_value_heads = 8;
    c.head_dim = 128;
    c.n_routed_experts = 8;
    c.moe_intermediate_size = 512;
    c.router.num_experts_per_tok = 2;
    c.layer_is_moe.assign(4, true);
    return c;
}

// 4 GPUs per node; 1000 GB/s, 100 TFLOP/s at every precision, efficiencies 1, no launch overhead;
// all_reduce 10 µs + 100 GB/s, all_to_all 20 µs + 50 GB/s, all_gather 10 µs + 100 GB/s,
// send_recv 5 µs + 200 GB/s; inter-node: every collective 50 µs + 10 GB/s.
inline std::string round_profile_json() {
    auto link = [](const char* kind, double ar_lat, double ar_bw, double a2a_lat, double a2a_bw,
                   double sr_lat, double sr_bw) {
        auto c = [](double lat, double bw) {
            return "{\"latency_us\": " + std::to_string(lat) +
                   ", \"bus_bandwidth_gbps\": " + std::to_string(bw) + "}";
        };
        return std::string("{\"kind\": \"") + kind + "\", \"all_reduce\": " + c(ar_lat, ar_bw) +
               ", \"all_gather\": " + c(ar_lat, ar_bw) + ", \"all_to_all\": " + c(a2a_lat, a2a_bw) +
               ", \"send_recv\": " + c(sr_lat, sr_bw) + "}";
    };
    return std::string(R"({"schema": "epinfer.hardware_profile/1", "name": "round", "gpus_per_node": 4,
        "gpu": {"name": "Round GPU", "memory_bytes": 10000000000, "usable_memory_fraction": 1.0,
                "memory_bandwidth_gbps": 1000, "bf16_tflops": 100, "fp8_tflops": 100, "fp4_tflops": 100,
                "kernel_launch_us": 0, "graph_kernel_us": 0, "memory_efficiency": 1.0,
                "matmul_efficiency": 1.0},
        "intra_node": )") +
           link("nvlink", 10, 100, 20, 50, 5, 200) +
           ", \"inter_node\": " + link("infiniband", 50, 10, 50, 10, 50, 10) + "}";
}

// The round-number model of tiny_gqa_config() priced on the profile hw_ that a derived fixture's SetUp sets:
// CostInputs of 100 context tokens per request, and a step's collective term by name.
class TinyModelCosts : public ::testing::Test {
protected:
    CostInputs inputs(ParallelLayout layout, int nodes = 1) const {
        CostInputs in;
        in.model = &model_;
        in.hardware = &hw_;
        in.layout = layout;
        in.nodes = nodes;
        in.context_tokens = 100;
        return in;
    }
    // tp1 inputs of a closed loop: prompts of input_len, output_len tokens each, steps of step_tokens.
    CostInputs closed_loop_inputs(int64_t input_len, int64_t output_len, int64_t step_tokens) const {
        CostInputs in = inputs(ParallelLayout{1, 1, 1, 1, 1});
        in.input_len = input_len;
        in.output_len = output_len;
        in.max_step_tokens = step_tokens;
        return in;
    }
    // The term `what` of s.collectives; null when absent.
    static const CollectiveTerm* term(const StepBreakdown& s, const std::string& what) {
        for (const CollectiveTerm& t : s.collectives) {
            if (t.what == what) return &t;
        }
        return nullptr;
    }
    HardwareProfile hw_;
    ModelCosts model_ = model_costs(tiny_gqa_config());
};

}  // namespace epinfer::planner::testing
