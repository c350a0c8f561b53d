#include "engine/cpu/packed_matrix.h"

#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#include "engine/common/logging.h"
#include "engine/cpu/matmul_kernels.h"
#include "engine/cpu/team.h"
#include "engine/weights/int8_quant.h"

namespace dcf::cpu {
namespace {

// Below this many multiply-adds one thread finishes before a second one would start.
constexpr int64_t kMinParallelMacs = int64_t{1} << 17;
// Work items per thread of a parallel product.
constexpr int64_t kChunksPerThread = 8;
// Elements of x from which int8 x int8 products quantize them on the threads.
constexpr int64_t kMinParallelQuantElements = int64_t{1} << 15;

uint16_t NarrowBits(float v, DType dtype) {
  return dtype == DType::kBF16 ? FloatToBF16(v) : FloatToHalf(v);
}

float ToFloat(const void* src, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kF32: return static_cast<const float*>(src)[i];
    case DType::kF16: return HalfToFloat(static_cast<const uint16_t*>(src)[i]);
    case DType::kBF16: return BF16ToFloat(static_cast<const uint16_t*>(src)[i]);
    case DType::kI8: return static_cast<const int8_t*>(src)[i];  // QuantizeInt8 copies these
  }
  return 0;
}

kernels::WeightType WeightTypeOf(DType dtype) {
  switch (dtype) {
    case DType::kF32: return kernels::kWeightF32;
    case DType::kF16: return kernels::kWeightF16;
    case DType::kBF16: return kernels::kWeightBF16;
    case DType::kI8: break;  // int8 matrices come from QuantizeInt8 or FromInt8Rows
  }
  DCF_CHECK(false) << "Concat stores F32, F16 or BF16, not " << DTypeName(dtype);
  return kernels::kWeightF32;
}

// Slot of output j (0..31) of a panel column: pairs (j, j + 16) share a word in bf16.
int Slot(DType dtype, int j) {
  if (dtype != DType::kBF16) return j;
  return j < 16 ? 2 * j : 2 * (j - 16) + 1;
}

}  // namespace

PackedMatrix PackedMatrix::Concat(const std::vector<Source>& sources, int64_t in,
                                  DType dtype) {
  PackedMatrix m;
  int64_t out = 0;
  for (const Source& src : sources) out += src.rows;
  if (out == 0 || in == 0) return m;
  m.in_ = in;
  m.out_ = out;
  m.type_ = WeightTypeOf(dtype);
  m.data_ = LargeBuffer(m.nbytes());
  void* p = m.data_.data();
  // Output row -> (source, row within it).
  std::vector<int> source_of(out);
  std::vector<int64_t> row_in(out);
  for (int64_t o = 0, i = 0; i < static_cast<int64_t>(sources.size()); ++i) {
    for (int64_t r = 0; r < sources[i].rows; ++r, ++o) {
      source_of[o] = static_cast<int>(i);
      row_in[o] = r;
    }
  }
  const int64_t panels = m.num_panels();
#pragma omp parallel for schedule(static)
  for (int64_t pi = 0; pi < panels; ++pi) {
    for (int j = 0; j < kPanel; ++j) {
      const int64_t o = pi * kPanel + j;
      for (int64_t k = 0; k < in; ++k) {
        const int64_t dst = (pi * in + k) * kPanel + Slot(dtype, j);
        if (o >= out) {  // padding outputs: zero weights
          if (dtype == DType::kF32) {
            static_cast<float*>(p)[dst] = 0;
          } else {
            static_cast<uint16_t*>(p)[dst] = 0;
          }
          continue;
        }
        const Source& src = sources[source_of[o]];
        const int64_t i = src.columns ? k * src.ld + row_in[o] : row_in[o] * src.ld + k;
        if (dtype == DType::kF32) {
          static_cast<float*>(p)[dst] = ToFloat(src.data, src.dtype, i);
        } else if (src.dtype == dtype) {  // same 16-bit dtype: copy the bits
          static_cast<uint16_t*>(p)[dst] = static_cast<const uint16_t*>(src.data)[i];
        } else {
          static_cast<uint16_t*>(p)[dst] = NarrowBits(ToFloat(src.data, src.dtype, i), dtype);
        }
      }
    }
  }
  return m;
}

