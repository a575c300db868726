// Runs the GoogleTest cases of tests/mpi on every rank of an mpirun job; rank 0 prints the usual report,
// the other ranks print only their failures (tagged with their rank). The exit status is non-zero on a
// rank whose tests failed, so mpirun (and ctest) fail too.
//   mpirun --allow-run-as-root --oversubscribe -np 4 build/tests/mpi/epinfer_mpi_test
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>

#include "mpi_test_world.h"

namespace epinfer::mpi_test {
namespace {

std::unique_ptr<Communicator> g_world;

// Prints failed assertions only, prefixed with the rank.
class FailurePrinter : public ::testing::EmptyTestEventListener {
public:
    explicit FailurePrinter(int rank) : rank_(rank) {}
    void OnTestPartResult(const ::testing::TestPartResult& result) override {
        if (!result.failed()) return;
        std::fprintf(stderr, "[rank %d] %s:%d: %s\n", rank_, result.file_name() ? result.file_name() : "?",
                     result.line_number(), result.summary());
    }

private:
    int rank_;
};

}  // namespace

Communicator& world() {
    return *g_world;
}

}  // namespace epinfer::mpi_test

int main(int argc, char** argv) {
    ::testing::InitGoogleTest(&argc, argv);
    auto world = epinfer::create_world_communicator();
    if (!world.is_ok()) {
        std::fprintf(stderr, "epinfer_mpi_test: %s\n", world.status().message().c_str());
        return 1;
    }
    epinfer::mpi_test::g_world = std::move(world).value();
    const int rank = epinfer::mpi_test::g_world->rank();
    if (rank != 0) {
        ::testing::TestEventListeners& listeners = ::testing::UnitTest::GetInstance()->listeners();
        delete listeners.Release(listeners.default_result_printer());
        listeners.Append(new epinfer::mpi_test::FailurePrinter(rank));
    }
    const int rc = RUN_ALL_TESTS();
    epinfer::mpi_test::g_world.reset();  // finalises MPI
    return rc;
}
