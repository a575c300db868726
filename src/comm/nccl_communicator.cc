#include "comm/nccl_communicator.h"

#if EPINFER_WITH_NCCL

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <fmt/format.h>
#include <nccl.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace epinfer {
namespace {

using Clock = std::chrono::steady_clock;

Clock::time_point deadline_after(double timeout_s) {
    return Clock::now() +
           std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
}

// Polls spin briefly, then yield, then sleep 100 us (as the MPI backend), so waiting ranks leave the
// cores to their peers.
void backoff(int polls, Clock::time_point start) {
    if (polls < 64) return;
    if (Clock::now() - start < std::chrono::milliseconds(20)) {
        std::this_thread::yield();
    } else {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
}

// The NCCL entry points this backend uses, from libnccl.so.2 loaded at run time.
struct NcclApi {
    decltype(&ncclGetVersion) get_version = nullptr;
    decltype(&ncclGetUniqueId) get_unique_id = nullptr;
    decltype(&ncclCommInitRankConfig) comm_init_rank_config = nullptr;
    decltype(&ncclCommSplit) comm_split = nullptr;
    decltype(&ncclCommFinalize) comm_finalize = nullptr;
    decltype(&ncclCommDestroy) comm_destroy = nullptr;
    decltype(&ncclCommAbort) comm_abort = nullptr;
    decltype(&ncclCommGetAsyncError) comm_get_async_error = nullptr;
    decltype(&ncclCommCount) comm_count = nullptr;
    decltype(&ncclCommUserRank) comm_user_rank = nullptr;
    decltype(&ncclGetErrorString) get_error_string = nullptr;
    decltype(&ncclGetLastError) get_last_error = nullptr;
    decltype(&ncclAllReduce) all_reduce = nullptr;
    decltype(&ncclAllGather) all_gather = nullptr;
    decltype(&ncclReduceScatter) reduce_scatter = nullptr;
    decltype(&ncclBroadcast) broadcast = nullptr;
    decltype(&ncclSend) send = nullptr;
    decltype(&ncclRecv) recv = nullptr;
    decltype(&ncclGroupStart) group_start = nullptr;
    decltype(&ncclGroupEnd) group_end = nullptr;

    // The process-wide API, loaded once. Errors: kNotSupported naming dlopen's or dlsym's reason.
    static Result<const NcclApi*> get() {
        static std::once_flag once;
        static NcclApi api;
        static Status status;
        std::call_once(once, [] { status = api.load(); });
        if (!status.is_ok()) return status;
        return &api;
    }

    std::string error(ncclResult_t rc, ncclComm_t comm) const {
        const char* last = comm != nullptr ? get_last_error(comm) : nullptr;
        return fmt::format("NCCL error {} ({}){}{}", static_cast<int>(rc), get_error_string(rc),
                           last != nullptr && last[0] != '\0' ? ": " : "", last != nullptr ? last : "");
    }

private:
    Status load() {
        void* lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
        if (lib == nullptr) {
            const char* why = dlerror();
            return not_supported(
                fmt::format("nccl: cannot load libnccl.so.2 ({}); put NCCL on LD_LIBRARY_PATH",
                            why != nullptr ? why : "unknown reason"));
        }
        Status st = Status::ok();
        const auto bind = [&](auto& fn, const char* symbol) {
            fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, symbol));
            if (fn == nullptr && st.is_ok())
                st = not_supported(fmt::format("nccl: libnccl.so.2 lacks {}", symbol));
        };
        bind(get_version, "ncclGetVersion");
        bind(get_unique_id, "ncclGetUniqueId");
        bind(comm_init_rank_config, "ncclCommInitRankConfig");
        bind(comm_split, "ncclCommSplit");
        bind(comm_finalize, "ncclCommFinalize");
        bind(comm_destroy, "ncclCommDestroy");
        bind(comm_abort, "ncclCommAbort");
        bind(comm_get_async_error, "ncclCommGetAsyncError");
        bind(comm_count, "ncclCommCount");
        bind(comm_user_rank, "ncclCommUserRank");
        bind(get_error_string, "ncclGetErrorString");
        bind(get_last_error, "ncclGetLastError");
        bind(all_reduce, "ncclAllReduce");
        bind(all_gather, "ncclAllGather");
        bind(reduce_scatter, "ncclReduceScatter");
        bind(broadcast, "ncclBroadcast");
        bind(send, "ncclSend");
        bind(recv, "ncclRecv");
        bind(group_start, "ncclGroupStart");
        bind(group_end, "ncclGroupEnd");
        return st;  // the library stays loaded for the process
    }
};

