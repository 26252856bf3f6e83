// The GEMM entry point: engine detection, the once-per-process choice, and the two engines' calls.
// See gemm.h.
#include "cpu/gemm.h"

#include "cpu/bf16.h"
#include "cpu/bf16_rows.h"
#include "cpu/common.h"

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/jit_type.h>
#include <ATen/native/CPUBlas.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace fastqa {
namespace gemm {
namespace {

// torch's oneDNN linear ops, looked up through the dispatcher (they have no public C++ header) and
// called boxed, so that the C++ signature of their kernels may change between torch versions.
const c10::OperatorHandle* find_cpu_op(const char* name, const char* overload) {
  const auto handle = c10::Dispatcher::singleton().findSchema({name, overload});
  if (!handle.has_value() || !handle->hasKernelForDispatchKey(c10::DispatchKey::CPU)) return nullptr;
  return new c10::OperatorHandle(*handle);  // lives as long as the process (the registry does too)
}

struct OneDnnOps {
  const c10::OperatorHandle* linear = nullptr;         // mkldnn::_linear_pointwise
  const c10::OperatorHandle* linear_binary = nullptr;  // mkldnn::_linear_pointwise.binary
  OneDnnOps()
      : linear(find_cpu_op("mkldnn::_linear_pointwise", "")),
        linear_binary(find_cpu_op("mkldnn::_linear_pointwise", "binary")) {}
  bool found() const { return linear != nullptr && linear_binary != nullptr; }
};

const OneDnnOps& onednn_ops() {
  static const OneDnnOps ops;
  return ops;
}

c10::IValue optional_tensor(const c10::optional<at::Tensor>& t) {
  return t.has_value() && t->defined() ? c10::IValue(*t) : c10::IValue();
}

// The weight as oneDNN's fast inner product takes it: dense, row- or column-major ([N, K] or a
// transposed view of a contiguous [K, N]). Any other strides (e.g. a column slice of a wider matrix)
// send oneDNN to its reference kernel, measured 1300x slower ([50, 400] x [400, 128], row stride 256):
// those are copied first.
at::Tensor dense_weight(const at::Tensor& w) {
  return w.is_contiguous() || w.t().is_contiguous() ? w : w.contiguous();
}

// a @ wᵀ (+ bias), w [N, K]: a fresh [M, N] tensor. oneDNN reads w through its strides.
at::Tensor onednn_linear(const at::Tensor& a, const at::Tensor& w, const c10::optional<at::Tensor>& bias) {
  std::vector<c10::IValue> stack;
  stack.reserve(6);
  stack.emplace_back(a);
  stack.emplace_back(dense_weight(w));
  stack.emplace_back(optional_tensor(bias));
  stack.emplace_back(std::string("none"));
  stack.emplace_back(c10::impl::GenericList(c10::OptionalType::create(c10::NumberType::get())));
  stack.emplace_back(c10::IValue());  // algorithm: None
  onednn_ops().linear->callBoxed(&stack);
  return stack[0].toTensor();
}

// a @ wᵀ + other (the add fused as a binary post-op): a fresh [M, N] tensor.
at::Tensor onednn_linear_add(const at::Tensor& a, const at::Tensor& other, const at::Tensor& w) {
  std::vector<c10::IValue> stack;
  stack.reserve(5);
  stack.emplace_back(a);
  stack.emplace_back(other);
  stack.emplace_back(dense_weight(w));
  stack.emplace_back(c10::IValue());  // bias: None
  stack.emplace_back(std::string("add"));
  onednn_ops().linear_binary->callBoxed(&stack);
  return stack[0].toTensor();
}

// Seconds per call of each fn: the median of interleaved calls (load from other processes lands on both
// alike) after one warm-up call each -- at least `min_reps` of each, and more, up to `max_reps`, until
// each fn has run ~`budget` seconds. For a product of a few milliseconds, best-of-two picked either engine
// where they ran within ~5% of each other (BLAS and oneDNN on QANet's [rows, 128] x [128, 384]), and
// processes of the same program ran different engines.
template <typename F, typename G>
std::pair<double, double> time_pair(F&& f, G&& g, int min_reps, int max_reps, double budget) {
  using clock = std::chrono::steady_clock;
  const auto seconds = [](clock::time_point a, clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
  };
  const auto t0 = clock::now();
  f();
  const auto t1 = clock::now();
  g();
  const auto t2 = clock::now();
  const double slower = std::max(seconds(t0, t1), seconds(t1, t2));
  const int reps = std::clamp(static_cast<int>(budget / std::max(slower, 1e-9)), min_reps, max_reps);
  std::vector<double> tf, tg;
  for (int r = 0; r < reps; ++r) {
    const auto a = clock::now();
    f();
    const auto b = clock::now();
    g();
    const auto c = clock::now();
    tf.push_back(seconds(a, b));
    tg.push_back(seconds(b, c));
  }
  const auto median = [](std::vector<double>& v) {
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    return v[v.size() / 2];
  };
  return {median(tf), median(tg)};
}

// GFLOP/s of each engine running its fn (one call: `flop` operations), medians of interleaved calls; oneDNN's 0 where
// it is unavailable (its fn is then never called).
template <typename F, typename G>
std::pair<double, double> engine_rates(double flop, F&& blas, G&& onednn) {
  if (!onednn_available()) return {flop / time_pair(blas, [] {}, 5, 25, 0.02).first / 1e9, 0.0};
  const auto t = time_pair(blas, onednn, 5, 25, 0.02);
  return {flop / t.first / 1e9, flop / t.second / 1e9};
}

Rates measure_rates() {
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  constexpr int64_t n = 512;
  // Fixed operands, not random ones: drawing from the global generator would change a seeded user's dropout
  // masks depending on whether this measurement ran before them. (The values do not change GEMM speed.)
  const at::Tensor a = at::linspace(-1.0, 1.0, n * n, at::kFloat).view({n, n});
  const at::Tensor w = a.flip({0}).contiguous();
  at::Tensor out = at::empty({n, n}, at::kFloat);
  const double flop = 2.0 * n * n * n;
  Rates r;
  std::tie(r.blas, r.onednn) = engine_rates(
      flop, [&] { at::mm_out(out, a, w.t()); }, [&] { (void)onednn_linear(a, w, c10::nullopt); });
  // What the process's engine serves: the kernels' tile products, each single-threaded inside a parallel region,
  // every thread multiplying its own tile at once, the product written into the tile's output (as gemm::mm_out
  // does on either engine).
  const int64_t threads = at::get_num_threads();
  const at::Tensor ta = a.narrow(0, 0, kTile).narrow(1, 0, kTile).contiguous();
  const at::Tensor tw = w.narrow(0, 0, kTile).narrow(1, 0, kTile).contiguous();
  std::vector<at::Tensor> touts;
  for (int64_t i = 0; i < threads; ++i) touts.push_back(at::empty({kTile, kTile}, at::kFloat));
  const auto tiles = [&](Engine engine) {
    at::parallel_for(0, threads, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        for (int rep = 0; rep < kTileReps; ++rep) {
          if (engine == Engine::kOneDnn) {
            touts[i].copy_(onednn_linear(ta, tw, c10::nullopt));
          } else {
            at::mm_out(touts[i], ta, tw.t());
          }
        }
      }
    });
  };
  std::tie(r.tile_blas, r.tile_onednn) = engine_rates(2.0 * kTile * kTile * kTile * kTileReps * threads,
                                                      [&] { tiles(Engine::kBlas); }, [&] { tiles(Engine::kOneDnn); });
  return r;
}

