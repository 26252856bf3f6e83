// GLU convolution (ConvS2S), causal and centred, and its one-step decode: CPU kernels.
//
//   pre = conv1d(pad(x * mask), weight) + bias        x [B, T, H], weight [2H, H, K], pre [., 2H]
//   g   = a * sigmoid(b),  [a; b] = pre split along channels (F.glu order)
//   y   = (g + x) * scale  (residual)  or  g * scale
//
// Layout trick (no im2col tensor): the masked input is copied once into a zero-padded row buffer
// xp [B*Tp, H], Tp = T + K - 1, one padded sequence after the other. Output position t of sequence
// b lives at row r = b*Tp + t of the "padded row space", and
//     pre[r] = bias + sum_k xp[r + k] @ W_k^T,          W_k = weight[:, :, k]  [2H, H]
// i.e. K GEMMs on contiguous row-shifted slices of xp (rows r in [0, N), N = B*Tp - (K-1)). The
// K-1 rows between two sequences are junk: ignored in the forward, zeroed in the backward.
// aux = pre [N, 2H] in that row space: the only thing the backward needs beyond the inputs (xp is
// rebuilt from x and mask, which is a cheap copy and saves holding a second activation).
//
// For 2 <= K <= 7 the contractions (forward, grad_x, grad_weight) run through Winograd's F(9-K, K) on the
// same row space instead of the K tap GEMMs (winograd.h; FASTQA_CPU_GLU_CONV chooses): the GEMMs are the
// op's time, and F(6, 3) does 8 of them with a sixth of the rows each, 2.25x fewer multiply-adds.
//
// bfloat16 (csrc/cpu/bf16.h): bf16 in and out -- y, the gradients, aux and the step's new state (aux is the
// pre-activation, an activation and not a statistic: bf16, as eager autocast saves its conv's output) --, the
// taps' products on bf16 operands, their sums, the bias, the GLU and its derivative in float32. Two routes per
// direction and shape class (gemm::route_for): native -- the taps summed in float32 by the batch-reduce GEMM
// micro-kernel per block of rows (fwd_bf16_brgemm, bwd_bf16_brgemm), or per-tap bf16 GEMMs where it does not
// apply (fwd_bf16, bwd_bf16) -- and widen (the float32 kernel on widened inputs). The native route always takes
// the direct taps: Winograd's transforms of bf16-rounded operands add errors of the order of a tile's largest
// value to every output of the tile, far beyond one bf16 rounding of each tap's product.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "cpu/bf16.h"
#include "cpu/bf16_rows.h"
#include "cpu/common.h"
#include "cpu/gemm.h"
#include "cpu/winograd.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace fastqa {
namespace {

// Rows per parallel work item in the element-wise passes; also the fixed block of rows whose
// bias-gradient partial sum is kept separately, so the reduction order never depends on the
// thread count (deterministic backward).
constexpr int64_t kRowBlock = 32;

template <typename T>
inline T sigmoid(T v) {
  return T(1) / (T(1) + vec_exp(-v));
}

struct Geometry {
  int64_t B, T, H, K, pad_left, Tp, N;  // Tp: padded length; N: rows of the padded row space
};

Geometry check_conv_args(const char* op, const at::Tensor& x, const at::Tensor& weight,
                         const std::optional<at::Tensor>& mask, int64_t pad_left) {
  FASTQA_CHECK(x.dim() == 3, op, "x must be [B, T, H], got ", x.sizes());
  FASTQA_CHECK(weight.dim() == 3, op, "weight must be [2H, H, K], got ", weight.sizes());
  FASTQA_CHECK(x.device().is_cpu() && weight.device().is_cpu(), op, "the cpu kernels take CPU tensors");
  FASTQA_CHECK(x.scalar_type() == weight.scalar_type(), op, "weight dtype ", weight.scalar_type(),
              " != x dtype ", x.scalar_type());
  const int64_t B = x.size(0), T = x.size(1), H = x.size(2), K = weight.size(2);
  FASTQA_CHECK(B > 0 && T > 0 && H > 0, op, "x must be non-empty, got ", x.sizes());
  FASTQA_CHECK(weight.size(0) == 2 * H && weight.size(1) == H, op, "weight must be [2H, H, K] = [",
              2 * H, ", ", H, ", K], got ", weight.sizes());
  FASTQA_CHECK(K > 0, op, "kernel size must be positive");
  FASTQA_CHECK(pad_left >= 0 && pad_left < K, op, "pad_left must be in [0, K-1], got ", pad_left);
  if (mask.has_value()) {
    FASTQA_CHECK(mask->scalar_type() == at::kBool, op, "mask must be bool, got ", mask->scalar_type());
    FASTQA_CHECK(mask->dim() == 2 && mask->size(0) == B && mask->size(1) == T, op, "mask must be [B, T] = [",
                B, ", ", T, "], got ", mask->sizes());
    FASTQA_CHECK(mask->device().is_cpu(), op, "mask must be a CPU tensor");
  }
  const int64_t Tp = T + K - 1;
  return {B, T, H, K, pad_left, Tp, B * Tp - (K - 1)};
}

void check_bias(const char* op, const std::optional<at::Tensor>& bias, const at::Tensor& x, int64_t H) {
  if (!bias.has_value()) return;
  FASTQA_CHECK(bias->dim() == 1 && bias->size(0) == 2 * H, op, "bias must be [2H] = [", 2 * H, "], got ",
              bias->sizes());
  FASTQA_CHECK(bias->scalar_type() == x.scalar_type() && bias->device().is_cpu(), op,
               "bias must be a CPU tensor of x's dtype");
}

// The weight as K contiguous [2H, H] taps W_k = weight[:, :, k] (BLAS needs a unit stride; W_k.t() is
// then free). One copy for all taps: every extra pass is a thread-pool round trip.
at::Tensor weight_taps(const at::Tensor& weight) { return weight.permute({2, 0, 1}).contiguous(); }

// Whether n values are all finite: 0 * inf and 0 * NaN are NaN, so the sum is NaN exactly then (one
// vectorised pass over rows that were just written, still in cache).
template <typename T>
inline bool row_finite(const T* p, int64_t n) {
  T acc = 0;
#pragma omp simd reduction(+ : acc)
  for (int64_t c = 0; c < n; ++c) acc += p[c] * T(0);
  return acc == acc;
}

// The largest |value| of n values (0 for an empty or all-zero row; NaN may be dropped: callers test
// finiteness apart).
template <typename T>
inline T row_max_abs(const T* p, int64_t n) {
  T m = 0;
#pragma omp simd reduction(max : m)
  for (int64_t c = 0; c < n; ++c) m = max_of(m, std::abs(p[c]));
  return m;
}

// Winograd's transforms add to every output of a tile rounding errors of the order of the tile's largest
// input -- a few ulps of it, times the transforms' coefficients -- where the direct taps' error is of the
// order of that output's own terms. On rows of about one magnitude the two agree to within a few ulps; one
// row far above the others (a position at 1e30 among O(1) values, or a gradient spike) swamps every other
// output of its tiles, which then lose every digit (the taps round each to its own terms). So an operand
// goes through the transforms only if its largest row (max |value| over the row's channels) is within
// kWinogradRange of its median row, all-zero rows (padding, masked positions) left out -- every output's
// extra error then stays within a few ulps of the operand's typical magnitude -- and far enough below the
// dtype's largest value that the transforms' sums cannot overflow. Both are read off row maxima taken
// while the rows are written (in cache), and a median of one value per row.
constexpr double kWinogradRange = 32.0;
constexpr double kWinogradHeadroom = 1 << 16;

template <typename T>
bool moderate_range(std::vector<T> row_max) {
  const auto end = std::remove(row_max.begin(), row_max.end(), T(0));
  const int64_t n = end - row_max.begin();
  if (n == 0) return true;  // all zero: exact either way
  const T largest = *std::max_element(row_max.begin(), end);
  const auto mid = row_max.begin() + n / 2;
  std::nth_element(row_max.begin(), mid, end);
  return double(largest) <= kWinogradRange * double(*mid) &&
         double(largest) <= double(std::numeric_limits<T>::max()) / kWinogradHeadroom;
}

// xp [B*Tp, H]: x with masked positions zeroed, pad_left zero rows before and K-1-pad_left after
// every sequence. Reads x through its strides (channels-first views included). With row_max (float32 and float64:
// the statistics Winograd needs; a bf16 call takes the taps and passes null), writes each row's largest |value| to
// row_max [B*Tp] (0 for the zero rows) and returns whether every value copied is finite (the Winograd path is
// only taken then, see winograd_requested, and on a moderate range, see moderate_range); without, returns true.
template <typename T>
bool fill_padded(const at::Tensor& x, const bool* mask, const Geometry& g, T* xp, T* row_max) {
  const T* xd = x.data_ptr<T>();
  const int64_t sb = x.stride(0), st = x.stride(1), sc = x.stride(2);
  const int64_t H = g.H;
  const auto fill_rows = [&](int64_t begin, int64_t end, int finite) {
    for (int64_t row = begin; row < end; ++row) {
      const int64_t b = row / g.Tp, t = row % g.Tp - g.pad_left;
      T* dst = xp + row * H;
      if (t < 0 || t >= g.T || (mask != nullptr && !mask[b * g.T + t])) {
        std::fill(dst, dst + H, T(0));
        if (row_max != nullptr) row_max[row] = T(0);
        continue;
      }
      const T* src = xd + b * sb + t * st;
      if (sc == 1) {
        std::memcpy(static_cast<void*>(dst), src, H * sizeof(T));
      } else {
        for (int64_t c = 0; c < H; ++c) dst[c] = src[c * sc];
      }
      if constexpr (!std::is_same_v<T, at::BFloat16>) {
        if (row_max != nullptr) {
          finite &= row_finite(dst, H);
          row_max[row] = row_max_abs(dst, H);
        }
      }
    }
    return finite;
  };
  return at::parallel_reduce(0, g.B * g.Tp, kRowBlock, 1, fill_rows, [](int a, int b) { return a & b; });
}

// Row (b, t) of x: its copy in xp where the mask kept it, else read through x's strides into tmp.
template <typename T>
const T* residual_row(const at::Tensor& x, const bool* mask, const Geometry& g, const T* xp,
                             int64_t b, int64_t t, T* tmp) {
  if (mask == nullptr || mask[b * g.T + t]) return xp + (b * g.Tp + g.pad_left + t) * g.H;
  const T* src = x.data_ptr<T>() + b * x.stride(0) + t * x.stride(1);
  for (int64_t c = 0; c < g.H; ++c) tmp[c] = src[c * x.stride(2)];
  return tmp;
}

const bool* mask_data(const std::optional<at::Tensor>& mask, at::Tensor& holder) {
  if (!mask.has_value()) return nullptr;
  holder = mask->contiguous();
  return holder.data_ptr<bool>();
}

// Bias + GLU + residual + scale over one row: pre += bias (kept: it is the backward's aux), then
// y = (a * sigmoid(b) + res) * scale. bias and res may be null.
template <typename T>
inline void glu_row(T* pre, const T* bias, const T* res, T scale, int64_t H,
                    T* y) {
  T* a = pre;
  T* bg = pre + H;
  if (bias != nullptr) {
#pragma omp simd
    for (int64_t c = 0; c < H; ++c) {
      a[c] += bias[c];
      bg[c] += bias[H + c];
    }
  }
  if (res != nullptr) {
#pragma omp simd
    for (int64_t c = 0; c < H; ++c) y[c] = (a[c] * sigmoid(bg[c]) + res[c]) * scale;
  } else {
#pragma omp simd
    for (int64_t c = 0; c < H; ++c) y[c] = a[c] * sigmoid(bg[c]) * scale;
  }
}

// d y / d pre for one row: ga = gy*scale*sigmoid(b), gb = gy*scale*a*sigmoid(b)*(1-sigmoid(b)).
template <typename T>
inline void glu_backward_row(const T* pre, const T* gy, T scale, int64_t H, T* grad_pre) {
  const T* a = pre;
  const T* bg = pre + H;
  T* ga = grad_pre;
  T* gb = grad_pre + H;
#pragma omp simd
  for (int64_t c = 0; c < H; ++c) {
    const T sg = sigmoid(bg[c]);
    const T gg = gy[c] * scale;
    ga[c] = gg * sg;
    gb[c] = gg * a[c] * sg * (T(1) - sg);
  }
}

template <typename T>
inline void add_row(const T* src, int64_t n, T* acc) {
#pragma omp simd
  for (int64_t c = 0; c < n; ++c) acc[c] += src[c];
}

// dst = conv + res_scale * gy, conv may be null (a masked position: the conv never saw it).
template <typename T>
inline void grad_x_row(const T* conv, T res_scale, const T* gy, int64_t n, T* dst) {
  if (conv != nullptr) {
#pragma omp simd
    for (int64_t c = 0; c < n; ++c) dst[c] = conv[c] + res_scale * gy[c];
  } else {
#pragma omp simd
    for (int64_t c = 0; c < n; ++c) dst[c] = res_scale * gy[c];
  }
}

// How the K-tap contractions run: "taps" (K GEMMs on row-shifted slices of the padded rows) or
// "winograd" (F(m, K), see winograd.h: about half the GEMM work for K 3-7). FASTQA_CPU_GLU_CONV=auto|
// winograd|taps, read at every call; auto (unset) takes Winograd wherever it applies (2 <= K <= 7) --
// the GEMMs are most of the op's time, and they shrink by m K / n for every shape. Operands holding a
// NaN or an inf always take the taps (callers check after this says yes): Winograd's transforms would
// spread one non-finite value over its whole tile, where torch's convolution keeps it to the outputs
// that read it. So do operands whose rows span too many orders of magnitude (moderate_range), for the
// same reason with rounding errors in place of NaN.
bool winograd_requested(int64_t K) {
  const char* env = std::getenv("FASTQA_CPU_GLU_CONV");
  const std::string v = env == nullptr ? "" : env;
  TORCH_CHECK(v.empty() || v == "auto" || v == "winograd" || v == "taps",
              "FASTQA_CPU_GLU_CONV must be auto, winograd or taps, got '", v, "'");
  return v != "taps" && winograd::applies(K);
}

bool all_finite(const at::Tensor& t) { return at::isfinite(t).all().item<bool>(); }

// U [n, O, I]: the Winograd weight transform sum_k coef[i, k] W_k of the taps W_k = weight[:, :, k]
// (coef = EK, or EK with its columns reversed for the transposed convolution of the backward).
at::Tensor transformed_weight(const at::Tensor& weight, const at::Tensor& coef) {
  const int64_t O = weight.size(0), I = weight.size(1), K = weight.size(2);
  return at::mm(coef, weight.reshape({O * I, K}).t()).view({coef.size(0), O, I});
}

// The n Winograd products M_i = V_i @ w_i^T ([tiles, O] each), V = the input transform of src [rows, I]
// shifted down by `offset` rows (rows outside src read as zero); w [n, O, I] (any strides gemm::linear
// takes: contiguous, or transposed views of contiguous matrices).
std::vector<at::Tensor> winograd_products(const at::Tensor& src, int64_t rows, const winograd::Plan& p,
                                          int64_t tiles, int64_t offset, const std::vector<at::Tensor>& w) {
  const int64_t I = src.size(1);
  at::Tensor v = at::empty({p.n, tiles, I}, src.options());
  AT_DISPATCH_FLOATING_TYPES(src.scalar_type(), "glu_conv1d_winograd_input", [&] {
    winograd::gather_tiles<scalar_t>(src.data_ptr<scalar_t>(), rows, I, tiles, p.m, offset, p.BT, p.n, p.n,
                                     v.data_ptr<scalar_t>());
  });
  std::vector<at::Tensor> mats;
  mats.reserve(p.n);
  for (int64_t i = 0; i < p.n; ++i) mats.push_back(gemm::linear(v[i], w[i], c10::nullopt));
  return mats;
}

template <typename T>
std::vector<const T*> data_pointers(const std::vector<at::Tensor>& mats) {
  std::vector<const T*> ptrs;
  for (const auto& t : mats) ptrs.push_back(t.data_ptr<T>());
  return ptrs;
}

// The forward's pre-activation through Winograd, fused with the epilogue: allocates and fills pre [N, 2H]
// (bias included) and y [B, T, H] (every real row).
template <typename T>
void winograd_forward(const at::Tensor& x, const bool* mask, const Geometry& g, const at::Tensor& xp,
                      const at::Tensor& weight, const T* bias, bool residual, T scale, at::Tensor& pre,
                      at::Tensor& y) {
  const winograd::Plan p = winograd::make_plan(g.K);
  const int64_t tiles = ceil_div(g.N, p.m);
  // The transformed weight (8/K times the weight) is released before the output transform allocates.
  const std::vector<at::Tensor> mats = [&] {
    const at::Tensor u = transformed_weight(weight, winograd::as_tensor(p.EK, p.n, g.K, x.scalar_type()));
    std::vector<at::Tensor> w;
    for (int64_t i = 0; i < p.n; ++i) w.push_back(u[i]);
    return winograd_products(xp, g.B * g.Tp, p, tiles, 0, w);
  }();
  const std::vector<const T*> mp = data_pointers<T>(mats);
  const std::vector<T> em(p.Em.begin(), p.Em.end());
  pre = at::empty({g.N, 2 * g.H}, x.options());
  y = at::empty({g.B, g.T, g.H}, x.options());
  const T* xpd = xp.data_ptr<T>();
  T* pd = pre.data_ptr<T>();
  T* yd = y.data_ptr<T>();
  at::parallel_for(0, tiles, 4, [&](int64_t t0, int64_t t1) {
    std::vector<T> tmp(mask != nullptr && residual ? g.H : 0);
    for (int64_t t = t0; t < t1; ++t) {
      for (int64_t o = 0; o < p.m && t * p.m + o < g.N; ++o) {
        const int64_t r = t * p.m + o, b = r / g.Tp, tt = r % g.Tp;
        T* row = pd + r * 2 * g.H;
        winograd::scatter_row<T>(mp, t, o, p.m, 2 * g.H, em, row);
        if (tt >= g.T) continue;  // a junk row between two sequences: never read
        const T* res = residual ? residual_row<T>(x, mask, g, xpd, b, tt, tmp.data()) : nullptr;
        glu_row<T>(row, bias, res, scale, g.H, yd + (b * g.T + tt) * g.H);
      }
    }
  });
}

// Winograd backward of the contractions: the weight gradient [2H, H, K] (returned) and grad_x (with its
// residual / mask epilogue) from grad_pre [N, 2H] (junk rows zero). The weight gradient comes first so that
// xp (taken over: the caller's handle is moved in) and its transforms are freed before grad_x's.
template <typename T>
at::Tensor winograd_backward(const at::Tensor& grad_pre, at::Tensor xp, const at::Tensor& weight,
                             const at::Tensor& grad_y, const bool* mask, const Geometry& g, bool residual, T scale,
                             at::Tensor& grad_x) {
  const winograd::Plan p = winograd::make_plan(g.K);
  const at::ScalarType dtype = grad_pre.scalar_type();
  const int64_t H = g.H, rows = g.B * g.Tp;
  // grad W_k = sum_r grad_pre[r]^T xp[r + k] through F(K, m): P_i = sum_o Em[i, o] grad_pre[t m + o],
  // V_i = the forward's input transform of xp, Q_i = P_i^T V_i, grad W_k = sum_i EK[i, k] Q_i (one Q_i
  // at a time, added into the taps in a fixed order).
  at::Tensor grad_taps = at::zeros({g.K, 2 * H, H}, grad_pre.options());
  {
    const int64_t tiles = ceil_div(g.N, p.m);
    at::Tensor pt = at::empty({p.n, tiles, 2 * H}, grad_pre.options());
    at::Tensor v = at::empty({p.n, tiles, H}, grad_pre.options());
    winograd::gather_tiles<T>(grad_pre.data_ptr<T>(), g.N, 2 * H, tiles, p.m, 0, p.Em, p.n, p.m, pt.data_ptr<T>());
    winograd::gather_tiles<T>(xp.data_ptr<T>(), rows, H, tiles, p.m, 0, p.BT, p.n, p.n, v.data_ptr<T>());
    xp.reset();
    // P_i^T as a view: BLAS reads it as it is, oneDNN copies it into its own layout (the same values and
    // time as a copy made here), and the GEMM entry point picks the engine for this shape and layout.
    at::Tensor q = at::empty({2 * H, H}, grad_pre.options());
    for (int64_t i = 0; i < p.n; ++i) {
      gemm::mm_out(q, pt[i].t(), v[i]);
      for (int64_t k = 0; k < g.K; ++k) {
        const double f = p.EK[i * g.K + k];
        if (f != 0.0) grad_taps[k].add_(q, f);
      }
    }
  }
  // grad xp[s] = sum_k grad_pre[s - k] @ W_k: a correlation of grad_pre (K-1 zero rows in front) with
  // the reversed taps W_{K-1-k}^T, i.e. the same F(m, K) with U'_i = (sum_k EK[i, K-1-k] W_k)^T.
  const int64_t tiles = ceil_div(rows, p.m);
  const std::vector<at::Tensor> mats = [&] {
    const at::Tensor ek = winograd::as_tensor(p.EK, p.n, g.K, dtype);
    const at::Tensor uf = transformed_weight(weight, ek.flip({1}));  // [n, 2H, H]
    std::vector<at::Tensor> w;
    for (int64_t i = 0; i < p.n; ++i) w.push_back(uf[i].t());
    return winograd_products(grad_pre, g.N, p, tiles, g.K - 1, w);
  }();
  const std::vector<const T*> mp = data_pointers<T>(mats);
  const std::vector<T> em(p.Em.begin(), p.Em.end());
  const T* gyd = grad_y.data_ptr<T>();
  T* gxd = grad_x.data_ptr<T>();
  at::parallel_for(0, tiles, 4, [&](int64_t t0, int64_t t1) {
    std::vector<T> conv(H);
    for (int64_t t = t0; t < t1; ++t) {
      for (int64_t o = 0; o < p.m && t * p.m + o < rows; ++o) {
        const int64_t s = t * p.m + o, b = s / g.Tp, tt = s % g.Tp - g.pad_left;
        if (tt < 0 || tt >= g.T) continue;  // padding rows
        const int64_t i = b * g.T + tt;
        const bool kept = mask == nullptr || mask[i];
        if (kept) winograd::scatter_row<T>(mp, t, o, p.m, H, em, conv.data());
        grad_x_row<T>(kept ? conv.data() : nullptr, residual ? scale : T(0), gyd + i * H, H, gxd + i * H);
      }
    }
  });
  return grad_taps.permute({1, 2, 0}).contiguous();
}

// The float32 / float64 forward (bf16: fwd_bf16); g and m (the mask's data or null) from the checked entry.
std::tuple<at::Tensor, at::Tensor> fwd_kernel(const at::Tensor& x, const at::Tensor& weight,
                                              const std::optional<at::Tensor>& bias, const Geometry& g,
                                              const bool* m, bool residual, double scale) {
  at::Tensor xp = at::empty({g.B * g.Tp, g.H}, x.options());
  bool transformable = false;  // finite, of a moderate range (moderate_range)
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "glu_conv1d_fwd", [&] {
    std::vector<scalar_t> row_max(g.B * g.Tp);
    transformable = fill_padded<scalar_t>(x, m, g, xp.data_ptr<scalar_t>(), row_max.data()) &&
                    moderate_range(std::move(row_max));
  });
  if (winograd_requested(g.K) && transformable && all_finite(weight)) {
    at::Tensor pre, y;  // allocated once the products are done (a lower peak)
    const at::Tensor bias_c = bias.has_value() ? bias->contiguous() : at::Tensor();
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "glu_conv1d_fwd_winograd", [&] {
      winograd_forward<scalar_t>(x, m, g, xp, weight, bias_c.defined() ? bias_c.data_ptr<scalar_t>() : nullptr,
                                 residual, static_cast<scalar_t>(scale), pre, y);
    });
    return {y, pre};
  }
  at::Tensor y = at::empty({g.B, g.T, g.H}, x.options());
  // pre = bias + sum_k xp[k : k+N] @ W_k^T through the GEMM entry point: the bias is fused into the
  // first tap's GEMM, each later tap accumulates (oneDNN: a fused binary add), and the result is
  // adopted as it comes (no copy into a preallocated buffer).
  at::Tensor pre;
  {
    const at::Tensor w = weight_taps(weight);
    const c10::optional<at::Tensor> bias_c = bias.has_value() ? c10::optional<at::Tensor>(bias->contiguous())
                                                              : c10::nullopt;
    pre = gemm::linear(xp.narrow(0, 0, g.N), w[0], bias_c);
    for (int64_t k = 1; k < g.K; ++k) pre = gemm::mm(xp.narrow(0, k, g.N), w[k].t(), pre);
  }
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "glu_conv1d_fwd_epilogue", [&] {
    const scalar_t* xpd = xp.data_ptr<scalar_t>();
    scalar_t* pd = pre.data_ptr<scalar_t>();
    const scalar_t* bd = nullptr;  // the bias is already in pre (fused into the GEMM)
    scalar_t* yd = y.data_ptr<scalar_t>();
    const scalar_t s = static_cast<scalar_t>(scale);
    at::parallel_for(0, g.B * g.T, kRowBlock, [&](int64_t begin, int64_t end) {
      std::vector<scalar_t> tmp(m != nullptr && residual ? g.H : 0);
      for (int64_t i = begin; i < end; ++i) {
        const int64_t b = i / g.T, t = i % g.T;
        const scalar_t* res = residual ? residual_row<scalar_t>(x, m, g, xpd, b, t, tmp.data()) : nullptr;
        glu_row<scalar_t>(pd + (b * g.Tp + t) * 2 * g.H, bd, res, s, g.H, yd + i * g.H);
      }
    });
  });
  return {y, pre};
}

