// Linear map y = x Wᵀ + b on the CPU GEMM entry point (csrc/cpu/gemm.h): nn.Linear, with each of its
// three products (forward, grad_x, grad_weight) run by the engine measured fastest for its shape.
//
// Why an op for a plain GEMM: torch's nn.Linear always calls BLAS (MKL), and on some processors and
// shapes oneDNN -- which torch ships too -- is up to 2x faster (a vocabulary projection on an AMD EPYC,
// for one). The models' large projections (ConvS2S's output layer,
// QANet's feed-forward layers) go through here; gemm::linear measures each shape once and keeps the faster.
//
// Shapes: x [..., K] (any leading dimensions, any strides), weight [N, K], bias [N] or None -> y [..., N].
// dtypes: float32, float64 or bfloat16 (the products on the bf16 engine, see csrc/cpu/bf16.h); with bf16 x the
// weight and bias may be float32 (the master weights under autocast), their gradients then float32.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <array>
#include <functional>
#include <limits>
#include <set>
#include <tuple>
#include <vector>

#include "cpu/bf16.h"
#include "cpu/bf16_rows.h"
#include "cpu/common.h"
#include "cpu/gemm.h"

namespace fastqa {
namespace {

constexpr const char* kFwd = "fastqa::linear_fwd";
constexpr const char* kBwd = "fastqa::linear_bwd";
constexpr const char* kArgmax = "fastqa::linear_argmax";

void check_operands(const char* op, const at::Tensor& x, const at::Tensor& weight) {
  FASTQA_CHECK(x.dim() >= 1, op, "x must have at least one dimension");
  FASTQA_CHECK(weight.dim() == 2, op, "weight must be [N, K], got ", weight.sizes());
  FASTQA_CHECK(x.size(-1) == weight.size(1), op, "x's last dimension (", x.size(-1), ") must equal weight.shape[1] (",
               weight.size(1), ")");
  FASTQA_CHECK(bf16::param_dtype_ok(weight, x), op, "weight must have x's dtype (", x.scalar_type(),
               ") or, with bfloat16 x, float32; got ", weight.scalar_type());
}

void check_bias(const char* op, const c10::optional<at::Tensor>& bias, const at::Tensor& x, int64_t n) {
  if (bias.has_value() && bias->defined()) {
    FASTQA_CHECK(bias->dim() == 1 && bias->size(0) == n, op, "bias must be [", n, "], got ", bias->sizes());
    FASTQA_CHECK(bf16::param_dtype_ok(*bias, x), op, "bias must have x's dtype (", x.scalar_type(),
                 ") or, with bfloat16 x, float32; got ", bias->scalar_type());
  }
}

// A float32 parameter taken with bf16 x, in x's dtype for the bf16 product: rounded inside the kernel (what casting
// it before the call gives, bit for bit, without a copy the dispatcher sees), once per parameter value -- the calls
// of a step that share a weight (its forward and grad_x, a layer applied several times) share the rounded copy.
at::Tensor as_x(const at::Tensor& param, const at::Tensor& x) {
  if (param.scalar_type() == x.scalar_type()) return param;
  return gemm::packed_weight(param, "linear bf16", [&] { return param.to(x.scalar_type()); });
}
c10::optional<at::Tensor> as_x(const c10::optional<at::Tensor>& param, const at::Tensor& x) {
  if (!param.has_value() || !param->defined()) return c10::nullopt;
  return as_x(*param, x);
}

// The bf16 products y = x Wᵀ + b and grad_x = grad_y W each have two routes, chosen per shape class by measuring
// once per process (gemm::route_for, ops "linear_fwd" and "linear_bwd_x"):
//   native -- bf16 rows times the weight packed once per weight value on the bf16 micro-kernel (gemm::bf16_nt),
//             float32 sums, the bias added in float32 (a float32 bias as it is), each value rounded to bf16 once;
//   widen  -- the name the plan records for the other route, torch's bf16 GEMM (at::mm on the bf16 operands) rounded
//             to bf16, the bias (rounded to bf16) added after: the op's route before the micro-kernel, and its only
//             one where the micro-kernel does not take bf16. Nothing is widened on it: the operands are bf16 already.
bool native_usable(const at::Tensor& a, int64_t r, int64_t c) {
  return bf16::is_bf16(a) && a.size(0) > 0 && r > 0 && c > 0 && gemm::bf16_brgemm_usable();
}

gemm::Route bf16_route(const char* op, int64_t m, int64_t r, int64_t c, const std::function<void(gemm::Route)>& run) {
  return gemm::route_for(op, gemm::shape_class({{"M", m}, {"R", r}, {"C", c}}), run);
}

// y = x2 Wᵀ + b for bf16 x2 [M, K]: on the route measured faster for the shape class (see above).
at::Tensor bf16_forward(const at::Tensor& x2, const at::Tensor& weight, const c10::optional<at::Tensor>& bias) {
  const int64_t m = x2.size(0), n = weight.size(0), k = weight.size(1);
  const auto run = [&](gemm::Route route) {
    if (route == gemm::Route::kWiden) return gemm::linear(x2, as_x(weight, x2), as_x(bias, x2));
    const at::Tensor packed =
        gemm::packed_weight(weight, "linear nt", [&] { return gemm::pack_nt(weight); });
    const at::Tensor b = bias.has_value() && bias->defined() ? bias->to(at::kFloat).contiguous() : at::Tensor();
    return gemm::bf16_nt(x2, packed, n, b.defined() ? b.data_ptr<float>() : nullptr);
  };
  if (!native_usable(x2, k, n)) return run(gemm::Route::kWiden);
  return run(bf16_route("linear_fwd", m, k, n, [&](gemm::Route r) { (void)run(r); }));
}

// grad_x = g W for bf16 g [M, N]: the weight packed the other way (its transpose), on the route measured faster.
at::Tensor bf16_input_grad(const at::Tensor& g, const at::Tensor& weight) {
  const int64_t m = g.size(0), n = weight.size(0), k = weight.size(1);
  const auto run = [&](gemm::Route route) {
    if (route == gemm::Route::kWiden) return gemm::linear(g, as_x(weight, g).t(), c10::nullopt);
    const at::Tensor packed =
        gemm::packed_weight(weight, "linear nt t", [&] { return gemm::pack_nt(weight.t()); });
    return gemm::bf16_nt(g, packed, k, nullptr);
  };
  if (!native_usable(g, n, k)) return run(gemm::Route::kWiden);
  return run(bf16_route("linear_bwd_x", m, n, k, [&](gemm::Route r) { (void)run(r); }));
}

// [..., n] sizes of x with its last dimension replaced by n.
std::vector<int64_t> with_last(const at::Tensor& x, int64_t n) {
  std::vector<int64_t> sizes = x.sizes().vec();
  sizes.back() = n;
  return sizes;
}

at::Tensor linear_fwd(const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& bias) {
  check_operands(kFwd, x, weight);
  const int64_t n = weight.size(0), k = weight.size(1);
  check_bias(kFwd, bias, x, n);
  gemm::prepare();
  const at::Tensor x2 = x.reshape({-1, k});
  const at::Tensor y = bf16::is_bf16(x) ? bf16_forward(x2, weight, bias) : gemm::linear(x2, weight, bias);
  return y.view(with_last(x, n));
}

// grad_weight = grad_yᵀ x in float32 from bf16 operands: the exact products summed in float32, on the bf16
// micro-kernel with float32 sums (native, gemm::bf16_tn_float) or a float32 GEMM on widened copies (widen),
// whichever measures faster for the shape class (gemm::route_for; they differ only in the order of the sums).
at::Tensor bf16_weight_grad(const at::Tensor& g, const at::Tensor& x2) {
  const auto run = [&](gemm::Route route) {
    return route == gemm::Route::kNative ? gemm::bf16_tn_float(g, x2)
                                         : gemm::linear(bf16::widen(g).t(), bf16::widen(x2).t(), c10::nullopt);
  };
  // Only one route where the micro-kernel is not usable (or an operand is not bf16): nothing to measure.
  if (!bf16::is_bf16(g) || !bf16::is_bf16(x2) || !gemm::bf16_brgemm_usable()) return run(gemm::Route::kWiden);
  const gemm::Route route = gemm::route_for(
      "linear_bwd_weight", gemm::shape_class({{"M", g.size(0)}, {"N", g.size(1)}, {"K", x2.size(1)}}),
      [&](gemm::Route r) { (void)run(r); });
  return run(route);
}

// Σ_rows g in float32 for bf16 g [M, N], read in place (torch's sum(dtype=float32) first widens all of g): rows in
// fixed blocks, sized from the problem alone, each summed into a float32 partial row, the partials then added in
// block order -- the same sums whatever the thread count.
at::Tensor bf16_column_sums(const at::Tensor& g_in) {
  constexpr int64_t kBlockRows = 256;
  const at::Tensor g = g_in.stride(1) == 1 ? g_in : g_in.contiguous();
  const int64_t M = g.size(0), N = g.size(1), ld = g.stride(0);
  const int64_t blocks = std::max<int64_t>(1, ceil_div(M, kBlockRows));
  at::Tensor part = at::zeros({blocks, N}, g.options().dtype(at::kFloat));
  const c10::BFloat16* gp = g.data_ptr<c10::BFloat16>();
  float* pp = part.data_ptr<float>();
  at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t r1 = std::min(M, (b + 1) * kBlockRows);
      for (int64_t r = b * kBlockRows; r < r1; ++r) bf16::add_row(gp + r * ld, N, pp + b * N);
    }
  });
  at::Tensor sums = at::zeros({N}, part.options());
  float* sp = sums.data_ptr<float>();
  for (int64_t b = 0; b < blocks; ++b) {
    for (int64_t c = 0; c < N; ++c) sp[c] += pp[b * N + c];
  }
  return sums;
}