DType PackedMatrix::CommonDType(const std::vector<Source>& sources) {
  for (const Source& s : sources) {
    if (s.dtype != sources.front().dtype) return DType::kF32;
  }
  return sources.empty() ? DType::kF32 : sources.front().dtype;
}

DType PackedMatrix::dtype() const {
  switch (type_) {
    case kernels::kWeightF16: return DType::kF16;
    case kernels::kWeightBF16: return DType::kBF16;
    default: return DType::kF32;
  }
}

PackedMatrix PackedMatrix::QuantizeInt8(const std::vector<Source>& sources, int64_t in,
                                        Int8Matrices int8) {
  const int group = int8.group;
  int64_t out = 0;
  for (const Source& src : sources) out += src.rows;
  if (out == 0 || in == 0 || !ValidInt8GroupSize(group)) return PackedMatrix();
  const int64_t groups = (in + group - 1) / group;
  std::vector<int8_t> q(static_cast<size_t>(out * in));            // [out, in]
  std::vector<uint16_t> scales(static_cast<size_t>(out * groups));  // [out, groups] bf16
  std::vector<int> source_of(out);
  std::vector<int64_t> row_in(out);
  for (int64_t o = 0, i = 0; i < static_cast<int64_t>(sources.size()); ++i) {
    for (int64_t r = 0; r < sources[i].rows; ++r, ++o) {
      source_of[o] = static_cast<int>(i);
      row_in[o] = r;
    }
  }
#pragma omp parallel for schedule(static)
  for (int64_t o = 0; o < out; ++o) {
    const Source& src = sources[source_of[o]];
    if (src.dtype == DType::kI8) {
      std::memcpy(&q[o * in], static_cast<const int8_t*>(src.data) + row_in[o] * src.ld, in);
      std::memcpy(&scales[o * groups], src.scales + row_in[o] * groups,
                  sizeof(uint16_t) * groups);
      continue;
    }
    std::vector<float> v(static_cast<size_t>(in));
    for (int64_t k = 0; k < in; ++k) {
      const int64_t i = src.columns ? k * src.ld + row_in[o] : row_in[o] * src.ld + k;
      v[k] = ToFloat(src.data, src.dtype, i);
    }
    QuantizeRowInt8(v.data(), in, group, &q[o * in], &scales[o * groups]);
  }
  return FromInt8Rows(q.data(), scales.data(), out, in, int8);
}

