// The CPU backend's thread pool: disjoint chunks covering [0, n) exactly once, inline for small work.
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "backend/cpu/thread_pool.h"

namespace epinfer {
namespace {

TEST(ThreadPool, ChunksCoverEveryItemOnce) {
    ThreadPool pool(3);
    for (int round = 0; round < 50; ++round) {  // reuse across rounds
        const int64_t n = 1000 + round;
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        std::mutex mutex;
        std::set<std::thread::id> threads;
        int chunks = 0;
        pool.parallel_for(n, 1, [&](int64_t begin, int64_t end) {
            for (int64_t i = begin; i < end; ++i) hits[static_cast<size_t>(i)]++;
            std::lock_guard<std::mutex> lock(mutex);
            ++chunks;
            threads.insert(std::this_thread::get_id());
        });
        EXPECT_EQ(chunks, 3);
        EXPECT_EQ(threads.size(), 3u);
        for (const auto& h : hits) ASSERT_EQ(h.load(), 1);
    }
}

TEST(ThreadPool, SmallWorkRunsInlineOnTheCaller) {
    ThreadPool pool(4);
    int chunks = 0;
    std::thread::id where;
    pool.parallel_for(10, 8, [&](int64_t begin, int64_t end) {
        ++chunks;
        where = std::this_thread::get_id();
        EXPECT_EQ(begin, 0);
        EXPECT_EQ(end, 10);
    });
    EXPECT_EQ(chunks, 1);
    EXPECT_EQ(where, std::this_thread::get_id());
    pool.parallel_for(0, 1, [&](int64_t, int64_t) { ++chunks; });
    EXPECT_EQ(chunks, 1);
}

}  // namespace
}  // namespace epinfer