Geometry check_bwd_args(const at::Tensor& grad_y, const at::Tensor& x, const at::Tensor& weight,
                        const std::optional<at::Tensor>& mask, const at::Tensor& aux, int64_t pad_left) {
  constexpr const char* op = "fastqa::glu_conv1d_bwd";
  const Geometry g = check_conv_args(op, x, weight, mask, pad_left);
  FASTQA_CHECK(grad_y.sizes() == x.sizes() && grad_y.scalar_type() == x.scalar_type(),
              op, "grad_y must match x (", x.sizes(), "), got ", grad_y.sizes());
  FASTQA_CHECK(aux.dim() == 2 && aux.size(0) == g.N && aux.size(1) == 2 * g.H && aux.scalar_type() == x.scalar_type(),
              op, "aux must be the forward's pre-activation [", g.N, ", ", 2 * g.H, "], got ",
              aux.sizes());
  return g;
}

// The float32 / float64 backward (bf16: bwd_bf16); g and m from the checked entry.
std::tuple<at::Tensor, at::Tensor, at::Tensor> bwd_kernel(const at::Tensor& grad_y_in, const at::Tensor& x,
                                                          const at::Tensor& weight, const Geometry& g,
                                                          const bool* m, const at::Tensor& aux, bool residual,
                                                          double scale, bool has_bias) {
  const at::Tensor grad_y = grad_y_in.contiguous();
  const at::Tensor pre = aux.contiguous();
  const int64_t n_blocks = (g.B * g.T + kRowBlock - 1) / kRowBlock;
  at::Tensor grad_pre = at::empty({g.N, 2 * g.H}, x.options());
  at::Tensor bias_partials = has_bias ? at::empty({n_blocks, 2 * g.H}, x.options()) : at::Tensor();

  // grad_pre = d y / d pre (junk rows zero), per-block bias-gradient partials, per-block "all finite"
  // flags and per-row maxima (for the Winograd choice), in one pass.
  std::vector<char> block_finite(n_blocks, 1);
  bool grad_pre_moderate = false;
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "glu_conv1d_bwd_glu", [&] {
    const scalar_t* pd = pre.data_ptr<scalar_t>();
    const scalar_t* gyd = grad_y.data_ptr<scalar_t>();
    scalar_t* gpd = grad_pre.data_ptr<scalar_t>();
    scalar_t* partials = has_bias ? bias_partials.data_ptr<scalar_t>() : nullptr;
    const scalar_t s = static_cast<scalar_t>(scale);
    const int64_t H = g.H;
    std::vector<scalar_t> row_max(g.B * g.T);
    at::parallel_for(0, n_blocks, 1, [&](int64_t block_begin, int64_t block_end) {
      for (int64_t blk = block_begin; blk < block_end; ++blk) {
        scalar_t* part = partials != nullptr ? partials + blk * 2 * H : nullptr;
        if (part != nullptr) std::fill(part, part + 2 * H, scalar_t(0));
        const int64_t row_end = std::min(g.B * g.T, (blk + 1) * kRowBlock);
        for (int64_t i = blk * kRowBlock; i < row_end; ++i) {
          const int64_t r = (i / g.T) * g.Tp + i % g.T;
          glu_backward_row<scalar_t>(pd + r * 2 * H, gyd + i * H, s, H, gpd + r * 2 * H);
          if (part != nullptr) add_row<scalar_t>(gpd + r * 2 * H, 2 * H, part);
          block_finite[blk] &= row_finite(gpd + r * 2 * H, 2 * H);
          row_max[i] = row_max_abs(gpd + r * 2 * H, 2 * H);
        }
      }
    });
    grad_pre_moderate = moderate_range(std::move(row_max));
    for (int64_t b = 0; b + 1 < g.B; ++b) {  // the K-1 junk rows after each sequence but the last
      std::fill(gpd + (b * g.Tp + g.T) * 2 * H, gpd + ((b + 1) * g.Tp) * 2 * H, scalar_t(0));
    }
  });

  at::Tensor xp = at::empty({g.B * g.Tp, g.H}, x.options());
  bool transformable = false;  // xp finite, of a moderate range
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "glu_conv1d_bwd_pad", [&] {
    std::vector<scalar_t> row_max(g.B * g.Tp);
    transformable = fill_padded<scalar_t>(x, m, g, xp.data_ptr<scalar_t>(), row_max.data()) &&
                    moderate_range(std::move(row_max));
  });
  at::Tensor grad_bias = has_bias ? at::empty({2 * g.H}, x.options()) : at::Tensor();  // undefined: None
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "glu_conv1d_bwd_bias", [&] {
    if (has_bias) {  // fixed-order sum of the per-block partials
      scalar_t* gbd = grad_bias.data_ptr<scalar_t>();
      const scalar_t* partials = bias_partials.data_ptr<scalar_t>();
      std::fill(gbd, gbd + 2 * g.H, scalar_t(0));
      for (int64_t blk = 0; blk < n_blocks; ++blk) add_row<scalar_t>(partials + blk * 2 * g.H, 2 * g.H, gbd);
    }
  });
  const bool grad_pre_finite = std::all_of(block_finite.begin(), block_finite.end(), [](char f) { return f != 0; });
  if (winograd_requested(g.K) && transformable && grad_pre_finite && grad_pre_moderate && all_finite(weight)) {
    at::Tensor grad_x = at::empty({g.B, g.T, g.H}, x.options());
    at::Tensor grad_weight;
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "glu_conv1d_bwd_winograd", [&] {
      grad_weight = winograd_backward<scalar_t>(grad_pre, std::move(xp), weight, grad_y, m, g, residual,
                                                static_cast<scalar_t>(scale), grad_x);
    });
    return {grad_x, grad_weight, grad_bias};
  }
  // grad W_k = grad_pre^T @ xp[k : k+N], as taps [K, 2H, H], then once into the Conv1d layout.
  // oneDNN multiplies a row-major left operand: grad_pre^T is made contiguous once, not per tap
  // (BLAS reads the transposed view as it is).
  const bool onednn = gemm::engine_for(x.scalar_type()) == gemm::Engine::kOneDnn;
  at::Tensor grad_weight;
  {
    const at::Tensor grad_pre_t = onednn ? grad_pre.t().contiguous() : grad_pre.t();
    at::Tensor grad_taps = at::empty({g.K, 2 * g.H, g.H}, x.options());
    for (int64_t k = 0; k < g.K; ++k) gemm::mm_out(grad_taps[k], grad_pre_t, xp.narrow(0, k, g.N));
    grad_weight = grad_taps.permute({1, 2, 0}).contiguous();
  }
  // grad xp[k : k+N] += grad_pre @ W_k, written over xp (no longer needed) to save a buffer. The
  // right factor is W_k as a transposed view of contiguous W_k^T taps: oneDNN's [N, K] weight layout,
  // and a transposed operand BLAS reads directly.
  at::Tensor grad_xp = xp;
  grad_xp.narrow(0, g.N, g.K - 1).zero_();
  {
    const at::Tensor w_t = weight.permute({2, 1, 0}).contiguous();  // [K, H, 2H]: W_k^T
    gemm::mm_out(grad_xp.narrow(0, 0, g.N), grad_pre, w_t[0].t());
    for (int64_t k = 1; k < g.K; ++k) gemm::mm_out(grad_xp.narrow(0, k, g.N), grad_pre, w_t[k].t(), true);
  }
  grad_pre.reset();  // done with it: free before grad_x is allocated

  at::Tensor grad_x = at::empty({g.B, g.T, g.H}, x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "glu_conv1d_bwd_x", [&] {
    const scalar_t* gxp = grad_xp.data_ptr<scalar_t>();
    const scalar_t* gyd = grad_y.data_ptr<scalar_t>();
    scalar_t* gxd = grad_x.data_ptr<scalar_t>();
    const scalar_t s = static_cast<scalar_t>(scale);
    const int64_t H = g.H;
    at::parallel_for(0, g.B * g.T, kRowBlock, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const int64_t b = i / g.T, t = i % g.T;
        const bool kept = m == nullptr || m[i];
        const scalar_t* conv = kept ? gxp + (b * g.Tp + g.pad_left + t) * H : nullptr;
        grad_x_row<scalar_t>(conv, residual ? s : scalar_t(0), gyd + i * H, H, gxd + i * H);
      }
    });
  });
  return {grad_x, grad_weight, grad_bias};
}

