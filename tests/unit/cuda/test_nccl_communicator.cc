// The NCCL communicator (comm/nccl_communicator.h) at world size 1, bootstrapped over the single-rank
// communicator (no MPI): every operation on device buffers, split, the errors it reports before touching
// NCCL, and the watchdog that bounds a queued operation. Skips without a GPU, and with the loader's reason
// where libnccl.so.2 cannot be loaded. Operations return once queued on the communicator's stream: every
// result is read after synchronize() (synced_download).
#include <gtest/gtest.h>

#if EPINFER_WITH_CUDA
#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>

#include "comm/nccl_communicator.h"
#include "comm/single_rank_communicator.h"
#include "cuda_test_util.h"

namespace epinfer::test {
namespace {

class NcclCommunicatorTest : public CudaTest {
protected:
    void SetUp() override {
        CudaTest::SetUp();
        if (IsSkipped()) return;
        ASSERT_TRUE(nccl_available());
        bootstrap_ = create_single_rank_communicator(60.0);
        auto comm = create_nccl_communicator(*bootstrap_);
        if (!comm.is_ok() && comm.status().code() == StatusCode::kNotSupported) {
            GTEST_SKIP() << comm.status().message();
        }
        ASSERT_TRUE(comm.is_ok()) << comm.status().to_string();
        comm_ = std::move(comm).value();
    }

