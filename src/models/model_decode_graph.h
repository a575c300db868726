// The buffers and graph of one decode-graph bucket (Model::set_decode_graphs, model_decode_graph.cc).
#pragma once

#include <memory>

#include "backend/backend.h"
#include "layers/kv_cache.h"
#include "models/model.h"

namespace epinfer {

struct Model::DecodeGraph {
    DeviceBuffer ids;        // [rows] int32
    DeviceBuffer positions;  // [rows] int32
    KvBatchMetadata kv;      // slot_mapping [rows], token_sequence [rows], block_tables [rows, width]
    DeviceBuffer greedy;     // [2, rows] int32: argmax ids, then non-finite flags
    DeviceBuffer inv_temperature;    // [rows] fp32: 1 / T of each drawn row, 0 greedy (ArgmaxArgs)
    DeviceBuffer noise_keys;         // [rows] uint64
    bool sampled = false;            // inv_temperature holds a non-zero entry (else all zeros)
    std::unique_ptr<OpGraph> graph;  // null until captured
};

}  // namespace epinfer
