// Gemm on a GPU: cuBLASLt with fp32 accumulation (see gemm.h).
//
// cuBLASLt is loaded with dlopen when the first Gemm is created, not linked: its 94 KiB of
// static TLS, added to every thread of every binary that links the CUDA backend, made
// pthread_create fail for libraries that ask for small thread stacks (civetweb's 100 KiB
// metrics threads in dcformer-server). Binaries also start, and run the other backends,
// where no cuBLAS is installed.
#include "engine/cuda/gemm.h"

#if !defined(DCF_CUDA_SIM)

#include <cublasLt.h>  // types and prototypes only: the functions come from dlsym
#include <dlfcn.h>

#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/cuda/cuda_status.h"
#include "engine/cuda/device_buffer.h"

namespace dcf::cuda {
inline namespace DCF_CUDA_NS {
namespace {

// The cuBLASLt entry points the wrapper uses.
struct LtApi {
  decltype(&cublasLtCreate) Create;
  decltype(&cublasLtDestroy) Destroy;
  decltype(&cublasLtGetStatusName) GetStatusName;
  decltype(&cublasLtGetStatusString) GetStatusString;
  decltype(&cublasLtMatmulDescCreate) MatmulDescCreate;
  decltype(&cublasLtMatmulDescDestroy) MatmulDescDestroy;
  decltype(&cublasLtMatmulDescSetAttribute) MatmulDescSetAttribute;
  decltype(&cublasLtMatrixLayoutCreate) MatrixLayoutCreate;
  decltype(&cublasLtMatrixLayoutDestroy) MatrixLayoutDestroy;
  decltype(&cublasLtMatmulPreferenceCreate) MatmulPreferenceCreate;
  decltype(&cublasLtMatmulPreferenceDestroy) MatmulPreferenceDestroy;
  decltype(&cublasLtMatmulPreferenceSetAttribute) MatmulPreferenceSetAttribute;
  decltype(&cublasLtMatmulAlgoGetHeuristic) MatmulAlgoGetHeuristic;
  decltype(&cublasLtMatmul) Matmul;
};

// Loads libcublasLt.so.<major of the headers> once: the loader's search path first
// (LD_LIBRARY_PATH, ldconfig), then $CUDA_HOME/lib64, $CUDA_PATH/lib64, the toolkit this was
// built with, /usr/local/cuda/lib64. Unavailable naming the library when it is not found.
absl::StatusOr<const LtApi*> LoadLt() {
  static std::once_flag once;
  static absl::StatusOr<const LtApi*>* result = nullptr;
  std::call_once(once, [] {
    const std::string name = absl::StrCat("libcublasLt.so.", CUBLAS_VER_MAJOR);
    std::vector<std::string> candidates = {name};
    for (const char* env : {"CUDA_HOME", "CUDA_PATH"}) {
      if (const char* dir = std::getenv(env); dir != nullptr && *dir != '\0') {
        candidates.push_back(absl::StrCat(dir, "/lib64/", name));
      }
    }
#if defined(DCF_CUBLASLT_DIR)
    candidates.push_back(absl::StrCat(DCF_CUBLASLT_DIR, "/", name));
#endif
    candidates.push_back("/usr/local/cuda/lib64/" + name);
    void* lib = nullptr;
    std::string errors;
    for (const std::string& c : candidates) {
      lib = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (lib != nullptr) break;
      absl::StrAppend(&errors, errors.empty() ? "" : "; ", dlerror());
    }
    if (lib == nullptr) {
      result = new absl::StatusOr<const LtApi*>(absl::UnavailableError(
          absl::StrCat("cannot load cuBLASLt (", name, ", from the CUDA ", CUBLAS_VER_MAJOR,
                       " toolkit; set LD_LIBRARY_PATH or CUDA_HOME): ", errors)));
      return;
    }
    auto* api = new LtApi();
    bool ok = true;
    std::string missing;
    auto sym = [&](auto& fn, const char* symbol) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, symbol));
      if (fn == nullptr) {
        ok = false;
        absl::StrAppend(&missing, " ", symbol);
      }
    };
    sym(api->Create, "cublasLtCreate");
    sym(api->Destroy, "cublasLtDestroy");
    sym(api->GetStatusName, "cublasLtGetStatusName");
    sym(api->GetStatusString, "cublasLtGetStatusString");
    sym(api->MatmulDescCreate, "cublasLtMatmulDescCreate");
    sym(api->MatmulDescDestroy, "cublasLtMatmulDescDestroy");
    sym(api->MatmulDescSetAttribute, "cublasLtMatmulDescSetAttribute");
    sym(api->MatrixLayoutCreate, "cublasLtMatrixLayoutCreate");
    sym(api->MatrixLayoutDestroy, "cublasLtMatrixLayoutDestroy");
    sym(api->MatmulPreferenceCreate, "cublasLtMatmulPreferenceCreate");
    sym(api->MatmulPreferenceDestroy, "cublasLtMatmulPreferenceDestroy");
    sym(api->MatmulPreferenceSetAttribute, "cublasLtMatmulPreferenceSetAttribute");
    sym(api->MatmulAlgoGetHeuristic, "cublasLtMatmulAlgoGetHeuristic");
    sym(api->Matmul, "cublasLtMatmul");
    if (!ok) {
      result = new absl::StatusOr<const LtApi*>(
          absl::UnavailableError(absl::StrCat(name, " lacks", missing)));
      return;
    }
    result = new absl::StatusOr<const LtApi*>(api);
  });
  return *result;
}

absl::Status LtStatus(const LtApi& api, cublasStatus_t s, absl::string_view what) {
  if (s == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("cuBLASLt error in ", what, ": ", api.GetStatusName(s),
                                          ": ", api.GetStatusString(s)));
}