    std::unique_ptr<Communicator> bootstrap_;
    std::unique_ptr<Communicator> comm_;
};

// `count` elements of `device` once `comm` has finished what it queued.
template <typename T>
std::vector<T> synced_download(Communicator& comm, const void* device, size_t count) {
    const Status st = comm.synchronize();
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    return download<T>(device, count);
}

TEST_F(NcclCommunicatorTest, IdentityFollowsTheBootstrap) {
    EXPECT_STREQ(comm_->backend_name(), "nccl");
    EXPECT_EQ(comm_->rank(), 0);
    EXPECT_EQ(comm_->size(), 1);
    EXPECT_EQ(comm_->identity().name, "world");
    EXPECT_DOUBLE_EQ(comm_->timeout_s(), 60.0);
}

TEST_F(NcclCommunicatorTest, CollectivesOnDeviceBuffers) {
    const std::vector<float> host = random_floats(1000, 5);
    cuda::CudaBuffer in = upload(host);
    cuda::CudaBuffer out = poisoned<float>(host.size());
    ASSERT_TRUE(comm_->all_reduce(in.data(), out.data(), 1000, DType::kF32, ReduceOp::kSum).is_ok());
    EXPECT_EQ(synced_download<float>(*comm_, out.data(), host.size()), host);
    ASSERT_TRUE(
        comm_->all_reduce(in.data(), in.data(), 1000, DType::kF32, ReduceOp::kMax).is_ok());  // in place
    EXPECT_EQ(synced_download<float>(*comm_, in.data(), host.size()), host);

    cuda::CudaBuffer gathered = poisoned<float>(host.size());
    ASSERT_TRUE(comm_->all_gather(in.data(), gathered.data(), 1000, DType::kF32).is_ok());
    EXPECT_EQ(synced_download<float>(*comm_, gathered.data(), host.size()), host);

    const std::vector<int64_t> ints = {1, -2, 3, 1LL << 40};
    cuda::CudaBuffer i_in = upload(ints), i_out = poisoned<int64_t>(ints.size());
    ASSERT_TRUE(comm_->reduce_scatter(i_in.data(), i_out.data(), 4, DType::kI64, ReduceOp::kSum).is_ok());
    EXPECT_EQ(synced_download<int64_t>(*comm_, i_out.data(), ints.size()), ints);

    const std::vector<uint16_t> bf16 = random_bf16(77, 9, 3.0f);
    cuda::CudaBuffer b = upload(bf16);
    ASSERT_TRUE(comm_->broadcast(b.data(), 77, DType::kBF16, 0).is_ok());  // moved, never reduced
    EXPECT_EQ(synced_download<uint16_t>(*comm_, b.data(), bf16.size()), bf16);
    EXPECT_TRUE(comm_->barrier().is_ok());
}

TEST_F(NcclCommunicatorTest, PointToPointWithItself) {
    const std::vector<int32_t> host = {4, 8, 15, 16, 23, 42};
    cuda::CudaBuffer src = upload(host), dst = poisoned<int32_t>(host.size());
    SendRecvArgs pair;
    pair.send = src.data();
    pair.send_count = 6;
    pair.send_peer = 0;
    pair.recv = dst.data();
    pair.recv_count = 6;
    pair.recv_peer = 0;
    pair.dtype = DType::kI32;
    ASSERT_TRUE(comm_->send_recv(pair).is_ok());
    EXPECT_EQ(synced_download<int32_t>(*comm_, dst.data(), host.size()), host);
    // A lone send to oneself cannot be queued by NCCL: refused before anything is issued.
    EXPECT_EQ(comm_->send(src.data(), 6, DType::kI32, 0).code(), StatusCode::kInvalidArgument);

    cuda::CudaBuffer all = poisoned<int32_t>(8);
    const std::vector<int64_t> counts = {6}, send_displs = {0}, recv_displs = {2};
    AllToAllVArgs a2a;
    a2a.send = src.data();
    a2a.send_counts = counts;
    a2a.send_displs = send_displs;
    a2a.recv = all.data();
    a2a.recv_counts = counts;
    a2a.recv_displs = recv_displs;
    a2a.dtype = DType::kI32;
    ASSERT_TRUE(comm_->all_to_all_v(a2a).is_ok());
    const std::vector<int32_t> got = synced_download<int32_t>(*comm_, all.data(), 8);
    EXPECT_EQ(std::vector<int32_t>(got.begin() + 2, got.end()), host);
}

TEST_F(NcclCommunicatorTest, SplitMakesAWorkingSubGroup) {
    auto sub = comm_->split(0, 0, "tp");
    ASSERT_TRUE(sub.is_ok()) << sub.status().to_string();
    EXPECT_STREQ((*sub)->backend_name(), "nccl");
    EXPECT_EQ((*sub)->identity().name, "tp");
    EXPECT_EQ((*sub)->size(), 1);
    const std::vector<double> host = {0.5, -1.25};
    cuda::CudaBuffer buf = upload(host);
    ASSERT_TRUE((*sub)->all_reduce(buf.data(), buf.data(), 2, DType::kF64, ReduceOp::kSum).is_ok());
    EXPECT_EQ(synced_download<double>(**sub, buf.data(), 2), host);
}

TEST_F(NcclCommunicatorTest, ArgumentErrorsComeBeforeNccl) {
    cuda::CudaBuffer buf = poisoned<float>(4);
    EXPECT_EQ(comm_->all_reduce(buf.data(), buf.data(), 4, DType::kBF16, ReduceOp::kSum).code(),
              StatusCode::kNotSupported);
    EXPECT_EQ(comm_->broadcast(buf.data(), 4, DType::kF32, 1).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(comm_->all_reduce(nullptr, nullptr, 4, DType::kF32, ReduceOp::kSum).code(),
              StatusCode::kInvalidArgument);
    EXPECT_TRUE(comm_->barrier().is_ok()) << "argument errors leave the communicator usable";
}

TEST(NcclCommunicatorFactory, MissingDeviceIsNotSupported) {
    if (!cuda::cuda_require_device().is_ok()) GTEST_SKIP() << cuda::cuda_require_device().message();
    auto bootstrap = create_single_rank_communicator(5.0);
    NcclOptions options;
    options.device = 4096;
    auto comm = create_nccl_communicator(*bootstrap, options);
    EXPECT_EQ(comm.status().code(), StatusCode::kNotSupported) << comm.status().to_string();
}

// The watchdog: an all_reduce queued behind a stream that a host function holds past the 1 s timeout
// breaks the communicator; the call itself returned at once, and synchronize() and later calls report
// the timeout. Run in a child process (gtest's threadsafe death-test style re-executes this binary with
// only this test): the abort leaves NCCL state that the other tests of this process must not share.
void stuck_all_reduce_then_exit() {
    cudaStream_t stream = nullptr;
    if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) std::_Exit(2);
    auto bootstrap = create_single_rank_communicator(60.0);
    NcclOptions options;
    options.stream = stream;
    options.timeout_s = 1.0;
    auto comm = create_nccl_communicator(*bootstrap, options);
    if (!comm.is_ok()) std::_Exit(comm.status().code() == StatusCode::kNotSupported ? 0 : 3);
    static std::atomic<bool> release{false};
    const auto hold = [](void*) {  // bounded: 20 s
        for (int i = 0; i < 2000 && !release.load(); ++i)
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
    };
    if (cudaLaunchHostFunc(stream, hold, nullptr) != cudaSuccess) std::_Exit(4);
    void* buf = nullptr;
    if (cudaMalloc(&buf, 64) != cudaSuccess) std::_Exit(5);
    const auto start = std::chrono::steady_clock::now();
    const Status queued = (*comm)->all_reduce(buf, buf, 16, DType::kF32, ReduceOp::kSum);
    const double queue_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    const Status synced = (*comm)->synchronize();
    release = true;
    cudaStreamSynchronize(stream);
    const Status later = (*comm)->all_reduce(buf, buf, 16, DType::kF32, ReduceOp::kSum);
    std::fprintf(stderr, "queued %s in %.3f s\nsynchronize %s\nlater %s\n", queued.to_string().c_str(),
                 queue_s, synced.to_string().c_str(), later.to_string().c_str());
    const bool ok = queued.is_ok() && queue_s < 0.5 && synced.code() == StatusCode::kCommFailure &&
                    later.code() == StatusCode::kCommFailure;
    std::_Exit(ok ? 0 : 1);
}

TEST(NcclCommunicatorWatchdog, AQueuedOperationStuckPastTheTimeoutBreaksTheCommunicator) {
    if (!cuda::cuda_require_device().is_ok()) GTEST_SKIP() << cuda::cuda_require_device().message();
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    EXPECT_EXIT(stuck_all_reduce_then_exit(), ::testing::ExitedWithCode(0),
                "synchronize .*all_reduce timed out after 1 s waiting for peers\nlater .*unusable after an "
                "earlier failure");
}

}  // namespace
}  // namespace epinfer::test
#endif  // EPINFER_WITH_CUDA
