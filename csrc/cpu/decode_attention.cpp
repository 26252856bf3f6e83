// Decode-time attention: a few query rows per sentence against that sentence's own memory, forward only.
//
//   fastqa::decode_attention(q [B, R, E], keys [B, S, E], values [B, S, Ev], bias [B, 1|R, S]?, mask [B, S]?,
//                            scale) -> (out [B, R, Ev], weights [B, R, S])
//   weights = softmax over the unmasked positions of scale q keysᵀ + bias (0 at masked ones), out = weights values
//
// What it is for: every step of ConvS2S decoding attends one row per sentence (greedy) or per beam over
// the sentence's S source positions. As batched GEMMs (baddbmm, softmax, bmm) that is B tiny
// [R x E] x [E x S] products and three passes over [B, R, S], all of them over the padding too. Here each
// sentence is one work item: its scores, softmax and weighted sum of values in one pass over the keys and
// values of its real positions only (a sentence's 2 S E floats stay in cache between the two).
//
// bfloat16: the keys, values and bias are read as they are stored -- a widened copy of the memory, whole or per
// sentence, costs more than the attention (it is read once per step). Scores: AVX512-BF16 pair products of the
// bf16 query and key rows, accumulated in float32, where the build has them; elsewhere each key row widened once
// (into a row of float32 scratch that stays in L1) for all of its sentence's query rows. Each value row is
// widened once the same way. Softmax, weights and output are float32, rounded as they are stored. No GEMM: a
// few query rows per sentence.
#include "bf16.h"
#include "bf16_rows.h"
#include "common.h"

#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <limits>
#include <tuple>
#include <type_traits>
#include <vector>

