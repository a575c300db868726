// The model start-up shared by the commands (tools/epinfer/model_setup.h), through `epinfer generate`: the
// memory check refuses a layout that does not fit with one line of breakdown before any weight is read,
// --device cuda in a build without CUDA is one line, so is a layout flag given as 0, the KV pool is sized
// from the flags (its dtype from --kv-cache-dtype), and rank 0 prints one summary line.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "common/cli_runner.h"

namespace epinfer {
namespace {

namespace fs = std::filesystem;

const std::string kModel = std::string(EPINFER_TEST_DATA_DIR) + "/fixtures/deepseek_v3_tiny";

using epinfer::testing::CliResult;
using epinfer::testing::expect_one_line_error;

CliResult run_cli(const std::string& args) { return epinfer::testing::run_epinfer(args); }

std::string generate(const std::string& model, const std::string& flags) {
    return "generate --model '" + model + "' --prompt-ids 12,7,99 --max-new-tokens 2 " + flags;
}

// A scratch checkpoint folder, removed with the object.
struct ScratchModel {
    fs::path dir;
    explicit ScratchModel(const std::string& name)
        : dir(epinfer::testing::cli_scratch_dir("epinfer_setup") / name) {
        fs::create_directories(dir);
    }
    ~ScratchModel() { fs::remove_all(dir.parent_path()); }
    ScratchModel(const ScratchModel&) = delete;
    ScratchModel& operator=(const ScratchModel&) = delete;
    std::string path() const { return dir.string(); }
};

// deepseek_v3_tiny's config.json next to a safetensors file that lacks every model tensor (its golden
// inputs): loading it fails with a missing tensor, so an error about memory proves the check ran first.
struct WeightlessCheckpoint : ScratchModel {
    WeightlessCheckpoint() : ScratchModel("no_weights") {
        fs::copy_file(kModel + "/config.json", dir / "config.json", fs::copy_options::overwrite_existing);
        fs::copy_file(kModel + "/golden.safetensors", dir / "model.safetensors",
                      fs::copy_options::overwrite_existing);
    }
};

TEST(CliModelSetup, LoadingTheWeightlessCheckpointFails) {
    const WeightlessCheckpoint m;
    const CliResult r = run_cli(generate(m.path(), ""));
    expect_one_line_error(r, "missing");
}

// deepseek_v3_tiny without its model.safetensors: one line naming the folder and what was looked for, not
// its golden.safetensors read as weights ("model.embed_tokens.weight: missing ... (and 150 more ...)").
TEST(CliModelSetup, FolderWithoutWeightFileIsOneLine) {
    const ScratchModel m("no_model_safetensors");
    for (const char* f : {"config.json", "generation_config.json", "golden.safetensors"})
        fs::copy_file(kModel + "/" + f, m.dir / f, fs::copy_options::overwrite_existing);
    const CliResult r = run_cli(generate(m.path(), ""));
    expect_one_line_error(r, "epinfer: error: " + m.path() +
                                 ": no model weights: neither model.safetensors.index.json nor "
                                 "model*.safetensors\n");
}

TEST(CliModelSetup, TooLittleMemoryIsOneLineBreakdownBeforeLoading) {
    const WeightlessCheckpoint m;
    const CliResult r = run_cli(generate(m.path(), "--memory-fraction 0.000001"));
    expect_one_line_error(r, "tp1 does not fit: per rank, weights ");
    for (const char* part : {"+ buffers ", "+ activations ", "+ KV of 512 tokens (one request of max_position_embeddings)",
                             "> usable ", "= 1e-06 × ", "cpu: MemAvailable / 1 rank of this host",
                             "largest term: ", "--memory-fraction"})
        EXPECT_NE(r.err.find(part), std::string::npos) << "'" << part << "' not in: " << r.err;
    EXPECT_EQ(r.err.find("missing"), std::string::npos) << r.err;
}

TEST(CliModelSetup, TooManyKvTokensIsOneLineBreakdownBeforeLoading) {
    // 10^11 tokens · 3 layers · (32 + 8) latent elements · 4 B = 43.7 TiB.
    const WeightlessCheckpoint m;
    const CliResult r = run_cli(generate(m.path(), "--kv-cache-tokens 100000000000"));
    expect_one_line_error(r, "KV of 100000000000 tokens (--kv-cache-tokens) 43.7 TiB");
    EXPECT_NE(r.err.find("largest term: KV 43.7 TiB"), std::string::npos) << r.err;
}

TEST(CliModelSetup, CudaWithoutCudaBuildIsOneLine) {
#if EPINFER_WITH_CUDA
    GTEST_SKIP() << "this build has the CUDA backend";
#else
    const std::string no_cuda = "--device cuda: this build has no CUDA (configure with -DEPINFER_CUDA=ON)";
    expect_one_line_error(run_cli(generate(kModel, "--device cuda")), no_cuda);
    // Refused before a layout re-runs the command under mpirun: one line, not one per rank.
    expect_one_line_error(run_cli(generate(kModel, "--device cuda --ep 2")), no_cuda);
    expect_one_line_error(run_cli("bench comm --ranks 2 --device cuda"), no_cuda);
    expect_one_line_error(run_cli("bench ep --ranks 2 --device cuda"), no_cuda);
#endif
}

TEST(CliModelSetup, SummaryLineAndKvPoolFromFlags) {
    // generate with --kv-cache-tokens 0: the request's 3 + 2 tokens in whole blocks, what it allocates (the
    // line said 2048 tokens, bench's size below, while generate sized its own pool).
    CliResult r = run_cli(generate(kModel, "--max-running 4"));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.err.find("epinfer: ready in "), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(": deepseek_v3 (3 layers), layout tp1 ep1 pp1 dp1 on cpu, per rank: weights "),
              std::string::npos)
        << r.err;
    EXPECT_NE(r.err.find(", KV cache 16 tokens (1 block of 16, fp32)\n"), std::string::npos) << r.err;
    // bench (serve alike) on cpu with --kv-cache-tokens 0: what fits, at most --max-running ×
    // max_position_embeddings (4 × 512 = 2048 tokens = 128 blocks of 16).
    r = run_cli("bench --model '" + kModel +
                "' --max-running 4 --concurrency 1 --num-prompts 1 --input-len 2 --output-len 1 --warmup 0 "
                "--threads 2");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.err.find(", KV cache 2048 tokens (128 blocks of 16, fp32)\n"), std::string::npos) << r.err;
    // An explicit size rounds down to whole blocks: 1000 tokens = 31 blocks of 32.
    r = run_cli(generate(kModel, "--kv-cache-tokens 1000 --block-size 32"));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.err.find(", KV cache 992 tokens (31 blocks of 32, fp32)\n"), std::string::npos) << r.err;
}

