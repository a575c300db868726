// Every Communicator operation across MPI ranks, checked with rank-coded data (each value names the
// rank that produced it and its position), for 2, 3 and 4 ranks.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <time.h>

#include <chrono>
#include <cstdint>
#include <numeric>
#include <thread>
#include <vector>

#include "core/dtype.h"
#include "mpi_test_world.h"

namespace epinfer::mpi_test {
namespace {

using ::testing::HasSubstr;

TEST(Comm, WorldIsMpi) {
    Communicator& w = world();
    EXPECT_STREQ(w.backend_name(), "mpi");
    EXPECT_GE(w.size(), 2);
    EXPECT_EQ(w.identity().world_rank, w.rank());
    EXPECT_EQ(w.identity().world_size, w.size());
}

TEST(Comm, AllReduceEveryDtypeAndOp) {
    Communicator& w = world();
    const int n = w.size(), r = w.rank();
    // Sizes that take MPI's small and large-message algorithms, and zero.
    for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{37}, int64_t{100003}}) {
        std::vector<float> f(static_cast<size_t>(count)), f_out(static_cast<size_t>(count), -1.0f);
        std::vector<int64_t> l(static_cast<size_t>(count)), l_out(static_cast<size_t>(count), -1);
        std::vector<int32_t> i32(static_cast<size_t>(count));
        std::vector<double> d(static_cast<size_t>(count));
        for (int64_t i = 0; i < count; ++i) {
            f[static_cast<size_t>(i)] = static_cast<float>(r * 1000 + i % 1000);
            l[static_cast<size_t>(i)] = int64_t{r} << 40 | i;
            i32[static_cast<size_t>(i)] = (r + 1) * static_cast<int32_t>(i % 7 + 1);
            d[static_cast<size_t>(i)] = 0.5 * r - static_cast<double>(i);
        }
        ASSERT_TRUE(w.all_reduce(f.data(), f_out.data(), count, DType::kF32, ReduceOp::kSum).is_ok());
        ASSERT_TRUE(w.all_reduce(l.data(), l_out.data(), count, DType::kI64, ReduceOp::kMax).is_ok());
        ASSERT_TRUE(
            w.all_reduce(i32.data(), i32.data(), count, DType::kI32, ReduceOp::kSum).is_ok());  // in place
        ASSERT_TRUE(w.all_reduce(d.data(), d.data(), count, DType::kF64, ReduceOp::kMin).is_ok());
        const int64_t rank_sum = int64_t{n} * (n - 1) / 2;
        for (int64_t i = 0; i < count; ++i) {
            const size_t k = static_cast<size_t>(i);
            ASSERT_EQ(f_out[k], static_cast<float>(rank_sum * 1000 + n * (i % 1000)))
                << "count " << count << " i " << i;
            ASSERT_EQ(l_out[k], int64_t{n - 1} << 40 | i);
            ASSERT_EQ(i32[k], static_cast<int32_t>(n * (n + 1) / 2 * (i % 7 + 1)));
            ASSERT_EQ(d[k], -static_cast<double>(i));
        }
    }
}

TEST(Comm, AllGatherAndInPlace) {
    Communicator& w = world();
    const int n = w.size(), r = w.rank();
    const int64_t c = 5;
    std::vector<int32_t> mine(c), all(static_cast<size_t>(n * c), -1);
    for (int64_t i = 0; i < c; ++i) mine[static_cast<size_t>(i)] = r * 100 + static_cast<int32_t>(i);
    ASSERT_TRUE(w.all_gather(mine.data(), all.data(), c, DType::kI32).is_ok());
    for (int s = 0; s < n; ++s) {
        for (int64_t i = 0; i < c; ++i) ASSERT_EQ(all[static_cast<size_t>(s * c + i)], s * 100 + i);
    }
    // In place (NCCL convention): this rank's block already sits at recv + rank·count; bf16 is moved as is.
    std::vector<uint16_t> bf(static_cast<size_t>(n * c), 0xFFFF);
    for (int64_t i = 0; i < c; ++i)
        bf[static_cast<size_t>(r * c + i)] = f32_to_bf16(static_cast<float>(r + i));
    ASSERT_TRUE(w.all_gather(bf.data() + r * c, bf.data(), c, DType::kBF16).is_ok());
    for (int s = 0; s < n; ++s) {
        for (int64_t i = 0; i < c; ++i) ASSERT_EQ(bf16_to_f32(bf[static_cast<size_t>(s * c + i)]), s + i);
    }
    // Zero elements.
    ASSERT_TRUE(w.all_gather(nullptr, nullptr, 0, DType::kF32).is_ok());
}