ncclDataType_t nccl_reduce_type(DType dtype) {
    switch (dtype) {
        case DType::kF64:
            return ncclFloat64;
        case DType::kI32:
            return ncclInt32;
        case DType::kI64:
            return ncclInt64;
        default:
            return ncclFloat32;  // reductions take F32, F64, I32, I64 (checked by Communicator)
    }
}

ncclRedOp_t nccl_op(ReduceOp op) {
    switch (op) {
        case ReduceOp::kMax:
            return ncclMax;
        case ReduceOp::kMin:
            return ncclMin;
        default:
            return ncclSum;
    }
}

// Blocking communicators: an operation is queued on the stream before its call returns. A non-blocking one
// (blocking = 0) launched every collective from a thread of NCCL's own, and the host waited ~80 µs for it:
// on 2× H200 an 8 KiB all_reduce took 100 µs instead of 20, and a tp2 decode step of Qwen3-30B-A3B 13.9–14.9
// ms instead of 4.5–5.1 (docs/benchmarks/multi_gpu.md). The calls that wait for peers (init, split,
// finalize) run under call_with_deadline instead.
ncclConfig_t blocking_config() {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 1;
    return config;
}

// Runs `call` (an NCCL init, split or finalize: they wait for every peer) on a thread of its own and waits
// for it until `deadline`. Returns its result, or ncclInProgress past the deadline; the thread is then left
// to finish or block on its own, touching only what `call` owns (its captures, by value).
ncclResult_t call_with_deadline(std::function<ncclResult_t()> call, Clock::time_point deadline) {
    struct Outcome {
        std::mutex mu;
        std::condition_variable cv;
        bool done = false;
        ncclResult_t rc = ncclSuccess;
    };
    auto outcome = std::make_shared<Outcome>();
    std::thread([outcome, call = std::move(call)] {
        const ncclResult_t rc = call();
        std::lock_guard<std::mutex> lock(outcome->mu);
        outcome->rc = rc;
        outcome->done = true;
        outcome->cv.notify_all();
    }).detach();
    std::unique_lock<std::mutex> lock(outcome->mu);
    if (!outcome->cv.wait_until(lock, deadline, [&] { return outcome->done; })) return ncclInProgress;
    return outcome->rc;
}

// Polls `comm` until its last call has completed (an enqueue, which a blocking communicator finishes before
// it returns: normally the first poll) or failed; ncclInProgress past the deadline returns ncclInProgress.
ncclResult_t poll_until_ready(const NcclApi& api, ncclComm_t comm, Clock::time_point deadline) {
    const Clock::time_point start = Clock::now();
    for (int polls = 0;; ++polls) {
        ncclResult_t state = ncclSuccess;
        const ncclResult_t rc = api.comm_get_async_error(comm, &state);
        if (rc != ncclSuccess) return rc;
        if (state != ncclInProgress) return state;
        if (Clock::now() >= deadline) return ncclInProgress;
        backoff(polls, start);
    }
}

// What the communicators of one NCCL world (the world and its splits) share: the first failure or timeout
// of any of them. The rank's collectives are then out of step with its peers, so every one of them refuses
// further calls with it.
struct NcclHealth {
    std::mutex mu;
    Status failure;  // ok while usable

    // Records `why` as the world's failure unless an earlier one was (the first one wins).
    void record(const Status& why) {
        std::lock_guard<std::mutex> lock(mu);
        if (failure.is_ok()) failure = why;
    }
};

