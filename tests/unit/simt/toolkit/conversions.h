// The 16-bit float and fp8 E4M3 conversions of one build, behind plain C++ names, so that a
// test can hold the emulator's and the CUDA toolkit's host implementations side by side.
#pragma once

#include <cstdint>

namespace dcf::cuda_test {
namespace sim_host {
uint16_t FloatToBf16(float f);
uint16_t FloatToHalf(float f);
float Bf16ToFloat(uint16_t bits);
float HalfToFloat(uint16_t bits);
uint8_t FloatToFp8(float f, bool saturate);  // E4M3
uint16_t Fp8ToHalf(uint8_t code);           // E4M3 -> half bits
}  // namespace sim_host
namespace cuda_host {
uint16_t FloatToBf16(float f);
uint16_t FloatToHalf(float f);
float Bf16ToFloat(uint16_t bits);
float HalfToFloat(uint16_t bits);
uint8_t FloatToFp8(float f, bool saturate);  // E4M3
uint16_t Fp8ToHalf(uint8_t code);           // E4M3 -> half bits
}  // namespace cuda_host
}  // namespace dcf::cuda_test
