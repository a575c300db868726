// Hardware profiles: the figures of one machine that the planner's cost and memory models read.
//
// A profile is a JSON file (schema in docs/planner.md, "epinfer.hardware_profile/1"): one GPU (memory,
// usable fraction, memory bandwidth, dense bf16/fp8/fp4 matrix rates, kernel launch overheads and latency,
// efficiencies), the intra-node link and optionally the inter-node link, each with a latency and a bus
// bandwidth per collective (all_reduce, all_gather, all_to_all, send_recv) and optionally tables of
// measured times over message size, one per group size. Every figure records where it came from (datasheet, measured, estimate)
// and its source. Shipped profiles live in the project's profiles/ folder; `epinfer bench comm` writes the
// same format.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"

namespace epinfer::planner {

enum class Provenance {
    kDatasheet,    // vendor or spec-database figure
    kMeasured,     // measured (by us or a cited third party)
    kEstimate,     // derived or assumed; the source says from what
    kUnspecified,  // a bare number in a user profile
};
const char* provenance_name(Provenance provenance);

// One figure of a profile and where it came from.
struct Figure {
    double value = 0.0;
    Provenance provenance = Provenance::kUnspecified;
    std::string source;  // e.g. "FACTS.md C.2 [H3c]"
};

enum class LinkKind { kNvlink, kPcieP2p, kPcieNoP2p, kInfiniband, kEthernet };
// "nvlink", "pcie_p2p", "pcie_no_p2p", "infiniband", "ethernet".
const char* link_kind_name(LinkKind kind);

enum class Collective { kAllReduce = 0, kAllGather = 1, kAllToAll = 2, kSendRecv = 3 };
inline constexpr int kNumCollectives = 4;
// "all_reduce", "all_gather", "all_to_all", "send_recv" (the JSON keys).
const char* collective_name(Collective collective);

// Measured times of one collective at a fixed group size, over message size. `bytes` is the "size"
// column of nccl-tests (all_reduce: the buffer each rank reduces; all_gather: the gathered output;
// all_to_all: each rank's whole send buffer; send_recv: the message).
struct SizeTable {
    int ranks = 0;                                  // group size the table was measured at
    std::vector<std::pair<double, double>> points;  // (bytes, time_us), bytes strictly ascending
    Provenance provenance = Provenance::kUnspecified;
    std::string source;
};

// Cost of one collective: time = latency + size · factor(n) / bus_bandwidth (nccl-tests busbw
// convention, cost_model.h), or the table measured at the group size n in question when there is one.
struct CollectiveSpec {
    Figure latency_us;
    Figure bus_bandwidth_gbps;     // GB/s = 1e9 bytes/s
    std::vector<SizeTable> tables;  // ranks strictly ascending, each with points; empty = none