// grad_x = grad_y W, grad_weight = grad_yᵀ x (summed over every leading position), grad_bias = Σ grad_y, each
// computed only where output_mask asks for it (absent, None, elsewhere: an input that needs no gradient, or a
// bias there is not, allocates nothing). The parameters' gradients in weight's dtype: with bf16 x and a float32
// weight, summed in float32 from the exact products of the bf16 operands (bf16_weight_grad) and returned in
// float32, never rounded to bf16 on the way.
std::tuple<c10::optional<at::Tensor>, c10::optional<at::Tensor>, c10::optional<at::Tensor>> linear_bwd(
    const at::Tensor& grad_y, const at::Tensor& x, const at::Tensor& weight, std::array<bool, 3> output_mask) {
  check_operands(kBwd, x, weight);
  const int64_t n = weight.size(0), k = weight.size(1);
  FASTQA_CHECK(grad_y.sizes() == at::IntArrayRef(with_last(x, n)), kBwd, "grad_y must be x's shape with N = ", n,
               " last, got ", grad_y.sizes());
  gemm::prepare();
  const at::Tensor g = grad_y.reshape({-1, n});
  const at::Tensor x2 = x.reshape({-1, k});
  // Both as products "a @ wᵀ" for the entry point: grad_x = g @ (Wᵀ)ᵀ, grad_weight = gᵀ @ (xᵀ)ᵀ.
  c10::optional<at::Tensor> grad_x, grad_weight, grad_bias;
  if (output_mask[0]) {
    grad_x = (bf16::is_bf16(x) ? bf16_input_grad(g, weight) : gemm::linear(g, weight.t(), c10::nullopt))
                 .view(x.sizes());
  }
  const bool wide = weight.scalar_type() != x.scalar_type();
  if (output_mask[1]) {
    grad_weight = wide ? bf16_weight_grad(g, x2) : gemm::linear(g.t(), x2.t(), c10::nullopt);
  }
  if (output_mask[2]) grad_bias = wide ? bf16_column_sums(g) : g.sum(0);
  return {grad_x, grad_weight, grad_bias};
}

