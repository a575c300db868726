// The single-rank communicator and the argument checks every backend shares; EPINFER_COMM_TIMEOUT_S.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/single_rank_communicator.h"
#include "core/env.h"

namespace epinfer {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(SingleRank, CollectivesAreCopies) {
    std::unique_ptr<Communicator> comm = create_single_rank_communicator(5.0);
    EXPECT_EQ(comm->rank(), 0);
    EXPECT_EQ(comm->size(), 1);
    EXPECT_STREQ(comm->backend_name(), "single");
    EXPECT_EQ(comm->timeout_s(), 5.0);

    std::vector<float> in = {1.5f, -2.0f, 3.0f}, out(3, 0.0f);
    ASSERT_TRUE(comm->all_reduce(in.data(), out.data(), 3, DType::kF32, ReduceOp::kSum).is_ok());
    EXPECT_EQ(out, in);
    ASSERT_TRUE(comm->all_reduce(in.data(), in.data(), 3, DType::kF32, ReduceOp::kMax).is_ok());  // in place
    EXPECT_THAT(in, ElementsAre(1.5f, -2.0f, 3.0f));

    std::vector<int64_t> g_in = {7, 8}, g_out(2, 0);
    ASSERT_TRUE(comm->all_gather(g_in.data(), g_out.data(), 2, DType::kI64).is_ok());
    EXPECT_EQ(g_out, g_in);
    std::vector<int32_t> rs_in = {4, 5}, rs_out(2, 0);
    ASSERT_TRUE(comm->reduce_scatter(rs_in.data(), rs_out.data(), 2, DType::kI32, ReduceOp::kSum).is_ok());
    EXPECT_EQ(rs_out, rs_in);

    std::vector<uint16_t> a_in = {9, 1, 2, 3}, a_out(5, 0);
    const int64_t sc[] = {3}, sd[] = {1}, rc[] = {3}, rd[] = {2};
    AllToAllVArgs args{a_in.data(), sc, sd, a_out.data(), rc, rd, DType::kBF16};
    ASSERT_TRUE(comm->all_to_all_v(args).is_ok());
    EXPECT_THAT(a_out, ElementsAre(0, 0, 1, 2, 3));

    int32_t value = 42;
    ASSERT_TRUE(comm->broadcast(&value, 1, DType::kI32, 0).is_ok());
    EXPECT_EQ(value, 42);
    EXPECT_TRUE(comm->barrier().is_ok());
}

TEST(SingleRank, SendToSelfIsQueuedByTag) {
    std::unique_ptr<Communicator> comm = create_single_rank_communicator(5.0);
    const int32_t a[] = {1, 2}, b[] = {3};
    ASSERT_TRUE(comm->send(a, 2, DType::kI32, 0, 7).is_ok());
    ASSERT_TRUE(comm->send(b, 1, DType::kI32, 0, 8).is_ok());
    int32_t got_b = 0;
    ASSERT_TRUE(comm->recv(&got_b, 1, DType::kI32, 0, 8).is_ok());
    EXPECT_EQ(got_b, 3);
    int32_t got_a[3] = {};
    Status s = comm->recv(got_a, 3, DType::kI32, 0, 7);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr("message of 8 bytes, expected 12"));
    s = comm->recv(got_a, 1, DType::kI32, 0, 9);
    EXPECT_EQ(s.code(), StatusCode::kCommFailure);
    EXPECT_THAT(s.message(), HasSubstr("rank 0/1: recv: no message from rank 0 with tag 9 was sent"));
}

TEST(SingleRank, SplitNamesTheGroup) {
    std::unique_ptr<Communicator> comm = create_single_rank_communicator(5.0);
    Result<std::unique_ptr<Communicator>> ep = comm->split(0, 0, "ep");
    ASSERT_TRUE(ep.is_ok());
    EXPECT_EQ((*ep)->identity().name, "ep");
    EXPECT_EQ((*ep)->size(), 1);
    EXPECT_EQ((*ep)->timeout_s(), 5.0);
    Status s = (*ep)->broadcast(nullptr, 1, DType::kF32, 0);
    EXPECT_EQ(s.message(), "ep rank 0/1 (world rank 0/1): broadcast: null buffer with count 1");
    Result<std::unique_ptr<Communicator>> bad = comm->split(-1, 0, "tp");
    ASSERT_FALSE(bad.is_ok());
    EXPECT_THAT(bad.status().message(), HasSubstr("split into 'tp': color -1 is negative"));
}

