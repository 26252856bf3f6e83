// Depthwise-separable conv1d on channels-last data, fused: depthwise conv (+ bias) -> pointwise 1x1
// conv (GEMM) -> + bias -> ReLU? -> + residual?, forward and backward.
//
//   x [B, L, C_in], dw_weight [C_in, 1, K], dw_bias [C_in]?, pw_weight [C_out, C_in, 1], pw_bias [C_out]?,
//   residual [B, L, C_out]?; zero padding: pad_left on the left, K-1-pad_left on the right.
//
// Work is split into tiles of (sequence b, rows [l0, l1)) -- in the forward, of several whole sequences when they
// are short -- small enough that a tile's depthwise output stays in cache between the direct depthwise loop
// (vectorised over channels), the GEMM that consumes it and the epilogue. Each tile runs its own single-threaded
// GEMM (at::mm_out inside at::parallel_for; MKL does not nest threads), so there is one pass over memory per tensor.
//
// aux (what the forward hands its backward): the ReLU mask (bool [B, L, C_out], !(pre-activation <= 0):
// true for NaN, so a NaN's gradient passes as through torch.relu's threshold_backward) when relu, else
// absent (None: nothing allocated), as are the gradients of absent biases. The depthwise output is NOT saved:
// the backward recomputes it
// tile by tile (K FMAs per element, cheaper than writing and re-reading [B, L, C_in]).
//
// Backward is deterministic and independent of the thread count: its tiling does not depend on the
// number of threads, and weight and bias gradients accumulate into one partial buffer per block (a fixed,
// contiguous range of tiles, sized from the problem alone), summed in block order.
//
// ln_dwsep_conv1d_fwd / _bwd put a LayerNorm over the channels in front (the schemas of the Triton
// ops fastqa_triton::ln_dwsep_conv1d_*): h = LN(x) is computed row by row into a [B, L, C_in] buffer
// that lives for the call only (ln_stats [B, 2, L] = row mean and 1/std are what is saved), then the
// dwsep kernels above run on h. The backward rebuilds h from x and ln_stats with the forward's code
// (the same bits), runs the dwsep backward for dL/dh, then the LayerNorm backward: grad_x row by row,
// and the ln_weight / ln_bias gradients in fixed blocks of rows (sized from the problem alone), each
// reduced by one thread and the block partials summed in block order, as above -- bit-identical for
// any thread count (ATen's layer_norm backward, used here before, reduces per thread).
// mask [B, L] bool (optional): rows where it is false (padding) are zero in h, so they enter the depthwise
// conv as its zero padding does and real rows never see them; their dL/dh is dropped (grad_x rows 0).
//
// dtypes: float32, float64, or bfloat16 (csrc/cpu/bf16.h) with every activation of a call bf16 and each parameter
// bf16 or float32 (the float32 master weights under autocast, taken as they are). A bf16 call runs the float32
// kernels on the bf16 x, residual and grad_y as they are (Rows: a tile's rows widened into per-thread scratch, the
// residual added as it is read; no float32 copy of a whole activation) and on the depthwise and LayerNorm
// parameters and the biases widened, inside a gemm::Bf16Products scope, opened again on the pool's threads where
// the tiles' GEMMs run; pw_weight, which feeds only GEMMs, is bf16 (a float32 one rounded once per call). The
// parameters' gradients are summed in float32 and returned in each parameter's dtype. y and grad_x are rounded to
// bf16 tile by tile (or block by block), the other gradients once reduced; ln_stats stays float32 (what it is
// computed in) and the ReLU mask bool.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "cpu/bf16.h"
#include "cpu/bf16_rows.h"
#include "cpu/common.h"
#include "cpu/gemm.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace fastqa {
namespace {

// Rows per tile are chosen so a tile of the widest activation holds about this many elements
// (128K floats = 512 KiB, in L2 with the GEMM's other operands; MKL's per-call efficiency drops below
// ~200 rows, measured for C_in 500 -> C_out 128).
constexpr int64_t kTileElems = 1 << 17;
constexpr int64_t kMinTileRows = 32;

// Output rows per step of the depthwise loops (tap_sum_rows): kDepthwiseRows accumulators and as many input
// rows in registers per channel block, 2 * kDepthwiseRows + 1 of the 16 AVX2 registers.
constexpr int kDepthwiseRows = 4;

// Below this many multiply-adds a parallel task costs more in thread wake-up than it saves.
constexpr int64_t kMinTaskWork = 1 << 18;

// The backward tiles and blocks its work as if there were this many threads, whatever their number:
// the weight gradients are then summed in one order, bit-identical for any thread count (blocks are
// shared out among the threads there are; a machine with more threads than blocks leaves some idle).
constexpr int64_t kBackwardThreads = 16;

// Tiles of (sequence, row range); tile t covers sequences [seq(t), seq_end(t)), rows [begin(t), end(t)) of each:
// one sequence split into per_seq pieces, or (group_sequences, sequences short enough) several whole sequences,
// rows contiguous either way. grain: tiles per parallel task, so that small problems run on the calling thread.
struct Tiling {
  int64_t B = 0, L = 0, chunk = 0, per_seq = 0, seqs = 1, count = 0, grain = 1;

