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
  if (bf16::is_bf16(q)) {
    using BF = c10::BFloat16;
    const BF* qd = q_c.data_ptr<BF>();
    const BF* kd = keys_c.data_ptr<BF>();
    const BF* vd = values_c.data_ptr<BF>();
    const BF* bd = bias_c.defined() ? bias_c.data_ptr<BF>() : nullptr;
    const bool* md = mask_c.defined() ? mask_c.data_ptr<bool>() : nullptr;
    BF* wd = weights.data_ptr<BF>();
    BF* od = out.data_ptr<BF>();
    const int64_t bias_rows = bias_stride == 0 ? 1 : R;
    at::parallel_for(0, B, grain, [&](int64_t b0, int64_t b1) {
      std::vector<int64_t> positions;
      positions.reserve(S);
      // One sentence in float32: q [R, E], keys [S, E], values [S, Ev], bias rows, weights [R, S], out [R, Ev].
      std::vector<float> fq(R * E), fk(S * E), fv(S * Ev), fb(bias_rows * S), fw(R * S), fo(R * Ev);
      for (int64_t b = b0; b < b1; ++b) {
        positions.clear();
        for (int64_t j = 0; j < S; ++j) {
          if (md == nullptr || md[b * S + j]) positions.push_back(j);
        }
        bf16::widen_row(qd + b * R * E, R * E, fq.data());
        bf16::widen_row(kd + b * S * E, S * E, fk.data());
        bf16::widen_row(vd + b * S * Ev, S * Ev, fv.data());
        if (bd != nullptr) bf16::widen_row(bd + b * bias_rows * S, bias_rows * S, fb.data());
        attend_sentence<float>(fq.data(), fk.data(), fv.data(), bd == nullptr ? nullptr : fb.data(), bias_stride,
                               static_cast<float>(scale), positions, R, S, E, Ev, fw.data(), fo.data());
        bf16::narrow_row(fw.data(), R * S, wd + b * R * S);
        bf16::narrow_row(fo.data(), R * Ev, od + b * R * Ev);
      }
    });
    return {out, weights};
  }
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "decode_attention", [&] {
    const scalar_t* qd = q_c.data_ptr<scalar_t>();
    const scalar_t* kd = keys_c.data_ptr<scalar_t>();
    const scalar_t* vd = values_c.data_ptr<scalar_t>();
    const scalar_t* bd = bias_c.defined() ? bias_c.data_ptr<scalar_t>() : nullptr;
    const bool* md = mask_c.defined() ? mask_c.data_ptr<bool>() : nullptr;
    scalar_t* wd = weights.data_ptr<scalar_t>();
    scalar_t* od = out.data_ptr<scalar_t>();
    const scalar_t s = static_cast<scalar_t>(scale);
    const int64_t bias_rows = bias_stride == 0 ? 1 : R;
    at::parallel_for(0, B, grain, [&](int64_t b0, int64_t b1) {
      std::vector<int64_t> positions;
      positions.reserve(S);
      for (int64_t b = b0; b < b1; ++b) {
        positions.clear();
        for (int64_t j = 0; j < S; ++j) {
          if (md == nullptr || md[b * S + j]) positions.push_back(j);
        }
        attend_sentence<scalar_t>(qd + b * R * E, kd + b * S * E, vd + b * S * Ev,
                                  bd == nullptr ? nullptr : bd + b * bias_rows * S, bias_stride, s, positions, R, S,
                                  E, Ev, wd + b * R * S, od + b * R * Ev);
      }
    });
  });
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
