// The one GEMM entry point of the CPU kernels: every contraction of every op goes through here.
//
// Engines (both are what the installed torch ships; nothing is linked twice):
//   * blas   -- at::mm / at::addmm: MKL or OpenBLAS, whatever torch was built with. Always there,
//               and the only engine for float64.
//   * onednn -- torch's own oneDNN, through the dispatcher ops mkldnn::_linear_pointwise(.binary)
//               (the ops torch.compile's CPU backend uses). float32 only; there where the torch build
//               has them and torch.backends.mkldnn is enabled.
// On AMD processors MKL's sgemm runs its AVX2 code while oneDNN's runs AVX-512: up to ~2x apart.
// On Intel the two are close. But the gap depends on the shape as much as on the processor: on an AMD
// EPYC with AVX2 only, where the two tie on a 512^3 product, oneDNN was 1.9x faster on [200, 256] x
// [256, 5893] (a vocabulary projection) and BLAS 1.2x faster on [1600, 128] x [128, 128]. So:
//   * the process's engine (gemm::choice()) is chosen once, at the first call of an op, by timing with each what
//     it serves: the GEMMs issued inside parallel regions, single-threaded tile products, every thread
//     multiplying a [128, 128] tile at once. (A 512^3 product, timed too for info(), can prefer the other
//     engine: on an AMD EPYC Zen 4 oneDNN won it while the convs' and attention's tiles ran faster on BLAS.);
//   * with FASTQA_CPU_GEMM=auto (the default), every top-level float32 GEMM is timed with both engines the
//     first time its shape is seen (M rounded up to a power of two, K, N, the operand layouts, the bias or
//     accumulation, the thread count) and the faster one is kept for that shape (gemm::shape_choices()).
//     Small ones too: a oneDNN call has a fixed cost of tens of microseconds that a 512^3 product does not
//     show, so a process engine chosen there made a small model's every linear map several times slower
//     than BLAS (what F.linear runs) where oneDNN won the large product;
//   * FASTQA_CPU_GEMM=blas|onednn forces one engine everywhere.
// Nothing is measured twice: a shape's engine cannot change between a forward and its backward, and
// repeated backwards stay bit-identical.
//
// Call gemm::prepare() at the top of an op, outside any parallel region: the first call measures
// (with all threads). A GEMM issued inside at::parallel_for runs single-threaded in either engine.
//
// bfloat16: a product of bf16 operands, or of float32 ones inside a Bf16Products scope (a bf16 op running
// its float32 kernel, csrc/cpu/bf16.h), runs at::mm on bf16 operands -- torch's bf16 GEMM, which is oneDNN's
// (AMX tiles or AVX512-BF16 dot products where the processor has them) -- and is rounded to bf16; a float32
// caller gets that result widened back. The choice between engines above is float32's only. The kernels' own bf16
// products on packed operands (float32 sums, nothing rounded between them) go through the micro-kernel entries at
// the end of this file instead, each op choosing its route per shape class (route_for).
#pragma once

#include <ATen/ATen.h>

#include <c10/util/Optional.h>

#include <functional>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

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

// Each engine's measured float32 rates (GFLOP/s, medians of interleaved runs, at the current thread count; onednn
// 0 where unavailable), measured once, on first call: blas / onednn of one 512^3 product (what the machine's
// large products reach), tile_blas / tile_onednn of the kernels' tile products -- every thread multiplying its own
// [kTile, kTile] x [kTile, kTile]^T, kTileReps times, inside one parallel region -- which choose the process's engine.
constexpr int64_t kTile = 128;
constexpr int kTileReps = 8;
struct Rates {
  double blas = 0, onednn = 0;
  double tile_blas = 0, tile_onednn = 0;
};
const Rates& rates();

bool onednn_available();

// Makes the choice if not made yet. Call at the top of each op (outside parallel regions).
inline void prepare() { (void)choice(); }

// While one is alive on a thread, that thread's float32 products are taken in bf16 (see above). Scopes nest;
// `Bf16Products scope(false)` leaves the thread's setting as it is.
class Bf16Products {
 public:
  explicit Bf16Products(bool enable = true);
  ~Bf16Products();
  Bf16Products(const Bf16Products&) = delete;
  Bf16Products& operator=(const Bf16Products&) = delete;

 private:
  bool previous_;
};
// Whether this thread's float32 products are taken in bf16 now.
bool bf16_products();

// The engine for this dtype: float32 -> process_engine(); float64 -> BLAS.
Engine engine_for(at::ScalarType dtype);

