// The portable and AVX2 kernels of cpu::MatMul: one C++ loop nest (vectorised by the
// compiler) inlined into a baseline function and into an AVX2+FMA one.
#include <cstdint>

#include "engine/cpu/matmul_kernels.h"

#define DCF_ALWAYS_INLINE inline __attribute__((always_inline))
#define DCF_AVX2 __attribute__((target("avx2,fma")))

namespace dcf::cpu::kernels {
namespace {

constexpr int kPanel = kPanelOutputs;

// Writes column k of a panel (32 weights) as fp32 to w[32].
struct WidenF32 {
  DCF_ALWAYS_INLINE void operator()(const void* panel, int64_t k, float* w) const {
    __builtin_memcpy(w, static_cast<const float*>(panel) + k * kPanel, sizeof(float) * kPanel);
  }
};

struct WidenBF16 {  // pair-interleaved: low halves are outputs 0-15, high halves 16-31
  DCF_ALWAYS_INLINE void operator()(const void* panel, int64_t k, float* w) const {
    const uint32_t* p = static_cast<const uint32_t*>(panel) + k * (kPanel / 2);
    for (int j = 0; j < kPanel / 2; ++j) {
      w[j] = __builtin_bit_cast(float, p[j] << 16);
      w[j + kPanel / 2] = __builtin_bit_cast(float, p[j] & 0xffff0000u);
    }
  }
};

// IEEE half -> float without branches or tables, so the loop vectorises (exact for every
// input: normals by rebiasing the exponent, subnormals through an exact multiply, inf/NaN
// keep their payload).
struct WidenF16 {
  DCF_ALWAYS_INLINE void operator()(const void* panel, int64_t k, float* w) const {
    const uint16_t* p = static_cast<const uint16_t*>(panel) + k * kPanel;
    for (int j = 0; j < kPanel; ++j) {
      const uint32_t h = p[j];
      const uint32_t sign = (h & 0x8000u) << 16;
      const uint32_t em = h & 0x7fffu;
      const uint32_t normal = (em << 13) + (em >= 0x7c00u ? 0x70000000u : 0x38000000u);
      const float magnitude = em < 0x400u ? static_cast<float>(static_cast<int32_t>(em)) * 0x1p-24f
                                          : __builtin_bit_cast(float, normal);
      w[j] = __builtin_bit_cast(float, __builtin_bit_cast(uint32_t, magnitude) | sign);
    }
  }
};

// int8 panels [in, 32] followed by their scales [groups, 32] bf16: q * scale (exact).
struct WidenI8 {
  int64_t in = 0, group = 0;
  DCF_ALWAYS_INLINE void operator()(const void* panel, int64_t k, float* w) const {
    const int8_t* q = static_cast<const int8_t*>(panel) + k * kPanel;
    const uint16_t* s =
        reinterpret_cast<const uint16_t*>(static_cast<const int8_t*>(panel) + in * kPanel) +
        (k / group) * kPanel;
    for (int j = 0; j < kPanel; ++j) {
      const float scale = __builtin_bit_cast(float, static_cast<uint32_t>(s[j]) << 16);
      w[j] = static_cast<float>(q[j]) * scale;
    }
  }
};

template <int MR, typename Widen>
DCF_ALWAYS_INLINE void Block(const Widen& widen, const float* x, int64_t ldx, const void* panel,
                             int64_t in, const float* bias, float* y, int64_t ldy, int valid) {
  float acc[MR][kPanel] = {};
  alignas(64) float w[kPanel];
  for (int64_t k = 0; k < in; ++k) {
    widen(panel, k, w);
    for (int r = 0; r < MR; ++r) {
      const float xv = x[r * ldx + k];
      for (int j = 0; j < kPanel; ++j) acc[r][j] += xv * w[j];
    }
  }
  for (int r = 0; r < MR; ++r) {
    for (int j = 0; j < valid; ++j) y[r * ldy + j] = acc[r][j] + (bias != nullptr ? bias[j] : 0.0f);
  }
}

template <typename Widen>
DCF_ALWAYS_INLINE void Panels(const Widen& widen, int64_t panel_bytes, const PanelArgs& a,
                              int64_t p0, int64_t p1) {
  const uint8_t* w = static_cast<const uint8_t*>(a.w);
  for (int64_t r0 = 0; r0 < a.rows; r0 += kGenericRowBlock) {
    const int64_t r1 = r0 + kGenericRowBlock < a.rows ? r0 + kGenericRowBlock : a.rows;
    for (int64_t p = p0; p < p1; ++p) {
      const void* panel = w + p * panel_bytes;
      const int64_t o = p * kPanel;
      const int valid = static_cast<int>(a.out - o < kPanel ? a.out - o : kPanel);
      const float* bias = a.bias != nullptr ? a.bias + o : nullptr;
      for (int64_t r = r0; r < r1; r += kGenericRows) {
        const float* x = a.x + r * a.ldx;
        float* y = a.y + r * a.ldy + o;
        switch (r1 - r < kGenericRows ? r1 - r : kGenericRows) {
          case 1: Block<1>(widen, x, a.ldx, panel, a.in, bias, y, a.ldy, valid); break;
          case 2: Block<2>(widen, x, a.ldx, panel, a.in, bias, y, a.ldy, valid); break;
          case 3: Block<3>(widen, x, a.ldx, panel, a.in, bias, y, a.ldy, valid); break;
          default: Block<4>(widen, x, a.ldx, panel, a.in, bias, y, a.ldy, valid); break;
        }
      }
    }
  }
}

// int8 x int8 (kWeightI8A8): the arithmetic of matmul_kernels.h written out, one output at a
// time; the integer sums are of x_q * q directly (the AVX-512 kernel's qsum correction is
// checked against them).
DCF_ALWAYS_INLINE void PanelsI8A8(const PanelArgs& a, int64_t p0, int64_t p1) {
  const uint8_t* w = static_cast<const uint8_t*>(a.w);
  const int64_t panel_bytes = I8A8PanelBytes(a.in, a.group);
  for (int64_t p = p0; p < p1; ++p) {
    const int64_t o = p * kPanel;
    const int valid = static_cast<int>(a.out - o < kPanel ? a.out - o : kPanel);
    for (int64_t r = 0; r < a.rows; ++r) {
      const uint8_t* xq = a.xq + r * a.ldxq;
      const float* xs = a.xs + r * a.ldxs;
      for (int j = 0; j < valid; ++j) {
        float y = a.bias != nullptr ? a.bias[o + j] : 0.0f;
        const uint8_t* block = w + p * panel_bytes;
        for (int64_t g = 0, k0 = 0; k0 < a.in; ++g, k0 += a.group) {
          const int64_t len = a.in - k0 < a.group ? a.in - k0 : a.group;
          const int8_t* q = reinterpret_cast<const int8_t*>(block);
          int32_t sum = 0;
          for (int64_t k = 0; k < len; ++k) {
            sum += (static_cast<int32_t>(xq[k0 + k]) - 128) * q[I8A8QOffset(k, j)];
          }
          uint16_t bits;
          __builtin_memcpy(&bits, block + I8A8ScalesOffset(len) + 2 * j, 2);
          const float scale = __builtin_bit_cast(float, static_cast<uint32_t>(bits) << 16);
          y = __builtin_fmaf(static_cast<float>(sum), xs[g] * scale, y);
          block += I8A8BlockBytes(len);
        }
        a.y[r * a.ldy + o + j] = y;
      }
    }
  }
}

// Every weight type, compiled for the caller's target.
DCF_ALWAYS_INLINE void AllPanels(const PanelArgs& a, int64_t p0, int64_t p1) {
  const auto type = static_cast<WeightType>(a.weight_type);
  const int64_t bytes = PanelBytes(type, a.in, a.group);
  switch (type) {
    case kWeightF32: Panels(WidenF32{}, bytes, a, p0, p1); break;
    case kWeightF16: Panels(WidenF16{}, bytes, a, p0, p1); break;
    case kWeightBF16: Panels(WidenBF16{}, bytes, a, p0, p1); break;
    case kWeightI8: Panels(WidenI8{a.in, a.group}, bytes, a, p0, p1); break;
    case kWeightI8A8: PanelsI8A8(a, p0, p1); break;
  }
}

}  // namespace

void PanelsPortable(const PanelArgs& a, int64_t panel_begin, int64_t panel_end) {
  AllPanels(a, panel_begin, panel_end);
}

DCF_AVX2 void PanelsAvx2(const PanelArgs& a, int64_t panel_begin, int64_t panel_end) {
  AllPanels(a, panel_begin, panel_end);
}

}  // namespace dcf::cpu::kernels
