// Multi-head self-attention with a key padding mask, for short sequences and small heads (QANet:
// L <= ~1000, head size 16): forward and backward, CPU.
//
//   qkv [B, L, 3C] (C = heads * D): q = qkv[..., :C], k = qkv[..., C:2C], v = qkv[..., 2C:], head h in
//   columns [h*D, (h+1)*D) of each -- the output of one nn.Linear(C, 3C), read as it is (no transposes);
//   mask [B, L] bool, True = a real position: the keys to attend to and the query rows to compute (a
//   sequence with no True position has no row to compute: zeros throughout, and no gradient);
//   out [B, L, C] = softmax(q kᵀ / sqrt(D) + mask) v, heads side by side (ready for the output Linear),
//   zero at padded query rows (nothing real reads them: they are neither keys nor, in QANet, read by
//   the masked convolutions), which are skipped -- a batch padded by a quarter saves a quarter of the work;
//   lse [B, heads, L]: each query row's log-sum-exp of its scaled scores, what the backward needs (0 at
//   padded rows);
//   segments (optional): lengths summing to L that cut every row into sequences attended apart -- a packed
//   batch (several sequences one after another in one row) -- each a task of its own, as a row is without.
//
// Why not ATen's flash attention: with D = 16 its blocked GEMMs have an inner dimension of 16, and
// each call's overhead and the score block's trips through memory dominate. Here one (sequence, head)
// is one task: its keys and values (2 * L * D values, 51 KB at L 400) are copied once into padded
// local buffers that stay in L1/L2, the whole row of scores of a block of kRows query rows is computed
// at once (exact softmax, no rescaling), and every product is a register-blocked loop over one native
// SIMD vector of keys or of head channels with kRows accumulators.
//
// The backward recomputes the probabilities from lse, and accumulates dK and dV of its (sequence,
// head) in local buffers: each task writes a disjoint slice of grad_qkv, so the result does not
// depend on the thread count (bit-identical for any number of threads).
//
// bfloat16 (csrc/cpu/bf16.h): out and grad_qkv are bf16, lse stays float32 (a softmax statistic). Where the build
// targets AVX512-BF16 (__AVX512BF16__: -march=native on such a processor; sa_bf16 below), the kernels read and
// write bf16 themselves and take every product -- the scores, P V, and in the backward dO Vᵀ, dS K, dSᵀ Q and Pᵀ dO
// -- on its bf16 pair dot products, with float32 accumulators: their operands are pairs of bf16 values adjacent
// along the reduced dimension, so each task packs its keys and values once into the layouts its products read. q,
// k, v and dO are bf16 already; the probabilities and dS are rounded to bf16 before the products that take them (as
// eager autocast's bmm rounds its operands); the softmax, lse, delta and the scale stay float32. That halves the
// multiply-adds of the float32 loops and drops the widening and narrowing passes. Elsewhere (AVX2, AVX512 without
// BF16) each entry widens its bf16 tensors and runs the float32 kernel, narrowing its results: bf16 changes what
// the model stores there, not the kernel's arithmetic. No product goes through the GEMM entry point either way (a
// head of 16 channels is too narrow a GEMM, see above).
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "cpu/bf16.h"
#include "cpu/bf16_rows.h"
#include "cpu/common.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <tuple>
#include <vector>

