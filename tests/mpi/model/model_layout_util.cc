#include "model_layout_util.h"

#include <algorithm>
#include <cstdlib>
#include <sstream>
#include <string>

#include "backend/cpu/cpu_backend.h"
#include "engine/kv_block_pool.h"
#if EPINFER_WITH_CUDA
#include <cuda_runtime_api.h>

#include "backend/cuda/cuda_backend.h"
#include "comm/nccl_communicator.h"
#endif

namespace epinfer {

LayoutFlags layout_flags_from_env() {
    LayoutFlags f;
    const char* text = std::getenv("EPINFER_TEST_LAYOUT");
    std::istringstream in(text != nullptr ? text : "");
    std::string flag;
    int value = 0;
    while (in >> flag >> value) {
        if (flag == "--tp") f.tp = value;
        if (flag == "--ep") f.ep = value;
        if (flag == "--dp") f.dp = value;
        if (flag == "--pp") f.pp = value;
    }
    return f;
}

Result<TestRankBackend> test_rank_backend(Communicator& world) {
    const char* device = std::getenv("EPINFER_TEST_DEVICE");
    const std::string name = device != nullptr ? device : "cpu";
    TestRankBackend out;
    if (name == "cpu" || name.empty()) {
        out.backend = make_cpu_backend(1);
        return out;
    }
    if (name != "cuda") return invalid_argument("EPINFER_TEST_DEVICE '" + name + "' is not one of cpu, cuda");
#if EPINFER_WITH_CUDA
    int num_gpus = 0;
    if (cudaGetDeviceCount(&num_gpus) != cudaSuccess || num_gpus == 0) return not_supported("no CUDA GPU");
    const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
    const int gpu = (local != nullptr ? std::atoi(local) : world.rank()) % num_gpus;
    CudaBackendOptions options;
    options.device = gpu;
    options.fp32_activations = true;
    EPI_ASSIGN_OR_RETURN(out.backend, make_cuda_backend(options));
    if (world.size() > 1) {
        NcclOptions nccl;
        nccl.device = gpu;
        nccl.stream = cuda_stream_of(*out.backend);
        EPI_ASSIGN_OR_RETURN(out.device_world, create_nccl_communicator(world, nccl));
    }
    return out;
#else
    return not_supported("EPINFER_TEST_DEVICE=cuda: this build has no CUDA");
#endif
}

Result<std::vector<float>> prefill_logits(Model& model, const std::vector<std::vector<int32_t>>& prompts) {
    constexpr int64_t kBlockSize = 4;
    int64_t rows = 0, num_blocks = 0;
    for (const auto& p : prompts) {
        rows += static_cast<int64_t>(p.size());
        num_blocks += (static_cast<int64_t>(p.size()) + kBlockSize - 1) / kBlockSize;
    }
    EPI_ASSIGN_OR_RETURN(KvBlockPool pool,
                         KvBlockPool::create(model, std::max<int64_t>(num_blocks, 1), kBlockSize));
    std::vector<std::vector<int32_t>> tables(prompts.size());
    std::vector<std::vector<LayerKvCache>> caches;
    std::vector<SequenceInput> inputs;
    for (size_t s = 0; s < prompts.size(); ++s) {
        EPI_RETURN_IF_ERROR(
            pool.allocate(pool.blocks_for(static_cast<int64_t>(prompts[s].size())), &tables[s]));
        caches.push_back(pool.views(tables[s], 0));
    }
    for (size_t s = 0; s < prompts.size(); ++s) inputs.push_back({prompts[s], caches[s]});
    std::vector<float> logits(static_cast<size_t>(rows * model.config().vocab_size));
    ForwardArgs args;
    args.sequences = inputs;
    args.logits_mode = LogitsMode::kAllRows;
    args.logits = logits.data();
    EPI_RETURN_IF_ERROR(model.forward(args));
    return logits;
}

}  // namespace epinfer