// Comma-separated ids as generate prints them.
std::vector<std::string> split_ids(const std::string& line) {
    std::vector<std::string> ids;
    std::stringstream in(line);
    for (std::string id; std::getline(in, id, ',');) ids.push_back(id);
    if (!ids.empty() && !ids.back().empty() && ids.back().back() == '\n') ids.back().pop_back();
    return ids;
}

// --kv-cache-dtype: auto is fp32 on the CPU backend (the exact reference); bf16 runs with a bf16 pool,
// whose rounding reaches the greedy tokens only after a while (on an MLA and a GQA fixture the first 16
// of 48 tokens agree with fp32's, the 48 do not: the flag reaches the pool); the memory check prices
// 2 bytes per element; an unknown value is one line naming it.
TEST(CliModelSetup, KvCacheDtypeChoosesThePoolsElement) {
    for (const char* fixture : {"deepseek_v3_tiny", "qwen3_moe_tiny"}) {
        SCOPED_TRACE(fixture);
        const std::string dir = std::string(EPINFER_TEST_DATA_DIR) + "/fixtures/" + fixture;
        const auto run = [&](const std::string& flags) {
            return run_cli("generate --model '" + dir +
                           "' --prompt-ids 12,7,99 --max-new-tokens 48 --ignore-eos --threads 2 " + flags);
        };
        const CliResult automatic = run("");
        const CliResult fp32 = run("--kv-cache-dtype fp32");
        const CliResult bf16 = run("--kv-cache-dtype bf16");
        ASSERT_EQ(automatic.exit_code, 0) << automatic.err;
        ASSERT_EQ(fp32.exit_code, 0) << fp32.err;
        ASSERT_EQ(bf16.exit_code, 0) << bf16.err;
        EXPECT_NE(automatic.err.find(" blocks of 16, fp32)\n"), std::string::npos) << automatic.err;
        EXPECT_NE(bf16.err.find(" blocks of 16, bf16)\n"), std::string::npos) << bf16.err;
        EXPECT_EQ(automatic.out, fp32.out);
        const std::vector<std::string> want = split_ids(fp32.out), got = split_ids(bf16.out);
        ASSERT_EQ(want.size(), 48u) << fp32.out;
        ASSERT_EQ(got.size(), 48u) << bf16.out;
        EXPECT_EQ(std::vector<std::string>(got.begin(), got.begin() + 16),
                  std::vector<std::string>(want.begin(), want.begin() + 16));
        EXPECT_NE(got, want) << "the bf16 pool's rounding never reached a token: is the pool fp32?";
    }
    // 10^11 tokens · 3 layers · (32 + 8) latent elements · 2 B = 21.8 TiB (fp32: 43.7 TiB, above).
    const WeightlessCheckpoint m;
    const CliResult r = run_cli(generate(m.path(), "--kv-cache-tokens 100000000000 --kv-cache-dtype bf16"));
    expect_one_line_error(r, "KV of 100000000000 tokens (--kv-cache-tokens) 21.8 TiB");

    expect_one_line_error(run_cli(generate(kModel, "--kv-cache-dtype fp16")),
                          "--kv-cache-dtype 'fp16': expected auto, bf16 or fp32");
    expect_one_line_error(run_cli(generate(kModel, "--kv-cache-dtype ' bf16'")),
                          "--kv-cache-dtype ' bf16': expected auto, bf16 or fp32");
    // A bad value is named before the device is checked (a CPU-only build used to answer "no CUDA").
    expect_one_line_error(run_cli(generate(kModel, "--device cuda --kv-cache-dtype fp16")),
                          "--kv-cache-dtype 'fp16': expected auto, bf16 or fp32");
}