namespace fastqa {
namespace {

constexpr const char* kFwd = "fastqa::self_attention_fwd";
constexpr const char* kBwd = "fastqa::self_attention_bwd";

// Query rows per block: kRows accumulators per loop, each vector of keys (or of channels) loaded once.
constexpr int64_t kRows = 6;

// Buffers are padded to whole float vectors (a multiple of the double lane count too).
constexpr int64_t kPad = kSimdBytes / sizeof(float);

// scores[r][j] = bias[j] + sum_c a[r][c] * bt[c][j] for r < kRows, j < Lp (a multiple of W):
// a [kRows, Dp] rows, bt [D, Lp] (a transposed operand), D inner terms. NJ vectors of keys per pass, so
// each broadcast a[r][c] feeds NJ multiply-adds (the loop is bound by loads otherwise).
template <int64_t NJ, typename T>
int64_t rows_times_t_pass(const T* a, int64_t Dp, const T* bt, int64_t D, int64_t Lp, const T* bias, T* scores,
                          int64_t j) {
  using S = NativeBlock<T>;
  for (; j + NJ * S::W <= Lp; j += NJ * S::W) {
    typename S::V acc[kRows][NJ];
    for (int64_t n = 0; n < NJ; ++n) {
      const typename S::V init = bias ? S::load(bias + j + n * S::W) : typename S::V{};
      for (int64_t r = 0; r < kRows; ++r) acc[r][n] = init;
    }
    for (int64_t c = 0; c < D; ++c) {
      typename S::V b[NJ];
      for (int64_t n = 0; n < NJ; ++n) b[n] = S::load(bt + c * Lp + j + n * S::W);
      for (int64_t r = 0; r < kRows; ++r) {
        const T ar = a[r * Dp + c];
        for (int64_t n = 0; n < NJ; ++n) acc[r][n] += b[n] * ar;  // vector * scalar: one broadcast
      }
    }
    for (int64_t r = 0; r < kRows; ++r) {
      for (int64_t n = 0; n < NJ; ++n) S::store(scores + r * Lp + j + n * S::W, acc[r][n]);
    }
  }
  return j;
}

template <typename T>
void rows_times_t(const T* a, int64_t Dp, const T* bt, int64_t D, int64_t Lp, const T* bias, T* scores) {
  const int64_t j = rows_times_t_pass<2>(a, Dp, bt, D, Lp, bias, scores, 0);
  rows_times_t_pass<1>(a, Dp, bt, D, Lp, bias, scores, j);
}

// out[r][:] = sum_{j < L} p[r][j] * m[j][:] for r < kRows; p [kRows, Lp], m [L, Dp], out [kRows, Dp].
template <typename T>
void rows_times(const T* p, int64_t Lp, const T* m, int64_t L, int64_t Dp, T* out) {
  using S = NativeBlock<T>;
  int64_t d = 0;
  for (; d + 2 * S::W <= Dp; d += 2 * S::W) {  // two vectors of channels per pass: 2 * kRows accumulators
    typename S::V acc0[kRows] = {}, acc1[kRows] = {};
    for (int64_t j = 0; j < L; ++j) {
      const typename S::V m0 = S::load(m + j * Dp + d), m1 = S::load(m + j * Dp + d + S::W);
      for (int64_t r = 0; r < kRows; ++r) {
        const T pr = p[r * Lp + j];
        acc0[r] += m0 * pr;
        acc1[r] += m1 * pr;
      }
    }
    for (int64_t r = 0; r < kRows; ++r) {
      S::store(out + r * Dp + d, acc0[r]);
      S::store(out + r * Dp + d + S::W, acc1[r]);
    }
  }
  for (; d < Dp; d += S::W) {
    typename S::V acc[kRows] = {};
    for (int64_t j = 0; j < L; ++j) {
      const typename S::V m0 = S::load(m + j * Dp + d);
      for (int64_t r = 0; r < kRows; ++r) acc[r] += m0 * p[r * Lp + j];
    }
    for (int64_t r = 0; r < kRows; ++r) S::store(out + r * Dp + d, acc[r]);
  }
}

// acc[j][:] += sum_{r < kRows} p[r][j] * m[r][:] for j < L; p [kRows, Lp], m [kRows, Dp], acc [L, Dp].
// ND = Dp / W vectors per row at compile time (m's rows stay in registers; each p[r][j] broadcast feeds
// ND multiply-adds); 0: any Dp, one vector of channels at a time.
template <int64_t ND, typename T>
void accumulate_t_times_nd(const T* p, int64_t Lp, const T* m, int64_t L, int64_t Dp, T* acc) {
  using S = NativeBlock<T>;
  typename S::V mr[kRows][ND];
  for (int64_t r = 0; r < kRows; ++r) {
    for (int64_t n = 0; n < ND; ++n) mr[r][n] = S::load(m + r * Dp + n * S::W);
  }
  for (int64_t j = 0; j < L; ++j) {
    typename S::V sum[ND];
    for (int64_t n = 0; n < ND; ++n) sum[n] = S::load(acc + j * Dp + n * S::W);
    for (int64_t r = 0; r < kRows; ++r) {
      const T pr = p[r * Lp + j];
      for (int64_t n = 0; n < ND; ++n) sum[n] += mr[r][n] * pr;
    }
    for (int64_t n = 0; n < ND; ++n) S::store(acc + j * Dp + n * S::W, sum[n]);
  }
}

template <typename T>
void accumulate_t_times(const T* p, int64_t Lp, const T* m, int64_t L, int64_t Dp, T* acc) {
  using S = NativeBlock<T>;
  if (Dp == S::W) return accumulate_t_times_nd<1>(p, Lp, m, L, Dp, acc);
  if (Dp == 2 * S::W) return accumulate_t_times_nd<2>(p, Lp, m, L, Dp, acc);
  for (int64_t d = 0; d < Dp; d += S::W) {
    typename S::V mr[kRows];
    for (int64_t r = 0; r < kRows; ++r) mr[r] = S::load(m + r * Dp + d);
    for (int64_t j = 0; j < L; ++j) {
      typename S::V sum = S::load(acc + j * Dp + d);
      for (int64_t r = 0; r < kRows; ++r) sum += mr[r] * p[r * Lp + j];
      S::store(acc + j * Dp + d, sum);
    }
  }
}

struct Geometry {
  int64_t B, L, H, D, C, Dp;
};

// One sequence: positions [start, start + len) of row b.
struct Sequence {
  int64_t b, start, len;
  int64_t first_row(const Geometry& g) const { return b * g.L + start; }  // in the flattened [B * L] rows
};

// Work item t of every kernel's loop over (sequence, head): the sequence, the head and the sequence's first row.
struct HeadTask {
  const Sequence& seq;
  int64_t h, first;
};
inline HeadTask head_task(const std::vector<Sequence>& seqs, const Geometry& g, int64_t t) {
  const Sequence& seq = seqs[t / g.H];
  return {seq, t % g.H, seq.first_row(g)};
}

// The sequences the kernels attend apart: each row whole, or each row cut by `segments` (checked: positive
// lengths summing to L).
std::vector<Sequence> sequences_of(const char* op, const Geometry& g, at::OptionalIntArrayRef segments) {
  std::vector<Sequence> seqs;
  if (!segments.has_value()) {
    for (int64_t b = 0; b < g.B; ++b) seqs.push_back({b, 0, g.L});
    return seqs;
  }
  int64_t total = 0;
  for (const int64_t len : *segments) {
    FASTQA_CHECK(len > 0, op, "segments must be positive lengths, got ", *segments);
    total += len;
  }
  FASTQA_CHECK(total == g.L, op, "segments must sum to L = ", g.L, ", got ", *segments);
  for (int64_t b = 0; b < g.B; ++b) {
    int64_t start = 0;
    for (const int64_t len : *segments) {
      seqs.push_back({b, start, len});
      start += len;
    }
  }
  return seqs;
}

// Buffer sizes of a task: its sequence's length at most (a packed row is many short sequences; buffers of
// the whole row's length, zero-filled per task, were a tenth of the backward).
struct TaskSizes {
  int64_t L, Lp;
};
TaskSizes task_sizes(const std::vector<Sequence>& seqs) {
  int64_t longest = 1;
  for (const Sequence& seq : seqs) longest = std::max(longest, seq.len);
  return {longest, round_up(longest, kPad)};
}

Geometry check_args(const char* op, const at::Tensor& qkv, const at::Tensor& mask, int64_t heads) {
  FASTQA_CHECK(qkv.dim() == 3, op, "qkv must be [B, L, 3C], got ", qkv.sizes());
  check_cpu_float(op, "qkv", qkv);
  FASTQA_CHECK(heads > 0, op, "heads must be positive, got ", heads);
  const int64_t B = qkv.size(0), L = qkv.size(1);
  FASTQA_CHECK(B > 0 && L > 0, op, "qkv must be non-empty, got ", qkv.sizes());
  FASTQA_CHECK(qkv.size(2) % (3 * heads) == 0 && qkv.size(2) > 0, op, "qkv's last dimension must be 3 * heads * D "
               "with heads=", heads, ", got ", qkv.size(2));
  FASTQA_CHECK(mask.scalar_type() == at::kBool && mask.dim() == 2 && mask.size(0) == B &&
                   mask.size(1) == L && mask.device().is_cpu(),
               op, "mask must be a CPU bool tensor [B, L] = [", B, ", ", L, "], got ", mask.sizes(), " ",
               mask.scalar_type());
  const int64_t C = qkv.size(2) / 3, D = C / heads;
  return {B, L, heads, D, C, round_up(D, kPad)};
}

// dst[c][j] = src[rows[j] * stride + c] for j < 8 * floor(n / 8), c < D (dst rows of ld values): the
// transposed copy of n gathered rows, 8 rows x 8 channels per step through registers (AVX2, float, D a
// multiple of 8). One scalar store per element instead went to a different cache line each time and was
// a tenth of the forward. Returns how many rows it copied (0 where it does not apply: the caller's scalar
// loop does the rest).
template <typename T>
int64_t transpose_rows_8x8(const T*, int64_t, const int64_t*, int64_t, int64_t, T*, int64_t) {
  return 0;
}

#ifdef __AVX2__
template <>
int64_t transpose_rows_8x8<float>(const float* src, int64_t stride, const int64_t* rows, int64_t n, int64_t D,
                                  float* dst, int64_t ld) {
  if (D % 8 != 0) return 0;
  const int64_t blocked = n / 8 * 8;
  for (int64_t j = 0; j < blocked; j += 8) {
    for (int64_t c = 0; c < D; c += 8) {
      __m256 r[8];
      for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + rows[j + i] * stride + c);
      __m256 t[8], u[8];
      for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
      }
      for (int i = 0; i < 8; i += 4) {
        u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
        u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
        u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
      }
      for (int i = 0; i < 4; ++i) {
        _mm256_storeu_ps(dst + (c + i) * ld + j, _mm256_permute2f128_ps(u[i], u[i + 4], 0x20));
        _mm256_storeu_ps(dst + (c + i + 4) * ld + j, _mm256_permute2f128_ps(u[i], u[i + 4], 0x31));
      }
    }
  }
  return blocked;
}
#endif

