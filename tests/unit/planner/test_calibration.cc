// Calibration: the latency/bandwidth fit pinned to hand calculations, and the calibrated profile that
// `epinfer bench comm` / `bench moe --profile-out` write (docs/planner.md §1, "Calibration").
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "planner/calibration.h"
#include "planner/cost_model.h"

namespace epinfer::planner {
namespace {

const std::string kH200Path = std::string(EPINFER_TEST_DATA_DIR) + "/../../profiles/h200_sxm.json";

std::string read_text(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
}

TEST(LatencyBandwidthFit, ExactLine) {
    // 10 µs + 2 µs per 1000 B: 1000 B / 2 µs = 5e8 B/s = 0.5 GB/s.
    auto fit = fit_latency_bandwidth({{1000, 12}, {2000, 14}, {4000, 18}});
    ASSERT_TRUE(fit.is_ok()) << fit.status().message();
    EXPECT_NEAR(fit.value().latency_us, 10.0, 1e-9);
    EXPECT_NEAR(fit.value().bandwidth_gbps, 0.5, 1e-12);
}

TEST(LatencyBandwidthFit, LeastSquaresOverNoisyPoints) {
    // x̄ 2000, ȳ 37/3; Sxx = 2e6, Sxy = 1000·(7/3) + 1000·(5/3) = 4000 → slope 0.002 µs/B (0.5 GB/s),
    // intercept 37/3 − 4 = 25/3 µs.
    auto fit = fit_latency_bandwidth({{1000, 10}, {2000, 13}, {3000, 14}});
    ASSERT_TRUE(fit.is_ok()) << fit.status().message();
    EXPECT_NEAR(fit.value().latency_us, 25.0 / 3.0, 1e-9);
    EXPECT_NEAR(fit.value().bandwidth_gbps, 0.5, 1e-12);
}

TEST(LatencyBandwidthFit, NegativeInterceptFitsThroughOrigin) {
    // Ordinary fit: slope 0.004, intercept 5 − 8 = −3 < 0 → through the origin: slope Σxy/Σxx =
    // 38000 / 14e6 µs/B, bandwidth 1e-3 · 14e6 / 38000 = 0.368421... GB/s.
    auto fit = fit_latency_bandwidth({{1000, 1}, {2000, 5}, {3000, 9}});
    ASSERT_TRUE(fit.is_ok()) << fit.status().message();
    EXPECT_EQ(fit.value().latency_us, 0.0);
    EXPECT_NEAR(fit.value().bandwidth_gbps, 14.0 / 38.0, 1e-12);
}

TEST(LatencyBandwidthFit, Errors) {
    EXPECT_NE(fit_latency_bandwidth({{1000, 10}}).status().message().find("two distinct sizes"),
              std::string::npos);
    EXPECT_FALSE(fit_latency_bandwidth({{1000, 10}, {1000, 12}}).is_ok());
    EXPECT_FALSE(fit_latency_bandwidth({}).is_ok());
    EXPECT_NE(fit_latency_bandwidth({{1000, 10}, {2000, 9}}).status().message().find("do not grow"),
              std::string::npos);
    EXPECT_FALSE(fit_latency_bandwidth({{1000, 10}, {2000, -1}}).is_ok());
}

TEST(CalibratedProfile, ReplacesMeasuredCollectivesOnly) {
    const std::string base_text = read_text(kH200Path);
    auto base = parse_hardware_profile(base_text, kH200Path);
    ASSERT_TRUE(base.is_ok()) << base.status().message();

    Calibration cal;
    cal.source = "epinfer bench comm --ranks 2 on testhost, 2026-01-01T00:00:00Z";
    // 20 µs + 0.002 µs/B: algbw 0.5 GB/s; at 2 ranks all_reduce f = 1, all_gather f = 1/2.
    cal.collectives.push_back({Collective::kAllReduce, 2, {{1000, 22}, {3000, 26}, {5000, 30}}});
    cal.collectives.push_back({Collective::kAllGather, 2, {{1000, 22}, {3000, 26}, {5000, 30}}});
    // Flat times: no fit; latency = first time, busbw = 4000 B / 9 µs at f = 1/2.
    cal.collectives.push_back({Collective::kAllToAll, 2, {{1000, 10}, {4000, 9}}});
    auto text = calibrated_profile_json(base_text, kH200Path, cal);
    ASSERT_TRUE(text.is_ok()) << text.status().message();
    auto p = parse_hardware_profile(text.value(), "out.json");
    ASSERT_TRUE(p.is_ok()) << p.status().message();

    EXPECT_EQ(p.value().name, "h200_sxm_measured");
    const CollectiveSpec& ar = p.value().intra_node[Collective::kAllReduce];
    EXPECT_NEAR(ar.latency_us.value, 20.0, 1e-9);
    EXPECT_NEAR(ar.bus_bandwidth_gbps.value, 0.5, 1e-12);
    EXPECT_EQ(ar.latency_us.provenance, Provenance::kMeasured);
    EXPECT_EQ(ar.bus_bandwidth_gbps.provenance, Provenance::kMeasured);
    EXPECT_NE(ar.bus_bandwidth_gbps.source.find("testhost"), std::string::npos);
    EXPECT_EQ(ar.table.ranks, 2);
    ASSERT_EQ(ar.table.points.size(), 3u);
    EXPECT_EQ(ar.table.points[1], std::make_pair(3000.0, 26.0));
    EXPECT_EQ(ar.table.provenance, Provenance::kMeasured);
    EXPECT_EQ(ar.table.source, cal.source);

    EXPECT_NEAR(p.value().intra_node[Collective::kAllGather].bus_bandwidth_gbps.value, 0.25, 1e-12);
    const CollectiveSpec& a2a = p.value().intra_node[Collective::kAllToAll];
    EXPECT_EQ(a2a.latency_us.value, 10.0);
    EXPECT_NEAR(a2a.bus_bandwidth_gbps.value, 4000.0 / 9e3 * 0.5, 1e-12);
    EXPECT_NE(a2a.latency_us.source.find("no fit"), std::string::npos);

    // Not measured: send_recv, the GPU, the inter-node link stay the base's.
    const CollectiveSpec& sr = p.value().intra_node[Collective::kSendRecv];
    const CollectiveSpec& base_sr = base.value().intra_node[Collective::kSendRecv];
    EXPECT_EQ(sr.latency_us.value, base_sr.latency_us.value);
    EXPECT_EQ(sr.bus_bandwidth_gbps.source, base_sr.bus_bandwidth_gbps.source);
    EXPECT_EQ(p.value().gpu.memory_efficiency.value, base.value().gpu.memory_efficiency.value);
    EXPECT_EQ(p.value().gpus_per_node, base.value().gpus_per_node);
    ASSERT_TRUE(p.value().inter_node.has_value());

    // The cost model reads the table at 2 ranks and the fitted figures elsewhere: at 4 ranks an all_reduce of
    // 3000 B costs 20 + 3000 · 1.5 / (0.5 · 1e3) = 29 µs.
    EXPECT_NEAR(collective_time_us(ar, Collective::kAllReduce, 2000, 2), 24.0, 1e-9);
    EXPECT_NEAR(collective_time_us(ar, Collective::kAllReduce, 3000, 4), 29.0, 1e-9);
}

TEST(CalibratedProfile, GpuCeilingsBecomeEfficiencies) {
    const std::string base_text = read_text(kH200Path);
    Calibration cal;
    cal.source = "epinfer bench moe on gpuhost";
    // H200: 4800 GB/s, 989.4 TFLOP/s bf16 → 4320 / 4800 = 0.9, 692.58 / 989.4 = 0.7.
    cal.gpu_ceilings.push_back({4320.0, 692.58});
    auto text = calibrated_profile_json(base_text, kH200Path, cal);
    ASSERT_TRUE(text.is_ok()) << text.status().message();
    auto p = parse_hardware_profile(text.value(), "out.json");
    ASSERT_TRUE(p.is_ok()) << p.status().message();
    EXPECT_NEAR(p.value().gpu.memory_efficiency.value, 0.9, 1e-12);
    EXPECT_NEAR(p.value().gpu.matmul_efficiency.value, 0.7, 1e-12);
    EXPECT_EQ(p.value().gpu.matmul_efficiency.provenance, Provenance::kMeasured);
    EXPECT_EQ(p.value().gpu.memory_bandwidth_gbps.value, 4800.0);
    EXPECT_EQ(p.value().gpu.memory_bandwidth_gbps.provenance, Provenance::kDatasheet);

    cal.gpu_ceilings[0].stream_read_gbps = 5000.0;  // above the H200's 4800: a base for another GPU
    auto over = calibrated_profile_json(base_text, kH200Path, cal);
    ASSERT_FALSE(over.is_ok());
    EXPECT_NE(over.status().message().find("memory_bandwidth_gbps 4800.0"), std::string::npos)
        << over.status().message();
}

TEST(CalibratedProfile, Errors) {
    const std::string base_text = read_text(kH200Path);
    Calibration one_rank;
    one_rank.collectives.push_back({Collective::kAllReduce, 1, {{1000, 10}, {2000, 12}}});
    auto r = calibrated_profile_json(base_text, kH200Path, one_rank);
    ASSERT_FALSE(r.is_ok());
    EXPECT_NE(r.status().message().find("ranks >= 2"), std::string::npos) << r.status().message();

    auto bad = calibrated_profile_json("{\"schema\": 1}", "base.json", Calibration{});
    ASSERT_FALSE(bad.is_ok());
    EXPECT_EQ(bad.status().message().rfind("base.json: schema", 0), 0u) << bad.status().message();
}

}  // namespace
}  // namespace epinfer::planner
