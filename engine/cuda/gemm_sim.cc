// Gemm on the SIMT emulator: OpenBLAS on the emulated device memory, queued on the stream
// like the library's kernels (engine/simt/library_work.h: stream order, graph capture, trace).
#include "engine/cuda/gemm.h"

#if defined(DCF_CUDA_SIM)

#include <cblas.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "engine/cuda/cuda_status.h"
#include "engine/simt/library_work.h"
#include "engine/weights/dtype.h"

namespace dcf::cuda {
inline namespace DCF_CUDA_NS {
namespace {

// f32 view of `rows` rows of `cols` elements (`ld` apart) of `type` at `src`: `src` itself
// for f32, else a packed converted copy in `buf` (then the returned ld is `cols`).
const float* AsF32(const void* src, ElemType type, int64_t rows, int64_t cols, int64_t ld,
                   std::vector<float>& buf, int64_t* out_ld) {
  if (type == ElemType::kF32) {
    *out_ld = ld;
    return static_cast<const float*>(src);
  }
  const DType dt = type == ElemType::kBF16 ? DType::kBF16 : DType::kF16;
  buf.resize(static_cast<size_t>(rows * cols));
  const uint16_t* s = static_cast<const uint16_t*>(src);
  for (int64_t r = 0; r < rows; ++r) ConvertToF32(dt, s + r * ld, cols, buf.data() + r * cols);
  *out_ld = cols;
  return buf.data();
}

}  // namespace

struct Gemm::Impl {
  struct Buffers {
    std::vector<float> x, w;  // converted 16-bit inputs
  };
  // Shared with queued and captured GEMMs, which may run after the Gemm is gone.
  std::shared_ptr<Buffers> buffers = std::make_shared<Buffers>();
  // OpenBLAS needs no plan: the cache holds empty ones, so that the bookkeeping (which
  // products Prepare covered, what a step had to build) is the library build's.
  struct NoPlan {};
  GemmPlanCache<NoPlan> plans{kLazyPlanCapacity};
  std::vector<GemmPlanChoice> choices;
  int64_t built_on_use = 0;
};

Gemm::Gemm(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Gemm::~Gemm() = default;

absl::StatusOr<std::unique_ptr<Gemm>> Gemm::Create(size_t /*workspace_bytes*/) {
  return std::unique_ptr<Gemm>(new Gemm(std::make_unique<Impl>()));
}

size_t Gemm::workspace_bytes() const { return 0; }

absl::Status Gemm::Prepare(absl::Span<const GemmArgs> products, int min_m,
                           cudaStream_t /*stream*/) {
  impl_->plans.Clear();
  impl_->choices.clear();
  for (const GemmArgs& p : products) {
    if (absl::Status s = ValidateGemmArgs(p); !s.ok()) return s;
    for (int b : GemmBucketsFor(min_m, p.m)) {
      GemmArgs at = p;
      at.m = std::min(GemmBucketHi(b), p.m);
      const GemmPlanKey key = GemmPlanKeyOf(at);
      if (impl_->plans.Find(key) != nullptr) continue;
      impl_->plans.Insert(key, Impl::NoPlan{}, /*pinned=*/true);
      GemmPlanChoice c;
      c.key = key;
      c.timed_m = at.m;
      impl_->choices.push_back(c);
    }
  }
  return absl::OkStatus();
}

Gemm::Stats Gemm::stats() const {
  Stats s;
  s.pinned_plans = impl_->plans.pinned();
  s.cached_plans = impl_->plans.unpinned();
  s.plans_built_on_use = impl_->built_on_use;
  s.evictions = impl_->plans.evictions();
  return s;
}

const std::vector<GemmPlanChoice>& Gemm::choices() const { return impl_->choices; }

absl::Status Gemm::Linear(const GemmArgs& a, cudaStream_t stream) {
  if (absl::Status s = ValidateGemmArgs(a); !s.ok()) return s;
  if (a.m == 0) return absl::OkStatus();
  if (const GemmPlanKey key = GemmPlanKeyOf(a); impl_->plans.Find(key) == nullptr) {
    impl_->plans.Insert(key, Impl::NoPlan{}, /*pinned=*/false);
    ++impl_->built_on_use;
  }
  // Fails after a sticky device error, as a real library call does.
  return CudaStatus(simt::EnqueueGemm(stream, a.m, a.n, a.k, [a, buf = impl_->buffers] {
                      int64_t ldx = 0, ldw = 0;
                      const float* x = AsF32(a.x, a.dtype, a.m, a.k, a.ldx, buf->x, &ldx);
                      const float* w = AsF32(a.w, a.dtype, a.n, a.k, a.k, buf->w, &ldw);
                      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, a.m, a.n, a.k, 1.0f,
                                  x, ldx, w, ldw, a.accumulate ? 1.0f : 0.0f, a.y, a.ldy);
                      if (a.bias != nullptr) {
                        for (int r = 0; r < a.m; ++r) {
                          float* row = a.y + r * a.ldy;
                          for (int c = 0; c < a.n; ++c) row[c] += a.bias[c];
                        }
                      }
                    }),
                    "GEMM");
}

}  // namespace DCF_CUDA_NS
}  // namespace dcf::cuda

#endif  // DCF_CUDA_SIM