TEST(Comm, ReduceScatter) {
    Communicator& w = world();
    const int n = w.size(), r = w.rank();
    const int64_t c = 3;
    std::vector<float> send(static_cast<size_t>(n * c)), recv(c, -1.0f);
    // Rank r contributes (r + 1)·(j + 1) at index j; block b of the sum is Σ_r (r + 1)·(j + 1).
    for (int64_t j = 0; j < n * c; ++j) send[static_cast<size_t>(j)] = static_cast<float>((r + 1) * (j + 1));
    ASSERT_TRUE(w.reduce_scatter(send.data(), recv.data(), c, DType::kF32, ReduceOp::kSum).is_ok());
    for (int64_t i = 0; i < c; ++i) {
        const int64_t j = r * c + i;
        ASSERT_EQ(recv[static_cast<size_t>(i)], static_cast<float>(n * (n + 1) / 2 * (j + 1)));
    }
}

// Elements rank s sends to rank d: uneven, and zero for some pairs (including s = d for some ranks).
int64_t pair_count(int s, int d) {
    return (s * 3 + d * 5 + 1) % 4;
}
int64_t code(int s, int d, int64_t i) {
    return int64_t{s} * 1000000 + d * 1000 + i;
}

TEST(Comm, AllToAllVUnevenZeroAndGappedDisplacements) {
    Communicator& w = world();
    const int n = w.size(), r = w.rank();
    std::vector<int64_t> sc(n), sd(n), rc(n), rd(n);
    // Send blocks in order with one padding element between them; receive blocks in reverse rank order.
    int64_t off = 0;
    for (int d = 0; d < n; ++d) {
        sc[d] = pair_count(r, d);
        sd[d] = off;
        off += sc[d] + 1;
    }
    std::vector<int64_t> send(static_cast<size_t>(off), -7);
    for (int d = 0; d < n; ++d) {
        for (int64_t i = 0; i < sc[d]; ++i) send[static_cast<size_t>(sd[d] + i)] = code(r, d, i);
    }
    int64_t roff = 0;
    for (int s = n - 1; s >= 0; --s) {
        rc[s] = pair_count(s, r);
        rd[s] = roff;
        roff += rc[s];
    }
    std::vector<int64_t> recv(static_cast<size_t>(roff) + 1, -9);  // one guard element at the end
    ASSERT_TRUE(w.all_to_all_v({send.data(), sc, sd, recv.data(), rc, rd, DType::kI64}).is_ok());
    for (int s = 0; s < n; ++s) {
        for (int64_t i = 0; i < rc[s]; ++i) ASSERT_EQ(recv[static_cast<size_t>(rd[s] + i)], code(s, r, i));
    }
    EXPECT_EQ(recv.back(), -9);
}

TEST(Comm, AllToAllVAllZeroAndOneRankSendsEverything) {
    Communicator& w = world();
    const int n = w.size(), r = w.rank();
    std::vector<int64_t> zero(n, 0);
    ASSERT_TRUE(w.all_to_all_v({nullptr, zero, zero, nullptr, zero, zero, DType::kF32}).is_ok());
    // Only the last rank sends (40 floats to each rank); everyone receives only from it.
    const int64_t c = 40;
    std::vector<int64_t> sc(n, 0), sd(n, 0), rc(n, 0), rd(n, 0);
    std::vector<float> send;
    if (r == n - 1) {
        send.resize(static_cast<size_t>(n * c));
        for (int d = 0; d < n; ++d) {
            sc[d] = c;
            sd[d] = d * c;
            for (int64_t i = 0; i < c; ++i)
                send[static_cast<size_t>(d * c + i)] = static_cast<float>(d * 100 + i);
        }
    }
    rc[n - 1] = c;
    std::vector<float> recv(c, -1.0f);
    ASSERT_TRUE(
        w.all_to_all_v({send.empty() ? nullptr : send.data(), sc, sd, recv.data(), rc, rd, DType::kF32})
            .is_ok());
    for (int64_t i = 0; i < c; ++i) ASSERT_EQ(recv[static_cast<size_t>(i)], static_cast<float>(r * 100 + i));
}

