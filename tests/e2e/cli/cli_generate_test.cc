// `epinfer generate` as a user runs it (the built binary, EPINFER_CLI_PATH): greedy tokens equal to the
// transformers golden of deepseek_v3_tiny, deterministic sampling, and one-line errors with exit status
// 1 for bad input.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/safetensors.h"
#include "common/cli_runner.h"

namespace epinfer {
namespace {

const std::string kModel = std::string(EPINFER_TEST_DATA_DIR) + "/fixtures/deepseek_v3_tiny";

using epinfer::testing::CliResult;
using epinfer::testing::expect_one_line_error;

CliResult run_cli(const std::string& args) { return epinfer::testing::run_epinfer(args); }

std::string join(const std::vector<int64_t>& ids) {
    std::string s;
    for (size_t i = 0; i < ids.size(); ++i) {
        if (i > 0) s += ',';
        s += std::to_string(ids[i]);
    }
    return s;
}

// Prompt p of the golden input_ids and its 6 greedy tokens.
void golden_prompt(size_t p, std::vector<int64_t>& prompt, std::vector<int64_t>& greedy_new) {
    auto file = SafetensorsFile::open(kModel + "/golden.safetensors");
    ASSERT_TRUE(file.is_ok()) << file.status().to_string();
    const TensorInfo* ids = (*file)->find("input_ids");
    const TensorInfo* greedy = (*file)->find("greedy");
    ASSERT_TRUE(ids && greedy);
    const int64_t P = ids->shape[1], G = greedy->shape[1];
    std::vector<int64_t> all_ids(ids->numel()), all_greedy(greedy->numel());
    std::memcpy(all_ids.data(), (*file)->data(*ids), all_ids.size() * 8);
    std::memcpy(all_greedy.data(), (*file)->data(*greedy), all_greedy.size() * 8);
    prompt.assign(all_ids.begin() + p * P, all_ids.begin() + (p + 1) * P);
    greedy_new.assign(all_greedy.begin() + p * G + P, all_greedy.begin() + (p + 1) * G);
}

TEST(CliGenerate, JsonGreedyEqualsGoldenTokens) {
    for (size_t p = 0; p < 2; ++p) {
        std::vector<int64_t> prompt, want;
        golden_prompt(p, prompt, want);
        const CliResult r = run_cli("generate --model " + kModel + " --prompt-ids " + join(prompt) +
                                    " --max-new-tokens 6 --json --ignore-eos");
        ASSERT_EQ(r.exit_code, 0) << r.err;
        const auto j = nlohmann::json::parse(r.out);  // exactly one JSON object
        EXPECT_EQ(j.at("output_ids").get<std::vector<int64_t>>(), want) << r.out;
        EXPECT_EQ(j.at("prompt_ids").get<std::vector<int64_t>>(), prompt);
        EXPECT_GT(j.at("prefill_tokens_per_s").get<double>(), 0.0);
        EXPECT_GT(j.at("decode_tokens_per_s").get<double>(), 0.0);
        EXPECT_NE(r.err.find("prefill"), std::string::npos) << r.err;
        EXPECT_NE(r.err.find("decode"), std::string::npos) << r.err;
    }
}

// `generate` on golden prompt 0 for 6 new tokens (--ignore-eos) with `flags`; greedy_new: its golden tokens.
CliResult generate_on_golden_prompt(const std::string& flags, std::vector<int64_t>& greedy_new) {
    std::vector<int64_t> prompt;
    golden_prompt(0, prompt, greedy_new);
    return run_cli("generate --model " + kModel + " --prompt-ids " + join(prompt) +
                   " --max-new-tokens 6 --ignore-eos" + flags);
}

TEST(Cli, VersionPrintsTheProjectVersion) {
    const CliResult r = run_cli("--version");
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_TRUE(std::regex_match(r.out, std::regex("epinfer [0-9]+\\.[0-9]+\\.[0-9]+\n"))) << r.out;
}

TEST(CliGenerate, TextOutputListsNewIds) {
    std::vector<int64_t> want;
    const CliResult r = generate_on_golden_prompt("", want);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, join(want) + "\n");
    EXPECT_NE(r.err.find("tokens/s"), std::string::npos) << r.err;
}

TEST(CliGenerate, AnUnderflowingTemperatureReadsAsZeroThatIsGreedy) {
    // 1e-400 is below double's smallest magnitude: read as 0 (as the server's JSON parser reads it), not
    // refused.
    std::vector<int64_t> want;
    const CliResult r = generate_on_golden_prompt(" --temperature 1e-400 --seed 3", want);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, join(want) + "\n");
}

TEST(CliGenerate, SamplingIsDeterministicForASeed) {
    const std::string args =
        "generate --model " + kModel +
        " --prompt-ids 12,7,99 --max-new-tokens 8 --temperature 0.9 --top-p 0.95 --top-k 40 "
        "--ignore-eos --seed ";
    const CliResult a = run_cli(args + "11"), b = run_cli(args + "11");
    ASSERT_EQ(a.exit_code, 0) << a.err;
    EXPECT_EQ(a.out, b.out);
    EXPECT_EQ(std::count(a.out.begin(), a.out.end(), ','), 7);
}

