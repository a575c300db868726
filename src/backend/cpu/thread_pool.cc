#include "backend/cpu/thread_pool.h"

#include <algorithm>

namespace epinfer {

namespace {
// Chunk c of num_chunks over [0, n).
std::pair<int64_t, int64_t> chunk_range(int64_t n, int c, int num_chunks) {
    return {n * c / num_chunks, n * (c + 1) / num_chunks};
}
}  // namespace

ThreadPool::ThreadPool(int num_threads) : num_threads_(std::max(1, num_threads)) {
    for (int i = 1; i < num_threads_; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        stopping_ = true;
    }
    work_ready_.notify_all();
    for (auto& w : workers_) w.join();
}

void ThreadPool::parallel_for(int64_t n, int64_t min_items_per_chunk,
                              const std::function<void(int64_t, int64_t)>& fn) {
    if (n <= 0) return;
    const int64_t max_chunks = std::max<int64_t>(1, n / std::max<int64_t>(1, min_items_per_chunk));
    const int num_chunks = static_cast<int>(std::min<int64_t>(num_threads_, max_chunks));
    if (num_chunks <= 1) {
        fn(0, n);
        return;
    }
    {
        std::lock_guard<std::mutex> lock(mutex_);
        fn_ = &fn;
        num_items_ = n;
        num_chunks_ = num_chunks;
        pending_ = num_chunks - 1;
        ++generation_;
    }
    work_ready_.notify_all();
    const auto [begin, end] = chunk_range(n, 0, num_chunks);
    fn(begin, end);
    std::unique_lock<std::mutex> lock(mutex_);
    work_done_.wait(lock, [this] { return pending_ == 0; });
    fn_ = nullptr;
}

void ThreadPool::worker_loop(int worker_idx) {
    uint64_t seen = 0;
    for (;;) {
        const std::function<void(int64_t, int64_t)>* fn;
        int64_t n;
        int num_chunks;
        {
            std::unique_lock<std::mutex> lock(mutex_);
            work_ready_.wait(lock, [&] { return stopping_ || generation_ != seen; });
            if (stopping_) return;
            seen = generation_;
            fn = fn_;
            n = num_items_;
            num_chunks = num_chunks_;
        }
        if (worker_idx >= num_chunks) continue;  // this round needs fewer threads
        const auto [begin, end] = chunk_range(n, worker_idx, num_chunks);
        (*fn)(begin, end);
        {
            std::lock_guard<std::mutex> lock(mutex_);
            --pending_;
        }
        work_done_.notify_one();
    }
}

}  // namespace epinfer