// A task's keys: only the attended ones, compacted: keys[0 .. nk) are their positions in the sequence
// (nk = 0 for a sequence with no real position: its rows are all padding, zero in the output and the
// gradient). Fills the transposed keys kt [D][Lk] and values vt [D][Lk] (for the score loops), keys
// kr [nk][Dp] and values vr [nk][Dp] as rows, all zero-padded, and bias [Lk] (0, or -inf on the padding
// up to Lk = nk rounded up to a whole vector). Returns Lk. Skipping masked keys changes nothing in the
// result (their probabilities are exactly 0) and saves their work.
template <typename T>
int64_t load_keys(const T* qkv, const bool* mask, const Geometry& g, const Sequence& seq, int64_t h, int64_t* keys,
                  int64_t& nk, T* bias, T* kt, T* kr, T* vr, T* vt) {
  const bool* mb = mask + seq.first_row(g);
  nk = 0;
  for (int64_t j = 0; j < seq.len; ++j) {
    if (mb[j]) keys[nk++] = j;
  }
  const int64_t Lk = round_up(nk, kPad);
  for (int64_t j = 0; j < Lk; ++j) bias[j] = j < nk ? T(0) : -std::numeric_limits<T>::infinity();
  std::fill(kt, kt + g.Dp * Lk, T(0));
  if (vt) std::fill(vt, vt + g.Dp * Lk, T(0));
  const int64_t row_stride = 3 * g.C, head = seq.first_row(g) * row_stride + h * g.D;
  // The transposed copies, 8 keys x 8 channels at a time where the head is whole vectors; then the rest.
  const int64_t blocked = transpose_rows_8x8(qkv + head + g.C, row_stride, keys, nk, g.D, kt, Lk);
  if (vt) transpose_rows_8x8(qkv + head + 2 * g.C, row_stride, keys, nk, g.D, vt, Lk);
  for (int64_t j = 0; j < nk; ++j) {
    const T* row = qkv + head + keys[j] * row_stride;
    const T* k = row + g.C;
    const T* v = row + 2 * g.C;
    if (j >= blocked) {
      for (int64_t c = 0; c < g.D; ++c) kt[c * Lk + j] = k[c];
      if (vt) {
        for (int64_t c = 0; c < g.D; ++c) vt[c * Lk + j] = v[c];
      }
    }
    if (kr) {
      std::copy(k, k + g.D, kr + j * g.Dp);
      std::fill(kr + j * g.Dp + g.D, kr + (j + 1) * g.Dp, T(0));
    }
    std::copy(v, v + g.D, vr + j * g.Dp);
    std::fill(vr + j * g.Dp + g.D, vr + (j + 1) * g.Dp, T(0));
  }
  return Lk;
}

// Rows rows[0 .. n) (positions in the sequence whose first row is first_row) of head h's channels in src
// (rows of row_stride values: qkv for q, or a [B, L, C] tensor), times `scale`, into dst [kRows, Dp]
// (zero-padded; rows past n are zero).
template <typename T>
void load_rows(const T* src, int64_t row_stride, const Geometry& g, int64_t first_row, int64_t h,
               const int64_t* rows, int64_t n, T scale, T* dst) {
  std::fill(dst, dst + kRows * g.Dp, T(0));
  for (int64_t r = 0; r < n; ++r) {
    const T* s = src + (first_row + rows[r]) * row_stride + h * g.D;
    for (int64_t c = 0; c < g.D; ++c) dst[r * g.Dp + c] = s[c] * scale;
  }
}

// The padded rows of a sequence (those not in keys[0 .. nk), ascending) of head h: zero in dst (rows of
// row_stride values; the head's D channels) and, when given, in lse_row [seq.len] (of its own dtype: float32
// for bf16 rows).
template <typename T, typename S = T>
void zero_padded_rows(const int64_t* keys, int64_t nk, const Geometry& g, const Sequence& seq, int64_t h, T* dst,
                      int64_t row_stride, S* lse_row = nullptr) {
  for (int64_t j = 0, kk = 0; j < seq.len; ++j) {
    if (kk < nk && keys[kk] == j) {
      ++kk;
      continue;
    }
    T* row = dst + (seq.first_row(g) + j) * row_stride + h * g.D;
    std::fill(row, row + g.D, T(0));
    if (lse_row) lse_row[j] = S(0);
  }
}

// s[j] = exp(s[j] - m) for j < n (a multiple of the native vector width; s <= m), returns their sum.
template <typename T>
T exp_shifted_sum(T* s, int64_t n, T m) {
  T sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < n; ++j) {
    s[j] = vec_exp(s[j] - m);
    sum += s[j];
  }
  return sum;
}

template <>
float exp_shifted_sum<float>(float* s, int64_t n, float m) {
  using S = NativeBlock<float>;
  S::V acc = {};
  for (int64_t j = 0; j < n; j += S::W) {
    const S::V e = exp_nonpositive(S::load(s + j) - m);
    S::store(s + j, e);
    acc += e;
  }
  float sum = 0;
  for (int64_t l = 0; l < S::W; ++l) sum += acc[l];
  return sum;
}

// P = exp(s - lse) in place on s [n] (a multiple of the native vector width), and dp = P * (dp - delta).
template <typename T>
void probs_and_grad(T* s, T* dp, int64_t n, T lse, T delta) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) {
    const T p = vec_exp(s[j] - lse);
    s[j] = p;
    dp[j] = p * (dp[j] - delta);
  }
}

template <>
void probs_and_grad<float>(float* s, float* dp, int64_t n, float lse, float delta) {
  using S = NativeBlock<float>;
  for (int64_t j = 0; j < n; j += S::W) {
    const S::V p = exp_nonpositive(S::load(s + j) - lse);
    S::store(s + j, p);
    S::store(dp + j, p * (S::load(dp + j) - delta));
  }
}

// The softmax statistics of a block's rows p [kRows][len]: for r < n, row(r) turns its row into exponentials
// and returns (max, sum of exp(s - max)), whose log-sum-exp goes to lse[r] and 1 / sum to inv_sum[r]; rows
// past n are zeroed. P: the probabilities' element type.
template <typename T, typename P, typename Row>
void softmax_stats_rows(P* p, int64_t len, int64_t n, T* lse, T* inv_sum, Row&& row) {
  for (int64_t r = 0; r < kRows; ++r) {
    if (r >= n) {
      std::fill(p + r * len, p + (r + 1) * len, P(0));
      inv_sum[r] = 0;
      continue;
    }
    const auto [m, sum] = row(r);
    inv_sum[r] = T(1) / sum;
    lse[r] = m + std::log(sum);
  }
}

// In place on scores [kRows, Lp]: rows r < n become exp(s - max), their log-sum-exp goes to lse[r] and
// 1 / sum to inv_sum[r] (the normalisation is applied to the [kRows, D] output, not to the Lp
// probabilities). Rows past n are zeroed.
template <typename T>
void softmax_rows(T* scores, int64_t Lp, int64_t n, T* lse, T* inv_sum) {
  softmax_stats_rows(scores, Lp, n, lse, inv_sum, [&](int64_t r) {
    T* s = scores + r * Lp;
    T m = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : m)
    for (int64_t j = 0; j < Lp; ++j) m = max_of(m, s[j]);
    return std::pair<T, T>(m, exp_shifted_sum(s, Lp, m));
  });
}

// The bf16 kernels below: AVX512-BF16's dot products, and AVX512BW/VL's 16-bit masked loads and shuffles (every
// processor with the first has the others).
#if defined(__AVX512BF16__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define FASTQA_SA_BF16_DOT 1
#endif

