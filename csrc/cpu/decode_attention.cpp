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
// bfloat16 (csrc/cpu/bf16.h): each sentence's q, keys, values and bias rows are widened into its thread's
// float32 scratch, attended there by the float32 routine, and its weights and output rounded into the bf16
// results -- no widened copy of the whole memory (which cost more than the attention: the memory is read once
// per step). Its products are its own float32 loops (one query row at a time: no GEMM for a bf16 engine).
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

// One sentence: q [R, E], keys [S, E], values [S, Ev]; `positions` the unmasked positions; bias rows
// bias_stride apart (0: one row for all) or null. Writes weights [R, S] and out [R, Ev].
template <typename T>
void attend_sentence(const T* q, const T* keys, const T* values, const T* bias, int64_t bias_stride, T scale,
                     const std::vector<int64_t>& positions, int64_t R, int64_t S, int64_t E, int64_t Ev, T* weights,
                     T* out) {
  for (int64_t r = 0; r < R; ++r) {
    T* wr = weights + r * S;
    T* o = out + r * Ev;
    std::fill(wr, wr + S, T(0));
    std::fill(o, o + Ev, T(0));
    if (positions.empty()) continue;  // nothing to attend to: zero weights, zero output
    const T* qr = q + r * E;
    const T* br = bias == nullptr ? nullptr : bias + r * bias_stride;
    T top = -std::numeric_limits<T>::infinity();
    for (const int64_t s : positions) {
      wr[s] = scale * dot(qr, keys + s * E, E) + (br == nullptr ? T(0) : br[s]);
      top = max_of(top, wr[s]);
    }
    T sum = 0;
    for (const int64_t s : positions) {
      wr[s] = vec_exp(wr[s] - top);
      sum += wr[s];
    }
    const T inv = T(1) / sum;
    for (const int64_t s : positions) {
      const T w = wr[s] * inv;
      wr[s] = w;
      const T* v = values + s * Ev;
      for (int64_t c = 0; c < Ev; ++c) o[c] += w * v[c];
    }
  }
}

// attend_sentence on one sentence as stored: float32 or float64 in place; bf16 (bias_rows bias rows) widened into
// `scratch` (float32, grown as needed), attended there, its weights and output rounded as they are stored.
template <typename St>
void attend_stored(const St* q, const St* keys, const St* values, const St* bias, int64_t bias_stride,
                   int64_t bias_rows, double scale, const std::vector<int64_t>& positions, int64_t R, int64_t S,
                   int64_t E, int64_t Ev, St* weights, St* out, std::vector<float>& scratch) {
  if constexpr (std::is_same_v<St, c10::BFloat16>) {
    scratch.resize(R * E + S * E + S * Ev + bias_rows * S + R * S + R * Ev);
    float* fq = scratch.data();
    float* fk = fq + R * E;
    float* fv = fk + S * E;
    float* fb = fv + S * Ev;
    float* fw = fb + bias_rows * S;
    float* fo = fw + R * S;
    bf16::widen_row(q, R * E, fq);
    bf16::widen_row(keys, S * E, fk);
    bf16::widen_row(values, S * Ev, fv);
    if (bias != nullptr) bf16::widen_row(bias, bias_rows * S, fb);
    attend_sentence<float>(fq, fk, fv, bias == nullptr ? nullptr : fb, bias_stride, static_cast<float>(scale),
                           positions, R, S, E, Ev, fw, fo);
    bf16::narrow_row(fw, R * S, weights);
    bf16::narrow_row(fo, R * Ev, out);
  } else {
    attend_sentence<St>(q, keys, values, bias, bias_stride, static_cast<St>(scale), positions, R, S, E, Ev, weights,
                        out);
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
      std::vector<float> scratch;
      for (int64_t b = b0; b < b1; ++b) {
        positions.clear();
        for (int64_t j = 0; j < S; ++j) {
          if (md == nullptr || md[b * S + j]) positions.push_back(j);
        }
        attend_stored<St>(qd + b * R * E, kd + b * S * E, vd + b * S * Ev,
                          bd == nullptr ? nullptr : bd + b * bias_rows * S, bias_stride, bias_rows, scale, positions,
                          R, S, E, Ev, wd + b * R * S, od + b * R * Ev, scratch);
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
  m.def(
      "decode_attention(Tensor q, Tensor keys, Tensor values, Tensor? bias, Tensor? mask, float scale) "
      "-> (Tensor out, Tensor weights)");
}

TORCH_LIBRARY_IMPL(fastqa, CPU, m) { m.impl("decode_attention", &decode_attention); }

}  // namespace fastqa
