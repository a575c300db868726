// The goldens of one fixture (tests/data/fixtures/<name>/golden.safetensors, from transformers 5.17 through
// gen_fixtures.py): the prompts, their greedy continuation, the prefill logits and per-layer activations,
// as host vectors. Shared by the golden tests on CPU, on CUDA and under parallel layouts.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"

namespace epinfer::test {

struct Golden {
    int64_t num_prompts = 0, prompt_len = 0, greedy_len = 0;  // B, P, P + N
    std::vector<std::vector<int32_t>> prompts;                 // [B][P] "input_ids"
    std::vector<std::vector<int32_t>> greedy;                  // [B][P + N] prompt, then greedy tokens
    std::vector<float> logits;                                 // [B·P, V] prefill logits
    std::map<std::string, std::vector<float>> per_layer;       // "mlp_out.l", "hidden.l" → [B·P, H]
};

// dir/golden.safetensors; a file that cannot be read fails the calling test (EXPECT) and gives an empty
// Golden.
inline Golden load_golden(const std::string& dir) {
    const auto read_i64 = [](const SafetensorsFile& file, const TensorInfo& info) {
        std::vector<int64_t> out(static_cast<size_t>(info.numel()));
        std::memcpy(out.data(), file.data(info), out.size() * sizeof(int64_t));
        return out;
    };
    const auto read_f32 = [](const SafetensorsFile& file, const TensorInfo& info) {
        std::vector<float> out(static_cast<size_t>(info.numel()));
        std::memcpy(out.data(), file.data(info), out.size() * sizeof(float));
        return out;
    };
    const auto rows_i32 = [](const std::vector<int64_t>& flat, int64_t rows, int64_t cols) {
        std::vector<std::vector<int32_t>> out(static_cast<size_t>(rows));
        for (int64_t r = 0; r < rows; ++r)
            for (int64_t c = 0; c < cols; ++c)
                out[static_cast<size_t>(r)].push_back(static_cast<int32_t>(flat[static_cast<size_t>(r * cols + c)]));
        return out;
    };
    Golden g;
    auto file = SafetensorsFile::open(dir + "/golden.safetensors");
    EXPECT_TRUE(file.is_ok()) << file.status().to_string();
    if (!file.is_ok()) return g;
    for (const TensorInfo& info : (*file)->tensors()) {
        if (info.name == "input_ids") {
            g.num_prompts = info.shape[0];
            g.prompt_len = info.shape[1];
            g.prompts = rows_i32(read_i64(**file, info), info.shape[0], info.shape[1]);
        } else if (info.name == "greedy") {
            g.greedy_len = info.shape[1];
            g.greedy = rows_i32(read_i64(**file, info), info.shape[0], info.shape[1]);
        } else if (info.name == "logits") {
            g.logits = read_f32(**file, info);
        } else if (info.name.rfind("mlp_out.", 0) == 0 || info.name.rfind("hidden.", 0) == 0) {
            g.per_layer[info.name] = read_f32(**file, info);
        }
    }
    return g;
}

}  // namespace epinfer::test