  // threads: how many threads the tiles should feed (the backward passes a constant, so that its tiles
  // and hence its reduction order do not depend on the thread count). group_sequences (the forward): short
  // sequences share a tile, so that a batch of many short sequences runs a few GEMMs of many rows instead of
  // one small GEMM, and its fixed costs, per sequence.
  Tiling(int64_t B_, int64_t L_, int64_t C_in, int64_t C_out, int64_t K, int64_t threads, bool group_sequences = false)
      : B(B_), L(L_) {
    const int64_t max_rows = std::max(kMinTileRows, kTileElems / std::max(C_in, C_out));
    int64_t pieces = ceil_div(L, max_rows);
    // Short batches of long sequences: split sequences so every thread has a tile.
    pieces = std::max(pieces, std::min(L, ceil_div(threads, B)));
    chunk = ceil_div(L, pieces);
    per_seq = ceil_div(L, chunk);
    if (group_sequences && per_seq == 1) {
      // As few tiles as hold the rows, a multiple of the thread count so that every thread gets as many rows.
      const int64_t tiles = ceil_div(ceil_div(B * L, max_rows), threads) * threads;
      seqs = std::max<int64_t>(1, ceil_div(B, tiles));
    }
    count = ceil_div(B, seqs) * per_seq;
    grain = ceil_div(kMinTaskWork, seqs * chunk * C_in * (K + C_out));
  }
  // How many parallel tasks (each a contiguous range of tiles) the work is worth.
  int64_t tasks() const { return std::max<int64_t>(1, std::min<int64_t>(count / grain, at::get_num_threads())); }
  // The backward's reduction blocks: as tasks() with kBackwardThreads in place of the thread count.
  int64_t blocks() const { return std::max<int64_t>(1, std::min<int64_t>(count / grain, kBackwardThreads)); }
  // Rows a tile holds at most.
  int64_t max_rows() const { return seqs * chunk; }
  int64_t seq(int64_t t) const { return t / per_seq * seqs; }
  int64_t seq_end(int64_t t) const { return std::min(B, seq(t) + seqs); }
  int64_t begin(int64_t t) const { return (t % per_seq) * chunk; }
  int64_t end(int64_t t) const { return std::min(L, begin(t) + chunk); }
};

// Register-blocked channel loops: a block of CB channels is accumulated in registers across all the
// taps (or rows) before it is stored, instead of a load-FMA-store of the output per tap. Blocks of one
// native vector (kSimdBytes: 16 floats with AVX-512, 8 with AVX2), then one 16-byte vector, then single
// channels cover any C.
// Each block is one Block<CB, T> (common.h), at most one native register wide.
#define FASTQA_FOR_CHANNEL_BLOCKS(BODY)                  \
  do {                                                   \
    int64_t c0 = 0;                                      \
    c0 = BODY(kSimdBytes / sizeof(T), c0);               \
    if (kSimdBytes > 16) c0 = BODY(16 / sizeof(T), c0);  \
    BODY(1, c0);                                         \
  } while (0)

// out[c] = init[c] (0 without init) + sum_{j < n} w[j*C + c] * src[j*step + c], for c in [c0, C) in
// blocks of CB; returns where it stopped. One output row of a depthwise conv: w points at the first
// valid tap's weights [n, C], src at the input row that tap reads, step is +-C.
template <int64_t CB, typename T>
int64_t tap_sum(T* out, const T* init, const T* w, const T* src, int64_t step, int64_t n, int64_t C, int64_t c0) {
  using Bk = Block<CB, T>;
  for (; c0 + CB <= C; c0 += CB) {
    typename Bk::V acc = init ? Bk::load(init + c0) : typename Bk::V{};
    for (int64_t k = 0; k < n; ++k) acc += Bk::load(w + k * C + c0) * Bk::load(src + k * step + c0);
    Bk::store(out + c0, acc);
  }
  return c0;
}

// kRows consecutive output rows of a depthwise conv whose taps all lie inside the sequence: for r < kRows
// and c in [c0, C) in blocks of CB, out[r*C + c] = init[c] (0 without init) + sum_{k < n} w[k*C + c] *
// src[(r + k*dir)*C + c], dir = +1 (the forward conv) or -1 (the transposed conv of the backward).
// The kRows input rows a tap reads sit in registers and slide by one row per tap, so each tap loads one
// weight vector and one input row for kRows multiply-adds into kRows independent accumulators (two rows
// a step loaded a weight and a row per two). Measured: the single-thread dwsep forward 2-3% faster.
template <int kRows, int kDir, int64_t CB, typename T>
int64_t tap_sum_rows(T* out, const T* init, const T* w, const T* src, int64_t n, int64_t C, int64_t c0) {
  using Bk = Block<CB, T>;
  using V = typename Bk::V;
  static_assert(kDir == 1 || kDir == -1, "dir is +1 or -1");
  for (; c0 + CB <= C; c0 += CB) {
    V acc[kRows], x[kRows];
    const V start = init ? Bk::load(init + c0) : V{};
    for (int r = 0; r < kRows; ++r) acc[r] = start;
    // Before tap k = 0: x[r] holds row r, except the slot the first tap loads (forward: the last one,
    // transposed: the first one).
    for (int r = 0; r < kRows; ++r) {
      if ((kDir > 0 && r < kRows - 1) || (kDir < 0 && r > 0)) x[r] = Bk::load(src + r * C + c0);
    }
    for (int64_t k = 0; k < n; ++k) {
      const V wk = Bk::load(w + k * C + c0);
      if (kDir > 0) {
        x[kRows - 1] = Bk::load(src + (k + kRows - 1) * C + c0);
      } else {
        x[0] = Bk::load(src - k * C + c0);
      }
      for (int r = 0; r < kRows; ++r) acc[r] += wk * x[r];
      if (kDir > 0) {
        for (int r = 0; r + 1 < kRows; ++r) x[r] = x[r + 1];
      } else {
        for (int r = kRows - 1; r > 0; --r) x[r] = x[r - 1];
      }
    }
    for (int r = 0; r < kRows; ++r) Bk::store(out + r * C + c0, acc[r]);
  }
  return c0;
}

// acc[c] += sum_{r < rows} a[r*C + c] * b[r*C + c] (b == nullptr: sum of a), for c in [c0, C) in blocks of CB.
// Four partial sums, over the rows r = 0, 1, 2, 3 (mod 4): with one running sum every row waited for the
// previous row's add (a latency-bound chain per block of channels, ~9% of the dwsep backward by perf).
template <int64_t CB, typename T>
int64_t column_dot(T* acc, const T* a, const T* b, int64_t rows, int64_t C, int64_t c0) {
  using Bk = Block<CB, T>;
  using V = typename Bk::V;
  for (; c0 + CB <= C; c0 += CB) {
    V sum[4] = {};
    int64_t r = 0;
    if (b) {
      for (; r + 4 <= rows; r += 4) {
        for (int64_t u = 0; u < 4; ++u) sum[u] += Bk::load(a + (r + u) * C + c0) * Bk::load(b + (r + u) * C + c0);
      }
      for (; r < rows; ++r) sum[0] += Bk::load(a + r * C + c0) * Bk::load(b + r * C + c0);
    } else {
      for (; r + 4 <= rows; r += 4) {
        for (int64_t u = 0; u < 4; ++u) sum[u] += Bk::load(a + (r + u) * C + c0);
      }
      for (; r < rows; ++r) sum[0] += Bk::load(a + r * C + c0);
    }
    Bk::store(acc + c0, Bk::load(acc + c0) + ((sum[0] + sum[1]) + (sum[2] + sum[3])));
  }
  return c0;
}

// Rows per chunk of tap_dots_chunked: a chunk's g and x rows (~2 x 64 x C values) stay in cache while
// every channel block walks them.
constexpr int64_t kTapDotRows = 64;

// gwt[k, c] += sum_{r < rows} g[r*C + c] * x[(r + k)*C + c] for k < kTaps and c in [c0, C) in blocks of CB,
// and gdb[c] += sum_r g[r*C + c] when gdb is given: the depthwise weight and bias gradients over rows whose
// kTaps taps all lie inside the sequence, every tap in one pass (each g row loaded once for kTaps
// multiply-adds into independent accumulators; the x rows a tap reads again sit in L1). The per-tap passes
// (column_dot) read the tile's g and x once per tap, two loads per multiply-add, from L2 or beyond (~8% of
// the dwsep backward by perf); this made the B32 L400 C128 K7 backward ~7% faster.
template <int kTaps, int64_t CB, typename T>
int64_t tap_dots(T* gwt, T* gdb, const T* g, const T* x, int64_t rows, int64_t C, int64_t c0) {
  using Bk = Block<CB, T>;
  using V = typename Bk::V;
  for (; c0 + CB <= C; c0 += CB) {
    V acc[kTaps] = {}, bias_acc{};
    for (int64_t r = 0; r < rows; ++r) {
      const V gr = Bk::load(g + r * C + c0);
      bias_acc += gr;
      for (int k = 0; k < kTaps; ++k) acc[k] += gr * Bk::load(x + (r + k) * C + c0);
    }
    for (int k = 0; k < kTaps; ++k) Bk::store(gwt + k * C + c0, Bk::load(gwt + k * C + c0) + acc[k]);
    if (gdb) Bk::store(gdb + c0, Bk::load(gdb + c0) + bias_acc);
  }
  return c0;
}

template <int kTaps, typename T>
void tap_dots_chunked(T* gwt, T* gdb, const T* g, const T* x, int64_t rows, int64_t C) {
  for (int64_t r0 = 0; r0 < rows; r0 += kTapDotRows) {
    const int64_t n = std::min(kTapDotRows, rows - r0);
#define FASTQA_BLOCK(CB, c0) tap_dots<kTaps, CB, T>(gwt, gdb, g + r0 * C, x + r0 * C, n, C, c0)
    FASTQA_FOR_CHANNEL_BLOCKS(FASTQA_BLOCK);
#undef FASTQA_BLOCK
  }
}

// gwt[k, :] += sum_l gh[l - e0, :] * x[l + k - pad - x0, :] over rows l in [a, b) for each tap k, the rows
// where tap k's input row lies inside the sequence, one tap at a time.
template <typename T>
void tap_dots_per_tap(const T* gh, int64_t e0, const T* x, int64_t x0, T* gwt, int64_t L, int64_t C, int64_t K,
                      int64_t pad, int64_t a, int64_t b) {
  for (int64_t k = 0; k < K; ++k) {
    const int64_t lo = std::max(a, pad - k), hi = std::min(b, L + pad - k);
    if (lo >= hi) continue;
    const T* g = gh + (lo - e0) * C;
    const T* src = x + (lo + k - pad - x0) * C;
#define FASTQA_BLOCK(CB, c0) column_dot<CB, T>(gwt + k * C, g, src, hi - lo, C, c0)
    FASTQA_FOR_CHANNEL_BLOCKS(FASTQA_BLOCK);
#undef FASTQA_BLOCK
  }
}

// h[l - l0, :] = dw_bias + sum_k wt[k, :] * x[l + k - pad, :] for l in [l0, l1); x holds rows of one sequence
// [L, C] from its row x0 on (at least the rows these taps read, input_span; rows outside [0, L) are the zero
// padding), wt is the depthwise weight as [K, C].
template <typename T>
void depthwise_rows(const T* x, int64_t x0, const T* wt, const T* bias, T* h, int64_t L, int64_t C, int64_t K,
                    int64_t pad, int64_t l0, int64_t l1) {
  // Rows whose K taps all lie inside the sequence, [full_lo, full_hi), go kDepthwiseRows at a time.
  const int64_t full_lo = std::max(l0, pad), full_hi = std::min(l1, L + pad - K + 1);
  for (int64_t l = l0; l < l1; ++l) {
    if (l >= full_lo && l + kDepthwiseRows <= full_hi) {
      const T* src = x + (l - pad - x0) * C;
      T* out = h + (l - l0) * C;
#define FASTQA_BLOCK(CB, c0) tap_sum_rows<kDepthwiseRows, 1, CB>(out, bias, wt, src, K, C, c0)
      FASTQA_FOR_CHANNEL_BLOCKS(FASTQA_BLOCK);
#undef FASTQA_BLOCK
      l += kDepthwiseRows - 1;
      continue;
    }
    const int64_t k_lo = std::max<int64_t>(0, pad - l), k_hi = std::min(K, L + pad - l);
    const T* w = wt + k_lo * C;
    const T* src = x + (l + k_lo - pad - x0) * C;
    T* out = h + (l - l0) * C;
#define FASTQA_BLOCK(CB, c0) tap_sum<CB>(out, bias, w, src, C, k_hi - k_lo, C, c0)
    FASTQA_FOR_CHANNEL_BLOCKS(FASTQA_BLOCK);
#undef FASTQA_BLOCK
  }
}

// acc[:] += sum over rows of src [rows, C].
template <typename T>
void accumulate_rows(const T* src, int64_t rows, int64_t C, T* acc) {
#define FASTQA_BLOCK(CB, c0) column_dot<CB, T>(acc, src, nullptr, rows, C, c0)
  FASTQA_FOR_CHANNEL_BLOCKS(FASTQA_BLOCK);
#undef FASTQA_BLOCK
}

// Transposed depthwise conv over one tile, given gh = dL/dh on rows [e0, e0 + n) of the sequence
// (the tile's rows plus the halo the transposed conv reads) and x from the sequence's row x0 on (as
// depthwise_rows'):
//   gx[l - l0, :]   = sum_k wt[k, :] * gh[l - k + pad, :]          for l in [l0, l1)
//   gwt[k, :]      += sum_l gh[l, :] * x[l + k - pad, :]            (tile rows only)
//   gdb[:]         += sum_l gh[l, :]                                (tile rows only; gdb may be null)
template <typename T>
void depthwise_backward_rows(const T* gh, int64_t e0, const T* x, int64_t x0, const T* wt, T* gx, T* gwt, T* gdb,
                             int64_t L, int64_t C, int64_t K, int64_t pad, int64_t l0, int64_t l1) {
  // Rows that read all K taps, [full_lo, full_hi), go kDepthwiseRows at a time.
  const int64_t full_lo = std::max(l0, K - 1 - pad), full_hi = std::min(l1, L - pad);
  for (int64_t l = l0; l < l1; ++l) {
    if (l >= full_lo && l + kDepthwiseRows <= full_hi) {
      const T* src = gh + (l + pad - e0) * C;
      T* out = gx + (l - l0) * C;
#define FASTQA_BLOCK(CB, c0) tap_sum_rows<kDepthwiseRows, -1, CB, T>(out, nullptr, wt, src, K, C, c0)
      FASTQA_FOR_CHANNEL_BLOCKS(FASTQA_BLOCK);
#undef FASTQA_BLOCK
      l += kDepthwiseRows - 1;
      continue;
    }
    const int64_t k_lo = std::max<int64_t>(0, l + pad - L + 1), k_hi = std::min(K, l + pad + 1);
    const T* w = wt + k_lo * C;
    const T* src = gh + (l - k_lo + pad - e0) * C;
    T* out = gx + (l - l0) * C;
#define FASTQA_BLOCK(CB, c0) tap_sum<CB, T>(out, nullptr, w, src, -C, k_hi - k_lo, C, c0)
    FASTQA_FOR_CHANNEL_BLOCKS(FASTQA_BLOCK);
#undef FASTQA_BLOCK
  }
  // Weight gradient. Tap k pairs output row l with input row l + k - pad, which must lie inside the
  // sequence: all taps do for rows [in_lo, in_hi), which the common kernel sizes take in one pass.
  const int64_t in_lo = std::min(l1, std::max(l0, pad)), in_hi = std::max(in_lo, std::min(l1, L + pad - K + 1));
  const T* g = gh + (in_lo - e0) * C;
  const T* src = x + (in_lo - pad - x0) * C;
  const int64_t rows = in_hi - in_lo;
  bool bias_done = false;  // gdb over [in_lo, in_hi) taken in the same pass
  switch (rows > 0 ? K : 0) {
    case 3: tap_dots_chunked<3>(gwt, gdb, g, src, rows, C); bias_done = true; break;
    case 5: tap_dots_chunked<5>(gwt, gdb, g, src, rows, C); bias_done = true; break;
    case 7: tap_dots_chunked<7>(gwt, gdb, g, src, rows, C); bias_done = true; break;
    default: tap_dots_per_tap(gh, e0, x, x0, gwt, L, C, K, pad, in_lo, in_hi);
  }
  tap_dots_per_tap(gh, e0, x, x0, gwt, L, C, K, pad, l0, in_lo);
  tap_dots_per_tap(gh, e0, x, x0, gwt, L, C, K, pad, in_hi, l1);
  if (gdb) {
    if (bias_done) {
      accumulate_rows(gh + (l0 - e0) * C, in_lo - l0, C, gdb);
      accumulate_rows(gh + (in_hi - e0) * C, l1 - in_hi, C, gdb);
    } else {
      accumulate_rows(gh + (l0 - e0) * C, l1 - l0, C, gdb);
    }
  }
}

// An activation [N, C] (x, the residual, grad_y; contiguous) as the kernels computing in T read it: a T tensor
// in place, a bf16 one (T float32) widened -- exactly -- a tile's rows at a time into the reading thread's
// scratch or added to a row as it is read, so that a bf16 call makes no float32 copy of the whole tensor.
template <typename T>
class Rows {
 public:
  // t undefined (an absent residual): present() is false.
  explicit Rows(const at::Tensor& t) {
    if (!t.defined()) return;
    C_ = t.size(-1);
    if (bf16::is_bf16(t)) {
      TORCH_INTERNAL_ASSERT((std::is_same_v<T, float>), "bf16 data is read into float32");
      narrow_ = t.data_ptr<c10::BFloat16>();
    } else {
      wide_ = t.data_ptr<T>();
    }
  }
  explicit Rows(const c10::optional<at::Tensor>& t) : Rows(t.has_value() ? *t : at::Tensor()) {}
  bool present() const { return wide_ || narrow_; }
  // Whether get() writes to its scratch (which then needs n * C values).
  bool widens() const { return narrow_ != nullptr; }
  // Rows [r0, r0 + n) as T: in place, or widened into scratch.
  const T* get(int64_t r0, int64_t n, T* scratch) const {
    if constexpr (std::is_same_v<T, float>) {
      if (narrow_) {
        bf16::widen_row(narrow_ + r0 * C_, n * C_, scratch);
        return scratch;
      }
    }
    return wide_ + r0 * C_;
  }
  // acc[0..C) += row r.
  void add_to(int64_t r, T* __restrict acc) const {
    if constexpr (std::is_same_v<T, float>) {
      if (narrow_) return bf16::add_row(narrow_ + r * C_, C_, acc);
    }
    const T* __restrict src = wide_ + r * C_;
#pragma omp simd
    for (int64_t c = 0; c < C_; ++c) acc[c] += src[c];
  }