// One shape's choice (FASTQA_CPU_GEMM=auto only): m is M rounded up to a power of two; a_layout and
// w_layout are 'r' (row-major), 'c' (a transposed view of a row-major matrix) or 's' (other strides).
struct ShapeChoice {
  int64_t m = 0, k = 0, n = 0;
  int threads = 0;
  char a_layout = 'r', w_layout = 'r';
  bool bias = false, accumulate = false;
  double blas_gflops = 0, onednn_gflops = 0;  // measured here; 0 for a restored choice
  Engine engine = Engine::kBlas;
  bool restored = false;                      // set by restore(), not measured in this process
};
// Every shape decided so far in this process, in the order they were first seen.
std::vector<ShapeChoice> shape_choices();

// The float32 engine of the process's small and in-thread products: choice().engine, or the one
// restore() set.
Engine process_engine();

// Takes another process's decisions (a training checkpoint's), so that a resumed run multiplies every
// shape on the engine the interrupted one used and reproduces its losses bit for bit: the process's
// engine and each shape's, measured or not. Ignored unless FASTQA_CPU_GEMM=auto and oneDNN is usable.
void restore(Engine process, const std::vector<ShapeChoice>& shapes);

// The engine for out[M, N] = a[M, K] @ w[N, K]^T (+ bias or + out): engine_for(dtype) for float64, inside
// a parallel region or when forced; otherwise the shape's (measured now if the shape is new, on a's first
// rows, with the bias when `with_bias`; or restored).
Engine engine_for(const at::Tensor& a, const at::Tensor& w, bool with_bias, bool accumulate);

// out (=, or += when accumulate) a @ b. a [M, K], b [K, N], out [M, N]: any strides (transposed
// views included). oneDNN writes a fresh result that is copied into out: prefer mm() when the caller
// can take a new tensor.
void mm_out(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b, bool accumulate = false);

// a @ b (+ acc) as a tensor: BLAS accumulates into acc in place and returns it; oneDNN fuses the add
// (a binary post-op) and returns a new tensor. Callers use the returned tensor, never acc.
at::Tensor mm(const at::Tensor& a, const at::Tensor& b, const at::Tensor& acc = at::Tensor());

// a @ wᵀ + bias as a new [M, N] tensor (nn.Linear layout: w [N, K]); the bias is fused into the GEMM.
at::Tensor linear(const at::Tensor& a, const at::Tensor& w, const c10::optional<at::Tensor>& bias);


// ---- bfloat16 routes ---------------------------------------------------------------------------------------
// A bf16 op with two ways to run picks one per shape class, measured once per process (or restored):
//   * native -- reads and writes bf16 itself, its products on the bf16 engine (bf16 operands, float32 sums);
//   * widen  -- widens its bf16 inputs, runs the float32 kernel with float32 products and rounds its results
//               back: the float32 kernel's speed plus the conversions, so where native loses, bf16 costs no
//               more than a float32 call.
// The two round differently: like the GEMM engines, a choice never changes within a process, is saved with
// the GEMM plan (cpu_gemm_plan(), training checkpoints and the machine's plan cache) and restored from it.
// FASTQA_CPU_BF16_ROUTE=auto (default) | native | widen, read at each call: a forced route is not recorded.
enum class Route { kNative = 0, kWiden = 1 };
const char* route_name(Route r);

// What FASTQA_CPU_BF16_ROUTE asks for ("auto", "native" or "widen"); raises on another value.
std::string requested_route();

struct RouteChoice {
  std::string op;     // the op and direction, e.g. "glu_conv1d_step"
  std::string shape;  // its shape class (sizes rounded up to powers of two, see shape_class)
  int threads = 0;
  double native_ms = 0, widen_ms = 0;  // measured here; 0 for a restored choice
  Route route = Route::kNative;
  bool restored = false;
};

// "name=v ..." with each size rounded up to a power of two: the key of a shape class.
std::string shape_class(std::initializer_list<std::pair<const char*, int64_t>> sizes);

// The route of (op, shape class) at the current thread count: the forced one, else the one decided before
// in this process (measured or restored), else measured now by calling run(Route::kNative) and
// run(Route::kWiden) interleaved (the median of a few calls each) and taking the faster. Call at the top of
// an op, outside parallel regions; run must be a pure function of the op's inputs (its results dropped).
Route route_for(const char* op, const std::string& shape, const std::function<void(Route)>& run);

// Every route decided so far in this process, in the order first decided.
std::vector<RouteChoice> route_choices();

// Takes another process's route decisions (replacing this process's for the same keys).
void restore_routes(const std::vector<RouteChoice>& routes);

