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
#include <algorithm>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/common/status_macros.h"
#include "engine/cuda/cuda_status.h"
#include "engine/cuda/device_buffer.h"
#include "engine/cuda/gemm_quant.h"

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
  decltype(&cublasLtMatrixLayoutSetAttribute) MatrixLayoutSetAttribute;
  decltype(&cublasLtMatmulPreferenceCreate) MatmulPreferenceCreate;
  decltype(&cublasLtMatmulPreferenceDestroy) MatmulPreferenceDestroy;
  decltype(&cublasLtMatmulPreferenceSetAttribute) MatmulPreferenceSetAttribute;
  decltype(&cublasLtMatmulAlgoGetHeuristic) MatmulAlgoGetHeuristic;
  decltype(&cublasLtMatmulAlgoCheck) MatmulAlgoCheck;
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
    sym(api->MatrixLayoutSetAttribute, "cublasLtMatrixLayoutSetAttribute");
    sym(api->MatmulPreferenceCreate, "cublasLtMatmulPreferenceCreate");
    sym(api->MatmulPreferenceDestroy, "cublasLtMatmulPreferenceDestroy");
    sym(api->MatmulPreferenceSetAttribute, "cublasLtMatmulPreferenceSetAttribute");
    sym(api->MatmulAlgoGetHeuristic, "cublasLtMatmulAlgoGetHeuristic");
    sym(api->MatmulAlgoCheck, "cublasLtMatmulAlgoCheck");
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

// One m bucket's descriptors and algorithms. The B and C layouts hold `cols` columns (m, in
// the column-major view below); Linear sets the real m as an attribute before each call.
// `ranked`: the algorithms that run at both ends of the bucket, the chosen one first, then
// the rest in the heuristic's order. The library is asked once per m of the bucket whether
// the first runs there (cublasLtMatmulAlgoCheck, host only); `algo_at[m - lo]` remembers the
// answer: the index in `ranked` of the first that does, kNoAlgo when none does, kUnchecked
// before the first product at that m.
struct Plan {
  static constexpr int16_t kUnchecked = -1;
  static constexpr int16_t kNoAlgo = -2;
  const LtApi* api = nullptr;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  std::vector<cublasLtMatmulAlgo_t> ranked;
  int lo = 0;
  std::vector<int16_t> algo_at;
  uint64_t cols = 0;

  Plan() = default;
  explicit Plan(const LtApi* lt) : api(lt) {}
  Plan(Plan&& o) noexcept { *this = std::move(o); }
  Plan& operator=(Plan&& o) noexcept {
    if (this != &o) {
      Release();
      api = o.api;
      op = std::exchange(o.op, nullptr);
      a = std::exchange(o.a, nullptr);
      b = std::exchange(o.b, nullptr);
      c = std::exchange(o.c, nullptr);
      ranked = std::move(o.ranked);
      lo = o.lo;
      algo_at = std::move(o.algo_at);
      cols = o.cols;
    }
    return *this;
  }
  ~Plan() { Release(); }

  void Release() {
    if (api == nullptr) return;
    if (a != nullptr) api->MatrixLayoutDestroy(a);
    if (b != nullptr) api->MatrixLayoutDestroy(b);
    if (c != nullptr) api->MatrixLayoutDestroy(c);
    if (op != nullptr) api->MatmulDescDestroy(op);
    a = b = c = nullptr;
    op = nullptr;
  }
};

// Sets the B and C layouts' column count (m) of `p`.
absl::Status SetCols(const LtApi* api, Plan& p, int m) {
  const uint64_t cols = static_cast<uint64_t>(m);
  if (p.cols == cols) return absl::OkStatus();
  DCF_LT_RETURN_IF_ERROR(
      api->MatrixLayoutSetAttribute(p.b, CUBLASLT_MATRIX_LAYOUT_COLS, &cols, sizeof(cols)),
      "GEMM layout");
  DCF_LT_RETURN_IF_ERROR(
      api->MatrixLayoutSetAttribute(p.c, CUBLASLT_MATRIX_LAYOUT_COLS, &cols, sizeof(cols)),
      "GEMM layout");
  p.cols = cols;
  return absl::OkStatus();
}

// Whether `algo` runs the plan's product at m = `m` within `workspace` bytes.
bool AlgoRunsAt(const LtApi* api, cublasLtHandle_t handle, Plan& p,
                const cublasLtMatmulAlgo_t& algo, int m, size_t workspace) {
  if (!SetCols(api, p, m).ok()) return false;
  cublasLtMatmulHeuristicResult_t check{};
  return api->MatmulAlgoCheck(handle, p.op, p.a, p.b, p.c, p.c, &algo, &check) ==
             CUBLAS_STATUS_SUCCESS &&
         check.workspaceSize <= workspace;
}

