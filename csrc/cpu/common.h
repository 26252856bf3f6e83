// What the CPU kernels share: vectorisable scalar math, small utilities and the argument-check
// convention.
//
// Naming: templates over the element type take `T`; `scalar_t` appears only inside AT_DISPATCH
// lambdas (ATen's name). Every TORCH_CHECK message starts with the op's full name,
// "fastqa::<op>_fwd: ...", through FASTQA_CHECK (the Python entry points raise friendlier
// ValueError/TypeError first; these guard direct calls of torch.ops.fastqa.*).
#pragma once

#include <ATen/ATen.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include <c10/util/Optional.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#if defined(__AVX__)
#include <immintrin.h>  // the kernels' x86 intrinsics (masked tails here, streaming stores, ...)
#endif

#define FASTQA_CHECK(cond, op, ...) TORCH_CHECK(cond, op, ": ", __VA_ARGS__)

namespace fastqa {

// By-value min/max: std::min/max return references, which can stop gcc from vectorising a loop.
template <typename T>
inline T min_of(T a, T b) {
  return b < a ? b : a;
}
template <typename T>
inline T max_of(T a, T b) {
  return a < b ? b : a;
}

// A schema's CPU kernel, given where the schema is defined: m.def(schema, cpu_kernel(TORCH_FN(kernel))).
template <typename Fn>
auto cpu_kernel(Fn kernel) {
  return torch::dispatch(c10::DispatchKey::CPU, kernel);
}

// A kernel run with autocast off for its own ATen calls. Its inputs come in the dtypes autocast chose for the op;
// the calls inside it (the float32 products of a bf16 op's widening route, for one) must run in the dtypes the
// kernel gives them, where autocast -- still on for the caller's thread -- would cast them to bf16 again.
template <auto Kernel>
struct WithoutAutocast;
template <typename R, typename... Args, R (*Kernel)(Args...)>
struct WithoutAutocast<Kernel> {
  static R call(Args... args) {
    const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    return Kernel(std::forward<Args>(args)...);
  }
};

// How every file defines its ops, inside namespace fastqa: the op `name` (schema: name + signature) with its
// CPU kernel, the C++ function of the same name (run by WithoutAutocast) -- the name written once, so the two
// cannot disagree.
#define FASTQA_CPU_OP(m, name, signature) \
  m.def(#name signature, ::fastqa::cpu_kernel(TORCH_FN(::fastqa::WithoutAutocast<&name>::call)))

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

// dst[r * ld + c] = row[c] for r < rows, c < n: a bias as a GEMM's starting value, so that BLAS accumulates
// into it (beta = 1) instead of first zeroing its output (MKL's beta = 0 pass was ~6% of the dwsep forward).
template <typename T>
inline void fill_rows(T* dst, int64_t ld, const T* row, int64_t n, int64_t rows) {
  for (int64_t r = 0; r < rows; ++r) std::copy(row, row + n, dst + r * ld);
}

// Bytes in the widest SIMD register of the build's target (-march=native: the machine's own). Code that
// holds a block of values in one GCC/Clang vector must not make it wider than this: GCC lowers a
// vector_size wider than the target's registers through the stack (measured on an AVX2 processor: 64-byte
// blocks made the dwsep depthwise loop ~4x slower than 32-byte ones).
#if defined(__AVX512F__)
constexpr int64_t kSimdBytes = 64;
#elif defined(__AVX__)
constexpr int64_t kSimdBytes = 32;
#else
constexpr int64_t kSimdBytes = 16;
#endif

// A block of CB values of type T as one GCC/Clang vector value (CB * sizeof(T) <= kSimdBytes, see above), so
// a loop's accumulators stay in registers. Loads and stores go through an unaligned, may_alias copy of the
// vector type: one vector move each, no aliasing assumptions. (memcpy did the same for a lone value, but an
// array of accumulators whose elements went through memcpy was kept on the stack: GCC stored every register
// there and copied it out in 16-byte pieces: a quarter of the self-attention score loop's time.)
template <int64_t CB, typename T>
struct Block {
  static constexpr int64_t W = CB;
  typedef T V __attribute__((vector_size(CB * sizeof(T))));
  typedef T Unaligned __attribute__((vector_size(CB * sizeof(T)), aligned(alignof(T)), may_alias));
  static V load(const T* p) { return *reinterpret_cast<const Unaligned*>(p); }
  static void store(T* p, const V& v) { *reinterpret_cast<Unaligned*>(p) = v; }
  // The first n values (n >= W: a whole vector), zeros after them: a loop's tail through the same vector
  // code as its body, so a value's bits do not depend on where in the loop it falls.
  // A partial native float vector goes through one masked load / store (lanes past n are not touched, so
  // they cannot fault); other blocks through memcpy, which GCC lowers to a variable-length copy via the
  // stack (measured: ~10% of the CQA softmax loops, whose rows are 50 floats, 6 vectors and a tail of 2).
  static V load_upto(const T* p, int64_t n) {
    if (n >= CB) return load(p);
#if defined(__AVX512F__) || defined(__AVX2__)
    if constexpr (std::is_same_v<T, float> && CB * sizeof(T) == kSimdBytes) return masked_load(p, n);
#endif
    V v{};
    std::memcpy(&v, p, n * sizeof(T));
    return v;
  }
  static void store_upto(T* p, const V& v, int64_t n) {
    if (n >= CB) return store(p, v);
#if defined(__AVX512F__) || defined(__AVX2__)
    if constexpr (std::is_same_v<T, float> && CB * sizeof(T) == kSimdBytes) return masked_store(p, v, n);
#endif
    std::memcpy(p, &v, n * sizeof(T));
  }

 private:
#if defined(__AVX512F__)
  static V masked_load(const float* p, int64_t n) { return (V)_mm512_maskz_loadu_ps(tail_mask(n), p); }
  static void masked_store(float* p, const V& v, int64_t n) { _mm512_mask_storeu_ps(p, tail_mask(n), (__m512)v); }
  static __mmask16 tail_mask(int64_t n) { return static_cast<__mmask16>((1u << n) - 1u); }
#elif defined(__AVX2__)
  static V masked_load(const float* p, int64_t n) { return (V)_mm256_maskload_ps(p, tail_mask(n)); }
  static void masked_store(float* p, const V& v, int64_t n) { _mm256_maskstore_ps(p, tail_mask(n), (__m256)v); }
  // Lanes i < n all ones (the sign bit selects a lane).
  static __m256i tail_mask(int64_t n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
#endif
};

// One native register of T.
template <typename T>
using NativeBlock = Block<kSimdBytes / static_cast<int64_t>(sizeof(T)), T>;

// exp that the compiler vectorises (std::exp on float does not without -ffast-math). float:
// Cody-Waite range reduction + Cephes' degree-6 polynomial, ~1 ulp, over the normal range
// [ln FLT_MIN, ln FLT_MAX] = [-87.34, 88.72] (2^n is applied as two normal factors, so n = 128 is fine).
// Outside it, as std::exp up to subnormals: exactly 0 below (a softmax probability or a sigmoid that
// underflows is 0, not 1e-38 that a huge input could blow up again), +inf above, NaN stays NaN.
//
// Written so that GCC vectorises the loops that call it: no float -> int conversion (n comes from the
// bits of the 1.5 * 2^23 rounding sum), integer work in uint32_t (no signed overflow for huge inputs,
// whose garbage is replaced below), and the out-of-range cases picked by a bit mask built with `&`, not
// `&&` or a select of the result: GCC 12 turns either into a branch around the polynomial, and a loop
// with a branch is not vectorised ("control flow in loop") -- every vec_exp loop ran scalar before.
// Bit-identical to the earlier clamp-and-select form for all 2^32 inputs (checked exhaustively).
inline float vec_exp(float v) {
  constexpr float lo = -87.3365447505f, hi = 88.7228391117f;
  const float t = v * 1.44269504088896341f + 12582912.0f;  // n = round(v / ln 2) in t's low mantissa bits
  const float n = t - 12582912.0f;
  float r = std::fma(n, -0.693359375f, v);  // v - n·ln2 in two parts
  r = std::fma(n, 2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = std::fma(p, r, 1.3981999507e-3f);
  p = std::fma(p, r, 8.3334519073e-3f);
  p = std::fma(p, r, 4.1665795894e-2f);
  p = std::fma(p, r, 1.6666665459e-1f);
  p = std::fma(p, r, 5.0000001201e-1f);
  p = std::fma(p, r * r, r) + 1.0f;
  // 2^n = 2^n1 · 2^n2 (n in [-126, 128] in range, so both halves are normal) from their bit patterns.
  const uint32_t ni = __builtin_bit_cast(uint32_t, t) - 0x4B400000u;
  const uint32_t n1 = static_cast<uint32_t>(static_cast<int32_t>(ni) >> 1), n2 = ni - n1;
  const float e = p * __builtin_bit_cast(float, (n1 + 127u) << 23) * __builtin_bit_cast(float, (n2 + 127u) << 23);
  const uint32_t in_range = 0u - (static_cast<uint32_t>(v >= lo) & static_cast<uint32_t>(v <= hi));  // 0 for NaN
  const float outside = v < lo ? 0.0f : (v > hi ? __builtin_inff() : v);
  return __builtin_bit_cast(float, (__builtin_bit_cast(uint32_t, e) & in_range) |
                                       (__builtin_bit_cast(uint32_t, outside) & ~in_range));
}
// float64 serves gradcheck: exactness first.
inline double vec_exp(double v) { return std::exp(v); }

// exp of each lane of a native float vector, for softmax arguments x = s - max (x <= 0; a rounding error
// above 0 is fine, anything up to 88 is): vec_exp's range reduction with one 2^n factor (n <= 0: nothing to
// overflow) and a degree-5 polynomial (relative-error minimax on [-ln2/2, ln2/2], fitted for this file),
// 0 below ln FLT_MIN (-inf included), NaN stays NaN. Within 2.01 ulp of the correctly rounded exp for every
// float in [ln FLT_MIN, 0] (checked exhaustively against double exp; vec_exp: ~1 ulp) in 9 multiply-adds
// or multiplies where vec_exp's polynomial took 11: the softmax exponentials are a third of the
// self-attention forward, and those units are what they wait for. Written with vector types, so no
// auto-vectoriser decides its fate.
inline NativeBlock<float>::V exp_nonpositive(NativeBlock<float>::V x) {
  using V = NativeBlock<float>::V;
  typedef int32_t VI __attribute__((vector_size(sizeof(V))));
  const V lo = V{} + -87.3365447505f;
  const VI under = x < lo;  // lanes of all ones where exp underflows
  x = under ? lo : x;
  const V t = x * 1.44269504088896341f + 12582912.0f;  // n = round(x / ln 2) in t's low mantissa bits
  const V n = t - 12582912.0f;
  V r = n * -0.693359375f + x;  // x - n·ln2 in two parts
  r = n * 2.12194440e-4f + r;
  V p = r * 8.290315046906471e-3f + 4.189793020486832e-2f;
  p = p * r + 1.666763573884964e-1f;
  p = p * r + 4.999915063381195e-1f;
  p = p * r + 9.999997019767761e-1f;
  p = p * r + 1.0f;
  const VI two_n = ((VI)t - 0x4B400000 + 127) << 23;  // the bits of 2^n, n in [-126, 0]
  return (V)((VI)(p * (V)two_n) & ~under);
}

// sum_i a[i] b[i] over n elements: two vector accumulators (two multiply-add chains in flight), then a
// scalar tail.
template <typename T>
inline T dot(const T* a, const T* b, int64_t n) {
  using S = NativeBlock<T>;
  typename S::V acc0{}, acc1{};
  int64_t i = 0;
  for (; i + 2 * S::W <= n; i += 2 * S::W) {
    acc0 += S::load(a + i) * S::load(b + i);
    acc1 += S::load(a + i + S::W) * S::load(b + i + S::W);
  }
  for (; i + S::W <= n; i += S::W) acc0 += S::load(a + i) * S::load(b + i);
  acc0 += acc1;
  T sum = 0;
  for (int64_t l = 0; l < S::W; ++l) sum += acc0[l];
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

template <typename T>
inline T* ptr(const at::Tensor& t) {
  return t.data_ptr<T>();
}

// The data of an optional tensor, or nullptr when it is absent.
template <typename T>
inline const T* data_or_null(const c10::optional<at::Tensor>& t) {
  return t.has_value() ? t->data_ptr<T>() : nullptr;
}

// An op's optional (`Tensor?`) output: absent (None in Python, nothing allocated) where the kernel left it
// undefined -- an absent bias's gradient, a mask a variant does not keep.
inline c10::optional<at::Tensor> if_defined(const at::Tensor& t) {
  return t.defined() ? c10::optional<at::Tensor>(t) : c10::nullopt;
}

// A CPU float32/float64/bfloat16 tensor: the dtypes the CPU kernels take (bf16 through its float32 kernel,
// csrc/cpu/bf16.h).
inline void check_cpu_float(const char* op, const char* name, const at::Tensor& t) {
  FASTQA_CHECK(t.device().is_cpu(), op, name, " must be a CPU tensor, got ", t.device());
  FASTQA_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kDouble || t.scalar_type() == at::kBFloat16,
               op, name, " must be float32, float64 or bfloat16, got ", t.scalar_type());
}

}  // namespace fastqa
