#include "engine/cuda/gemm_quant.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "engine/common/status_macros.h"
#include "engine/cuda/cuda_status.h"
#include "engine/cuda/quant_kernels.h"

namespace dcf::cuda {
inline namespace DCF_CUDA_NS {
namespace {

int64_t panel_bytes = int64_t{32} << 20;
int panel_quantum = 256;

int64_t RoundUp(int64_t v, int64_t q) { return (v + q - 1) / q * q; }

// Rows apart in the sums buffer: the panel's width rounded up to 16 (aligned f32 rows).
int64_t SumsLd(const GemmArgs& a) { return RoundUp(QuantPanelRows(a), 16); }

// `b` grown to at least `bytes` (its contents are not kept).
absl::Status Grow(DeviceBuffer* b, size_t bytes, bool* synced, cudaStream_t stream,
                  const char* what) {
  if (b->bytes() >= bytes) return absl::OkStatus();
  if (!*synced) {
    DCF_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream), "quantized GEMM workspace");
    *synced = true;
  }
  b->Reset();
  ASSIGN_OR_RETURN(*b, DeviceBuffer::Allocate(bytes, what));
  return absl::OkStatus();
}

}  // namespace

absl::Status Fp8GemmSupport(int major, int minor) {
  if (major > 8 || (major == 8 && minor >= 9)) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "fp8 activations run cuBLASLt's FP8 GEMM, which needs compute capability 8.9 or later "
      "(Ada, Hopper: sm_89, sm_90); this GPU is sm_",
      major, minor, " (fp8 weights run weight-only there: --activation-dtype float32)"));
}

bool UsesFp8Gemm(const GemmArgs& a) {
  // cuBLASLt's FP8 kernels want K and N multiples of 16 (16-byte rows of both operands; a
  // logits product of a 50,257-token vocabulary has no FP8 algorithm), and the panels of a
  // product are multiples of 16 rows but for its last, so N % 16 covers every panel.
  return a.wtype == WeightType::kFp8 && a.fp8_activations && a.k % 16 == 0 && a.n % 16 == 0;
}

int QuantPanelRows(const GemmArgs& a) {
  const int64_t row_bytes =
      static_cast<int64_t>(a.k) * (UsesFp8Gemm(a) ? 1 : ElemBytes(a.dtype));
  const int64_t fit = panel_bytes / row_bytes / panel_quantum * panel_quantum;
  return static_cast<int>(std::min<int64_t>(a.n, std::max<int64_t>(panel_quantum, fit)));
}

void SetQuantPanelForTesting(int64_t bytes, int quantum) {
  panel_bytes = bytes;
  panel_quantum = quantum;
}

absl::Status EnsureQuantScratch(const GemmArgs& a, QuantScratch* s, cudaStream_t stream) {
  const int64_t m = std::max(a.m, 1);
  bool synced = false;
  RETURN_IF_ERROR(Grow(&s->sums, sizeof(float) * m * SumsLd(a), &synced, stream,
                       "the quantized GEMM's sums"));
  if (UsesFp8Gemm(a)) {
    RETURN_IF_ERROR(Grow(&s->x8, static_cast<size_t>(m) * a.k, &synced, stream,
                         "the quantized GEMM's fp8 activations"));
    RETURN_IF_ERROR(Grow(&s->x_scale, sizeof(float) * m, &synced, stream,
                         "the quantized GEMM's activation scales"));
  } else {
    RETURN_IF_ERROR(Grow(&s->panel,
                         static_cast<size_t>(QuantPanelRows(a)) * a.k * ElemBytes(a.dtype),
                         &synced, stream, "the quantized GEMM's decoded panel"));
  }
  return absl::OkStatus();
}

std::vector<GemmArgs> QuantLibraryProducts(const GemmArgs& a, const QuantScratch& s) {
  std::vector<GemmArgs> products;
  const int panel = QuantPanelRows(a);
  const bool fp8 = UsesFp8Gemm(a);
  for (int n0 = 0; n0 < a.n; n0 += panel) {
    GemmArgs p;
    p.m = a.m;
    p.n = std::min(panel, a.n - n0);
    p.k = a.k;
    p.dtype = a.dtype;
    p.y = s.sums.as<float>();
    p.ldy = SumsLd(a);
    if (fp8) {
      p.x = s.x8.get();
      p.ldx = a.k;
      p.w = static_cast<const uint8_t*>(a.w) + static_cast<int64_t>(n0) * a.k;
      p.wtype = WeightType::kFp8;
      p.fp8_activations = true;
    } else {
      p.x = a.x;
      p.ldx = a.ldx;
      p.w = s.panel.get();
    }
    products.push_back(p);
  }
  return products;
}