class NcclCommunicator final : public Communicator {
public:
    NcclCommunicator(CommIdentity identity, double timeout_s, const NcclApi& api, ncclComm_t comm, int device,
                     cudaStream_t stream, bool owns_stream, std::shared_ptr<NcclHealth> health)
        : Communicator(std::move(identity), timeout_s),
          api_(api),
          comm_(comm),
          device_(device),
          stream_(stream),
          owns_stream_(owns_stream),
          health_(std::move(health)),
          watchdog_([this] { watch(); }) {}

    ~NcclCommunicator() override {
        {
            std::lock_guard<std::mutex> lock(mu_);
            stopping_ = true;
        }
        wake_.notify_all();
        watchdog_.join();
        cudaSetDevice(device_);
        bool finalizing = false;  // a finalize past its deadline still runs: leave the comm and stream to it
        if (comm_ != nullptr) {
            // Finalize flushes the communicator's queued work (waiting for peers); bounded, else abort.
            const NcclApi* api = &api_;
            const ncclComm_t comm = comm_;
            const int device = device_;
            const ncclResult_t rc = call_with_deadline(
                [api, comm, device] {
                    cudaSetDevice(device);
                    return api->comm_finalize(comm);
                },
                deadline_after(timeout_s()));
            if (rc == ncclSuccess) {
                api_.comm_destroy(comm_);
            } else if (rc == ncclInProgress) {
                finalizing = true;
            } else {
                api_.comm_abort(comm_);
            }
        }
        for (const Pending& p : pending_) cudaEventDestroy(p.done);
        for (cudaEvent_t e : free_events_) cudaEventDestroy(e);
        if (barrier_buf_ != nullptr) cudaFree(barrier_buf_);
        if (owns_stream_ && stream_ != nullptr && !finalizing) cudaStreamDestroy(stream_);
    }

    const char* backend_name() const override { return "nccl"; }

protected:
    Status do_all_reduce(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op) override {
        const Clock::time_point deadline = deadline_after(timeout_s());
        std::lock_guard<std::mutex> lock(mu_);
        EPI_RETURN_IF_ERROR(usable("all_reduce"));
        const ncclResult_t rc = api_.all_reduce(send, recv, static_cast<size_t>(count),
                                                nccl_reduce_type(dtype), nccl_op(op), comm_, stream_);
        return queued("all_reduce", rc, deadline);
    }

    Status do_all_gather(const void* send, void* recv, int64_t count_per_rank, DType dtype) override {
        const Clock::time_point deadline = deadline_after(timeout_s());
        std::lock_guard<std::mutex> lock(mu_);
        EPI_RETURN_IF_ERROR(usable("all_gather"));
        const ncclResult_t rc =
            api_.all_gather(send, recv, bytes(count_per_rank, dtype), ncclUint8, comm_, stream_);
        return queued("all_gather", rc, deadline);
    }

    Status do_reduce_scatter(const void* send, void* recv, int64_t count_per_rank, DType dtype,
                             ReduceOp op) override {
        const Clock::time_point deadline = deadline_after(timeout_s());
        std::lock_guard<std::mutex> lock(mu_);
        EPI_RETURN_IF_ERROR(usable("reduce_scatter"));
        const ncclResult_t rc = api_.reduce_scatter(send, recv, static_cast<size_t>(count_per_rank),
                                                    nccl_reduce_type(dtype), nccl_op(op), comm_, stream_);
        return queued("reduce_scatter", rc, deadline);
    }