// ------------------------------------------------------------------------------------------ bfloat16
// A bf16 call (fwd_bf16, bwd_bf16) runs the float32 kernels' steps on bf16 storage: xp, the taps' products,
// aux and grad_pre are bf16 tensors -- the bf16 GEMM's operands and results as it takes and gives them -- and
// the epilogues widen each row into float32 scratch rows, sum the taps' products there, add the bias, run the
// float32 kernels' row functions and round each result as they store it. Widening the op's tensors and running
// the float32 kernel in a gemm::Bf16Products scope gives the same values, but its conversions and float32
// accumulations (passes over [N, 2H] tensors, several of them mixed-dtype copies) left the bf16 op hardly
// faster than the float32 one.

// One bf16 row of the forward's epilogue (pre: the float32 sums, with the bias; res: the widened residual row
// or null) and of the backward's GLU derivative, each a function of its own whose callees are all inlined: in
// the parallel regions' bodies GCC called vec_exp per element instead, and the GLU loops ran scalar.
[[gnu::flatten]] void glu_row_bf16(float* pre, const float* res, float scale, int64_t H, float* out,
                                   at::BFloat16* y) {
  glu_row<float>(pre, nullptr, res, scale, H, out);
  bf16::narrow_row(out, H, y);
}
[[gnu::flatten]] void glu_backward_row_bf16(const at::BFloat16* pre_b, const at::BFloat16* gy_b, float scale,
                                            int64_t H, float* pre, float* gy, float* grad_pre) {
  bf16::widen_row(pre_b, 2 * H, pre);
  bf16::widen_row(gy_b, H, gy);
  glu_backward_row<float>(pre, gy, scale, H, grad_pre);
}