// Regression: Open MPI's non-blocking collectives took equal send and receive pointers on one rank (here
// the placeholders for null buffers) as in place, and the next collective then stalled on every rank.
TEST(Comm, EmptyRankBesideASelfOnlyRankThenAnotherCollective) {
    Communicator& w = world();
    const int n = w.size(), r = w.rank();
    for (int round = 0; round < 3; ++round) {
        std::vector<int64_t> zero(n, 0), sc(n, 0), sd(n, 0);
        std::vector<char> send(192, static_cast<char>(r + 1)), recv(192, 0);
        if (r == 0) {
            sc[0] = 192;
            ASSERT_TRUE(w.all_to_all_v({send.data(), sc, sd, recv.data(), sc, sd, DType::kU8}).is_ok());
            EXPECT_EQ(recv[191], 1);
        } else {
            ASSERT_TRUE(w.all_to_all_v({nullptr, zero, zero, nullptr, zero, zero, DType::kU8}).is_ok());
        }
        ASSERT_TRUE(w.reduce_scatter(nullptr, nullptr, 0, DType::kF32, ReduceOp::kSum).is_ok());
        // In place on rank 0 only.
        int64_t a = r + 1, b = 0;
        ASSERT_TRUE((r == 0 ? w.all_reduce(&a, &a, 1, DType::kI64, ReduceOp::kSum)
                            : w.all_reduce(&a, &b, 1, DType::kI64, ReduceOp::kSum))
                        .is_ok());
        EXPECT_EQ(r == 0 ? a : b, int64_t{n} * (n + 1) / 2);
        std::vector<int64_t> three(n, 3), displs(n);
        for (int d = 0; d < n; ++d) displs[d] = 3 * d;
        std::vector<int64_t> out(3 * n, -1), in(3 * n, r);
        ASSERT_TRUE(
            w.all_to_all_v({in.data(), three, displs, out.data(), three, displs, DType::kI64}).is_ok());
        for (int s = 0; s < n; ++s) ASSERT_EQ(out[3 * s + 2], s);
    }
}

TEST(Comm, BroadcastFromEveryRoot) {
    Communicator& w = world();
    for (int root = 0; root < w.size(); ++root) {
        std::vector<int64_t> buf(1000, -1);
        if (w.rank() == root) std::iota(buf.begin(), buf.end(), int64_t{root} * 10000);
        ASSERT_TRUE(w.broadcast(buf.data(), 1000, DType::kI64, root).is_ok());
        for (int64_t i = 0; i < 1000; ++i) ASSERT_EQ(buf[static_cast<size_t>(i)], root * 10000 + i);
    }
}

// A long wait for a peer (an idle follower waits up to 0.5 s for rank 0's next step) sleeps longer between
// polls as it goes on: 2 s in a broadcast cost a waiting rank 0.2 to 0.3 s of CPU with polls 100 us apart,
// about 0.06 s now.
TEST(Comm, LongWaitPollsCheaply) {
    Communicator& w = world();
    int64_t value = -1;
    if (w.rank() == 0) {
        std::this_thread::sleep_for(std::chrono::seconds(2));
        value = 42;
    }
    timespec start{}, end{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &start);
    ASSERT_TRUE(w.broadcast(&value, 1, DType::kI64, 0).is_ok());
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &end);
    EXPECT_EQ(value, 42);
    const double cpu_s =
        static_cast<double>(end.tv_sec - start.tv_sec) + 1e-9 * static_cast<double>(end.tv_nsec - start.tv_nsec);
    if (w.rank() != 0) {
        EXPECT_LT(cpu_s, 0.15) << "rank " << w.rank() << ": CPU seconds waiting 2 s in a broadcast";
    }
}

