// make_plan: request validation, recommendations and their explanations, the JSON report.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "planner/layouts.h"
#include "planner/plan_report.h"
#include "planner/planner.h"
#include "planner_test_util.h"

namespace epinfer::planner {
namespace {

const std::string kProfilesDir = std::string(EPINFER_TEST_DATA_DIR) + "/../../profiles";

HardwareProfile profile(const std::string& name) {
    auto p = load_hardware_profile_file(kProfilesDir + "/" + name + ".json");
    EXPECT_TRUE(p.is_ok()) << p.status().message();
    return p.is_ok() ? *p : HardwareProfile{};
}

PlanRequest kimi_int4_request(int gpus) {
    PlanRequest r;
    r.model_label = "kimi_k2";
    r.gpus = gpus;
    r.memory.weights = {WeightFormat::kInt4Group32, WeightFormat::kBf16};
    return r;
}

std::string plan_error(const PlanRequest& r, const std::string& hw = "rtx_pro_6000") {
    auto plan = make_plan(testing::kimi_k2_config(), profile(hw), r);
    return plan.is_ok() ? std::string("(ok)") : plan.status().message();
}

TEST(Planner, RejectsBadRequestsInOneLine) {
    PlanRequest r = kimi_int4_request(0);
    EXPECT_EQ(plan_error(r), "--gpus 0: must be >= 1");
    r.gpus = 8;
    r.nodes = 3;
    EXPECT_EQ(plan_error(r), "--gpus 8 --nodes 3: the GPUs must split evenly over the nodes");
    r.gpus = 16;
    r.nodes = 1;
    EXPECT_EQ(plan_error(r),
              "--gpus 16 on 1 node(s): profile rtx_pro_6000 has at most 8 GPUs per node; pass --nodes 2");
    r.gpus = 8;
    r.concurrency = {1, 0};
    EXPECT_EQ(plan_error(r), "--concurrency 0: must be >= 1");
    r.concurrency = {1};
    r.layouts = {ParallelLayout{1, 3, 1, 3, 1}};
    std::string msg = plan_error(r);
    EXPECT_EQ(msg.rfind("layout tp3: ", 0), 0u) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos);
    r.layouts = {ParallelLayout{1, 8, 1, 8, 1}};
    EXPECT_EQ(plan_error(r), "(ok)");
}

TEST(Planner, TokensPerSecondKeepTwoDigitsBelowTen) {
    // A plan of 1-token steps over a long prompt runs at a fraction of a token per second: not "0".
    EXPECT_EQ(format_tokens_per_s(0.4), "0.4");
    EXPECT_EQ(format_tokens_per_s(3.14159), "3.1");
    EXPECT_EQ(format_tokens_per_s(0.0), "0");
    EXPECT_EQ(format_tokens_per_s(12.6), "13");
    EXPECT_EQ(format_tokens_per_s(21282.4), "21282");
}

TEST(Planner, RestrictsToRequestedLayouts) {
    PlanRequest r = kimi_int4_request(8);
    r.layouts = {ParallelLayout{1, 8, 1, 8, 1}, ParallelLayout{1, 8, 1, 1, 8}};
    auto plan = make_plan(testing::kimi_k2_config(), profile("rtx_pro_6000"), r);
    ASSERT_TRUE(plan.is_ok());
    ASSERT_EQ(plan->layouts.size(), 2u);
    EXPECT_EQ(plan->layouts[1].spec, "ep8");
    ASSERT_EQ(plan->recommendations.size(), r.concurrency.size());
}

TEST(Planner, ExplainsTheWinnerWithNumbers) {
    PlanRequest r = kimi_int4_request(8);
    r.concurrency = {1};
    r.layouts = {ParallelLayout{1, 8, 1, 8, 1}, ParallelLayout{1, 8, 1, 1, 8}};
    auto plan = make_plan(testing::kimi_k2_config(), profile("h200_sxm"), r);
    ASSERT_TRUE(plan.is_ok());
    const Recommendation& rec = plan->recommendations[0];
    // At one request EP's busiest rank reads more experts than TP's even split: TP wins on expert GEMMs.
    ASSERT_EQ(rec.layout, 0);
    EXPECT_EQ(rec.runner_up, 1);
    EXPECT_EQ(rec.reason.rfind("tp8: ", 0), 0u) << rec.reason;
    EXPECT_NE(rec.reason.find("ep8 ("), std::string::npos) << rec.reason;
    EXPECT_NE(rec.reason.find("loses at C=1: expert GEMMs"), std::string::npos) << rec.reason;
}

TEST(Planner, AllReduceTermNamedWhenItDecides) {
    // The round profile with slow all-reduces (100 µs): TP8's 8 all-reduces (4 layers × 2) of 8 tokens'
    // fp32 hidden states, 100 + 32768 · 1.75 / 1e5 = 100.6 µs each, decide against EP with DP attention,
    // whose 8 all-to-alls take about 20 µs each.
    nlohmann::json doc = nlohmann::json::parse(testing::round_profile_json());
    doc["gpus_per_node"] = 8;
    doc["intra_node"]["all_reduce"]["latency_us"] = 100;
    auto hw = parse_hardware_profile(doc.dump(), "slow_all_reduce.json");
    ASSERT_TRUE(hw.is_ok()) << hw.status().message();
    PlanRequest r;
    r.model_label = "tiny";
    r.gpus = 8;
    r.concurrency = {8};
    r.memory.context_tokens = 100;
    r.input_len = 100;  // a request holds its prompt
    r.memory.cuda_graph_bytes = 0;
    r.layouts = {ParallelLayout{1, 8, 1, 8, 1}, ParallelLayout{1, 1, 8, 1, 8}};
    auto plan = make_plan(testing::tiny_gqa_config(), *hw, r);
    ASSERT_TRUE(plan.is_ok()) << plan.status().message();
    const Recommendation& rec = plan->recommendations[0];
    const std::string& why = rec.reason;
    ASSERT_EQ(rec.layout, 1) << why;
    EXPECT_EQ(why.rfind("dp8-ep8: ", 0), 0u) << why;
    EXPECT_NE(why.find("tp8 ("), std::string::npos) << why;
    EXPECT_NE(why.find("loses at C=8: 8 all_reduce × 100.6 µs = 0.80 ms per step (dp8-ep8: none"),
              std::string::npos)
        << why;
    // The same two results with the loser's throughput within 1 % of the winner's: called a tie, with the
    // term that tips it.
    const LayoutPlan& win = plan->layouts[1];
    const LayoutPlan& lose = plan->layouts[0];
    DecodeResult close = lose.decode[0];
    close.tokens_per_s = win.decode[0].tokens_per_s / 1.005;
    const std::string tie = explain_difference(win, win.decode[0], lose, close);
    EXPECT_EQ(tie.rfind("ties with dp8-ep8 at C=8 (within 1 %); the term that tips it: 8 all_reduce", 0), 0u)
        << tie;
    close.tokens_per_s = win.decode[0].tokens_per_s / 1.02;
    EXPECT_EQ(explain_difference(win, win.decode[0], lose, close).rfind("loses at C=8: 8 all_reduce", 0), 0u);
}

TEST(Planner, JsonReportIsOneValidDocument) {
    PlanRequest r = kimi_int4_request(8);
    auto plan = make_plan(testing::kimi_k2_config(), profile("rtx_pro_6000"), r);
    ASSERT_TRUE(plan.is_ok());
    nlohmann::json doc = nlohmann::json::parse(plan_to_json(*plan));
    EXPECT_EQ(doc["schema"], "epinfer.plan/1");
    EXPECT_EQ(doc["layouts"].size(), plan->layouts.size());
    EXPECT_EQ(doc["layouts"][0]["spec"], "tp8");
    EXPECT_EQ(doc["layouts"][0]["decode"].size(), 6u);
    EXPECT_EQ(doc["recommendations"].size(), 6u);
    EXPECT_TRUE(doc["any_fits"].get<bool>());
    std::string text = plan_to_text(*plan);
    EXPECT_NE(text.find("recommended"), std::string::npos);
    EXPECT_NE(text.find("tp8"), std::string::npos);
}

}  // namespace
}  // namespace epinfer::planner