std::string requested_engine() {
  const char* env = std::getenv("FASTQA_CPU_GEMM");
  std::string v = env == nullptr ? "" : env;
  return v.empty() ? "auto" : v;
}

}  // namespace

const char* engine_name(Engine e) { return e == Engine::kOneDnn ? "onednn" : "blas"; }

bool onednn_available() {
  return at::hasMKLDNN() && at::globalContext().userEnabledMkldnn() && onednn_ops().found();
}

Engine choose(double blas_gflops, double onednn_gflops, bool available, const std::string& requested) {
  if (requested == "blas") return Engine::kBlas;
  if (requested == "onednn") {
    TORCH_CHECK(available,
                "FASTQA_CPU_GEMM=onednn: this torch build has no usable oneDNN (torch.backends.mkldnn "
                "unavailable or disabled); use FASTQA_CPU_GEMM=auto or blas");
    return Engine::kOneDnn;
  }
  TORCH_CHECK(requested == "auto", "FASTQA_CPU_GEMM must be auto, blas or onednn, got '", requested, "'");
  return available && onednn_gflops >= kOneDnnMargin * blas_gflops ? Engine::kOneDnn : Engine::kBlas;
}

const Rates& rates() {
  static const Rates measured = measure_rates();
  return measured;
}

const Choice& choice() {
  static const Choice made = [] {
    Choice c;
    c.requested = requested_engine();
    c.onednn_available = onednn_available();
    if (c.requested == "auto" && c.onednn_available) {
      const Rates& r = rates();
      c.engine = choose(r.tile_blas, r.tile_onednn, true, c.requested);
    } else {
      c.engine = choose(0, 0, c.onednn_available, c.requested);  // forced, or nothing to compare
    }
    return c;
  }();
  return made;
}