std::vector<const at::BFloat16*> bf16_pointers(const std::vector<at::Tensor>& mats) {
  std::vector<const at::BFloat16*> ptrs;
  for (const auto& t : mats) ptrs.push_back(t.data_ptr<at::BFloat16>());
  return ptrs;
}

// pre = bias + sum_k xp[k : k+N] @ W_k^T: the K products in bf16, summed per row in float32 in the float32
// kernel's order (first tap, bias, later taps); aux is pre rounded, every row of it (the junk rows too: an
// output holds no uninitialised memory).
std::tuple<at::Tensor, at::Tensor> fwd_bf16(const at::Tensor& x, const at::Tensor& weight,
                                            const std::optional<at::Tensor>& bias, const Geometry& g, const bool* m,
                                            bool residual, double scale) {
  at::Tensor xp = at::empty({g.B * g.Tp, g.H}, x.options());
  fill_padded<at::BFloat16>(x, m, g, xp.data_ptr<at::BFloat16>(), nullptr);
  std::vector<at::Tensor> products;  // [N, 2H] bf16 each
  {
    const at::Tensor w = weight_taps(weight);
    for (int64_t k = 0; k < g.K; ++k) products.push_back(gemm::mm(xp.narrow(0, k, g.N), w[k].t()));
  }
  const std::vector<const at::BFloat16*> pp = bf16_pointers(products);
  const at::Tensor bias_f = bias.has_value() ? bias->to(at::kFloat).contiguous() : at::Tensor();
  const float* bd = bias_f.defined() ? bias_f.data_ptr<float>() : nullptr;
  at::Tensor aux = at::empty({g.N, 2 * g.H}, x.options());
  at::Tensor y = at::empty({g.B, g.T, g.H}, x.options());
  const at::BFloat16* xpd = xp.data_ptr<at::BFloat16>();
  at::BFloat16* ad = aux.data_ptr<at::BFloat16>();
  at::BFloat16* yd = y.data_ptr<at::BFloat16>();
  const int64_t H = g.H;
  const float s = static_cast<float>(scale);
  at::parallel_for(0, g.N, kRowBlock, [&](int64_t begin, int64_t end) {
    std::vector<float> pre(2 * H), res(residual ? H : 0), out(H);
    std::vector<at::BFloat16> tmp(m != nullptr && residual ? H : 0);
    for (int64_t r = begin; r < end; ++r) {
      bf16::widen_row(pp[0] + r * 2 * H, 2 * H, pre.data());
      if (bd != nullptr) add_row<float>(bd, 2 * H, pre.data());
      for (int64_t k = 1; k < g.K; ++k) bf16::add_row(pp[k] + r * 2 * H, 2 * H, pre.data());
      bf16::narrow_row(pre.data(), 2 * H, ad + r * 2 * H);
      const int64_t b = r / g.Tp, t = r % g.Tp;
      if (t >= g.T) continue;  // a junk row between two sequences: no output reads it
      if (residual) bf16::widen_row(residual_row<at::BFloat16>(x, m, g, xpd, b, t, tmp.data()), H, res.data());
      glu_row_bf16(pre.data(), residual ? res.data() : nullptr, s, H, out.data(), yd + (b * g.T + t) * H);
    }
  });
  return {y, aux};
}

