#include "engine/cuda/device_weights.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "engine/common/status_macros.h"
#include "engine/cuda/cuda_status.h"
#include "engine/execution/step_plan.h"
#include "engine/weights/fp8_quant.h"
#include "engine/weights/int8_quant.h"

namespace dcf::cuda {
inline namespace DCF_CUDA_NS {
namespace {

constexpr int C = ModelConfig::kComposeBranches;
// Elements converted per host chunk (16 MiB of f32): bounds the host staging memory.
constexpr int64_t kChunkElems = int64_t{4} << 20;

DType ToDType(ElemType t) {
  switch (t) {
    case ElemType::kF32:
      return DType::kF32;
    case ElemType::kBF16:
      return DType::kBF16;
    case ElemType::kF16:
      return DType::kF16;
  }
  return DType::kF32;
}

// Converts host data chunk by chunk into a page-locked staging buffer and copies it to the
// device. Synchronous (loading is not on the serving path).
class Uploader {
 public:
  // With `check_finite` (--check-weights) every converted chunk is scanned: a value the
  // compute dtype cannot hold (F32 -> F16 beyond 65504) fails naming the tensor.
  static absl::StatusOr<Uploader> Create(bool check_finite) {
    Uploader u;
    u.check_finite_ = check_finite;
    ASSIGN_OR_RETURN(u.staging_,
                     PinnedBuffer::Allocate(kChunkElems * sizeof(float), "weight upload staging"));
    return u;
  }

  // Copies `count` elements of `from` at `src` to `dst` (device) + `dst_offset` elements of
  // `to`.
  // `count` elements of `from` at `src` to `dst` (device) + `dst_offset` elements of `to`;
  // `what` names them in errors.
  absl::Status Copy(const void* src, DType from, int64_t count, void* dst, int64_t dst_offset,
                    ElemType to, const std::string& what) {
    const DType t = ToDType(to);
    const int size = DTypeSize(t), src_size = DTypeSize(from);
    for (int64_t done = 0; done < count; done += kChunkElems) {
      const int64_t n = std::min(kChunkElems, count - done);
      ConvertDType(from, static_cast<const uint8_t*>(src) + done * src_size, n, t, staging_.get());
      if (check_finite_ && CountNonFinite(t, staging_.get(), n, nullptr) > 0) {
        RETURN_IF_ERROR(CheckFiniteConversion(what, from, src, count, t));
        return absl::InternalError(absl::StrCat(what, ": converting ", DTypeName(from), " to ",
                                                DTypeName(t), " gave non-finite values"));
      }
      DCF_CUDA_RETURN_IF_ERROR(cudaMemcpy(static_cast<uint8_t*>(dst) + (dst_offset + done) * size,
                                          staging_.get(), n * size, cudaMemcpyHostToDevice),
                               "weight upload");
    }
    return absl::OkStatus();
  }

 private:
  PinnedBuffer staging_;
  bool check_finite_ = false;
};

class Loader {
 public:
  Loader(ElemType dtype, WeightType matrices, Uploader uploader)
      : dtype_(dtype), matrices_(matrices), up_(std::move(uploader)) {}

  // A device tensor of `elems` elements of `type`, filled from the concatenation of `parts`
  // (each released after its upload).
  absl::StatusOr<DeviceBuffer> Concat(std::initializer_list<Tensor*> parts, int64_t elems,
                                      ElemType type, const std::string& what) {
    ASSIGN_OR_RETURN(DeviceBuffer buf, DeviceBuffer::Allocate(elems * ElemBytes(type), what));
    int64_t offset = 0;
    for (Tensor* t : parts) {
      RETURN_IF_ERROR(up_.Copy(t->data(), t->dtype(), t->numel(), buf.get(), offset, type, what));
      offset += t->numel();
      *t = Tensor();
    }
    if (offset != elems) {
      return absl::InternalError(absl::StrCat(what, ": ", offset, " elements, expected ", elems));
    }
    bytes_ += buf.bytes();
    return buf;
  }
  // One tensor as a matrix in the compute dtype.
  absl::StatusOr<DeviceBuffer> Matrix(Tensor& t, const std::string& what) {
    return Concat({&t}, t.numel(), dtype_, what);
  }
  // The concatenation of `parts` (row-major, `cols` columns each) as one of the five weight
  // matrices: in the compute dtype, or quantized row by row (device_weights.h), each part
  // released after its upload.
  absl::StatusOr<DeviceMatrix> WeightMatrix(std::initializer_list<Tensor*> parts, int64_t rows,
                                            int64_t cols, const std::string& what) {
    DeviceMatrix m;
    m.type = matrices_;
    if (matrices_ == WeightType::kDense) {
      ASSIGN_OR_RETURN(m.w, Concat(parts, rows * cols, dtype_, what));
      return m;
    }
    ASSIGN_OR_RETURN(m.w, DeviceBuffer::Allocate(rows * cols, what));
    ASSIGN_OR_RETURN(m.scale, DeviceBuffer::Allocate(rows * sizeof(float), what + " scales"));
    // Rows per host chunk: about kChunkElems values at a time.
    const int64_t chunk = std::max<int64_t>(1, kChunkElems / cols);
    std::vector<float> f(static_cast<size_t>(chunk * cols));
    std::vector<uint8_t> q(f.size());
    std::vector<float> scales(static_cast<size_t>(chunk));
    int64_t row = 0;
    for (Tensor* t : parts) {
      const int64_t part_rows = t->numel() / cols;
      const int src_size = DTypeSize(t->dtype());
      for (int64_t r0 = 0; r0 < part_rows; r0 += chunk) {
        const int64_t n = std::min(chunk, part_rows - r0);
        ConvertToF32(t->dtype(), static_cast<const uint8_t*>(t->data()) + r0 * cols * src_size,
                     n * cols, f.data());
        for (int64_t r = 0; r < n; ++r) {
          const float* v = f.data() + r * cols;
          uint8_t* codes = q.data() + r * cols;
          if (matrices_ == WeightType::kI8) {
            // The cpu's int8 rule with one group spanning the row: a bf16 scale, widened.
            uint16_t bits = 0;
            QuantizeRowInt8(v, cols, static_cast<int>(cols), reinterpret_cast<int8_t*>(codes),
                            &bits);
            scales[r] = BF16ToFloat(bits);
          } else {
            scales[r] = QuantizeRowFp8E4M3(v, cols, codes);
          }
        }
        DCF_CUDA_RETURN_IF_ERROR(cudaMemcpy(m.w.as<uint8_t>() + (row + r0) * cols, q.data(),
                                            n * cols, cudaMemcpyHostToDevice),
                                 "weight upload");
        DCF_CUDA_RETURN_IF_ERROR(cudaMemcpy(m.scale.as<float>() + row + r0, scales.data(),
                                            n * sizeof(float), cudaMemcpyHostToDevice),
                                 "weight upload");
      }
      row += part_rows;
      *t = Tensor();
    }
    if (row != rows) {
      return absl::InternalError(absl::StrCat(what, ": ", row, " rows, expected ", rows));
    }
    bytes_ += m.w.bytes() + m.scale.bytes();
    return m;
  }
  // One tensor in f32; empty stays empty.
  absl::StatusOr<DeviceBuffer> F32(Tensor& t, const std::string& what) {
    if (t.empty()) return DeviceBuffer();
    return Concat({&t}, t.numel(), ElemType::kF32, what);
  }

  ElemType dtype() const { return dtype_; }
  Uploader& uploader() { return up_; }
  void AddBytes(size_t b) { bytes_ += b; }
  size_t bytes() const { return bytes_; }

 private:
  ElemType dtype_;
  WeightType matrices_;
  Uploader up_;
  size_t bytes_ = 0;
};

// [rows, cols] -> [cols, rows], in the tensor's dtype.
Tensor Transposed(const Tensor& t, int64_t rows, int64_t cols) {
  Tensor out(t.dtype(), {cols, rows});
  const int size = DTypeSize(t.dtype());
  const uint8_t* src = static_cast<const uint8_t*>(t.data());
  uint8_t* dst = static_cast<uint8_t*>(out.data());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      std::memcpy(dst + (c * rows + r) * size, src + (r * cols + c) * size, size);
    }
  }
  return out;
}

absl::Status UploadLayer(const ModelConfig& cfg, int l, LayerWeights& L, Loader& ld,
                         DeviceLayerWeights* d) {
  const int64_t E = cfg.dim, N = cfg.n_head, F = cfg.intermediate_size, K = cfg.dynamic_hidden();
  const int64_t rows_in = FusedInputWidth(cfg);
  const std::string p = absl::StrCat("layers.", l, ".");
  ASSIGN_OR_RETURN(d->attn_norm_w, ld.F32(L.attention_norm_w, p + "attention_norm.weight"));
  ASSIGN_OR_RETURN(d->attn_norm_b, ld.F32(L.attention_norm_b, p + "attention_norm.bias"));
  {
    Tensor dw1_t = Transposed(L.dw1, E, C * K);  // [C*K, E]
    Tensor dd_t = Transposed(L.dd, E, C * N);    // [C*N, E]
    L.dw1 = Tensor();
    L.dd = Tensor();
    ASSIGN_OR_RETURN(d->w_in, ld.WeightMatrix({&L.wqkv_w, &dw1_t, &dd_t}, rows_in, E,
                                              p + "attention.wqkv|dw1|dd"));
  }
  if (!L.wqkv_b.empty()) {
    Tensor b(DType::kF32, {rows_in});
    std::memset(b.data(), 0, b.nbytes());
    ConvertToF32(L.wqkv_b.dtype(), L.wqkv_b.data(), 3 * E, b.f32());
    L.wqkv_b = Tensor();
    ASSIGN_OR_RETURN(d->b_in, ld.F32(b, p + "attention.wqkv.bias"));
  }
  ASSIGN_OR_RETURN(d->q_norm, ld.F32(L.q_norm, p + "attention.q_norm.scale"));
  ASSIGN_OR_RETURN(d->k_norm, ld.F32(L.k_norm, p + "attention.k_norm.scale"));
  ASSIGN_OR_RETURN(d->qkw, ld.Matrix(L.qkw, p + "attention.dyn_w_proj.qkw"));
  ASSIGN_OR_RETURN(d->wo, ld.WeightMatrix({&L.wo_w}, E, E, p + "attention.wo.weight"));
  ASSIGN_OR_RETURN(d->wo_b, ld.F32(L.wo_b, p + "attention.wo.bias"));
  ASSIGN_OR_RETURN(d->ffn_norm_w, ld.F32(L.ffn_norm_w, p + "ffn_norm.weight"));
  ASSIGN_OR_RETURN(d->ffn_norm_b, ld.F32(L.ffn_norm_b, p + "ffn_norm.bias"));
  if (cfg.architecture == Architecture::kDcPythia) {
    ASSIGN_OR_RETURN(d->w_up, ld.WeightMatrix({&L.w1_w}, F, E, p + "feed_forward.w1.weight"));
    ASSIGN_OR_RETURN(d->b_up, ld.F32(L.w1_b, p + "feed_forward.w1.bias"));
  } else {
    ASSIGN_OR_RETURN(d->w_up,
                     ld.WeightMatrix({&L.w1_w, &L.w3_w}, 2 * F, E, p + "feed_forward.w1|w3"));
  }
  ASSIGN_OR_RETURN(d->w_down, ld.WeightMatrix({&L.w2_w}, E, F, p + "feed_forward.w2.weight"));
  ASSIGN_OR_RETURN(d->b_down, ld.F32(L.w2_b, p + "feed_forward.w2.bias"));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<DeviceWeights> UploadWeights(const ModelConfig& config, ModelWeights weights,
                                            ElemType dtype, bool check_finite,
                                            WeightType matrices) {
  ASSIGN_OR_RETURN(Uploader uploader, Uploader::Create(check_finite));
  Loader ld(dtype, matrices, std::move(uploader));
  DeviceWeights d;
  ASSIGN_OR_RETURN(d.embed, ld.Matrix(weights.tok_embeddings, "tok_embeddings.weight"));
  d.layers.resize(config.n_layer);
  for (int l = 0; l < config.n_layer; ++l) {
    RETURN_IF_ERROR(UploadLayer(config, l, weights.layers[l], ld, &d.layers[l]));
  }
  ASSIGN_OR_RETURN(d.norm_w, ld.F32(weights.norm_w, "norm.weight"));
  ASSIGN_OR_RETURN(d.norm_b, ld.F32(weights.norm_b, "norm.bias"));
  ASSIGN_OR_RETURN(d.output, ld.WeightMatrix({&weights.output}, config.vocab_size, config.dim,
                                             "output.weight"));
  d.bytes = ld.bytes();
  return d;
}

}  // namespace DCF_CUDA_NS
}  // namespace dcf::cuda