    Status do_all_to_all_v(const AllToAllVArgs& args) override {
        const Clock::time_point deadline = deadline_after(timeout_s());
        std::lock_guard<std::mutex> lock(mu_);
        EPI_RETURN_IF_ERROR(usable("all_to_all_v"));
        const size_t me = static_cast<size_t>(rank());
        if (args.send_counts[me] != args.recv_counts[me]) {
            return invalid_argument(
                fmt::format("{}: all_to_all_v: sends {} elements to itself but expects {}", rank_label(),
                            args.send_counts[me], args.recv_counts[me]));
        }
        const size_t elem = dtype_size(args.dtype);
        const auto* send = static_cast<const char*>(args.send);
        auto* recv = static_cast<char*>(args.recv);
        EPI_RETURN_IF_ERROR(device_copy("all_to_all_v", recv + args.recv_displs[me] * elem,
                                        send + args.send_displs[me] * elem,
                                        bytes(args.send_counts[me], args.dtype)));
        ncclResult_t rc = api_.group_start();
        for (size_t r = 0; r < static_cast<size_t>(size()) && rc == ncclSuccess; ++r) {
            if (r == me) continue;
            if (args.send_counts[r] > 0) {
                rc = api_.send(send + args.send_displs[r] * elem, bytes(args.send_counts[r], args.dtype),
                               ncclUint8, static_cast<int>(r), comm_, stream_);
            }
            if (rc == ncclSuccess && args.recv_counts[r] > 0) {
                rc = api_.recv(recv + args.recv_displs[r] * elem, bytes(args.recv_counts[r], args.dtype),
                               ncclUint8, static_cast<int>(r), comm_, stream_);
            }
        }
        const ncclResult_t end = api_.group_end();
        return queued("all_to_all_v", rc != ncclSuccess ? rc : end, deadline);
    }

    Status do_send_recv(const SendRecvArgs& args) override {
        const Clock::time_point deadline = deadline_after(timeout_s());
        const char* op = args.send_peer >= 0 && args.recv_peer >= 0 ? "send_recv"
                         : args.send_peer >= 0                      ? "send"
                                                                    : "recv";
        std::lock_guard<std::mutex> lock(mu_);
        EPI_RETURN_IF_ERROR(usable(op));
        const bool send_self = args.send_peer == rank(), recv_self = args.recv_peer == rank();
        if (send_self || recv_self) {
            if (!(send_self && recv_self) || args.send_count != args.recv_count) {
                return invalid_argument(
                    fmt::format("{}: {}: NCCL cannot queue a message to oneself: pair the send and the "
                                "receive of the same "
                                "count in one send_recv",
                                rank_label(), op));
            }
            return device_copy(op, args.recv, args.send, bytes(args.send_count, args.dtype));
        }
        ncclResult_t rc = api_.group_start();
        if (rc == ncclSuccess && args.send_peer >= 0) {
            rc = api_.send(args.send, bytes(args.send_count, args.dtype), ncclUint8, args.send_peer, comm_,
                           stream_);
        }
        if (rc == ncclSuccess && args.recv_peer >= 0) {
            rc = api_.recv(args.recv, bytes(args.recv_count, args.dtype), ncclUint8, args.recv_peer, comm_,
                           stream_);
        }
        const ncclResult_t end = api_.group_end();
        return queued(op, rc != ncclSuccess ? rc : end, deadline);
    }

    Status do_broadcast(void* buf, int64_t count, DType dtype, int root) override {
        const Clock::time_point deadline = deadline_after(timeout_s());
        std::lock_guard<std::mutex> lock(mu_);
        EPI_RETURN_IF_ERROR(usable("broadcast"));
        const ncclResult_t rc =
            api_.broadcast(buf, buf, bytes(count, dtype), ncclUint8, root, comm_, stream_);
        return queued("broadcast", rc, deadline);
    }

    Status do_barrier() override {
        const Clock::time_point deadline = deadline_after(timeout_s());
        {
            std::lock_guard<std::mutex> lock(mu_);
            EPI_RETURN_IF_ERROR(usable("barrier"));
            if (barrier_buf_ == nullptr) {
                cudaSetDevice(device_);
                if (cudaMalloc(&barrier_buf_, sizeof(int32_t)) != cudaSuccess) {
                    cudaGetLastError();
                    barrier_buf_ = nullptr;
                    return Status(StatusCode::kOutOfMemory,
                                  rank_label() + ": barrier: cannot allocate 4 bytes");
                }
            }
            const ncclResult_t rc =
                api_.all_reduce(barrier_buf_, barrier_buf_, 1, ncclInt32, ncclSum, comm_, stream_);
            EPI_RETURN_IF_ERROR(queued("barrier", rc, deadline));
        }
        return wait_for_stream("barrier", deadline);
    }