namespace {

std::atomic<int> restored_process_engine{-1};  // -1: none; else an Engine set by restore()

// A probe multiplies at most this many rows of a: enough for the shape's steady-state rate (a product
// of 1600 rows and one of 12800 rows can prefer different engines), bounded in cost.
constexpr int64_t kProbeRows = 4096;

int64_t pow2_at_least(int64_t v) {
  int64_t p = 1;
  while (p < v) p <<= 1;
  return p;
}

// 'r' row-major, 'c' column-major (a transposed view of a contiguous matrix), 's' any other strides.
char layout_of(const at::Tensor& t) {
  return t.is_contiguous() ? 'r' : t.t().is_contiguous() ? 'c' : 's';
}

using ShapeKey = std::tuple<int64_t, int64_t, int64_t, int, char, char, bool, bool>;

ShapeKey key_of(const ShapeChoice& s) {
  return ShapeKey{s.m, s.k, s.n, s.threads, s.a_layout, s.w_layout, s.bias, s.accumulate};
}

// The choices made so far, one per key, in the order first made. A lookup that misses makes the choice
// under the lock, so each key is measured once, whichever thread asks first.
template <typename Key, typename Value, typename Mutex>
class ChoiceTable {
 public:
  template <typename Make>
  Value get_or_make(const Key& key, Make&& make) {
    std::lock_guard<Mutex> lock(mutex_);
    const auto found = index_.find(key);
    if (found != index_.end()) return seen_[found->second];
    Value value = make();
    index_.emplace(key, seen_.size());
    seen_.push_back(value);
    return value;
  }

  // A restored plan's choice: replaces one made in this process, keeps its place.
  void put(const Key& key, const Value& value) {
    std::lock_guard<Mutex> lock(mutex_);
    const auto [slot, added] = index_.emplace(key, seen_.size());
    if (added) {
      seen_.push_back(value);
    } else {
      seen_[slot->second] = value;
    }
  }

  std::vector<Value> all() {
    std::lock_guard<Mutex> lock(mutex_);
    return seen_;
  }

 private:
  Mutex mutex_;
  std::vector<Value> seen_;
  std::map<Key, size_t> index_;
};

ChoiceTable<ShapeKey, ShapeChoice, std::mutex>& shape_table() {
  static ChoiceTable<ShapeKey, ShapeChoice, std::mutex> table;
  return table;
}

// Each engine's rate on this GEMM as the entry points issue it (into a scratch result: the caller's
// output is not touched): the median of interleaved calls, a few milliseconds of each engine.
std::pair<double, double> probe(const at::Tensor& a, const at::Tensor& w, bool with_bias, bool accumulate) {
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  const at::Tensor ap = a.narrow(0, 0, std::min<int64_t>(a.size(0), kProbeRows));
  const int64_t n = w.size(0);
  const c10::optional<at::Tensor> bias =
      with_bias ? c10::optional<at::Tensor>(at::zeros({n}, a.options())) : c10::nullopt;
  // The accumulator only where the product accumulates (a vocabulary-sized one would be large).
  at::Tensor acc = accumulate ? at::zeros({ap.size(0), n}, a.options()) : at::Tensor();
  return engine_rates(
      2.0 * ap.size(0) * ap.size(1) * n,
      [&] {
        if (accumulate) {
          acc.addmm_(ap, w.t());
        } else {
          (void)(with_bias ? at::addmm(*bias, ap, w.t()) : at::mm(ap, w.t()));
        }
      },
      [&] { (void)(accumulate ? onednn_linear_add(ap, acc, w) : onednn_linear(ap, w, bias)); });
}

}  // namespace

namespace {

thread_local bool bf16_products_on = false;

// Whether a @ b is taken in bf16 (see gemm.h): bf16 operands, or float32 ones in a Bf16Products scope.
bool in_bf16(const at::Tensor& a) {
  return a.scalar_type() == at::kBFloat16 || (a.scalar_type() == at::kFloat && bf16_products_on);
}

// a @ b on bf16 operands (float32 ones rounded), rounded to bf16, in a's dtype (bf16, or float32 widened from it).
at::Tensor bf16_mm(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor y = at::mm(bf16::narrow(a), bf16::narrow(b));
  return bf16::is_bf16(a) ? y : bf16::widen(y);
}

}  // namespace