 private:
  const T* wide_ = nullptr;
  const c10::BFloat16* narrow_ = nullptr;
  int64_t C_ = 0;
};

// The rows [lo, hi) of a sequence [0, L) that the depthwise taps of output rows [l0, l1) read (and the backward's
// weight gradient pairs with them).
std::pair<int64_t, int64_t> input_span(int64_t L, int64_t K, int64_t pad, int64_t l0, int64_t l1) {
  return {std::max<int64_t>(0, l0 - pad), std::min(L, l1 + K - 1 - pad)};
}

// In place on a GEMM output tile y [rows, C] (the bias already in it): y = relu?(y) + residual rows [row0,
// row0 + rows), recording the ReLU mask.
template <typename T>
void epilogue_rows(T* y, const Rows<T>& residual, int64_t row0, bool* mask, int64_t rows, int64_t C, bool relu) {
  for (int64_t r = 0; r < rows; ++r) {
    T* __restrict row = y + r * C;
    if (relu) {
      bool* __restrict m = mask + r * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) {
        m[c] = !(row[c] <= T(0));  // NaN: true, as torch's threshold_backward lets its gradient through
        row[c] = row[c] < T(0) ? T(0) : row[c];  // NaN stays NaN, as in torch.relu
      }
    }
    if (residual.present()) residual.add_to(row0 + r, row);
  }
}

// gz [n, C] = grad_y masked by the ReLU mask (in place when gz is grad_y: each element is read before it is
// written). Both operands are loaded unconditionally and the mask is read as bytes so that the select vectorises
// (a branch per element mispredicts half the time).
template <typename T>
void relu_backward_rows(const T* grad_y, const bool* mask, T* gz, int64_t n) {
  const uint8_t* __restrict m = reinterpret_cast<const uint8_t*>(mask);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const T g = grad_y[i];
    gz[i] = m[i] != 0 ? g : T(0);
  }
}

// The worker threads of at::parallel_for do not inherit the caller's dispatch state, so the ATen calls
// made on them (GEMMs on tiles of the weights) must be told explicitly that autograd is not wanted.
using BelowAutograd = at::AutoDispatchBelowADInplaceOrView;

// Sum of per-group partial buffers [P, ...] in group order (deterministic).
at::Tensor reduce_partials(const at::Tensor& partials) {
  at::Tensor out = partials[0].clone();
  for (int64_t p = 1; p < partials.size(0); ++p) out.add_(partials[p]);
  return out;
}

struct Shapes {
  int64_t B, L, C_in, C_out, K;
};

Shapes check_args(const char* op, const at::Tensor& x, const at::Tensor& dw_weight,
                  const c10::optional<at::Tensor>& dw_bias, const at::Tensor& pw_weight,
                  const c10::optional<at::Tensor>& pw_bias, int64_t pad_left) {
  TORCH_CHECK(x.dim() == 3, op, ": x must be [B, L, C_in], got ", x.sizes());
  check_cpu_float(op, "x", x);
  const Shapes s{x.size(0), x.size(1), x.size(2), pw_weight.size(0), dw_weight.size(-1)};
  TORCH_CHECK(s.B > 0 && s.L > 0 && s.C_in > 0, op, ": x must be non-empty, got ", x.sizes());
  TORCH_CHECK(dw_weight.dim() == 3 && dw_weight.size(0) == s.C_in && dw_weight.size(1) == 1 && s.K > 0, op,
              ": dw_weight must be [C_in=", s.C_in, ", 1, K], got ", dw_weight.sizes());
  TORCH_CHECK(pw_weight.dim() == 3 && pw_weight.size(1) == s.C_in && pw_weight.size(2) == 1 && s.C_out > 0, op,
              ": pw_weight must be [C_out, C_in=", s.C_in, ", 1], got ", pw_weight.sizes());
  TORCH_CHECK(0 <= pad_left && pad_left < s.K, op, ": pad_left must be in [0, K-1=", s.K - 1, "], got ", pad_left);
  // A parameter: x's dtype, or float32 with bf16 x (bf16::param_dtype_ok).
  auto same_kind = [&](const at::Tensor& t, const char* name) {
    TORCH_CHECK(t.device() == x.device() && bf16::param_dtype_ok(t, x), op, ": ", name,
                " must be a ", x.scalar_type(), " tensor on ", x.device(), " like x, got ", t.scalar_type(),
                " on ", t.device());
  };
  same_kind(dw_weight, "dw_weight");
  same_kind(pw_weight, "pw_weight");
  if (dw_bias) {
    same_kind(*dw_bias, "dw_bias");
    TORCH_CHECK(dw_bias->dim() == 1 && dw_bias->size(0) == s.C_in, op, ": dw_bias must be [C_in=", s.C_in,
                "], got ", dw_bias->sizes());
  }
  if (pw_bias) {
    same_kind(*pw_bias, "pw_bias");
    TORCH_CHECK(pw_bias->dim() == 1 && pw_bias->size(0) == s.C_out, op, ": pw_bias must be [C_out=", s.C_out,
                "], got ", pw_bias->sizes());
  }
  return s;
}