// Index of the largest of row[0..n), as torch.argmax: the first one on ties, the first NaN if there is one.
// Two passes over the row (it is in L1/L2 after the GEMM): a vectorised max, then the first position that
// holds it. torch.argmax scans element by element, several times slower on a vocabulary-sized block.
template <typename T>
int64_t row_argmax(const T* row, int64_t n) {
  using S = NativeBlock<T>;
  using V = typename S::V;
  using Mask = decltype(V{} != V{});  // the integer vector a compare gives: all ones where true
  V top = V{} - std::numeric_limits<T>::infinity();
  Mask nan{};
  int64_t i = 0;
  for (; i + S::W <= n; i += S::W) {
    const V v = S::load(row + i);
    top = v > top ? v : top;
    nan |= v != v;
  }
  T best = -std::numeric_limits<T>::infinity();
  bool has_nan = false;
  for (int64_t l = 0; l < S::W; ++l) {
    best = max_of(best, top[l]);
    has_nan = has_nan || nan[l] != 0;
  }
  for (; i < n; ++i) {
    best = max_of(best, row[i]);
    has_nan = has_nan || row[i] != row[i];
  }
  for (int64_t j = 0; j < n; ++j) {
    if (has_nan ? row[j] != row[j] : row[j] == best) return j;
  }
  return 0;  // unreachable: n > 0 and best is one of the row's values
}