    Status do_synchronize() override { return wait_for_stream("synchronize", deadline_after(timeout_s())); }

    Result<std::unique_ptr<Communicator>> do_split(int color, int key, const std::string& name) override {
        const Clock::time_point deadline = deadline_after(timeout_s());
        std::lock_guard<std::mutex> lock(mu_);
        EPI_RETURN_IF_ERROR(usable("split"));
        // The split waits for every rank of this communicator: on a thread of its own, bounded. Past the
        // deadline that thread still uses comm_, so the world is marked failed without aborting it.
        const NcclApi* api = &api_;
        const ncclComm_t parent = comm_;
        const int device = device_;
        auto child = std::make_shared<ncclComm_t>(nullptr);
        const ncclResult_t rc = call_with_deadline(
            [api, parent, device, color, key, child] {
                cudaSetDevice(device);
                ncclConfig_t config = blocking_config();
                return api->comm_split(parent, color, key, child.get(), &config);
            },
            deadline);
        if (rc == ncclInProgress) {
            const Status why = timeout_error("split");
            health_->record(why);
            return why;
        }
        const ncclComm_t sub = *child;
        if (rc != ncclSuccess || sub == nullptr) {
            if (sub != nullptr) api_.comm_abort(sub);
            return fail("split", rc != ncclSuccess ? rc : ncclInternalError);
        }
        CommIdentity id = identity();
        id.name = name;
        api_.comm_user_rank(sub, &id.rank);
        api_.comm_count(sub, &id.size);
        cudaStream_t stream = stream_;
        if (owns_stream_ && cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
            cudaGetLastError();
            api_.comm_abort(sub);
            return comm_failure("split", "cannot create a CUDA stream");
        }
        return std::unique_ptr<Communicator>(new NcclCommunicator(std::move(id), timeout_s(), api_, sub,
                                                                  device_, stream, owns_stream_, health_));
    }

private:
    // An operation queued on the stream: `done` is recorded after it.
    struct Pending {
        cudaEvent_t done;
        Clock::time_point deadline;
        const char* op;
    };

    static size_t bytes(int64_t count, DType dtype) { return static_cast<size_t>(count) * dtype_size(dtype); }

    // kCommFailure once any communicator of this NCCL world has failed or timed out.
    Status usable(const char* op) const {
        std::lock_guard<std::mutex> lock(health_->mu);
        if (health_->failure.is_ok()) return Status::ok();
        return comm_failure(
            op, "the communicator is unusable after an earlier failure: " + health_->failure.message());
    }

    Status device_copy(const char* op, void* dst, const void* src, size_t num_bytes) {
        if (num_bytes == 0) return Status::ok();
        const cudaError_t err = cudaMemcpyAsync(dst, src, num_bytes, cudaMemcpyDeviceToDevice, stream_);
        if (err != cudaSuccess) {
            cudaGetLastError();
            return break_with(comm_failure(op, fmt::format("cudaMemcpyAsync: {}", cudaGetErrorString(err))));
        }
        return Status::ok();
    }

    // After the NCCL call that returned `start_rc` (mu_ held): waits until NCCL has queued it on the
    // stream (or aborts at `deadline`: kTimeout), then hands it to the watchdog.
    Status queued(const char* op, ncclResult_t start_rc, Clock::time_point deadline) {
        if (start_rc != ncclSuccess && start_rc != ncclInProgress) return fail(op, start_rc);
        const ncclResult_t enqueued = poll_until_ready(api_, comm_, deadline);
        if (enqueued == ncclInProgress) return break_with(timeout_error(op));
        if (enqueued != ncclSuccess) return fail(op, enqueued);
        cudaEvent_t done = nullptr;
        if (!free_events_.empty()) {
            done = free_events_.back();
            free_events_.pop_back();
        } else if (cudaEventCreateWithFlags(&done, cudaEventDisableTiming) != cudaSuccess) {
            cudaGetLastError();
            return break_with(comm_failure(op, "cannot create a CUDA event"));
        }
        if (cudaEventRecord(done, stream_) != cudaSuccess) {
            cudaGetLastError();
            cudaEventDestroy(done);
            return break_with(comm_failure(op, "cannot record a CUDA event"));
        }
        pending_.push_back({done, deadline, op});
        if (pending_.size() == 1) wake_.notify_all();
        return Status::ok();
    }