namespace fastqa {
namespace {

constexpr const char* kOp = "fastqa::decode_attention";

// A stored row as T: the row itself, or a bf16 row widened into buf.
template <typename T, typename In>
inline const T* row_as(const In* row, int64_t n, T* buf) {
  if constexpr (std::is_same_v<In, T>) {
    return row;
  } else {
    bf16::widen_row(row, n, buf);
    return buf;
  }
}

#if defined(__AVX512BF16__) && defined(__AVX512BW__)
// Scores of bf16 rows with AVX512-BF16's pair products: q_row · key_row over n bf16 values, each product exact in
// float32, accumulated in float32 (no widened copy of either row). A tail of fewer than 32 values is one masked
// load of zeros past it.
constexpr bool kBf16Dot = true;
inline float bf16_dot(const c10::BFloat16* a, const c10::BFloat16* b, int64_t n) {
  const uint16_t* x = bf16::bits(a);
  const uint16_t* y = bf16::bits(b);
  __m512 acc = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    acc = _mm512_dpbf16_ps(acc, (__m512bh)_mm512_loadu_si512(x + i), (__m512bh)_mm512_loadu_si512(y + i));
  }
  if (i < n) {
    const __mmask32 tail = static_cast<__mmask32>((uint64_t(1) << (n - i)) - 1);
    acc = _mm512_dpbf16_ps(acc, (__m512bh)_mm512_maskz_loadu_epi16(tail, x + i),
                           (__m512bh)_mm512_maskz_loadu_epi16(tail, y + i));
  }
  return _mm512_reduce_add_ps(acc);
}

// The most query rows whose accumulators bf16_weighted_rows keeps in registers (a beam's rows); more take the
// widening loop.
constexpr int64_t kPairRows = 8;

// out [R, Ev] = Σ_s w[r][s] values[s] over `positions`, the weights w [R, S] rounded to bf16 (as a bf16 matrix
// product takes them) and the value rows bf16 as stored: the rows of two positions interleaved in registers
// (unpacklo/hi of 16-bit lanes: a pair of values per 32-bit lane) and multiplied by the two positions' weights
// with AVX512-BF16's pair products, float32 accumulators for a block of 32 columns of every row, put back in
// column order once per block. R <= kPairRows. pair_w: R * ceil(|positions| / 2) words of scratch.
inline void bf16_weighted_rows(const float* w, int64_t S, const c10::BFloat16* values,
                               const std::vector<int64_t>& positions, int64_t R, int64_t Ev, float* out,
                               uint32_t* pair_w) {
  const int64_t n = static_cast<int64_t>(positions.size()), pairs = (n + 1) / 2;
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t p = 0; p < pairs; ++p) {
      const uint32_t lo = bf16::round_bits(w[r * S + positions[2 * p]]);
      const uint32_t hi = 2 * p + 1 < n ? bf16::round_bits(w[r * S + positions[2 * p + 1]]) : 0u;
      pair_w[r * pairs + p] = lo | (hi << 16);
    }
  }
  // Lane e of the low unpack holds column 8 (e / 4) + e % 4 of the block, of the high one that plus 4: column c
  // of the block's first 16 is lane (c / 8) * 4 + c % 8 of the low (c % 8 < 4) or high (16 + ...) unpack.
  alignas(64) static constexpr int32_t kFirst[16] = {0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23};
  alignas(64) static constexpr int32_t kSecond[16] = {8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31};
  const __m512i to_first = _mm512_load_si512(kFirst), to_second = _mm512_load_si512(kSecond);
  const uint16_t* v = bf16::bits(values);
  for (int64_t c = 0; c < Ev; c += 32) {
    const int64_t width = std::min<int64_t>(32, Ev - c);
    const __mmask32 cols = static_cast<__mmask32>(width == 32 ? ~uint64_t(0) : (uint64_t(1) << width) - 1);
    __m512 acc_lo[kPairRows], acc_hi[kPairRows];
    for (int64_t r = 0; r < R; ++r) acc_lo[r] = acc_hi[r] = _mm512_setzero_ps();
    for (int64_t p = 0; p < pairs; ++p) {
      const __m512i a = _mm512_maskz_loadu_epi16(cols, v + positions[2 * p] * Ev + c);
      const __m512i b = 2 * p + 1 < n ? _mm512_maskz_loadu_epi16(cols, v + positions[2 * p + 1] * Ev + c)
                                      : _mm512_setzero_si512();
      const __m512bh lo = (__m512bh)_mm512_unpacklo_epi16(a, b), hi = (__m512bh)_mm512_unpackhi_epi16(a, b);
      for (int64_t r = 0; r < R; ++r) {
        const __m512bh wp = (__m512bh)_mm512_set1_epi32(static_cast<int32_t>(pair_w[r * pairs + p]));
        acc_lo[r] = _mm512_dpbf16_ps(acc_lo[r], wp, lo);
        acc_hi[r] = _mm512_dpbf16_ps(acc_hi[r], wp, hi);
      }
    }
    const __mmask16 head = static_cast<__mmask16>(cols), tail = static_cast<__mmask16>(cols >> 16);
    for (int64_t r = 0; r < R; ++r) {
      _mm512_mask_storeu_ps(out + r * Ev + c, head, _mm512_permutex2var_ps(acc_lo[r], to_first, acc_hi[r]));
      if (width > 16) {
        _mm512_mask_storeu_ps(out + r * Ev + c + 16, tail, _mm512_permutex2var_ps(acc_lo[r], to_second, acc_hi[r]));
      }
    }
  }
}
#else
constexpr bool kBf16Dot = false;
constexpr int64_t kPairRows = 0;
inline void bf16_weighted_rows(const float*, int64_t, const c10::BFloat16*, const std::vector<int64_t>&, int64_t,
                               int64_t, float*, uint32_t*) {}
#endif

inline float widened(c10::BFloat16 v) { return bf16::to_float(v.x); }
template <typename T>
inline T widened(T v) {
  return v;
}

// The row of scratch attend_sentence uses: a widened key or value row, or the bf16 weights in pairs.
inline int64_t row_scratch(int64_t R, int64_t S, int64_t E, int64_t Ev) {
  return std::max({E, Ev, R * ((S + 1) / 2)});
}