// grad_pre (bf16 rows [N, 2H] at gpd, junk rows zero) from aux and grad_y (both contiguous bf16), in float32 per row;
// returns the bias gradient (bf16, summed in float32 over fixed blocks of rows), undefined without a bias.
at::Tensor bf16_grad_pre(const at::Tensor& grad_y, const at::Tensor& aux, const Geometry& g, float s, bool has_bias,
                         at::BFloat16* gpd) {
  const int64_t H = g.H;
  const int64_t n_blocks = (g.B * g.T + kRowBlock - 1) / kRowBlock;
  at::Tensor bias_partials = has_bias ? at::empty({n_blocks, 2 * H}, aux.options().dtype(at::kFloat)) : at::Tensor();
  {
    const at::BFloat16* ad = aux.data_ptr<at::BFloat16>();
    const at::BFloat16* gyd = grad_y.data_ptr<at::BFloat16>();
    float* partials = has_bias ? bias_partials.data_ptr<float>() : nullptr;
    at::parallel_for(0, n_blocks, 1, [&](int64_t block_begin, int64_t block_end) {
      std::vector<float> pre(2 * H), gy(H), gp(2 * H);
      for (int64_t blk = block_begin; blk < block_end; ++blk) {
        float* part = partials != nullptr ? partials + blk * 2 * H : nullptr;
        if (part != nullptr) std::fill(part, part + 2 * H, 0.0f);
        const int64_t row_end = std::min(g.B * g.T, (blk + 1) * kRowBlock);
        for (int64_t i = blk * kRowBlock; i < row_end; ++i) {
          const int64_t r = (i / g.T) * g.Tp + i % g.T;
          glu_backward_row_bf16(ad + r * 2 * H, gyd + i * H, s, H, pre.data(), gy.data(), gp.data());
          if (part != nullptr) add_row<float>(gp.data(), 2 * H, part);
          bf16::narrow_row(gp.data(), 2 * H, gpd + r * 2 * H);
        }
      }
    });
    for (int64_t b = 0; b + 1 < g.B; ++b) {  // the K-1 junk rows after each sequence but the last
      std::memset(static_cast<void*>(gpd + (b * g.Tp + g.T) * 2 * H), 0, (g.K - 1) * 2 * H * sizeof(at::BFloat16));
    }
  }
  at::Tensor grad_bias;  // undefined without a bias: the op returns None
  if (has_bias) {  // fixed-order sum of the per-block partials, in float32
    at::Tensor sum = at::zeros({2 * H}, bias_partials.options());
    float* gbd = sum.data_ptr<float>();
    const float* partials = bias_partials.data_ptr<float>();
    for (int64_t blk = 0; blk < n_blocks; ++blk) add_row<float>(partials + blk * 2 * H, 2 * H, gbd);
    grad_bias = sum.to(at::kBFloat16);
  }
  return grad_bias;
}

// bwd_kernel's steps on bf16 storage: grad_pre computed per row in float32 from the widened aux and grad_y
// (the bias gradient summed there, in float32), stored in bf16 as the GEMMs' operand; the K products
// grad_pre @ W_k in bf16, summed per row of grad_x in float32 in bwd_kernel's order (tap 0, then taps 1..K-1).
std::tuple<at::Tensor, at::Tensor, at::Tensor> bwd_bf16(const at::Tensor& grad_y_in, const at::Tensor& x,
                                                        const at::Tensor& weight, const Geometry& g, const bool* m,
                                                        const at::Tensor& aux_in, bool residual, double scale,
                                                        bool has_bias) {
  const at::Tensor grad_y = grad_y_in.contiguous();
  const int64_t H = g.H;
  const float s = static_cast<float>(scale);
  at::Tensor grad_pre = at::empty({g.N, 2 * H}, x.options());
  const at::Tensor grad_bias =
      bf16_grad_pre(grad_y, aux_in.contiguous(), g, s, has_bias, grad_pre.data_ptr<at::BFloat16>());
  at::Tensor xp = at::empty({g.B * g.Tp, H}, x.options());
  fill_padded<at::BFloat16>(x, m, g, xp.data_ptr<at::BFloat16>(), nullptr);
  // grad W_k = grad_pre^T @ xp[k : k+N] ([2H, H] each, bf16), stacked into the Conv1d layout [2H, H, K].
  at::Tensor grad_weight;
  {
    const at::Tensor grad_pre_t = grad_pre.t().contiguous();
    std::vector<at::Tensor> taps;
    for (int64_t k = 0; k < g.K; ++k) taps.push_back(gemm::mm(grad_pre_t, xp.narrow(0, k, g.N)));
    grad_weight = at::stack(taps, 2);
  }
  xp.reset();
  // grad xp[s] = sum_k grad_pre[s - k] @ W_k: the K products [N, H], tap k's row s - k read for row s.
  std::vector<at::Tensor> products;
  {
    const at::Tensor w_t = weight.permute({2, 1, 0}).contiguous();  // [K, H, 2H]: W_k^T
    for (int64_t k = 0; k < g.K; ++k) products.push_back(gemm::mm(grad_pre, w_t[k].t()));
  }
  grad_pre.reset();
  const std::vector<const at::BFloat16*> pp = bf16_pointers(products);
  at::Tensor grad_x = at::empty({g.B, g.T, H}, x.options());
  const at::BFloat16* gyd = grad_y.data_ptr<at::BFloat16>();
  at::BFloat16* gxd = grad_x.data_ptr<at::BFloat16>();
  at::parallel_for(0, g.B * g.T, kRowBlock, [&](int64_t begin, int64_t end) {
    std::vector<float> conv(H), gy(H), out(H);
    for (int64_t i = begin; i < end; ++i) {
      const int64_t b = i / g.T, t = i % g.T;
      const bool kept = m == nullptr || m[i];
      if (kept) {
        const int64_t row = b * g.Tp + g.pad_left + t;  // in xp's row space
        if (row < g.N) {
          bf16::widen_row(pp[0] + row * H, H, conv.data());
        } else {
          std::fill(conv.begin(), conv.end(), 0.0f);
        }
        for (int64_t k = 1; k < g.K; ++k) {
          if (row - k >= 0 && row - k < g.N) bf16::add_row(pp[k] + (row - k) * H, H, conv.data());
        }
      }
      bf16::widen_row(gyd + i * H, H, gy.data());
      grad_x_row<float>(kept ? conv.data() : nullptr, residual ? s : 0.0f, gy.data(), H, out.data());
      bf16::narrow_row(out.data(), H, gxd + i * H);
    }
  });
  return {grad_x, grad_weight, grad_bias};
}

// ---- bfloat16 on the batch-reduce GEMM micro-kernel (gemm::bf16_brgemm)
// Where the micro-kernel takes packed bf16 (gemm::bf16_brgemm_usable) and H is even (the packed layout pairs the
// rows of the reduction), the bf16 forward and grad_x run fused per block of kBrRows rows and kBrChannels
// channels: the K taps' products summed in float32 straight into one small buffer (the K bf16 product tensors
// of fwd_bf16 / bwd_bf16, their rounding and their passes over memory are gone), then the epilogue on that
// buffer while it is in cache. The taps are packed once per weight value (gemm::packed_weight). The weight
// gradient sums every tap's product in float32 over blocks of rows (weight_grad_bf16_brgemm).
constexpr int64_t kBrRows = 64;
constexpr int64_t kBrChannels = 256;

bool brgemm_applies(int64_t H) { return gemm::bf16_brgemm_usable() && H % 2 == 0; }

// The forward's taps: for each tap k and chunk of GLU channels [h0, h0 + w), the chunk's a rows then its b rows of
// W_k = weight[:, :, k] ([2w, H]) in gemm::pack_vnni's layout; block (k, h0) starts at (k * 2H + 2 * h0) * H. Packed
// straight from the weight through its strides (gemm::pack_vnni), no copy of the taps first: with weight
// normalisation the weight is a new tensor at every call, so this runs at every call.
at::Tensor pack_forward_taps(const at::Tensor& weight) {
  const int64_t H = weight.size(1), K = weight.size(2);
  at::Tensor out = at::empty({K * 2 * H * H}, weight.options());
  const c10::BFloat16* w = weight.data_ptr<c10::BFloat16>();
  std::vector<int64_t> rows;
  for (int64_t k = 0; k < K; ++k) {
    for (int64_t h0 = 0; h0 < H; h0 += kBrChannels) {
      const int64_t width = std::min(kBrChannels, H - h0);
      rows.clear();
      for (int64_t half = 0; half < 2; ++half) {
        for (int64_t n = 0; n < width; ++n) rows.push_back(half * H + h0 + n);
      }
      gemm::pack_vnni(w + k * weight.stride(2), rows.data(), 2 * width, H, weight.stride(0), weight.stride(1),
                      out.data_ptr<c10::BFloat16>() + (k * 2 * H + 2 * h0) * H);
    }
  }
  return out;
}

// grad_x's taps: for each tap k and chunk of input channels [c0, c0 + w), rows c0.. of W_k^T ([w, 2H]) in
// gemm::pack_vnni's layout; block (k, c0) starts at (k * H + c0) * 2H. Packed straight from the weight, as the
// forward's.
at::Tensor pack_backward_taps(const at::Tensor& weight) {
  const int64_t H = weight.size(1), K = weight.size(2);
  at::Tensor out = at::empty({K * H * 2 * H}, weight.options());
  const c10::BFloat16* w = weight.data_ptr<c10::BFloat16>();
  for (int64_t k = 0; k < K; ++k) {
    for (int64_t c0 = 0; c0 < H; c0 += kBrChannels) {
      // W_k^T's row c is weight[:, c, k]: rows stride(1) apart, their values stride(0) apart.
      gemm::pack_vnni(w + k * weight.stride(2) + c0 * weight.stride(1), nullptr, std::min(kBrChannels, H - c0), 2 * H,
                      weight.stride(1), weight.stride(0), out.data_ptr<c10::BFloat16>() + (k * H + c0) * 2 * H);
    }
  }
  return out;
}