    // Polls the stream until it has run everything queued so far, the watchdog reports a failure, or
    // `deadline` (then breaks the communicator: kTimeout).
    Status wait_for_stream(const char* op, Clock::time_point deadline) {
        const Clock::time_point start = Clock::now();
        for (int polls = 0;; ++polls) {
            EPI_RETURN_IF_ERROR(usable(op));
            const cudaError_t q = cudaStreamQuery(stream_);
            if (q == cudaSuccess) return Status::ok();
            if (q != cudaErrorNotReady) {
                cudaGetLastError();
                std::lock_guard<std::mutex> lock(mu_);
                return break_with(
                    comm_failure(op, fmt::format("CUDA error {} while waiting", cudaGetErrorString(q))));
            }
            if (Clock::now() >= deadline) {
                std::lock_guard<std::mutex> lock(mu_);
                return break_with(timeout_error(op));
            }
            backoff(polls, start);
        }
    }

    // The watchdog thread: retires completed operations; the oldest one still running past its deadline,
    // or an asynchronous NCCL error, breaks the communicator (its NCCL kernels then exit, so the stream
    // and whatever waits on it move on).
    void watch() {
        cudaSetDevice(device_);
        std::unique_lock<std::mutex> lock(mu_);
        while (!stopping_) {
            wake_.wait_for(lock,
                           pending_.empty() ? std::chrono::milliseconds(200) : std::chrono::milliseconds(1));
            while (!pending_.empty()) {
                const Pending& oldest = pending_.front();
                const cudaError_t q = cudaEventQuery(oldest.done);
                if (q == cudaSuccess) {
                    free_events_.push_back(oldest.done);
                    pending_.pop_front();
                    continue;
                }
                if (q != cudaErrorNotReady) {
                    cudaGetLastError();
                    static_cast<void>(break_with(comm_failure(
                        oldest.op, fmt::format("CUDA error {} while running", cudaGetErrorString(q)))));
                    break;
                }
                ncclResult_t state = ncclSuccess;
                if (comm_ != nullptr) api_.comm_get_async_error(comm_, &state);
                if (state != ncclSuccess && state != ncclInProgress) {
                    static_cast<void>(fail(oldest.op, state));  // recorded for the next call
                } else if (Clock::now() >= oldest.deadline) {
                    static_cast<void>(break_with(timeout_error(oldest.op)));
                }
                break;
            }
        }
    }

    // Records `why` as the NCCL world's failure (the first one wins) and aborts this communicator (mu_
    // held); returns `why`.
    Status break_with(Status why) {
        health_->record(why);
        if (comm_ != nullptr) api_.comm_abort(comm_);
        comm_ = nullptr;
        for (const Pending& p : pending_) free_events_.push_back(p.done);
        pending_.clear();
        return why;
    }

    Status fail(const char* op, ncclResult_t rc) {
        return break_with(comm_failure(op, api_.error(rc, comm_)));
    }

    const NcclApi& api_;
    std::mutex mu_;  // guards comm_, pending_, free_events_, stopping_ (the NCCL calls and the watchdog's)
    std::condition_variable wake_;
    ncclComm_t comm_;
    int device_;
    cudaStream_t stream_;
    bool owns_stream_;
    std::shared_ptr<NcclHealth> health_;
    std::deque<Pending> pending_;  // oldest first
    std::vector<cudaEvent_t> free_events_;
    bool stopping_ = false;
    void* barrier_buf_ = nullptr;  // [1] int32, device
    std::thread watchdog_;         // last: starts once the members above exist
};

}  // namespace

bool nccl_available() {
    return true;
}