// ---- small bf16 products on packed weights (PyTorch's batch-reduce GEMM micro-kernel) -------------------------
// c[M, N] (=, or += when accumulate) a[M, K] · b on raw row-major bf16 a (leading dimension lda) and b packed by
// pack_vnni (pairs of K rows interleaved, what the bf16 dot-product and AMX instructions read), summed in float32
// into float32 c (leading dimension ldc): no tensors, no dispatch, no packing per call and no bf16 rounding of
// the result. Single-threaded: call it inside parallel regions, and bf16_brgemm_release() at the end of each
// region's work (AMX keeps a tile configuration per thread).
// Usable where at::native::cpublas::brgemm takes packed bf16 and gives the right sums: checked once per process
// on known values (bf16_brgemm_usable), so a processor without bf16 instructions (or a torch whose micro-kernel
// expects another layout) takes the callers' other route instead of a wrong result.
bool bf16_brgemm_usable();

// The packing of every bf16 operand the kernels make, from float32 values (rounded to nearest even by
// bf16::round_bits) or bf16 ones, T = float or c10::BFloat16; each reads its source once, through its strides.
//
// pack_vnni: b for bf16_brgemm with N columns, the matrix m [N, K] as [Kp / 2, N, 2] (Kp = K rounded up to even):
// each pair of m's columns interleaved, an odd K's last value paired with a zero. m's value (n, k) is
// src[row(n) * row_stride + k * col_stride], row(n) = rows[n] or, with rows null, n: rows picked from anywhere, any
// strides (a weight in nn.Linear layout, its transpose, the taps of a conv weight, a block of activations summed over
// its rows: row_stride 1), no copy of m first. Writes N * Kp values to out, in parallel over blocks of column pairs
// (inline inside a parallel region).
template <typename T>
void pack_vnni(const T* src, const int64_t* rows, int64_t N, int64_t K, int64_t row_stride, int64_t col_stride,
               c10::BFloat16* out);
// The same of a whole w [N, K] (float32 or bf16, any strides, nn.Linear layout): a new bf16 [Kp / 2, N, 2].
at::Tensor pack_vnni(const at::Tensor& w);
// pack_transposed: the left factor of a product summed over src's rows (pack_vnni(src, nullptr, N, rows, 1, lds, ..)
// being the right one): srcᵀ for src [rows, N] (leading dimension lds) as a row-major bf16 [N, rows_p] (rows_p =
// rows rounded up to even, the padding zero) at dst, in parallel over tiles of row pairs (inline inside a parallel
// region).
template <typename T>
void pack_transposed(const T* src, int64_t lds, int64_t rows, int64_t N, c10::BFloat16* dst);

void bf16_brgemm(int64_t m, int64_t n, int64_t k, const c10::BFloat16* a, int64_t lda, const c10::BFloat16* b,
                 float* c, int64_t ldc, bool accumulate);
void bf16_brgemm_release();

// gᵀ x for bf16 g [M, N] and x [M, K] (any strides), summed over the M rows in float32 from the exact products of the
// bf16 values: a float32 [N, K] (a linear layer's weight gradient), on bf16_brgemm (check bf16_brgemm_usable
// first) in blocks of rows summed in order, bands of output columns split between the threads (the same sums on any
// thread count). The narrower factor is transposed once; the other is packed block by block in cache.
at::Tensor bf16_tn_float(const at::Tensor& g, const at::Tensor& x);

// The right factor of bf16_nt: w [C, R] (float32 or bf16, any strides) in bands of kNtBand rows of w (output
// columns), each band packed by pack_vnni (R rounded up to even), one after the other: one bf16 tensor of
// C * (R + R % 2) values.
constexpr int64_t kNtBand = 128;
at::Tensor pack_nt(const at::Tensor& w);
// a wᵀ (+ bias) as a new bf16 [M, C] for bf16 a [M, R] (any row stride, unit column stride) and `packed` =
// pack_nt(w) of a w [C, R]: each block of rows times each band on bf16_brgemm into float32 scratch (check
// bf16_brgemm_usable first), the float32 bias (null: none) added there, each value rounded to bf16 once. The blocks
// are fixed by the shape alone, and each value is one brgemm's sum: the same results on any thread count.
at::Tensor bf16_nt(const at::Tensor& a, const at::Tensor& packed, int64_t c, const float* bias);

// A copy of a weight made for a kernel (rounded to bf16, widened to float32, transposed, packed), made once per weight value and
// reused by later calls: kept while `w` is the same live tensor with the same version counter and data (an
// optimizer step bumps the version: the next call makes a fresh copy), the most recent kPackedWeights of them.
// `kind` names what make() builds. Inference tensors (no version counter) are never cached: make() runs each call.
constexpr size_t kPackedWeights = 256;  // every layer of a deep model, each in the forms its kernels read
at::Tensor packed_weight(const at::Tensor& w, const char* kind, const std::function<at::Tensor()>& make);

}  // namespace gemm
}  // namespace fastqa
