#include "engine/simt/cuda_compat.h"  // built with DCF_CUDA_REAL: the toolkit's host code
#include "tests/unit/simt/toolkit/conversions.h"

namespace dcf::cuda_test::cuda_host {
#include "tests/unit/simt/toolkit/conversions.inc"
}  // namespace dcf::cuda_test::cuda_host