#if defined(FASTQA_SA_BF16_DOT)
// ---------------------------------------------------------------- bfloat16 on AVX512-BF16 dot products
//
// _mm512_dpbf16_ps adds to each of 16 float32 lanes the sum of a pair of bf16 products, so every operand
// is held as 32-bit words of two bf16 values adjacent along the reduced dimension: (x[2i], x[2i+1]) with
// the first in the low half, as they lie in memory. One side of a product is a vector of 16 such words
// (16 keys, or 16 channels), the other a broadcast word. Accumulation, the softmax and lse are float32;
// what is rounded to bf16 are the probabilities and dS before the products that take them (as eager
// autocast's bmm does); q, k, v, dO are bf16 already. The scale 1/sqrt(D) is applied to the float32
// products, not to a bf16 operand, so it adds no rounding.
namespace sa_bf16 {

using V = NativeBlock<float>::V;  // 16 float32 lanes
static_assert(kPad == 16, "the bf16 loops assume AVX512's 16-lane float vectors");

// The 4 bytes at p (a pair of bf16) in every lane: one broadcast load, which takes no shuffle unit (from
// two adjacent pairs read together, GCC made a 64-bit load, shifts and register broadcasts).
inline __m512bh broadcast_pair(const void* p) {
  int32_t w;
  std::memcpy(&w, p, sizeof(w));
  return (__m512bh)_mm512_set1_epi32(w);
}

// dst[i] = the pair (src[2i], src[2i+1]) for i < ceil(n / 2), a missing odd tail's partner 0; dst[i] = 0
// up to `words`. (The words are the bf16 values as they lie: a copy, by masked moves of 32 values -- a head's row
// is too short for memcpy's call to pay.)
inline void pair_words(const uint16_t* src, int64_t n, uint32_t* dst, int64_t words) {
  const auto lanes = [](int64_t count, int64_t d) {
    return d + 32 <= count ? ~__mmask32{0} : d < count ? (__mmask32{1} << (count - d)) - 1 : __mmask32{0};
  };
  uint16_t* out = reinterpret_cast<uint16_t*>(dst);
  for (int64_t d = 0; d < 2 * words; d += 32) {
    _mm512_mask_storeu_epi16(out + d, lanes(2 * words, d), _mm512_maskz_loadu_epi16(lanes(n, d), src + d));
  }
}

// Lanes i < n - d of a 16-lane block starting at d (all, some or none).
inline __mmask16 lanes_below(int64_t n, int64_t d) {
  return d + 16 <= n ? static_cast<__mmask16>(0xFFFF) : d < n ? static_cast<__mmask16>((1u << (n - d)) - 1) : 0;
}

// sum_c a[c] * b[c] over n bf16 values, in float32: 16 lanes at a time (a scalar loop here was a twentieth of the
// backward).
inline float dot_bf16(const uint16_t* a, const uint16_t* b, int64_t n) {
  const __mmask16 all = 0xFFFF;
  V sum{};
  for (int64_t d = 0; d < n; d += 16) {
    const __mmask16 m = lanes_below(n, d);
    const V x = (V)_mm512_maskz_slli_epi32(all, _mm512_maskz_cvtepu16_epi32(all, _mm256_maskz_loadu_epi16(m, a + d)), 16);
    const V y = (V)_mm512_maskz_slli_epi32(all, _mm512_maskz_cvtepu16_epi32(all, _mm256_maskz_loadu_epi16(m, b + d)), 16);
    sum += x * y;
  }
  return _mm512_reduce_add_ps((__m512)sum);
}

// dst[d] = (a[d], b[d]) for d < n, 0 up to `words` (a multiple of 16); a null row reads as zeros. Masked
// loads: nothing past a row's n values is read.
inline void interleave_rows(const uint16_t* a, const uint16_t* b, int64_t n, uint32_t* dst, int64_t words) {
  for (int64_t d = 0; d < words; d += 16) {
    const __mmask16 m = lanes_below(n, d);
    // (The maskz forms with every lane: GCC 12's unmasked ones warn of their undefined pass-through operand.)
    const __mmask16 all = 0xFFFF;
    const __m512i zero = _mm512_setzero_si512();
    const __m512i lo = a ? _mm512_maskz_cvtepu16_epi32(all, _mm256_maskz_loadu_epi16(m, a + d)) : zero;
    const __m512i hi = b ? _mm512_maskz_cvtepu16_epi32(all, _mm256_maskz_loadu_epi16(m, b + d)) : zero;
    _mm512_storeu_si512(dst + d, _mm512_or_si512(lo, _mm512_maskz_slli_epi32(all, hi, 16)));
  }
}

// s[r][j] = scale * sum_i aw[r][i] . bw[i][j] (+ bias[j]) for r < kRows, j < Lk (a multiple of 16):
// aw [kRows][Dh] words of a query row (or dO row), bw [Dh][Lk] words of the keys (or values), pairs along
// the head's channels. NJ vectors of keys per pass, as rows_times_t.
template <int64_t NJ>
int64_t scores_pass(const uint32_t* aw, int64_t Dh, const uint32_t* bw, int64_t Lk, float scale, const float* bias,
                    float* s, V* rmax, int64_t j) {
  for (; j + NJ * 16 <= Lk; j += NJ * 16) {
    V acc[kRows][NJ];
    for (int64_t r = 0; r < kRows; ++r) {
      for (int64_t n = 0; n < NJ; ++n) acc[r][n] = V{};
    }
    for (int64_t i = 0; i < Dh; ++i) {
      __m512i b[NJ];
      for (int64_t n = 0; n < NJ; ++n) b[n] = _mm512_loadu_si512(bw + i * Lk + j + n * 16);
      for (int64_t r = 0; r < kRows; ++r) {
        const __m512bh a = broadcast_pair(aw + r * Dh + i);
        for (int64_t n = 0; n < NJ; ++n) acc[r][n] = (V)_mm512_dpbf16_ps((__m512)acc[r][n], a, (__m512bh)b[n]);
      }
    }
    for (int64_t r = 0; r < kRows; ++r) {
      for (int64_t n = 0; n < NJ; ++n) {
        V v = acc[r][n] * scale;
        if (bias) v += NativeBlock<float>::load(bias + j + n * 16);
        NativeBlock<float>::store(s + r * Lk + j + n * 16, v);
        if (rmax) rmax[r] = v > rmax[r] ? v : rmax[r];
      }
    }
  }
  return j;
}

// rmax (optional): each row's running maximum, lane by lane, for the softmax (no pass of its own).
void scores(const uint32_t* aw, int64_t Dh, const uint32_t* bw, int64_t Lk, float scale, const float* bias,
            float* s, V* rmax = nullptr) {
  const int64_t j = scores_pass<2>(aw, Dh, bw, Lk, scale, bias, s, rmax, 0);
  scores_pass<1>(aw, Dh, bw, Lk, scale, bias, s, rmax, j);
}

// softmax_rows for the forward, whose probabilities are only read rounded to bf16: rows r < n of s
// [kRows][Lk] become pb [kRows][Lk] = bf16(exp(s - max)) (max from rmax), with lse[r] and inv_sum[r] from
// the float32 exponentials; rows past n are zeros. One pass: no float32 probabilities are stored.
void softmax_round_rows(const float* s, int64_t Lk, int64_t n, const V* rmax, uint16_t* pb, float* lse,
                        float* inv_sum) {
  softmax_stats_rows(pb, Lk, n, lse, inv_sum, [&](int64_t r) {
    uint16_t* p = pb + r * Lk;
    float m = rmax[r][0];
    for (int64_t l = 1; l < 16; ++l) m = max_of(m, rmax[r][l]);
    V acc = {};
    for (int64_t j = 0; j < Lk; j += 16) {
      const V e = exp_nonpositive(NativeBlock<float>::load(s + r * Lk + j) - m);
      acc += e;
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(p + j), (__m256i)_mm512_cvtneps_pbh((__m512)e));
    }
    float sum = 0;
    for (int64_t l = 0; l < 16; ++l) sum += acc[l];
    return std::pair<float, float>(m, sum);
  });
}

