// The one GEMM entry point of the CPU kernels: every contraction of every op goes through here.
//
// Engines (both are what the installed torch ships; nothing is linked twice):
//   * blas   -- at::mm / at::addmm: MKL or OpenBLAS, whatever torch was built with. Always there,
//               and the only engine for float64.
//   * onednn -- torch's own oneDNN, through the dispatcher ops mkldnn::_linear_pointwise(.binary)
//               (the ops torch.compile's CPU backend uses). float32 only; there where the torch build
//               has them and torch.backends.mkldnn is enabled.
// On AMD processors MKL's sgemm runs its AVX2 code while oneDNN's runs AVX-512: up to ~2x apart.
// On Intel the two are close. So the engine is chosen once per process, at the first call of an op,
// by timing one float32 GEMM with each (gemm::choice()), or forced by FASTQA_CPU_GEMM=blas|onednn
// (auto: measure). Later calls never re-measure: the engine cannot change between a forward and its
// backward, and repeated backwards stay bit-identical.
//
// Call gemm::prepare() at the top of an op, outside any parallel region: the first call measures
// (with all threads). A GEMM issued inside at::parallel_for runs single-threaded in either engine.
#pragma once

#include <ATen/ATen.h>

#include <c10/util/Optional.h>

#include <string>

namespace fastqa {
namespace gemm {

enum class Engine { kBlas = 0, kOneDnn = 1 };

const char* engine_name(Engine e);

// What the first use decided, and why.
struct Choice {
  Engine engine = Engine::kBlas;
  std::string requested;          // FASTQA_CPU_GEMM: "auto" (unset), "blas" or "onednn"
  bool onednn_available = false;  // the torch build has the ops and torch.backends.mkldnn is enabled
};

// The process's choice, made on first call (thread-safe). Raises on a bad FASTQA_CPU_GEMM value or
// on FASTQA_CPU_GEMM=onednn where oneDNN is not available.
const Choice& choice();

// The decision itself, a pure function (unit-tested with made-up rates): "blas" / "onednn" force an
// engine (onednn raises when unavailable); "auto" takes oneDNN when available and measured at least
// kOneDnnMargin times BLAS's rate (noise on a loaded machine must not flip a tie away from BLAS).
constexpr double kOneDnnMargin = 1.05;
Engine choose(double blas_gflops, double onednn_gflops, bool onednn_available, const std::string& requested);

// Each engine's measured float32 rate (GFLOP/s, one 512^3 product, best of a few interleaved runs,
// at the current thread count); onednn is 0 where unavailable. Measured once, on first call.
struct Rates {
  double blas = 0, onednn = 0;
};
const Rates& rates();

bool onednn_available();

// Makes the choice if not made yet. Call at the top of each op (outside parallel regions).
inline void prepare() { (void)choice(); }

// The engine for this dtype: float32 -> the chosen engine; float64 -> BLAS.
Engine engine_for(at::ScalarType dtype);

// out (=, or += when accumulate) a @ b. a [M, K], b [K, N], out [M, N]: any strides (transposed
// views included). oneDNN writes a fresh result that is copied into out: prefer mm() when the caller
// can take a new tensor.
void mm_out(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b, bool accumulate = false);

// a @ b (+ acc) as a tensor: BLAS accumulates into acc in place and returns it; oneDNN fuses the add
// (a binary post-op) and returns a new tensor. Callers use the returned tensor, never acc.
at::Tensor mm(const at::Tensor& a, const at::Tensor& b, const at::Tensor& acc = at::Tensor());

// a @ wᵀ + bias as a new [M, N] tensor (nn.Linear layout: w [N, K]); the bias is fused into the GEMM.
at::Tensor linear(const at::Tensor& a, const at::Tensor& w, const c10::optional<at::Tensor>& bias);

}  // namespace gemm
}  // namespace fastqa
