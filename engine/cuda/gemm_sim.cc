// Gemm on the SIMT emulator: OpenBLAS on the emulated device memory, queued on the stream
// like the library's kernels (engine/simt/library_work.h: stream order, graph capture, trace).
#include "engine/cuda/gemm.h"

#if defined(DCF_CUDA_SIM)

#include <cblas.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "engine/common/status_macros.h"
#include "engine/cuda/cuda_status.h"
#include "engine/cuda/gemm_quant.h"
#include "engine/simt/library_work.h"
#include "engine/weights/dtype.h"
#include "engine/weights/fp8_quant.h"

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

// E4M3 codes [rows, cols] (`ld` apart) widened exactly to f32 in `buf` (ld cols): what the
// FP8 tensor cores multiply.
const float* Fp8AsF32(const void* src, int64_t rows, int64_t cols, int64_t ld,
                      std::vector<float>& buf) {
  buf.resize(static_cast<size_t>(rows * cols));
  const uint8_t* s = static_cast<const uint8_t*>(src);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) buf[r * cols + c] = Fp8E4M3ToFloat(s[r * ld + c]);
  }
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
  QuantGemm quant;  // validation, the dense / quantized routing, the quantized workspace

  // One library product (dense, or the FP8 products of gemm_quant.h), validated.
  absl::Status Product(const GemmArgs& a, cudaStream_t stream);
  // Pins the plans of `p`'s buckets from min_m on.
  void PrepareProduct(const GemmArgs& p, int min_m);
};

Gemm::Gemm(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Gemm::~Gemm() = default;

absl::StatusOr<std::unique_ptr<Gemm>> Gemm::Create(size_t /*workspace_bytes*/) {
  auto impl = std::make_unique<Impl>();
  RETURN_IF_ERROR(impl->quant.Init());
  return std::unique_ptr<Gemm>(new Gemm(std::move(impl)));
}

size_t Gemm::workspace_bytes() const { return 0; }

size_t Gemm::quant_workspace_bytes() const { return impl_->quant.workspace_bytes(); }

bool Gemm::fp8_gemm_supported() const { return impl_->quant.fp8_gemm_supported(); }

void Gemm::Impl::PrepareProduct(const GemmArgs& p, int min_m) {
  for (int b : GemmBucketsFor(min_m, p.m)) {
    GemmArgs at = p;
    at.m = std::min(GemmBucketHi(b), p.m);
    const GemmPlanKey key = GemmPlanKeyOf(at);
    if (plans.Find(key) != nullptr) continue;
    plans.Insert(key, Impl::NoPlan{}, /*pinned=*/true);
    GemmPlanChoice c;
    c.key = key;
    c.timed_m = at.m;
    choices.push_back(c);
  }
}

absl::Status Gemm::Prepare(absl::Span<const GemmArgs> products, int min_m, cudaStream_t stream) {
  impl_->plans.Clear();
  impl_->choices.clear();
  return impl_->quant.Prepare(
      products, min_m,
      [&](const GemmArgs& p) {
        impl_->PrepareProduct(p, min_m);
        return absl::OkStatus();
      },
      stream);
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
  return impl_->quant.Linear(
      a, [&](const GemmArgs& p) { return impl_->Product(p, stream); }, stream);
}

absl::Status Gemm::Impl::Product(const GemmArgs& a, cudaStream_t stream) {
  if (const GemmPlanKey key = GemmPlanKeyOf(a); plans.Find(key) == nullptr) {
    plans.Insert(key, Impl::NoPlan{}, /*pinned=*/false);
    ++built_on_use;
  }
  const bool fp8 = a.wtype == WeightType::kFp8 && a.fp8_activations;
  // Fails after a sticky device error, as a real library call does.
  return CudaStatus(simt::EnqueueGemm(stream, a.m, a.n, a.k, [a, fp8, buf = buffers] {
                      int64_t ldx = 0, ldw = 0;
                      const float* x;
                      const float* w;
                      if (fp8) {  // e4m3 x e4m3, exactly widened: the FP8 GEMM's products
                        x = Fp8AsF32(a.x, a.m, a.k, a.ldx, buf->x);
                        w = Fp8AsF32(a.w, a.n, a.k, a.k, buf->w);
                        ldx = ldw = a.k;
                      } else {
                        x = AsF32(a.x, a.dtype, a.m, a.k, a.ldx, buf->x, &ldx);
                        w = AsF32(a.w, a.dtype, a.n, a.k, a.k, buf->w, &ldw);
                      }
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