// Weights in the layouts the loops and GEMMs want: depthwise as [K, C_in], pointwise as [C_out, C_in].
at::Tensor depthwise_kc(const at::Tensor& dw_weight) {
  return dw_weight.reshape({dw_weight.size(0), dw_weight.size(2)}).t().contiguous();
}
at::Tensor pointwise_2d(const at::Tensor& pw_weight) {
  return pw_weight.reshape({pw_weight.size(0), pw_weight.size(1)}).contiguous();
}

// The optional residual, checked against x, contiguous.
c10::optional<at::Tensor> checked_residual(const char* op, const c10::optional<at::Tensor>& residual,
                                           const Shapes& s, const at::Tensor& x) {
  if (!residual) return c10::nullopt;
  TORCH_CHECK(residual->sizes() == at::IntArrayRef({s.B, s.L, s.C_out}), op, ": residual must be [B, L, C_out]=[",
              s.B, ", ", s.L, ", ", s.C_out, "], got ", residual->sizes());
  TORCH_CHECK(residual->device() == x.device() && residual->scalar_type() == x.scalar_type(), op,
              ": residual must match x in dtype and device");
  return residual->contiguous();
}

// ---- the bf16 "native" route's products (gemm::bf16_brgemm) ----
// The same tiles and loops as the float32 kernel; each tile's products on PyTorch's batch-reduce GEMM micro-kernel
// instead of at::mm on bf16 copies made per tile: the tile's left factor rounded to bf16 into the thread's scratch,
// the pointwise weight packed once per weight value (gemm::packed_weight), the exact products summed in float32
// into the tile's float32 buffer. No tensor per tile; the products' sums are float32, not rounded to bf16.
bool native_products_apply(const Shapes& s) {
  return gemm::bf16_brgemm_usable() && s.C_in % 2 == 0 && s.C_out % 2 == 0;
}

// The pointwise weight as a route's kernel reads it: bf16 for bf16 products, float32 for float32 ones; and, where
// the native route multiplies on the micro-kernel, packed (made once per weight value) for the forward's
// y = h·pwᵀ (pw [C_out, C_in]) or, `transposed`, the backward's dL/dh = gz·pw (pwᵀ [C_in, C_out]).
struct PointwiseOperands {
  at::Tensor weight, packed;  // packed: undefined where the micro-kernel does not run
};
PointwiseOperands pointwise_operands(const at::Tensor& pw_weight, gemm::Route route, const Shapes& s,
                                     bool transposed) {
  if (route != gemm::Route::kNative) return {bf16::widen(pw_weight), at::Tensor()};
  if (!native_products_apply(s)) return {bf16::narrow(pw_weight), at::Tensor()};
  const at::Tensor packed =
      gemm::packed_weight(pw_weight, transposed ? "dwsep pointwise vnni t" : "dwsep pointwise vnni", [&] {
        const at::Tensor w = pw_weight.select(2, 0);  // [C_out, C_in], read through its strides by the one pass
        return gemm::pack_vnni(transposed ? w.t() : w);
      });
  return {pw_weight, packed};  // the kernels read only the packed weight: no bf16 copy of pw_weight
}

// The route of a bf16 call of `op` (gemm::route_for, per shape class): "native" takes the products in bf16 -- on
// the micro-kernel where native_products_apply, else on torch's bf16 GEMM (a gemm::Bf16Products scope) --,
// "widen" in float32. Both run the float32 kernel's loops, reading the bf16 activations through Rows, and round the
// results to bf16.
gemm::Route bf16_route(const char* op, const Shapes& s, const std::function<void(gemm::Route)>& run) {
  const std::string shape =
      gemm::shape_class({{"rows", s.B * s.L}, {"C_in", s.C_in}, {"C_out", s.C_out}, {"K", s.K}});
  return gemm::route_for(op, shape, run);
}

// The dtype a kernel computes in for activations of t's dtype: float32 for bf16 (read through Rows), else t's.
at::ScalarType compute_dtype(const at::Tensor& t) { return bf16::is_bf16(t) ? at::kFloat : t.scalar_type(); }

// The forward on checked arguments (check_args, checked_residual): dw_weight and the biases float32 or float64,
// the dtype it computes in (compute_dtype); x and the residual that dtype or bf16 (read through Rows).
// pw_weight feeds the GEMMs only: the compute dtype, or bf16 inside a Bf16Products scope (a bf16 operand
// is taken as it is, where a float32 one would be rounded to bf16 on every tile). bf16_out (computing in
// float32): y is bf16, each tile computed in a float32 buffer and rounded while in cache, instead of a float32
// y [B, L, C_out] allocated, written and read again by a separate rounding pass.
std::tuple<at::Tensor, at::Tensor> dwsep_forward(const Shapes& s, const at::Tensor& x_in, const at::Tensor& dw_weight,
                                                 const c10::optional<at::Tensor>& dw_bias_in,
                                                 const at::Tensor& pw_weight,
                                                 const c10::optional<at::Tensor>& pw_bias_in,
                                                 const c10::optional<at::Tensor>& residual, int64_t pad_left,
                                                 bool relu, bool bf16_out = false,
                                                 const at::Tensor& pw_packed = at::Tensor()) {
  gemm::prepare();
  c10::optional<at::Tensor> dw_bias, pw_bias;
  if (dw_bias_in) dw_bias = dw_bias_in->contiguous();
  if (pw_bias_in) pw_bias = pw_bias_in->contiguous();
  // Channels-first data viewed as [B, L, C] (or any other layout) is copied to channels-last once.
  const at::Tensor x = x_in.contiguous();
  const auto opts = x.options().dtype(compute_dtype(x));
  const at::Tensor wt = depthwise_kc(dw_weight);
  // The right factor [C_in, C_out]. BLAS: contiguous (MKL's small-M GEMM on a transposed view is up
  // to 1.8x slower here); oneDNN: a transposed view of [C_out, C_in], its own weight layout.
  const bool onednn = gemm::engine_for(opts.dtype().toScalarType()) == gemm::Engine::kOneDnn;
  const at::Tensor w_t = pw_packed.defined() ? at::Tensor()  // the native route reads pw_packed only
                         : onednn ? pointwise_2d(pw_weight).t() : pointwise_2d(pw_weight).t().contiguous();
  at::Tensor y = at::empty({s.B, s.L, s.C_out}, bf16_out ? opts.dtype(at::kBFloat16) : opts);
  // The ReLU mask; none without ReLU (the op's aux is then absent: nothing allocated).
  at::Tensor aux = relu ? at::empty({s.B, s.L, s.C_out}, opts.dtype(at::kBool)) : at::Tensor();
  at::Tensor y2d = y.view({s.B * s.L, s.C_out});
  const Tiling tiles(s.B, s.L, s.C_in, s.C_out, s.K, at::get_num_threads(), /*group_sequences=*/true);
  // The tiles' GEMMs run on the pool's threads: they take their products in bf16 when the caller does.
  const bool b16 = gemm::bf16_products();

  AT_DISPATCH_FLOATING_TYPES(opts.dtype().toScalarType(), "dwsep_conv1d_fwd", [&] {
    const Rows<scalar_t> xs(x), res(residual);
    const scalar_t* wtp = wt.data_ptr<scalar_t>();
    const scalar_t* dbp = data_or_null<scalar_t>(dw_bias);
    const scalar_t* pbp = data_or_null<scalar_t>(pw_bias);
    bool* mp = relu ? aux.data_ptr<bool>() : nullptr;
    at::parallel_for(0, tiles.count, tiles.grain, [&](int64_t t0, int64_t t1) {
      const BelowAutograd below_autograd;
      const gemm::Bf16Products bf16_scope(b16);
      at::Tensor h = at::empty({tiles.max_rows(), s.C_in}, opts);
      at::Tensor y_buf = bf16_out ? at::empty({tiles.max_rows(), s.C_out}, opts) : at::Tensor();
      // A bf16 x: the rows one sequence's depthwise taps read (input_span), widened.
      std::vector<scalar_t> x_rows(xs.widens() ? (tiles.chunk + s.K - 1) * s.C_in : 0);
      // The native route's products (computing in float32): h rounded to bf16 here, pw_packed the right factor.
      const bool native = pw_packed.defined() && std::is_same_v<scalar_t, float>;
      std::vector<c10::BFloat16> h16(native ? tiles.max_rows() * s.C_in : 0);
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t b0 = tiles.seq(t), b1 = tiles.seq_end(t), l0 = tiles.begin(t), l1 = tiles.end(t);
        const int64_t rows = (b1 - b0) * (l1 - l0);
        const int64_t row0 = b0 * s.L + l0;  // first row of the tile in the flattened [B*L, C] views
        at::Tensor h_tile = h.narrow(0, 0, rows);
        const auto [lo, hi] = input_span(s.L, s.K, pad_left, l0, l1);
        for (int64_t b = b0; b < b1; ++b) {
          depthwise_rows(xs.get(b * s.L + lo, hi - lo, x_rows.data()), lo, wtp, dbp,
                         h_tile.data_ptr<scalar_t>() + (b - b0) * (l1 - l0) * s.C_in, s.L, s.C_in, s.K, pad_left, l0,
                         l1);
        }
        at::Tensor y_tile = bf16_out ? y_buf.narrow(0, 0, rows) : y2d.narrow(0, row0, rows);
        // The bias, when there is one, is the GEMM's starting value (fill_rows): the epilogue has one
        // pass less.
        if (pbp) fill_rows(y_tile.data_ptr<scalar_t>(), s.C_out, pbp, s.C_out, rows);
        if constexpr (std::is_same_v<scalar_t, float>) {
          if (native) {
            bf16::narrow_row(h_tile.data_ptr<float>(), rows * s.C_in, h16.data());
            gemm::bf16_brgemm(rows, s.C_out, s.C_in, h16.data(), s.C_in,
                              pw_packed.data_ptr<c10::BFloat16>(), y_tile.data_ptr<float>(), s.C_out,
                              /*accumulate=*/pbp != nullptr);
          }
        }
        if (!native) gemm::mm_out(y_tile, h_tile, w_t, /*accumulate=*/pbp != nullptr);
        epilogue_rows(y_tile.data_ptr<scalar_t>(), res, row0, mp ? mp + row0 * s.C_out : nullptr, rows, s.C_out,
                      relu);
        if (bf16_out) {
          bf16::narrow_row(y_tile.data_ptr<float>(), rows * s.C_out, y.data_ptr<c10::BFloat16>() + row0 * s.C_out);
        }
      }
      if (native) gemm::bf16_brgemm_release();
    });
  });
  return {y, aux};
}

