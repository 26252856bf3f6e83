// bfloat16 in the CPU kernels: the storage dtype of activations and weights under `--precision bf16` or
// torch.autocast("cpu", dtype=torch.bfloat16).
//
// The rule every op follows (as torch's bf16 CPU kernels and CUDA autocast do): bf16 in and out, float32
// inside -- accumulation, softmax and LayerNorm statistics, the values an op saves for its backward that are
// statistics (a log-sum-exp, a mean and a reciprocal deviation) -- and the products on the machine's bf16
// matrix engine: a GEMM multiplies bf16 operands and rounds its result to bf16 (what torch.mm does in bf16
// and what eager PyTorch under autocast does), so a bf16 op is never less exact than the eager layers it
// replaces.
//
// How: an op's entry widens its bf16 tensors to float32 and runs its float32 kernel inside a
// `gemm::Bf16Products` scope, in which every product of the GEMM entry point (csrc/cpu/gemm.h) is taken in
// bf16; it narrows its results back to bf16. GEMMs issued inside at::parallel_for run on other threads: an
// op that issues them there captures `gemm::bf16_products()` before the region and opens a scope inside it.
#pragma once

#include <ATen/ATen.h>

#include <c10/util/Optional.h>

#include "cpu/gemm.h"

namespace fastqa {
namespace bf16 {

inline bool is_bf16(const at::Tensor& t) { return t.defined() && t.scalar_type() == at::kBFloat16; }

// A contiguous float32 copy of a bf16 tensor (one copy, whatever its strides: the kernels read it contiguous);
// any other tensor (float32, float64, integer, undefined) as it is.
inline at::Tensor widen(const at::Tensor& t) {
  return is_bf16(t) ? t.to(t.options().dtype(at::kFloat), /*non_blocking=*/false, /*copy=*/false,
                           at::MemoryFormat::Contiguous)
                    : t;
}
inline c10::optional<at::Tensor> widen(const c10::optional<at::Tensor>& t) {
  return t.has_value() ? c10::optional<at::Tensor>(widen(*t)) : c10::nullopt;
}

// A float32 tensor rounded to bf16 (round to nearest even, as Tensor.to does), an empty float32 placeholder
// included (a bf16 op's absent-bias gradient is an empty bf16 tensor); an undefined tensor or another dtype
// stays as it is.
inline at::Tensor narrow(const at::Tensor& t) {
  return t.defined() && t.scalar_type() == at::kFloat ? t.to(at::kBFloat16) : t;
}

// A parameter (weight, bias, LayerNorm gamma/beta) a kernel with activation `x` takes: in x's dtype, or float32 with
// bf16 activations (the float32 master weights under autocast, read as they are: no per-call copy in the glue).
inline bool param_dtype_ok(const at::Tensor& param, const at::Tensor& x) {
  return param.scalar_type() == x.scalar_type() || (is_bf16(x) && param.scalar_type() == at::kFloat);
}

// A parameter's gradient, computed in float32 by a bf16 call, in the parameter's own dtype: rounded to bf16 for a
// bf16 parameter, kept float32 (no round trip through bf16) for a float32 one. An absent parameter's empty
// placeholder is rounded as the activations' dtype (bf16).
inline at::Tensor grad_like(const at::Tensor& grad, const at::Tensor& param) {
  return param.defined() && param.scalar_type() == at::kFloat ? grad : narrow(grad);
}
inline at::Tensor grad_like(const at::Tensor& grad, const c10::optional<at::Tensor>& param) {
  return param.has_value() ? grad_like(grad, *param) : narrow(grad);
}

// The dtype of the statistics an op computes from `input` and saves for its backward (a log-sum-exp, softmax
// probabilities, a mean and reciprocal deviation): float32 for bf16 input, what they are computed in; the input's
// dtype otherwise.
inline at::ScalarType statistics_dtype(const at::Tensor& input) {
  return is_bf16(input) ? at::kFloat : input.scalar_type();
}

}  // namespace bf16
}  // namespace fastqa
