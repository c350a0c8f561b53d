// Gemm on a GPU: cuBLASLt with fp32 accumulation (see gemm.h).
#include "engine/cuda/gemm.h"

#if !defined(DCF_CUDA_SIM)

#include <cublasLt.h>

#include <map>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "engine/cuda/cuda_status.h"
#include "engine/cuda/device_buffer.h"

namespace dcf::cuda {
inline namespace DCF_CUDA_NS {
namespace {

absl::Status LtStatus(cublasStatus_t s, absl::string_view what) {
  if (s == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("cuBLASLt error in ", what, ": ",
                                          cublasLtGetStatusName(s), ": ",
                                          cublasLtGetStatusString(s)));
}

#define DCF_LT_RETURN_IF_ERROR(call, what)                                              \
  do {                                                                                  \
    const cublasStatus_t dcf_lt_status_ = (call);                                       \
    if (dcf_lt_status_ != CUBLAS_STATUS_SUCCESS) return LtStatus(dcf_lt_status_, what); \
  } while (0)

cudaDataType_t DataType(ElemType t) {
  switch (t) {
    case ElemType::kF32:
      return CUDA_R_32F;
    case ElemType::kBF16:
      return CUDA_R_16BF;
    case ElemType::kF16:
      return CUDA_R_16F;
  }
  return CUDA_R_32F;
}

// The largest power of two (<= 256) dividing the address: the alignment the algorithm
// heuristic may assume.
uint32_t Alignment(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  uint32_t align = 256;
  while (align > 1 && a % align != 0) align >>= 1;
  return align;
}

// Everything that selects a plan: shapes, strides, dtype, epilogue, accumulation, alignment.
using PlanKey =
    std::tuple<int, int, int, int64_t, int64_t, int, bool, bool, uint32_t, uint32_t, uint32_t>;

struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

}  // namespace

struct Gemm::Impl {
  cublasLtHandle_t handle = nullptr;
  DeviceBuffer workspace;
  std::map<PlanKey, Plan> plans;

  ~Impl() {
    for (auto& [key, p] : plans) {
      if (p.a != nullptr) cublasLtMatrixLayoutDestroy(p.a);
      if (p.b != nullptr) cublasLtMatrixLayoutDestroy(p.b);
      if (p.c != nullptr) cublasLtMatrixLayoutDestroy(p.c);
      if (p.op != nullptr) cublasLtMatmulDescDestroy(p.op);
    }
    if (handle != nullptr) cublasLtDestroy(handle);
  }

  absl::StatusOr<Plan*> GetPlan(const GemmArgs& g) {
    const uint32_t ax = Alignment(g.x), aw = Alignment(g.w), ay = Alignment(g.y);
    const PlanKey key{
        g.m,          g.n, g.k, g.ldx, g.ldy, static_cast<int>(g.dtype), g.bias != nullptr,
        g.accumulate, ax,  aw,  ay};
    auto it = plans.find(key);
    if (it != plans.end()) return &it->second;
    Plan p;
    const std::string what = absl::StrCat("GEMM plan m=", g.m, " n=", g.n, " k=", g.k);
    // Column-major view: D[n, m] = W^T[n, k] . X[k, m]; W is stored as a k x n column-major
    // matrix (ld k), X as k x m (ld ldx), D as n x m (ld ldy).
    absl::Status st = [&]() -> absl::Status {
      DCF_LT_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), what);
      const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
      DCF_LT_RETURN_IF_ERROR(
          cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)), what);
      DCF_LT_RETURN_IF_ERROR(
          cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)), what);
      if (g.bias != nullptr) {
        const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
        DCF_LT_RETURN_IF_ERROR(
            cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)),
            what);
        const void* bias = g.bias;  // the heuristic needs a pointer; Linear sets the real one
        DCF_LT_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
                                   p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)),
                               what);
      }
      const cudaDataType_t in = DataType(g.dtype);
      DCF_LT_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&p.a, in, g.k, g.n, g.k), what);
      DCF_LT_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&p.b, in, g.k, g.m, g.ldx), what);
      DCF_LT_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&p.c, CUDA_R_32F, g.n, g.m, g.ldy), what);
      cublasLtMatmulPreference_t pref = nullptr;
      DCF_LT_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&pref), what);
      const size_t ws = workspace.bytes();
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                           sizeof(ws));
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aw,
                                           sizeof(aw));
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ax,
                                           sizeof(ax));
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ay,
                                           sizeof(ay));
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ay,
                                           sizeof(ay));
      cublasLtMatmulHeuristicResult_t result{};
      int returned = 0;
      const cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(handle, p.op, p.a, p.b, p.c, p.c,
                                                               pref, 1, &result, &returned);
      cublasLtMatmulPreferenceDestroy(pref);
      DCF_LT_RETURN_IF_ERROR(hs, what);
      if (returned == 0) {
        return absl::InternalError(absl::StrCat("cuBLASLt has no algorithm for ", what));
      }
      p.algo = result.algo;
      return absl::OkStatus();
    }();
    if (!st.ok()) {
      if (p.a != nullptr) cublasLtMatrixLayoutDestroy(p.a);
      if (p.b != nullptr) cublasLtMatrixLayoutDestroy(p.b);
      if (p.c != nullptr) cublasLtMatrixLayoutDestroy(p.c);
      if (p.op != nullptr) cublasLtMatmulDescDestroy(p.op);
      return st;
    }
    return &plans.emplace(key, p).first->second;
  }
};

Gemm::Gemm(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Gemm::~Gemm() = default;

absl::StatusOr<std::unique_ptr<Gemm>> Gemm::Create(size_t workspace_bytes) {
  auto impl = std::make_unique<Impl>();
  DCF_LT_RETURN_IF_ERROR(cublasLtCreate(&impl->handle), "cublasLtCreate");
  auto ws = DeviceBuffer::Allocate(workspace_bytes, "the cuBLASLt workspace");
  if (!ws.ok()) return ws.status();
  impl->workspace = std::move(*ws);
  return std::unique_ptr<Gemm>(new Gemm(std::move(impl)));
}

size_t Gemm::workspace_bytes() const { return impl_->workspace.bytes(); }

absl::Status Gemm::Linear(const GemmArgs& a, cudaStream_t stream) {
  if (absl::Status s = ValidateGemmArgs(a); !s.ok()) return s;
  if (a.m == 0) return absl::OkStatus();
  absl::StatusOr<Plan*> plan = impl_->GetPlan(a);
  if (!plan.ok()) return plan.status();
  Plan& p = **plan;
  if (a.bias != nullptr) {
    const void* bias = a.bias;
    DCF_LT_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                          &bias, sizeof(bias)),
                           "GEMM bias");
  }
  const float alpha = 1.0f, beta = a.accumulate ? 1.0f : 0.0f;
  DCF_LT_RETURN_IF_ERROR(
      cublasLtMatmul(impl_->handle, p.op, &alpha, a.w, p.a, a.x, p.b, &beta, a.y, p.c, a.y, p.c,
                     &p.algo, impl_->workspace.get(), impl_->workspace.bytes(), stream),
      absl::StrCat("GEMM m=", a.m, " n=", a.n, " k=", a.k));
  return absl::OkStatus();
}

}  // namespace DCF_CUDA_NS
}  // namespace dcf::cuda

#endif  // !DCF_CUDA_SIM