absl::Status RunQuantized(const GemmArgs& a, QuantScratch& s, const LibraryProductFn& product,
                          cudaStream_t stream) {
  RETURN_IF_ERROR(EnsureQuantScratch(a, &s, stream));
  const bool fp8 = UsesFp8Gemm(a);
  if (fp8) {
    QuantizeRowsFp8Params qp;
    qp.rows = a.m;
    qp.k = a.k;
    qp.x = a.x;
    qp.ldx = a.ldx;
    qp.dtype = a.dtype;
    qp.q = s.x8.as<uint8_t>();
    qp.ldq = a.k;
    qp.x_scale = s.x_scale.as<float>();
    RETURN_IF_ERROR(CudaStatus(LaunchQuantizeRowsFp8(qp, stream), "fp8 activation quantization"));
  }
  const int panel = QuantPanelRows(a);
  int n0 = 0;
  for (const GemmArgs& p : QuantLibraryProducts(a, s)) {
    if (!fp8) {
      DequantRowsParams dp;
      dp.rows = p.n;
      dp.k = a.k;
      dp.w = static_cast<const uint8_t*>(a.w) + static_cast<int64_t>(n0) * a.k;
      dp.wtype = a.wtype;
      dp.out = s.panel.get();
      dp.dtype = a.dtype;
      RETURN_IF_ERROR(CudaStatus(LaunchDequantRows(dp, stream), "weight panel decode"));
    }
    RETURN_IF_ERROR(product(p));
    ScaleEpilogueParams ep;
    ep.rows = a.m;
    ep.cols = p.n;
    ep.sums = p.y;
    ep.lds = p.ldy;
    ep.w_scale = a.w_scale + n0;
    ep.x_scale = fp8 ? s.x_scale.as<float>() : nullptr;
    ep.bias = a.bias != nullptr ? a.bias + n0 : nullptr;
    ep.y = a.y + n0;
    ep.ldy = a.ldy;
    ep.accumulate = a.accumulate;
    RETURN_IF_ERROR(CudaStatus(LaunchScaleEpilogue(ep, stream), "quantized GEMM epilogue"));
    n0 += panel;
  }
  return absl::OkStatus();
}

absl::Status QuantGemm::Init() {
  int device = 0;
  cudaDeviceProp prop{};
  DCF_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device), "cudaGetDevice");
  DCF_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  fp8_support_ = Fp8GemmSupport(prop.major, prop.minor);
  return absl::OkStatus();
}

size_t QuantGemm::workspace_bytes() const {
  return scratch_.sums.bytes() + scratch_.panel.bytes() + scratch_.x8.bytes() +
         scratch_.x_scale.bytes();
}

absl::Status QuantGemm::Linear(const GemmArgs& a, const LibraryProductFn& product,
                               cudaStream_t stream) {
  RETURN_IF_ERROR(ValidateGemmArgs(a));
  if (a.m == 0) return absl::OkStatus();
  if (a.wtype == WeightType::kDense) return product(a);
  if (a.fp8_activations && !fp8_support_.ok()) return fp8_support_;
  return RunQuantized(a, scratch_, product, stream);
}

absl::Status QuantGemm::Prepare(absl::Span<const GemmArgs> products, int min_m,
                                const LibraryProductFn& plan, cudaStream_t stream) {
  for (const GemmArgs& p : products) RETURN_IF_ERROR(ValidateGemmArgs(p));
  for (const GemmArgs& p : products) {
    if (p.wtype == WeightType::kDense) {
      RETURN_IF_ERROR(plan(p));
      continue;
    }
    if (p.m < min_m) continue;
    if (p.fp8_activations && !fp8_support_.ok()) return fp8_support_;
    RETURN_IF_ERROR(EnsureQuantScratch(p, &scratch_, stream));
    for (const GemmArgs& inner : QuantLibraryProducts(p, scratch_)) RETURN_IF_ERROR(plan(inner));
  }
  return absl::OkStatus();
}

}  // namespace DCF_CUDA_NS
}  // namespace dcf::cuda