std::tuple<at::Tensor, c10::optional<at::Tensor>> dwsep_conv1d_fwd(
    const at::Tensor& x, const at::Tensor& dw_weight, const c10::optional<at::Tensor>& dw_bias,
    const at::Tensor& pw_weight, const c10::optional<at::Tensor>& pw_bias,
    const c10::optional<at::Tensor>& residual_in, int64_t pad_left, bool relu) {
  constexpr const char* op = "dwsep_conv1d_fwd";
  const Shapes s = check_args(op, x, dw_weight, dw_bias, pw_weight, pw_bias, pad_left);
  const c10::optional<at::Tensor> residual = checked_residual(op, residual_in, s, x);
  if (!bf16::is_bf16(x)) {
    auto [y, aux] = dwsep_forward(s, x, dw_weight, dw_bias, pw_weight, pw_bias, residual, pad_left, relu);
    return {y, if_defined(aux)};
  }
  // bf16 (csrc/cpu/bf16.h): the float32 kernel reading the bf16 x and residual tile by tile, its products by the
  // route (bf16_route); y rounded once, at the end of its tile.
  const auto run = [&](gemm::Route route) {
    const gemm::Bf16Products bf16_scope(route == gemm::Route::kNative);
    const PointwiseOperands pw = pointwise_operands(pw_weight, route, s, /*transposed=*/false);
    return dwsep_forward(s, x, bf16::widen(dw_weight), bf16::widen(dw_bias), pw.weight, bf16::widen(pw_bias), residual,
                         pad_left, relu, /*bf16_out=*/true, pw.packed);
  };
  auto [y, aux] = run(bf16_route(op, s, [&](gemm::Route r) { (void)run(r); }));
  return {y, if_defined(aux)};
}

// The backward's checks of grad_y and aux (the rest is check_args'): aux, the forward's ReLU mask with relu,
// absent without.
at::Tensor check_grad_and_aux(const char* op, const Shapes& s, const at::Tensor& grad_y, const at::Tensor& x,
                              const c10::optional<at::Tensor>& aux_in, bool relu) {
  TORCH_CHECK(grad_y.sizes() == at::IntArrayRef({s.B, s.L, s.C_out}) && grad_y.scalar_type() == x.scalar_type() &&
                  grad_y.device() == x.device(),
              op, ": grad_y must be a [B, L, C_out]=[", s.B, ", ", s.L, ", ", s.C_out, "] ", x.scalar_type(),
              " tensor like x, got ", grad_y.sizes(), " ", grad_y.scalar_type());
  if (!relu) {
    TORCH_CHECK(!aux_in.has_value(), op, ": without relu, aux must be None (the forward's), got a tensor");
    return at::Tensor();
  }
  TORCH_CHECK(aux_in.has_value(), op, ": with relu, aux must be the forward's bool mask [B, L, C_out], got None");
  const at::Tensor& aux = *aux_in;
  TORCH_CHECK(aux.scalar_type() == at::kBool && aux.sizes() == grad_y.sizes(), op,
              ": with relu, aux must be the forward's bool mask [B, L, C_out], got ", aux.sizes(), " ",
              aux.scalar_type());
  return aux;
}

