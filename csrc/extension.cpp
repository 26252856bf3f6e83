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
        out["engine"] = gemm::engine_name(gemm::process_engine());
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
          d["a"] = std::string(1, s.a_layout);
          d["w"] = std::string(1, s.w_layout);
          d["bias"] = s.bias;
          d["accumulate"] = s.accumulate;
          d["gflops"] = pybind11::dict(pybind11::arg("blas") = s.blas_gflops, pybind11::arg("onednn") = s.onednn_gflops);
          d["engine"] = gemm::engine_name(s.engine);
          d["restored"] = s.restored;
          shapes.append(d);
        }
        out["shapes"] = shapes;
        pybind11::list routes;
        for (const gemm::RouteChoice& r : gemm::route_choices()) {
          pybind11::dict d;
          d["op"] = r.op;
          d["shape"] = r.shape;
          d["threads"] = r.threads;
          d["ms"] = pybind11::dict(pybind11::arg("native") = r.native_ms, pybind11::arg("widen") = r.widen_ms);
          d["route"] = gemm::route_name(r.route);
          d["restored"] = r.restored;
          routes.append(d);
        }
        out["routes"] = routes;
        out["bf16_route"] = gemm::requested_route();
        out["bf16_brgemm"] = gemm::bf16_brgemm_usable();
        return out;
      },
      "The CPU kernels' GEMM engine: the process's (float32), what FASTQA_CPU_GEMM asked for, whether "
      "oneDNN is usable, each engine's measured float32 rate in GFLOP/s, and the per-shape choices made "
      "so far (auto: each top-level GEMM shape measured with both engines)");
  m.def(
      "gemm_restore",
      [](const std::string& engine, const pybind11::list& shapes) {
        namespace gemm = fastqa::gemm;
        auto parse = [](const std::string& name) {
          TORCH_CHECK(name == "blas" || name == "onednn", "gemm_restore: engine must be blas or onednn, got '", name, "'");
          return name == "onednn" ? gemm::Engine::kOneDnn : gemm::Engine::kBlas;
        };
        std::vector<gemm::ShapeChoice> parsed;
        for (const auto& item : shapes) {
          const auto d = item.cast<pybind11::dict>();
          gemm::ShapeChoice s;
          s.m = d["m"].cast<int64_t>();
          s.k = d["k"].cast<int64_t>();
          s.n = d["n"].cast<int64_t>();
          s.threads = d["threads"].cast<int>();
          s.a_layout = d["a"].cast<std::string>().at(0);
          s.w_layout = d["w"].cast<std::string>().at(0);
          s.bias = d["bias"].cast<bool>();
          s.accumulate = d["accumulate"].cast<bool>();
          s.engine = parse(d["engine"].cast<std::string>());
          parsed.push_back(s);
        }
        gemm::restore(parse(engine), parsed);
      },
      "Take the process engine and the per-shape choices of gemm_info() from another process (a training "
      "checkpoint), so a resumed run multiplies every shape on the same engine; no-op unless "
      "FASTQA_CPU_GEMM=auto and oneDNN is usable");
  m.def(
      "route_restore",
      [](const pybind11::list& routes) {
        namespace gemm = fastqa::gemm;
        std::vector<gemm::RouteChoice> parsed;
        for (const auto& item : routes) {
          const auto d = item.cast<pybind11::dict>();
          gemm::RouteChoice r;
          r.op = d["op"].cast<std::string>();
          r.shape = d["shape"].cast<std::string>();
          r.threads = d["threads"].cast<int>();
          const std::string name = d["route"].cast<std::string>();
          TORCH_CHECK(name == "native" || name == "widen", "route_restore: route must be native or widen, got '",
                      name, "'");
          r.route = name == "widen" ? gemm::Route::kWiden : gemm::Route::kNative;
          parsed.push_back(r);
        }
        gemm::restore_routes(parsed);
      },
      "Take the bf16 route choices of gemm_info()['routes'] from another process (a training checkpoint or "
      "the machine's plan cache), so each op and shape class runs the route it ran there");
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