PackedMatrix PackedMatrix::FromInt8Rows(const int8_t* q, const uint16_t* scales, int64_t out,
                                        int64_t in, Int8Matrices int8) {
  PackedMatrix m;
  const int group = int8.group;
  if (out == 0 || in == 0 || !ValidInt8GroupSize(group)) return m;
  m.in_ = in;
  m.out_ = out;
  m.type_ = int8.activations ? kernels::kWeightI8A8 : kernels::kWeightI8;
  m.group_ = group;
  m.data_ = LargeBuffer(m.nbytes());
  const int64_t panels = m.num_panels(), groups = m.num_groups();
  const size_t panel_bytes = m.panel_bytes();
  uint8_t* base = static_cast<uint8_t*>(m.data_.data());
  if (int8.activations) {  // kernels::kWeightI8A8: group blocks of q, scales, sums of q
#pragma omp parallel for schedule(static)
    for (int64_t pi = 0; pi < panels; ++pi) {
      for (int64_t g = 0, k0 = 0; k0 < in; ++g, k0 += group) {
        uint8_t* block = base + pi * panel_bytes + kernels::I8A8BlockOffset(g, group);
        const int64_t len = std::min<int64_t>(group, in - k0);
        int8_t* pq = reinterpret_cast<int8_t*>(block);
        std::memset(pq, 0, kernels::I8A8ScalesOffset(len));
        for (int j = 0; j < kPanel; ++j) {
          const int64_t o = pi * kPanel + j;
          int sum = 0;
          uint16_t scale = 0;
          if (o < out) {
            for (int64_t k = 0; k < len; ++k) {
              const int8_t v = q[o * in + k0 + k];
              pq[kernels::I8A8QOffset(k, j)] = v;
              sum += v;
            }
            scale = scales[o * groups + g];
          }
          // |sum| <= 128 * 128 (a checkpoint may hold -128), well within int16.
          const int16_t sum16 = static_cast<int16_t>(sum);
          std::memcpy(block + kernels::I8A8ScalesOffset(len) + 2 * j, &scale, 2);
          std::memcpy(block + kernels::I8A8SumsOffset(len) + 2 * j, &sum16, 2);
        }
      }
    }
    return m;
  }
#pragma omp parallel for schedule(static)
  for (int64_t pi = 0; pi < panels; ++pi) {
    int8_t* pq = reinterpret_cast<int8_t*>(base + pi * panel_bytes);  // [in, 32]
    uint16_t* ps = reinterpret_cast<uint16_t*>(pq + in * kPanel);     // [groups, 32]
    for (int j = 0; j < kPanel; ++j) {
      const int64_t o = pi * kPanel + j;
      for (int64_t k = 0; k < in; ++k) pq[k * kPanel + j] = o < out ? q[o * in + k] : 0;
      for (int64_t g = 0; g < groups; ++g) {
        ps[g * kPanel + j] = o < out ? scales[o * groups + g] : 0;
      }
    }
  }
  return m;
}

PackedMatrix PackedMatrix::FromRows(const void* w, DType src, int64_t out, int64_t in,
                                    DType dtype) {
  return Concat({Source{w, src, out, false, in}}, in, dtype);
}

PackedMatrix PackedMatrix::FromColumns(const void* w, DType src, int64_t in, int64_t out,
                                       int64_t ld, DType dtype) {
  return Concat({Source{w, src, out, true, ld}}, in, dtype);
}

int8_t PackedMatrix::QuantAt(int64_t o, int64_t k) const {
  const uint8_t* panel = static_cast<const uint8_t*>(data_.data()) + (o / kPanel) * panel_bytes();
  const int j = static_cast<int>(o % kPanel);
  if (type_ == kernels::kWeightI8A8) {
    const uint8_t* block = panel + kernels::I8A8BlockOffset(k / group_, group_);
    return static_cast<int8_t>(block[kernels::I8A8QOffset(k % group_, j)]);
  }
  return reinterpret_cast<const int8_t*>(panel)[k * kPanel + j];
}

uint16_t PackedMatrix::ScaleBitsAt(int64_t o, int64_t k) const {
  const uint8_t* panel = static_cast<const uint8_t*>(data_.data()) + (o / kPanel) * panel_bytes();
  const int64_t g = k / group_, j = o % kPanel;
  if (type_ == kernels::kWeightI8A8) {
    const int64_t len = std::min<int64_t>(group_, in_ - g * group_);
    const uint8_t* block = panel + kernels::I8A8BlockOffset(g, group_);
    uint16_t bits;
    std::memcpy(&bits, block + kernels::I8A8ScalesOffset(len) + 2 * j, 2);
    return bits;
  }
  const uint16_t* scales = reinterpret_cast<const uint16_t*>(panel + in_ * kPanel);
  return scales[g * kPanel + j];
}

float PackedMatrix::At(int64_t o, int64_t k) const {
  if (group_ != 0) return static_cast<float>(QuantAt(o, k)) * BF16ToFloat(ScaleBitsAt(o, k));
  const int64_t p = o / kPanel;
  const DType d = dtype();
  const int64_t i = (p * in_ + k) * kPanel + Slot(d, static_cast<int>(o % kPanel));
  return ToFloat(data_.data(), d, i);
}