// Fills `p`'s ranks for the bucket [lo, hi] from the usable candidates `usable` (indices into
// `cands`), `first` going first (it must be among them).
void Rank(Plan& p, const std::vector<cublasLtMatmulHeuristicResult_t>& cands,
          const std::vector<int>& usable, int first, int lo, int hi) {
  p.ranked.clear();
  p.ranked.push_back(cands[first].algo);
  for (int i : usable) {
    if (i != first) p.ranked.push_back(cands[i].algo);
  }
  p.lo = lo;
  p.algo_at.assign(static_cast<size_t>(hi - lo + 1), Plan::kUnchecked);
  p.algo_at.front() = 0;  // checked while ranking
  p.algo_at.back() = 0;
}

}  // namespace

struct Gemm::Impl {
  const LtApi* api = nullptr;  // the loaded library
  cublasLtHandle_t handle = nullptr;
  DeviceBuffer workspace;
  GemmPlanCache<Plan> plans{kLazyPlanCapacity};
  std::vector<GemmPlanChoice> choices;
  int64_t built_on_use = 0;
  QuantGemm quant;  // validation, the dense / quantized routing, the quantized workspace

  ~Impl() {
    plans.Clear();  // before the handle goes
    if (handle != nullptr) api->Destroy(handle);
  }

