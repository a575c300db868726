#include "backend/cpu/cpu_moe_experts.h"

#include <vector>

#include "backend/cpu/cpu_kernels.h"
#include "backend/moe_permute_plan.h"

namespace epinfer {

void cpu_moe_experts(const MoeExpertsArgs& a, ThreadPool& pool) {
    const int64_t T = a.num_tokens, K = a.top_k, E = a.num_experts, H = a.hidden, I = a.intermediate;
    if (T == 0) return;
    std::vector<int32_t> local_ids(a.topk_ids, a.topk_ids + T * K);  // [T, K] ids − first_expert
    for (int32_t& id : local_ids) id = id < a.first_expert ? -1 : static_cast<int32_t>(id - a.first_expert);
    const MoeRoutePlan plan = moe_permute_plan(local_ids.data(), T, K, E);
    const int64_t S = plan.num_slots();
    std::vector<float> x_perm(static_cast<size_t>(S * H));  // [S, H]
    std::vector<float> y_perm(static_cast<size_t>(S * H));  // [S, H]
    moe_permute_rows(plan, a.x, static_cast<size_t>(H) * sizeof(float), x_perm.data());
    std::vector<float> gate, up;  // [count, I]
    for (int64_t e = 0; e < E; ++e) {
        const int64_t count = plan.expert_counts[static_cast<size_t>(e)];
        const int64_t offset = plan.expert_offsets[static_cast<size_t>(e)];
        if (count == 0) continue;
        const MoeExpertWeights& w = a.experts[e];
        gate.resize(static_cast<size_t>(count * I));
        up.resize(static_cast<size_t>(count * I));
        MatmulArgs m;
        m.x = x_perm.data() + offset * H;
        m.w_dtype = a.weight_dtype;
        m.num_rows = count;
        m.out_features = I;
        m.in_features = H;
        m.x_row_stride = H;
        m.y_row_stride = I;
        m.w = w.gate;
        m.y = gate.data();
        cpu_matmul(m, pool);
        m.w = w.up;
        m.y = up.data();
        cpu_matmul(m, pool);
        cpu_silu_mul(SiluMulArgs{gate.data(), up.data(), gate.data(), count * I});
        MatmulArgs d;
        d.x = gate.data();
        d.w = w.down;
        d.w_dtype = a.weight_dtype;
        d.y = y_perm.data() + offset * H;
        d.num_rows = count;
        d.out_features = H;
        d.in_features = I;
        d.x_row_stride = I;
        d.y_row_stride = H;
        cpu_matmul(d, pool);
    }
    moe_combine_rows(plan, y_perm.data(), a.topk_weights, H, a.out);
}

}  // namespace epinfer