// out[r][:] = sum_{j < L} pb[r][j] * m[j][:] for r < kRows: pb [kRows][Lk] bf16 rows (pairs of keys are
// adjacent), mw [Lk / 2][Dp] words of the rows of keys 2i and 2i+1, out [kRows][Dp]. Two sets of
// accumulators (even and odd pairs of keys) keep twice as many dot products in flight; they are added
// in a fixed order, so the result does not depend on anything but the operands.
void rows_times(const uint16_t* pb, int64_t Lk, const uint32_t* mw, int64_t L, int64_t Dp, float* out) {
  const int64_t pairs = (L + 1) / 2;  // a last odd key's partner is padding: probability and row 0
  for (int64_t d = 0; d < Dp; d += 16) {
    V acc0[kRows] = {}, acc1[kRows] = {};
    int64_t i = 0;
    for (; i + 2 <= pairs; i += 2) {
      const __m512i b0 = _mm512_loadu_si512(mw + i * Dp + d), b1 = _mm512_loadu_si512(mw + (i + 1) * Dp + d);
      for (int64_t r = 0; r < kRows; ++r) {
        acc0[r] = (V)_mm512_dpbf16_ps((__m512)acc0[r], broadcast_pair(pb + r * Lk + 2 * i), (__m512bh)b0);
        acc1[r] = (V)_mm512_dpbf16_ps((__m512)acc1[r], broadcast_pair(pb + r * Lk + 2 * i + 2), (__m512bh)b1);
      }
    }
    if (i < pairs) {
      const __m512i b0 = _mm512_loadu_si512(mw + i * Dp + d);
      for (int64_t r = 0; r < kRows; ++r) {
        acc0[r] = (V)_mm512_dpbf16_ps((__m512)acc0[r], broadcast_pair(pb + r * Lk + 2 * i), (__m512bh)b0);
      }
    }
    for (int64_t r = 0; r < kRows; ++r) NativeBlock<float>::store(out + r * Dp + d, acc0[r] + acc1[r]);
  }
}

// The backward's probabilities and dS, straight into the layouts its products read: for rows r < n of the
// scores s and of dp = dO Vᵀ ([kRows][Lk]), P = exp(s - lse[r]) and dS = P * (dp - delta[r]) (rows past n: 0),
// stored rounded to bf16 as dS rows dsb [kRows][Lk] (for dS K) and as pairs of rows pw, dsw [kRows / 2][Lk]
// (for Pᵀ dO and dSᵀ Q); no float32 P or dS is stored and read back.
void probs_and_grads(const float* s, const float* dp, int64_t Lk, int64_t n, const float* lse, const float* delta,
                     uint16_t* dsb, uint32_t* pw, uint32_t* dsw) {
  // cvtne2ps_pbh(hi, lo) holds lo's 16 values then hi's; idx interleaves them into pairs.
  const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                                       21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  for (int64_t k = 0; k < kRows / 2; ++k) {
    for (int64_t j = 0; j < Lk; j += 16) {
      V p[2] = {}, ds[2] = {};
      for (int64_t i = 0; i < 2; ++i) {
        const int64_t r = 2 * k + i;
        if (r < n) {
          p[i] = exp_nonpositive(NativeBlock<float>::load(s + r * Lk + j) - lse[r]);
          ds[i] = p[i] * (NativeBlock<float>::load(dp + r * Lk + j) - delta[r]);
        }
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dsb + r * Lk + j), (__m256i)_mm512_cvtneps_pbh((__m512)ds[i]));
      }
      _mm512_storeu_si512(pw + k * Lk + j,
                          _mm512_permutexvar_epi16(idx, (__m512i)_mm512_cvtne2ps_pbh((__m512)p[1], (__m512)p[0])));
      _mm512_storeu_si512(dsw + k * Lk + j,
                          _mm512_permutexvar_epi16(idx, (__m512i)_mm512_cvtne2ps_pbh((__m512)ds[1], (__m512)ds[0])));
    }
  }
}

// acc[j][:] += sum_{r < 2K} p[r][j] * m[r][:] for j < L: pw [K][Lk] words of pairs of rows of p (probs_and_grads),
// mw [K][Dp] words of pairs of rows of m, acc [L][Dp] float32. The backward takes two blocks of kRows query
// rows (K = kRows) per pass where it can: each acc row loaded and stored once for twice the dot products
// (this loop waits on its loads and stores, not on the dot products).
// Each acc row's K dot products form one dependent chain: kChains rows are taken together, their chains interleaved,
// so that the chains' latencies overlap (each row's sums in the same order as one at a time).
template <int64_t K>
void accumulate_t_times(const uint32_t* pw, int64_t Lk, const uint32_t* mw, int64_t L, int64_t Dp, float* acc) {
  constexpr int64_t kChains = 4;
  for (int64_t d = 0; d < Dp; d += 16) {
    __m512i m[K];
    for (int64_t k = 0; k < K; ++k) m[k] = _mm512_loadu_si512(mw + k * Dp + d);
    int64_t j = 0;
    for (; j + kChains <= L; j += kChains) {
      V sum[kChains];
      for (int64_t c = 0; c < kChains; ++c) sum[c] = NativeBlock<float>::load(acc + (j + c) * Dp + d);
      for (int64_t k = 0; k < K; ++k) {
        for (int64_t c = 0; c < kChains; ++c) {
          sum[c] = (V)_mm512_dpbf16_ps((__m512)sum[c], broadcast_pair(pw + k * Lk + j + c), (__m512bh)m[k]);
        }
      }
      for (int64_t c = 0; c < kChains; ++c) NativeBlock<float>::store(acc + (j + c) * Dp + d, sum[c]);
    }
    for (; j < L; ++j) {
      V sum = NativeBlock<float>::load(acc + j * Dp + d);
      for (int64_t k = 0; k < K; ++k) {
        sum = (V)_mm512_dpbf16_ps((__m512)sum, broadcast_pair(pw + k * Lk + j), (__m512bh)m[k]);
      }
      NativeBlock<float>::store(acc + j * Dp + d, sum);
    }
  }
}

// A task's keys, as load_keys: keys[0 .. nk) their positions, bias [Lk] (0, -inf on the padding), and the
// operands as words: kc [Dh][Lk] (keys, pairs of channels: the scores), vr [Lk / 2][Dp] (values, pairs of
// keys: P V); for the backward vc [Dh][Lk] (values, pairs of channels: dO Vᵀ) and kr [Lk / 2][Dp] (keys,
// pairs of keys: dS K). All zero-padded. Returns Lk.
int64_t load_keys(const uint16_t* qkv, const bool* mask, const Geometry& g, const Sequence& seq, int64_t h,
                  int64_t* keys, int64_t& nk, float* bias, uint32_t* kc, uint32_t* vr, uint32_t* vc, uint32_t* kr) {
  const bool* mb = mask + seq.first_row(g);
  nk = 0;
  for (int64_t j = 0; j < seq.len; ++j) {
    if (mb[j]) keys[nk++] = j;
  }
  const int64_t Lk = round_up(nk, kPad), Dh = (g.D + 1) / 2;
  for (int64_t j = 0; j < Lk; ++j) bias[j] = j < nk ? 0.0f : -std::numeric_limits<float>::infinity();
  const int64_t row_stride = 3 * g.C, head = seq.first_row(g) * row_stride + h * g.D;
  const uint16_t* kb = qkv + head + g.C;  // the sequence's first key row, this head
  const uint16_t* vb = kb + g.C;
  if (g.D % 2 == 0 && seq.len * row_stride <= std::numeric_limits<int32_t>::max()) {
    // The transposed copies, 16 keys per gather of one pair of channels (a 4-byte read within the head);
    // lanes past nk are zeros, the padding.
    for (int64_t j = 0; j < Lk; j += 16) {
      const __mmask16 m = lanes_below(nk, j);
      int32_t offsets[16] = {};  // each key's offset from kb, in bf16 values
      for (int64_t l = 0; l < 16 && j + l < nk; ++l) offsets[l] = static_cast<int32_t>(keys[j + l] * row_stride);
      const __m512i off = _mm512_loadu_si512(offsets);
      for (int64_t i = 0; i < Dh; ++i) {
        const __m512i zero = _mm512_setzero_si512();
        _mm512_storeu_si512(kc + i * Lk + j, _mm512_mask_i32gather_epi32(zero, m, off, kb + 2 * i, 2));
        if (vc) _mm512_storeu_si512(vc + i * Lk + j, _mm512_mask_i32gather_epi32(zero, m, off, vb + 2 * i, 2));
      }
    }
  } else {
    // An odd head (the last pair's partner is not the head's, and may lie past the tensor's end), or offsets
    // too large for a gather's 32-bit indices.
    for (int64_t j = 0; j < nk; ++j) {
      const uint16_t* k = kb + keys[j] * row_stride;
      const uint16_t* v = k + g.C;
      for (int64_t i = 0; i < Dh; ++i) {
        kc[i * Lk + j] = k[2 * i] | (2 * i + 1 < g.D ? static_cast<uint32_t>(k[2 * i + 1]) << 16 : 0u);
        if (vc) vc[i * Lk + j] = v[2 * i] | (2 * i + 1 < g.D ? static_cast<uint32_t>(v[2 * i + 1]) << 16 : 0u);
      }
    }
    for (int64_t i = 0; i < Dh; ++i) {  // the padding keys
      std::fill(kc + i * Lk + nk, kc + (i + 1) * Lk, 0u);
      if (vc) std::fill(vc + i * Lk + nk, vc + (i + 1) * Lk, 0u);
    }
  }
  for (int64_t i = 0; i < Lk / 2; ++i) {
    const uint16_t* a = 2 * i < nk ? kb + keys[2 * i] * row_stride : nullptr;
    const uint16_t* b = 2 * i + 1 < nk ? kb + keys[2 * i + 1] * row_stride : nullptr;
    interleave_rows(a ? a + g.C : nullptr, b ? b + g.C : nullptr, g.D, vr + i * g.Dp, g.Dp);
    if (kr) interleave_rows(a, b, g.D, kr + i * g.Dp, g.Dp);
  }
  return Lk;
}