  // The descriptors of `g`'s product with m = g.m, and up to `count` heuristic candidates
  // for it (in the heuristic's order, at least one).
  absl::Status Describe(const GemmArgs& g, const GemmPlanKey& key, int count, Plan* p,
                        std::vector<cublasLtMatmulHeuristicResult_t>* candidates) {
    const std::string what = absl::StrCat(key.fp8 ? "FP8 " : "", "GEMM plan m=", g.m, " n=", g.n,
                                          " k=", g.k);
    // Column-major view: D[n, m] = W^T[n, k] . X[k, m]; W is stored as a k x n column-major
    // matrix (ld k), X as k x m (ld ldx), D as n x m (ld ldy). That is the "TN" form (A
    // transposed, B not) cuBLASLt's FP8 GEMM requires: e4m3 A and B, f32 C and D, f32
    // compute and scale type, no scale pointers (1) and no bias (gemm_quant.h applies both).
    DCF_LT_RETURN_IF_ERROR(api->MatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F), what);
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    DCF_LT_RETURN_IF_ERROR(
        api->MatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)), what);
    DCF_LT_RETURN_IF_ERROR(
        api->MatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)), what);
    if (g.bias != nullptr) {
      const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
      DCF_LT_RETURN_IF_ERROR(
          api->MatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)),
          what);
      const void* bias = g.bias;  // the heuristic needs a pointer; Linear sets the real one
      DCF_LT_RETURN_IF_ERROR(api->MatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                         &bias, sizeof(bias)),
                             what);
    }
    const cudaDataType_t in = key.fp8 ? CUDA_R_8F_E4M3 : DataType(g.dtype);
    DCF_LT_RETURN_IF_ERROR(api->MatrixLayoutCreate(&p->a, in, g.k, g.n, g.k), what);
    DCF_LT_RETURN_IF_ERROR(api->MatrixLayoutCreate(&p->b, in, g.k, g.m, g.ldx), what);
    DCF_LT_RETURN_IF_ERROR(api->MatrixLayoutCreate(&p->c, CUDA_R_32F, g.n, g.m, g.ldy), what);
    p->cols = static_cast<uint64_t>(g.m);
    cublasLtMatmulPreference_t pref = nullptr;
    DCF_LT_RETURN_IF_ERROR(api->MatmulPreferenceCreate(&pref), what);
    const size_t ws = workspace.bytes();
    api->MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                      sizeof(ws));
    api->MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                      &key.align_w, sizeof(key.align_w));
    api->MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                      &key.align_x, sizeof(key.align_x));
    api->MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                      &key.align_y, sizeof(key.align_y));
    api->MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                      &key.align_y, sizeof(key.align_y));
    candidates->assign(count, cublasLtMatmulHeuristicResult_t{});
    int returned = 0;
    const cublasStatus_t hs = api->MatmulAlgoGetHeuristic(
        handle, p->op, p->a, p->b, p->c, p->c, pref, count, candidates->data(), &returned);
    api->MatmulPreferenceDestroy(pref);
    DCF_LT_RETURN_IF_ERROR(hs, what);
    candidates->resize(returned);
    if (returned == 0) {
      return absl::InternalError(absl::StrCat("cuBLASLt has no algorithm for ", what));
    }
    return absl::OkStatus();
  }

  // A plan for `key` (the bucket of a.m) without timing, for a product Prepare did not
  // cover: the heuristic's first candidate that runs at both ends of the bucket.
  absl::StatusOr<Plan*> BuildOnUse(const GemmArgs& a, const GemmPlanKey& key) {
    const int lo = GemmBucketLo(key.bucket), hi = GemmBucketHi(key.bucket);
    GemmArgs at = a;
    at.m = hi;
    Plan p(api);
    std::vector<cublasLtMatmulHeuristicResult_t> cands;
    RETURN_IF_ERROR(Describe(at, key, kCandidates, &p, &cands));
    const size_t ws = workspace.bytes();
    std::vector<int> usable;
    for (int i = 0; i < static_cast<int>(cands.size()); ++i) {
      const cublasLtMatmulHeuristicResult_t& c = cands[i];
      if (c.state == CUBLAS_STATUS_SUCCESS && AlgoRunsAt(api, handle, p, c.algo, lo, ws) &&
          AlgoRunsAt(api, handle, p, c.algo, hi, ws)) {
        usable.push_back(i);
      }
    }
    if (usable.empty()) {
      return absl::InternalError(absl::StrCat("cuBLASLt has no algorithm for GEMM n=", a.n,
                                              " k=", a.k, " valid for m ", lo, "..", hi));
    }
    Rank(p, cands, usable, usable.front(), lo, hi);
    ++built_on_use;
    Plan* stored = plans.Insert(key, std::move(p), /*pinned=*/false);
    if (stored == nullptr) return absl::InternalError("GEMM plan cache holds nothing");
    return stored;
  }

  // The algorithm of `p` for m (checked with the library the first time m comes; a later
  // candidate where the first does not run there); null when none does.
  const cublasLtMatmulAlgo_t* AlgoFor(Plan& p, int m) {
    int16_t& at = p.algo_at[static_cast<size_t>(m - p.lo)];
    if (at == Plan::kUnchecked) {
      at = Plan::kNoAlgo;
      for (size_t i = 0; i < p.ranked.size(); ++i) {
        if (AlgoRunsAt(api, handle, p, p.ranked[i], m, workspace.bytes())) {
          at = static_cast<int16_t>(i);
          break;
        }
      }
    }
    return at >= 0 ? &p.ranked[static_cast<size_t>(at)] : nullptr;
  }

  // The mean time of `runs` products of `a` with `algo`, after one warm-up; a negative time
  // when the library refuses to run it. Internal on a CUDA failure.
  absl::StatusOr<float> Time(const GemmArgs& a, Plan& p, const cublasLtMatmulAlgo_t& algo,
                             cudaEvent_t start, cudaEvent_t stop, cudaStream_t stream) {
    constexpr int kRuns = 5;
    RETURN_IF_ERROR(SetCols(api, p, a.m));
    const float alpha = 1.0f, beta = a.accumulate ? 1.0f : 0.0f;
    auto run = [&] {
      return api->Matmul(handle, p.op, &alpha, a.w, p.a, a.x, p.b, &beta, a.y, p.c, a.y, p.c,
                         &algo, workspace.get(), workspace.bytes(), stream);
    };
    if (run() != CUBLAS_STATUS_SUCCESS) {
      DCF_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream), "GEMM candidate timing");
      return -1.0f;
    }
    DCF_CUDA_RETURN_IF_ERROR(cudaEventRecord(start, stream), "GEMM candidate timing");
    for (int r = 0; r < kRuns; ++r) {
      if (run() != CUBLAS_STATUS_SUCCESS) {
        DCF_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream), "GEMM candidate timing");
        return -1.0f;
      }
    }
    DCF_CUDA_RETURN_IF_ERROR(cudaEventRecord(stop, stream), "GEMM candidate timing");
    DCF_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(stop), "GEMM candidate timing");
    float ms = 0.0f;
    DCF_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start, stop), "GEMM candidate timing");
    return ms / kRuns;
  }

  // Plans of every bucket of `p` from min_m on, candidates timed (see Gemm::Prepare).
  absl::Status PrepareProduct(const GemmArgs& product, int min_m, cudaEvent_t start,
                              cudaEvent_t stop, cudaStream_t stream) {
    const size_t ws = workspace.bytes();
    for (int bucket : GemmBucketsFor(min_m, product.m)) {
      GemmArgs at = product;
      at.m = std::min(GemmBucketHi(bucket), product.m);  // the buffers hold product.m rows
      const GemmPlanKey key = GemmPlanKeyOf(at);
      if (plans.Find(key) != nullptr) continue;  // another product of the same shape
      const int lo = GemmBucketLo(bucket), hi = GemmBucketHi(bucket);
      GemmArgs top = at;
      top.m = hi;  // the heuristic answers for the bucket's largest m
      Plan p(api);
      std::vector<cublasLtMatmulHeuristicResult_t> cands;
      RETURN_IF_ERROR(Describe(top, key, kCandidates, &p, &cands));
      GemmPlanChoice choice;
      choice.key = key;
      choice.timed_m = at.m;
      std::vector<int> usable;
      for (const cublasLtMatmulHeuristicResult_t& c : cands) {
        GemmCandidateTime t;
        t.workspace_bytes = c.workspaceSize;
        // Any m of the bucket may come: the algorithm must run at both of its ends.
        t.usable = c.state == CUBLAS_STATUS_SUCCESS && AlgoRunsAt(api, handle, p, c.algo, lo, ws) &&
                   AlgoRunsAt(api, handle, p, c.algo, hi, ws);
        if (t.usable) {
          ASSIGN_OR_RETURN(t.ms, Time(at, p, c.algo, start, stop, stream));
          t.usable = t.ms > 0.0f;
        }
        if (t.usable) usable.push_back(static_cast<int>(choice.candidates.size()));
        choice.candidates.push_back(t);
      }
      choice.chosen = PickFastestCandidate(choice.candidates, ws);
      if (choice.chosen < 0) {
        return absl::InternalError(absl::StrCat("cuBLASLt has no algorithm for GEMM n=", at.n,
                                                " k=", at.k, " valid for m ", lo, "..", hi));
      }
      Rank(p, cands, usable, choice.chosen, lo, hi);
      plans.Insert(key, std::move(p), /*pinned=*/true);
      choices.push_back(std::move(choice));
    }
    return absl::OkStatus();
  }

  // One library product (dense, or an FP8 product of gemm_quant.h), validated.
  absl::Status Product(const GemmArgs& a, cudaStream_t stream);
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
  RETURN_IF_ERROR(impl->quant.Init());
  return std::unique_ptr<Gemm>(new Gemm(std::move(impl)));
}