Bf16Products::Bf16Products(bool enable) : previous_(bf16_products_on) { bf16_products_on = previous_ || enable; }
Bf16Products::~Bf16Products() { bf16_products_on = previous_; }
bool bf16_products() { return bf16_products_on; }

Engine process_engine() {
  const int restored = restored_process_engine.load(std::memory_order_relaxed);
  return restored >= 0 ? static_cast<Engine>(restored) : choice().engine;
}

Engine engine_for(at::ScalarType dtype) {
  return dtype == at::kFloat ? process_engine() : Engine::kBlas;
}

std::vector<ShapeChoice> shape_choices() {
  return shape_table().all();
}

void restore(Engine process, const std::vector<ShapeChoice>& shapes) {
  const Choice& c = choice();
  if (c.requested != "auto" || !c.onednn_available) return;  // forced, or BLAS only: the same everywhere
  restored_process_engine.store(static_cast<int>(process), std::memory_order_relaxed);
  for (ShapeChoice s : shapes) {
    s.restored = true;
    s.blas_gflops = s.onednn_gflops = 0;
    shape_table().put(key_of(s), s);
  }
}

Engine engine_for(const at::Tensor& a, const at::Tensor& w, bool with_bias, bool accumulate) {
  const Choice& c = choice();
  const int64_t m = a.size(0), k = a.size(1), n = w.size(0);
  if (a.scalar_type() != at::kFloat || c.requested != "auto" || !c.onednn_available || at::in_parallel_region()) {
    return engine_for(a.scalar_type());
  }
  ShapeChoice s;
  s.m = pow2_at_least(m);
  s.k = k;
  s.n = n;
  s.threads = at::get_num_threads();
  s.a_layout = layout_of(a);
  s.w_layout = layout_of(w);
  s.bias = with_bias;
  s.accumulate = accumulate;
  return shape_table()
      .get_or_make(key_of(s),
                   [&] {
                     std::tie(s.blas_gflops, s.onednn_gflops) = probe(a, w, with_bias, accumulate);
                     s.engine = choose(s.blas_gflops, s.onednn_gflops, true, "auto");
                     return s;
                   })
      .engine;
}

void mm_out(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b, bool accumulate) {
  if (in_bf16(a)) {
    // The bf16 result goes into out as it is: a float32 out takes each bf16 value exactly, so widening it into
    // a float32 copy first (bf16_mm) would change nothing but cost a pass over it.
    const at::Tensor y = at::mm(bf16::narrow(a), bf16::narrow(b));
    accumulate ? out.add_(y) : out.copy_(y);
    return;
  }
  if (a.numel() > 0 && b.numel() > 0 && engine_for(a, b.t(), false, accumulate) == Engine::kOneDnn) {
    out.copy_(accumulate ? onednn_linear_add(a, out, b.t()) : onednn_linear(a, b.t(), c10::nullopt));
    return;
  }
  if (accumulate) {
    out.addmm_(a, b);
  } else {
    at::Tensor o = out;
    at::mm_out(o, a, b);
  }
}

at::Tensor mm(const at::Tensor& a, const at::Tensor& b, const at::Tensor& acc) {
  if (in_bf16(a)) {
    const at::Tensor y = bf16_mm(a, b);
    return acc.defined() ? acc.add_(y) : y;
  }
  if (a.numel() > 0 && b.numel() > 0 && engine_for(a, b.t(), false, acc.defined()) == Engine::kOneDnn) {
    return acc.defined() ? onednn_linear_add(a, acc, b.t()) : onednn_linear(a, b.t(), c10::nullopt);
  }
  if (acc.defined()) return acc.addmm_(a, b);
  return at::mm(a, b);
}

at::Tensor linear(const at::Tensor& a, const at::Tensor& w, const c10::optional<at::Tensor>& bias) {
  const bool has_bias = bias.has_value() && bias->defined();
  if (in_bf16(a)) {
    // The bias added in a's dtype after the product, as F.linear in bf16 does.
    const at::Tensor y = bf16_mm(a, w.t());
    return has_bias ? y.add_(*bias) : y;
  }
  if (a.numel() > 0 && w.numel() > 0 && engine_for(a, w, has_bias, false) == Engine::kOneDnn) {
    return onednn_linear(a, w, has_bias ? bias : c10::nullopt);
  }
  return has_bias ? at::addmm(*bias, a, w.t()) : at::mm(a, w.t());
}

// ---- bfloat16 routes ----------------------------------------------------------------------------------------

const char* route_name(Route r) { return r == Route::kWiden ? "widen" : "native"; }