// argmax over the last dimension of x Wᵀ + b, the features in `exclude` never chosen: the largest logit per
// row of a vocabulary projection (greedy decoding) without torch.argmax's slow scan. Forward only (indices).
// The rule (as the reference's): the first allowed id holding the largest allowed logit, a NaN counting as the
// largest; a row whose allowed logits are all -inf gives the lowest allowed id.
at::Tensor linear_argmax(const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
                         at::IntArrayRef exclude) {
  check_operands(kArgmax, x, weight);
  const int64_t n = weight.size(0), k = weight.size(1);
  check_bias(kArgmax, bias, x, n);
  for (const int64_t e : exclude) {
    FASTQA_CHECK(e >= 0 && e < n, kArgmax, "excluded feature ", e, " is outside [0, ", n, ")");
  }
  const std::set<int64_t> excluded(exclude.begin(), exclude.end());
  FASTQA_CHECK(static_cast<int64_t>(excluded.size()) < n, kArgmax, "exclude holds every one of the ", n,
               " features");
  // A row whose allowed logits are all -inf ties with the excluded ones (set to -inf below), and the first of
  // the ties may be excluded: such a row gets the lowest allowed id instead.
  int64_t lowest_allowed = 0;
  while (excluded.count(lowest_allowed) != 0) ++lowest_allowed;
  gemm::prepare();
  // [M, n], contiguous; bf16 logits are the forward's (the same route), compared in float32.
  const at::Tensor x2 = x.reshape({-1, k});
  const at::Tensor y = bf16::is_bf16(x) ? bf16::widen(bf16_forward(x2, weight, bias)) : gemm::linear(x2, weight, bias);
  const int64_t m = y.size(0);
  std::vector<int64_t> sizes = x.sizes().vec();
  sizes.pop_back();
  at::Tensor index = at::empty({m}, x.options().dtype(at::kLong));
  int64_t* out = index.data_ptr<int64_t>();
  AT_DISPATCH_FLOATING_TYPES(y.scalar_type(), "linear_argmax", [&] {
    scalar_t* yd = y.data_ptr<scalar_t>();
    at::parallel_for(0, m, std::max<int64_t>(1, 16384 / n), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        scalar_t* row = yd + r * n;
        for (const int64_t e : exclude) row[e] = -std::numeric_limits<scalar_t>::infinity();
        const int64_t best = row_argmax(row, n);
        // The chosen logit is -inf only where no allowed one is larger (a NaN would have been chosen).
        out[r] = row[best] == -std::numeric_limits<scalar_t>::infinity() ? lowest_allowed : best;
      }
    });
  });
  return index.view(sizes);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(fastqa, m) {
  FASTQA_CPU_OP(m, linear_fwd, "(Tensor x, Tensor weight, Tensor? bias) -> Tensor y");
  FASTQA_CPU_OP(m, linear_argmax, "(Tensor x, Tensor weight, Tensor? bias, int[] exclude) -> Tensor index");
  FASTQA_CPU_OP(m, linear_bwd,
                "(Tensor grad_y, Tensor x, Tensor weight, bool[3] output_mask) "
                "-> (Tensor? grad_x, Tensor? grad_weight, Tensor? grad_bias)");
}

}  // namespace fastqa