// One sentence: q [R, E], keys [S, E], values [S, Ev] as stored (In: T itself, or bf16 read as float32; q_wide:
// q as T, unread where bf16 scores are AVX512-BF16 pair products); `positions` the unmasked positions; bias rows
// bias_stride apart (0: one row for all) or null. Writes weights [R, S] and out [R, Ev] in T. work:
// row_scratch + R values. Each key and value row is read (and a bf16 one widened, into work) once for all R query
// rows; each row's sums run in the same order whatever R is.
template <typename T, typename In>
void attend_sentence(const In* q, const T* q_wide, const In* keys, const In* values, const In* bias,
                     int64_t bias_stride, T scale, const std::vector<int64_t>& positions, int64_t R, int64_t S,
                     int64_t E, int64_t Ev, T* weights, T* out, T* work) {
  std::fill(weights, weights + R * S, T(0));
  std::fill(out, out + R * Ev, T(0));
  if (positions.empty()) return;  // nothing to attend to: zero weights, zero output
  T* row = work;
  T* inv = work + row_scratch(R, S, E, Ev);
  for (const int64_t s : positions) {
    const In* key = keys + s * E;
    const T* k = kBf16Dot && !std::is_same_v<In, T> ? nullptr : row_as(key, E, row);
    for (int64_t r = 0; r < R; ++r) {
      T qk;
      if constexpr (kBf16Dot && !std::is_same_v<In, T>) {
        qk = bf16_dot(q + r * E, key, E);
      } else {
        qk = dot(q_wide + r * E, k, E);
      }
      weights[r * S + s] = scale * qk + (bias == nullptr ? T(0) : widened(bias[r * bias_stride + s]));
    }
  }
  for (int64_t r = 0; r < R; ++r) {
    T* wr = weights + r * S;
    T top = -std::numeric_limits<T>::infinity();
    for (const int64_t s : positions) top = max_of(top, wr[s]);
    T sum = 0;
    for (const int64_t s : positions) {
      wr[s] = vec_exp(wr[s] - top);
      sum += wr[s];
    }
    inv[r] = T(1) / sum;
  }
  if constexpr (kBf16Dot && !std::is_same_v<In, T>) {
    if (R <= kPairRows) {
      for (int64_t r = 0; r < R; ++r) {
        for (const int64_t s : positions) weights[r * S + s] *= inv[r];
      }
      bf16_weighted_rows(weights, S, values, positions, R, Ev, out, reinterpret_cast<uint32_t*>(row));
      return;
    }
  }
  for (const int64_t s : positions) {
    const T* v = row_as(values + s * Ev, Ev, row);
    for (int64_t r = 0; r < R; ++r) {
      const T w = weights[r * S + s] * inv[r];
      weights[r * S + s] = w;
      T* o = out + r * Ev;
      for (int64_t c = 0; c < Ev; ++c) o[c] += w * v[c];
    }
  }
}

// attend_sentence on one sentence as stored: float32 or float64 in place; bf16 with its query rows widened into
// `scratch` (float32, grown as needed) and its weights and output computed there, rounded as they are stored.
template <typename St, typename T>
void attend_stored(const St* q, const St* keys, const St* values, const St* bias, int64_t bias_stride,
                   double scale, const std::vector<int64_t>& positions, int64_t R, int64_t S, int64_t E, int64_t Ev,
                   St* weights, St* out, std::vector<T>& scratch) {
  const int64_t work = row_scratch(R, S, E, Ev) + R;
  if constexpr (std::is_same_v<St, c10::BFloat16>) {
    scratch.resize(work + R * E + R * S + R * Ev);
    float* fq = scratch.data() + work;
    float* fw = fq + R * E;
    float* fo = fw + R * S;
    if (!kBf16Dot) bf16::widen_row(q, R * E, fq);
    attend_sentence<float, St>(q, fq, keys, values, bias, bias_stride, static_cast<float>(scale), positions, R, S,
                               E, Ev, fw, fo, scratch.data());
    bf16::narrow_row(fw, R * S, weights);
    bf16::narrow_row(fo, R * Ev, out);
  } else {
    scratch.resize(work);
    attend_sentence<St, St>(q, q, keys, values, bias, bias_stride, static_cast<St>(scale), positions, R, S, E, Ev,
                            weights, out, scratch.data());
  }
}

void check_operand(const char* name, const at::Tensor& t, const at::Tensor& q) {
  check_cpu_float(kOp, name, t);
  FASTQA_CHECK(t.scalar_type() == q.scalar_type(), kOp, name, " must have q's dtype ", q.scalar_type(), ", got ",
               t.scalar_type());
}