std::tuple<at::Tensor, at::Tensor> fwd(const at::Tensor& qkv_in, const at::Tensor& mask_in, const Geometry& g,
                                       const std::vector<Sequence>& seqs) {
  const TaskSizes ts = task_sizes(seqs);
  const int64_t S = static_cast<int64_t>(seqs.size()), Dh = (g.D + 1) / 2;
  const at::Tensor qkv = qkv_in.contiguous(), mask = mask_in.contiguous();
  at::Tensor out = at::empty({g.B, g.L, g.C}, qkv.options());
  at::Tensor lse = at::empty({g.B, g.H, g.L}, qkv.options().dtype(at::kFloat));
  const uint16_t* qp = bf16::bits(qkv.data_ptr<c10::BFloat16>());
  const bool* mp = mask.data_ptr<bool>();
  uint16_t* op = bf16::bits(out.data_ptr<c10::BFloat16>());
  float* lp = lse.data_ptr<float>();
  const float scale = 1.0f / std::sqrt(static_cast<float>(g.D));
  at::parallel_for(0, S * g.H, 1, [&](int64_t t0, int64_t t1) {
    std::vector<float> bias(ts.Lp), s(kRows * ts.Lp), o(kRows * g.Dp);
    std::vector<uint32_t> kc(Dh * ts.Lp), vr(ts.Lp / 2 * g.Dp), qw(kRows * Dh);
    std::vector<uint16_t> pb(kRows * ts.Lp);
    std::vector<int64_t> keys(ts.L);
    float inv_sum[kRows], lse_r[kRows];
    for (int64_t t = t0; t < t1; ++t) {
      const auto [seq, h, first] = head_task(seqs, g, t);
      int64_t nk = 0;
      const int64_t Lk = load_keys(qp, mp, g, seq, h, keys.data(), nk, bias.data(), kc.data(), vr.data(), nullptr,
                                   nullptr);
      float* lse_row = lp + (seq.b * g.H + h) * g.L + seq.start;
      zero_padded_rows(keys.data(), nk, g, seq, h, op, g.C, lse_row);
      for (int64_t i0 = 0; i0 < nk; i0 += kRows) {
        const int64_t n = std::min(kRows, nk - i0);
        const int64_t* rows = keys.data() + i0;
        for (int64_t r = 0; r < kRows; ++r) {
          if (r < n) {
            pair_words(qp + (first + rows[r]) * 3 * g.C + h * g.D, g.D, qw.data() + r * Dh, Dh);
          } else {
            std::fill(qw.data() + r * Dh, qw.data() + (r + 1) * Dh, 0u);
          }
        }
        V rmax[kRows];
        for (int64_t r = 0; r < kRows; ++r) rmax[r] = V{} - std::numeric_limits<float>::infinity();
        scores(qw.data(), Dh, kc.data(), Lk, scale, bias.data(), s.data(), rmax);
        softmax_round_rows(s.data(), Lk, n, rmax, pb.data(), lse_r, inv_sum);
        rows_times(pb.data(), Lk, vr.data(), nk, g.Dp, o.data());
        for (int64_t r = 0; r < n; ++r) {
          uint16_t* dst = op + (first + rows[r]) * g.C + h * g.D;
          for (int64_t c = 0; c < g.D; ++c) dst[c] = bf16::round_bits(o[r * g.Dp + c] * inv_sum[r]);
          lse_row[rows[r]] = lse_r[r];
        }
      }
    }
  });
  return {out, lse};
}