TEST(CommunicatorChecks, RejectBadArguments) {
    std::unique_ptr<Communicator> comm = create_single_rank_communicator(5.0);
    uint16_t h[2] = {};
    Status s = comm->all_reduce(h, h, 2, DType::kBF16, ReduceOp::kSum);
    EXPECT_EQ(s.code(), StatusCode::kNotSupported);
    EXPECT_EQ(s.message(), "rank 0/1: all_reduce of BF16: reductions take F32, F64, I32 or I64");
    s = comm->all_gather(h, h, -1, DType::kU8);
    EXPECT_EQ(s.message(), "rank 0/1: all_gather: negative count -1");
    s = comm->send(h, 1, DType::kU8, 1);
    EXPECT_EQ(s.message(), "rank 0/1: send: peer 1 is outside the group of 1 ranks");
    s = comm->broadcast(h, 1, DType::kU8, 3);
    EXPECT_EQ(s.message(), "rank 0/1: broadcast: root 3 is outside the group of 1 ranks");
    const int64_t one[] = {1}, two[] = {1, 1}, neg[] = {-2};
    s = comm->all_to_all_v({h, two, one, h, one, one, DType::kU8});
    EXPECT_EQ(s.message(), "rank 0/1: all_to_all_v: send_counts has 2 entries, expected 1");
    s = comm->all_to_all_v({h, one, one, h, neg, one, DType::kU8});
    EXPECT_EQ(s.message(), "rank 0/1: all_to_all_v: recv_counts[0] = -2 is negative");
    s = comm->all_to_all_v({nullptr, one, one, h, one, one, DType::kU8});
    EXPECT_THAT(s.message(), HasSubstr("null buffer with a positive count for rank 0"));
    const int64_t zero[] = {0};
    s = comm->all_to_all_v({h, one, zero, h, zero, zero, DType::kU8});
    EXPECT_THAT(s.message(), HasSubstr("sends 1 elements to itself but expects 0"));
    EXPECT_TRUE(comm->all_to_all_v({nullptr, zero, zero, nullptr, zero, zero, DType::kU8}).is_ok());
    SendRecvArgs bad_tag;
    bad_tag.send = h;
    bad_tag.send_count = 1;
    bad_tag.send_peer = 0;
    bad_tag.tag = 40000;
    EXPECT_THAT(comm->send_recv(bad_tag).message(), HasSubstr("tag 40000 is outside [0, 32768)"));
}

class EnvTest : public ::testing::Test {
protected:
    void TearDown() override { unsetenv("EPINFER_COMM_TIMEOUT_S"); }
};

TEST_F(EnvTest, CommTimeout) {
    unsetenv("EPINFER_COMM_TIMEOUT_S");
    Result<double> t = env_comm_timeout_s();
    ASSERT_TRUE(t.is_ok());
    EXPECT_EQ(*t, 300.0);
    setenv("EPINFER_COMM_TIMEOUT_S", "2.5", 1);
    t = env_comm_timeout_s();
    ASSERT_TRUE(t.is_ok());
    EXPECT_EQ(*t, 2.5);
    setenv("EPINFER_COMM_TIMEOUT_S", "1e9", 1);  // the largest (core/timeout.h)
    t = env_comm_timeout_s();
    ASSERT_TRUE(t.is_ok());
    EXPECT_EQ(*t, 1e9);
    for (const char* bad : {"0", "-1", "abc", "5s", "inf", "1.5e9", "1e10", "1e300"}) {
        setenv("EPINFER_COMM_TIMEOUT_S", bad, 1);
        t = env_comm_timeout_s();
        ASSERT_FALSE(t.is_ok()) << bad;
        EXPECT_EQ(t.status().message(), std::string("EPINFER_COMM_TIMEOUT_S='") + bad +
                                            "': expected a positive number of seconds up to 1e+09");
    }
}

TEST_F(EnvTest, TableListsEveryVariable) {
    std::vector<std::string> names;
    for (const EnvVarInfo& v : env_vars()) names.push_back(v.name);
    EXPECT_THAT(names, ::testing::IsSupersetOf({"EPINFER_COMM_TIMEOUT_S", "EPINFER_MPIRUN"}));
}

TEST_F(EnvTest, WorldIsOneRankOutsideMpi) {
    if (launched_by_mpi()) GTEST_SKIP() << "running under an MPI launcher";
    setenv("EPINFER_COMM_TIMEOUT_S", "7", 1);
    Result<std::unique_ptr<Communicator>> world = create_world_communicator();
    ASSERT_TRUE(world.is_ok()) << world.status().message();
    EXPECT_EQ((*world)->size(), 1);
    EXPECT_EQ((*world)->timeout_s(), 7.0);
    setenv("EPINFER_COMM_TIMEOUT_S", "x", 1);
    EXPECT_FALSE(create_world_communicator().is_ok());
    EXPECT_TRUE(create_world_communicator({.timeout_s = 3.0}).is_ok());
}

}  // namespace
}  // namespace epinfer
