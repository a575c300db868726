// A rank that skips a collective or never sends makes its peers fail with kTimeout after
// EPINFER_COMM_TIMEOUT_S (ctest runs this with 2 s), naming the rank and the operation; nobody hangs.
// Run alone: EPINFER_COMM_TIMEOUT_S=2 mpirun ... epinfer_mpi_test --gtest_filter='Timeout.*'
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "mpi_test_world.h"

namespace epinfer::mpi_test {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

TEST(Timeout, SkippedCollectiveAndMissingSend) {
    Communicator& w = world();
    const int n = w.size(), r = w.rank();
    ASSERT_EQ(w.timeout_s(), 2.0) << "run with EPINFER_COMM_TIMEOUT_S=2";
    Result<std::unique_ptr<Communicator>> sub = w.split(0, r, "probe");
    ASSERT_TRUE(sub.is_ok()) << sub.status().message();
    Result<std::unique_ptr<Communicator>> pair = w.split(0, r, "pair");
    ASSERT_TRUE(pair.is_ok()) << pair.status().message();
    // The world waits for the slow ranks below; it must outlast their timeouts.
    w.set_timeout_s(60.0);

    // MPI may write into a timed-out operation's buffers until exit: keep them alive (static).
    static float reduce_buf[16];
    static int32_t recv_buf[4];
    if (r != 0) {
        // Rank 0 never joins this all_reduce.
        const auto start = std::chrono::steady_clock::now();
        Status s = (*sub)->all_reduce(reduce_buf, reduce_buf, 16, DType::kF32, ReduceOp::kSum);
        const double waited_s =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        EXPECT_EQ(s.code(), StatusCode::kTimeout);
        EXPECT_EQ(s.message(), "probe rank " + std::to_string(r) + "/" + std::to_string(n) + " (world rank " +
                                   std::to_string(r) + "/" + std::to_string(n) +
                                   "): all_reduce timed out after 2 s waiting for peers");
        EXPECT_GE(waited_s, 2.0);
        EXPECT_LT(waited_s, 20.0);
        // The broken communicator refuses further work at once.
        Status again = (*sub)->barrier();
        EXPECT_EQ(again.code(), StatusCode::kCommFailure);
        EXPECT_THAT(again.message(),
                    HasSubstr("barrier: the communicator is unusable after an earlier failure in "
                              "all_reduce"));
    }
    if (r == 1) {
        // Rank 0 never sends.
        Status s = (*pair)->recv(recv_buf, 4, DType::kI32, 0, 1);
        EXPECT_EQ(s.code(), StatusCode::kTimeout);
        EXPECT_THAT(s.message(), StartsWith("pair rank 1/"));
        EXPECT_THAT(s.message(), HasSubstr("recv timed out after 2 s waiting for peers"));
    }
    // Every rank meets here; the world is unaffected by the broken sub-groups.
    ASSERT_TRUE(w.barrier().is_ok());
    int64_t total = 1;
    ASSERT_TRUE(w.all_reduce(&total, &total, 1, DType::kI64, ReduceOp::kSum).is_ok());
    EXPECT_EQ(total, n);
}

}  // namespace
}  // namespace epinfer::mpi_test
