#include "comm/single_rank_communicator.h"

#include <fmt/format.h>

#include <cstring>
#include <deque>
#include <vector>

namespace epinfer {
namespace {

class SingleRankCommunicator final : public Communicator {
public:
    SingleRankCommunicator(CommIdentity identity, double timeout_s)
        : Communicator(std::move(identity), timeout_s) {}

    const char* backend_name() const override { return "single"; }

protected:
    Status do_all_reduce(const void* send, void* recv, int64_t count, DType dtype, ReduceOp) override {
        copy(send, recv, count, dtype);
        return Status::ok();
    }
    Status do_all_gather(const void* send, void* recv, int64_t count_per_rank, DType dtype) override {
        copy(send, recv, count_per_rank, dtype);
        return Status::ok();
    }
    Status do_reduce_scatter(const void* send, void* recv, int64_t count_per_rank, DType dtype,
                             ReduceOp) override {
        copy(send, recv, count_per_rank, dtype);
        return Status::ok();
    }
    Status do_all_to_all_v(const AllToAllVArgs& args) override {
        if (args.send_counts[0] != args.recv_counts[0]) {
            return invalid_argument(
                fmt::format("{}: all_to_all_v: sends {} elements to itself but expects {}", rank_label(),
                            args.send_counts[0], args.recv_counts[0]));
        }
        const size_t elem = dtype_size(args.dtype);
        if (args.send_counts[0] > 0) {
            std::memmove(static_cast<char*>(args.recv) + args.recv_displs[0] * elem,
                         static_cast<const char*>(args.send) + args.send_displs[0] * elem,
                         static_cast<size_t>(args.send_counts[0]) * elem);
        }
        return Status::ok();
    }
    Status do_send_recv(const SendRecvArgs& args) override {
        const size_t elem = dtype_size(args.dtype);
        if (args.send_peer == 0) {
            const auto* bytes = static_cast<const char*>(args.send);
            mailbox_.push_back({args.tag, std::vector<char>(bytes, bytes + args.send_count * elem)});
        }
        if (args.recv_peer != 0) return Status::ok();
        for (auto it = mailbox_.begin(); it != mailbox_.end(); ++it) {
            if (it->tag != args.tag) continue;
            const size_t want = static_cast<size_t>(args.recv_count) * elem;
            if (it->bytes.size() != want) {
                return invalid_argument(
                    fmt::format("{}: recv from rank 0 (tag {}): message of {} bytes, expected {}",
                                rank_label(), args.tag, it->bytes.size(), want));
            }
            if (want > 0) std::memcpy(args.recv, it->bytes.data(), want);
            mailbox_.erase(it);
            return Status::ok();
        }
        return comm_failure("recv", fmt::format("no message from rank 0 with tag {} was sent", args.tag));
    }
    Status do_broadcast(void*, int64_t, DType, int) override { return Status::ok(); }
    Status do_barrier() override { return Status::ok(); }
    Status do_synchronize() override { return Status::ok(); }
    Result<std::unique_ptr<Communicator>> do_split(int, int, const std::string& name) override {
        CommIdentity id = identity();
        id.name = name;
        return std::unique_ptr<Communicator>(new SingleRankCommunicator(std::move(id), timeout_s()));
    }

private:
    struct Message {
        int tag;
        std::vector<char> bytes;
    };

    static void copy(const void* send, void* recv, int64_t count, DType dtype) {
        if (count > 0 && send != recv)
            std::memcpy(recv, send, static_cast<size_t>(count) * dtype_size(dtype));
    }

    std::deque<Message> mailbox_;
};

}  // namespace

std::unique_ptr<Communicator> create_single_rank_communicator(double timeout_s) {
    return std::make_unique<SingleRankCommunicator>(CommIdentity{}, timeout_s);
}

}  // namespace epinfer