std::string requested_route() {
  const char* env = std::getenv("FASTQA_CPU_BF16_ROUTE");
  const std::string v = env == nullptr || *env == '\0' ? "auto" : env;
  TORCH_CHECK(v == "auto" || v == "native" || v == "widen",
              "FASTQA_CPU_BF16_ROUTE must be auto, native or widen, got '", v, "'");
  return v;
}

std::string shape_class(std::initializer_list<std::pair<const char*, int64_t>> sizes) {
  std::string out;
  for (const auto& [name, v] : sizes) {
    if (!out.empty()) out += ' ';
    out += name;
    out += '=';
    out += std::to_string(pow2_at_least(v));
  }
  return out;
}

namespace {

using RouteKey = std::tuple<std::string, std::string, int>;

// The routes decided so far. Recursive: a route's measuring run may call another op.
ChoiceTable<RouteKey, RouteChoice, std::recursive_mutex>& route_table() {
  static ChoiceTable<RouteKey, RouteChoice, std::recursive_mutex> table;
  return table;
}

}  // namespace

Route route_for(const char* op, const std::string& shape, const std::function<void(Route)>& run) {
  const std::string requested = requested_route();
  if (requested == "native") return Route::kNative;
  if (requested == "widen") return Route::kWiden;
  RouteChoice r;
  r.op = op;
  if (r.op.rfind("fastqa::", 0) == 0) r.op.erase(0, 8);  // the op's schema name, recorded without its namespace
  r.shape = shape;
  r.threads = at::get_num_threads();
  return route_table()
      .get_or_make(RouteKey{r.op, r.shape, r.threads},
                   [&] {
                     // A few calls of each: the first of a class is measured on the caller's own inputs, so the
                     // cost is a handful of calls once per class and process (and none in a process that
                     // restored the plan). At least five of each: medians of three picked either route on a
                     // loaded machine.
                     const auto t =
                         time_pair([&] { run(Route::kNative); }, [&] { run(Route::kWiden); }, 5, 15, 0.05);
                     r.native_ms = t.first * 1e3;
                     r.widen_ms = t.second * 1e3;
                     r.route = r.native_ms <= r.widen_ms ? Route::kNative : Route::kWiden;
                     return r;
                   })
      .route;
}

std::vector<RouteChoice> route_choices() {
  return route_table().all();
}

void restore_routes(const std::vector<RouteChoice>& routes) {
  for (RouteChoice r : routes) {
    r.restored = true;
    r.native_ms = r.widen_ms = 0;
    route_table().put(RouteKey{r.op, r.shape, r.threads}, r);
  }
}

namespace {

// A source value's bf16 bits: a float32 rounded, a bf16 as it is.
inline uint16_t bits_of(float v) { return bf16::round_bits(v); }
inline uint16_t bits_of(c10::BFloat16 v) { return v.x; }
// Two bf16 as one 32-bit word, the first in the low half: the layout the bf16 dot-product and AMX instructions read.
inline uint32_t pair_of(uint16_t lo, uint16_t hi) { return lo | static_cast<uint32_t>(hi) << 16; }

// f(typed pointer to w's first value) for a float32 or bf16 w.
template <typename F>
void with_values(const char* op, const at::Tensor& w, F&& f) {
  TORCH_CHECK(w.scalar_type() == at::kFloat || w.scalar_type() == at::kBFloat16, op,
              ": w must be float32 or bfloat16, got ", w.scalar_type());
  if (w.scalar_type() == at::kFloat) {
    f(w.data_ptr<float>());
  } else {
    f(w.data_ptr<c10::BFloat16>());
  }
}

}  // namespace

template <typename T>
void pack_vnni(const T* src, const int64_t* rows, int64_t N, int64_t K, int64_t row_stride, int64_t col_stride,
               c10::BFloat16* out) {
  constexpr int64_t kPairs = 16;  // a block's output rows: each source row's reads stay within a few cache lines
  uint32_t* o = reinterpret_cast<uint32_t*>(out);  // word (i, n): the pair (m[n][2i], m[n][2i + 1])
  const int64_t pairs = ceil_div(K, 2), full = K / 2;
  // m's rows adjacent in memory (a transposed view, a block of activations): a pair of source lines interleaved at a
  // time, contiguous reads and writes.
  const bool lines = rows == nullptr && row_stride == 1;
  at::parallel_for(0, ceil_div(pairs, kPairs), 1, [&](int64_t b0, int64_t b1) {
    const int64_t i0 = b0 * kPairs, i1 = std::min(pairs, b1 * kPairs);
    if (lines) {
      for (int64_t i = i0; i < i1; ++i) {
        const T* a = src + 2 * i * col_stride;
        uint32_t* d = o + i * N;
        if (i < full) {
          const T* b = a + col_stride;
          for (int64_t n = 0; n < N; ++n) d[n] = pair_of(bits_of(a[n]), bits_of(b[n]));
        } else {
          for (int64_t n = 0; n < N; ++n) d[n] = bits_of(a[n]);
        }
      }
      return;
    }
    for (int64_t n = 0; n < N; ++n) {
      const T* row = src + (rows != nullptr ? rows[n] : n) * row_stride;
      for (int64_t i = i0; i < std::min(i1, full); ++i) {
        o[i * N + n] = pair_of(bits_of(row[2 * i * col_stride]), bits_of(row[(2 * i + 1) * col_stride]));
      }
      if (i1 > full) o[full * N + n] = bits_of(row[2 * full * col_stride]);
    }
  });
}

