#include "engine/model/model_weights.h"

#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <new>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "engine/common/status_macros.h"
#include "engine/weights/int8_quant.h"

namespace dcf {
namespace {

// Tensors that published checkpoints carry but inference does not read.
bool IsIgnoredTensor(absl::string_view name) {
  static constexpr absl::string_view kIgnoredSuffixes[] = {
      ".dyn_w_proj.dw_m", ".dyn_w_proj.qkw_m", ".dyn_w_proj.pre_proj.w",
      ".dyn_w_proj.post_proj.w"};
  for (absl::string_view s : kIgnoredSuffixes) {
    if (absl::EndsWith(name, s)) return true;
  }
  return absl::StrContains(name, ".attention.kv_cache.");
}

// Layers the checkpoint holds: the count of layers 0, 1, 2, ... that have at least one
// "layers.<l>." tensor, up to the first missing index. Bounded by the number of tensors in
// the files, whatever indices they name: one tiny tensor "layers.9999999.x" adds one index,
// not ten million layers.
int LayersHeld(const CheckpointReader& reader) {
  absl::flat_hash_set<int> indices;
  for (const TensorInfo& t : reader.tensors()) {
    absl::string_view rest = t.name;
    if (!absl::ConsumePrefix(&rest, "layers.")) continue;
    int l = 0;
    if (absl::SimpleAtoi(rest.substr(0, rest.find('.')), &l) && l >= 0) indices.insert(l);
  }
  int held = 0;
  while (indices.contains(held)) ++held;
  return held;
}

absl::Status OutOfHostMemory() {
  return absl::ResourceExhaustedError(
      "out of host memory while loading the weights (the model is too large)");
}

// One expected tensor: its name, the shape the file must have, and where it goes.
struct Expected {
  std::string name;
  std::vector<int64_t> shape;
  Tensor* dst;
  // The dtype the file must store it in (int8 matrices and their scales); nullopt: any
  // float dtype.
  std::optional<DType> dtype = std::nullopt;
};

bool IsScaleOrInt8(const Tensor& t, const LayerWeights* l, const ModelWeights* w) {
  if (t.dtype() == DType::kI8) return true;
  if (w != nullptr && &t == &w->output_s) return true;
  if (l != nullptr) {
    for (const Tensor* s : {&l->wqkv_s, &l->wo_s, &l->w1_s, &l->w3_s, &l->w2_s}) {
      if (&t == s) return true;
    }
  }
  return false;
}

// The scales of an int8 matrix must be finite and not negative (a negative one would flip
// the group's sign; NaN or infinity would poison every product), and small enough that
// 127 * scale, the group's largest weight, is finite too.
absl::Status CheckInt8Scales(const std::string& name, const Tensor& scales) {
  const auto* bits = static_cast<const uint16_t*>(scales.data());
  for (int64_t i = 0; i < scales.numel(); ++i) {
    const bool negative = (bits[i] & 0x8000u) != 0 && (bits[i] & 0x7fffu) != 0;
    if (negative || (bits[i] & 0x7f80u) == 0x7f80u) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", name, "': scale ", i, " is ", BF16ToFloat(bits[i]),
          " (int8 scales must be finite and not negative)"));
    }
    if (!std::isfinite(127.0f * BF16ToFloat(bits[i]))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", name, "': scale ", i, " is ", BF16ToFloat(bits[i]),
          ", so 127 * scale overflows float32 (int8 weights would dequantize to infinity)"));
    }
  }
  return absl::OkStatus();
}

// The codes of an int8 matrix lie in [-127, 127] (docs/QUANTIZATION.md): -128 has no
// positive twin, and the kernels' exactness bounds assume |q| <= 127. One memchr pass over
// the bytes just read (GB/s, a small fraction of reading them).
absl::Status CheckInt8Codes(const std::string& name, const Tensor& codes) {
  const auto* bytes = static_cast<const uint8_t*>(codes.data());
  const void* at = std::memchr(bytes, 0x80, static_cast<size_t>(codes.numel()));
  if (at == nullptr) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "': value ",
                                                 static_cast<const uint8_t*>(at) - bytes,
                                                 " is -128 (int8 weights must be in [-127, 127])"));
}

}  // namespace

