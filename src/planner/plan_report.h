// A Plan as a text table (for people) or a JSON document (for tools): `epinfer plan` prints one of them.
#pragma once

#include <string>

#include "planner/planner.h"

namespace epinfer::planner {

// The table (layout × concurrency → output tok/s @ TPOT, memory per GPU, fits), the prefill estimate,
// the recommended layout per concurrency with its deciding terms, and the layouts that do not fit.
std::string plan_to_text(const Plan& plan);

// One JSON document (schema "epinfer.plan/1", documented in docs/planner.md) with every breakdown.
std::string plan_to_json(const Plan& plan);

}  // namespace epinfer::planner