template <typename T>
void pack_transposed(const T* src, int64_t lds, int64_t rows, int64_t N, c10::BFloat16* dst) {
  // In tiles of 16 pairs by 16 columns: the pairs built row by row (contiguous reads), stored column by column.
  constexpr int64_t kTile = 16;
  const int64_t pairs = ceil_div(rows, 2);
  uint32_t* o = reinterpret_cast<uint32_t*>(dst);  // word (n, j): the pair (src[2j][n], src[2j + 1][n])
  at::parallel_for(0, ceil_div(pairs, kTile), 1, [&](int64_t t0, int64_t t1) {
    uint32_t tile[kTile][kTile];
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t j0 = t * kTile, nj = std::min(kTile, pairs - j0);
      for (int64_t n0 = 0; n0 < N; n0 += kTile) {
        const int64_t nn = std::min(kTile, N - n0);
        for (int64_t j = 0; j < nj; ++j) {
          const T* a = src + 2 * (j0 + j) * lds + n0;
          if (2 * (j0 + j) + 1 < rows) {
            for (int64_t c = 0; c < nn; ++c) tile[j][c] = pair_of(bits_of(a[c]), bits_of(a[lds + c]));
          } else {
            for (int64_t c = 0; c < nn; ++c) tile[j][c] = bits_of(a[c]);
          }
        }
        for (int64_t c = 0; c < nn; ++c) {
          for (int64_t j = 0; j < nj; ++j) o[(n0 + c) * pairs + j0 + j] = tile[j][c];
        }
      }
    }
  });
}

template void pack_vnni<float>(const float*, const int64_t*, int64_t, int64_t, int64_t, int64_t, c10::BFloat16*);
template void pack_vnni<c10::BFloat16>(const c10::BFloat16*, const int64_t*, int64_t, int64_t, int64_t, int64_t,
                                       c10::BFloat16*);
template void pack_transposed<float>(const float*, int64_t, int64_t, int64_t, c10::BFloat16*);
template void pack_transposed<c10::BFloat16>(const c10::BFloat16*, int64_t, int64_t, int64_t, c10::BFloat16*);

at::Tensor pack_vnni(const at::Tensor& w) {
  const int64_t N = w.size(0), K = w.size(1);
  at::Tensor out = at::empty({ceil_div(K, 2), N, 2}, w.options().dtype(at::kBFloat16));
  with_values("pack_vnni", w, [&](const auto* p) {
    pack_vnni(p, nullptr, N, K, w.stride(0), w.stride(1), out.data_ptr<c10::BFloat16>());
  });
  return out;
}

void bf16_brgemm(int64_t m, int64_t n, int64_t k, const c10::BFloat16* a, int64_t lda, const c10::BFloat16* b,
                 float* c, int64_t ldc, bool accumulate) {
  if (m == 0 || n == 0) return;
  at::native::cpublas::brgemm(m, n, k, lda, n, ldc, accumulate, a, b, c, /*is_vnni=*/true);
}

void bf16_brgemm_release() { at::native::cpublas::brgemm_release(/*is_vnni=*/true); }