// v's data with room for n elements: grown when smaller, never shrunk (within what
// MatMulScratch::Reserve reserved, no allocation; a resize down and up again between a
// narrow and a wide product would zero the difference every time).
namespace {
template <typename T>
T* Grown(std::vector<T>& v, int64_t n) {
  if (v.size() < static_cast<size_t>(n)) v.resize(static_cast<size_t>(n));
  return v.data();
}
}  // namespace

void MatMulScratch::Reserve(int64_t rows, int64_t in, int group, bool int8_activations) {
  if (int8_activations) {
    xq.reserve(static_cast<size_t>(rows * RoundUpTo4(in)));
    xs.reserve(static_cast<size_t>(rows * Int8Groups(in, group)));
  } else {
    xpacked.reserve(static_cast<size_t>(rows * in));
  }
}

namespace {

// A product's arguments, kernel and row buffers, as every thread of its team sees them.
struct Product {
  kernels::PanelArgs a;
  void (*kernel)(const kernels::PanelArgs&, int64_t, int64_t) = kernels::PanelsPortable;
  const PackedMatrix* w = nullptr;
  Isa isa = Isa::kPortable;
  MatMulScratch* buf = nullptr;  // where x is quantized or packed once for the product

  Product(const float* x, int64_t ldx, int64_t rows, const PackedMatrix& m, const float* bias,
          float* y, int64_t ldy, Isa want, MatMulScratch* scratch)
      : w(&m), isa(SupportedIsa(want)), buf(scratch) {
    a.x = x;
    a.ldx = ldx;
    a.rows = rows;
    a.w = m.data();
    a.weight_type = m.weight_type();
    a.group = m.int8_group();
    a.in = m.in();
    a.out = m.out();
    a.bias = bias;
    a.y = y;
    a.ldy = ldy;
    switch (isa) {
      case Isa::kAvx512: kernel = kernels::PanelsAvx512; break;
      case Isa::kAvx2: kernel = kernels::PanelsAvx2; break;
      case Isa::kPortable: break;
    }
    if (m.int8_activations()) {
      a.ldxq = RoundUpTo4(m.in());
      a.ldxs = m.num_groups();
    }
  }