std::tuple<at::Tensor, at::Tensor> decode_attention(const at::Tensor& q, const at::Tensor& keys,
                                                    const at::Tensor& values, const std::optional<at::Tensor>& bias,
                                                    const std::optional<at::Tensor>& mask, double scale) {
  check_cpu_float(kOp, "q", q);
  check_operand("keys", keys, q);
  check_operand("values", values, q);
  FASTQA_CHECK(q.dim() == 3 && keys.dim() == 3 && values.dim() == 3, kOp,
               "q, keys and values must be [B, R, E], [B, S, E], [B, S, Ev]; got ", q.sizes(), ", ", keys.sizes(),
               ", ", values.sizes());
  const int64_t B = q.size(0), R = q.size(1), E = q.size(2), S = keys.size(1), Ev = values.size(2);
  FASTQA_CHECK(keys.size(0) == B && keys.size(2) == E, kOp, "keys must be [B, S, E] = [", B, ", S, ", E, "], got ",
               keys.sizes());
  FASTQA_CHECK(values.size(0) == B && values.size(1) == S, kOp, "values must be [B, S, Ev] = [", B, ", ", S,
               ", Ev], got ", values.sizes());
  at::Tensor bias_c;
  int64_t bias_stride = 0;
  if (bias.has_value()) {
    check_operand("bias", *bias, q);
    FASTQA_CHECK(bias->dim() == 3 && bias->size(0) == B && (bias->size(1) == 1 || bias->size(1) == R) &&
                     bias->size(2) == S,
                 kOp, "bias must be [B, 1, S] or [B, R, S] = [", B, ", 1 or ", R, ", ", S, "], got ", bias->sizes());
    bias_c = bias->contiguous();
    bias_stride = bias->size(1) == 1 ? 0 : S;
  }
  at::Tensor mask_c;
  if (mask.has_value()) {
    FASTQA_CHECK(mask->scalar_type() == at::kBool && mask->device().is_cpu() && mask->dim() == 2 &&
                     mask->size(0) == B && mask->size(1) == S,
                 kOp, "mask must be a [B, S] = [", B, ", ", S, "] bool CPU tensor, got ", mask->sizes(), " ",
                 mask->scalar_type());
    mask_c = mask->contiguous();
  }
  const at::Tensor q_c = q.contiguous(), keys_c = keys.contiguous(), values_c = values.contiguous();
  at::Tensor out = at::empty({B, R, Ev}, q.options());
  at::Tensor weights = at::empty({B, R, S}, q.options());
  if (B == 0 || R == 0 || S == 0) return {out.zero_(), weights};
  // Sentences per work item: enough reading (keys + values) that a thread's fork/join is paid for.
  const int64_t grain = std::max<int64_t>(1, 32768 / (S * (E + Ev)));
  const int64_t bias_rows = bias_stride == 0 ? 1 : R;
  const bool* md = mask_c.defined() ? mask_c.data_ptr<bool>() : nullptr;
  // St: the dtype as stored (float, double or bf16); the sentences are attended in float32 or float64.
  const auto run = [&](auto stored) {
    using St = decltype(stored);
    const St* qd = q_c.data_ptr<St>();
    const St* kd = keys_c.data_ptr<St>();
    const St* vd = values_c.data_ptr<St>();
    const St* bd = bias_c.defined() ? bias_c.data_ptr<St>() : nullptr;
    St* wd = weights.data_ptr<St>();
    St* od = out.data_ptr<St>();
    at::parallel_for(0, B, grain, [&](int64_t b0, int64_t b1) {
      std::vector<int64_t> positions;
      positions.reserve(S);
      std::vector<std::conditional_t<std::is_same_v<St, c10::BFloat16>, float, St>> scratch;
      for (int64_t b = b0; b < b1; ++b) {
        positions.clear();
        for (int64_t j = 0; j < S; ++j) {
          if (md == nullptr || md[b * S + j]) positions.push_back(j);
        }
        attend_stored<St>(qd + b * R * E, kd + b * S * E, vd + b * S * Ev,
                          bd == nullptr ? nullptr : bd + b * bias_rows * S, bias_stride, scale, positions, R, S, E,
                          Ev, wd + b * R * S, od + b * R * Ev, scratch);
      }
    });
  };
  if (bf16::is_bf16(q)) {
    run(c10::BFloat16{});
  } else {
    AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "decode_attention", [&] { run(scalar_t{}); });
  }
  return {out, weights};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(fastqa, m) {
  FASTQA_CPU_OP(m, decode_attention,
                "(Tensor q, Tensor keys, Tensor values, Tensor? bias, Tensor? mask, float scale) "
                "-> (Tensor out, Tensor weights)");
}

}  // namespace fastqa
