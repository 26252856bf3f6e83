// Conversions between bfloat16 storage and float32 for the kernels that read and write bf16 themselves: an
// elementwise op (a widened copy of its input would cost more than the op) and the epilogues of the GEMM-based
// ops (each row widened into a float32 scratch row, computed there, rounded back as it is stored).
//
// On the raw bits, so that a loop over them vectorises: c10::BFloat16's float conversion branches on NaN,
// which keeps GCC from vectorising the loop around it. Rounding is to nearest even, a NaN stored as
// c10::BFloat16 stores it (0x7FC0): what Tensor.to(torch.bfloat16) gives for every non-NaN value.
#pragma once

#include <c10/util/BFloat16.h>

#include <cstdint>

namespace fastqa {
namespace bf16 {

// The float a bf16 holds (exact: its bits are a float's high half).
inline float to_float(uint16_t bits) { return __builtin_bit_cast(float, static_cast<uint32_t>(bits) << 16); }

// v rounded to bf16, as bits; a select rather than a branch for NaN, so the loop vectorises.
inline uint16_t round_bits(float v) {
  const uint32_t u = __builtin_bit_cast(uint32_t, v);
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>(v != v ? 0x7FC0u : rounded);
}

// c10::BFloat16 is a standard-layout struct whose one member is its uint16_t bits: a pointer to it is a
// pointer to those bits.
inline const uint16_t* bits(const c10::BFloat16* p) { return reinterpret_cast<const uint16_t*>(p); }
inline uint16_t* bits(c10::BFloat16* p) { return reinterpret_cast<uint16_t*>(p); }

// dst[0..n) = src[0..n) widened / rounded.
inline void widen_row(const c10::BFloat16* src, int64_t n, float* dst) {
  const uint16_t* s = bits(src);
  for (int64_t c = 0; c < n; ++c) dst[c] = to_float(s[c]);
}
inline void narrow_row(const float* src, int64_t n, c10::BFloat16* dst) {
  uint16_t* d = bits(dst);
  for (int64_t c = 0; c < n; ++c) d[c] = round_bits(src[c]);
}
// acc[0..n) += src[0..n) widened.
inline void add_row(const c10::BFloat16* src, int64_t n, float* acc) {
  const uint16_t* s = bits(src);
  for (int64_t c = 0; c < n; ++c) acc[c] += to_float(s[c]);
}

}  // namespace bf16
}  // namespace fastqa