at::Tensor bwd(const at::Tensor& grad_out_in, const at::Tensor& qkv_in, const at::Tensor& mask_in,
               const at::Tensor& out_in, const at::Tensor& lse_in, const Geometry& g,
               const std::vector<Sequence>& seqs) {
  const TaskSizes ts = task_sizes(seqs);
  const int64_t S = static_cast<int64_t>(seqs.size()), Dh = (g.D + 1) / 2;
  const at::Tensor qkv = qkv_in.contiguous(), mask = mask_in.contiguous();
  const at::Tensor grad_out = grad_out_in.contiguous(), out = out_in.contiguous(), lse = lse_in.contiguous();
  at::Tensor grad_qkv = at::empty_like(qkv);
  const uint16_t* qp = bf16::bits(qkv.data_ptr<c10::BFloat16>());
  const bool* mp = mask.data_ptr<bool>();
  const uint16_t* gop = bf16::bits(grad_out.data_ptr<c10::BFloat16>());
  const uint16_t* op = bf16::bits(out.data_ptr<c10::BFloat16>());
  const float* lp = lse.data_ptr<float>();
  uint16_t* gp = bf16::bits(grad_qkv.data_ptr<c10::BFloat16>());
  const float scale = 1.0f / std::sqrt(static_cast<float>(g.D));
  constexpr int64_t K = kRows / 2;
  at::parallel_for(0, S * g.H, 1, [&](int64_t t0, int64_t t1) {
    std::vector<float> bias(ts.Lp), dk(ts.L * g.Dp), dv(ts.L * g.Dp), p(kRows * ts.Lp), dp(kRows * ts.Lp),
        dq(kRows * g.Dp);
    std::vector<uint32_t> kc(Dh * ts.Lp), vc(Dh * ts.Lp), vr(ts.Lp / 2 * g.Dp), kr(ts.Lp / 2 * g.Dp),
        qw(kRows * Dh), gw(kRows * Dh), qpair(2 * K * g.Dp), gpair(2 * K * g.Dp), ppair(2 * K * ts.Lp),
        dspair(2 * K * ts.Lp);
    std::vector<uint16_t> dsb(kRows * ts.Lp);
    std::vector<int64_t> keys(ts.L);
    for (int64_t t = t0; t < t1; ++t) {
      const auto [seq, h, first] = head_task(seqs, g, t);
      int64_t nk = 0;
      const int64_t Lk = load_keys(qp, mp, g, seq, h, keys.data(), nk, bias.data(), kc.data(), vr.data(), vc.data(),
                                   kr.data());
      std::fill(dk.begin(), dk.begin() + nk * g.Dp, 0.0f);
      std::fill(dv.begin(), dv.begin() + nk * g.Dp, 0.0f);
      const float* lse_row = lp + (seq.b * g.H + h) * g.L + seq.start;
      for (int64_t i0 = 0; i0 < nk; i0 += kRows) {
        const int64_t n = std::min(kRows, nk - i0);
        const int64_t* rows = keys.data() + i0;
        const uint16_t* q_r[kRows];
        const uint16_t* go_r[kRows];
        for (int64_t r = 0; r < kRows; ++r) {
          q_r[r] = r < n ? qp + (first + rows[r]) * 3 * g.C + h * g.D : nullptr;
          go_r[r] = r < n ? gop + (first + rows[r]) * g.C + h * g.D : nullptr;
          if (r < n) {
            pair_words(q_r[r], g.D, qw.data() + r * Dh, Dh);
            pair_words(go_r[r], g.D, gw.data() + r * Dh, Dh);
          } else {
            std::fill(qw.data() + r * Dh, qw.data() + (r + 1) * Dh, 0u);
            std::fill(gw.data() + r * Dh, gw.data() + (r + 1) * Dh, 0u);
          }
        }
        // This block's pairs of rows for dK and dV: the first or the second half of a pass of two blocks.
        const int64_t half = (i0 / kRows) % 2;
        for (int64_t k = 0; k < K; ++k) {
          interleave_rows(q_r[2 * k], q_r[2 * k + 1], g.D, qpair.data() + (half * K + k) * g.Dp, g.Dp);
          interleave_rows(go_r[2 * k], go_r[2 * k + 1], g.D, gpair.data() + (half * K + k) * g.Dp, g.Dp);
        }
        // P = exp(S - lse): the forward's probabilities (before its P was rounded); dP = dO Vᵀ.
        scores(qw.data(), Dh, kc.data(), Lk, scale, bias.data(), p.data());
        scores(gw.data(), Dh, vc.data(), Lk, 1.0f, nullptr, dp.data());
        float lse_b[kRows] = {}, delta[kRows] = {};
        for (int64_t r = 0; r < n; ++r) {
          const uint16_t* o_r = op + (first + rows[r]) * g.C + h * g.D;
          delta[r] = dot_bf16(go_r[r], o_r, g.D);
          lse_b[r] = lse_row[rows[r]];
        }
        // delta = sum_c dO * O = sum_j P * dP; P = exp(S - lse), dS = P * (dP - delta).
        probs_and_grads(p.data(), dp.data(), Lk, n, lse_b, delta, dsb.data(), ppair.data() + half * K * Lk,
                        dspair.data() + half * K * Lk);
        // dQ = scale * dS K; dK += scale * dSᵀ Q; dV += Pᵀ dO (scale applied when dK is written)
        rows_times(dsb.data(), Lk, kr.data(), nk, g.Dp, dq.data());
        if (half == 1) {
          accumulate_t_times<2 * K>(dspair.data(), Lk, qpair.data(), nk, g.Dp, dk.data());
          accumulate_t_times<2 * K>(ppair.data(), Lk, gpair.data(), nk, g.Dp, dv.data());
        } else if (i0 + kRows >= nk) {  // the task's last block, alone
          accumulate_t_times<K>(dspair.data(), Lk, qpair.data(), nk, g.Dp, dk.data());
          accumulate_t_times<K>(ppair.data(), Lk, gpair.data(), nk, g.Dp, dv.data());
        }
        for (int64_t r = 0; r < n; ++r) {
          uint16_t* dst = gp + (first + rows[r]) * 3 * g.C + h * g.D;
          for (int64_t c = 0; c < g.D; ++c) dst[c] = bf16::round_bits(dq[r * g.Dp + c] * scale);
        }
      }
      for (int64_t kk = 0; kk < nk; ++kk) {
        uint16_t* row = gp + (first + keys[kk]) * 3 * g.C + h * g.D;
        for (int64_t c = 0; c < g.D; ++c) {
          row[g.C + c] = bf16::round_bits(dk[kk * g.Dp + c] * scale);
          row[2 * g.C + c] = bf16::round_bits(dv[kk * g.Dp + c]);
        }
      }
      for (int64_t part = 0; part < 3; ++part) {
        zero_padded_rows<uint16_t>(keys.data(), nk, g, seq, h, gp + part * g.C, 3 * g.C);
      }
    }
  });
  return grad_qkv;
}

}  // namespace sa_bf16
#endif  // FASTQA_SA_BF16_DOT

std::tuple<at::Tensor, at::Tensor> self_attention_fwd(const at::Tensor& qkv_in, const at::Tensor& mask_in,
                                                      int64_t heads, at::OptionalIntArrayRef segments) {
  const Geometry g = check_args(kFwd, qkv_in, mask_in, heads);
  if (bf16::is_bf16(qkv_in)) {
#if defined(FASTQA_SA_BF16_DOT)
    return sa_bf16::fwd(qkv_in, mask_in, g, sequences_of(kFwd, g, segments));
#else
    gemm::Bf16Products scope;  // no GEMM here today; a product routed through gemm:: would take it
    auto [o, l] = self_attention_fwd(bf16::widen(qkv_in), mask_in, heads, segments);
    return {bf16::narrow(o), l};
#endif
  }
  const std::vector<Sequence> seqs = sequences_of(kFwd, g, segments);
  const TaskSizes ts = task_sizes(seqs);
  const int64_t S = static_cast<int64_t>(seqs.size());
  const at::Tensor qkv = qkv_in.contiguous();
  const at::Tensor mask = mask_in.contiguous();
  at::Tensor out = at::empty({g.B, g.L, g.C}, qkv.options());
  at::Tensor lse = at::empty({g.B, g.H, g.L}, qkv.options());
  AT_DISPATCH_FLOATING_TYPES(qkv.scalar_type(), "self_attention_fwd", [&] {
    using T = scalar_t;
    const T* qp = qkv.data_ptr<T>();
    const bool* mp = mask.data_ptr<bool>();
    T* op = out.data_ptr<T>();
    T* lp = lse.data_ptr<T>();
    const T scale = T(1) / std::sqrt(T(g.D));
    at::parallel_for(0, S * g.H, 1, [&](int64_t t0, int64_t t1) {
      std::vector<T> bias(ts.Lp), kt(g.Dp * ts.Lp), vr(ts.L * g.Dp), qr(kRows * g.Dp), s(kRows * ts.Lp),
          o(kRows * g.Dp);
      std::vector<int64_t> keys(ts.L);
      T inv_sum[kRows], lse[kRows];
      for (int64_t t = t0; t < t1; ++t) {
        const auto [seq, h, first] = head_task(seqs, g, t);
        int64_t nk = 0;
        const int64_t Lk = load_keys<T>(qp, mp, g, seq, h, keys.data(), nk, bias.data(), kt.data(), nullptr, vr.data(),
                                        nullptr);
        T* lse_row = lp + (seq.b * g.H + h) * g.L + seq.start;
        zero_padded_rows<T>(keys.data(), nk, g, seq, h, op, g.C, lse_row);
        // The query rows are the real positions, as the keys (keys[0 .. nk)).
        for (int64_t i0 = 0; i0 < nk; i0 += kRows) {
          const int64_t n = std::min(kRows, nk - i0);
          const int64_t* rows = keys.data() + i0;
          load_rows<T>(qp, 3 * g.C, g, first, h, rows, n, scale, qr.data());
          rows_times_t<T>(qr.data(), g.Dp, kt.data(), g.D, Lk, bias.data(), s.data());
          softmax_rows<T>(s.data(), Lk, n, lse, inv_sum);
          rows_times<T>(s.data(), Lk, vr.data(), nk, g.Dp, o.data());
          for (int64_t r = 0; r < n; ++r) {
            T* dst = op + (first + rows[r]) * g.C + h * g.D;
            for (int64_t c = 0; c < g.D; ++c) dst[c] = o[r * g.Dp + c] * inv_sum[r];
            lse_row[rows[r]] = lse[r];
          }
        }
      }
    });
  });
  return {out, lse};
}