// Returns a cuBLASLt failure from the enclosing function (which has `api` in scope).
#define DCF_LT_RETURN_IF_ERROR(call, what)                                                    \
  do {                                                                                        \
    const cublasStatus_t dcf_lt_status_ = (call);                                             \
    if (dcf_lt_status_ != CUBLAS_STATUS_SUCCESS) return LtStatus(*api, dcf_lt_status_, what); \
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
  const LtApi* api = nullptr;  // the loaded library
  cublasLtHandle_t handle = nullptr;
  DeviceBuffer workspace;
  std::map<PlanKey, Plan> plans;

  ~Impl() {
    for (auto& [key, p] : plans) {
      if (p.a != nullptr) api->MatrixLayoutDestroy(p.a);
      if (p.b != nullptr) api->MatrixLayoutDestroy(p.b);
      if (p.c != nullptr) api->MatrixLayoutDestroy(p.c);
      if (p.op != nullptr) api->MatmulDescDestroy(p.op);
    }
    if (handle != nullptr) api->Destroy(handle);
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
      DCF_LT_RETURN_IF_ERROR(api->MatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), what);
      const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
      DCF_LT_RETURN_IF_ERROR(
          api->MatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)), what);
      DCF_LT_RETURN_IF_ERROR(
          api->MatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)), what);
      if (g.bias != nullptr) {
        const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
        DCF_LT_RETURN_IF_ERROR(
            api->MatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)),
            what);
        const void* bias = g.bias;  // the heuristic needs a pointer; Linear sets the real one
        DCF_LT_RETURN_IF_ERROR(api->MatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                           &bias, sizeof(bias)),
                               what);
      }
      const cudaDataType_t in = DataType(g.dtype);
      DCF_LT_RETURN_IF_ERROR(api->MatrixLayoutCreate(&p.a, in, g.k, g.n, g.k), what);
      DCF_LT_RETURN_IF_ERROR(api->MatrixLayoutCreate(&p.b, in, g.k, g.m, g.ldx), what);
      DCF_LT_RETURN_IF_ERROR(api->MatrixLayoutCreate(&p.c, CUDA_R_32F, g.n, g.m, g.ldy), what);
      cublasLtMatmulPreference_t pref = nullptr;
      DCF_LT_RETURN_IF_ERROR(api->MatmulPreferenceCreate(&pref), what);
      const size_t ws = workspace.bytes();
      api->MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                        sizeof(ws));
      api->MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aw,
                                        sizeof(aw));
      api->MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ax,
                                        sizeof(ax));
      api->MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ay,
                                        sizeof(ay));
      api->MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ay,
                                        sizeof(ay));
      cublasLtMatmulHeuristicResult_t result{};
      int returned = 0;
      const cublasStatus_t hs = api->MatmulAlgoGetHeuristic(handle, p.op, p.a, p.b, p.c, p.c, pref,
                                                            1, &result, &returned);
      api->MatmulPreferenceDestroy(pref);
      DCF_LT_RETURN_IF_ERROR(hs, what);
      if (returned == 0) {
        return absl::InternalError(absl::StrCat("cuBLASLt has no algorithm for ", what));
      }
      p.algo = result.algo;
      return absl::OkStatus();
    }();
    if (!st.ok()) {
      if (p.a != nullptr) api->MatrixLayoutDestroy(p.a);
      if (p.b != nullptr) api->MatrixLayoutDestroy(p.b);
      if (p.c != nullptr) api->MatrixLayoutDestroy(p.c);
      if (p.op != nullptr) api->MatmulDescDestroy(p.op);
      return st;
    }
    return &plans.emplace(key, p).first->second;
  }
};

Gemm::Gemm(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Gemm::~Gemm() = default;

absl::StatusOr<std::unique_ptr<Gemm>> Gemm::Create(size_t workspace_bytes) {
  absl::StatusOr<const LtApi*> loaded = LoadLt();
  if (!loaded.ok()) return loaded.status();
  const LtApi* api = *loaded;
  auto impl = std::make_unique<Impl>();
  impl->api = api;
  DCF_LT_RETURN_IF_ERROR(api->Create(&impl->handle), "cublasLtCreate");
  auto ws = DeviceBuffer::Allocate(workspace_bytes, "the cuBLASLt workspace");
  if (!ws.ok()) return ws.status();
  impl->workspace = std::move(*ws);
  return std::unique_ptr<Gemm>(new Gemm(std::move(impl)));
}

size_t Gemm::workspace_bytes() const { return impl_->workspace.bytes(); }

absl::Status Gemm::Linear(const GemmArgs& a, cudaStream_t stream) {
  if (absl::Status s = ValidateGemmArgs(a); !s.ok()) return s;
  if (a.m == 0) return absl::OkStatus();
  const LtApi* api = impl_->api;
  absl::StatusOr<Plan*> plan = impl_->GetPlan(a);
  if (!plan.ok()) return plan.status();
  Plan& p = **plan;
  if (a.bias != nullptr) {
    const void* bias = a.bias;
    DCF_LT_RETURN_IF_ERROR(
        api->MatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)),
        "GEMM bias");
  }
  const float alpha = 1.0f, beta = a.accumulate ? 1.0f : 0.0f;
  DCF_LT_RETURN_IF_ERROR(
      api->Matmul(impl_->handle, p.op, &alpha, a.w, p.a, a.x, p.b, &beta, a.y, p.c, a.y, p.c,
                  &p.algo, impl_->workspace.get(), impl_->workspace.bytes(), stream),
      absl::StrCat("GEMM m=", a.m, " n=", a.n, " k=", a.k));
  return absl::OkStatus();
}

}  // namespace DCF_CUDA_NS
}  // namespace dcf::cuda

#endif  // !DCF_CUDA_SIM