size_t Gemm::workspace_bytes() const { return impl_->workspace.bytes(); }

size_t Gemm::quant_workspace_bytes() const { return impl_->quant.workspace_bytes(); }

bool Gemm::fp8_gemm_supported() const { return impl_->quant.fp8_gemm_supported(); }

absl::Status Gemm::Prepare(absl::Span<const GemmArgs> products, int min_m, cudaStream_t stream) {
  impl_->plans.Clear();
  impl_->choices.clear();
  // Malformed products are InvalidArgument whatever the device's state (QuantGemm::Prepare
  // checks them again, before any planning).
  for (const GemmArgs& p : products) RETURN_IF_ERROR(ValidateGemmArgs(p));
  cudaEvent_t start = nullptr, stop = nullptr;
  DCF_CUDA_RETURN_IF_ERROR(cudaEventCreate(&start), "cudaEventCreate");
  if (cudaError_t e = cudaEventCreate(&stop); e != cudaSuccess) {
    cudaEventDestroy(start);
    return CudaStatus(e, "cudaEventCreate");
  }
  const absl::Status st = impl_->quant.Prepare(
      products, min_m,
      [&](const GemmArgs& p) { return impl_->PrepareProduct(p, min_m, start, stop, stream); },
      stream);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return st;
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
  const GemmPlanKey key = GemmPlanKeyOf(a);
  Plan* p = plans.Find(key);
  if (p == nullptr) {
    absl::StatusOr<Plan*> built = BuildOnUse(a, key);
    if (!built.ok()) return built.status();
    p = *built;
  }
  const cublasLtMatmulAlgo_t* algo = AlgoFor(*p, a.m);
  if (algo == nullptr) {
    return absl::InternalError(absl::StrCat("cuBLASLt has no algorithm for GEMM m=", a.m, " n=",
                                            a.n, " k=", a.k, " among the plan's candidates"));
  }
  RETURN_IF_ERROR(SetCols(api, *p, a.m));
  if (a.bias != nullptr) {
    const void* bias = a.bias;
    DCF_LT_RETURN_IF_ERROR(
        api->MatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)),
        "GEMM bias");
  }
  const float alpha = 1.0f, beta = a.accumulate ? 1.0f : 0.0f;
  DCF_LT_RETURN_IF_ERROR(
      api->Matmul(handle, p->op, &alpha, a.w, p->a, a.x, p->b, &beta, a.y, p->c, a.y, p->c,
                  algo, workspace.get(), workspace.bytes(), stream),
      absl::StrCat("GEMM m=", a.m, " n=", a.n, " k=", a.k));
  return absl::OkStatus();
}

}  // namespace DCF_CUDA_NS
}  // namespace dcf::cuda

#endif  // !DCF_CUDA_SIM