// The backward on checked arguments (check_args, check_grad_and_aux); the dtypes as dwsep_forward's, grad_y the
// compute dtype or bf16 (read through Rows). bf16_out (computing in float32): grad_x is bf16, rounded tile by
// tile from a float32 buffer, as dwsep_forward's y.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> dwsep_backward(
    const Shapes& s, const at::Tensor& grad_y_in, const at::Tensor& x_in, const at::Tensor& dw_weight,
    const c10::optional<at::Tensor>& dw_bias_in, const at::Tensor& pw_weight,
    const c10::optional<at::Tensor>& pw_bias, const at::Tensor& aux_in, int64_t pad_left, bool relu,
    bool bf16_out = false, const at::Tensor& pw_t_packed = at::Tensor()) {
  gemm::prepare();
  const at::Tensor grad_y = grad_y_in.contiguous();
  const at::Tensor x = x_in.contiguous();
  const auto opts = x.options().dtype(compute_dtype(x));
  const at::Tensor aux = relu ? aux_in.contiguous() : aux_in;
  c10::optional<at::Tensor> dw_bias;
  if (dw_bias_in) dw_bias = dw_bias_in->contiguous();
  const at::Tensor wt = depthwise_kc(dw_weight);
  const at::Tensor w2d = pw_t_packed.defined() ? at::Tensor() : pointwise_2d(pw_weight);  // native: packed only
  const at::Tensor grad_y2d = grad_y.view({s.B * s.L, s.C_out});
  const int64_t pad_right = s.K - 1 - pad_left;

  const Tiling tiles(s.B, s.L, s.C_in, s.C_out, s.K, kBackwardThreads);
  const int64_t groups = tiles.blocks();
  at::Tensor grad_x = at::empty({s.B, s.L, s.C_in}, bf16_out ? opts.dtype(at::kBFloat16) : opts);
  // Per-block partials, zero-initialised so blocks accumulate into them directly.
  at::Tensor part_pw = at::zeros({groups, s.C_out, s.C_in}, opts);
  at::Tensor part_pb = pw_bias ? at::zeros({groups, s.C_out}, opts) : at::Tensor();
  at::Tensor part_dw = at::zeros({groups, s.K, s.C_in}, opts);
  at::Tensor part_db = dw_bias ? at::zeros({groups, s.C_in}, opts) : at::Tensor();
  const bool b16 = gemm::bf16_products();  // as in the forward: the blocks' GEMMs run on the pool's threads

  AT_DISPATCH_FLOATING_TYPES(opts.dtype().toScalarType(), "dwsep_conv1d_bwd", [&] {
    const Rows<scalar_t> xs(x), gy(grad_y);
    const scalar_t* wtp = wt.data_ptr<scalar_t>();
    const scalar_t* dbp = data_or_null<scalar_t>(dw_bias);
    const bool* mp = relu ? aux.data_ptr<bool>() : nullptr;
    // At least two parallel items, so that a single block too runs inside the thread pool's parallel
    // region whenever there are threads: its GEMMs then run single-threaded, as they do on one thread
    // (a GEMM called outside the region may split its work by the thread count and round differently).
    at::parallel_for(0, std::max<int64_t>(groups, 2), 1, [&](int64_t g0, int64_t g1) {
      g1 = std::min(g1, groups);
      if (g0 >= g1) return;
      const BelowAutograd below_autograd;
      const gemm::Bf16Products bf16_scope(b16);
      const int64_t halo_rows = tiles.chunk + s.K - 1;
      at::Tensor h = at::empty({tiles.chunk, s.C_in}, opts);
      at::Tensor gh = at::empty({halo_rows, s.C_in}, opts);
      // gz: grad_y's rows masked by the ReLU mask, or widened from bf16; without either grad_y is read in place.
      const bool own_gz = relu || gy.widens();
      at::Tensor gz = own_gz ? at::empty({halo_rows, s.C_out}, opts) : at::Tensor();
      // A bf16 x: the rows a tile's depthwise taps read (input_span), widened.
      std::vector<scalar_t> x_rows(xs.widens() ? (tiles.chunk + s.K - 1) * s.C_in : 0);
      at::Tensor gx_buf = bf16_out ? at::empty({tiles.chunk, s.C_in}, opts) : at::Tensor();
      // The native route's products (computing in float32): gz rounded to bf16 (as it is, for dL/dh = gz·pw) and
      // transposed (the left factor of gzᵀ·h), h paired by rows (the right factor).
      const bool native = pw_t_packed.defined() && std::is_same_v<scalar_t, float>;
      const int64_t chunk_p = tiles.chunk + tiles.chunk % 2;
      std::vector<c10::BFloat16> gz16(native ? halo_rows * s.C_out : 0), gz_t16(native ? s.C_out * chunk_p : 0),
          h_vnni(native ? chunk_p * s.C_in : 0);
      for (int64_t g = g0; g < g1; ++g) {
        at::Tensor pw_acc = part_pw[g];
        scalar_t* pb_acc = pw_bias ? part_pb[g].data_ptr<scalar_t>() : nullptr;
        scalar_t* dw_acc = part_dw[g].data_ptr<scalar_t>();
        scalar_t* db_acc = dw_bias ? part_db[g].data_ptr<scalar_t>() : nullptr;
        for (int64_t t = tiles.count * g / groups; t < tiles.count * (g + 1) / groups; ++t) {
          const int64_t b = tiles.seq(t), l0 = tiles.begin(t), l1 = tiles.end(t), rows = l1 - l0;
          // The transposed depthwise conv of rows [l0, l1) reads dL/dh on [e0, e1).
          const int64_t e0 = std::max<int64_t>(0, l0 - pad_right), e1 = std::min(s.L, l1 + pad_left);
          const int64_t ext = e1 - e0, row_e0 = b * s.L + e0;
          // gz = dL/d(pointwise output) on the extended rows; without ReLU it is grad_y itself.
          at::Tensor gz_ext;
          if (own_gz) {
            gz_ext = gz.narrow(0, 0, ext);
            scalar_t* gzp = gz_ext.data_ptr<scalar_t>();
            const scalar_t* gyp = gy.get(row_e0, ext, gzp);
            if (relu) relu_backward_rows(gyp, mp + row_e0 * s.C_out, gzp, ext * s.C_out);
          } else {
            gz_ext = grad_y2d.narrow(0, row_e0, ext);
          }
          at::Tensor gz_tile = gz_ext.narrow(0, l0 - e0, rows);
          if (pb_acc) accumulate_rows(gz_tile.data_ptr<scalar_t>(), rows, s.C_out, pb_acc);
          // Recompute the depthwise output of the tile for the pointwise weight gradient.
          at::Tensor h_tile = h.narrow(0, 0, rows);
          const auto [lo, hi] = input_span(s.L, s.K, pad_left, l0, l1);
          const scalar_t* xr = xs.get(b * s.L + lo, hi - lo, x_rows.data());
          depthwise_rows(xr, lo, wtp, dbp, h_tile.data_ptr<scalar_t>(), s.L, s.C_in, s.K, pad_left, l0, l1);
          at::Tensor gh_ext = gh.narrow(0, 0, ext);
          if constexpr (std::is_same_v<scalar_t, float>) {
            if (native) {
              const int64_t rows_p = rows + rows % 2;
              gemm::pack_transposed(gz_tile.data_ptr<float>(), s.C_out, rows, s.C_out, gz_t16.data());
              gemm::pack_vnni(h_tile.data_ptr<float>(), nullptr, s.C_in, rows, 1, s.C_in, h_vnni.data());
              gemm::bf16_brgemm(s.C_out, s.C_in, rows_p, gz_t16.data(), rows_p, h_vnni.data(),
                                pw_acc.data_ptr<float>(), s.C_in, /*accumulate=*/true);
              bf16::narrow_row(gz_ext.data_ptr<float>(), ext * s.C_out, gz16.data());
              gemm::bf16_brgemm(ext, s.C_in, s.C_out, gz16.data(), s.C_out,
                                pw_t_packed.data_ptr<c10::BFloat16>(), gh_ext.data_ptr<float>(), s.C_in,
                                /*accumulate=*/false);
            }
          }
          if (!native) {
            gemm::mm_out(pw_acc, gz_tile.t(), h_tile, /*accumulate=*/true);
            gemm::mm_out(gh_ext, gz_ext, w2d);
          }
          const scalar_t* ghp = gh_ext.data_ptr<scalar_t>();
          const int64_t row0 = b * s.L + l0;
          scalar_t* gxp = bf16_out ? gx_buf.data_ptr<scalar_t>() : grad_x.data_ptr<scalar_t>() + row0 * s.C_in;
          depthwise_backward_rows(ghp, e0, xr, lo, wtp, gxp, dw_acc, db_acc, s.L, s.C_in, s.K, pad_left, l0, l1);
          if (bf16_out) {
            bf16::narrow_row(gx_buf.data_ptr<float>(), rows * s.C_in, grad_x.data_ptr<c10::BFloat16>() + row0 * s.C_in);
          }
        }
      }
      if (native) gemm::bf16_brgemm_release();
    });
  });

  at::Tensor grad_pw_weight = reduce_partials(part_pw).view({s.C_out, s.C_in, 1});
  at::Tensor grad_dw_weight = reduce_partials(part_dw).t().contiguous().view({s.C_in, 1, s.K});
  // An absent bias has no gradient (undefined: the op returns None).
  at::Tensor grad_pw_bias = pw_bias ? reduce_partials(part_pb) : at::Tensor();
  at::Tensor grad_dw_bias = dw_bias ? reduce_partials(part_db) : at::Tensor();
  return {grad_x, grad_dw_weight, grad_dw_bias, grad_pw_weight, grad_pw_bias};
}

std::tuple<at::Tensor, at::Tensor, c10::optional<at::Tensor>, at::Tensor, c10::optional<at::Tensor>> dwsep_conv1d_bwd(
    const at::Tensor& grad_y, const at::Tensor& x, const at::Tensor& dw_weight,
    const c10::optional<at::Tensor>& dw_bias, const at::Tensor& pw_weight,
    const c10::optional<at::Tensor>& pw_bias, const c10::optional<at::Tensor>& aux_in, int64_t pad_left, bool relu) {
  constexpr const char* op = "dwsep_conv1d_bwd";
  const Shapes s = check_args(op, x, dw_weight, dw_bias, pw_weight, pw_bias, pad_left);
  const at::Tensor aux = check_grad_and_aux(op, s, grad_y, x, aux_in, relu);
  if (!bf16::is_bf16(x)) {
    auto [gx, gdw, gdb, gpw, gpb] =
        dwsep_backward(s, grad_y, x, dw_weight, dw_bias, pw_weight, pw_bias, aux, pad_left, relu);
    return {gx, gdw, if_defined(gdb), gpw, if_defined(gpb)};
  }
  // bf16: the float32 kernel reading the bf16 grad_y and x tile by tile (as dwsep_conv1d_fwd).
  const auto run = [&](gemm::Route route) {
    const gemm::Bf16Products bf16_scope(route == gemm::Route::kNative);
    const PointwiseOperands pw = pointwise_operands(pw_weight, route, s, /*transposed=*/true);
    return dwsep_backward(s, grad_y, x, bf16::widen(dw_weight), bf16::widen(dw_bias), pw.weight, pw_bias, aux,
                          pad_left, relu, /*bf16_out=*/true, pw.packed);
  };
  auto [gx, gdw, gdb, gpw, gpb] = run(bf16_route(op, s, [&](gemm::Route r) { (void)run(r); }));
  return {gx, bf16::grad_like(gdw, dw_weight), if_defined(bf16::grad_like(gdb, dw_bias)),
          bf16::grad_like(gpw, pw_weight), if_defined(bf16::grad_like(gpb, pw_bias))};
}

// ------------------------------------------------------------------------------------------------
// Pre-LayerNorm variant
// ------------------------------------------------------------------------------------------------

// Rows per block of the LayerNorm parameter-gradient reduction (at most kBackwardThreads blocks).
constexpr int64_t kLnBlockRows = 256;

// Row statistics of x [C]: (mean, 1/sqrt(biased variance + eps)), two passes in double, the first on x
// shifted by its first value. A constant row then has a mean equal to its value exactly and a variance of
// exactly 0, so its normalised values are exact zeros and 1/std is exactly 1/sqrt(eps) -- what the
// LayerNorm's gradient there is made of (with a tiny eps, a variance of one rounding error instead,
// e.g. a float64 sum of C values divided by C, would replace eps and change the gradient's scale
// entirely). Shifting by a value of the row also keeps the sums small for rows far from zero.
template <typename T>
void layer_norm_stats(const T* x, int64_t C, double eps, T* mean_out, T* rstd_out) {
  const double shift = double(x[0]);
  double sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t c = 0; c < C; ++c) sum += double(x[c]) - shift;
  const double mean = shift + sum / double(C);
  double sq = 0;
#pragma omp simd reduction(+ : sq)
  for (int64_t c = 0; c < C; ++c) {
    const double v = double(x[c]) - mean;
    sq += v * v;
  }
  *mean_out = T(mean);
  *rstd_out = T(1.0 / std::sqrt(sq / double(C) + eps));
}

// h [C] = (x - mean) * rstd * w + b: the forward's and (rebuilding h) the backward's one expression.
template <typename T>
void layer_norm_row(const T* __restrict x, T mean, T rstd, const T* __restrict w, const T* __restrict b,
                    T* __restrict h, int64_t C) {
#pragma omp simd
  for (int64_t c = 0; c < C; ++c) h[c] = (x[c] - mean) * rstd * w[c] + b[c];
}

