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
    DeviceBuffer draws;      // [rows] TokenDraw (padding rows greedy), drawn buckets only (ArgmaxArgs)
    DeviceBuffer floor;      // [rows] fp32 workspace, drawn buckets only
    std::unique_ptr<OpGraph> graph;  // null until captured
};

}  // namespace epinfer
