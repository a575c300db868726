// A kernel timeline of any CUDA process, for reading where a step's time goes on a machine without Nsight
// Systems: a CUDA injection library (the driver loads it at cuInit when CUDA_INJECTION64_PATH names it) that
// records every kernel's start and end through CUPTI's activity API (CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
// kernels inside CUDA graphs included, with their graph ids) and writes them as CSV when the process exits.
//
//   LIB=build-gpu/src/libepinfer_kernel_trace.so   # target epinfer_kernel_trace of a CUDA build
//   CUDA_INJECTION64_PATH=$LIB EPINFER_KERNEL_TRACE=trace.csv epinfer bench ...
//   python3 bench/kernel_trace_summary.py trace.csv
//
// EPINFER_KERNEL_TRACE: the output file (required; without it nothing is recorded); "%p" in it is replaced
// by the process id, so that the ranks of an MPI run (which inherit the variable) write a file each.
// EPINFER_KERNEL_TRACE_MAX: the most kernels kept (default 2,000,000), the first ones.
// Columns: start_ns, end_ns (GPU timestamps), device, stream, graph_id (0: not in a graph), grid_x, block_x,
// name (demangled, without the parameter list). Kernels still running at exit, and records CUPTI dropped,
// are left out (the count of dropped ones is printed). Errors go to stderr; the traced process is not
// stopped.
#include <cupti.h>
#include <cxxabi.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

namespace {

constexpr size_t kBufferBytes = 8 << 20;

struct KernelRecord {
    uint64_t start, end;
    uint32_t device, stream, graph_id;
    int32_t grid_x, block_x;
    std::string name;
};

std::mutex g_mutex;
std::vector<KernelRecord> g_records;
size_t g_max_records = 2000000;
size_t g_dropped = 0;
std::string g_path;

std::string short_name(const char* mangled) {
    int status = 0;
    char* demangled = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
    std::string name = status == 0 && demangled != nullptr ? demangled : mangled;
    std::free(demangled);
    for (const std::string anon = "(anonymous namespace)::"; name.find(anon) != std::string::npos;) {
        name.erase(name.find(anon), anon.size());
    }
    // Drop the parameter list: the first '(' at template depth 0.
    int depth = 0;
    for (size_t i = 0; i < name.size(); ++i) {
        if (name[i] == '<') ++depth;
        if (name[i] == '>') --depth;
        if (name[i] == '(' && depth == 0 && i > 0) return name.substr(0, i);
    }
    return name;
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
    *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
    *size = kBufferBytes;
    *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext context, uint32_t stream, uint8_t* buffer, size_t,
                               size_t valid_size) {
    CUpti_Activity* record = nullptr;
    size_t dropped = 0;
    cuptiActivityGetNumDroppedRecords(context, stream, &dropped);
    std::lock_guard<std::mutex> lock(g_mutex);
    g_dropped += dropped;
    while (cuptiActivityGetNextRecord(buffer, valid_size, &record) == CUPTI_SUCCESS) {
        if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
        if (g_records.size() >= g_max_records) continue;
        const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
        if (k->start == 0 || k->end < k->start) continue;  // still running when a forced flush took it
        g_records.push_back({k->start, k->end, k->deviceId, k->streamId, k->graphId, k->gridX, k->blockX,
                             short_name(k->name)});
    }
    std::free(buffer);
}

void write_trace() {
    cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    std::lock_guard<std::mutex> lock(g_mutex);
    FILE* f = std::fopen(g_path.c_str(), "w");
    if (f == nullptr) {
        std::fprintf(stderr, "kernel_trace: cannot write %s\n", g_path.c_str());
        return;
    }
    std::fprintf(f, "start_ns,end_ns,device,stream,graph_id,grid_x,block_x,name\n");
    for (const KernelRecord& r : g_records) {
        std::fprintf(f, "%llu,%llu,%u,%u,%u,%d,%d,\"%s\"\n", static_cast<unsigned long long>(r.start),
                     static_cast<unsigned long long>(r.end), r.device, r.stream, r.graph_id, r.grid_x,
                     r.block_x, r.name.c_str());
    }
    std::fclose(f);
    std::fprintf(stderr, "kernel_trace: %zu kernels to %s (%zu records dropped by CUPTI)\n", g_records.size(),
                 g_path.c_str(), g_dropped);
}

}  // namespace

// Called by the CUDA driver at initialisation (CUDA_INJECTION64_PATH). Returns 1 when tracing started.
extern "C" int InitializeInjection(void) {
    const char* path = std::getenv("EPINFER_KERNEL_TRACE");
    if (path == nullptr || *path == '\0') return 0;
    g_path = path;
    if (const size_t at = g_path.find("%p"); at != std::string::npos)
        g_path.replace(at, 2, std::to_string(getpid()));
    if (const char* max = std::getenv("EPINFER_KERNEL_TRACE_MAX"))
        g_max_records = std::strtoull(max, nullptr, 10);
    if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
        std::fprintf(stderr, "kernel_trace: CUPTI activity tracing could not start\n");
        return 0;
    }
    std::atexit(write_trace);
    return 1;
}