TEST(CliGenerate, BadInputIsOneLineErrorNamingTheValue) {
    const std::string gen = "generate --model " + kModel + " ";
    expect_one_line_error(run_cli("generate --model /nonexistent/epinfer_dir --prompt-ids 1,2"),
                          "/nonexistent/epinfer_dir");
    const auto empty_dir =
        std::filesystem::temp_directory_path() / ("epinfer_empty_" + std::to_string(::getpid()));
    std::filesystem::create_directories(empty_dir);
    expect_one_line_error(run_cli("generate --model " + empty_dir.string() + " --prompt-ids 1,2"),
                          "config.json");
    std::filesystem::remove_all(empty_dir);
    expect_one_line_error(run_cli(gen + "--prompt-ids ''"), "--prompt-ids '' has an empty item");
    expect_one_line_error(run_cli(gen + "--prompt-ids 12,320"), "320");  // vocab_size 320
    expect_one_line_error(run_cli(gen + "--prompt-ids=3,-5"), "-5");
    expect_one_line_error(run_cli(gen + "--prompt-ids 12,abc,7"), "abc");
    expect_one_line_error(run_cli(gen + "--prompt-ids 99999999999"), "99999999999");
    expect_one_line_error(run_cli(gen + "--prompt-ids 1,2 --max-new-tokens 0"), "0");
    expect_one_line_error(run_cli(gen + "--prompt-ids 1,2 --max-new-tokens abc"), "abc");
    expect_one_line_error(run_cli(gen + "--prompt-ids 1,2,3 --max-new-tokens 600"), "512");  // max positions
    expect_one_line_error(run_cli(gen + "--prompt-ids 1,2 --top-p 1.5"), "1.5");
    expect_one_line_error(run_cli(gen + "--prompt-ids 1,2 --threads 1000000"), "1000000");
}

// The errors name the flags the user typed, not the fields of the engine's GenerateRequest (prompt_ids,
// max_new_tokens, top_p, ...), which its own checks name.
TEST(CliGenerate, RequestErrorsNameTheFlags) {
    const std::vector<std::pair<std::string, std::string>> cases = {
        {"--prompt-ids ''", "generate: --prompt-ids '' has an empty item"},
        {"--prompt-ids 1,,2", "generate: --prompt-ids '1,,2' has an empty item"},
        {"--prompt-ids 12,320", "--prompt-ids: token id 320 is outside [0, vocab_size 320) of config.json"},
        {"--prompt-ids 99999999999", "--prompt-ids: token id 99999999999 is outside the int32 range"},
        {"--prompt-ids 1,2 --max-new-tokens 0",
         "--max-new-tokens must be in [1, 9223372036854775807], got 0"},
        {"--prompt-ids 1,2 --max-new-tokens -3",
         "--max-new-tokens must be in [1, 9223372036854775807], got -3"},
        {"--prompt-ids 1,2,3 --max-new-tokens 600",
         "--max-new-tokens 600 after a prompt of 3 tokens (--prompt-ids) exceeds max_position_embeddings 512 "
         "of config.json (at most 509 new tokens)"},
        {"--prompt-ids 1 --temperature -1", "--temperature must be ≥ 0 (0: greedy), got -1"},
        {"--prompt-ids 1 --top-k -1", "--top-k must be in [0, 9223372036854775807], got -1"},
        {"--prompt-ids 1 --top-p 1.5", "--top-p must be in (0, 1], got 1.5"},
        {"--prompt-ids 1 --top-p 0", "--top-p must be in (0, 1], got 0"},
        {"--prompt-ids 1 --top-k 5", "--top-k 5 applies to sampled tokens: give --temperature > 0"},
        {"--prompt-ids 1 --seed 18446744073709551616",
         "--seed '18446744073709551616' is not an integer in [0, "
         "18446744073709551615]"},
        {"--prompt-ids 1 --temperature 1e400", "--temperature '1e400' is not a finite number"},
        {"--prompt-ids 1 --top-p 0.5", "--top-p 0.5 applies to sampled tokens: give --temperature > 0"},
    };
    for (const auto& [args, message] : cases) {
        SCOPED_TRACE(args);
        expect_one_line_error(run_cli("generate --model " + kModel + " " + args), message);
    }
}

// A checkpoint whose final norm weight is NaN gives an error, never made-up tokens.
TEST(CliGenerate, NonFiniteLogitsAreAnError) {
    const auto dir = std::filesystem::temp_directory_path() / ("epinfer_nan_" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    for (const char* f : {"config.json", "generation_config.json", "model.safetensors"})
        std::filesystem::copy_file(kModel + "/" + f, dir / f);
    const std::string path = (dir / "model.safetensors").string();
    uint64_t data_begin = 0;
    {
        auto file = SafetensorsFile::open(path);
        ASSERT_TRUE(file.is_ok()) << file.status().message();
        const TensorInfo* info = (*file)->find("model.norm.weight");
        ASSERT_NE(info, nullptr);
        ASSERT_EQ(info->dtype, DType::kBF16);
        data_begin = info->data_begin;
    }
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    uint64_t header_bytes = 0;
    f.read(reinterpret_cast<char*>(&header_bytes), 8);
    f.seekp(static_cast<std::streamoff>(8 + header_bytes + data_begin));
    const uint16_t nan_bf16 = 0x7fc0;
    for (int i = 0; i < 64; ++i) f.write(reinterpret_cast<const char*>(&nan_bf16), 2);  // H = 64
    f.close();
    // It fails after start-up: the start-up summary line, then the one error line.
    const CliResult r = run_cli("generate --model " + dir.string() + " --prompt-ids 12,7,99 --max-new-tokens 4");
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
    EXPECT_EQ(r.err.rfind("epinfer: ready in ", 0), 0u) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 2) << r.err;
    const size_t error_line = r.err.find("\nepinfer: error: ");
    ASSERT_NE(error_line, std::string::npos) << r.err;
    EXPECT_NE(r.err.find("non-finite", error_line), std::string::npos) << r.err;
    std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace epinfer