at::Tensor self_attention_bwd(const at::Tensor& grad_out_in, const at::Tensor& qkv_in,
                              const at::Tensor& mask_in, const at::Tensor& out_in, const at::Tensor& lse_in,
                              int64_t heads, at::OptionalIntArrayRef segments) {
  const Geometry g = check_args(kBwd, qkv_in, mask_in, heads);
  const std::vector<Sequence> seqs = sequences_of(kBwd, g, segments);
  const TaskSizes ts = task_sizes(seqs);
  const int64_t S = static_cast<int64_t>(seqs.size());
  FASTQA_CHECK(grad_out_in.sizes() == at::IntArrayRef({g.B, g.L, g.C}) && out_in.sizes() == grad_out_in.sizes() &&
                   grad_out_in.scalar_type() == qkv_in.scalar_type() && out_in.scalar_type() == qkv_in.scalar_type(),
               kBwd, "grad_out and out must be [B, L, C] = [", g.B, ", ", g.L, ", ", g.C, "] like qkv, got ",
               grad_out_in.sizes(), " and ", out_in.sizes());
  const at::ScalarType lse_type = bf16::statistics_dtype(qkv_in);  // as the forward saved it
  FASTQA_CHECK(lse_in.sizes() == at::IntArrayRef({g.B, g.H, g.L}) && lse_in.scalar_type() == lse_type,
               kBwd, "lse must be the forward's [B, heads, L] = [", g.B, ", ", g.H, ", ", g.L, "] ", lse_type,
               ", got ", lse_in.sizes(), " ", lse_in.scalar_type());
  if (bf16::is_bf16(qkv_in)) {
#if defined(FASTQA_SA_BF16_DOT)
    return sa_bf16::bwd(grad_out_in, qkv_in, mask_in, out_in, lse_in, g, seqs);
#else
    gemm::Bf16Products scope;
    return bf16::narrow(self_attention_bwd(bf16::widen(grad_out_in), bf16::widen(qkv_in), mask_in,
                                           bf16::widen(out_in), lse_in, heads, segments));
#endif
  }
  const at::Tensor qkv = qkv_in.contiguous(), mask = mask_in.contiguous();
  const at::Tensor grad_out = grad_out_in.contiguous(), out = out_in.contiguous(), lse = lse_in.contiguous();
  at::Tensor grad_qkv = at::empty_like(qkv);
  AT_DISPATCH_FLOATING_TYPES(qkv.scalar_type(), "self_attention_bwd", [&] {
    using T = scalar_t;
    const T* qp = qkv.data_ptr<T>();
    const bool* mp = mask.data_ptr<bool>();
    const T* gop = grad_out.data_ptr<T>();
    const T* op = out.data_ptr<T>();
    const T* lp = lse.data_ptr<T>();
    T* gp = grad_qkv.data_ptr<T>();
    const T scale = T(1) / std::sqrt(T(g.D));
    at::parallel_for(0, S * g.H, 1, [&](int64_t t0, int64_t t1) {
      std::vector<T> bias(ts.Lp), kt(g.Dp * ts.Lp), kr(ts.L * g.Dp), vr(ts.L * g.Dp), vt(g.Dp * ts.Lp),
          dk(ts.L * g.Dp), dv(ts.L * g.Dp), qr(kRows * g.Dp), gor(kRows * g.Dp), orow(kRows * g.Dp),
          p(kRows * ts.Lp), dp(kRows * ts.Lp), dq(kRows * g.Dp);
      std::vector<int64_t> keys(ts.L);
      for (int64_t t = t0; t < t1; ++t) {
        const auto [seq, h, first] = head_task(seqs, g, t);
        int64_t nk = 0;
        const int64_t Lk = load_keys<T>(qp, mp, g, seq, h, keys.data(), nk, bias.data(), kt.data(), kr.data(),
                                        vr.data(), vt.data());
        std::fill(dk.begin(), dk.begin() + nk * g.Dp, T(0));
        std::fill(dv.begin(), dv.begin() + nk * g.Dp, T(0));
        const T* lse_row = lp + (seq.b * g.H + h) * g.L + seq.start;
        // Padded query rows gave zeros, whatever q: their dQ is 0 and they add nothing to dK, dV.
        for (int64_t i0 = 0; i0 < nk; i0 += kRows) {
          const int64_t n = std::min(kRows, nk - i0);
          const int64_t* rows = keys.data() + i0;
          load_rows<T>(qp, 3 * g.C, g, first, h, rows, n, scale, qr.data());
          load_rows<T>(gop, g.C, g, first, h, rows, n, T(1), gor.data());
          load_rows<T>(op, g.C, g, first, h, rows, n, T(1), orow.data());
          // P = exp(S - lse): the forward's probabilities (rows past n: 0).
          rows_times_t<T>(qr.data(), g.Dp, kt.data(), g.D, Lk, bias.data(), p.data());
          // dP = dO Vᵀ
          rows_times_t<T>(gor.data(), g.Dp, vt.data(), g.D, Lk, nullptr, dp.data());
          for (int64_t r = 0; r < kRows; ++r) {
            T* pr = p.data() + r * Lk;
            T* dpr = dp.data() + r * Lk;
            if (r >= n) {
              std::fill(pr, pr + Lk, T(0));
              std::fill(dpr, dpr + Lk, T(0));
              continue;
            }
            T delta = 0;  // sum_c dO * O = sum_j P * dP
            for (int64_t c = 0; c < g.D; ++c) delta += gor[r * g.Dp + c] * orow[r * g.Dp + c];
            // One query row, in place: s (scores + mask) becomes P = exp(s - lse) and dp (dO Vᵀ) becomes
            // dS = P * (dp - delta), delta = sum_c dO * O.
            probs_and_grad<T>(pr, dpr, Lk, lse_row[rows[r]], delta);
          }
          // dQ = scale * dS K; dK += dSᵀ (scale Q); dV += Pᵀ dO
          rows_times<T>(dp.data(), Lk, kr.data(), nk, g.Dp, dq.data());
          accumulate_t_times<T>(dp.data(), Lk, qr.data(), nk, g.Dp, dk.data());
          accumulate_t_times<T>(p.data(), Lk, gor.data(), nk, g.Dp, dv.data());
          for (int64_t r = 0; r < n; ++r) {
            T* dst = gp + (first + rows[r]) * 3 * g.C + h * g.D;
            for (int64_t c = 0; c < g.D; ++c) dst[c] = dq[r * g.Dp + c] * scale;
          }
        }
        // Real positions get their compacted dK, dV rows; padded ones (skipped as keys and as queries) zeros.
        for (int64_t kk = 0; kk < nk; ++kk) {
          T* row = gp + (first + keys[kk]) * 3 * g.C + h * g.D;
          std::copy(dk.data() + kk * g.Dp, dk.data() + kk * g.Dp + g.D, row + g.C);
          std::copy(dv.data() + kk * g.Dp, dv.data() + kk * g.Dp + g.D, row + 2 * g.C);
        }
        for (int64_t part = 0; part < 3; ++part) {
          zero_padded_rows<T>(keys.data(), nk, g, seq, h, gp + part * g.C, 3 * g.C);
        }
      }
    });
  });
  return grad_qkv;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(fastqa, m) {
  FASTQA_CPU_OP(m, self_attention_fwd, "(Tensor qkv, Tensor mask, int heads, int[]? segments=None) -> (Tensor out, Tensor lse)");
  FASTQA_CPU_OP(m, self_attention_bwd,
                "(Tensor grad_out, Tensor qkv, Tensor mask, Tensor out, Tensor lse, int heads, int[]? segments=None) "
                "-> Tensor grad_qkv");
}

}  // namespace fastqa
