// Trilinear similarity and QANet context-query attention: CPU kernels (float32, float64, bfloat16).
//
//   S  = (c∘w_cq)·qᵀ + c·w_c + (q·w_q)ᵀ + b                       [B, n, m]
//   S̄  = softmax of S over the real question words (rows),  S̿ = over the real context words (columns)
//   out = [c, A, c∘A, c∘B] with A = S̄·q, B = S̄·(S̿ᵀ·c)              [B, n, 4d]
//
// Work is split over the batch (at::parallel_for, torch's thread pool). Each batch element runs its
// whole pipeline while its [n, m] matrices sit in L2: the contractions go through the GEMM entry point
// (cpu/gemm.h: MKL/OpenBLAS or oneDNN, single-threaded inside the pool), the softmaxes and epilogues
// are fused loops over rows.
// Never materialised: [B, n, m, 3d] (the bilinear term is c·(q∘w_cq)ᵀ, one GEMM) and [B, n, n]
// (B is S̄·(S̿ᵀc), two GEMMs). A and B come from one GEMM, S̄·[q, S̿ᵀc], into an L2-sized scratch, and
// one sequential pass writes each output row whole (measured faster than letting the GEMMs write
// into strided slots of `out` and patching the rest in a second pass).
//
// aux_row = S̄ [B, n, m]; aux_col [B, n + d, m] = S̿ in rows [0, n) and (S̿ᵀc)ᵀ in rows [n, n + d): the
// backward needs both probability matrices and S̿ᵀc, which it would otherwise recompute (one of the ten
// [n, m, d] products of the backward) for the cost of storing m·d values per batch element.
//
// bfloat16: two routes per entry, chosen per shape class (gemm::route_for). "native" (where PyTorch's batch-reduce
// GEMM micro-kernel takes bf16, gemm::bf16_brgemm_usable) reads the bf16 inputs in place and writes bf16 results:
// every product above on bf16 operands (the inputs themselves, or per-element bf16 tiles of the probabilities and
// gradients) summed in float32 into float32 tiles, the softmaxes, epilogues and weight-gradient sums the float32
// kernel's loops on those tiles (the section "native bfloat16 route" below); without the micro-kernel it is the
// float32 kernel on widened copies with its GEMMs on torch's bf16 GEMM. "widen" widens the inputs and runs the
// float32 kernel with float32 products (the float32 kernel's speed plus the conversions: where native loses,
// bf16 is not slower than float32). out and the gradients come back in bf16 (a float32 weight and bias, the
// master weights under autocast, are read as float32 and get float32 gradients); aux_row and aux_col stay
// float32: they are the softmax probabilities the backward differentiates through, and rounding them to bf16
// would add an error the forward never made.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "cpu/bf16.h"
#include "cpu/bf16_rows.h"
#include "cpu/common.h"
#include "cpu/gemm.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#ifdef __linux__
#include <sys/mman.h>
#endif