  int64_t rows() const { return a.rows; }
  int64_t panels() const { return w->num_panels(); }
  // Whether one thread finishes it before a second one would start.
  bool Small() const { return a.rows * w->in() * w->out() < kMinParallelMacs; }
  // Whether the threads share x packed once (AVX-512, 4 or more rows): packing it per chunk
  // cost 0.3 ns an element on the AMD EPYC VM (all of x for every chunk: about 10% of a
  // 5-9-row product of the 261M shape on 2 threads, a quarter of a 128-row one).
  bool SharesPackedRows() const {
    return kernel == kernels::PanelsAvx512 && a.rows >= 4 && !w->int8_activations();
  }
  // int8 x int8: the row buffers, grown (by one thread; the others read a.xq / a.xs after a
  // barrier).
  void GrowQuantized() {
    a.xq = Grown(buf->xq, a.rows * a.ldxq);
    a.xs = Grown(buf->xs, a.rows * a.ldxs);
  }
  void QuantizeRow(int64_t r) const {
    const auto quantize = isa == Isa::kAvx512 ? kernels::QuantizeActivationRowInt8Avx512
                                              : QuantizeActivationRowInt8;
    quantize(a.x + r * a.ldx, w->in(), w->int8_group(), const_cast<uint8_t*>(a.xq) + r * a.ldxq,
             const_cast<float*>(a.xs) + r * a.ldxs);
  }
  // The kernel over panels [p0, p1): x packed per call unless shared.
  void Run(int64_t p0, int64_t p1) const {
    kernels::PanelArgs mine = a;
    if (a.rows > 1 && !w->int8_activations() && a.xpacked == nullptr) {
      thread_local std::vector<float> pack;
      mine.xpack = Grown(pack, kernels::PackFloats(a.rows, w->in()));
    }
    kernel(mine, p0, p1);
  }
};

// The whole product on the calling thread.
void RunAlone(Product& p) {
  if (p.w->int8_activations()) {
    p.GrowQuantized();
    for (int64_t r = 0; r < p.rows(); ++r) p.QuantizeRow(r);
  }
  p.Run(0, p.panels());
}

// The product on every thread of `team` (each calls it with the same arguments), which
// shares p.buf: x quantized (int8 x int8) or packed (SharesPackedRows) once, then chunks of
// consecutive panels handed out one at a time (a thread that another process slows down
// takes fewer, instead of the others waiting for its half), then a barrier.
void RunOnTeam(Team& team, Product& p) {
  if (p.w->int8_activations()) {
    // Each row quantized once, before the threads split the panels; many rows on the threads.
    // The leader grows the buffers; the others take their addresses after a barrier.
    const auto shared = [&p] {
      p.a.xq = p.buf->xq.data();
      p.a.xs = p.buf->xs.data();
    };
    if (team.leader()) p.GrowQuantized();
    if (p.rows() > 1 && p.rows() * p.w->in() >= kMinParallelQuantElements) {
      team.Barrier();
      shared();
      team.ForEach(p.rows(), [&](int64_t r) { p.QuantizeRow(r); });
    } else {
      if (team.leader()) {
        for (int64_t r = 0; r < p.rows(); ++r) p.QuantizeRow(r);
      }
      team.Barrier();
      shared();
    }
  } else if (p.SharesPackedRows()) {
    // A product that streams whole panels (x at most kPackFloats floats, or one pass) packs
    // on the leader (short); a larger one on all threads, pass by pass.
    const bool whole = kernels::StreamsPanels(p.rows(), p.w->in());
    if (team.leader()) {
      float* const packed = Grown(p.buf->xpacked, p.rows() * p.w->in());
      if (whole) kernels::PackRowsAvx512(p.a, packed);
    }
    team.Barrier();
    p.a.xpacked = p.buf->xpacked.data();  // grown by the leader
    if (!whole) {
      kernels::PackRowsAvx512(p.a, p.buf->xpacked.data(), team.rank(), team.size());
      team.Barrier();
    }
  }
  const int64_t panels = p.panels();
  const int64_t chunks = std::min<int64_t>(panels, team.size() * kChunksPerThread);
  team.ForEach(chunks, [&](int64_t c) { p.Run(panels * c / chunks, panels * (c + 1) / chunks); });
}

}  // namespace

void MatMul(const float* x, int64_t ldx, int64_t rows, const PackedMatrix& w, const float* bias,
            float* y, int64_t ldy, Isa isa, MatMulScratch* scratch) {
  if (rows <= 0 || w.empty()) return;
  // x quantized or packed once for the product: into `scratch`, or (none, or inside a
  // parallel region) this thread's own.
  thread_local MatMulScratch own;
  Product p(x, ldx, rows, w, bias, y, ldy, isa,
            scratch != nullptr && !omp_in_parallel() ? scratch : &own);
  const int threads = static_cast<int>(std::min<int64_t>(omp_get_max_threads(), p.panels()));
  if (threads <= 1 || omp_in_parallel() || p.Small()) {
    RunAlone(p);
    return;
  }
  RunTeam(threads, [&](Team& team) {
    Product mine = p;  // each thread's own copy of the arguments
    RunOnTeam(team, mine);
  });
}

void MatMul(Team& team, const float* x, int64_t ldx, int64_t rows, const PackedMatrix& w,
            const float* bias, float* y, int64_t ldy, Isa isa, MatMulScratch* scratch) {
  if (rows <= 0 || w.empty()) return;
  DCF_CHECK(scratch != nullptr) << "a product on a team shares its caller's scratch";
  Product p(x, ldx, rows, w, bias, y, ldy, isa, scratch);
  if (team.size() <= 1 || p.Small() || p.panels() <= 1) {
    if (team.leader()) RunAlone(p);
    team.Barrier();
    return;
  }
  RunOnTeam(team, p);
}

}  // namespace dcf::cpu
