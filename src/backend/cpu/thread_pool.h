// A small fixed pool of std::threads for the CPU reference kernels.
//
// parallel_for splits [0, n) into contiguous chunks, one per thread; every item is processed by exactly
// one thread, so a kernel that computes each output element inside one item gives results independent of
// the thread count.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace epinfer {

class ThreadPool {
public:
    // num_threads ≥ 1 counts the calling thread: num_threads − 1 workers are started.
    explicit ThreadPool(int num_threads);
    ~ThreadPool();
    ThreadPool(const ThreadPool&) = delete;
    ThreadPool& operator=(const ThreadPool&) = delete;

    int num_threads() const { return num_threads_; }

    // Calls fn(begin, end) on disjoint chunks covering [0, n); returns when all are done. Runs inline
    // when n < 2·min_items_per_chunk. Not reentrant: fn must not call parallel_for.
    void parallel_for(int64_t n, int64_t min_items_per_chunk,
                      const std::function<void(int64_t, int64_t)>& fn);

private:
    void worker_loop(int worker_idx);

    int num_threads_;
    std::vector<std::thread> workers_;
    std::mutex mutex_;
    std::condition_variable work_ready_;
    std::condition_variable work_done_;
    const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
    int64_t num_items_ = 0;
    int num_chunks_ = 0;
    uint64_t generation_ = 0;
    int pending_ = 0;
    bool stopping_ = false;
};

}  // namespace epinfer