// An explicit --kv-cache-tokens is generate's pool (it sized its own for the request and ignored the flag
// that the summary line and the memory check reported): a request of more tokens is one line naming both,
// before any weight is read (the weightless checkpoint would fail to load), in whole blocks of --block-size.
TEST(CliModelSetup, GenerateHonoursKvCacheTokens) {
    const auto run = [](const std::string& model, const std::string& flags) {
        return run_cli("generate --model '" + model + "' --prompt-ids 12,7,99 --ignore-eos --threads 2 " +
                       flags);
    };
    const WeightlessCheckpoint m;
    expect_one_line_error(
        run(m.path(), "--max-new-tokens 30 --kv-cache-tokens 32"),
        "prompt of 3 tokens + --max-new-tokens 30 = 33 tokens exceed the KV cache of 32 tokens "
        "per rank (--kv-cache-tokens 32, in blocks of --block-size 16)");
    expect_one_line_error(
        run(m.path(), "--max-new-tokens 30 --kv-cache-tokens 40"),
        "= 33 tokens exceed the KV cache of 32 tokens per rank (--kv-cache-tokens 40, in blocks "
        "of --block-size 16)");
    expect_one_line_error(run(m.path(), "--max-new-tokens 30 --kv-cache-tokens 40 --block-size 8"),
                          "missing");
    const CliResult fits = run(kModel, "--max-new-tokens 29 --kv-cache-tokens 32");
    ASSERT_EQ(fits.exit_code, 0) << fits.err;
    EXPECT_EQ(split_ids(fits.out).size(), 29u) << fits.out;
    EXPECT_NE(fits.err.find(", KV cache 32 tokens (2 blocks of 16, fp32)\n"), std::string::npos) << fits.err;
}

TEST(CliModelSetup, BadFlagsAreOneLineNamingTheFlag) {
    expect_one_line_error(run_cli(generate(kModel, "--device tpu")), "--device 'tpu' is not one of cpu, cuda");
    expect_one_line_error(run_cli(generate(kModel, "--block-size 0")), "--block-size must be in [1, 4096], got 0");
    expect_one_line_error(run_cli(generate(kModel, "--max-running abc")), "--max-running 'abc' is not an integer");
    expect_one_line_error(run_cli(generate(kModel, "--memory-fraction 1.5")),
                          "--memory-fraction must be in (0, 1], got 1.5");
    expect_one_line_error(run_cli(generate(kModel, "--kv-cache-tokens -1")), "--kv-cache-tokens");
    expect_one_line_error(run_cli(generate(kModel, "--kv-cache-tokens 8 --block-size 16")),
                          "a KV cache of 8 tokens per rank holds no block of --block-size 16");
}

// A layout flag given explicitly must be ≥ 1: "--tp 0" is an error, not "--tp not given" (which the
// summary line test above covers: layout tp1 ep1 pp1 dp1).
TEST(CliModelSetup, ExplicitZeroOrNegativeLayoutFlagIsOneLine) {
    for (const char* flag : {"--tp", "--ep", "--dp", "--pp"}) {
        SCOPED_TRACE(flag);
        expect_one_line_error(run_cli(generate(kModel, std::string(flag) + " 0")),
                              std::string(flag) + " must be ≥ 1, got 0");
        expect_one_line_error(run_cli(generate(kModel, std::string(flag) + " -2")),
                              std::string(flag) + " must be ≥ 1, got -2");
    }
    expect_one_line_error(run_cli(generate(kModel, "--ep 2 --tp=0")), "--tp must be ≥ 1, got 0");
    expect_one_line_error(run_cli(generate(kModel, "--dp four")), "--dp 'four' is not an integer");
    expect_one_line_error(run_cli(generate(kModel, "--tp ''")), "--tp '' is not an integer");
    expect_one_line_error(run_cli(generate(kModel, "--pp 2000000")), "--pp must be ≤ 1048576, got 2000000");
}

// gpt-oss is planned, not run: one line naming the architecture, before any weight is read.
TEST(CliModelSetup, GptOssIsNotRun) {
    const ScratchModel m("gpt_oss");
    fs::copy_file(std::string(EPINFER_TEST_DATA_DIR) + "/configs/gpt_oss_120b.json", m.dir / "config.json",
                  fs::copy_options::overwrite_existing);
    expect_one_line_error(run_cli(generate(m.path(), "")),
                          "GptOssForCausalLM (model_type gpt_oss) is not supported by the runtime");
}

}  // namespace
}  // namespace epinfer
