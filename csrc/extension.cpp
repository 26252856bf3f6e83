// fastqa._C: the CPU kernels register themselves as torch.ops.fastqa.* (TORCH_LIBRARY_FRAGMENT +
// TORCH_LIBRARY_IMPL in csrc/cpu/<op>.cpp); this file owns the namespace and the Python module.
#include <ATen/Parallel.h>
#include <pybind11/pybind11.h>
#include <torch/library.h>

TORCH_LIBRARY(fastqa, m) {
  // Schemas live next to their kernels (csrc/cpu/*.cpp, TORCH_LIBRARY_FRAGMENT).
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "fastqa CPU kernels; the ops themselves are torch.ops.fastqa.*";
  m.def("parallel_info", []() { return at::get_parallel_info(); },
        "ATen's description of the thread pool the kernels run on");
#ifdef __AVX512F__
  m.attr("simd") = "avx512";
#elif defined(__AVX2__)
  m.attr("simd") = "avx2";
#else
  m.attr("simd") = "baseline";
#endif
}