std::vector<Tensor*> LayerWeights::All() {
  return {&attention_norm_w, &attention_norm_b, &wqkv_w, &wqkv_b, &wo_w,   &wo_b,
          &q_norm,           &k_norm,           &dw1,    &qkw,    &dd,     &ffn_norm_w,
          &ffn_norm_b,       &w1_w,             &w1_b,   &w3_w,   &w2_w,   &w2_b,
          &wqkv_s,           &wo_s,             &w1_s,   &w3_s,   &w2_s};
}

std::vector<Tensor*> ModelWeights::All() {
  std::vector<Tensor*> all = {&tok_embeddings, &norm_w, &norm_b, &output, &output_s};
  for (LayerWeights& l : layers) {
    for (Tensor* t : l.All()) all.push_back(t);
  }
  return all;
}

int64_t ModelWeights::NumParameters() {
  int64_t n = 0;
  for (const Tensor* t : All()) n += t->numel();
  return n;
}

size_t ModelWeights::NumBytes() {
  size_t n = 0;
  for (const Tensor* t : All()) n += t->nbytes();
  return n;
}

void ModelWeights::ConvertTo(DType dtype) {
  for (Tensor* t : {&tok_embeddings, &norm_w, &norm_b, &output}) {
    if (!IsScaleOrInt8(*t, nullptr, this)) t->ConvertTo(dtype);
  }
  for (LayerWeights& l : layers) {
    for (Tensor* t : l.All()) {
      if (!IsScaleOrInt8(*t, &l, nullptr)) t->ConvertTo(dtype);
    }
  }
}

namespace {

struct SplitQkv {
  Tensor q, k, v;  // [E, E] each
};

// Lists every tensor a model with config `c` reads, with the shape the file must have and
// the buffer of `w` it goes into. `split_layers[l]` selects wq/wk/wv instead of wqkv.
absl::StatusOr<std::vector<Expected>> BuildExpected(const ModelConfig& c, ModelWeights& w,
                                                    const std::vector<bool>& split_layers,
                                                    std::vector<SplitQkv>& split) {
  const int64_t E = c.dim, N = c.n_head, hd = c.head_dim, F = c.intermediate_size,
                V = c.vocab_size, C = ModelConfig::kComposeBranches, K = c.dynamic_hidden(),
                I = ModelConfig::kRank;
  const bool bias = c.linear_bias;
  const bool pythia = c.architecture == Architecture::kDcPythia;
  w.layers.resize(c.n_layer);
  split.resize(c.n_layer);
  std::vector<Expected> expected;
  const int G = c.int8_group_size;
  // A row-major matrix [out, in]: I8 with its BF16 scales in an int8 checkpoint.
  auto matrix = [&](std::string name, int64_t out, int64_t in, Tensor* dst, Tensor* scales) {
    if (G == 0) {
      expected.push_back({std::move(name), {out, in}, dst});
      return;
    }
    expected.push_back({name, {out, in}, dst, DType::kI8});
    expected.push_back({name + "_scale", {out, Int8Groups(in, G)}, scales, DType::kBF16});
  };
  expected.push_back({"tok_embeddings.weight", {V, E}, &w.tok_embeddings});
  expected.push_back({"norm.weight", {E}, &w.norm_w});
  if (pythia) expected.push_back({"norm.bias", {E}, &w.norm_b});
  matrix("output.weight", V, E, &w.output, &w.output_s);
  for (int l = 0; l < c.n_layer; ++l) {
    LayerWeights& L = w.layers[l];
    const std::string p = absl::StrCat("layers.", l, ".");
    auto add = [&](std::string suffix, std::vector<int64_t> shape, Tensor* dst) {
      expected.push_back({p + suffix, std::move(shape), dst});
    };
    auto add_matrix = [&](std::string suffix, int64_t out, int64_t in, Tensor* dst,
                          Tensor* scales) { matrix(p + suffix, out, in, dst, scales); };
    add("attention_norm.weight", {E}, &L.attention_norm_w);
    add("ffn_norm.weight", {E}, &L.ffn_norm_w);
    if (pythia) {
      add("attention_norm.bias", {E}, &L.attention_norm_b);
      add("ffn_norm.bias", {E}, &L.ffn_norm_b);
    }
    if (!split_layers[l]) {
      add_matrix("attention.wqkv.weight", 3 * E, E, &L.wqkv_w, &L.wqkv_s);
      if (bias) add("attention.wqkv.bias", {3 * E}, &L.wqkv_b);
    } else {
      if (bias) {
        return absl::InvalidArgumentError(absl::StrCat(
            p, "attention.wq/wk/wv: split projections with biases are not supported"));
      }
      if (G > 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            p, "attention.wq/wk/wv: an int8 checkpoint stores the fused ", p,
            "attention.wqkv.weight"));
      }
      add("attention.wq.weight", {E, E}, &split[l].q);
      add("attention.wk.weight", {E, E}, &split[l].k);
      add("attention.wv.weight", {E, E}, &split[l].v);
    }
    add_matrix("attention.wo.weight", E, E, &L.wo_w, &L.wo_s);
    if (bias) add("attention.wo.bias", {E}, &L.wo_b);
    if (c.use_qk_norm) {
      add("attention.q_norm.scale", {hd}, &L.q_norm);
      add("attention.k_norm.scale", {hd}, &L.k_norm);
    }
    add("attention.dyn_w_proj.dw1", {E, 1, C, K}, &L.dw1);
    add("attention.dyn_w_proj.qkw", {1, C, K, 2 * I, N}, &L.qkw);
    add("attention.dyn_w_proj.dd", {E, 1, C * N}, &L.dd);
    add_matrix("feed_forward.w1.weight", F, E, &L.w1_w, &L.w1_s);
    add_matrix("feed_forward.w2.weight", E, F, &L.w2_w, &L.w2_s);
    if (pythia) {
      if (bias) {
        add("feed_forward.w1.bias", {F}, &L.w1_b);
        add("feed_forward.w2.bias", {E}, &L.w2_b);
      }
    } else {
      add_matrix("feed_forward.w3.weight", F, E, &L.w3_w, &L.w3_s);
    }
  }
  return expected;
}

}  // namespace

