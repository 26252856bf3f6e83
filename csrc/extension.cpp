// fastqa._C: the CPU kernels register themselves as torch.ops.fastqa.* (TORCH_LIBRARY_FRAGMENT +
// TORCH_LIBRARY_IMPL in csrc/cpu/<op>.cpp); this file owns the namespace and the Python module.
#include <ATen/Parallel.h>
#include <pybind11/pybind11.h>
#include <torch/library.h>

#include "cpu/gemm.h"

TORCH_LIBRARY(fastqa, m) {
  // Schemas live next to their kernels (csrc/cpu/*.cpp, TORCH_LIBRARY_FRAGMENT).
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "fastqa CPU kernels; the ops themselves are torch.ops.fastqa.*";
  m.def("parallel_info", []() { return at::get_parallel_info(); },
        "ATen's description of the thread pool the kernels run on");
  m.def(
      "gemm_info",
      []() {
        namespace gemm = fastqa::gemm;
        const gemm::Choice& c = gemm::choice();  // makes the choice (measuring) if not made yet
        const gemm::Rates& r = gemm::rates();
        pybind11::dict rates;
        rates["blas"] = r.blas;
        if (c.onednn_available) rates["onednn"] = r.onednn;
        pybind11::dict out;
        out["engine"] = gemm::engine_name(c.engine);
        out["requested"] = c.requested;
        out["onednn_available"] = c.onednn_available;
        out["gflops"] = rates;
        pybind11::list shapes;
        for (const gemm::ShapeChoice& s : gemm::shape_choices()) {
          pybind11::dict d;
          d["m"] = s.m;
          d["k"] = s.k;
          d["n"] = s.n;
          d["threads"] = s.threads;
          d["layout"] = s.layout;
          d["gflops"] = pybind11::dict(pybind11::arg("blas") = s.blas_gflops, pybind11::arg("onednn") = s.onednn_gflops);
          d["engine"] = gemm::engine_name(s.engine);
          shapes.append(d);
        }
        out["shapes"] = shapes;
        return out;
      },
      "The CPU kernels' GEMM engine: the process's (float32), what FASTQA_CPU_GEMM asked for, whether "
      "oneDNN is usable, each engine's measured float32 rate in GFLOP/s, and the per-shape choices made "
      "so far (auto: each top-level GEMM shape measured with both engines)");
  m.def(
      "gemm_choose",
      [](double blas_gflops, double onednn_gflops, bool onednn_available, const std::string& requested) {
        return std::string(fastqa::gemm::engine_name(
            fastqa::gemm::choose(blas_gflops, onednn_gflops, onednn_available, requested)));
      },
      "The engine the chooser picks for the given measured rates and FASTQA_CPU_GEMM value (a pure "
      "function, for tests)");
#ifdef __AVX512F__
  m.attr("simd") = "avx512";
#elif defined(__AVX2__)
  m.attr("simd") = "avx2";
#else
  m.attr("simd") = "baseline";
#endif
}
