// Linear map y = x Wᵀ + b on the CPU GEMM entry point (csrc/cpu/gemm.h): nn.Linear, with each of its
// three products (forward, grad_x, grad_weight) run by the engine measured fastest for its shape.
//
// Why an op for a plain GEMM: torch's nn.Linear always calls BLAS (MKL), and on some processors and
// shapes oneDNN -- which torch ships too -- is up to 2x faster (a vocabulary projection [200, 256] x
// [256, 5893] on an AMD EPYC: 12.4 ms vs 6.4 ms). The models' large projections (ConvS2S's output layer,
// QANet's feed-forward layers) go through here; gemm::linear measures each shape once and keeps the faster.
//
// Shapes: x [..., K] (any leading dimensions, any strides), weight [N, K], bias [N] or None -> y [..., N].
#include <ATen/ATen.h>
#include <torch/library.h>

#include <tuple>
#include <vector>

#include "cpu/common.h"
#include "cpu/gemm.h"

namespace fastqa {
namespace {

constexpr const char* kFwd = "fastqa::linear_fwd";
constexpr const char* kBwd = "fastqa::linear_bwd";

void check_operands(const char* op, const at::Tensor& x, const at::Tensor& weight) {
  FASTQA_CHECK(x.dim() >= 1, op, "x must have at least one dimension");
  FASTQA_CHECK(weight.dim() == 2, op, "weight must be [N, K], got ", weight.sizes());
  FASTQA_CHECK(x.size(-1) == weight.size(1), op, "x's last dimension (", x.size(-1), ") must equal weight.shape[1] (",
               weight.size(1), ")");
  FASTQA_CHECK(x.scalar_type() == weight.scalar_type(), op, "x and weight must have the same dtype");
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
  if (bias.has_value() && bias->defined()) {
    FASTQA_CHECK(bias->dim() == 1 && bias->size(0) == n, kFwd, "bias must be [", n, "], got ", bias->sizes());
  }
  gemm::prepare();
  const at::Tensor y = gemm::linear(x.reshape({-1, k}), weight, bias);
  return y.view(with_last(x, n));
}

// grad_x = grad_y W, grad_weight = grad_yᵀ x (summed over every leading position), grad_bias = Σ grad_y
// (empty when has_bias is false).
std::tuple<at::Tensor, at::Tensor, at::Tensor> linear_bwd(const at::Tensor& grad_y, const at::Tensor& x,
                                                          const at::Tensor& weight, bool has_bias) {
  check_operands(kBwd, x, weight);
  const int64_t n = weight.size(0), k = weight.size(1);
  FASTQA_CHECK(grad_y.sizes() == at::IntArrayRef(with_last(x, n)), kBwd, "grad_y must be x's shape with N = ", n,
               " last, got ", grad_y.sizes());
  gemm::prepare();
  const at::Tensor g = grad_y.reshape({-1, n});
  const at::Tensor x2 = x.reshape({-1, k});
  // Both as products "a @ wᵀ" for the entry point: grad_x = g @ (Wᵀ)ᵀ, grad_weight = gᵀ @ (xᵀ)ᵀ.
  const at::Tensor grad_x = gemm::linear(g, weight.t(), c10::nullopt).view(x.sizes());
  const at::Tensor grad_weight = gemm::linear(g.t(), x2.t(), c10::nullopt);
  const at::Tensor grad_bias = has_bias ? g.sum(0) : at::empty({0}, weight.options());
  return {grad_x, grad_weight, grad_bias};
}

}  // namespace
}  // namespace fastqa

TORCH_LIBRARY_FRAGMENT(fastqa, m) {
  m.def("linear_fwd(Tensor x, Tensor weight, Tensor? bias) -> Tensor y");
  m.def(
      "linear_bwd(Tensor grad_y, Tensor x, Tensor weight, bool has_bias) -> (Tensor grad_x, Tensor grad_weight, "
      "Tensor grad_bias)");
}

TORCH_LIBRARY_IMPL(fastqa, CPU, m) {
  m.impl("linear_fwd", &fastqa::linear_fwd);
  m.impl("linear_bwd", &fastqa::linear_bwd);
}