Result<std::unique_ptr<Communicator>> create_nccl_communicator(Communicator& bootstrap,
                                                               const NcclOptions& options) {
    const double timeout_s = options.timeout_s > 0.0 ? options.timeout_s : bootstrap.timeout_s();
    const std::string who = fmt::format("rank {}/{}", bootstrap.rank(), bootstrap.size());
    int num_devices = 0;
    if (cudaGetDeviceCount(&num_devices) != cudaSuccess || options.device < 0 ||
        options.device >= num_devices) {
        cudaGetLastError();
        return not_supported(fmt::format("{}: nccl: CUDA device {} does not exist ({} visible)", who,
                                         options.device, num_devices));
    }
    // Rank 0 makes the id; every rank learns whether that worked, so none waits on a failed peer.
    struct Bootstrap {
        int32_t ok;
        ncclUniqueId id;
    } boot = {};
    Result<const NcclApi*> api = NcclApi::get();
    if (bootstrap.rank() == 0 && api.is_ok())
        boot.ok = (*api)->get_unique_id(&boot.id) == ncclSuccess ? 1 : 0;
    EPI_RETURN_IF_ERROR_CTX(bootstrap.broadcast(&boot, sizeof(boot), DType::kU8, 0), "nccl bootstrap");
    if (!api.is_ok()) return api.status();
    if (boot.ok == 0)
        return Status(StatusCode::kCommFailure, who + ": nccl: rank 0 could not make the unique id");

    if (cudaSetDevice(options.device) != cudaSuccess) {
        cudaGetLastError();
        return not_supported(fmt::format("{}: nccl: cannot use CUDA device {}", who, options.device));
    }
    cudaStream_t stream = static_cast<cudaStream_t>(options.stream);
    const bool owns_stream = stream == nullptr;
    if (owns_stream && cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
        cudaGetLastError();
        return Status(StatusCode::kCommFailure, who + ": nccl: cannot create a CUDA stream");
    }
    const auto drop_stream = [&] {
        if (owns_stream) cudaStreamDestroy(stream);
    };
    const NcclApi& nccl = **api;
    // Every connection is made at init, so no later call waits for a peer on the host (NCCL otherwise
    // connects at an algorithm's first use); a user's own NCCL_RUNTIME_CONNECT is kept.
    setenv("NCCL_RUNTIME_CONNECT", "0", /*overwrite=*/0);
    // Init waits for every rank: on a thread of its own, bounded (past the deadline it is left behind).
    const NcclApi* nccl_api = &nccl;
    const int device = options.device, size = bootstrap.size(), rank = bootstrap.rank();
    const ncclUniqueId id = boot.id;
    auto slot = std::make_shared<ncclComm_t>(nullptr);
    const ncclResult_t rc = call_with_deadline(
        [nccl_api, device, size, rank, id, slot] {
            cudaSetDevice(device);
            ncclConfig_t config = blocking_config();
            return nccl_api->comm_init_rank_config(slot.get(), size, id, rank, &config);
        },
        deadline_after(timeout_s));
    const ncclComm_t comm = rc == ncclInProgress ? nullptr : *slot;
    if (rc != ncclSuccess || comm == nullptr) {
        const std::string why = rc == ncclInProgress
                                    ? fmt::format("timed out after {:g} s waiting for peers", timeout_s)
                                    : nccl.error(rc, comm);
        if (comm != nullptr) nccl.comm_abort(comm);
        drop_stream();
        return Status(rc == ncclInProgress ? StatusCode::kTimeout : StatusCode::kCommFailure,
                      fmt::format("{}: nccl init: {}", who, why));
    }
    return std::unique_ptr<Communicator>(new NcclCommunicator(bootstrap.identity(), timeout_s, nccl, comm,
                                                              options.device, stream, owns_stream,
                                                              std::make_shared<NcclHealth>()));
}

}  // namespace epinfer

#else  // !EPINFER_WITH_NCCL

namespace epinfer {

bool nccl_available() {
    return false;
}

Result<std::unique_ptr<Communicator>> create_nccl_communicator(Communicator&, const NcclOptions&) {
    return not_supported("epinfer was built without the NCCL communicator (EPINFER_CUDA=OFF)");
}

}  // namespace epinfer

#endif