at::Tensor bf16_tn_float(const at::Tensor& g_in, const at::Tensor& x_in) {
  const int64_t M = g_in.size(0), N = g_in.size(1), K = x_in.size(1);
  // The left factor is the transposed copy: of the narrower operand, the result transposed back if need be.
  if (K < N) return bf16_tn_float(x_in, g_in).t().contiguous();
  at::Tensor out = at::zeros({N, K}, g_in.options().dtype(at::kFloat));
  if (M == 0 || N == 0 || K == 0) return out;
  const at::Tensor g = g_in.stride(1) == 1 ? g_in : g_in.contiguous();
  const at::Tensor x = x_in.stride(1) == 1 ? x_in : x_in.contiguous();
  // The reduction over M in pairs (the packed layout): an odd M pairs its last row with zeros in both factors.
  const int64_t Mp = M + M % 2, ldx = x.stride(0);
  at::Tensor a = at::empty({N, Mp}, g.options());  // row-major left factor
  pack_transposed(g.data_ptr<c10::BFloat16>(), g.stride(0), M, N, a.data_ptr<c10::BFloat16>());
  const c10::BFloat16* ad = a.data_ptr<c10::BFloat16>();
  const c10::BFloat16* xd = x.data_ptr<c10::BFloat16>();
  float* od = out.data_ptr<float>();
  // Each task: a fixed band of the result's columns, its rows of the reduction taken in blocks, in order, each
  // block's right factor packed in cache just before its product: the same sums on any thread count, and no
  // packed copy of x in memory.
  constexpr int64_t kRowsPerBlock = 512;
  constexpr int64_t kCols = 32;
  at::parallel_for(0, ceil_div(K, kCols), 1, [&](int64_t t0, int64_t t1) {
    std::vector<c10::BFloat16> b(kRowsPerBlock * kCols);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t c0 = t * kCols, cols = std::min(kCols, K - c0);
      for (int64_t m0 = 0; m0 < M; m0 += kRowsPerBlock) {
        const int64_t mb = std::min(kRowsPerBlock, M - m0);
        // The block's rows in pairs: pack_vnni of its transpose (rows ldx apart, columns adjacent).
        pack_vnni(xd + m0 * ldx + c0, nullptr, cols, mb, 1, ldx, b.data());
        bf16_brgemm(N, cols, mb + mb % 2, ad + m0, Mp, b.data(), od + c0, K, /*accumulate=*/true);
      }
    }
    bf16_brgemm_release();
  });
  return out;
}

at::Tensor pack_nt(const at::Tensor& w) {
  const int64_t C = w.size(0), R = w.size(1), Rp = R + R % 2, s0 = w.stride(0), s1 = w.stride(1);
  // One pass straight from w's values (a float32 master weight rounded here): one tensor made per packing.
  at::Tensor out = at::empty({C * Rp}, w.options().dtype(at::kBFloat16));
  c10::BFloat16* o = out.data_ptr<c10::BFloat16>();
  with_values("pack_nt", w, [&](const auto* p) {
    for (int64_t c0 = 0; c0 < C; c0 += kNtBand) {
      pack_vnni(p + c0 * s0, nullptr, std::min(kNtBand, C - c0), R, s0, s1, o + c0 * Rp);
    }
  });
  return out;
}

at::Tensor bf16_nt(const at::Tensor& a_in, const at::Tensor& packed, int64_t C, const float* bias) {
  const int64_t M = a_in.size(0), R = a_in.size(1), Rp = R + R % 2;
  TORCH_CHECK(packed.numel() == C * Rp, "bf16_nt: packed holds ", packed.numel(), " values, expected ", C * Rp);
  at::Tensor y = at::empty({M, C}, a_in.options());
  if (M == 0 || C == 0) return y;
  const at::Tensor a = a_in.stride(1) == 1 ? a_in : a_in.contiguous();
  const int64_t lda = a.stride(0);
  const c10::BFloat16* ad = a.data_ptr<c10::BFloat16>();
  const c10::BFloat16* pd = packed.data_ptr<c10::BFloat16>();
  c10::BFloat16* yd = y.data_ptr<c10::BFloat16>();
  // Tasks: a block of rows times a band of columns, the bands of a block consecutive (its rows stay in cache).
  constexpr int64_t kRows = 64;
  const int64_t bands = ceil_div(C, kNtBand), tasks = ceil_div(M, kRows) * bands;
  at::parallel_for(0, tasks, 1, [&](int64_t t0, int64_t t1) {
    std::vector<float> c(kRows * kNtBand);
    std::vector<c10::BFloat16> padded;  // an odd R: the block's rows with a zero column, what the packing pairs
    int64_t padded_block = -1;
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t blk = t / bands, r0 = blk * kRows, rows = std::min(kRows, M - r0);
      const int64_t c0 = (t % bands) * kNtBand, cols = std::min(kNtBand, C - c0);
      const c10::BFloat16* ab = ad + r0 * lda;
      int64_t ldab = lda;
      if (R % 2 != 0) {
        if (padded_block != blk) {
          padded.assign(kRows * Rp, c10::BFloat16(0.0f));
          for (int64_t r = 0; r < rows; ++r) std::copy(ab + r * lda, ab + r * lda + R, padded.data() + r * Rp);
          padded_block = blk;
        }
        ab = padded.data();
        ldab = Rp;
      }
      bf16_brgemm(rows, cols, Rp, ab, ldab, pd + c0 * Rp, c.data(), cols, /*accumulate=*/false);
      for (int64_t r = 0; r < rows; ++r) {
        float* row = c.data() + r * cols;
        if (bias != nullptr) {
          for (int64_t j = 0; j < cols; ++j) row[j] += bias[c0 + j];
        }
        bf16::narrow_row(row, cols, yd + (r0 + r) * C + c0);
      }
    }
    bf16_brgemm_release();
  });
  return y;
}