// fwd_bf16 with the taps' products summed in float32 by the micro-kernel (the bias as their starting value).
std::tuple<at::Tensor, at::Tensor> fwd_bf16_brgemm(const at::Tensor& x, const at::Tensor& weight,
                                                   const std::optional<at::Tensor>& bias, const Geometry& g,
                                                   const bool* m, bool residual, double scale) {
  const int64_t H = g.H;
  at::Tensor xp = at::empty({g.B * g.Tp, H}, x.options());
  fill_padded<at::BFloat16>(x, m, g, xp.data_ptr<at::BFloat16>(), nullptr);
  const at::Tensor packed =
      gemm::packed_weight(weight, "glu_conv1d forward vnni", [&] { return pack_forward_taps(weight); });
  const at::Tensor bias_f = bias.has_value() ? bias->to(at::kFloat).contiguous() : at::Tensor();
  const float* bd = bias_f.defined() ? bias_f.data_ptr<float>() : nullptr;
  at::Tensor aux = at::empty({g.N, 2 * H}, x.options());
  at::Tensor y = at::empty({g.B, g.T, H}, x.options());
  const at::BFloat16* xpd = xp.data_ptr<at::BFloat16>();
  const at::BFloat16* pw = packed.data_ptr<at::BFloat16>();
  at::BFloat16* ad = aux.data_ptr<at::BFloat16>();
  at::BFloat16* yd = y.data_ptr<at::BFloat16>();
  const float s = static_cast<float>(scale);
  // Work items channel chunk by channel chunk, row blocks within: a thread's consecutive items share their packed
  // taps, which then stay in cache while the rows stream by.
  const int64_t blocks = ceil_div(g.N, kBrRows);
  at::parallel_for(0, blocks * ceil_div(H, kBrChannels), 1, [&](int64_t item0, int64_t item1) {
    std::vector<float> sums(kBrRows * 2 * kBrChannels), res(residual ? kBrChannels : 0), out(kBrChannels);
    std::vector<at::BFloat16> tmp(m != nullptr && residual ? H : 0);
    for (int64_t item = item0; item < item1; ++item) {
      const int64_t r0 = (item % blocks) * kBrRows, rows = std::min(kBrRows, g.N - r0);
      const int64_t h0 = (item / blocks) * kBrChannels, w = std::min(kBrChannels, H - h0);
      float* c = sums.data();  // [rows, 2w]: the chunk's a columns, then its b columns
      if (bd != nullptr) {
        fill_rows(c, 2 * w, bd + h0, w, rows);
        fill_rows(c + w, 2 * w, bd + H + h0, w, rows);
      }
      for (int64_t k = 0; k < g.K; ++k) {
        gemm::bf16_brgemm(rows, 2 * w, H, xpd + (r0 + k) * H, H, pw + (k * 2 * H + 2 * h0) * H, c, 2 * w,
                          /*accumulate=*/bd != nullptr || k > 0);
      }
      for (int64_t i = 0; i < rows; ++i) {
        const int64_t r = r0 + i, b = r / g.Tp, t = r % g.Tp;
        float* pre = c + i * 2 * w;
        bf16::narrow_row(pre, w, ad + r * 2 * H + h0);
        bf16::narrow_row(pre + w, w, ad + r * 2 * H + H + h0);
        if (t >= g.T) continue;  // a junk row between two sequences: no output reads it
        if (residual) {
          bf16::widen_row(residual_row<at::BFloat16>(x, m, g, xpd, b, t, tmp.data()) + h0, w, res.data());
        }
        glu_row_bf16(pre, residual ? res.data() : nullptr, s, w, out.data(), yd + (b * g.T + t) * H + h0);
      }
    }
    gemm::bf16_brgemm_release();
  });
  return {y, aux};
}

// The weight gradient of bwd_bf16_brgemm: grad W_k[o, i] = sum_r grad_pre[r, o] xp[r + k, i], every tap at once.
// The micro-kernel's left factor is xpᵀ (one row per input channel, the rows of the padded space along it), so tap k
// is the same factor shifted by k columns; its right factor is grad_pre packed once in pairs of rows, per chunk of
// kBrChannels output channels. Each work item (a block of kWgtIn input channels, a chunk of output channels) keeps
// the K taps' float32 sums and runs the reduction over the rows in blocks of kWgtRows (in order: the same sums on
// any thread count), each packed block of grad_pre used by all K taps while it is in cache.
constexpr int64_t kWgtIn = 64;
constexpr int64_t kWgtRows = 256;  // even: the packed pairs

at::Tensor weight_grad_bf16_brgemm(const at::Tensor& x, const bool* m, const Geometry& g, const at::Tensor& grad_pre) {
  const int64_t H = g.H, K = g.K, N = g.N, O = 2 * H;
  const int64_t Np = N + N % 2;       // the reduction in pairs: an odd N gets a zero row of grad_pre
  const int64_t ldx = Np + K - 1;     // columns of xpᵀ: every tap's shifted read stays inside
  const at::BFloat16 zero(0.0f);
  // xpᵀ [H, ldx]: column s is row s of the padded space (x with masked positions and padding zero).
  at::Tensor xpt = at::empty({H, ldx}, x.options());
  {
    const at::BFloat16* xd = x.data_ptr<at::BFloat16>();
    at::BFloat16* dst = xpt.data_ptr<at::BFloat16>();
    const int64_t sb = x.stride(0), st = x.stride(1), sc = x.stride(2);
    constexpr int64_t kCols = 16;  // input channels per pass: their rows of xpᵀ are written along together
    at::parallel_for(0, ceil_div(H, kCols), 1, [&](int64_t c0, int64_t c1) {
      for (int64_t cb = c0; cb < c1; ++cb) {
        const int64_t i0 = cb * kCols, ni = std::min(kCols, H - i0);
        for (int64_t srow = 0; srow < ldx; ++srow) {
          const int64_t b = srow / g.Tp, t = srow % g.Tp - g.pad_left;
          const bool real = srow < g.B * g.Tp && t >= 0 && t < g.T && (m == nullptr || m[b * g.T + t]);
          const at::BFloat16* src = real ? xd + b * sb + t * st + i0 * sc : nullptr;
          for (int64_t ii = 0; ii < ni; ++ii) dst[(i0 + ii) * ldx + srow] = real ? src[ii * sc] : zero;
        }
      }
    });
  }
  // grad_pre packed per chunk of output channels [o0, o0 + w): block at o0 * Np, [Np / 2, w, 2].
  at::Tensor gpv = at::empty({Np * O}, x.options());
  {
    const at::BFloat16* gp = grad_pre.data_ptr<at::BFloat16>();
    at::BFloat16* dst = gpv.data_ptr<at::BFloat16>();
    at::parallel_for(0, Np / 2, 64, [&](int64_t p0, int64_t p1) {
      for (int64_t p = p0; p < p1; ++p) {
        const at::BFloat16* r0 = gp + 2 * p * O;
        const at::BFloat16* r1 = 2 * p + 1 < N ? r0 + O : nullptr;
        for (int64_t o0 = 0; o0 < O; o0 += kBrChannels) {
          const int64_t w = std::min(kBrChannels, O - o0);
          at::BFloat16* d = dst + o0 * Np + p * 2 * w;
          for (int64_t c = 0; c < w; ++c) {
            d[2 * c] = r0[o0 + c];
            d[2 * c + 1] = r1 != nullptr ? r1[o0 + c] : zero;
          }
        }
      }
    });
  }
  at::Tensor grad_weight = at::empty({O, H, K}, x.options());
  const at::BFloat16* a = xpt.data_ptr<at::BFloat16>();
  const at::BFloat16* bv = gpv.data_ptr<at::BFloat16>();
  at::BFloat16* gw = grad_weight.data_ptr<at::BFloat16>();
  const int64_t iblocks = ceil_div(H, kWgtIn);
  at::parallel_for(0, iblocks * ceil_div(O, kBrChannels), 1, [&](int64_t item0, int64_t item1) {
    std::vector<float> acc(K * kWgtIn * kBrChannels);
    for (int64_t item = item0; item < item1; ++item) {
      const int64_t i0 = (item % iblocks) * kWgtIn, mi = std::min(kWgtIn, H - i0);
      const int64_t o0 = (item / iblocks) * kBrChannels, w = std::min(kBrChannels, O - o0);
      for (int64_t r0 = 0; r0 < Np; r0 += kWgtRows) {
        const int64_t kr = std::min(kWgtRows, Np - r0);
        for (int64_t k = 0; k < K; ++k) {
          gemm::bf16_brgemm(mi, w, kr, a + i0 * ldx + r0 + k, ldx, bv + o0 * Np + r0 * w,
                            acc.data() + k * kWgtIn * kBrChannels, w, /*accumulate=*/r0 > 0);
        }
      }
      for (int64_t k = 0; k < K; ++k) {  // tap k's [mi, w] sums into grad_weight[o0 + c, i0 + i, k]
        const float* tile = acc.data() + k * kWgtIn * kBrChannels;
        for (int64_t c = 0; c < w; ++c) {
          for (int64_t i = 0; i < mi; ++i) gw[((o0 + c) * H + i0 + i) * K + k] = at::BFloat16(tile[i * w + c]);
        }
      }
    }
    gemm::bf16_brgemm_release();
  });
  return grad_weight;
}

