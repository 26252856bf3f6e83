// Winograd minimal filtering F(m, K) for row convolutions with channel mixing (the GLU convolution):
//
//   out[r] = sum_{k<K} src[r + k] @ W_k^T        src [R, I], W_k [O, I], out [R - K + 1, O]
//
// Output rows are taken in tiles of m. With n = m + K - 1 interpolation points p_0..p_{n-2}, ∞,
//   V_i[t] = sum_l BT[i, l] src[t*m + l]     (input transform, n rows of [tiles, I])
//   U_i    = sum_k EK[i, k] W_k              (weight transform, n matrices [O, I])
//   M_i    = V_i @ U_i^T                     (n GEMMs [tiles, I] x [I, O] instead of K of [R, I] x [I, O])
//   out[t*m + o] = sum_i Em[i, o] M_i[t]     (output transform)
// where Ej [n, j] evaluates a degree-(j-1) polynomial at the points (the ∞ row takes its leading
// coefficient) and BT = (V^-1)^T for the n x n Vandermonde matrix V of the points. This is the
// transpose of Toom-Cook polynomial multiplication: (sum_i ...) equals the direct sum exactly in exact
// arithmetic, and the GEMM work drops by m K / n (2.25x for K 3, m 6).
//
// The same points give the weight gradient: grad W_k = sum_r gout[r]^T src[r + k] is, tile by tile, a
// correlation of src with the m rows of gout producing K outputs, i.e. F(K, m) with the roles of Em and
// EK swapped and the same BT:
//   P_i = sum_o Em[i, o] gout[t*m + o],   Q_i = P_i^T @ V_i,   grad W_k = sum_i EK[i, k] Q_i.
//
// Points 0, ±1, ±2, ±1/2 keep the transforms' entries small: the float32 error of F(6, 3) measured
// 2.8e-6 of the output's largest entry (direct taps: 3.5e-7), far inside the fp32 tolerance.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace fastqa {
namespace winograd {

// Filters of K taps, 2 <= K <= kMaxTaps, are run with n = 8 points (m = 9 - K outputs a tile); wider ones
// would need points whose transforms lose float32 precision, and go through the direct taps.
constexpr int64_t kPoints = 8;
constexpr int64_t kMaxTaps = 7;

struct Plan {
  int64_t m = 0, K = 0, n = 0;
  std::vector<double> BT;  // [n, n]: input transform
  std::vector<double> Em;  // [n, m]: output transform (forward), gradient transform (weight grad)
  std::vector<double> EK;  // [n, K]: weight transform (forward), output transform (weight grad)
};

inline bool applies(int64_t K) { return K >= 2 && K <= kMaxTaps; }

// The transforms of F(kPoints - K + 1, K), in double (cast once per call to the op's dtype).
inline Plan make_plan(int64_t K) {
  Plan p;
  p.K = K;
  p.n = kPoints;
  p.m = kPoints - K + 1;
  const int64_t n = p.n;
  const double points[kPoints - 1] = {0.0, 1.0, -1.0, 2.0, -2.0, 0.5, -0.5};
  auto evaluation = [&](int64_t len) {  // [n, len]
    std::vector<double> e(n * len, 0.0);
    for (int64_t i = 0; i + 1 < n; ++i) {
      double power = 1.0;
      for (int64_t j = 0; j < len; ++j, power *= points[i]) e[i * len + j] = power;
    }
    e[(n - 1) * len + len - 1] = 1.0;  // the point at infinity: the leading coefficient
    return e;
  };
  p.Em = evaluation(p.m);
  p.EK = evaluation(K);
  // BT = (V^-1)^T by Gauss-Jordan elimination with partial pivoting on [V | I].
  std::vector<double> v = evaluation(n), inv(n * n, 0.0);
  for (int64_t i = 0; i < n; ++i) inv[i * n + i] = 1.0;
  for (int64_t col = 0; col < n; ++col) {
    int64_t pivot = col;
    for (int64_t r = col + 1; r < n; ++r) {
      if (std::abs(v[r * n + col]) > std::abs(v[pivot * n + col])) pivot = r;
    }
    for (int64_t j = 0; j < n; ++j) {
      std::swap(v[col * n + j], v[pivot * n + j]);
      std::swap(inv[col * n + j], inv[pivot * n + j]);
    }
    const double d = v[col * n + col];
    for (int64_t j = 0; j < n; ++j) {
      v[col * n + j] /= d;
      inv[col * n + j] /= d;
    }
    for (int64_t r = 0; r < n; ++r) {
      const double f = v[r * n + col];
      if (r == col || f == 0.0) continue;
      for (int64_t j = 0; j < n; ++j) {
        v[r * n + j] -= f * v[col * n + j];
        inv[r * n + j] -= f * inv[col * n + j];
      }
    }
  }
  p.BT.assign(n * n, 0.0);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < n; ++j) p.BT[i * n + j] = inv[j * n + i];
  }
  return p;
}

// A matrix of coefficients as a [rows, cols] tensor of dtype (for at:: products with weights).
inline at::Tensor as_tensor(const std::vector<double>& c, int64_t rows, int64_t cols, at::ScalarType dtype) {
  return at::from_blob(const_cast<double*>(c.data()), {rows, cols}, at::kDouble).to(dtype);
}

// dst = f * src (the first term of a sum: no zero fill) or dst += f * src, over C values.
template <typename T>
inline void add_scaled(T f, const T* src, int64_t C, bool first, T* dst) {
  if (first) {
#pragma omp simd
    for (int64_t ch = 0; ch < C; ++ch) dst[ch] = f * src[ch];
  } else {
#pragma omp simd
    for (int64_t ch = 0; ch < C; ++ch) dst[ch] += f * src[ch];
  }
}

// out[i, t, :] = sum_{l < n_in} coef[i, l] * src[t * step + l - offset, :] for i < n_out, t < tiles:
// out is [n_out, tiles, C]; source rows outside [0, rows) read as zero. coef [n_out, n_in] row-major,
// zero coefficients skipped (most of BT's are zero or +-1).
template <typename T>
void gather_tiles(const T* src, int64_t rows, int64_t C, int64_t tiles, int64_t step, int64_t offset,
                  const std::vector<double>& coef, int64_t n_out, int64_t n_in, T* out) {
  std::vector<T> c(coef.begin(), coef.end());
  at::parallel_for(0, tiles, 8, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      for (int64_t i = 0; i < n_out; ++i) {
        T* dst = out + (i * tiles + t) * C;
        bool written = false;
        for (int64_t l = 0; l < n_in; ++l) {
          const T f = c[i * n_in + l];
          const int64_t r = t * step + l - offset;
          if (f == T(0) || r < 0 || r >= rows) continue;
          add_scaled(f, src + r * C, C, !written, dst);
          written = true;
        }
        if (!written) std::fill(dst, dst + C, T(0));
      }
    }
  });
}

// Row o of tile t of the output transform: dst[:] = sum_i Em[i, o] * M_i[t, :] (M_i [tiles, C], their
// data pointers in mats). coef is Em as T.
template <typename T>
inline void scatter_row(const std::vector<const T*>& mats, int64_t t, int64_t o, int64_t m, int64_t C,
                        const std::vector<T>& coef, T* dst) {
  bool written = false;
  for (size_t i = 0; i < mats.size(); ++i) {
    const T f = coef[i * m + o];
    if (f == T(0)) continue;
    add_scaled(f, mats[i] + t * C, C, !written, dst);
    written = true;
  }
  if (!written) std::fill(dst, dst + C, T(0));
}

}  // namespace winograd
}  // namespace fastqa