bool bf16_brgemm_usable() {
  static const bool usable = [] {
    try {
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      // Fixed values (not the global generator: a seeded user's draws must not depend on this check): odd M
      // and N not a multiple of the vector width with an accumulation, then a whole-tile product, so that a
      // wrong layout, tail or blocking shows.
      for (const auto& [m, k, n] : {std::tuple<int64_t, int64_t, int64_t>{5, 36, 40}, {16, 64, 128}}) {
        const at::Tensor a = at::linspace(-2.0, 3.0, m * k, at::kFloat).view({m, k}).sin().to(at::kBFloat16);
        const at::Tensor w = at::linspace(-1.0, 1.5, n * k, at::kFloat).view({n, k}).cos().to(at::kBFloat16);
        const at::Tensor packed = pack_vnni(w);
        at::Tensor c = at::ones({m, n}, at::kFloat);
        bf16_brgemm(m, n, k, a.data_ptr<c10::BFloat16>(), k, packed.data_ptr<c10::BFloat16>(),
                    c.data_ptr<float>(), n, /*accumulate=*/true);
        bf16_brgemm_release();
        const at::Tensor want = at::mm(a.to(at::kDouble), w.to(at::kDouble).t()) + 1;
        if ((c.to(at::kDouble) - want).abs().max().item<double>() > 1e-4 * want.abs().max().item<double>()) {
          return false;
        }
      }
      return true;
    } catch (const std::exception&) {  // not built into this torch, or refused on this processor
      return false;
    }
  }();
  return usable;
}

namespace {

struct PackedEntry {
  explicit PackedEntry(const at::Tensor& w) : owner(w.getIntrusivePtr()) {}
  c10::weak_intrusive_ptr<c10::TensorImpl> owner;
  const void* data = nullptr;
  uint32_t version = 0;
  std::string kind;
  std::vector<int64_t> sizes, strides;
  at::Tensor packed;
};

struct PackedCache {
  std::mutex mutex;
  std::vector<PackedEntry> entries;  // most recent last
};

PackedCache& packed_cache() {
  static PackedCache cache;
  return cache;
}

}  // namespace

at::Tensor packed_weight(const at::Tensor& w, const char* kind, const std::function<at::Tensor()>& make) {
  if (w.is_inference()) return make();
  const uint32_t version = w.unsafeGetTensorImpl()->version_counter().current_version();
  PackedCache& cache = packed_cache();
  {
    std::lock_guard<std::mutex> lock(cache.mutex);
    auto& entries = cache.entries;
    for (auto it = entries.begin(); it != entries.end(); ++it) {
      const auto owner = it->owner.lock();
      if (!owner) continue;
      if (owner.get() == w.unsafeGetTensorImpl() && it->kind == kind && it->version == version &&
          it->data == w.data_ptr() && it->sizes == w.sizes().vec() && it->strides == w.strides().vec()) {
        return it->packed;
      }
    }
    // Entries of dead tensors, and this tensor's earlier copies of this kind (made from an older value), can never
    // match again.
    entries.erase(std::remove_if(entries.begin(), entries.end(),
                                 [&](const PackedEntry& e) {
                                   const auto owner = e.owner.lock();
                                   return !owner || (owner.get() == w.unsafeGetTensorImpl() && e.kind == kind);
                                 }),
                  entries.end());
  }
  at::Tensor packed = make();
  std::lock_guard<std::mutex> lock(cache.mutex);
  auto& entries = cache.entries;
  if (entries.size() >= kPackedWeights) entries.erase(entries.begin());
  PackedEntry e(w);
  e.data = w.data_ptr();
  e.version = version;
  e.kind = kind;
  e.sizes = w.sizes().vec();
  e.strides = w.strides().vec();
  e.packed = packed;
  entries.push_back(std::move(e));
  return packed;
}

}  // namespace gemm
}  // namespace fastqa
