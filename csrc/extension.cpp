// fastqa._C: the CPU kernels register themselves as torch.ops.fastqa.* (TORCH_LIBRARY_FRAGMENT +
// TORCH_LIBRARY_IMPL in csrc/cpu/<op>.cpp); this file owns the namespace and the Python module.
#include <ATen/Parallel.h>
#include <pybind11/pybind11.h>
#include <torch/library.h>

#include <string>
#include <vector>

#include "cpu/gemm.h"

TORCH_LIBRARY(fastqa, m) {
  // Schemas live next to their kernels (csrc/cpu/*.cpp, TORCH_LIBRARY_FRAGMENT).
}

namespace {
// One Python dict per recorded choice, in the order the choices were made.
template <class Record, class ToDict>
pybind11::list to_dicts(const std::vector<Record>& records, ToDict to_dict) {
  pybind11::list out;
  for (const Record& record : records) out.append(to_dict(record));
  return out;
}
}  // namespace

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
        pybind11::dict tile_rates;
        tile_rates["blas"] = r.tile_blas;
        if (c.onednn_available) tile_rates["onednn"] = r.tile_onednn;
        pybind11::dict out;
        out["engine"] = gemm::engine_name(gemm::process_engine());
        out["requested"] = c.requested;
        out["onednn_available"] = c.onednn_available;
        out["gflops"] = rates;
        out["tile_gflops"] = tile_rates;
        using pybind11::arg;
        out["shapes"] = to_dicts(gemm::shape_choices(), [](const gemm::ShapeChoice& s) {
          return pybind11::dict(arg("m") = s.m, arg("k") = s.k, arg("n") = s.n, arg("threads") = s.threads,
                                arg("a") = std::string(1, s.a_layout), arg("w") = std::string(1, s.w_layout),
                                arg("bias") = s.bias, arg("accumulate") = s.accumulate,
                                arg("gflops") = pybind11::dict(arg("blas") = s.blas_gflops, arg("onednn") = s.onednn_gflops),
                                arg("engine") = gemm::engine_name(s.engine), arg("restored") = s.restored);
        });
        out["routes"] = to_dicts(gemm::route_choices(), [](const gemm::RouteChoice& r) {
          return pybind11::dict(arg("op") = r.op, arg("shape") = r.shape, arg("threads") = r.threads,
                                arg("ms") = pybind11::dict(arg("native") = r.native_ms, arg("widen") = r.widen_ms),
                                arg("route") = gemm::route_name(r.route), arg("restored") = r.restored);
        });
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