std::vector<TensorSpec> ExpectedTensors(const ModelConfig& config) {
  ModelWeights w;
  std::vector<SplitQkv> split;
  auto expected = BuildExpected(config, w, std::vector<bool>(config.n_layer, false), split);
  std::vector<TensorSpec> specs;
  for (const Expected& e : *expected) specs.push_back({e.name, e.shape});
  return specs;
}

std::vector<std::pair<std::string, Tensor*>> NamedTensors(const ModelConfig& config,
                                                         ModelWeights& w) {
  std::vector<SplitQkv> split;
  auto expected = BuildExpected(config, w, std::vector<bool>(config.n_layer, false), split);
  std::vector<std::pair<std::string, Tensor*>> named;
  for (const Expected& e : *expected) named.emplace_back(e.name, e.dst);
  return named;
}

absl::StatusOr<ModelWeights> LoadModelWeights(const ModelConfig& c, CheckpointReader& reader,
                                              const WeightLoadOptions& options) {
  // Files may split wqkv into wq/wk/wv; those are concatenated after reading.
  absl::flat_hash_map<std::string, const TensorInfo*> present;
  for (const TensorInfo& t : reader.tensors()) present[t.name] = &t;
  // The layers the files hold bound everything built per layer below: a config.json that
  // claims more (n_layer 10000000 beside a 4-layer checkpoint, with or without a tensor of
  // layer 9999999) must fail here, not after allocating for every claimed layer.
  const int held = LayersHeld(reader);
  if (c.n_layer > held) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config.json: n_layer is ", c.n_layer, " but the checkpoint holds ", held,
        " layer(s) (no tensor 'layers.", held, ".*')"));
  }
  std::vector<bool> split_layers(c.n_layer);
  for (int l = 0; l < c.n_layer; ++l) {
    const std::string p = absl::StrCat("layers.", l, ".attention.");
    split_layers[l] = !present.contains(p + "wqkv.weight") && present.contains(p + "wq.weight");
  }
  ModelWeights w;
  std::vector<SplitQkv> split;
  absl::StatusOr<std::vector<Expected>> built;
  try {
    built = BuildExpected(c, w, split_layers, split);
  } catch (const std::bad_alloc&) {
    return OutOfHostMemory();
  }
  ASSIGN_OR_RETURN(std::vector<Expected> expected, std::move(built));
  // Validate everything before reading anything.
  absl::flat_hash_map<std::string, const Expected*> by_name;
  for (const Expected& e : expected) by_name[e.name] = &e;
  for (const TensorInfo& t : reader.tensors()) {
    auto it = by_name.find(t.name);
    if (it == by_name.end()) {
      if (IsIgnoredTensor(t.name)) continue;
      return absl::InvalidArgumentError(
          absl::StrCat("unexpected tensor '", t.name, "' in the checkpoint (not part of a ",
                       c.ArchitectureName(), " model with this config)"));
    }
    if (t.shape != it->second->shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", t.name, "' has shape ", ShapeToString(t.shape), ", expected ",
          ShapeToString(it->second->shape), " for this config"));
    }
    const std::optional<DType> want = it->second->dtype;
    if (want.has_value() && t.dtype != *want) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", t.name, "' is ", DTypeName(t.dtype), ", expected ", DTypeName(*want),
          " in an int8 checkpoint (quantization_config group_size ", c.int8_group_size,
          ", docs/QUANTIZATION.md)"));
    }
    if (!want.has_value() && t.dtype == DType::kI8) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", t.name, "' is I8, which ",
          c.int8_group_size > 0 ? "only the quantized matrices may be"
                                : "needs config.json's quantization_config (docs/QUANTIZATION.md)"));
    }
  }
  for (const Expected& e : expected) {
    if (!present.contains(e.name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", e.name, "' is missing from the checkpoint"));
    }
  }

  absl::flat_hash_map<std::string, DType> stored;
  for (const TensorInfo& t : reader.tensors()) stored[t.name] = t.dtype;
  try {  // allocation failure (a model larger than host memory) becomes a Status
    for (const Expected& e : expected) {
      const DType dtype = e.dtype.has_value() ? *e.dtype : options.dtype.value_or(stored.at(e.name));
      *e.dst = Tensor(dtype, e.shape);
      RETURN_IF_ERROR(reader.Read(e.name, dtype, e.dst->data(), e.dst->numel()));
      if (e.dtype == DType::kBF16) RETURN_IF_ERROR(CheckInt8Scales(e.name, *e.dst));
      if (e.dtype == DType::kI8) RETURN_IF_ERROR(CheckInt8Codes(e.name, *e.dst));
      // The scan reads what was loaded; only when it finds something are the stored values
      // read again, to tell a corrupt checkpoint from a conversion out of range (F32 -> F16).
      if (options.check_finite &&
          CountNonFinite(dtype, e.dst->data(), e.dst->numel(), nullptr) > 0) {
        const DType from = stored.at(e.name);
        if (from == dtype) {
          return CheckFiniteConversion(e.name, from, e.dst->data(), e.dst->numel(), dtype);
        }
        Tensor raw(from, e.shape);
        RETURN_IF_ERROR(reader.Read(e.name, from, raw.data(), raw.numel()));
        RETURN_IF_ERROR(CheckFiniteConversion(e.name, from, raw.data(), raw.numel(), dtype));
        return absl::InternalError(absl::StrCat(
            "tensor '", e.name, "' loaded non-finite values that neither its stored ",
            DTypeName(from), " values nor their conversion to ", DTypeName(dtype), " hold"));
      }
    }
    for (int l = 0; l < c.n_layer; ++l) {
      SplitQkv& s = split[l];
      if (!split_layers[l]) continue;
      // The three parts may be stored in different dtypes: concatenate in the widest.
      DType dtype = s.q.dtype();
      if (s.k.dtype() != dtype || s.v.dtype() != dtype) dtype = DType::kF32;
      const int64_t E = c.dim;
      Tensor& dst = w.layers[l].wqkv_w;
      dst = Tensor(dtype, {3 * E, E});
      size_t offset = 0;
      for (Tensor* part : {&s.q, &s.k, &s.v}) {
        part->ConvertTo(dtype);
        std::memcpy(static_cast<uint8_t*>(dst.data()) + offset, part->data(), part->nbytes());
        offset += part->nbytes();
        *part = Tensor();
      }
    }
  } catch (const std::bad_alloc&) {
    return OutOfHostMemory();
  }
  return w;
}

}  // namespace dcf