TEST(Comm, SendRecvRingLargeMessages) {
    Communicator& w = world();
    const int n = w.size(), r = w.rank();
    const int64_t count = 1 << 20;  // 4 MiB: past the eager limit, so both halves must be posted together
    std::vector<float> send(static_cast<size_t>(count)), recv(static_cast<size_t>(count), -1.0f);
    for (int64_t i = 0; i < count; ++i) send[static_cast<size_t>(i)] = static_cast<float>(r * 4 + i % 4);
    SendRecvArgs args;
    args.send = send.data();
    args.send_count = count;
    args.send_peer = (r + 1) % n;
    args.recv = recv.data();
    args.recv_count = count;
    args.recv_peer = (r + n - 1) % n;
    args.dtype = DType::kF32;
    args.tag = 3;
    ASSERT_TRUE(w.send_recv(args).is_ok());
    const int from = (r + n - 1) % n;
    for (int64_t i = 0; i < count; ++i)
        ASSERT_EQ(recv[static_cast<size_t>(i)], static_cast<float>(from * 4 + i % 4));
}

TEST(Comm, SendThenRecvAlongAChain) {
    // Pipeline-style: rank 0 sends to 1, 1 forwards to 2, ...; each adds its rank.
    Communicator& w = world();
    const int n = w.size(), r = w.rank();
    std::vector<int32_t> acts(64, 0);
    if (r > 0) {
        ASSERT_TRUE(w.recv(acts.data(), 64, DType::kI32, r - 1, 5).is_ok());
    }
    for (int32_t& a : acts) a += r + 1;
    if (r + 1 < n) {
        ASSERT_TRUE(w.send(acts.data(), 64, DType::kI32, r + 1, 5).is_ok());
    }
    for (int32_t a : acts) ASSERT_EQ(a, (r + 1) * (r + 2) / 2);
}

TEST(Comm, RecvOfAShorterMessageIsAnError) {
    Communicator& w = world();
    const int r = w.rank();
    int32_t buf[4] = {1, 2, 3, 4};
    if (r == 0) {
        ASSERT_TRUE(w.send(buf, 3, DType::kI32, 1, 9).is_ok());
    } else if (r == 1) {
        Status s = w.recv(buf, 4, DType::kI32, 0, 9);
        EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
        EXPECT_THAT(s.message(), HasSubstr("rank 1/"));
        EXPECT_THAT(s.message(), HasSubstr("recv from rank 0 (tag 9): got 3 elements, expected 4"));
    }
    ASSERT_TRUE(w.barrier().is_ok());  // the communicator is still usable
}

TEST(Comm, SplitByParityInReverseOrder) {
    Communicator& w = world();
    const int n = w.size(), r = w.rank();
    Result<std::unique_ptr<Communicator>> sub = w.split(r % 2, -r, "parity");
    ASSERT_TRUE(sub.is_ok()) << sub.status().message();
    Communicator& g = **sub;
    std::vector<int> members;
    for (int q = n - 1; q >= 0; --q) {
        if (q % 2 == r % 2) members.push_back(q);
    }
    ASSERT_EQ(g.size(), static_cast<int>(members.size()));
    EXPECT_EQ(members[static_cast<size_t>(g.rank())], r);
    EXPECT_EQ(g.identity().name, "parity");
    EXPECT_EQ(g.identity().world_rank, r);
    std::vector<int32_t> gathered(members.size(), -1);
    const int32_t mine = r;
    ASSERT_TRUE(g.all_gather(&mine, gathered.data(), 1, DType::kI32).is_ok());
    EXPECT_EQ(gathered, std::vector<int32_t>(members.begin(), members.end()));
    // The parent still works after the split, and the groups are independent.
    int64_t total = r;
    ASSERT_TRUE(w.all_reduce(&total, &total, 1, DType::kI64, ReduceOp::kSum).is_ok());
    EXPECT_EQ(total, n * (n - 1) / 2);
}

}  // namespace
}  // namespace epinfer::mpi_test
