// Dropout of a sublayer's output added to its residual, in one pass, with the mask drawn from a seed:
//
//   fastqa::dropout_add(branch [B, ...], residual [B, ...]?, example_scale [B]?, p, seed [1]) -> out [B, ...]
//   out = residual + branch * keep(seed, i) / (1 - p') * example_scale[b]      (i: branch's element index)
//
// seed is a one-element int64 tensor, not a scalar argument: a model draws it on its device with the device's
// generator, so no host read (a GPU sync) happens per call, and a captured or compiled step reads each call's
// fresh seed rather than a constant baked into the graph.
//
// keep(seed, i) is a counter-based hash of (seed, i), so nothing is stored between the forward and the
// backward: grad_branch is this op on grad_out with the same seed (and no residual), grad_residual is
// grad_out. With torch's generator (torch.rand < 1 - p, then where, then an add), a QANet train step spent
// about a tenth of its time drawing, storing and applying masks.
//
// The hash, which fastqa/reference/dropout_add.py computes with torch integer ops bit for bit: element
// pair j = i / 2 (int64) takes h = mix(mix((j mod 2^32) xor s0) xor s1 xor (j div 2^32)), s0 and s1 the
// seed's low and high 32 bits, mix the 32-bit "lowbias32" integer hash (shifts 16, 15, 15; odd multipliers
// 0x21f0aaad, 0x735a2d97, both below 2^31 so that the reference's int64 products never overflow). Element
// 2j reads h's low 16 bits, element 2j + 1 its high 16 bits: u16; it is kept when u16 >= drop =
// round(p * 65536), so p' = drop / 65536 (p quantised to 1/65536).
//
// bfloat16: read and written as it is (an elementwise op gains nothing from a widened copy), each element
// computed in float32 and rounded to nearest even when stored. The mask is the same for every dtype: it
// depends on the seed and the element index only.
#include "common.h"
#include "cpu/bf16_rows.h"

#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

