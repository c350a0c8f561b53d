#include "engine/cpu/dcmha.h"

#include <algorithm>
#include <cstdint>
#include <cmath>
#include <cstring>
#include <limits>

#include "engine/cpu/dcmha_kernels.h"
#include "engine/kv/kv_cache_manager.h"
#include "engine/model/model_config.h"

namespace dcf::cpu {
namespace {

constexpr int kRank = ModelConfig::kRank;

// How a row element of each KV dtype is stored and widened (exactly) to f32.
template <DType D>
struct RowElem;
template <>
struct RowElem<DType::kF32> {
  using T = float;
  static float Load(const float* p) { return *p; }
};
template <>
struct RowElem<DType::kBF16> {
  using T = uint16_t;
  static float Load(const uint16_t* p) { return BF16ToFloat(*p); }
};
template <>
struct RowElem<DType::kF16> {
  using T = uint16_t;
  static float Load(const uint16_t* p) { return HalfToFloat(*p); }
};

// Calls fn(j, row) for every visible key, j = position - lo, in position order.
template <typename T, typename Fn>
void ForEachKey(absl::Span<const KeySegment> segments, int64_t lo, int64_t hi, Fn&& fn) {
  for (const KeySegment& seg : segments) {
    const int64_t begin = std::max(lo, seg.pos0);
    const int64_t end = std::min(hi + 1, seg.pos0 + seg.count);
    const T* rows = static_cast<const T*>(seg.rows);
    for (int64_t p = begin; p < end; ++p) fn(p - lo, rows + (p - seg.pos0) * seg.stride);
  }
}

// Compose (dcmha.h) with key-side terms of element type RowElem<D>; the same operations in
// the same order as Compose, so widened terms give bit-identical results.
template <DType D>
void ComposeRow(int n_head, const float* qw, const float* qg, const typename RowElem<D>::T* kw,
                const typename RowElem<D>::T* kg, const float* s, float* out) {
  using E = RowElem<D>;
  const int N = n_head;
  float qa[kRank], ka[kRank];
  for (int i = 0; i < kRank; ++i) {
    const float* q1 = qw + i * N;
    const typename E::T* k1 = kw + i * N;
    float a = 0, b = 0;
    for (int n = 0; n < N; ++n) {
      a += q1[n] * s[n];
      b += E::Load(k1 + n) * s[n];
    }
    qa[i] = a;
    ka[i] = b;
  }
  const float* q2 = qw + kRank * N;
  const typename E::T* k2 = kw + kRank * N;
  for (int m = 0; m < N; ++m) {
    float v = s[m] * (1.0f + qg[m] + E::Load(kg + m));
    for (int i = 0; i < kRank; ++i) v += q2[i * N + m] * qa[i] + E::Load(k2 + i * N + m) * ka[i];
    out[m] = v;
  }
}

template <DType D>
void AttendOnePortable(const KvRowLayout& layout, const QueryInputs& qi,
                       absl::Span<const KeySegment> segments, int64_t lo, int64_t hi,
                       float* scratch, float* out) {
  using E = RowElem<D>;
  using T = typename E::T;
  const int N = layout.n_head, hd = layout.head_dim;
  const int64_t L = hi - lo + 1;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  float* S = scratch;  // [L, N]

  // Scores and pre-compose at every key.
  ForEachKey<T>(segments, lo, hi, [&](int64_t j, const T* row) {
    const T* k = row + layout.k_offset();
    float* s = S + j * N;
    for (int n = 0; n < N; ++n) {
      const float* qn = qi.q + n * hd;
      const T* kn = k + n * hd;
      float dot = 0;
      for (int d = 0; d < hd; ++d) dot += qn[d] * E::Load(kn + d);
      s[n] = dot * scale;
    }
    const T* kt = row + layout.branch_offset(0);
    if (qi.compose) ComposeRow<D>(N, qi.pre_w, qi.pre_g, kt, kt + 2 * kRank * N, s, s);
  });

  // Softmax over keys, per head.
  float mx[256], sum[256];  // N <= 256 (checked by CpuBackend::Create)
  std::fill(mx, mx + N, -std::numeric_limits<float>::infinity());
  std::fill(sum, sum + N, 0.0f);
  for (int64_t j = 0; j < L; ++j) {
    for (int n = 0; n < N; ++n) mx[n] = std::max(mx[n], S[j * N + n]);
  }
  for (int64_t j = 0; j < L; ++j) {
    for (int n = 0; n < N; ++n) {
      const float e = std::exp(S[j * N + n] - mx[n]);
      S[j * N + n] = e;
      sum[n] += e;
    }
  }
  for (int n = 0; n < N; ++n) sum[n] = 1.0f / sum[n];

  // Normalise, post-compose and accumulate values.
  std::memset(out, 0, sizeof(float) * N * hd);
  ForEachKey<T>(segments, lo, hi, [&](int64_t j, const T* row) {
    float* p = S + j * N;
    for (int n = 0; n < N; ++n) p[n] *= sum[n];
    const T* kt = row + layout.branch_offset(1);
    if (qi.compose) ComposeRow<D>(N, qi.post_w, qi.post_g, kt, kt + 2 * kRank * N, p, p);
    const T* v = row + layout.v_offset();
    for (int n = 0; n < N; ++n) {
      const float w = p[n];
      const T* vn = v + n * hd;
      float* on = out + n * hd;
      for (int d = 0; d < hd; ++d) on[d] += w * E::Load(vn + d);
    }
  });
}

}  // namespace

void Compose(int n_head, const float* qw, const float* qg, const float* kw, const float* kg,
             const float* s, float* out) {
  ComposeRow<DType::kF32>(n_head, qw, qg, kw, kg, s, out);
}

int64_t AttendScratchFloats(const KvRowLayout& layout, int64_t num_keys) {
  // Scores [num_keys][N padded to 16], one row pointer per key (two floats each), then the
  // softmax sums [N padded to 16].
  const int64_t padded = (layout.n_head + 15) / 16 * 16;
  return num_keys * (padded + 2) + padded;
}

namespace {

// Whether AttendOne and AttendTile run the AVX-512 kernels for `layout`: one rule for both,
// since a tile gives each query the per-query kernel's bits only when both take the same one.
bool UsesAvx512Attention(const KvRowLayout& layout, Isa isa) {
  return SupportedIsa(isa) == Isa::kAvx512 && kernels::AttendOneAvx512Supports(layout);
}

}  // namespace

void AttendOne(const KvRowLayout& layout, const QueryInputs& qi,
               absl::Span<const KeySegment> segments, int64_t lo, int64_t hi, float* scratch,
               float* out, Isa isa) {
  const DType dtype = segments.empty() ? DType::kF32 : segments[0].dtype;
  if (UsesAvx512Attention(layout, isa)) {
    Team alone;
    kernels::AttendOneAvx512(layout, qi, segments.data(), static_cast<int>(segments.size()), lo,
                             hi, dtype, scratch, out, alone);
    return;
  }
  switch (dtype) {
    case DType::kF32:
      return AttendOnePortable<DType::kF32>(layout, qi, segments, lo, hi, scratch, out);
    case DType::kBF16:
      return AttendOnePortable<DType::kBF16>(layout, qi, segments, lo, hi, scratch, out);
    case DType::kF16:
      return AttendOnePortable<DType::kF16>(layout, qi, segments, lo, hi, scratch, out);
    case DType::kI8:  // a weight dtype only: no KV cache holds int8 rows
      break;
  }
}

void AttendOne(Team& team, const KvRowLayout& layout, const QueryInputs& qi,
               absl::Span<const KeySegment> segments, int64_t lo, int64_t hi, float* scratch,
               float* out, Isa isa) {
  if (UsesAvx512Attention(layout, isa)) {
    const DType dtype = segments.empty() ? DType::kF32 : segments[0].dtype;
    kernels::AttendOneAvx512(layout, qi, segments.data(), static_cast<int>(segments.size()), lo,
                             hi, dtype, scratch, out, team);
    return;
  }
  if (team.leader()) AttendOne(layout, qi, segments, lo, hi, scratch, out, isa);
  team.Barrier();
}

int64_t AttendTileScratchFloats(const KvRowLayout& layout, int64_t max_keys) {
  return std::max(AttendScratchFloats(layout, max_keys),
                  kernels::AttendTileAvx512ScratchFloats(layout, max_keys));
}

void AttendTile(const KvRowLayout& layout, const QueryTile& tile,
                absl::Span<const KeySegment> segments, float* scratch, float* out,
                int64_t out_stride, Isa isa) {
  const DType dtype = segments.empty() ? DType::kF32 : segments[0].dtype;
  if (UsesAvx512Attention(layout, isa)) {
    kernels::AttendTileAvx512(layout, tile, segments.data(), static_cast<int>(segments.size()),
                              dtype, scratch, out, out_stride);
    return;
  }
  const int N = layout.n_head;
  const int64_t dw_stride = static_cast<int64_t>(ModelConfig::kComposeBranches) * 2 * kRank * N;
  for (int i = 0; i < tile.count; ++i) {
    QueryInputs qi;
    qi.q = tile.q + i * tile.q_stride;
    qi.pre_w = tile.dw + i * dw_stride + 0 * 2 * kRank * N;
    qi.pre_g = tile.g + i * tile.g_stride + 0 * N;
    qi.post_w = tile.dw + i * dw_stride + 2 * 2 * kRank * N;
    qi.post_g = tile.g + i * tile.g_stride + 2 * N;
    qi.compose = tile.compose;
    const int64_t pos = tile.pos0 + i;
    AttendOne(layout, qi, segments, FirstKeptPosition(tile.window, static_cast<int>(pos)), pos,
              scratch, out + i * out_stride, isa);
  }
}

}  // namespace dcf::cpu