// bwd_bf16 with grad_x's taps and the weight gradient summed in float32 by the micro-kernel.
std::tuple<at::Tensor, at::Tensor, at::Tensor> bwd_bf16_brgemm(const at::Tensor& grad_y_in, const at::Tensor& x,
                                                               const at::Tensor& weight, const Geometry& g,
                                                               const bool* m, const at::Tensor& aux, bool residual,
                                                               double scale, bool has_bias) {
  const at::Tensor grad_y = grad_y_in.contiguous();
  const int64_t H = g.H, K = g.K, rows_all = g.B * g.Tp;
  const float s = static_cast<float>(scale);
  // grad_pre with K-1 zero rows before and after: every tap of every row of the padded space reads a real row.
  at::Tensor grad_pre_padded = at::empty({rows_all + K - 1, 2 * H}, x.options());
  grad_pre_padded.narrow(0, 0, K - 1).zero_();
  grad_pre_padded.narrow(0, K - 1 + g.N, K - 1).zero_();
  const at::Tensor grad_pre = grad_pre_padded.narrow(0, K - 1, g.N);
  const at::Tensor grad_bias = bf16_grad_pre(grad_y, aux.contiguous(), g, s, has_bias,
                                             grad_pre.data_ptr<at::BFloat16>());
  const at::Tensor grad_weight = weight_grad_bf16_brgemm(x, m, g, grad_pre);
  const at::Tensor packed =
      gemm::packed_weight(weight, "glu_conv1d backward vnni", [&] { return pack_backward_taps(weight); });
  at::Tensor grad_x = at::empty({g.B, g.T, H}, x.options());
  const at::BFloat16* gpd = grad_pre_padded.data_ptr<at::BFloat16>();
  const at::BFloat16* pw = packed.data_ptr<at::BFloat16>();
  const at::BFloat16* gyd = grad_y.data_ptr<at::BFloat16>();
  at::BFloat16* gxd = grad_x.data_ptr<at::BFloat16>();
  // grad xp[s] = sum_k grad_pre[s - k] @ W_k over the rows s of the padded space (rows of padding are skipped in
  // the epilogue); work items chunk by chunk as in the forward.
  const int64_t blocks = ceil_div(rows_all, kBrRows);
  at::parallel_for(0, blocks * ceil_div(H, kBrChannels), 1, [&](int64_t item0, int64_t item1) {
    std::vector<float> sums(kBrRows * kBrChannels), gy(kBrChannels), out(kBrChannels);
    for (int64_t item = item0; item < item1; ++item) {
      const int64_t s0 = (item % blocks) * kBrRows, rows = std::min(kBrRows, rows_all - s0);
      const int64_t c0 = (item / blocks) * kBrChannels, w = std::min(kBrChannels, H - c0);
      float* c = sums.data();  // [rows, w]
      for (int64_t k = 0; k < K; ++k) {  // grad_pre[s - k] is row s - k + K - 1 of the padded buffer
        gemm::bf16_brgemm(rows, w, 2 * H, gpd + (s0 - k + K - 1) * 2 * H, 2 * H, pw + (k * H + c0) * 2 * H, c, w,
                          /*accumulate=*/k > 0);
      }
      for (int64_t i = 0; i < rows; ++i) {
        const int64_t srow = s0 + i, b = srow / g.Tp, t = srow % g.Tp - g.pad_left;
        if (t < 0 || t >= g.T) continue;  // padding rows
        const int64_t row = b * g.T + t;
        const bool kept = m == nullptr || m[row];
        bf16::widen_row(gyd + row * H + c0, w, gy.data());
        grad_x_row<float>(kept ? c + i * w : nullptr, residual ? s : 0.0f, gy.data(), w, out.data());
        bf16::narrow_row(out.data(), w, gxd + row * H + c0);
      }
    }
    gemm::bf16_brgemm_release();
  });
  return {grad_x, grad_weight, grad_bias};
}

// A bf16 call of the forward or the backward takes one of two routes (gemm::route_for, per direction and shape
// class): native (bf16 storage and products, fwd_bf16_brgemm / bwd_bf16_brgemm, or fwd_bf16 / bwd_bf16 where the
// micro-kernel does not apply) or widen (the float32 kernel, Winograd included, on widened inputs and the
// weight widened once per weight value, the results rounded back): on a processor whose bf16 products are not
// faster than its float32 ones, a bf16 call costs no more than a float32 one. aux is the bf16 pre-activation
// either way, so the backward's route does not depend on the forward's.
std::string route_shape(const Geometry& g) {
  return gemm::shape_class({{"B", g.B}, {"T", g.T}, {"H", g.H}, {"K", g.K}});
}

at::Tensor widened_weight(const at::Tensor& weight) {
  return gemm::packed_weight(weight, "float32", [&] { return bf16::widen(weight); });
}

// The op entries: the argument checks once, then float32 / float64 run the kernels above, bf16 the bf16 ones
// (mixed dtypes are refused by the checks, as float32 with float64 is).
std::tuple<at::Tensor, at::Tensor> glu_conv1d_fwd(const at::Tensor& x, const at::Tensor& weight,
                                                  const std::optional<at::Tensor>& bias,
                                                  const std::optional<at::Tensor>& mask, int64_t pad_left,
                                                  bool residual, double scale) {
  constexpr const char* op = "fastqa::glu_conv1d_fwd";
  gemm::prepare();
  const Geometry g = check_conv_args(op, x, weight, mask, pad_left);
  check_bias(op, bias, x, g.H);
  at::Tensor mask_holder;
  const bool* m = mask_data(mask, mask_holder);
  if (!bf16::is_bf16(x)) return fwd_kernel(x, weight, bias, g, m, residual, scale);
  const auto run = [&](gemm::Route route) -> std::tuple<at::Tensor, at::Tensor> {
    if (route == gemm::Route::kNative) {
      return brgemm_applies(g.H) ? fwd_bf16_brgemm(x, weight, bias, g, m, residual, scale)
                                 : fwd_bf16(x, weight, bias, g, m, residual, scale);
    }
    auto [y, pre] = fwd_kernel(bf16::widen(x), widened_weight(weight), bf16::widen(bias), g, m, residual, scale);
    return {bf16::narrow(y), bf16::narrow(pre)};
  };
  return run(gemm::route_for(op, route_shape(g), [&](gemm::Route r) { (void)run(r); }));
}

std::tuple<at::Tensor, at::Tensor, c10::optional<at::Tensor>> glu_conv1d_bwd(
    const at::Tensor& grad_y, const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& mask,
    const at::Tensor& aux, int64_t pad_left, bool residual, double scale, bool has_bias) {
  gemm::prepare();
  const Geometry g = check_bwd_args(grad_y, x, weight, mask, aux, pad_left);
  at::Tensor mask_holder;
  const bool* m = mask_data(mask, mask_holder);
  if (!bf16::is_bf16(x)) {
    auto [grad_x, grad_weight, grad_bias] = bwd_kernel(grad_y, x, weight, g, m, aux, residual, scale, has_bias);
    return {grad_x, grad_weight, if_defined(grad_bias)};
  }
  using Grads = std::tuple<at::Tensor, at::Tensor, at::Tensor>;
  const auto run = [&](gemm::Route route) -> Grads {
    if (route == gemm::Route::kNative) {
      return brgemm_applies(g.H) ? bwd_bf16_brgemm(grad_y, x, weight, g, m, aux, residual, scale, has_bias)
                                 : bwd_bf16(grad_y, x, weight, g, m, aux, residual, scale, has_bias);
    }
    auto [gx, gw, gb] = bwd_kernel(bf16::widen(grad_y), bf16::widen(x), widened_weight(weight), g, m,
                                   bf16::widen(aux), residual, scale, has_bias);
    return {bf16::narrow(gx), bf16::narrow(gw), bf16::narrow(gb)};
  };
  auto [grad_x, grad_weight, grad_bias] =
      run(gemm::route_for("fastqa::glu_conv1d_bwd", route_shape(g), [&](gemm::Route r) { (void)run(r); }));
  return {grad_x, grad_weight, if_defined(grad_bias)};
}

// GLU channels per work item of the decode step's product (see glu_conv1d_step).
constexpr int64_t kStepChannels = 128;

void check_step_args(const char* op, const at::Tensor& x_t, const at::Tensor& state, const at::Tensor& weight,
                     const std::optional<at::Tensor>& bias) {
  FASTQA_CHECK(x_t.dim() == 2, op, "x_t must be [B, H], got ", x_t.sizes());
  FASTQA_CHECK(weight.dim() == 3, op, "weight must be [2H, H, K], got ", weight.sizes());
  const int64_t B = x_t.size(0), H = x_t.size(1), K = weight.size(2);
  FASTQA_CHECK(B > 0 && H > 0, op, "x_t must be non-empty, got ", x_t.sizes());
  FASTQA_CHECK(weight.size(0) == 2 * H && weight.size(1) == H && K > 0, op, "weight must be [2H, H, K] = [",
              2 * H, ", ", H, ", K], got ", weight.sizes());
  FASTQA_CHECK(state.dim() == 3 && state.size(0) == B && state.size(1) == K - 1 && state.size(2) == H,
              op, "state must be [B, K-1, H] = [", B, ", ", K - 1, ", ", H, "], got ", state.sizes());
  FASTQA_CHECK(x_t.device().is_cpu() && state.device().is_cpu() && weight.device().is_cpu(),
              op, "the cpu kernels take CPU tensors");
  FASTQA_CHECK(state.scalar_type() == x_t.scalar_type() && weight.scalar_type() == x_t.scalar_type(),
              op, "x_t, state and weight must share a dtype");
  check_bias(op, bias, x_t, H);
}

// The weight of the native bf16 step, packed once per weight value (gemm::packed_weight) for gemm::bf16_brgemm:
// for each half (a, then b) and each chunk of kStepChannels GLU channels, that chunk's rows of weight.view(2H, H*K)
// in gemm::pack_vnni's layout (packed straight from the weight), one block after the other (block (half, chunk)
// starts at half*H*H*K + h0*H*K).
at::Tensor pack_step_weight(const at::Tensor& weight) {
  const int64_t H = weight.size(1), HK = weight.size(1) * weight.size(2);
  const at::Tensor w2 = weight.contiguous();  // [2H, H * K] rows (packed once per weight value)
  at::Tensor out = at::empty({2 * H * HK}, weight.options());
  for (int64_t row0 = 0, width = 0; row0 < 2 * H; row0 += width) {   // each half's chunks, a then b
    width = std::min(kStepChannels, (row0 < H ? H : 2 * H) - row0);
    gemm::pack_vnni(w2.data_ptr<c10::BFloat16>() + row0 * HK, nullptr, width, HK, HK, 1,
                    out.data_ptr<c10::BFloat16>() + row0 * HK);
  }
  return out;
}