namespace fastqa {
namespace {

constexpr const char* kOp = "fastqa::dropout_add";

inline uint32_t mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x21f0aaadu;
  x ^= x >> 15;
  x *= 0x735a2d97u;
  x ^= x >> 15;
  return x;
}

// bf16 storage as its raw bits (bf16_rows.h): a plain integer type, loaded and stored in vector registers.
using Bf16Bits = uint16_t;

inline float value_of(Bf16Bits bits) { return bf16::to_float(bits); }
inline float value_of(float v) { return v; }
inline double value_of(double v) { return v; }

// A value as the storage type S holds it: itself for float and double, rounded to nearest even for bf16.
template <typename S, typename T>
inline S stored(T v) {
  if constexpr (std::is_same_v<S, Bf16Bits>) {
    return bf16::round_bits(v);
  } else {
    return v;
  }
}

// Element pairs per inner chunk: their hashes (a plain loop GCC vectorises) fit in L1 next to the data.
constexpr int64_t kPairs = 512;

// No multiply-add contraction: residual + product rounds twice, as the reference (two torch ops) does.
// S: the storage type (float, double or Bf16Bits); T: the type each element is computed in (S, or float).
template <typename S, typename T>
__attribute__((optimize("fp-contract=off"))) void dropout_add_range(const S* branch, const S* residual, const S* example_scale, S* out, int64_t begin,
                       int64_t end, int64_t inner, uint32_t drop, T keep_scale, uint32_t s0, uint32_t s1) {
  alignas(64) uint32_t hashes[kPairs];
  alignas(64) T factor[2 * kPairs];
  // Chunks start at even element indices, so pair j covers elements 2j and 2j + 1 of the chunk.
  for (int64_t c0 = begin; c0 < end; c0 += 2 * kPairs) {
    const int64_t c1 = std::min(end, c0 + 2 * kPairs);
    const int64_t j0 = c0 / 2, pairs = (c1 - c0 + 1) / 2;
    for (int64_t t = 0; t < pairs; ++t) {
      const uint64_t j = static_cast<uint64_t>(j0 + t);
      hashes[t] = mix32(mix32(static_cast<uint32_t>(j) ^ s0) ^ s1 ^ static_cast<uint32_t>(j >> 32));
    }
    // Element 2j draws the low 16 bits of pair j's hash, element 2j + 1 the high ones (a chunk with an
    // odd length fills one factor past its end: unused).
    for (int64_t t = 0; t < pairs; ++t) {
      factor[2 * t] = (hashes[t] & 0xFFFFu) >= drop ? keep_scale : T(0);
      factor[2 * t + 1] = (hashes[t] >> 16) >= drop ? keep_scale : T(0);
    }
    // A chunk crosses at most a few example boundaries: split it there for the per-example scale.
    for (int64_t e0 = c0; e0 < c1;) {
      const int64_t b = e0 / inner;
      const int64_t e1 = std::min(c1, (b + 1) * inner);
      const T s = example_scale == nullptr ? T(1) : value_of(example_scale[b]);
      const T* f = factor + (e0 - c0);
      const S* br = branch + e0;
      S* o = out + e0;
      const int64_t len = e1 - e0;
      if (residual == nullptr) {
        for (int64_t t = 0; t < len; ++t) o[t] = stored<S>(value_of(br[t]) * (f[t] * s));
      } else {
        const S* r = residual + e0;
        for (int64_t t = 0; t < len; ++t) o[t] = stored<S>(value_of(r[t]) + value_of(br[t]) * (f[t] * s));
      }
      e0 = e1;
    }
  }
}

at::Tensor dropout_add(const at::Tensor& branch, const c10::optional<at::Tensor>& residual,
                       const c10::optional<at::Tensor>& example_scale, double p, const at::Tensor& seed_tensor) {
  check_cpu_float(kOp, "branch", branch);
  FASTQA_CHECK(seed_tensor.device().is_cpu() && seed_tensor.scalar_type() == at::kLong && seed_tensor.numel() == 1,
               kOp, "seed must be a one-element int64 CPU tensor, got ", seed_tensor.scalar_type(), " ",
               seed_tensor.sizes(), " on ", seed_tensor.device());
  const int64_t seed = *seed_tensor.data_ptr<int64_t>();
  FASTQA_CHECK(branch.dim() >= 1, kOp, "branch must have a batch dimension");
  FASTQA_CHECK(p >= 0.0 && p <= 1.0, kOp, "p must be in [0, 1], got ", p);
  const bool has_residual = residual.has_value() && residual->defined();
  const bool has_scale = example_scale.has_value() && example_scale->defined();
  if (has_residual) {
    FASTQA_CHECK(residual->sizes() == branch.sizes(), kOp, "residual must have branch's shape ", branch.sizes(),
                 ", got ", residual->sizes());
    FASTQA_CHECK(residual->scalar_type() == branch.scalar_type(), kOp, "residual must have branch's dtype");
  }
  if (has_scale) {
    FASTQA_CHECK(example_scale->dim() == 1 && example_scale->size(0) == branch.size(0), kOp,
                 "example_scale must be [", branch.size(0), "], got ", example_scale->sizes());
    FASTQA_CHECK(example_scale->scalar_type() == branch.scalar_type(), kOp, "example_scale must have branch's dtype");
  }
  const at::Tensor br = branch.contiguous();
  const at::Tensor res = has_residual ? residual->contiguous() : at::Tensor();
  const at::Tensor scale = has_scale ? example_scale->contiguous() : at::Tensor();
  at::Tensor out = at::empty(branch.sizes(), branch.options());
  const int64_t numel = br.numel();
  if (numel == 0) return out;
  const int64_t inner = numel / branch.size(0);
  const uint32_t drop = static_cast<uint32_t>(std::nearbyint(p * 65536.0));
  const uint32_t s0 = static_cast<uint32_t>(static_cast<uint64_t>(seed)),
                 s1 = static_cast<uint32_t>(static_cast<uint64_t>(seed) >> 32);
  // S: how the dtype is stored (bf16 as its raw bits); T: what each element is computed in.
  const auto run = [&](auto storage, auto compute) {
    using S = decltype(storage);
    using T = decltype(compute);
    // drop = 65536 (p = 1) keeps nothing: the factor is never used, so no division by zero matters.
    const T keep_scale = drop >= 65536u ? T(0) : T(65536.0 / (65536.0 - drop));
    const auto data = [](const at::Tensor& t) { return t.defined() ? static_cast<S*>(t.data_ptr()) : nullptr; };
    const S* bd = data(br);
    const S* rd = data(res);
    const S* sd = data(scale);
    S* od = data(out);
    // Work items of whole even-aligned chunks (a pair's two elements in one item).
    const int64_t chunk = 2 * kPairs;
    at::parallel_for(0, ceil_div(numel, chunk), 16, [&](int64_t a, int64_t b) {
      dropout_add_range<S, T>(bd, rd, sd, od, a * chunk, std::min(numel, b * chunk), inner, drop, keep_scale, s0, s1);
    });
  };
  if (br.scalar_type() == at::kBFloat16) {
    run(Bf16Bits{}, float{});
  } else {
    AT_DISPATCH_FLOATING_TYPES(br.scalar_type(), "dropout_add", [&] { run(scalar_t{}, scalar_t{}); });
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(fastqa, m) {
  FASTQA_CPU_OP(m, dropout_add, "(Tensor branch, Tensor? residual, Tensor? example_scale, float p, Tensor seed) -> Tensor");
}

}  // namespace fastqa
