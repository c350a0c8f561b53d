#include "engine/cuda/cuda_compat.h"  // built with DCF_CUDA_SIM
#include "tests/unit/cuda_sim/toolkit/conversions.h"

namespace dcf::cuda_test::sim_host {
#include "tests/unit/cuda_sim/toolkit/conversions.inc"
}  // namespace dcf::cuda_test::sim_host
