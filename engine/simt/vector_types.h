// CUDA's built-in vector types for the SIMT emulator: uint3 and dim3 (the launch and index
// built-ins), float2, float4, int2, int4, uint2, uint4 with their make_* functions. Layout
// and alignment match CUDA's (8 bytes for the 2-element types, 16 for the 4-element ones), so
// a kernel may load a float4 from a 16-byte aligned float buffer in both builds.
//
// The types live in dcf::simt and are brought into the global namespace, as CUDA declares
// them there; their mangled names therefore never collide with the real toolkit's.
#pragma once

namespace dcf::simt {

struct uint3 {
  unsigned int x, y, z;
};

// Grid and block extents. Like CUDA's dim3: unspecified components are 1, and an integer
// converts implicitly (a launch with `256` threads means dim3(256, 1, 1)).
struct dim3 {
  unsigned int x, y, z;
  constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1)
      : x(vx), y(vy), z(vz) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
  constexpr operator uint3() const { return uint3{x, y, z}; }
};

struct alignas(8) float2 {
  float x, y;
};
struct alignas(16) float4 {
  float x, y, z, w;
};
struct alignas(8) int2 {
  int x, y;
};
struct alignas(16) int4 {
  int x, y, z, w;
};
struct alignas(8) uint2 {
  unsigned int x, y;
};
struct alignas(16) uint4 {
  unsigned int x, y, z, w;
};

inline constexpr uint3 make_uint3(unsigned int x, unsigned int y, unsigned int z) {
  return uint3{x, y, z};
}
inline constexpr float2 make_float2(float x, float y) { return float2{x, y}; }
inline constexpr float4 make_float4(float x, float y, float z, float w) {
  return float4{x, y, z, w};
}
inline constexpr int2 make_int2(int x, int y) { return int2{x, y}; }
inline constexpr int4 make_int4(int x, int y, int z, int w) { return int4{x, y, z, w}; }
inline constexpr uint2 make_uint2(unsigned int x, unsigned int y) { return uint2{x, y}; }
inline constexpr uint4 make_uint4(unsigned int x, unsigned int y, unsigned int z, unsigned int w) {
  return uint4{x, y, z, w};
}

static_assert(sizeof(float2) == 8 && alignof(float2) == 8);
static_assert(sizeof(float4) == 16 && alignof(float4) == 16);
static_assert(sizeof(int4) == 16 && sizeof(uint4) == 16 && sizeof(uint2) == 8);

}  // namespace dcf::simt

using dcf::simt::dim3;
using dcf::simt::float2;
using dcf::simt::float4;
using dcf::simt::int2;
using dcf::simt::int4;
using dcf::simt::make_float2;
using dcf::simt::make_float4;
using dcf::simt::make_int2;
using dcf::simt::make_int4;
using dcf::simt::make_uint2;
using dcf::simt::make_uint3;
using dcf::simt::make_uint4;
using dcf::simt::uint2;
using dcf::simt::uint3;
using dcf::simt::uint4;