// The step on checked inputs. bf16 here is the native route: the gather (copies) runs on the bf16 values as they
// are, so the window is the product's bf16 operand and the new state bf16 without a conversion; with `packed`
// (pack_step_weight) the products go straight from bf16 storage into float32 sums (gemm::bf16_brgemm), else
// through the bf16 GEMM; the bias and the GLU are float32 (the epilogue's dtype); y is narrowed at the end.
std::tuple<at::Tensor, at::Tensor> step_kernel(const at::Tensor& x_t, const at::Tensor& state,
                                               const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                                               bool residual, double scale, const at::Tensor& packed = {}) {
  const int64_t B = x_t.size(0), H = x_t.size(1), K = weight.size(2);
  // bf16: the gather (copies) runs on the bf16 values as they are, so the window is the product's bf16 operand
  // and the new state bf16 without a conversion; the bias, the products' sums and the GLU are float32 (the
  // epilogue's dtype), and y is narrowed at the end.
  const bool b16 = bf16::is_bf16(x_t);
  const at::TensorOptions epilogue = x_t.options().dtype(b16 ? at::kFloat : x_t.scalar_type());
  at::Tensor new_state = at::empty({B, K - 1, H}, x_t.options());
  at::Tensor window_t = at::empty({B, H, K}, x_t.options());  // [b, h, k]: matches weight.view(2H, H*K)
  at::Tensor y = at::empty({B, H}, epilogue);
  const at::Tensor x_c = x_t.contiguous();
  const at::Tensor x_res = bf16::widen(x_c);  // the residual rows
  const at::Tensor state_c = state.contiguous();
  const at::Tensor w2 = weight.contiguous().view({2 * H, H * K});
  const at::Tensor bias_c = bias.has_value() ? bf16::widen(*bias).contiguous() : at::Tensor();
  // Rows per work item of the gather: small batches stay on one thread (the fork/join would cost more
  // than the copy), large ones split so the gather does not serialise the step.
  const int64_t grain = std::max<int64_t>(1, 16384 / (H * K));
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, x_t.scalar_type(), "glu_conv1d_step", [&] {
    const scalar_t* xd = x_c.data_ptr<scalar_t>();
    const scalar_t* sd = state_c.data_ptr<scalar_t>();
    scalar_t* ns = new_state.data_ptr<scalar_t>();
    scalar_t* wt = window_t.data_ptr<scalar_t>();
    at::parallel_for(0, B, grain, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        // window[b] = (state[b], x_t[b]) interleaved per channel; writes run contiguously.
        const scalar_t* srow = sd + b * (K - 1) * H;
        const scalar_t* xrow = xd + b * H;
        scalar_t* wrow = wt + b * H * K;
        for (int64_t c = 0; c < H; ++c) {
          for (int64_t k = 0; k + 1 < K; ++k) wrow[c * K + k] = srow[k * H + c];
          wrow[c * K + K - 1] = xrow[c];
        }
        if (K > 1) {  // new_state = window[1:] = (state[1:], x_t)
          scalar_t* nrow = ns + b * (K - 1) * H;
          std::copy(srow + H, srow + (K - 1) * H, nrow);
          std::copy(xrow, xrow + H, nrow + (K - 2) * H);
        }
      }
    });
  });
  // The product pre = window · w2ᵀ split by GLU channels: chunk j covers channels [j*kStepChannels, ...), i.e.
  // its columns of a and of b, each chunk two single-threaded GEMMs into its own [B, 2 * width] buffer (the
  // bias, when there is one, as the GEMMs' starting value) and the GLU of its channels: on the decode shape
  // half of the columns on one thread beat MKL's own two-thread split of the whole product -- a small-M
  // product is best split by its columns. The chunk boundaries do not depend on the thread count.
  const at::Tensor window2d = window_t.view({B, H * K});
  const int64_t chunks = ceil_div(H, kStepChannels);
  // The caller's Bf16Products setting, thread-local, carried into the pool (bf16 operands are multiplied in
  // bf16 whatever it is).
  const bool b16_products = gemm::bf16_products();
  AT_DISPATCH_FLOATING_TYPES(y.scalar_type(), "glu_conv1d_step_glu", [&] {
    const scalar_t* bd = bias_c.defined() ? bias_c.data_ptr<scalar_t>() : nullptr;
    const scalar_t* xd = x_res.data_ptr<scalar_t>();
    scalar_t* yd = y.data_ptr<scalar_t>();
    at::parallel_for(0, chunks, 1, [&](int64_t j0, int64_t j1) {
      const at::AutoDispatchBelowADInplaceOrView below_autograd;  // plain GEMMs on the pool's threads
      const gemm::Bf16Products scope(b16_products);
      // One buffer per task for its chunks' products, each viewed as a contiguous [B, 2 * width].
      at::Tensor buffer = at::empty({B * 2 * std::min(kStepChannels, H)}, epilogue);
      for (int64_t j = j0; j < j1; ++j) {
        const int64_t h0 = j * kStepChannels, width = std::min(kStepChannels, H - h0);
        at::Tensor pre = buffer.narrow(0, 0, B * 2 * width).view({B, 2 * width});
        scalar_t* pd = pre.data_ptr<scalar_t>();
        if (bd != nullptr) {  // the bias of the chunk's a and b columns as the GEMMs' starting value
          fill_rows(pd, 2 * width, bd + h0, width, B);
          fill_rows(pd + width, 2 * width, bd + H + h0, width, B);
        }
        if (packed.defined()) {  // bf16 operands, float32 sums straight into pre (scalar_t is float here)
          const auto* pw = packed.data_ptr<c10::BFloat16>();
          const auto* xw = window2d.data_ptr<c10::BFloat16>();
          float* pf = reinterpret_cast<float*>(pd);
          gemm::bf16_brgemm(B, width, H * K, xw, H * K, pw + h0 * H * K, pf, 2 * width, bd != nullptr);
          gemm::bf16_brgemm(B, width, H * K, xw, H * K, pw + (H + h0) * H * K, pf + width, 2 * width, bd != nullptr);
        } else {
          gemm::mm_out(pre.narrow(1, 0, width), window2d, w2.narrow(0, h0, width).t(), /*accumulate=*/bd != nullptr);
          gemm::mm_out(pre.narrow(1, width, width), window2d, w2.narrow(0, H + h0, width).t(),
                       /*accumulate=*/bd != nullptr);
        }
        for (int64_t b = 0; b < B; ++b) {
          glu_row<scalar_t>(pd + b * 2 * width, nullptr, residual ? xd + b * H + h0 : nullptr,
                            static_cast<scalar_t>(scale), width, yd + b * H + h0);
        }
      }
      if (packed.defined()) gemm::bf16_brgemm_release();
    });
  });
  return {b16 ? bf16::narrow(y) : y, new_state};
}

std::tuple<at::Tensor, at::Tensor> glu_conv1d_step(const at::Tensor& x_t, const at::Tensor& state,
                                                   const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                                                   bool residual, double scale) {
  constexpr const char* op = "fastqa::glu_conv1d_step";
  gemm::prepare();
  check_step_args(op, x_t, state, weight, bias);
  if (!bf16::is_bf16(x_t)) return step_kernel(x_t, state, weight, bias, residual, scale);
  // bf16, two routes (gemm::route_for): native (step_kernel on bf16 storage) or widen -- the float32 step on
  // widened inputs, the weight widened once per weight value (gemm::packed_weight), y rounded back; the new
  // state holds the inputs' bf16 values, so it rounds back exactly.
  const auto run = [&](gemm::Route route) -> std::tuple<at::Tensor, at::Tensor> {
    if (route == gemm::Route::kNative) {
      const bool brgemm = gemm::bf16_brgemm_usable() && (weight.size(1) * weight.size(2)) % 2 == 0;
      const at::Tensor packed =
          brgemm ? gemm::packed_weight(weight, "glu_conv1d_step vnni", [&] { return pack_step_weight(weight); })
                 : at::Tensor();
      return step_kernel(x_t, state, weight, bias, residual, scale, packed);
    }
    const at::Tensor w32 = gemm::packed_weight(weight, "float32", [&] { return bf16::widen(weight); });
    const std::optional<at::Tensor> b32 =
        bias.has_value() ? std::optional<at::Tensor>(bf16::widen(*bias)) : std::nullopt;
    auto [y, s] = step_kernel(bf16::widen(x_t), bf16::widen(state), w32, b32, residual, scale);
    return {bf16::narrow(y), bf16::narrow(s)};
  };
  const int64_t B = x_t.size(0), H = x_t.size(1), K = weight.size(2);
  const gemm::Route route = gemm::route_for("glu_conv1d_step", gemm::shape_class({{"B", B}, {"H", H}, {"K", K}}),
                                            [&](gemm::Route r) { (void)run(r); });
  return run(route);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(fastqa, m) {
  FASTQA_CPU_OP(m, glu_conv1d_fwd,
                "(Tensor x, Tensor weight, Tensor? bias, Tensor? mask, int pad_left, bool residual, float scale) "
                "-> (Tensor y, Tensor aux)");
  FASTQA_CPU_OP(m, glu_conv1d_bwd,
                "(Tensor grad_y, Tensor x, Tensor weight, Tensor? mask, Tensor aux, int pad_left, bool residual, "
                "float scale, bool has_bias) -> (Tensor grad_x, Tensor grad_weight, Tensor? grad_bias)");
  FASTQA_CPU_OP(m, glu_conv1d_step,
                "(Tensor x_t, Tensor state, Tensor weight, Tensor? bias, bool residual, float scale) "
                "-> (Tensor y_t, Tensor new_state)");
}

}  // namespace fastqa
