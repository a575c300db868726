// The grouped expert GEMM's kWide tile (backend/cuda/kernels/moe_grouped_gemm.cuh) on both of its kernels —
// kAuto (wgmma on H100/H200 with sm_90a in the build) and kMmaSync (the portable kernel) —, its kNarrow tile
// (unsplit, and split in K with a split past K's end), and its kGemv tile at each tile
// height (moe_grouped_gemv.cuh; groups of more rows than a tile take several tiles) against
// a host reference on fresh random bf16 weights and rows: group sizes around the warpgroup (64) and tile
// (128) edges, empty groups, K not a multiple of the 64-wide stage, outputs not a multiple of the tile,
// gathered rows (x_row_of_row with repeats), an extra (shared-expert) group, and per-expert weight pointers.
// The reference sums in double and rounds the output to bf16 where the kernel does, so the bound
// (tolerances.h "moe_grouped_gemm_cuda") measures fp32 accumulation order only.
#if EPINFER_WITH_CUDA
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/kernels/moe_grouped_gemm.cuh"
#include "backend/cuda/kernels/moe_grouped_gemv.cuh"
#include "common/compare.h"
#include "cuda_test_util.h"
#include "planner/engine_facts.h"

namespace epinfer::test {
namespace {

struct GemmCase {
    std::string name;
    std::vector<int32_t> group_rows;  // rows of each group; the last is the extra group when `extra`
    int64_t in_features;              // Kd
    int64_t out_features;             // N
    bool swiglu;
    bool extra;        // the last group's weights come from extra_weights
    bool weight_ptrs;  // per-group weight pointers instead of one stacked tensor
};

void PrintTo(const GemmCase& c, std::ostream* os) { *os << c.name; }

// Appends the reference's N outputs of one row xr [Kd] against weights w [N_w, Kd]: bf16(xr · Wᵀ) or, for
// SwiGLU, bf16(silu(xr·gateᵀ) · (xr·upᵀ)); dot products in double, SwiGLU in fp32 as the kernel's epilogue.
void append_reference_row(const std::vector<uint16_t>& w, const uint16_t* xr, int64_t kd, int64_t n,
                          bool swiglu, std::vector<float>& out) {
    for (int64_t f = 0; f < n; ++f) {
        double a = 0.0, b = 0.0;
        for (int64_t k = 0; k < kd; ++k) {
            const double xv = bf16_to_f32(xr[k]);
            a += xv * bf16_to_f32(w[static_cast<size_t>(f * kd + k)]);
            if (swiglu) b += xv * bf16_to_f32(w[static_cast<size_t>((n + f) * kd + k)]);
        }
        const float g_f = static_cast<float>(a), u_f = static_cast<float>(b);
        out.push_back(bf16_round(swiglu ? g_f / (1.0f + std::exp(-g_f)) * u_f : g_f));
    }
}

// out [rows, N] of the reference: per row r of group g, the outputs of x[x_row[r]] against W_g.
std::vector<float> reference(const GemmCase& c, const std::vector<std::vector<uint16_t>>& weights,
                             const std::vector<uint16_t>& x, const std::vector<int32_t>& x_row) {
    const int64_t kd = c.in_features;
    std::vector<float> out;
    int64_t row = 0;
    for (size_t g = 0; g < c.group_rows.size(); ++g) {
        for (int32_t i = 0; i < c.group_rows[g]; ++i, ++row) {
            const uint16_t* xr = x.data() + static_cast<int64_t>(x_row[static_cast<size_t>(row)]) * kd;
            append_reference_row(weights[g], xr, kd, c.out_features, c.swiglu, out);
        }
    }
    return out;
}

// The planner counts no f32→bf16 kernel in MoE steps the gemv tile takes (engine_facts.h).
static_assert(planner::kEngineMoeGemvMaxTokens == cuda::kGemvMaxRows, "the planner's gemv token limit");

// An fp32 copy of bf16 values x, each moved by a random relative amount below 2^-10 — less than half a bf16
// spacing either side — so that rounding to nearest even gives back x: the input of a launch with x_f32.
std::vector<float> fp32_rounding_to(const std::vector<uint16_t>& x, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> out(x.size());
    for (size_t i = 0; i < x.size(); ++i) out[i] = bf16_to_f32(x[i]) * (1.0f + u(rng) * 0x1p-10f);
    return out;
}

// Runs `args` (a gemv launch that gave `bits` on the bf16 x) again on an fp32 x that rounds to it, with
// x_f32: the same bits. out_elems: the output's bf16 elements.
void expect_same_bits_from_fp32_x(const cuda::MoeGroupedGemmArgs& args, const std::vector<uint16_t>& x,
                                  uint32_t seed, size_t out_elems, const std::vector<uint16_t>& bits,
                                  const std::string& what) {
    cuda::CudaBuffer d_x32 = upload(fp32_rounding_to(x, seed));
    cuda::CudaBuffer d_out32 = poisoned<uint16_t>(out_elems);
    cuda::MoeGroupedGemmArgs f32 = args;
    f32.x = d_x32.data();
    f32.x_f32 = true;
    f32.out = d_out32.data();
    ASSERT_EQ(cuda::launch_moe_grouped_gemm(f32, nullptr), cudaSuccess) << what;
    EXPECT_EQ(download<uint16_t>(d_out32.data(), out_elems), bits) << what;
}

class MoeGroupedGemmCudaTest : public CudaTest, public ::testing::WithParamInterface<GemmCase> {};

TEST_P(MoeGroupedGemmCudaTest, EveryTileMatchesHostReference) {
    const GemmCase& c = GetParam();
    const int64_t kd = c.in_features, n = c.out_features, n_w = c.swiglu ? 2 * n : n;
    const int64_t num_groups = static_cast<int64_t>(c.group_rows.size());
    const int64_t num_weight_groups = c.extra ? num_groups - 1 : num_groups;
    const int64_t rows = std::accumulate(c.group_rows.begin(), c.group_rows.end(), int64_t{0});
    const int64_t rows_x = rows / 2 + 3;  // fewer x rows than GEMM rows: gathered rows repeat
    const uint32_t seed = static_cast<uint32_t>(rows * 7 + kd + n);
    const float scale = 1.0f / std::sqrt(static_cast<float>(kd));

    std::vector<std::vector<uint16_t>> weights;  // [G][N_w, Kd]
    for (int64_t g = 0; g < num_groups; ++g)
        weights.push_back(random_bf16(static_cast<size_t>(n_w * kd), seed + 10 + static_cast<uint32_t>(g), scale));
    const std::vector<uint16_t> x = random_bf16(static_cast<size_t>(rows_x * kd), seed + 1, 1.0f);
    std::vector<int32_t> x_row(static_cast<size_t>(rows));
    std::mt19937 rng(seed + 2);
    for (int32_t& r : x_row) r = static_cast<int32_t>(rng() % static_cast<uint32_t>(rows_x));

    std::vector<int32_t> begin, end;
    int32_t row = 0;
    for (int32_t r : c.group_rows) {
        begin.push_back(row);
        end.push_back(row + r);
        row += r;
    }
    // group_tile_offsets of a tile shape (moe_permute's, on the host).
    const auto tile_offsets_of = [&](int64_t tile_rows) {
        std::vector<int32_t> offsets{0};
        for (int32_t r : c.group_rows)
            offsets.push_back(offsets.back() + static_cast<int32_t>((r + tile_rows - 1) / tile_rows));
        return offsets;
    };

    std::vector<uint16_t> stacked;  // [G_w, N_w, Kd]
    for (int64_t g = 0; g < num_weight_groups; ++g) stacked.insert(stacked.end(), weights[g].begin(), weights[g].end());
    cuda::CudaBuffer d_stacked = upload(stacked);
    cuda::CudaBuffer d_extra = c.extra ? upload(weights.back()) : cuda::CudaBuffer();
    std::vector<const void*> ptrs;  // [G_w · 2]: gate rows [0, N), up rows [N, 2N) (SwiGLU)
    for (int64_t g = 0; g < num_weight_groups; ++g) {
        const auto* base = static_cast<const uint16_t*>(d_stacked.data()) + g * n_w * kd;
        ptrs.push_back(base);
        ptrs.push_back(c.swiglu ? base + n * kd : base);
    }
    cuda::CudaBuffer d_ptrs = upload(ptrs);
    cuda::CudaBuffer d_x = upload(x), d_x_row = upload(x_row);
    cuda::CudaBuffer d_begin = upload(begin), d_end = upload(end);

    cuda::MoeGroupedGemmArgs args;
    args.weights = d_stacked.data();
    args.weight_group_stride = n_w * kd;
    args.num_weight_groups = num_weight_groups;
    args.extra_weights = c.extra ? d_extra.data() : nullptr;
    args.weight_ptrs = c.weight_ptrs ? static_cast<const void* const*>(d_ptrs.data()) : nullptr;
    args.weight_ptr_stride = 2;
    args.x = d_x.data();
    args.x_row_of_row = d_x_row.as<int32_t>();
    args.group_row_begin = d_begin.as<int32_t>();
    args.group_row_end = d_end.as<int32_t>();
    args.num_groups = num_groups;
    args.out_features = n;
    args.in_features = kd;
    args.epilogue = c.swiglu ? cuda::MoeGemmEpilogue::kSwiGlu : cuda::MoeGemmEpilogue::kStore;

    const std::vector<float> want = reference(c, weights, x, x_row);
    struct Run {
        cuda::MoeGemmTile tile;
        cuda::MoeGemmKernel kernel;
        int gemv_rows;  // kGemv: rows per tile
        int split_k;    // kNarrow: K splits
        const char* name;
    };
    for (const Run run : {Run{cuda::MoeGemmTile::kWide, cuda::MoeGemmKernel::kAuto, 0, 1, "wide auto"},
                          Run{cuda::MoeGemmTile::kWide, cuda::MoeGemmKernel::kMmaSync, 0, 1, "wide mma.sync"},
                          Run{cuda::MoeGemmTile::kNarrow, cuda::MoeGemmKernel::kAuto, 0, 1, "narrow"},
                          Run{cuda::MoeGemmTile::kNarrow, cuda::MoeGemmKernel::kAuto, 0, 3, "narrow split 3"},
                          Run{cuda::MoeGemmTile::kGemv, cuda::MoeGemmKernel::kAuto, 1, 1, "gemv 1 row"},
                          Run{cuda::MoeGemmTile::kGemv, cuda::MoeGemmKernel::kAuto, 2, 1, "gemv 2 rows"},
                          Run{cuda::MoeGemmTile::kGemv, cuda::MoeGemmKernel::kAuto, 4, 1, "gemv 4 rows"}}) {
        const char* kernel_name = run.name;
        const std::vector<int32_t> tile_offsets = tile_offsets_of(
            run.tile == cuda::MoeGemmTile::kGemv ? run.gemv_rows : cuda::moe_gemm_tile_rows(run.tile));
        cuda::CudaBuffer d_offsets = upload(tile_offsets);
        args.group_tile_offsets = d_offsets.as<int32_t>();
        args.max_row_tiles = tile_offsets.back() + 2;  // an upper bound, as the layer passes: extra CTAs exit
        args.tile = run.tile;
        args.gemv_rows = run.gemv_rows;
        args.split_k = run.split_k;
        cuda::CudaBuffer d_partials, d_counters;
        if (run.split_k > 1) {
            d_partials = poisoned<float>(static_cast<size_t>(run.split_k * rows * n_w));
            d_counters = upload(std::vector<int32_t>(static_cast<size_t>(cuda::moe_gemm_num_tiles(args)), 0));
            args.partials = d_partials.as<float>();
            args.partial_rows = rows;
            args.tile_counters = d_counters.as<int32_t>();
        }
        cuda::CudaBuffer d_out = poisoned<uint16_t>(static_cast<size_t>(rows * n));
        args.out = d_out.data();
        args.kernel = run.kernel;
        ASSERT_EQ(cuda::launch_moe_grouped_gemm(args, nullptr), cudaSuccess) << kernel_name;
        const std::vector<uint16_t> bits = download<uint16_t>(d_out.data(), static_cast<size_t>(rows * n));
        std::vector<float> got(bits.size());
        for (size_t i = 0; i < bits.size(); ++i) got[i] = bf16_to_f32(bits[i]);
        const Diff d = compare<float>(got, want);
        EXPECT_TRUE(within(d, tolerance("moe_grouped_gemm_cuda", DType::kBF16))) << c.name << ", " << kernel_name;
        if (run.tile == cuda::MoeGemmTile::kGemv) {
            expect_same_bits_from_fp32_x(args, x, seed + 3, static_cast<size_t>(rows * n), bits,
                                         std::string(c.name) + ", " + kernel_name + ", fp32 x");
        }
        if (run.split_k > 1) {
            // The last split of each tile put its counter back to zero, and a second launch on the same
            // buffers gives the same bits (the sum is in split order, whichever split finishes last).
            EXPECT_EQ(
                download<int32_t>(d_counters.data(), static_cast<size_t>(cuda::moe_gemm_num_tiles(args))),
                std::vector<int32_t>(static_cast<size_t>(cuda::moe_gemm_num_tiles(args)), 0))
                << c.name << ", " << kernel_name;
            d_partials = poisoned<float>(static_cast<size_t>(run.split_k * rows * n_w));
            d_out = poisoned<uint16_t>(static_cast<size_t>(rows * n));
            args.partials = d_partials.as<float>();
            args.out = d_out.data();
            ASSERT_EQ(cuda::launch_moe_grouped_gemm(args, nullptr), cudaSuccess) << kernel_name;
            EXPECT_EQ(download<uint16_t>(d_out.data(), static_cast<size_t>(rows * n)), bits)
                << c.name << ", " << kernel_name << ", again";
            args.split_k = 1;
            args.partials = nullptr;
            args.tile_counters = nullptr;
        }
    }
    args.tile = cuda::MoeGemmTile::kWide;  // fp32 x is the gemv tile's alone
    args.x_f32 = true;
    EXPECT_EQ(cuda::launch_moe_grouped_gemm(args, nullptr), cudaErrorInvalidValue);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, MoeGroupedGemmCudaTest,
    ::testing::Values(
        // Group sizes at the edges: empty, 1, one warpgroup (64) ± 1, one tile (128) ± 1, several tiles.
        GemmCase{"edges_swiglu", {0, 1, 63, 64, 65, 127, 128, 129, 0, 300}, 264, 136, true, false, false},
        GemmCase{"edges_store", {5, 0, 64, 129, 257}, 136, 200, false, false, false},
        // K of the down projection of Qwen3-30B-A3B (768), N past one 256-row tile, a shared-expert group.
        GemmCase{"extra_group_store", {70, 200, 131}, 768, 520, false, true, false},
        GemmCase{"extra_group_swiglu", {90, 40, 150}, 520, 264, true, true, false},
        // Experts stored as separate tensors (per-group pointers, gate and up apart).
        GemmCase{"weight_ptrs_swiglu", {33, 160, 0, 96}, 200, 128, true, false, true},
        GemmCase{"weight_ptrs_store", {128, 1, 255}, 40, 256, false, false, true},
        // Decode sizes (the kGemv regime): 0 to 4 rows per group, Qwen3-30B-A3B's gate_up and down shapes.
        GemmCase{"decode_swiglu", {1, 0, 3, 4, 2, 1}, 2048, 768, true, true, false},
        GemmCase{"decode_store", {2, 1, 0, 4, 1}, 768, 2048, false, false, true},
        // Decode-size groups in the dozens, as an MoE layer of 8 to 64 tokens has them (31, 32, 33, 64 and
        // 65 rows: the kNarrow tile's edges), more kNarrow tiles than CTAs the GPU holds at once, N past a
        // whole tile.
        GemmCase{"many_groups_swiglu",
                 {3, 0,  1, 70, 2, 64, 1, 5, 129, 0,  7, 1, 2,  40, 1, 65, 9, 1, 3, 2,
                  1, 33, 4, 1,  2, 6,  1, 1, 0,   12, 3, 2, 31, 1,  5, 32, 2, 1, 8, 1},
                 200,
                 520,
                 true,
                 true,
                 false},
        GemmCase{"many_groups_store",
                 {1, 2, 0, 3, 1,   65, 1, 1, 4, 2, 1, 1,  2, 9, 1,  0,
                  1, 3, 1, 1, 130, 2,  1, 1, 6, 1, 1, 32, 1, 1, 31, 3},
                 776,
                 1032,
                 false,
                 false,
                 true}),
    [](const ::testing::TestParamInfo<GemmCase>& info) { return info.param.name; });

// Pick mode (MoeGemmPicks): GEMM row r is pick r of group id − first_expert; picks of −1 and of experts
// below or past this block are skipped (their rows keep the poison); the extra group's rows follow the
// picks; x rows by token (the gate_up) or by GEMM row (the down).
TEST_F(CudaTest, GemvPickModeMatchesHostReference) {
    const int64_t T = 3, K = 4, G_w = 6, first = 5, kd = 264, n = 136, picks = T * K, rows = picks + T;
    const std::vector<int32_t> ids = {5, 10, -1, 7, 4, 6, 11, 9, 8, 5, 10, 3};  // [T, K] global ids
    for (const bool swiglu : {true, false}) {
        for (const bool x_per_token : {true, false}) {
            const int64_t n_w = swiglu ? 2 * n : n, x_rows = x_per_token ? T : rows;
            const uint32_t seed = 40 + 2 * swiglu + x_per_token;
            std::vector<std::vector<uint16_t>> weights;  // [G_w + 1][N_w, Kd], the last the extra group
            std::vector<uint16_t> stacked;
            for (int64_t g = 0; g <= G_w; ++g) {
                weights.push_back(random_bf16(static_cast<size_t>(n_w * kd),
                                              seed * 10 + static_cast<uint32_t>(g),
                                              1.0f / std::sqrt(static_cast<float>(kd))));
                if (g < G_w) stacked.insert(stacked.end(), weights.back().begin(), weights.back().end());
            }
            const std::vector<uint16_t> x = random_bf16(static_cast<size_t>(x_rows * kd), seed, 1.0f);
            cuda::CudaBuffer d_stacked = upload(stacked), d_extra = upload(weights.back());
            cuda::CudaBuffer d_x = upload(x), d_ids = upload(ids);
            cuda::CudaBuffer d_out = poisoned<uint16_t>(static_cast<size_t>(rows * n));
            cuda::MoeGroupedGemmArgs args;
            args.weights = d_stacked.data();
            args.weight_group_stride = n_w * kd;
            args.num_weight_groups = G_w;
            args.extra_weights = d_extra.data();
            args.x = d_x.data();
            args.max_row_tiles = rows;
            args.out_features = n;
            args.in_features = kd;
            args.out = d_out.data();
            args.epilogue = swiglu ? cuda::MoeGemmEpilogue::kSwiGlu : cuda::MoeGemmEpilogue::kStore;
            args.tile = cuda::MoeGemmTile::kGemv;
            args.gemv_rows = 1;
            args.picks = {d_ids.as<int32_t>(), first, T, K, x_per_token};
            ASSERT_EQ(cuda::launch_moe_grouped_gemm(args, nullptr), cudaSuccess);
            const std::vector<uint16_t> bits =
                download<uint16_t>(d_out.data(), static_cast<size_t>(rows * n));
            expect_same_bits_from_fp32_x(args, x, seed + 7, static_cast<size_t>(rows * n), bits,
                                         "swiglu " + std::to_string(swiglu) + ", x per token " +
                                             std::to_string(x_per_token) + ", fp32 x");

            std::vector<float> got, want;
            int64_t skipped = 0, poison_kept = 0;
            for (int64_t r = 0; r < rows; ++r) {
                const int64_t g = r < picks ? ids[static_cast<size_t>(r)] - first : G_w;
                const int64_t token = r < picks ? r / K : r - picks;
                if (r < picks && (g < 0 || g >= G_w)) {
                    ++skipped;
                    for (int64_t f = 0; f < n; ++f)
                        poison_kept += bits[static_cast<size_t>(r * n + f)] == 0x7f7f;
                    continue;
                }
                const uint16_t* xr = x.data() + (x_per_token ? token : r) * kd;
                append_reference_row(weights[static_cast<size_t>(g)], xr, kd, n, swiglu, want);
                for (int64_t f = 0; f < n; ++f)
                    got.push_back(bf16_to_f32(bits[static_cast<size_t>(r * n + f)]));
            }
            EXPECT_EQ(skipped, 4);  // −1, 4 and 3 (below), 11 (past)
            EXPECT_EQ(poison_kept, skipped * n) << "a skipped pick's row was written";
            const Diff d = compare<float>(got, want);
            EXPECT_TRUE(within(d, tolerance("moe_grouped_gemm_cuda", DType::kBF16)))
                << "swiglu " << swiglu << ", x per token " << x_per_token;
        }
    }
}

TEST_F(CudaTest, PickModeNeedsOneRowGemvTiles) {
    const int32_t ids = 0;
    cuda::MoeGroupedGemmArgs args;
    args.in_features = 64;
    args.out_features = 64;
    args.picks.expert_ids = &ids;
    args.tile = cuda::MoeGemmTile::kGemv;
    args.gemv_rows = 4;
    EXPECT_EQ(cuda::launch_moe_grouped_gemm(args, nullptr), cudaErrorInvalidValue);
    args.tile = cuda::MoeGemmTile::kNarrow;
    args.gemv_rows = 1;
    EXPECT_EQ(cuda::launch_moe_grouped_gemm(args, nullptr), cudaErrorInvalidValue);
}

TEST_F(CudaTest, SplitKWithoutTileCountersIsRejected) {
    float partials = 0.0f;
    cuda::MoeGroupedGemmArgs args;
    args.in_features = 64;
    args.out_features = 64;
    args.split_k = 2;
    args.partials = &partials;
    EXPECT_EQ(cuda::launch_moe_grouped_gemm(args, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace epinfer::test
#endif  // EPINFER_WITH_CUDA