// LayerNorm backward of rows [r0, r1) of x / g = dL/dh [rows, C] (stats [B, 2, L]: mean, rstd), with
// xhat = (x - mean) * rstd: grad_x = rstd * (g∘w - mean(g∘w) - xhat * mean(g∘w∘xhat)) row by row, and
// acc_w += Σ g∘xhat, acc_b += Σ g over the rows in order (rows with mask false: grad_x 0, nothing added).
// grad_x points at row r0's gradient. gw, x_row: [C] scratch (x_row: Rows::get's, for a bf16 x).
template <typename T>
void layer_norm_backward_rows(const Rows<T>& x, const T* g, const T* w, const T* stats, const bool* mask, T* grad_x,
                              T* acc_w, T* acc_b, T* gw, T* x_row, int64_t r0, int64_t r1, int64_t L, int64_t C) {
  for (int64_t r = r0; r < r1; ++r) {
    if (mask && !mask[r]) {  // a masked row's h was 0, whatever x: no gradient reaches x or the LN parameters
      std::fill(grad_x + (r - r0) * C, grad_x + (r - r0 + 1) * C, T(0));
      continue;
    }
    const T* xr = x.get(r, 1, x_row);
    const T* gr = g + r * C;
    const T mean = stats[(r / L * 2) * L + r % L], rstd = stats[(r / L * 2 + 1) * L + r % L];
    double sum_g = 0, sum_gx = 0;
#pragma omp simd reduction(+ : sum_g, sum_gx)
    for (int64_t c = 0; c < C; ++c) {
      const T xhat = (xr[c] - mean) * rstd;
      gw[c] = gr[c] * w[c];
      sum_g += double(gw[c]);
      sum_gx += double(gw[c] * xhat);
      acc_w[c] += gr[c] * xhat;
      acc_b[c] += gr[c];
    }
    const T mean_g = T(sum_g / double(C)), mean_gx = T(sum_gx / double(C));
    T* gxr = grad_x + (r - r0) * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) gxr[c] = rstd * (gw[c] - mean_g - (xr[c] - mean) * rstd * mean_gx);
  }
}

void check_ln_args(const char* op, const at::Tensor& x, const at::Tensor& ln_weight, const at::Tensor& ln_bias) {
  const int64_t C = x.size(2);
  auto check = [&](const at::Tensor& t, const char* name) {
    TORCH_CHECK(t.dim() == 1 && t.size(0) == C, op, ": ", name, " must be [C_in=", C, "], got ", t.sizes());
    TORCH_CHECK(t.device() == x.device() && bf16::param_dtype_ok(t, x), op, ": ", name, " must be a ",
                x.scalar_type(), " tensor on ", x.device(), " like x, got ", t.scalar_type(), " on ", t.device());
  };
  check(ln_weight, "ln_weight");
  check(ln_bias, "ln_bias");
}

// The optional row mask, checked, contiguous (undefined when absent).
at::Tensor checked_row_mask(const char* op, const c10::optional<at::Tensor>& mask, const at::Tensor& x) {
  if (!mask.has_value()) return at::Tensor();
  const at::Tensor& m = *mask;
  TORCH_CHECK(m.scalar_type() == at::kBool && m.dim() == 2 && m.size(0) == x.size(0) && m.size(1) == x.size(1) &&
                  m.device() == x.device(),
              op, ": mask must be a bool [B, L]=[", x.size(0), ", ", x.size(1), "] tensor on ", x.device(), ", got ",
              m.scalar_type(), " ", m.sizes(), " on ", m.device());
  return m.contiguous();
}

// h rows [r0, r1) = LN(x) (zero where the mask is false) from the row statistics [B, 2, L] (mean, rstd),
// computed into them first when eps is given. x_row: [C] scratch (Rows::get's, for a bf16 x).
template <typename T>
void layer_norm_rows(const Rows<T>& x, const T* w, const T* b, T* stats, const bool* mask, c10::optional<double> eps,
                     T* h, T* x_row, int64_t r0, int64_t r1, int64_t L, int64_t C) {
  for (int64_t r = r0; r < r1; ++r) {
    T* mean = stats + (r / L * 2) * L + r % L;
    const bool kept = !mask || mask[r];
    const T* xr = eps || kept ? x.get(r, 1, x_row) : nullptr;  // a masked row is read for its statistics only
    if (eps) layer_norm_stats(xr, C, *eps, mean, mean + L);
    if (kept) {
      layer_norm_row(xr, mean[0], mean[L], w, b, h + r * C, C);
    } else {
      std::fill(h + r * C, h + (r + 1) * C, T(0));
    }
  }
}

// h = LN(x): [B, L, C_in] in the compute dtype (x contiguous, that dtype or bf16; rows where the mask is false
// are zero) from the row statistics [B, 2, L] (mean, rstd) -- computed into `stats` first when eps is given (the
// forward), read otherwise (the backward, rebuilding h).
at::Tensor normalized_input(const Shapes& s, const at::Tensor& x, const at::Tensor& ln_weight_in,
                            const at::Tensor& ln_bias_in, const at::Tensor& stats, const at::Tensor& mask,
                            c10::optional<double> eps) {
  const at::Tensor ln_weight = ln_weight_in.contiguous(), ln_bias = ln_bias_in.contiguous();
  const auto opts = x.options().dtype(compute_dtype(x));
  at::Tensor h = at::empty({s.B, s.L, s.C_in}, opts);
  AT_DISPATCH_FLOATING_TYPES(opts.dtype().toScalarType(), "ln_dwsep_conv1d", [&] {
    const Rows<scalar_t> xs(x);
    at::parallel_for(0, s.B * s.L, std::max<int64_t>(1, kMinTaskWork / (4 * s.C_in)), [&](int64_t r0, int64_t r1) {
      std::vector<scalar_t> x_row(xs.widens() ? s.C_in : 0);
      layer_norm_rows(xs, ln_weight.data_ptr<scalar_t>(), ln_bias.data_ptr<scalar_t>(), stats.data_ptr<scalar_t>(),
                      mask.defined() ? mask.data_ptr<bool>() : nullptr, eps, h.data_ptr<scalar_t>(), x_row.data(), r0,
                      r1, s.L, s.C_in);
    });
  });
  return h;
}

// The forward on checked arguments (check_args, check_ln_args, checked_residual, checked_row_mask); the dtypes
// as dwsep_forward's, the LayerNorm parameters x's.
std::tuple<at::Tensor, at::Tensor, at::Tensor> ln_forward(
    const Shapes& s, const at::Tensor& x_in, const at::Tensor& ln_weight_in, const at::Tensor& ln_bias_in, double eps,
    const at::Tensor& dw_weight, const c10::optional<at::Tensor>& dw_bias, const at::Tensor& pw_weight,
    const c10::optional<at::Tensor>& pw_bias, const c10::optional<at::Tensor>& residual, const at::Tensor& mask,
    int64_t pad_left, bool relu, bool bf16_out = false, const at::Tensor& pw_packed = at::Tensor()) {
  const at::Tensor x = x_in.contiguous();
  at::Tensor stats = at::empty({s.B, 2, s.L}, x.options().dtype(compute_dtype(x)));
  const at::Tensor h = normalized_input(s, x, ln_weight_in, ln_bias_in, stats, mask, eps);
  auto [y, aux] =
      dwsep_forward(s, h, dw_weight, dw_bias, pw_weight, pw_bias, residual, pad_left, relu, bf16_out, pw_packed);
  return {y, aux, stats};
}

std::tuple<at::Tensor, c10::optional<at::Tensor>, at::Tensor> ln_dwsep_conv1d_fwd(
    const at::Tensor& x, const at::Tensor& ln_weight, const at::Tensor& ln_bias, double eps,
    const at::Tensor& dw_weight, const c10::optional<at::Tensor>& dw_bias, const at::Tensor& pw_weight,
    const c10::optional<at::Tensor>& pw_bias, const c10::optional<at::Tensor>& residual_in,
    const c10::optional<at::Tensor>& mask_in, int64_t pad_left, bool relu) {
  constexpr const char* op = "ln_dwsep_conv1d_fwd";
  const Shapes s = check_args(op, x, dw_weight, dw_bias, pw_weight, pw_bias, pad_left);
  check_ln_args(op, x, ln_weight, ln_bias);
  TORCH_CHECK(eps > 0, op, ": eps must be positive, got ", eps);
  const at::Tensor mask = checked_row_mask(op, mask_in, x);
  const c10::optional<at::Tensor> residual = checked_residual(op, residual_in, s, x);
  if (!bf16::is_bf16(x)) {
    auto [y, aux, stats] = ln_forward(s, x, ln_weight, ln_bias, eps, dw_weight, dw_bias, pw_weight, pw_bias,
                                      residual, mask, pad_left, relu);
    return {y, if_defined(aux), stats};
  }
  // bf16: as dwsep_conv1d_fwd (x read row by row by the LayerNorm); the statistics are saved in float32, the
  // dtype they are computed in.
  const auto run = [&](gemm::Route route) {
    const gemm::Bf16Products bf16_scope(route == gemm::Route::kNative);
    const PointwiseOperands pw = pointwise_operands(pw_weight, route, s, /*transposed=*/false);
    return ln_forward(s, x, bf16::widen(ln_weight), bf16::widen(ln_bias), eps, bf16::widen(dw_weight),
                      bf16::widen(dw_bias), pw.weight, bf16::widen(pw_bias), residual, mask, pad_left, relu,
                      /*bf16_out=*/true, pw.packed);
  };
  auto [y, aux, stats] = run(bf16_route(op, s, [&](gemm::Route r) { (void)run(r); }));
  return {y, if_defined(aux), stats};
}

