// The MoE permutation plan lives with the backend ops that use it (backend/moe_permute_plan.h); this header
// keeps the layers' include path.
#pragma once

#include "backend/moe_permute_plan.h"