namespace fastqa {
namespace {

using at::Tensor;

// ------------------------------------------------------------------------------------------------
// Memory
// ------------------------------------------------------------------------------------------------

// at::empty for a large result that is written once, backed by transparent huge pages where the OS
// offers them on request (Linux, THP mode "madvise"). Memory the allocator hands back to the OS is
// otherwise faulted in one 4 KiB page at a time on its first write, which in a loop of forward calls at
// the QANet shape costs hundreds of minor faults per call (none with this; figures in the benchmarks). Only the 2 MiB-aligned interior is advised; elsewhere, or if the advice is
// refused, this is plain at::empty.
Tensor empty_large(at::IntArrayRef sizes, const at::TensorOptions& opts) {
  Tensor t = at::empty(sizes, opts);
#ifdef __linux__
  constexpr uintptr_t huge = uintptr_t(2) << 20;
  const auto begin = reinterpret_cast<uintptr_t>(t.data_ptr());
  const uintptr_t first = (begin + huge - 1) & ~(huge - 1);
  const uintptr_t last = (begin + t.nbytes()) & ~(huge - 1);
  if (last > first) madvise(reinterpret_cast<void*>(first), last - first, MADV_HUGEPAGE);  // advice only
#endif
  return t;
}

// A contiguous copy of t in dtype, in empty_large memory: the bf16 entries' float32 copies of c, grad_out
// and out and their bf16 results are as large as the kernel's own results, and would be faulted in as often.
Tensor convert_large(const Tensor& t, at::ScalarType dtype) {
  return empty_large(t.sizes(), t.options().dtype(dtype)).copy_(t);
}

// ------------------------------------------------------------------------------------------------
// Argument checks (the Python entry points raise friendlier errors first; these guard direct calls)
// ------------------------------------------------------------------------------------------------

void check_similarity_args(const char* op, const Tensor& c, const Tensor& q, const Tensor& weight,
                           const c10::optional<Tensor>& bias) {
  TORCH_CHECK(c.device().is_cpu() && q.device().is_cpu() && weight.device().is_cpu(),
              op, ": the CPU kernels take CPU tensors");
  TORCH_CHECK(c.dim() == 3, op, ": c must be [B, n, d], got ", c.sizes());
  TORCH_CHECK(q.dim() == 3 && q.size(0) == c.size(0) && q.size(2) == c.size(2), op,
              ": q must be [B, m, d] with the B and d of c ", c.sizes(), ", got ", q.sizes());
  TORCH_CHECK(c.size(0) > 0 && c.size(1) > 0 && q.size(1) > 0 && c.size(2) > 0, op,
              ": c and q must be non-empty, got ", c.sizes(), " and ", q.sizes());
  TORCH_CHECK(c.scalar_type() == at::kFloat || c.scalar_type() == at::kDouble || c.scalar_type() == at::kBFloat16,
              op, ": c must be float32, float64 or bfloat16, got ", c.scalar_type());
  TORCH_CHECK(q.scalar_type() == c.scalar_type(), op, ": c and q must share a dtype, got ", c.scalar_type(), " and ",
              q.scalar_type());
  // The parameters: c's dtype, or float32 with bf16 c (the float32 master weights under autocast).
  TORCH_CHECK(bf16::param_dtype_ok(weight, c), op, ": weight must be ", c.scalar_type(),
              bf16::is_bf16(c) ? " or float32" : "", " (c's dtype), got ", weight.scalar_type());
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == 3 * c.size(2), op, ": weight must be [3d] = [",
              3 * c.size(2), "], got ", weight.sizes());
  if (bias.has_value()) {
    TORCH_CHECK(bias->numel() == 1 && bias->dim() <= 1 && bf16::param_dtype_ok(*bias, c) && bias->device().is_cpu(),
                op, ": bias must be a one-element CPU tensor of c's dtype", bf16::is_bf16(c) ? " or float32" : "",
                ", got ", bias->sizes(), " ", bias->scalar_type());
  }
}

void check_mask(const char* op, const char* name, const Tensor& mask, int64_t batch, int64_t len) {
  TORCH_CHECK(mask.scalar_type() == at::kBool && mask.device().is_cpu(), op, ": ", name,
              " must be a bool CPU tensor, got ", mask.scalar_type(), " on ", mask.device());
  TORCH_CHECK(mask.dim() == 2 && mask.size(0) == batch && mask.size(1) == len, op, ": ", name,
              " must be [", batch, ", ", len, "], got ", mask.sizes());
}

void check_same_shape(const char* op, const char* name, const Tensor& t, at::IntArrayRef shape,
                      at::ScalarType dtype) {
  TORCH_CHECK(t.sizes() == shape && t.scalar_type() == dtype && t.device().is_cpu(), op, ": ", name, " must be ",
              shape, " ", dtype, " on cpu, got ", t.sizes(), " ", t.scalar_type(), " on ", t.device());
}

// The shape class of a bf16 call's route choice (gemm::route_for).
std::string shape_class_of(const Tensor& c, const Tensor& q) {
  return gemm::shape_class({{"B", c.size(0)}, {"n", c.size(1)}, {"m", q.size(1)}, {"d", c.size(2)}});
}

// ------------------------------------------------------------------------------------------------
// Trilinear similarity, one batch element at a time
// ------------------------------------------------------------------------------------------------

template <typename T>
struct Weights {
  const T* wc;
  const T* wq;
  const T* wcq;
  T bias;
  int64_t d;
};

template <typename T>
Weights<T> unpack_weights(const Tensor& weight, const c10::optional<Tensor>& bias) {
  const int64_t d = weight.size(0) / 3;
  const T* w = ptr<T>(weight);
  return {w, w + d, w + 2 * d, bias.has_value() ? bias->item<T>() : T(0), d};
}

// Per-thread buffers of the similarity: qw = q∘w_cq [m, d] and sq = q·w_q + b [m].
template <typename T>
struct SimilarityScratch {
  Tensor qw;
  std::vector<T> sq;
  SimilarityScratch(int64_t m, int64_t d, const at::TensorOptions& opts)
      : qw(at::empty({m, d}, opts)), sq(m) {}
};

// qw = q∘w_cq for one batch element's question q [m, d].
template <typename T>
void scale_question(const T* q, const T* wcq, T* qw, int64_t m, int64_t d) {
  for (int64_t j = 0; j < m; ++j) {
#pragma omp simd
    for (int64_t k = 0; k < d; ++k) qw[j * d + k] = q[j * d + k] * wcq[k];
  }
}

// s_b = c_b·(q_b∘w_cq)ᵀ through one GEMM (q∘w_cq is [m, d], smaller than c∘w_cq), and the question
// terms q·w_q + b into scratch.sq. The context term is added per row by add_linear_terms, so that
// callers fuse it into their own pass over the row.
template <typename T>
void bilinear_term(const Tensor& c_b, const Tensor& q_b, const Weights<T>& w, SimilarityScratch<T>& scratch,
                   Tensor s_b) {
  const int64_t m = q_b.size(0), d = w.d;
  const T* q = ptr<T>(q_b);
  scale_question(q, w.wcq, ptr<T>(scratch.qw), m, d);
  for (int64_t j = 0; j < m; ++j) scratch.sq[j] = dot(q + j * d, w.wq, d) + w.bias;
  gemm::mm_out(s_b, c_b, scratch.qw.t());
}

// row (one context word's similarities) += c_i·w_c + (q·w_q + b).
template <typename T>
inline void add_linear_terms(T* row, const T* c_i, const Weights<T>& w, const T* sq, int64_t m) {
  const T sc = dot(c_i, w.wc, w.d);
#pragma omp simd
  for (int64_t j = 0; j < m; ++j) row[j] += sc + sq[j];
}

// Per-thread buffers of the similarity backward.
template <typename T>
struct SimilarityGradScratch {
  Tensor ds_t_c;          // dSᵀ·c [m, d]
  std::vector<T> colsum;  // Σ_i dS[i, j]
  SimilarityGradScratch(int64_t m, int64_t d, const at::TensorOptions& opts)
      : ds_t_c(at::empty({m, d}, opts)), colsum(m) {}
};

// The weight gradient's parts in dw [3d + 1] = [dw_c; dw_q; dw_cq; db], zeroed together with colsum [m]:
// what both similarity backwards (float kernels and the native bf16 route) sum into.
template <typename T>
struct WeightGradParts {
  T* c;
  T* q;
  T* cq;
  WeightGradParts(T* dw, int64_t d, T* colsum, int64_t m) : c(dw), q(dw + d), cq(dw + 2 * d) {
    std::fill(colsum, colsum + m, T(0));
    std::fill(dw, dw + 3 * d + 1, T(0));
  }
};

// The sum of row si [m], also added into the column sums colsum [m].
template <typename T>
inline T add_row_sums(const T* si, int64_t m, T* colsum) {
  T rowsum = 0;
#pragma omp simd reduction(+ : rowsum)
  for (int64_t j = 0; j < m; ++j) {
    rowsum += si[j];
    colsum[j] += si[j];
  }
  return rowsum;
}

// The similarity backward's sums for one batch element, in the float32 and the bf16 routes (E the inputs'
// element, Out the gradients', load/store the conversions from and to float sums): given dS [n, m],
// dc_acc = the products into dc [n, d] and e = dSᵀ·c [m, d], dc = dc_acc + rowsum(dS)⊗w_c and
// dq = dq_acc + e∘w_cq + colsum(dS)⊗w_q (dq_acc [m, ld_dq] or null), and this element's weight-gradient
// row (dw_c, dw_q, dw_cq, db) into dw [3d + 1]. dc_acc and dq_acc may be dc and dq themselves.
template <typename T, typename E, typename Out, class Load, class Store>
void similarity_row_sums(const T* ds, const E* cb, const E* qb, const Weights<T>& w, const T* dc_acc, const T* e,
                         const T* dq_acc, int64_t ld_dq, int64_t n, int64_t m, int64_t d, T* colsum, Out* dc,
                         Out* dq, T* dw, const Load& load, const Store& store) {
  const WeightGradParts<T> dwp(dw, d, colsum, m);
  T total = 0;
  for (int64_t i = 0; i < n; ++i) {
    const T rowsum = add_row_sums(ds + i * m, m, colsum);
    total += rowsum;
    const E* ci = cb + i * d;
    const T* ai = dc_acc + i * d;
    Out* dci = dc + i * d;
#pragma omp simd
    for (int64_t k = 0; k < d; ++k) {
      dci[k] = store(ai[k] + rowsum * w.wc[k]);
      dwp.c[k] += rowsum * load(ci[k]);
    }
  }
  for (int64_t j = 0; j < m; ++j) {
    const T* ej = e + j * d;
    const E* qj = qb + j * d;
    Out* dqj = dq + j * d;
    const T cs = colsum[j];
#pragma omp simd
    for (int64_t k = 0; k < d; ++k) {
      const T qv = load(qj[k]);
      dqj[k] = store((dq_acc != nullptr ? dq_acc[j * ld_dq + k] : T(0)) + ej[k] * w.wcq[k] + cs * w.wq[k]);
      dwp.q[k] += cs * qv;
      dwp.cq[k] += ej[k] * qv;
    }
  }
  dw[3 * d] = total;
}

// Backward of S = c·qwᵀ + c·w_c + (q·w_q)ᵀ + b for one batch element, given ds [n, m]:
//   dc (+)= ds·qw + rowsum(ds)⊗w_c,   dq (+)= (dsᵀ·c)∘w_cq + colsum(ds)⊗w_q,
// and this element's weight gradient (dw_c, dw_q, dw_cq, db) into dw [3d + 1] (reduced by the caller
// in a fixed order: deterministic). accumulate: add to dc_b / dq_b instead of overwriting them.
template <typename T>
void bilinear_backward(const Tensor& ds, const Tensor& c_b, const Tensor& q_b, const Tensor& qw,
                       const Weights<T>& w, Tensor dc_b, const Tensor& dq_b, bool accumulate,
                       SimilarityGradScratch<T>& scratch, T* dw) {
  const int64_t n = c_b.size(0), m = q_b.size(0), d = w.d;
  if (accumulate) {
    gemm::mm_out(dc_b, ds, qw, /*accumulate=*/true);
  } else {
    gemm::mm_out(dc_b, ds, qw);
  }
  gemm::mm_out(scratch.ds_t_c, ds.t(), c_b);

  T* dc = ptr<T>(dc_b);
  T* dq = ptr<T>(dq_b);
  const auto same = [](T v) { return v; };
  similarity_row_sums(ptr<T>(ds), ptr<T>(c_b), ptr<T>(q_b), w, dc, ptr<T>(scratch.ds_t_c), accumulate ? dq : nullptr,
                      d, n, m, d, scratch.colsum.data(), dc, dq, dw, same, same);
}

// grad_weight = Σ_b dw[b, :3d], grad_bias = Σ_b dw[b, 3d], summed serially: deterministic.
template <typename T>
std::pair<Tensor, Tensor> reduce_weight_grads(const Tensor& partial, const Tensor& weight,
                                              const c10::optional<Tensor>& bias) {
  const int64_t batch = partial.size(0), width = partial.size(1);
  Tensor grad_weight = at::zeros_like(weight);
  T* gw = ptr<T>(grad_weight);
  const T* p = ptr<T>(partial);
  T gb = 0;
  for (int64_t b = 0; b < batch; ++b) {
#pragma omp simd
    for (int64_t k = 0; k < width - 1; ++k) gw[k] += p[b * width + k];
    gb += p[b * width + width - 1];
  }
  Tensor grad_bias = bias.has_value() ? at::full_like(*bias, gb) : at::empty({0}, weight.options());
  return {grad_weight, grad_bias};
}

// The frame both backward passes share (inside their dtype dispatch): run body(w, b0, b1, partial) over
// ranges [b0, b1) of batch elements on torch's thread pool (autograd layers skipped: plain kernels
// inside), w being the unpacked weights and partial the base of a [batch, 3d + 1] buffer where batch
// element b writes its weight-gradient partial row (at partial + b * (3d + 1)); then sum those rows
// into (grad_weight, grad_bias).
template <typename T, typename Body>
std::pair<Tensor, Tensor> backward_over_batch(const Tensor& c, const Tensor& weight,
                                              const c10::optional<Tensor>& bias, const Body& body) {
  const int64_t batch = c.size(0), d = c.size(2);
  Tensor partial = at::empty({batch, 3 * d + 1}, c.options());
  const auto w = unpack_weights<T>(weight, bias);
  const bool b16 = gemm::bf16_products();  // the caller's bf16 products, for the GEMMs the workers issue
  at::parallel_for(0, batch, 1, [&](int64_t b0, int64_t b1) {
    at::AutoDispatchBelowADInplaceOrView guard;
    gemm::Bf16Products scope(b16);
    body(w, b0, b1, ptr<T>(partial));
  });
  return reduce_weight_grads<T>(partial, weight, bias);
}

// The native bf16 route of each entry (defined below, with the helpers they share).
Tensor trilinear_similarity_fwd_native(const Tensor& c, const Tensor& q, const Tensor& weight,
                                       const c10::optional<Tensor>& bias);
std::tuple<Tensor, Tensor, Tensor, Tensor> trilinear_similarity_bwd_native(const Tensor& grad_s, const Tensor& c,
                                                                           const Tensor& q, const Tensor& weight,
                                                                           const c10::optional<Tensor>& bias);

// ------------------------------------------------------------------------------------------------
// trilinear_similarity_fwd / _bwd
// ------------------------------------------------------------------------------------------------

Tensor trilinear_similarity_fwd(const Tensor& c_in, const Tensor& q_in, const Tensor& weight_in,
                                const c10::optional<Tensor>& bias) {
  constexpr const char* op = "fastqa::trilinear_similarity_fwd";
  gemm::prepare();
  check_similarity_args(op, c_in, q_in, weight_in, bias);
  if (bf16::is_bf16(c_in)) {  // the float32 kernel, its GEMMs in bf16 or float32 (the route; top of the file)
    const auto run = [&](gemm::Route route) {
      if (route == gemm::Route::kNative && gemm::bf16_brgemm_usable()) {
        return trilinear_similarity_fwd_native(c_in, q_in, weight_in, bias);
      }
      gemm::Bf16Products scope(route == gemm::Route::kNative);
      return bf16::narrow(trilinear_similarity_fwd(bf16::widen(c_in), bf16::widen(q_in), bf16::widen(weight_in),
                                                   bf16::widen(bias)));
    };
    return run(gemm::route_for(op, shape_class_of(c_in, q_in), [&](gemm::Route r) { (void)run(r); }));
  }
  const Tensor c = c_in.contiguous(), q = q_in.contiguous(), weight = weight_in.contiguous();
  const int64_t batch = c.size(0), n = c.size(1), m = q.size(1), d = c.size(2);
  Tensor s = at::empty({batch, n, m}, c.options());
  AT_DISPATCH_FLOATING_TYPES(c.scalar_type(), op, [&] {
    const auto w = unpack_weights<scalar_t>(weight, bias);
    const bool b16 = gemm::bf16_products();  // the caller's bf16 products, for the GEMMs the workers issue
    at::parallel_for(0, batch, 1, [&](int64_t b0, int64_t b1) {
      at::AutoDispatchBelowADInplaceOrView guard;  // plain kernels inside: skip the autograd layers
      gemm::Bf16Products scope(b16);
      SimilarityScratch<scalar_t> scratch(m, d, c.options());
      for (int64_t b = b0; b < b1; ++b) {
        const Tensor c_b = c[b], s_b = s[b];
        bilinear_term(c_b, q[b], w, scratch, s_b);
        scalar_t* sb = ptr<scalar_t>(s_b);
        const scalar_t* cb = ptr<scalar_t>(c_b);
        for (int64_t i = 0; i < n; ++i) add_linear_terms(sb + i * m, cb + i * d, w, scratch.sq.data(), m);
      }
    });
  });
  return s;
}

std::tuple<Tensor, Tensor, Tensor, Tensor> trilinear_similarity_bwd(const Tensor& grad_s, const Tensor& c_in,
                                                                    const Tensor& q_in, const Tensor& weight_in,
                                                                    const c10::optional<Tensor>& bias) {
  constexpr const char* op = "fastqa::trilinear_similarity_bwd";
  gemm::prepare();
  check_similarity_args(op, c_in, q_in, weight_in, bias);
  const int64_t batch = c_in.size(0), n = c_in.size(1), m = q_in.size(1), d = c_in.size(2);
  check_same_shape(op, "grad_s", grad_s, {batch, n, m}, c_in.scalar_type());
  if (bf16::is_bf16(c_in)) {
    const auto run = [&](gemm::Route route) -> std::tuple<Tensor, Tensor, Tensor, Tensor> {
      if (route == gemm::Route::kNative && gemm::bf16_brgemm_usable()) {
        return trilinear_similarity_bwd_native(grad_s, c_in, q_in, weight_in, bias);
      }
      gemm::Bf16Products scope(route == gemm::Route::kNative);
      auto [gc, gq, gw, gb] = trilinear_similarity_bwd(bf16::widen(grad_s), bf16::widen(c_in), bf16::widen(q_in),
                                                       bf16::widen(weight_in), bf16::widen(bias));
      return {bf16::narrow(gc), bf16::narrow(gq), bf16::grad_like(gw, weight_in), bf16::grad_like(gb, bias)};
    };
    return run(gemm::route_for(op, shape_class_of(c_in, q_in), [&](gemm::Route r) { (void)run(r); }));
  }
  const Tensor g = grad_s.contiguous(), c = c_in.contiguous(), q = q_in.contiguous(),
               weight = weight_in.contiguous();
  Tensor grad_c = at::empty_like(c), grad_q = at::empty_like(q);
  std::pair<Tensor, Tensor> weight_grads;
  AT_DISPATCH_FLOATING_TYPES(c.scalar_type(), op, [&] {
    weight_grads = backward_over_batch<scalar_t>(c, weight, bias, [&](const Weights<scalar_t>& w, int64_t b0,
                                                                      int64_t b1, scalar_t* partial) {
      SimilarityScratch<scalar_t> sim(m, d, c.options());
      SimilarityGradScratch<scalar_t> scratch(m, d, c.options());
      for (int64_t b = b0; b < b1; ++b) {
        const Tensor q_b = q[b];
        scale_question(ptr<scalar_t>(q_b), w.wcq, ptr<scalar_t>(sim.qw), m, d);
        bilinear_backward(g[b], c[b], q_b, sim.qw, w, grad_c[b], grad_q[b], /*accumulate=*/false, scratch,
                          partial + b * (3 * d + 1));
      }
    });
  });
  return {grad_c, grad_q, weight_grads.first, weight_grads.second};
}

// ------------------------------------------------------------------------------------------------
// Context-query attention, one batch element at a time
// ------------------------------------------------------------------------------------------------

// p[j] = exp(min(s[j] - row_max, 0)) * real[j] for j < m; returns their sum. For float, native vectors
// through exp_nonpositive, the tail as a zero-padded vector (GCC leaves the generic loop scalar: "control
// flow in loop" from the min and the mask around vec_exp -- it was the largest part of the forward's own
// time).
template <typename T>
T masked_exp_row(const T* s, T row_max, const T* real, T* p, int64_t m) {
  T sum = 0;
  for (int64_t j = 0; j < m; ++j) {
    p[j] = vec_exp(min_of(s[j] - row_max, T(0))) * real[j];
    sum += p[j];
  }
  return sum;
}

template <>
float masked_exp_row<float>(const float* s, float row_max, const float* real, float* p, int64_t m) {
  using S = NativeBlock<float>;
  const S::V zero{};
  S::V acc{};
  for (int64_t j = 0; j < m; j += S::W) {
    const S::V x = S::load_upto(s + j, m - j) - row_max;
    // min_of(x, 0) with NaN kept
    const S::V e = exp_nonpositive(zero < x ? zero : x) * S::load_upto(real + j, m - j);
    S::store_upto(p + j, e, m - j);
    acc += e;  // lanes past m: real is 0 there
  }
  float sum = 0;
  for (int64_t l = 0; l < S::W; ++l) sum += acc[l];
  return sum;
}

// s[j] = exp(s[j] - shift[j]) and sum[j] += s[j] for j < m (s <= shift): the column softmax's
// exponentials, float through exp_nonpositive (tail included, as above).
template <typename T>
void exp_shifted_accumulate(T* s, const T* shift, T* sum, int64_t m) {
#pragma omp simd
  for (int64_t i = 0; i < m; ++i) {
    s[i] = vec_exp(s[i] - shift[i]);
    sum[i] += s[i];
  }
}

template <>
void exp_shifted_accumulate<float>(float* s, const float* shift, float* sum, int64_t m) {
  using S = NativeBlock<float>;
  for (int64_t j = 0; j < m; j += S::W) {
    const S::V e = exp_nonpositive(S::load_upto(s + j, m - j) - S::load_upto(shift + j, m - j));
    S::store_upto(s + j, e, m - j);
    S::store_upto(sum + j, S::load_upto(sum + j, m - j) + e, m - j);
  }
}

// Both masked softmaxes of S in one sweep over the rows plus a normalising one. On entry pc holds the
// bilinear term of S (the linear terms are added here); on exit p = S̄ (row softmax over the real
// question words) and pc = S̿ (column softmax over the real context words). A slice with no real word
// is all zeros. q_real [m] / c_real [n]: the masks as 1/0 of type T, so the loops stay branch-free and
// vectorise; col_max / col_sum: [m] scratch. context_term(i) = c_i·w_c (the float32 kernel's dot, or the
// native bf16 route's precomputed sums).
template <typename T, typename ContextTerm>
void masked_softmaxes(T* pc, T* p, const ContextTerm& context_term, const T* sq, const T* q_real,
                      const T* c_real, int64_t n, int64_t m, T* col_max, T* col_sum) {
  constexpr T lowest = -std::numeric_limits<T>::infinity();
  std::fill(col_max, col_max + m, lowest);
  std::fill(col_sum, col_sum + m, T(0));
  for (int64_t i = 0; i < n; ++i) {
    T* s = pc + i * m;
    T* pi = p + i * m;
    const T sc = context_term(i);
#pragma omp simd
    for (int64_t j = 0; j < m; ++j) s[j] += sc + sq[j];
    T row_max = lowest;
#pragma omp simd reduction(max : row_max)
    for (int64_t j = 0; j < m; ++j) row_max = max_of(row_max, q_real[j] != 0 ? s[j] : lowest);
    // Masked words may exceed row_max (or row_max is -inf: no real word): min(., 0) keeps their exp
    // finite before the mask zeroes it, so no inf * 0.
    const T row_sum = masked_exp_row(s, row_max, q_real, pi, m);
    const T inv = row_sum > 0 ? T(1) / row_sum : T(0);
#pragma omp simd
    for (int64_t j = 0; j < m; ++j) pi[j] *= inv;
    if (c_real[i] != 0) {
#pragma omp simd
      for (int64_t j = 0; j < m; ++j) col_max[j] = max_of(col_max[j], s[j]);
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    T* s = pc + i * m;
    if (c_real[i] == 0) {
      std::fill(s, s + m, T(0));
      continue;
    }
    exp_shifted_accumulate(s, col_max, col_sum, m);  // s <= col_max: this real row took part in it
  }
#pragma omp simd
  for (int64_t j = 0; j < m; ++j) col_sum[j] = col_sum[j] > 0 ? T(1) / col_sum[j] : T(0);
  for (int64_t i = 0; i < n; ++i) {
    T* s = pc + i * m;
#pragma omp simd
    for (int64_t j = 0; j < m; ++j) s[j] *= col_sum[j];
  }
}

// mask (bool [len]) as 1/0 of type T.
template <typename T>
void mask_to_real(const bool* mask, T* out, int64_t len) {
  for (int64_t k = 0; k < len; ++k) out[k] = mask[k] ? T(1) : T(0);
}

// Backward of both masked softmaxes: dS = S̄∘(dS̄ − rowdot) + S̿∘(dS̿ − coldot), where rowdot_i = Σ_j S̄·dS̄
// and coldot_j = Σ_i S̿·dS̿. Masked entries have zero probability, hence zero gradient. dS overwrites dp.
template <typename T>
void masked_softmaxes_backward(T* dp, const T* dpc, const T* p, const T* pc, int64_t n, int64_t m, T* col_dot) {
  std::fill(col_dot, col_dot + m, T(0));
  for (int64_t i = 0; i < n; ++i) {
    T* dpi = dp + i * m;
    const T* pi = p + i * m;
    const T* pci = pc + i * m;
    const T* dpci = dpc + i * m;
    const T row_dot = dot(pi, dpi, m);
#pragma omp simd
    for (int64_t j = 0; j < m; ++j) {
      dpi[j] = pi[j] * (dpi[j] - row_dot);
      col_dot[j] += pci[j] * dpci[j];
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    T* dpi = dp + i * m;
    const T* pci = pc + i * m;
    const T* dpci = dpc + i * m;
#pragma omp simd
    for (int64_t j = 0; j < m; ++j) dpi[j] += pci[j] * (dpci[j] - col_dot[j]);
  }
}

#ifdef __AVX__
// One native float vector to 64-byte-line memory without reading the line first (aligned p).
inline void stream_store(float* p, NativeBlock<float>::V v) {
#ifdef __AVX512F__
  _mm512_stream_ps(p, v);
#else
  _mm256_stream_ps(p, v);
#endif
}
#endif

// out = [c, A, c∘A, c∘B] for one batch element [n, 4d] from ab = [A, B] [n, 2d]: one sequential
// pass writes every output row whole (the GEMM result ab is still in L2).
template <typename T>
void attention_output(T* out, const T* c, const T* ab, int64_t n, int64_t d) {
#ifdef __AVX__
  // float, rows of whole native vectors on a vector-aligned buffer: non-temporal stores. `out` (4 floats
  // per context word and feature) is far larger than the caches and not read back by the forward, so
  // this skips the read-for-ownership of every output line: the write was the forward's largest phase.
  if constexpr (std::is_same_v<T, float>) {
    using S = NativeBlock<float>;
    if (d % S::W == 0 && reinterpret_cast<uintptr_t>(out) % kSimdBytes == 0) {
      for (int64_t i = 0; i < n; ++i) {
        float* oi = out + i * 4 * d;
        const float* ci = c + i * d;
        const float* ai = ab + i * 2 * d;
        const float* bi = ai + d;
        for (int64_t k = 0; k < d; k += S::W) {
          const S::V cv = S::load(ci + k), av = S::load(ai + k);
          stream_store(oi + k, cv);
          stream_store(oi + d + k, av);
          stream_store(oi + 2 * d + k, cv * av);
          stream_store(oi + 3 * d + k, cv * S::load(bi + k));
        }
      }
      _mm_sfence();  // order the streaming stores before other threads read `out`
      return;
    }
  }
#endif
  for (int64_t i = 0; i < n; ++i) {
    T* oi = out + i * 4 * d;
    const T* ci = c + i * d;
    const T* ai = ab + i * 2 * d;
    const T* bi = ai + d;
#pragma omp simd
    for (int64_t k = 0; k < d; ++k) {
      oi[k] = ci[k];
      oi[d + k] = ai[k];
      oi[2 * d + k] = ci[k] * ai[k];
      oi[3 * d + k] = ci[k] * bi[k];
    }
  }
}

// Backward of the epilogue, given g = d out [n, 4d] and out (for A): dab = [dA, dB] [n, 2d] with
// dA = g1 + g2∘c and dB = g3∘c; dc = g0 + g2∘A + g3∘B, where dc holds B on entry.
template <typename T>
void attention_output_backward(const T* g, const T* out, const T* c, T* dab, T* dc, int64_t n, int64_t d) {
  for (int64_t i = 0; i < n; ++i) {
    const T* gi = g + i * 4 * d;
    const T* ai = out + i * 4 * d + d;
    const T* ci = c + i * d;
    T* dabi = dab + i * 2 * d;
    T* dci = dc + i * d;
#pragma omp simd
    for (int64_t k = 0; k < d; ++k) {
      dabi[k] = gi[d + k] + gi[2 * d + k] * ci[k];
      dabi[d + k] = gi[3 * d + k] * ci[k];
      dci[k] = gi[k] + gi[2 * d + k] * ai[k] + gi[3 * d + k] * dci[k];
    }
  }
}

// dst[r * ld_dst + c] = src[c * ld_src + r] for r < rows, c < cols: S̿ᵀc [m, d] (a column slot of the wider
// [q, S̿ᵀc] buffer) to and from its transposed copy in rows [n, n + d) of aux_col[b]. Walks dst contiguously
// (strided stores, one per cache line, were ~7% of the forward's own loops by perf; strided loads cost less).
template <typename T>
void transpose_into(T* dst, int64_t ld_dst, const T* src, int64_t ld_src, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) dst[r * ld_dst + c] = src[c * ld_src + r];
  }
}

// ------------------------------------------------------------------------------------------------
// The native bfloat16 route: bf16 tiles read in place, products on the batch-reduce micro-kernel
// ------------------------------------------------------------------------------------------------
//
// Each batch element's products take gemm::bf16_brgemm: a row-major bf16 left factor (the inputs c, grad_s
// or the [dA, dB] rows where they are one already, else a bf16 copy of a probability or gradient tile) times
// a right factor packed in VNNI pairs per call (at most [n, 2d] values, from L2), summed in float32 into
// float32 tiles. The softmaxes, the epilogues and the weight-gradient sums are the float32 kernel's loops on
// those tiles; nothing is widened whole and no float32 copy of c, grad_out or out is made. A product's
// odd inner size is padded with a zero column and row (the micro-kernel takes bf16 in pairs).

using Bits = uint16_t;  // a bf16 value's bits (bf16_rows.h)

inline int64_t even_up(int64_t k) { return (k + 1) & ~int64_t(1); }

// A right factor [k, n] whose (r, j) value is at(r, j) (bits), packed as gemm::bf16_brgemm reads it:
// [even_up(k) / 2, n, 2], rows r and r + 1 interleaved; the row past an odd k is zero.
template <typename At>
void pack_right(Bits* dst, int64_t k, int64_t n, const At& at) {
  for (int64_t r = 0; r < k; r += 2) {
    Bits* pair = dst + r * n;
    const bool second = r + 1 < k;
    for (int64_t j = 0; j < n; ++j) {
      pair[2 * j] = at(r, j);
      pair[2 * j + 1] = second ? at(r + 1, j) : Bits(0);
    }
  }
}

// A left factor [rows, ld] in bits: at(r, k) for k < cols, zero for cols <= k < ld.
template <typename At>
void make_left(Bits* dst, int64_t rows, int64_t cols, int64_t ld, const At& at) {
  for (int64_t r = 0; r < rows; ++r) {
    Bits* row = dst + r * ld;
    for (int64_t k = 0; k < cols; ++k) row[k] = at(r, k);
    for (int64_t k = cols; k < ld; ++k) row[k] = 0;
  }
}

// c_b [n, d] as a left factor with an even inner size: c itself for even d, else its copy into pad.
const Bits* context_left(const Bits* cb, int64_t n, int64_t d, std::vector<Bits>& pad) {
  if (d % 2 == 0) return cb;
  pad.resize(n * (d + 1));
  make_left(pad.data(), n, d, d + 1, [&](int64_t r, int64_t k) { return cb[r * d + k]; });
  return pad.data();
}

inline Bits rnd(float v) { return bf16::round_bits(v); }

// dst[0, count) = src[0, count), with non-temporal stores where dst is 16-byte aligned: a result far larger than
// the caches that the kernel does not read back (no read-for-ownership of its lines). The caller fences
// (stream_fence) before its results are read by other threads.
void stream_copy(Bits* dst, const Bits* src, int64_t count) {
#ifdef __SSE2__
  if (reinterpret_cast<uintptr_t>(dst) % 16 == 0) {
    const int64_t blocks = count / 8;
    auto* d = reinterpret_cast<__m128i*>(dst);
    const auto* s = reinterpret_cast<const __m128i*>(src);
    for (int64_t v = 0; v < blocks; ++v) _mm_stream_si128(d + v, _mm_loadu_si128(s + v));
    std::copy(src + blocks * 8, src + count, dst + blocks * 8);
    return;
  }
#endif
  std::copy(src, src + count, dst);
}

inline void stream_fence() {
#ifdef __SSE2__
  _mm_sfence();
#endif
}
inline float wid(Bits b) { return bf16::to_float(b); }

// The weights in float32 (w [3d] and b are a few hundred values: widened once per call).
struct NativeWeights {
  Tensor w32;
  c10::optional<Tensor> b32;
  Weights<float> w;
  NativeWeights(const Tensor& weight, const c10::optional<Tensor>& bias)
      : w32(bf16::widen(weight).contiguous()), b32(bf16::widen(bias)), w(unpack_weights<float>(w32, b32)) {}
};

// The question's similarity factors of one batch element: q∘w_cq packed as the right factor of c·(q∘w_cq)ᵀ
// ([d, m]) when transposed, else of dS·(q∘w_cq) ([m, d]); sq = q·w_q + b.
void question_factors(const Bits* qb, int64_t m, int64_t d, const Weights<float>& w, bool transposed, Bits* qw_p,
                      float* sq) {
  if (transposed) {
    pack_right(qw_p, d, m, [&](int64_t r, int64_t j) { return rnd(wid(qb[j * d + r]) * w.wcq[r]); });
  } else {
    pack_right(qw_p, m, d, [&](int64_t r, int64_t j) { return rnd(wid(qb[r * d + j]) * w.wcq[j]); });
  }
  if (sq == nullptr) return;
  for (int64_t j = 0; j < m; ++j) {
    float acc = 0;
#pragma omp simd reduction(+ : acc)
    for (int64_t k = 0; k < d; ++k) acc += wid(qb[j * d + k]) * w.wq[k];
    sq[j] = acc + w.bias;
  }
}

// sc[i] = c_i·w_c.
void context_terms(const Bits* cb, int64_t n, int64_t d, const Weights<float>& w, float* sc) {
  for (int64_t i = 0; i < n; ++i) {
    float acc = 0;
#pragma omp simd reduction(+ : acc)
    for (int64_t k = 0; k < d; ++k) acc += wid(cb[i * d + k]) * w.wc[k];
    sc[i] = acc;
  }
}

// The similarity backward's sums for one batch element, given dS [n, m] (float32), dc_acc = the products into
// dc [n, d] and e = dSᵀ·c [m, d]: dc = dc_acc + rowsum(dS)⊗w_c and dq = dq_acc + e∘w_cq + colsum(dS)⊗w_q
// rounded to bf16, and this element's weight-gradient row (dw_c, dw_q, dw_cq, db) into dw [3d + 1].
// dq_acc: [m, ld_dq] or null.
void similarity_sums(const float* ds, const Bits* cb, const Bits* qb, const Weights<float>& w, const float* dc_acc,
                     const float* e, const float* dq_acc, int64_t ld_dq, int64_t n, int64_t m, int64_t d,
                     float* colsum, Bits* dc, Bits* dq, float* dw) {
  similarity_row_sums(ds, cb, qb, w, dc_acc, e, dq_acc, ld_dq, n, m, d, colsum, dc, dq, dw,
                      [](Bits v) { return wid(v); }, [](float v) { return rnd(v); });
}

// (grad_weight, grad_bias) in the parameters' dtype from the float32 per-element rows.
std::pair<Tensor, Tensor> native_weight_grads(const Tensor& partial, const NativeWeights& nw, const Tensor& weight,
                                              const c10::optional<Tensor>& bias) {
  auto [gw, gb] = reduce_weight_grads<float>(partial, nw.w32, nw.b32);
  return {bf16::grad_like(gw, weight), bf16::grad_like(gb, bias)};
}

// The step both native backwards end a batch element with, and its per-thread buffers: e = dSᵀ·c, then
// similarity_sums into dc (dc_out [n, d], streamed), dq (dq_out [m, d]) and the weight partial row dw.
struct SimilarityTail {
  int64_t n, m, d, nE;
  std::vector<Bits> ds_t, c_p, dc_rows;
  std::vector<float> e, colsum;
  SimilarityTail(int64_t n_, int64_t m_, int64_t d_)
      : n(n_), m(m_), d(d_), nE(even_up(n_)), ds_t(m_ * nE), c_p(nE * d_), dc_rows(n_ * d_), e(m_ * d_), colsum(m_) {}
  // ds_t_at(r, k) = dS[k, r] in bf16; ds [n, m] the float32 dS; dq_acc (leading dimension ld_dq) may be null.
  template <class DsTAt>
  void finish(const DsTAt& ds_t_at, const float* ds, const Bits* cb, const Bits* qb, const Weights<float>& w,
              const float* dc_acc, const float* dq_acc, int64_t ld_dq, Bits* dc_out, Bits* dq_out, float* dw) {
    make_left(ds_t.data(), m, n, nE, ds_t_at);
    pack_right(c_p.data(), n, d, [&](int64_t r, int64_t j) { return cb[r * d + j]; });
    gemm::bf16_brgemm(m, d, nE, reinterpret_cast<const c10::BFloat16*>(ds_t.data()), nE,
                      reinterpret_cast<const c10::BFloat16*>(c_p.data()), e.data(), d, false);
    similarity_sums(ds, cb, qb, w, dc_acc, e.data(), dq_acc, ld_dq, n, m, d, colsum.data(), dc_rows.data(), dq_out,
                    dw);
    stream_copy(dc_out, dc_rows.data(), n * d);
  }
};

Tensor trilinear_similarity_fwd_native(const Tensor& c_in, const Tensor& q_in, const Tensor& weight,
                                       const c10::optional<Tensor>& bias) {
  const Tensor c = c_in.contiguous(), q = q_in.contiguous();
  const int64_t batch = c.size(0), n = c.size(1), m = q.size(1), d = c.size(2), dE = even_up(d);
  const NativeWeights nw(weight, bias);
  const Weights<float>& w = nw.w;
  Tensor s = at::empty({batch, n, m}, c.options());
  const Bits* cd = bf16::bits(c.data_ptr<c10::BFloat16>());
  const Bits* qd = bf16::bits(q.data_ptr<c10::BFloat16>());
  Bits* sd = bf16::bits(s.data_ptr<c10::BFloat16>());
  at::parallel_for(0, batch, 1, [&](int64_t b0, int64_t b1) {
    std::vector<Bits> qw_p(dE * m), c_pad, s_rows(n * m);
    std::vector<float> sq(m), sc(n), sf(n * m);
    for (int64_t b = b0; b < b1; ++b) {
      const Bits* cb = cd + b * n * d;
      const Bits* qb = qd + b * m * d;
      question_factors(qb, m, d, w, /*transposed=*/true, qw_p.data(), sq.data());
      context_terms(cb, n, d, w, sc.data());
      gemm::bf16_brgemm(n, m, dE, reinterpret_cast<const c10::BFloat16*>(context_left(cb, n, d, c_pad)), dE,
                        reinterpret_cast<const c10::BFloat16*>(qw_p.data()), sf.data(), m, false);
      for (int64_t i = 0; i < n; ++i) {
#pragma omp simd
        for (int64_t j = 0; j < m; ++j) s_rows[i * m + j] = rnd(sf[i * m + j] + sc[i] + sq[j]);
      }
      stream_copy(sd + b * n * m, s_rows.data(), n * m);
    }
    stream_fence();
    gemm::bf16_brgemm_release();
  });
  return s;
}

std::tuple<Tensor, Tensor, Tensor, Tensor> trilinear_similarity_bwd_native(const Tensor& grad_s, const Tensor& c_in,
                                                                           const Tensor& q_in, const Tensor& weight,
                                                                           const c10::optional<Tensor>& bias) {
  const Tensor g = grad_s.contiguous(), c = c_in.contiguous(), q = q_in.contiguous();
  const int64_t batch = c.size(0), n = c.size(1), m = q.size(1), d = c.size(2), nE = even_up(n), mE = even_up(m);
  const NativeWeights nw(weight, bias);
  const Weights<float>& w = nw.w;
  Tensor grad_c = at::empty_like(c), grad_q = at::empty_like(q);
  Tensor partial = at::empty({batch, 3 * d + 1}, c.options().dtype(at::kFloat));
  const Bits* gd = bf16::bits(g.data_ptr<c10::BFloat16>());
  const Bits* cd = bf16::bits(c.data_ptr<c10::BFloat16>());
  const Bits* qd = bf16::bits(q.data_ptr<c10::BFloat16>());
  Bits* gcd = bf16::bits(grad_c.data_ptr<c10::BFloat16>());
  Bits* gqd = bf16::bits(grad_q.data_ptr<c10::BFloat16>());
  float* pd = partial.data_ptr<float>();
  at::parallel_for(0, batch, 1, [&](int64_t b0, int64_t b1) {
    std::vector<Bits> qw_p(mE * d), ds_l(n * mE);
    std::vector<float> ds(n * m), dcf(n * d);
    SimilarityTail tail(n, m, d);
    for (int64_t b = b0; b < b1; ++b) {
      const Bits* gb = gd + b * n * m;
      const Bits* cb = cd + b * n * d;
      const Bits* qb = qd + b * m * d;
#pragma omp simd
      for (int64_t k = 0; k < n * m; ++k) ds[k] = wid(gb[k]);
      question_factors(qb, m, d, w, /*transposed=*/false, qw_p.data(), nullptr);
      const Bits* ds_left = gb;
      if (m % 2 != 0) {
        make_left(ds_l.data(), n, m, mE, [&](int64_t r, int64_t k) { return gb[r * m + k]; });
        ds_left = ds_l.data();
      }
      gemm::bf16_brgemm(n, d, mE, reinterpret_cast<const c10::BFloat16*>(ds_left), mE,
                        reinterpret_cast<const c10::BFloat16*>(qw_p.data()), dcf.data(), d, false);  // dS·(q∘w_cq)
      tail.finish([&](int64_t r, int64_t k) { return gb[k * m + r]; }, ds.data(), cb, qb, w, dcf.data(), nullptr, 0,
                  gcd + b * n * d, gqd + b * m * d, pd + b * (3 * d + 1));
    }
    stream_fence();
    gemm::bf16_brgemm_release();
  });
  auto [gw, gb] = native_weight_grads(partial, nw, weight, bias);
  return {grad_c, grad_q, gw, gb};
}

std::tuple<Tensor, Tensor, Tensor> context_query_attention_fwd_native(const Tensor& c_in, const Tensor& q_in,
                                                                      const Tensor& c_mask_in, const Tensor& q_mask_in,
                                                                      const Tensor& weight,
                                                                      const c10::optional<Tensor>& bias) {
  const Tensor c = c_in.contiguous(), q = q_in.contiguous();
  const Tensor c_mask = c_mask_in.contiguous(), q_mask = q_mask_in.contiguous();
  const int64_t batch = c.size(0), n = c.size(1), m = q.size(1), d = c.size(2);
  const int64_t nE = even_up(n), mE = even_up(m), dE = even_up(d);
  const NativeWeights nw(weight, bias);
  const Weights<float>& w = nw.w;
  const auto f32 = c.options().dtype(at::kFloat);
  Tensor out = empty_large({batch, n, 4 * d}, c.options());
  Tensor p_row = empty_large({batch, n, m}, f32);
  Tensor p_col = empty_large({batch, n + d, m}, f32);
  const Bits* cd = bf16::bits(c.data_ptr<c10::BFloat16>());
  const Bits* qd = bf16::bits(q.data_ptr<c10::BFloat16>());
  Bits* od = bf16::bits(out.data_ptr<c10::BFloat16>());
  float* prd = p_row.data_ptr<float>();
  float* pcd = p_col.data_ptr<float>();
  // `out` (far larger than the caches, not read back by the forward) is written row by row through a row buffer
  // (stream_copy) where its rows are whole 16-byte blocks.
  const bool stream = d % 2 == 0 && reinterpret_cast<uintptr_t>(od) % 16 == 0;
  at::parallel_for(0, batch, 1, [&](int64_t b0, int64_t b1) {
    std::vector<Bits> qw_p(dE * m), c_pad, c_p(nE * d), pc_t(m * nE), p_l(n * mE), qt_p(mE * 2 * d);
    std::vector<Bits> row(stream ? 4 * d : 0);
    std::vector<float> sq(m), sc(n), ctc(m * d), ab(n * 2 * d), col_max(m), col_sum(m), q_real(m), c_real(n);
    for (int64_t b = b0; b < b1; ++b) {
      const Bits* cb = cd + b * n * d;
      const Bits* qb = qd + b * m * d;
      float* pr = prd + b * n * m;
      float* pc = pcd + b * (n + d) * m;
      question_factors(qb, m, d, w, /*transposed=*/true, qw_p.data(), sq.data());
      context_terms(cb, n, d, w, sc.data());
      gemm::bf16_brgemm(n, m, dE, reinterpret_cast<const c10::BFloat16*>(context_left(cb, n, d, c_pad)), dE,
                        reinterpret_cast<const c10::BFloat16*>(qw_p.data()), pc, m, false);  // c·(q∘w_cq)ᵀ
      mask_to_real(ptr<bool>(q_mask) + b * m, q_real.data(), m);
      mask_to_real(ptr<bool>(c_mask) + b * n, c_real.data(), n);
      masked_softmaxes(pc, pr, [&](int64_t i) { return sc[i]; }, sq.data(), q_real.data(), c_real.data(), n, m,
                       col_max.data(), col_sum.data());
      // S̿ᵀ·c [m, d], kept transposed in aux_col's rows [n, n + d) for the backward
      make_left(pc_t.data(), m, n, nE, [&](int64_t r, int64_t k) { return rnd(pc[k * m + r]); });
      pack_right(c_p.data(), n, d, [&](int64_t r, int64_t j) { return cb[r * d + j]; });
      gemm::bf16_brgemm(m, d, nE, reinterpret_cast<const c10::BFloat16*>(pc_t.data()), nE,
                        reinterpret_cast<const c10::BFloat16*>(c_p.data()), ctc.data(), d, false);
      transpose_into(pc + n * m, m, ctc.data(), d, d, m);
      // [A, B] = S̄·[q, S̿ᵀ·c]
      make_left(p_l.data(), n, m, mE, [&](int64_t r, int64_t k) { return rnd(pr[r * m + k]); });
      pack_right(qt_p.data(), m, 2 * d,
                 [&](int64_t r, int64_t j) { return j < d ? qb[r * d + j] : rnd(ctc[r * d + j - d]); });
      gemm::bf16_brgemm(n, 2 * d, mE, reinterpret_cast<const c10::BFloat16*>(p_l.data()), mE,
                        reinterpret_cast<const c10::BFloat16*>(qt_p.data()), ab.data(), 2 * d, false);
      Bits* ob = od + b * n * 4 * d;
      for (int64_t i = 0; i < n; ++i) {  // out = [c, A, c∘A, c∘B]
        Bits* oi = stream ? row.data() : ob + i * 4 * d;
        const Bits* ci = cb + i * d;
        const float* ai = ab.data() + i * 2 * d;
#pragma omp simd
        for (int64_t k = 0; k < d; ++k) {
          const float cv = wid(ci[k]);
          oi[k] = ci[k];
          oi[d + k] = rnd(ai[k]);
          oi[2 * d + k] = rnd(cv * ai[k]);
          oi[3 * d + k] = rnd(cv * ai[d + k]);
        }
        if (stream) stream_copy(ob + i * 4 * d, row.data(), 4 * d);
      }
    }
    stream_fence();
    gemm::bf16_brgemm_release();
  });
  return {out, p_row, p_col};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> context_query_attention_bwd_native(
    const Tensor& grad_out, const Tensor& c_in, const Tensor& q_in, const Tensor& c_mask, const Tensor& q_mask,
    const Tensor& weight, const c10::optional<Tensor>& bias, const Tensor& out_in, const Tensor& aux_row,
    const Tensor& aux_col) {
  (void)c_mask;  // the masks live in the probabilities: masked entries are zero there
  (void)q_mask;
  const Tensor g = grad_out.contiguous(), c = c_in.contiguous(), q = q_in.contiguous(), out = out_in.contiguous(),
               p_row = aux_row.contiguous(), p_col = aux_col.contiguous();
  const int64_t batch = c.size(0), n = c.size(1), m = q.size(1), d = c.size(2);
  const int64_t nE = even_up(n), mE = even_up(m), dE = even_up(d);
  const NativeWeights nw(weight, bias);
  const Weights<float>& w = nw.w;
  Tensor grad_c = empty_large(c.sizes(), c.options()), grad_q = at::empty_like(q);
  Tensor partial = at::empty({batch, 3 * d + 1}, c.options().dtype(at::kFloat));
  const Bits* gd = bf16::bits(g.data_ptr<c10::BFloat16>());
  const Bits* cd = bf16::bits(c.data_ptr<c10::BFloat16>());
  const Bits* qd = bf16::bits(q.data_ptr<c10::BFloat16>());
  const Bits* od = bf16::bits(out.data_ptr<c10::BFloat16>());
  const float* prd = p_row.data_ptr<float>();
  const float* pcd = p_col.data_ptr<float>();
  Bits* gcd = bf16::bits(grad_c.data_ptr<c10::BFloat16>());
  Bits* gqd = bf16::bits(grad_q.data_ptr<c10::BFloat16>());
  float* pd = partial.data_ptr<float>();
  const auto as_bf16 = [](const Bits* p) { return reinterpret_cast<const c10::BFloat16*>(p); };
  at::parallel_for(0, batch, 1, [&](int64_t b0, int64_t b1) {
    std::vector<Bits> ctc_p(mE * d), p_l(n * mE), dab(n * 2 * d), qt_p(2 * d * m), p_t(m * nE), dab_p(nE * 2 * d),
        dctc_p(dE * m), c_pad, s_l(n * 2 * mE), dcq_p(2 * mE * d);
    std::vector<float> ctc(m * d), dcf(n * d), dp(n * m), dqd(m * 2 * d), dpc(n * m), col_dot(m);
    SimilarityTail tail(n, m, d);
    for (int64_t b = b0; b < b1; ++b) {
      const Bits* gb = gd + b * n * 4 * d;
      const Bits* cb = cd + b * n * d;
      const Bits* qb = qd + b * m * d;
      const Bits* ob = od + b * n * 4 * d;
      const float* pr = prd + b * n * m;
      const float* pc = pcd + b * (n + d) * m;
      transpose_into(ctc.data(), d, pc + n * m, m, m, d);  // the forward's S̿ᵀ·c [m, d]
      // B = S̄·(S̿ᵀc) into dc's float32 tile
      make_left(p_l.data(), n, m, mE, [&](int64_t r, int64_t k) { return rnd(pr[r * m + k]); });
      pack_right(ctc_p.data(), m, d, [&](int64_t r, int64_t j) { return rnd(ctc[r * d + j]); });
      gemm::bf16_brgemm(n, d, mE, as_bf16(p_l.data()), mE, as_bf16(ctc_p.data()), dcf.data(), d, false);
      // the epilogue's backward: [dA, dB] = [g1 + g2∘c, g3∘c], dc = g0 + g2∘A + g3∘B
      for (int64_t i = 0; i < n; ++i) {
        const Bits* gi = gb + i * 4 * d;
        const Bits* ai = ob + i * 4 * d + d;
        const Bits* ci = cb + i * d;
        Bits* dabi = dab.data() + i * 2 * d;
        float* dci = dcf.data() + i * d;
#pragma omp simd
        for (int64_t k = 0; k < d; ++k) {
          const float cv = wid(ci[k]), g2 = wid(gi[2 * d + k]), g3 = wid(gi[3 * d + k]);
          dabi[k] = rnd(wid(gi[d + k]) + g2 * cv);
          dabi[d + k] = rnd(g3 * cv);
          dci[k] = wid(gi[k]) + g2 * wid(ai[k]) + g3 * dci[k];
        }
      }
      // dS̄ = [dA, dB]·[q, S̿ᵀc]ᵀ
      pack_right(qt_p.data(), 2 * d, m,
                 [&](int64_t r, int64_t j) { return r < d ? qb[j * d + r] : rnd(ctc[j * d + r - d]); });
      gemm::bf16_brgemm(n, m, 2 * d, as_bf16(dab.data()), 2 * d, as_bf16(qt_p.data()), dp.data(), m, false);
      // [S̄ᵀ·dA, d(S̿ᵀc) = S̄ᵀ·dB]
      make_left(p_t.data(), m, n, nE, [&](int64_t r, int64_t k) { return rnd(pr[k * m + r]); });
      pack_right(dab_p.data(), n, 2 * d, [&](int64_t r, int64_t j) { return dab[r * 2 * d + j]; });
      gemm::bf16_brgemm(m, 2 * d, nE, as_bf16(p_t.data()), nE, as_bf16(dab_p.data()), dqd.data(), 2 * d, false);
      // dS̿ = c·d(S̿ᵀc)ᵀ
      pack_right(dctc_p.data(), d, m, [&](int64_t r, int64_t j) { return rnd(dqd[j * 2 * d + d + r]); });
      gemm::bf16_brgemm(n, m, dE, as_bf16(context_left(cb, n, d, c_pad)), dE, as_bf16(dctc_p.data()), dpc.data(), m,
                        false);
      // dS (into dp) through both softmaxes; the masked_softmaxes_backward reads p and pc read-only
      masked_softmaxes_backward(dp.data(), dpc.data(), pr, pc, n, m, col_dot.data());
      // dc += [S̿, dS]·[d(S̿ᵀc); q∘w_cq]: the column softmax's and the similarity's share of dc, one product
      make_left(s_l.data(), n, 2 * mE, 2 * mE, [&](int64_t r, int64_t k) {
        if (k < m) return rnd(pc[r * m + k]);
        if (k >= mE && k - mE < m) return rnd(dp[r * m + k - mE]);
        return Bits(0);
      });
      pack_right(dcq_p.data(), 2 * mE, d, [&](int64_t r, int64_t j) {
        if (r < m) return rnd(dqd[r * 2 * d + d + j]);
        if (r >= mE && r - mE < m) return rnd(wid(qb[(r - mE) * d + j]) * w.wcq[j]);
        return Bits(0);
      });
      gemm::bf16_brgemm(n, d, 2 * mE, as_bf16(s_l.data()), 2 * mE, as_bf16(dcq_p.data()), dcf.data(), d, true);
      tail.finish([&](int64_t r, int64_t k) { return rnd(dp[k * m + r]); }, dp.data(), cb, qb, w, dcf.data(),
                  dqd.data(), 2 * d, gcd + b * n * d, gqd + b * m * d, pd + b * (3 * d + 1));
    }
    stream_fence();
    gemm::bf16_brgemm_release();
  });
  auto [gw, gb] = native_weight_grads(partial, nw, weight, bias);
  return {grad_c, grad_q, gw, gb};
}

// ------------------------------------------------------------------------------------------------
// context_query_attention_fwd / _bwd
// ------------------------------------------------------------------------------------------------

void check_attention_args(const char* op, const Tensor& c, const Tensor& q, const Tensor& c_mask,
                          const Tensor& q_mask, const Tensor& weight, const c10::optional<Tensor>& bias) {
  check_similarity_args(op, c, q, weight, bias);
  check_mask(op, "c_mask", c_mask, c.size(0), c.size(1));
  check_mask(op, "q_mask", q_mask, q.size(0), q.size(1));
}

std::tuple<Tensor, Tensor, Tensor> context_query_attention_fwd(const Tensor& c_in, const Tensor& q_in,
                                                               const Tensor& c_mask_in, const Tensor& q_mask_in,
                                                               const Tensor& weight_in,
                                                               const c10::optional<Tensor>& bias) {
  constexpr const char* op = "fastqa::context_query_attention_fwd";
  gemm::prepare();
  check_attention_args(op, c_in, q_in, c_mask_in, q_mask_in, weight_in, bias);
  if (bf16::is_bf16(c_in)) {  // out in bf16; the probabilities (aux) stay float32
    const auto run = [&](gemm::Route route) -> std::tuple<Tensor, Tensor, Tensor> {
      if (route == gemm::Route::kNative && gemm::bf16_brgemm_usable()) {
        return context_query_attention_fwd_native(c_in, q_in, c_mask_in, q_mask_in, weight_in, bias);
      }
      gemm::Bf16Products scope(route == gemm::Route::kNative);
      auto [o, row, col] = context_query_attention_fwd(convert_large(c_in, at::kFloat), bf16::widen(q_in),
                                                       c_mask_in, q_mask_in, bf16::widen(weight_in),
                                                       bf16::widen(bias));
      return {convert_large(o, at::kBFloat16), row, col};
    };
    return run(gemm::route_for(op, shape_class_of(c_in, q_in), [&](gemm::Route r) { (void)run(r); }));
  }
  const Tensor c = c_in.contiguous(), q = q_in.contiguous(), weight = weight_in.contiguous();
  const Tensor c_mask = c_mask_in.contiguous(), q_mask = q_mask_in.contiguous();
  const int64_t batch = c.size(0), n = c.size(1), m = q.size(1), d = c.size(2);
  Tensor out = empty_large({batch, n, 4 * d}, c.options());
  Tensor p_row = empty_large({batch, n, m}, c.options());
  Tensor p_col = empty_large({batch, n + d, m}, c.options());
  AT_DISPATCH_FLOATING_TYPES(c.scalar_type(), op, [&] {
    const auto w = unpack_weights<scalar_t>(weight, bias);
    const bool b16 = gemm::bf16_products();  // the caller's bf16 products, for the GEMMs the workers issue
    at::parallel_for(0, batch, 1, [&](int64_t b0, int64_t b1) {
      at::AutoDispatchBelowADInplaceOrView guard;
      gemm::Bf16Products scope(b16);
      SimilarityScratch<scalar_t> sim(m, d, c.options());
      Tensor qt = at::empty({m, 2 * d}, c.options());  // [q, S̿ᵀc]: the right factors of A and B
      Tensor ab = at::empty({n, 2 * d}, c.options());  // [A, B]
      Tensor q_slot = qt.narrow(1, 0, d), ctc = qt.narrow(1, d, d);
      std::vector<scalar_t> col_max(m), col_sum(m), q_real(m), c_real(n);
      for (int64_t b = b0; b < b1; ++b) {
        const Tensor c_b = c[b], q_b = q[b], p_b = p_row[b], pc_b = p_col[b].narrow(0, 0, n);
        const scalar_t* cb = ptr<scalar_t>(c_b);
        bilinear_term(c_b, q_b, w, sim, pc_b);
        mask_to_real(ptr<bool>(q_mask) + b * m, q_real.data(), m);
        mask_to_real(ptr<bool>(c_mask) + b * n, c_real.data(), n);
        const auto context_term = [&](int64_t i) { return dot(cb + i * d, w.wc, d); };
        masked_softmaxes(ptr<scalar_t>(pc_b), ptr<scalar_t>(p_b), context_term, sim.sq.data(), q_real.data(),
                         c_real.data(), n, m, col_max.data(), col_sum.data());
        q_slot.copy_(q_b);
        gemm::mm_out(ctc, pc_b.t(), c_b);  // S̿ᵀ·c
        transpose_into(ptr<scalar_t>(pc_b) + n * m, m, ptr<scalar_t>(ctc), 2 * d, d, m);  // saved for the backward
        gemm::mm_out(ab, p_b, qt);         // [A, B] = S̄·[q, S̿ᵀ·c]: one GEMM for both
        attention_output(ptr<scalar_t>(out[b]), cb, ptr<scalar_t>(ab), n, d);
      }
    });
  });
  return {out, p_row, p_col};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> context_query_attention_bwd(
    const Tensor& grad_out, const Tensor& c_in, const Tensor& q_in, const Tensor& c_mask, const Tensor& q_mask,
    const Tensor& weight_in, const c10::optional<Tensor>& bias, const Tensor& out_in, const Tensor& aux_row,
    const Tensor& aux_col) {
  constexpr const char* op = "fastqa::context_query_attention_bwd";
  gemm::prepare();
  check_attention_args(op, c_in, q_in, c_mask, q_mask, weight_in, bias);
  const int64_t batch = c_in.size(0), n = c_in.size(1), m = q_in.size(1), d = c_in.size(2);
  check_same_shape(op, "grad_out", grad_out, {batch, n, 4 * d}, c_in.scalar_type());
  check_same_shape(op, "out", out_in, {batch, n, 4 * d}, c_in.scalar_type());
  check_same_shape(op, "aux_row", aux_row, {batch, n, m}, bf16::statistics_dtype(c_in));
  check_same_shape(op, "aux_col", aux_col, {batch, n + d, m}, bf16::statistics_dtype(c_in));
  if (bf16::is_bf16(c_in)) {
    const auto run = [&](gemm::Route route) -> std::tuple<Tensor, Tensor, Tensor, Tensor> {
      if (route == gemm::Route::kNative && gemm::bf16_brgemm_usable()) {
        return context_query_attention_bwd_native(grad_out, c_in, q_in, c_mask, q_mask, weight_in, bias, out_in,
                                                  aux_row, aux_col);
      }
      gemm::Bf16Products scope(route == gemm::Route::kNative);
      // The kernel reads only A = out[..., d:2d] of out (attention_output_backward): that quarter alone is
      // widened, the rest of the float32 copy is never read.
      Tensor out_a = empty_large(out_in.sizes(), out_in.options().dtype(at::kFloat));
      out_a.narrow(2, d, d).copy_(out_in.narrow(2, d, d));
      auto [gc, gq, gw, gb] = context_query_attention_bwd(
          convert_large(grad_out, at::kFloat), convert_large(c_in, at::kFloat), bf16::widen(q_in), c_mask, q_mask,
          bf16::widen(weight_in), bf16::widen(bias), out_a, aux_row, aux_col);
      return {convert_large(gc, at::kBFloat16), bf16::narrow(gq), bf16::grad_like(gw, weight_in),
              bf16::grad_like(gb, bias)};
    };
    return run(gemm::route_for(op, shape_class_of(c_in, q_in), [&](gemm::Route r) { (void)run(r); }));
  }
  const Tensor g = grad_out.contiguous(), c = c_in.contiguous(), q = q_in.contiguous(),
               weight = weight_in.contiguous(), out = out_in.contiguous(), p_row = aux_row.contiguous(),
               p_col = aux_col.contiguous();
  Tensor grad_c = empty_large(c.sizes(), c.options()), grad_q = at::empty_like(q);
  std::pair<Tensor, Tensor> weight_grads;
  AT_DISPATCH_FLOATING_TYPES(c.scalar_type(), op, [&] {
    weight_grads = backward_over_batch<scalar_t>(c, weight, bias, [&](const Weights<scalar_t>& w, int64_t b0,
                                                                      int64_t b1, scalar_t* partial) {
      const auto opts = c.options();
      SimilarityScratch<scalar_t> sim(m, d, opts);
      SimilarityGradScratch<scalar_t> sim_grad(m, d, opts);
      Tensor qt = at::empty({m, 2 * d}, opts);   // [q, S̿ᵀc]: the right factors of A and B
      Tensor dab = at::empty({n, 2 * d}, opts);  // [dA, dB]
      Tensor dp = at::empty({n, m}, opts), dpc = at::empty({n, m}, opts);
      Tensor dq_dctc = at::empty({m, 2 * d}, opts);  // [S̄ᵀ·dA, d(S̿ᵀc) = S̄ᵀ·dB]: one GEMM for both
      std::vector<scalar_t> col_dot(m);
      Tensor q_slot = qt.narrow(1, 0, d), ctc = qt.narrow(1, d, d);
      Tensor dq_a = dq_dctc.narrow(1, 0, d), d_ctc = dq_dctc.narrow(1, d, d);
      for (int64_t b = b0; b < b1; ++b) {
        const Tensor c_b = c[b], q_b = q[b], p_b = p_row[b], pc_b = p_col[b].narrow(0, 0, n);
        Tensor dc_b = grad_c[b], dq_b = grad_q[b];
        const scalar_t* cb = ptr<scalar_t>(c_b);
        q_slot.copy_(q_b);
        scale_question(ptr<scalar_t>(q_b), w.wcq, ptr<scalar_t>(sim.qw), m, d);
        transpose_into(ptr<scalar_t>(ctc), 2 * d, ptr<scalar_t>(pc_b) + n * m, m, m, d);  // the forward's S̿ᵀ·c
        gemm::mm_out(dc_b, p_b, ctc);  // B, recomputed into dc's buffer
        attention_output_backward(ptr<scalar_t>(g[b]), ptr<scalar_t>(out[b]), cb, ptr<scalar_t>(dab),
                                  ptr<scalar_t>(dc_b), n, d);
        gemm::mm_out(dp, dab, qt.t());          // dS̄ = dA·qᵀ + dB·(S̿ᵀc)ᵀ
        gemm::mm_out(dq_dctc, p_b.t(), dab);    // [S̄ᵀ·dA, S̄ᵀ·dB]
        dq_b.copy_(dq_a);                       // dq = S̄ᵀ·dA (+ similarity part below)
        gemm::mm_out(dpc, c_b, d_ctc.t());      // dS̿ = c·d(S̿ᵀc)ᵀ
        masked_softmaxes_backward(ptr<scalar_t>(dp), ptr<scalar_t>(dpc), ptr<scalar_t>(p_b), ptr<scalar_t>(pc_b),
                                  n, m, col_dot.data());
        gemm::mm_out(dc_b, pc_b, d_ctc, /*accumulate=*/true);  // dc += S̿·d(S̿ᵀc)
        bilinear_backward(dp, c_b, q_b, sim.qw, w, dc_b, dq_b, /*accumulate=*/true, sim_grad,
                          partial + b * (3 * d + 1));
      }
    });
  });
  return {grad_c, grad_q, weight_grads.first, weight_grads.second};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(fastqa, m) {
  FASTQA_CPU_OP(m, trilinear_similarity_fwd, "(Tensor c, Tensor q, Tensor weight, Tensor? bias) -> Tensor s");
  FASTQA_CPU_OP(m, trilinear_similarity_bwd,
                "(Tensor grad_s, Tensor c, Tensor q, Tensor weight, Tensor? bias) "
                "-> (Tensor grad_c, Tensor grad_q, Tensor grad_weight, Tensor grad_bias)");
  FASTQA_CPU_OP(m, context_query_attention_fwd,
                "(Tensor c, Tensor q, Tensor c_mask, Tensor q_mask, Tensor weight, Tensor? bias) "
                "-> (Tensor out, Tensor aux_row, Tensor aux_col)");
  FASTQA_CPU_OP(m, context_query_attention_bwd,
                "(Tensor grad_out, Tensor c, Tensor q, Tensor c_mask, Tensor q_mask, Tensor weight, Tensor? bias, "
                "Tensor out, Tensor aux_row, Tensor aux_col) "
                "-> (Tensor grad_c, Tensor grad_q, Tensor grad_weight, Tensor grad_bias)");
}

}  // namespace fastqa