    // The table measured at `ranks`, or nullptr when there is none.
    const SizeTable* table_for(int ranks) const;
};

struct LinkSpec {
    LinkKind kind = LinkKind::kNvlink;
    std::array<CollectiveSpec, kNumCollectives> collectives;
    const CollectiveSpec& operator[](Collective c) const { return collectives[static_cast<int>(c)]; }
};

// gpu.expert_memory_efficiency_by_rows: the fraction of memory_bandwidth_gbps the routed experts' GEMMs
// stream weights at, by the rows (token-expert pairs) each touched expert computes. At few rows per expert
// the engine runs a gemv-like tile whose ramp and waves hold it below the rate of large batches.
// gpu.expert_matmul_efficiency_by_rows: the fraction of the tensor-core rate they reach, by the same rows
// (the wgmma tiles fill as the rows grow).
struct RowsEfficiencyPoint {
    double rows_per_expert = 0.0;  // token-expert pairs per touched expert, > 0
    double efficiency = 0.0;       // (0, 1]
};
struct RowsEfficiencyTable {
    std::vector<RowsEfficiencyPoint> points;  // rows_per_expert strictly ascending; empty = none
    Provenance provenance = Provenance::kUnspecified;
    std::string source;
};

struct GpuSpec {
    std::string name;
    Figure memory_bytes;            // device memory
    Figure usable_memory_fraction;  // of memory_bytes the plan may use (driver, context, fragmentation)
    Figure memory_bandwidth_gbps;   // GB/s
    Figure bf16_tflops;             // dense tensor-core rate, fp32 accumulate
    Figure fp8_tflops;              // 0 = no fp8 tensor cores
    Figure fp4_tflops;              // 0 = no fp4 tensor cores
    Figure kernel_launch_us;        // back-to-back launches from the host (eager)
    Figure graph_kernel_us;         // per kernel node inside a CUDA graph (decode runs under graphs)
    // Optional (absent: 0). A dependent kernel's own shortest time beyond bytes / bandwidth and FLOPs / rate
    // (DRAM round trips, ramp-up, tail); each kernel of a step costs graph_kernel_us + kernel_latency_us.
    Figure kernel_latency_us;
    // Optional (absent: kernel_launch_us). Per kernel the host launches directly inside a step (no CUDA
    // graph: every step on more than one rank, prompt chunks, more than 256 rows; engine_facts.h): the
    // gap the GPU sees between dependent kernels; such a kernel costs eager_kernel_us + kernel_latency_us.
    Figure eager_kernel_us;
    // Optional (absent: 0). Per host round trip inside a step: the GPU idles while the host waits for it
    // (a synchronous device↔host copy), copies, exchanges with the other ranks over MPI and launches again.
    // The engine makes kEngineDpMoeHostRoundTrips of them per MoE layer under DP attention (engine_facts.h).
    Figure host_round_trip_us;
    // Optional (absent: 0). µs more per host round trip for each token row the rank holds in the step: the
    // host's copies and loops over the step's routing grow with its rows (2× H200, Qwen3-30B-A3B dp2-ep2:
    // 11 µs a round trip at one row, 30 at 128; docs/benchmarks/planner.md).
    Figure host_round_trip_us_per_row;
    // (No per-collective sync figure: the engine's NCCL calls return once queued on the stream, so a
    // collective costs its measured time alone; a profile with gpu.collective_sync_us is refused.)
    Figure memory_efficiency;  // achievable fraction of memory_bandwidth_gbps in GEMV-like kernels
    Figure matmul_efficiency;  // achievable fraction of the tensor-core rates in GEMMs
    // Optional (absent: matmul_efficiency). The fraction the routed experts' grouped GEMMs reach.
    Figure expert_matmul_efficiency;
    // Optional (absent: matmul_efficiency). The fraction of bf16_tflops the attention scores of GQA prompt
    // chunks reach (causal FLOPs over the KV cache, engine_facts.h: the flash-prefill kernel); their KV
    // bytes stream at memory_efficiency. GQA decode rows are bound by their KV bytes, at memory_efficiency.
    Figure prefill_attention_matmul_efficiency;
    // Optional (absent: matmul_efficiency). The fraction of bf16_tflops MLA's absorbed attention over the
    // latent cache reaches, decode rows and prompt chunks alike (one latent-attention kernel: its loop is
    // bound by the score MMAs, docs/benchmarks/attention_h200.md); the latent bytes at memory_efficiency.
    Figure latent_attention_matmul_efficiency;
    // Optional (absent: no points, memory_efficiency at any rows). The routed experts' weight bytes stream
    // at memory_bandwidth_gbps × this table at the step's rows per touched expert (cost_model.h
    // expert_memory_efficiency: interpolated, clamped at the ends).
    RowsEfficiencyTable expert_memory_efficiency_by_rows;
    // Optional (absent: no points, expert_matmul_efficiency at any rows). The routed experts' FLOPs run at
    // the tensor-core rate × this table at the step's rows per touched expert (cost_model.h
    // expert_matmul_efficiency: interpolated, clamped at the ends).
    RowsEfficiencyTable expert_matmul_efficiency_by_rows;

    // memory_bytes · usable_memory_fraction.
    int64_t usable_bytes() const;
};

struct HardwareProfile {
    std::string name;  // e.g. "h200_sxm"
    std::string description;
    std::string path;       // file it was read from ("" when parsed from text)
    int gpus_per_node = 1;  // most GPUs one node of this system holds
    GpuSpec gpu;
    LinkSpec intra_node;
    std::optional<LinkSpec> inter_node;  // absent: single-node system only
};

// Parses the JSON text of a profile. `source` names the file in error messages.
// Errors: kInvalidArgument, one line "SOURCE: KEY.PATH: problem", for malformed JSON, a missing or
// unknown key, a wrong type, a value out of range (memory ≤ 0, a fraction outside (0, 1], a negative
// rate, a link kind not allowed where it is, table sizes not ascending, two tables of one collective at
// one group size or out of order, the single "table" key of earlier profiles, an expert efficiency table
// (memory or matmul) with no points, rows not strictly ascending or an efficiency outside (0, 1]).
Result<HardwareProfile> parse_hardware_profile(const std::string& json_text, const std::string& source);

// Reads and parses one profile file. Errors: kNotFound when it cannot be read; otherwise as above.
Result<HardwareProfile> load_hardware_profile_file(const std::string& path);

// The folders searched for shipped profiles, in order: $EPINFER_PROFILES_DIR when set; then, relative to
// the folder of the executable `exe_path`, ../share/epinfer/profiles (installed) and ../../../profiles
// (a build tree build-*/tools/epinfer/ inside the source tree).
std::vector<std::string> profile_search_dirs(const std::string& exe_path);

// Names (file stems) of the *.json files in `dir`, sorted.
std::vector<std::string> list_profile_names(const std::string& dir);

// `name_or_file` is a path when it ends in ".json" or contains '/'; otherwise the name of a shipped
// profile, looked up in the first existing folder of profile_search_dirs(exe_path).
// Errors: kNotFound naming the profile and listing the shipped ones (or the folders searched when none
// exists), or naming EPINFER_PROFILES_DIR when it is set to something that is not a folder; otherwise as
// load_hardware_profile_file.
Result<HardwareProfile> resolve_hardware_profile(const std::string& name_or_file,
                                                 const std::string& exe_path);

}  // namespace epinfer::planner