// The backward on checked arguments (check_args, check_ln_args, check_grad_and_aux, the ln_stats check,
// checked_row_mask); the dtypes as ln_forward's, grad_y x's (or bf16, read through Rows), ln_stats the compute
// dtype. A bf16 x has a bf16 grad_x, each block of rows computed in a float32 buffer and rounded while in cache
// (as dwsep_backward's bf16_out).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> ln_backward(
    const Shapes& s, const at::Tensor& grad_y, const at::Tensor& x_in, const at::Tensor& ln_weight_in,
    const at::Tensor& ln_bias_in, const at::Tensor& dw_weight, const c10::optional<at::Tensor>& dw_bias,
    const at::Tensor& pw_weight, const c10::optional<at::Tensor>& pw_bias, const at::Tensor& aux,
    const at::Tensor& ln_stats_in, const at::Tensor& mask, int64_t pad_left, bool relu,
    const at::Tensor& pw_t_packed = at::Tensor()) {
  constexpr const char* op = "ln_dwsep_conv1d_bwd";
  const at::Tensor x = x_in.contiguous(), ln_weight = ln_weight_in.contiguous();
  const at::Tensor stats = ln_stats_in.contiguous();
  const bool* mp = mask.defined() ? mask.data_ptr<bool>() : nullptr;
  const int64_t rows = s.B * s.L, C = s.C_in;
  at::Tensor h = normalized_input(s, x, ln_weight, ln_bias_in, stats, mask, c10::nullopt);
  auto [grad_h, grad_dw_weight, grad_dw_bias, grad_pw_weight, grad_pw_bias] =
      dwsep_backward(s, grad_y, h, dw_weight, dw_bias, pw_weight, pw_bias, aux, pad_left, relu, /*bf16_out=*/false,
                     pw_t_packed);
  h.reset();
  // LayerNorm backward, with g = dL/dh and xhat = (x - mean) * rstd per row:
  //   grad_x = rstd * (g∘w - mean(g∘w) - xhat * mean(g∘w∘xhat)), grad_w = Σ_rows g∘xhat, grad_b = Σ_rows g.
  const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>(ceil_div(rows, kLnBlockRows), kBackwardThreads));
  const auto opts = x.options().dtype(compute_dtype(x));
  const bool bf16_out = bf16::is_bf16(x);
  at::Tensor grad_x = at::empty({s.B, s.L, C}, bf16_out ? opts.dtype(at::kBFloat16) : opts);
  at::Tensor part = at::zeros({blocks, 2, C}, opts);  // per block: [Σ g∘xhat, Σ g]
  AT_DISPATCH_FLOATING_TYPES(opts.dtype().toScalarType(), op, [&] {
    const Rows<scalar_t> xs(x);
    const scalar_t* wp = ln_weight.data_ptr<scalar_t>();
    const scalar_t* sp = stats.data_ptr<scalar_t>();
    const scalar_t* gp = grad_h.data_ptr<scalar_t>();
    scalar_t* gxp = bf16_out ? nullptr : grad_x.data_ptr<scalar_t>();
    scalar_t* partp = part.data_ptr<scalar_t>();
    // Each block by one thread, whichever: the partial sums depend on the block, not on the thread.
    at::parallel_for(0, blocks, 1, [&](int64_t k0, int64_t k1) {
      std::vector<scalar_t> gw(C), x_row(xs.widens() ? C : 0);
      at::Tensor gx_buf = bf16_out ? at::empty({ceil_div(rows, blocks), C}, opts) : at::Tensor();
      for (int64_t k = k0; k < k1; ++k) {
        scalar_t* acc_w = partp + k * 2 * C;
        scalar_t* acc_b = acc_w + C;
        const int64_t r0 = rows * k / blocks, r1 = rows * (k + 1) / blocks;
        scalar_t* gx = bf16_out ? gx_buf.data_ptr<scalar_t>() : gxp + r0 * C;
        layer_norm_backward_rows(xs, gp, wp, sp, mp, gx, acc_w, acc_b, gw.data(), x_row.data(), r0, r1, s.L, C);
        if (bf16_out) {
          bf16::narrow_row(gx_buf.data_ptr<float>(), (r1 - r0) * C, grad_x.data_ptr<c10::BFloat16>() + r0 * C);
        }
      }
    });
  });
  at::Tensor grad_ln = reduce_partials(part);  // [2, C], blocks summed in order
  return {grad_x, grad_ln[0].clone(), grad_ln[1].clone(), grad_dw_weight, grad_dw_bias, grad_pw_weight,
          grad_pw_bias};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, c10::optional<at::Tensor>, at::Tensor,
           c10::optional<at::Tensor>>
ln_dwsep_conv1d_bwd(const at::Tensor& grad_y, const at::Tensor& x, const at::Tensor& ln_weight,
                    const at::Tensor& ln_bias, const at::Tensor& dw_weight, const c10::optional<at::Tensor>& dw_bias,
                    const at::Tensor& pw_weight, const c10::optional<at::Tensor>& pw_bias,
                    const c10::optional<at::Tensor>& aux_in, const at::Tensor& ln_stats,
                    const c10::optional<at::Tensor>& mask_in, int64_t pad_left, bool relu) {
  constexpr const char* op = "ln_dwsep_conv1d_bwd";
  const Shapes s = check_args(op, x, dw_weight, dw_bias, pw_weight, pw_bias, pad_left);
  check_ln_args(op, x, ln_weight, ln_bias);
  const at::Tensor aux = check_grad_and_aux(op, s, grad_y, x, aux_in, relu);
  TORCH_CHECK(ln_stats.sizes() == at::IntArrayRef({s.B, 2, s.L}) && ln_stats.scalar_type() == bf16::statistics_dtype(x) &&
                  ln_stats.device() == x.device(),
              op, ": ln_stats must be the forward's [B, 2, L]=[", s.B, ", 2, ", s.L, "] ", bf16::statistics_dtype(x),
              " tensor, got ", ln_stats.sizes(), " ", ln_stats.scalar_type());
  const at::Tensor mask = checked_row_mask(op, mask_in, x);
  if (!bf16::is_bf16(x)) {
    auto [gx, glw, glb, gdw, gdb, gpw, gpb] = ln_backward(s, grad_y, x, ln_weight, ln_bias, dw_weight, dw_bias,
                                                          pw_weight, pw_bias, aux, ln_stats, mask, pad_left, relu);
    return {gx, glw, glb, gdw, if_defined(gdb), gpw, if_defined(gpb)};
  }
  const auto run = [&](gemm::Route route) {
    const gemm::Bf16Products bf16_scope(route == gemm::Route::kNative);
    const PointwiseOperands pw = pointwise_operands(pw_weight, route, s, /*transposed=*/true);
    return ln_backward(s, grad_y, x, bf16::widen(ln_weight), bf16::widen(ln_bias), bf16::widen(dw_weight),
                       bf16::widen(dw_bias), pw.weight, pw_bias, aux, ln_stats, mask, pad_left, relu, pw.packed);
  };
  auto [gx, glw, glb, gdw, gdb, gpw, gpb] = run(bf16_route(op, s, [&](gemm::Route r) { (void)run(r); }));
  return {gx, bf16::grad_like(glw, ln_weight), bf16::grad_like(glb, ln_bias),
          bf16::grad_like(gdw, dw_weight), if_defined(bf16::grad_like(gdb, dw_bias)), bf16::grad_like(gpw, pw_weight),
          if_defined(bf16::grad_like(gpb, pw_bias))};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(fastqa, m) {
  FASTQA_CPU_OP(m, dwsep_conv1d_fwd,
                "(Tensor x, Tensor dw_weight, Tensor? dw_bias, Tensor pw_weight, Tensor? pw_bias, Tensor? residual, "
                "int pad_left, bool relu) -> (Tensor y, Tensor? aux)");
  FASTQA_CPU_OP(m, dwsep_conv1d_bwd,
                "(Tensor grad_y, Tensor x, Tensor dw_weight, Tensor? dw_bias, Tensor pw_weight, Tensor? pw_bias, "
                "Tensor? aux, int pad_left, bool relu) -> (Tensor grad_x, Tensor grad_dw_weight, "
                "Tensor? grad_dw_bias, Tensor grad_pw_weight, Tensor? grad_pw_bias)");
  FASTQA_CPU_OP(m, ln_dwsep_conv1d_fwd,
                "(Tensor x, Tensor ln_weight, Tensor ln_bias, float eps, Tensor dw_weight, Tensor? dw_bias, "
                "Tensor pw_weight, Tensor? pw_bias, Tensor? residual, Tensor? mask, int pad_left, bool relu) "
                "-> (Tensor y, Tensor? aux, Tensor ln_stats)");
  FASTQA_CPU_OP(m, ln_dwsep_conv1d_bwd,
                "(Tensor grad_y, Tensor x, Tensor ln_weight, Tensor ln_bias, Tensor dw_weight, Tensor? dw_bias, "
                "Tensor pw_weight, Tensor? pw_bias, Tensor? aux, Tensor ln_stats, Tensor? mask, int pad_left, "
                "bool relu) -> (Tensor grad_x, Tensor grad_ln_weight, Tensor grad_ln_bias, Tensor grad_dw_weight, "
                "Tensor? grad_dw_bias, Tensor grad_pw_weight, Tensor? grad_pw_bias)");
}

}  // namespace fastqa
