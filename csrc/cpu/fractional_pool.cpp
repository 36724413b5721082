// CPU kernels of the FractionalPool family, bit-identical to TF 2.21's Eigen kernels for TF's
// dtypes (../shared/spec/batchnorm_fracpool.md §8-§10).
//
// Design:
// * NHWC with any batch/row/column strides is read in place (one copy only when the channels
//   are not contiguous); the output is contiguous NHWC.
// * Forward: parallel over (batch, output row); each cell is reduced over channel blocks held
//   in Vectorized registers, in TF's scan order (rows outer, columns inner), so every lane
//   performs exactly TF's sequence of float operations. Half types accumulate in float.
// * Avg gradient: gathers instead of scattering: each input element sums the contributions of
//   the (at most 2x2) cells covering it, in TF's cell order. No atomics, no races,
//   deterministic, and the same rounding as TF's scatter (double accumulator, then one cast).
// * Max gradient: each cell's argmax (first maximum in scan order, TF's tie rule) is
//   recomputed and checked against orig_output. Disjoint cells then write their elements, dy
//   at the argmax and 0 elsewhere; overlapping cells keep a cell row's argmaxes, and each dx
//   row is gathered once from the cells covering it, in TF's order (MaxGradPass). Its double
//   backward selects grad at the same argmax.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <limits>
#include <type_traits>
#include <vector>

#include "common/fractional_pool.h"
#include "cpu/avx512.h"
#include "cpu/fractional_max_grad_avx512.h"
#include "cpu/widen.h"

namespace torch_tfgrads {
namespace {

using fracpool::AxisPlan;
using fracpool::GradPlan;
using fracpool::channels_contiguous;

template <typename scalar_t>
using acc_t = std::conditional_t<std::is_same_v<scalar_t, c10::Half> ||
                                     std::is_same_v<scalar_t, c10::BFloat16>,
                                 float, scalar_t>;

// Parallel grain: about 32K input elements per task.
int64_t grain_for(int64_t elems_per_item) {
  return std::max<int64_t>(1, 32768 / std::max<int64_t>(1, elems_per_item));
}

// The widest cell of an axis.
inline int64_t widest(const AxisPlan& a) {
  int64_t n = 0;
  for (int64_t c = 0; c < a.cells; ++c) n = std::max(n, a.count(c));
  return n;
}

// Integer sums wrap like TF's T-typed accumulator (no signed-overflow UB here).
template <typename T>
T wrap_add(T a, T b) {
  using U = std::make_unsigned_t<T>;
  return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
}

struct Cell {
  const void* base;  // x at (b, 0, 0, d)
  int64_t sH, sW, r0, r1, c0, c1;
};

// ---- forward --------------------------------------------------------------------------------
// K vectors of channels of one cell, reduced in registers: sum (avg) or TF's max (`out < v`
// keeps the first of equal values and ignores NaN, as Eigen's cwiseMax on the CPU).
template <typename scalar_t, bool kMax, int K>
void reduce_vectors(const Cell& cell, scalar_t* out) {
  using A = acc_t<scalar_t>;
  using Wd = Widen<scalar_t, A>;
  using Vec = Vectorized<A>;
  constexpr int64_t L = Vec::size();
  const auto* x = static_cast<const scalar_t*>(cell.base);
  const Vec init(kMax ? static_cast<A>(std::numeric_limits<scalar_t>::lowest()) : A(0));
  Vec acc[K];
  for (int k = 0; k < K; ++k) acc[k] = init;
  for (int64_t h = cell.r0; h <= cell.r1; ++h) {
    for (int64_t w = cell.c0; w <= cell.c1; ++w) {
      const scalar_t* p = x + h * cell.sH + w * cell.sW;
      for (int k = 0; k < K; ++k) {
        const Vec v = Wd::load(p + k * L);
        acc[k] = kMax ? Vec::blendv(acc[k], v, acc[k] < v) : acc[k] + v;
      }
    }
  }
  if (!kMax) {
    const Vec n(static_cast<A>((cell.r1 - cell.r0 + 1) * (cell.c1 - cell.c0 + 1)));
    for (int k = 0; k < K; ++k) acc[k] = acc[k] / n;
  }
  for (int k = 0; k < K; ++k) Wd::store(out + k * L, acc[k]);
}

// Channels [d0, C) one at a time, same order and arithmetic (also the integer path).
template <typename scalar_t, bool kMax>
void reduce_scalars(const Cell& cell, int64_t d0, int64_t C, scalar_t* out) {
  using A = acc_t<scalar_t>;
  const auto* x = static_cast<const scalar_t*>(cell.base);
  const int64_t count = (cell.r1 - cell.r0 + 1) * (cell.c1 - cell.c0 + 1);
  for (int64_t d = d0; d < C; ++d) {
    A acc = kMax ? static_cast<A>(std::numeric_limits<scalar_t>::lowest()) : A(0);
    for (int64_t h = cell.r0; h <= cell.r1; ++h) {
      for (int64_t w = cell.c0; w <= cell.c1; ++w) {
        const A v = static_cast<A>(x[h * cell.sH + w * cell.sW + d]);
        if constexpr (kMax) {
          acc = acc < v ? v : acc;
        } else if constexpr (std::is_integral_v<A>) {
          acc = wrap_add(acc, v);
        } else {
          acc = acc + v;
        }
      }
    }
    if constexpr (!kMax) acc = acc / static_cast<A>(count);  // C++ truncation for integers
    out[d] = static_cast<scalar_t>(acc);
  }
}

// Max over the cells of one output row, channels [0, dv) in whole vectors, as straight-line
// code for cells of RH rows and at most CW columns: narrower cells repeat their last column,
// which never changes a maximum (TF's `out < v` keeps the first of equal values). Loops over
// the irregular 1-2-1-2 cell sizes mispredict at almost every cell.
template <typename scalar_t, int RH, int CW>
void max_row_vectors(const scalar_t* xr, int64_t sH, int64_t sW, const AxisPlan& cols,
                     int64_t C, int64_t dv, scalar_t* out) {
  using A = acc_t<scalar_t>;
  using Wd = Widen<scalar_t, A>;
  using Vec = Vectorized<A>;
  constexpr int64_t L = Vec::size();
  const Vec init(static_cast<A>(std::numeric_limits<scalar_t>::lowest()));
  for (int64_t j = 0; j < cols.cells; ++j) {
    const int64_t c0 = cols.start[j], last = cols.end[j] - c0;
    const scalar_t* xc = xr + c0 * sW;
    scalar_t* o = out + j * C;
    for (int64_t d = 0; d < dv; d += L) {
      Vec acc = init;
#pragma GCC unroll 4
      for (int64_t h = 0; h < RH; ++h) {
#pragma GCC unroll 4
        for (int64_t w = 0; w < CW; ++w) {
          const Vec v = Wd::load(xc + h * sH + std::min(w, last) * sW + d);
          acc = Vec::blendv(acc, v, acc < v);
        }
      }
      Wd::store(o + d, acc);
    }
  }
}

// The straight-line max row for this cell-row height and widest cell; false if none applies.
template <typename scalar_t, int RH>
bool max_row_fixed(const scalar_t* xr, int64_t sH, int64_t sW, const AxisPlan& cols,
                   int64_t cw_max, int64_t C, int64_t dv, scalar_t* out) {
  switch (cw_max) {
    case 1: max_row_vectors<scalar_t, RH, 1>(xr, sH, sW, cols, C, dv, out); return true;
    case 2: max_row_vectors<scalar_t, RH, 2>(xr, sH, sW, cols, C, dv, out); return true;
    case 3: max_row_vectors<scalar_t, RH, 3>(xr, sH, sW, cols, C, dv, out); return true;
    default: return false;
  }
}

template <typename scalar_t, bool kMax>
void pool_kernel(const at::Tensor& x, at::Tensor& out, const AxisPlan& rows,
                 const AxisPlan& cols) {
  const int64_t N = x.size(0), C = x.size(3), OH = rows.cells, OW = cols.cells;
  const int64_t sN = x.stride(0), sH = x.stride(1), sW = x.stride(2);
  const scalar_t* xp = x.const_data_ptr<scalar_t>();
  scalar_t* op = out.mutable_data_ptr<scalar_t>();
  constexpr bool kVector = !std::is_integral_v<scalar_t>;
  constexpr int64_t L = Vectorized<acc_t<scalar_t>>::size();
  const int64_t per_row = (x.size(1) / OH + 1) * x.size(2) * C;
  const int64_t cw_max = widest(cols);
  at::parallel_for(0, N * OH, grain_for(per_row), [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / OH, i = item % OH;
      if constexpr (kMax && kVector) {
        const int64_t dv = C / L * L;
        const scalar_t* xr = xp + b * sN + rows.start[i] * sH;
        scalar_t* o = op + item * OW * C;
        bool done = false;
        switch (rows.count(i)) {
          case 1: done = max_row_fixed<scalar_t, 1>(xr, sH, sW, cols, cw_max, C, dv, o); break;
          case 2: done = max_row_fixed<scalar_t, 2>(xr, sH, sW, cols, cw_max, C, dv, o); break;
          case 3: done = max_row_fixed<scalar_t, 3>(xr, sH, sW, cols, cw_max, C, dv, o); break;
        }
        if (done) {
          if (dv < C)
            for (int64_t j = 0; j < OW; ++j)
              reduce_scalars<scalar_t, kMax>(
                  Cell{xp + b * sN, sH, sW, rows.start[i], rows.end[i], cols.start[j],
                       cols.end[j]},
                  dv, C, o + j * C);
          continue;
        }
      }
      for (int64_t j = 0; j < OW; ++j) {
        scalar_t* o = op + (item * OW + j) * C;
        Cell cell{xp + b * sN, sH, sW, rows.start[i], rows.end[i], cols.start[j], cols.end[j]};
        int64_t d = 0;
        if constexpr (kVector) {
          for (; d + 4 * L <= C; d += 4 * L) {
            cell.base = xp + b * sN + d;
            reduce_vectors<scalar_t, kMax, 4>(cell, o + d);
          }
          for (; d + L <= C; d += L) {
            cell.base = xp + b * sN + d;
            reduce_vectors<scalar_t, kMax, 1>(cell, o + d);
          }
        }
        cell.base = xp + b * sN;
        reduce_scalars<scalar_t, kMax>(cell, d, C, o);
      }
    }
  });
}

template <bool kMax>
std::tuple<at::Tensor, at::Tensor, at::Tensor> fractional_pool_cpu(
    const at::Tensor& value, c10::ArrayRef<double> pooling_ratio, bool pseudo_random,
    bool overlapping, bool deterministic, int64_t seed, int64_t seed2) {
  constexpr const char* op = kMax ? "fractional_max_pool" : "fractional_avg_pool";
  const auto s = fracpool::check_pool(op, kMax, value, pooling_ratio, deterministic, seed, seed2);
  auto [rows, cols] = fracpool::pooling_sequences(s, pseudo_random, seed, seed2);
  const AxisPlan rp = fracpool::plan_axis(rows.data_ptr<int64_t>(), s.out_h, overlapping, s.H);
  const AxisPlan cp = fracpool::plan_axis(cols.data_ptr<int64_t>(), s.out_w, overlapping, s.W);
  const at::Tensor x = channels_contiguous(value);
  at::Tensor out = at::empty({s.N, s.out_h, s.out_w, s.C}, value.options());
  if (out.numel() > 0) {
    fracpool::dispatch_value_types(x.scalar_type(), [&](auto tag) {
      pool_kernel<decltype(tag), kMax>(x, out, rp, cp);
    });
  }
  return {out, rows, cols};
}

// ---- FractionalAvgPoolGrad --------------------------------------------------------------------
// dx[b,h,w,:] = T(sum over covering cells (r, c), in TF's order, of double(dy[b,r,c,:]) / n).
// An element with one covering cell: T(double(dy) / n) equals the division in float for
// float32 (double rounding is innocuous for division, 53 >= 2 * 24 + 2), and float division is
// twice as wide per vector. Elements on the shared boundaries of overlapping cells add the
// quotients double(dy) / n of their cells: computed once per cell row (a two-row cache per
// task) and reused by every element the cell covers, summed in TF's order from 0, so the
// result is TF's (a double division per element and term, 2.9 terms per element at ratio
// 1.44, made the division unit the bottleneck).
template <typename scalar_t>
void avg_grad_kernel(const at::Tensor& dy, at::Tensor& dx, const GradPlan& g) {
  const int64_t H = g.H, W = g.W, C = g.C, OW = g.cols.cells;
  const int64_t sN = dy.stride(0), sH = dy.stride(1), sW = dy.stride(2);
  const scalar_t* dyp = dy.const_data_ptr<scalar_t>();
  scalar_t* dxp = dx.mutable_data_ptr<scalar_t>();
  const AxisPlan& rows = g.rows;
  const AxisPlan& cols = g.cols;
  // TF's static_cast to an integer truncates toward zero; we also saturate instead of
  // overflowing.
  auto to_value = [](double v) {
    if constexpr (std::is_integral_v<scalar_t>) {
      constexpr double lo = static_cast<double>(std::numeric_limits<scalar_t>::lowest());
      constexpr double hi = static_cast<double>(std::numeric_limits<scalar_t>::max());
      return v <= lo ? std::numeric_limits<scalar_t>::lowest()
           : v >= hi ? std::numeric_limits<scalar_t>::max()
                     : static_cast<scalar_t>(v);
    } else {
      return static_cast<scalar_t>(v);
    }
  };
  const bool shared = std::is_integral_v<scalar_t> || rows.shares() || cols.shares();
  at::parallel_for(0, g.N * H, grain_for(W * C), [&](int64_t begin, int64_t end) {
    // Quotients of two cell rows: slot k holds cell row key[k] (b * OH + r) as [OW][C].
    std::vector<double> quot(shared ? 2 * OW * C : 0);
    int64_t key[2] = {-1, -1};
    auto cell_row = [&](int64_t b, int64_t r) -> const double* {
      const int64_t k = b * rows.cells + r;
      for (int s = 0; s < 2; ++s)
        if (key[s] == k) return quot.data() + s * OW * C;
      const int s = key[0] == k - 1 ? 1 : 0;  // keep the previous cell row
      key[s] = k;
      double* q = quot.data() + s * OW * C;
      for (int64_t c = 0; c < OW; ++c) {
        const double n = static_cast<double>(rows.count(r) * cols.count(c));
        const scalar_t* p = dyp + b * sN + r * sH + c * sW;
        for (int64_t d = 0; d < C; ++d) q[c * C + d] = static_cast<double>(p[d]) / n;
      }
      return q;
    };
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / H, h = item % H;
      const int64_t r_first = rows.first[h], r_last = rows.last[h];
      scalar_t* o = dxp + item * W * C;
      if (r_first > r_last) {  // no cell covers the row
        std::fill(o, o + W * C, scalar_t(0));
        continue;
      }
      const double* qa = shared ? cell_row(b, r_first) : nullptr;
      const double* qb = shared ? cell_row(b, r_last) : nullptr;
      for (int64_t w = 0; w < W; ++w, o += C) {
        const int64_t c_first = cols.first[w], c_last = cols.last[w];
        if (c_first > c_last) {
          std::fill(o, o + C, scalar_t(0));
          continue;
        }
        if constexpr (!std::is_integral_v<scalar_t>) {
          if (r_first == r_last && c_first == c_last) {
            using A = acc_t<scalar_t>;
            const A n = static_cast<A>(rows.count(r_first) * cols.count(c_first));
            const scalar_t* p = dyp + b * sN + r_first * sH + c_first * sW;
            for (int64_t d = 0; d < C; ++d)  // 0 + dy / n as TF's zeroed accumulator: -0 -> +0
              o[d] = static_cast<scalar_t>(A(0) + static_cast<A>(p[d]) / n);
            continue;
          }
        }
        const double *a1 = qa + c_first * C, *a2 = qa + c_last * C;
        const double *b1 = qb + c_first * C, *b2 = qb + c_last * C;
        // TF's order: (r_first, c_first), (r_first, c_last), (r_last, ...), from 0.0.
        if (r_first == r_last && c_first == c_last) {
          for (int64_t d = 0; d < C; ++d) o[d] = to_value(0.0 + a1[d]);
        } else if (r_first == r_last) {
          for (int64_t d = 0; d < C; ++d) o[d] = to_value((0.0 + a1[d]) + a2[d]);
        } else if (c_first == c_last) {
          for (int64_t d = 0; d < C; ++d) o[d] = to_value((0.0 + a1[d]) + b1[d]);
        } else {
          for (int64_t d = 0; d < C; ++d)
            o[d] = to_value((((0.0 + a1[d]) + a2[d]) + b1[d]) + b2[d]);
        }
      }
    }
  });
}

at::Tensor fractional_avg_pool_grad_cpu(c10::SymIntArrayRef orig_input_tensor_shape,
                                        const at::Tensor& out_backprop,
                                        const at::Tensor& row_pooling_sequence,
                                        const at::Tensor& col_pooling_sequence,
                                        bool overlapping) {
  constexpr const char* op = "fractional_avg_pool_grad";
  const auto shape = C10_AS_INTARRAYREF_SLOW(orig_input_tensor_shape);
  const GradPlan g = fracpool::check_avg_grad(op, shape, out_backprop, row_pooling_sequence,
                                              col_pooling_sequence, overlapping);
  const at::Tensor dy = channels_contiguous(fracpool::pad_out_backprop(out_backprop, g));
  at::Tensor dx = at::empty({g.N, g.H, g.W, g.C}, out_backprop.options());
  fracpool::dispatch_value_types(dy.scalar_type(), [&](auto tag) {
    avg_grad_kernel<decltype(tag)>(dy, dx, g);
  });
  return dx;
}

// ---- FractionalMaxPoolGrad --------------------------------------------------------------------
// TF's argmax of one channel of a cell, one element at a time with exact int64 coordinates:
// the first element, then `best < v` takes v (the first maximum in scan order; NaN never
// taken). xb: x at (b, 0, 0, d).
template <typename scalar_t>
struct ScalarMax {
  acc_t<scalar_t> value;
  int64_t h, w;
};
template <typename scalar_t>
ScalarMax<scalar_t> cell_max_scalar(const scalar_t* xb, int64_t sH, int64_t sW, int64_t r0,
                                    int64_t r1, int64_t c0, int64_t c1) {
  using A = acc_t<scalar_t>;
  ScalarMax<scalar_t> m{static_cast<A>(xb[r0 * sH + c0 * sW]), r0, c0};
  for (int64_t h = r0; h <= r1; ++h) {
    for (int64_t w = c0; w <= c1; ++w) {
      const A v = static_cast<A>(xb[h * sH + w * sW]);
      if (m.value < v) m = {v, h, w};
    }
  }
  return m;
}

// Whether every in-cell position (row-major index, < rows x cols of the largest cell) is an
// exact value of A (below 2^24 for float).
template <typename A>
bool exact_positions(const GradPlan& g) {
  return std::is_integral_v<A> ||
         widest(g.rows) * widest(g.cols) <= (int64_t{1} << std::numeric_limits<A>::digits);
}

// The gradient, with each cell's argmax (first maximum in scan order, TF's tie rule) recomputed
// and checked against orig_output.
// * Disjoint cells: one pass over the cells; each writes its elements, dy where it is the
//   maximum and 0 elsewhere. One task per cell row.
// * Overlapping cells: per image and channel block, the argmaxes of a cell row go to a
//   two-row ring, then every dx row that no later cell row covers is gathered, element by
//   element, from the (at most 2x2) cells covering it, in TF's cell order starting from 0 as
//   TF's scatter-add does: dx is written once, without read-modify-write of shared boundaries.
// Tasks never share an element.
template <typename scalar_t>
struct MaxGradPass {
  using A = acc_t<scalar_t>;
  using Wd = Widen<scalar_t, A>;
  using Vec = Vectorized<A>;
  static constexpr int64_t L = Vec::size();

  // orig_input, and for the gradient orig_output, out_backprop and the result (the double
  // backward reads x only).
  const scalar_t* x;
  const scalar_t *y = nullptr, *dy = nullptr;
  scalar_t* dx = nullptr;
  int64_t sN, sH, sW, H, W, C, OH, OW;
  const GradPlan& g;
  int64_t cw_max;  // widest cell; the position of (h, w) in a cell is h * cw_max + w
  // Positions in a cell are compared as acc_t values: exact below 2^24 for float. Cells with
  // more elements (a huge input pooled to a few cells) take the int64 scalar path.
  bool scalar_only = false;
  // Non-temporal stores (float, whole aligned vectors, dx beyond the L2 caches): every
  // element is written exactly once, so reading dx's lines in first is wasted.
  bool stream = false;
  // Overlapping cells, per input column: its first covering cell `ja` and its column in it,
  // and the next cell `jb` (where the column is that cell's first) or, if none covers it, `ja`
  // again with the column NaN (a position no element has). Uncovered columns: NaN for both.
  struct ColumnCells {
    int64_t ja, jb;
    A ka, kb;
  };
  std::vector<ColumnCells> columns;

  MaxGradPass(const at::Tensor& x_, const GradPlan& plan)
      : x(x_.const_data_ptr<scalar_t>()), sN(x_.stride(0)), sH(x_.stride(1)), sW(x_.stride(2)),
        H(plan.H), W(plan.W), C(plan.C), OH(plan.rows.cells), OW(plan.cols.cells), g(plan),
        cw_max(widest(plan.cols)), scalar_only(!exact_positions<A>(plan)) {}

  // The gradient's tensors (and, for overlapping cells, the column table of the gather).
  void set_gradient(const at::Tensor& y_, const at::Tensor& dy_, at::Tensor& dx_,
                    bool overlapping) {
    y = y_.const_data_ptr<scalar_t>();
    dy = dy_.const_data_ptr<scalar_t>();
    dx = dx_.mutable_data_ptr<scalar_t>();
    if (!overlapping) return;
    const A none = std::numeric_limits<A>::quiet_NaN();
    columns.resize(W);
    for (int64_t w = 0; w < W; ++w) {
      const int64_t f = g.cols.first[w], l = g.cols.last[w];
      columns[w] = f > l ? ColumnCells{0, 0, none, none}
                         : ColumnCells{f, l, static_cast<A>(w - g.cols.start[f]),
                                       l > f ? A(0) : none};
    }
  }

  // Channel vector xc[0, L) of one cell (rows [0, rh), columns [0, last] at row/pixel
  // strides): the maximum and its position, with TF's update (`best < v` takes v: the first
  // maximum in scan order wins, a NaN is never taken, a NaN first element stays and then fails
  // the orig_output check). RH > 0: rh at compile time; CW > 0: the cell is swept as exactly CW
  // columns (CW = cw_max), the extra ones repeating its last column, so the sweep is
  // straight-line code; a repeat never wins (its column came first). RH = CW = 0: runtime sizes.
  template <int RH, int CW>
  static void cell_argmax(const scalar_t* xc, int64_t rh, int64_t last, int64_t stride,
                          int64_t row, int64_t pixel, Vec& best, Vec& at) {
    const int64_t cw = CW > 0 ? CW : last + 1;
    best = Wd::load(xc);
    at = Vec(A(0));
#pragma GCC unroll 4
    for (int64_t h = 0; h < (RH > 0 ? RH : rh); ++h) {
#pragma GCC unroll 4
      for (int64_t w = (h == 0 ? 1 : 0); w < cw; ++w) {
        const Vec v = Wd::load(xc + h * row + (CW > 0 ? std::min(w, last) : w) * pixel);
        const Vec take = best < v;
        best = Vec::blendv(best, v, take);
        at = Vec::blendv(at, Vec(static_cast<A>(h * stride + w)), take);
      }
    }
  }

  void store(scalar_t* o, const Vec& v) const {
    if constexpr (std::is_same_v<scalar_t, float>)
      if (stream) return stream_store(o, v);
    Wd::store(o, v);
  }

  // ---- disjoint cells
  // One cell, channels [d0, d1) in whole vectors: argmax, then dy where the position matches
  // and 0 elsewhere, without reading x again. A row's columns are stored last to first, so a
  // repeated column's 0 is overwritten by its real column.
  template <int RH, int CW>
  bool cell_vectors(int64_t b, int64_t i, int64_t j, int64_t d0, int64_t d1) const {
    const int64_t r0 = g.rows.start[i], c0 = g.cols.start[j];
    const int64_t rh = RH > 0 ? RH : g.rows.end[i] - r0 + 1;
    const int64_t last = g.cols.end[j] - c0;  // the cell's last column, relative to c0
    const int64_t cw = CW > 0 ? CW : last + 1;
    auto col = [last](int64_t w) { return CW > 0 ? std::min(w, last) : w; };
    // Locals: vector stores may alias anything, so members would be reloaded after each one.
    const int64_t cell = ((b * OH + i) * OW + j) * C, row = sH, pixel = sW, opixel = C,
                  orow = W * C, stride = CW > 0 ? CW : cw_max;
    const scalar_t* xc = x + b * sN + r0 * sH + c0 * sW;
    const scalar_t *yc = y + cell, *gc = dy + cell;
    scalar_t* o = dx + ((b * H + r0) * W + c0) * C;
    int mismatch = 0;
    for (int64_t d = d0; d < d1; d += L) {
      Vec best, at;
      cell_argmax<RH, CW>(xc + d, rh, last, stride, row, pixel, best, at);
      mismatch |= (best == Wd::load(yc + d)).zero_mask();
      const Vec grad = Vec(A(0)) + Wd::load(gc + d);  // 0 + dy as TF's scatter-add: -0 -> +0
#pragma GCC unroll 4
      for (int64_t h = 0; h < rh; ++h) {
        Vec out[CW > 0 ? CW : 1];
#pragma GCC unroll 4
        for (int64_t w = 0; w < cw; ++w) {
          out[CW > 0 ? w : 0] = grad & (at == Vec(static_cast<A>(h * stride + w)));
          if (CW == 0) store(o + h * orow + w * opixel + d, out[0]);
        }
#pragma GCC unroll 4
        for (int64_t w = cw - 1; CW > 0 && w >= 0; --w)
          store(o + h * orow + col(w) * opixel + d, out[CW > 0 ? w : 0]);
      }
    }
    return mismatch == 0;
  }

  // One row of cells in order, channels [d0, d1), swept as cw_max columns. (Visiting
  // disjoint cells grouped by width instead, each group with its exact width, saves the
  // repeated columns but was 1.5-2x slower on inputs beyond L2: the hardware prefetchers
  // lose the row streams.)
  template <int RH, int CW>
  bool cells_of_row(int64_t b, int64_t i, int64_t d0, int64_t dv) const {
    bool ok = true;
    for (int64_t j = 0; j < OW; ++j) ok &= cell_vectors<RH, CW>(b, i, j, d0, dv);
    return ok;
  }
  template <int RH>
  bool cell_row(int64_t b, int64_t i, int64_t d0, int64_t dv) const {
    switch (cw_max) {
      case 1: return cells_of_row<RH, 1>(b, i, d0, dv);
      case 2: return cells_of_row<RH, 2>(b, i, d0, dv);
      case 3: return cells_of_row<RH, 3>(b, i, d0, dv);
      default: return cells_of_row<0, 0>(b, i, d0, dv);
    }
  }

  // ---- overlapping cells
  // Argmaxes of cell row i, channels [d0, d1) in whole vectors, into pos[OW][d1 - d0].
  template <int RH, int CW>
  bool argmax_cells(int64_t b, int64_t i, int64_t d0, int64_t d1, A* pos) const {
    const int64_t r0 = g.rows.start[i], rh = RH > 0 ? RH : g.rows.end[i] - r0 + 1;
    const int64_t row = sH, pixel = sW, nd = d1 - d0, stride = CW > 0 ? CW : cw_max;
    int mismatch = 0;
    for (int64_t j = 0; j < OW; ++j) {
      const int64_t c0 = g.cols.start[j], last = g.cols.end[j] - c0;
      const scalar_t* xc = x + b * sN + r0 * row + c0 * pixel;
      const scalar_t* yc = y + ((b * OH + i) * OW + j) * C;
      for (int64_t d = d0; d < d1; d += L) {
        Vec best, at;
        cell_argmax<RH, CW>(xc + d, rh, last, stride, row, pixel, best, at);
        at.store(pos + j * nd + (d - d0));
        mismatch |= (best == Wd::load(yc + d)).zero_mask();
      }
    }
    return mismatch == 0;
  }
  template <int RH>
  bool argmax_row(int64_t b, int64_t i, int64_t d0, int64_t d1, A* pos) const {
    switch (cw_max) {
      case 2: return argmax_cells<RH, 2>(b, i, d0, d1, pos);
      case 3: return argmax_cells<RH, 3>(b, i, d0, d1, pos);
      default: return argmax_cells<0, 0>(b, i, d0, d1, pos);
    }
  }

  // dx row h of image b, channels d0 + [0, nd): each element is 0 plus, in TF's cell order,
  // dy of each covering cell whose argmax it is. Cell rows ia and ib cover the row (kTwo: two
  // of them, and h is ib's first row); their argmaxes are in the ring. NV > 0: nd = NV * L.
  template <bool kTwo, int NV>
  void gather_row(int64_t b, int64_t h, int64_t d0, int64_t nd_, const A* ring) const {
    const int64_t nd = NV > 0 ? NV * L : nd_;
    const int64_t ia = g.rows.first[h], ib = g.rows.last[h], cells = OW * nd, c = C;
    const Vec ra(static_cast<A>((h - g.rows.start[ia]) * cw_max));
    const A *pa = ring + (ia & 1) * cells, *pb = ring + (ib & 1) * cells;
    const scalar_t* ga = dy + (b * OH + ia) * OW * C + d0;
    const scalar_t* gb = dy + (b * OH + ib) * OW * C + d0;
    scalar_t* o = dx + (b * H + h) * W * C + d0;
    const ColumnCells* cols = columns.data();
    for (int64_t w = 0; w < W; ++w, o += c) {
      const ColumnCells m = cols[w];
      const Vec ka(m.ka), kb(m.kb), ca = ra + ka, cb = ra + kb;
      const int64_t a = m.ja * nd, bb = m.jb * nd, ag = m.ja * c, bg = m.jb * c;
#pragma GCC unroll 8
      for (int64_t d = 0; d < nd; d += L) {
        Vec acc = Vec(A(0)) + (Wd::load(ga + ag + d) & (Vec::loadu(pa + a + d) == ca));
        acc = acc + (Wd::load(ga + bg + d) & (Vec::loadu(pa + bb + d) == cb));
        if (kTwo) {
          acc = acc + (Wd::load(gb + ag + d) & (Vec::loadu(pb + a + d) == ka));
          acc = acc + (Wd::load(gb + bg + d) & (Vec::loadu(pb + bb + d) == kb));
        }
        store(o + d, acc);
      }
    }
  }
  template <int NV>
  void gather_rows(int64_t b, int64_t h, int64_t d0, int64_t nd, const A* ring) const {
    if (g.rows.first[h] == g.rows.last[h]) gather_row<false, NV>(b, h, d0, nd, ring);
    if (g.rows.first[h] < g.rows.last[h]) gather_row<true, NV>(b, h, d0, nd, ring);
  }

  // Image b, channels [d0, d1) in whole vectors.
  bool shared_image(int64_t b, int64_t d0, int64_t d1) const {
    const int64_t nd = d1 - d0;
    std::vector<A> ring(2 * OW * nd);
    bool ok = true;
    int64_t h = 0;
    for (int64_t i = 0; i < OH; ++i) {
      A* pos = ring.data() + (i & 1) * OW * nd;
      switch (g.rows.count(i)) {
        case 2: ok &= argmax_row<2>(b, i, d0, d1, pos); break;
        case 3: ok &= argmax_row<3>(b, i, d0, d1, pos); break;
        default: ok &= argmax_row<0>(b, i, d0, d1, pos);
      }
      for (; h < H && g.rows.last[h] <= i; ++h) {  // rows no later cell row covers
        switch (nd / L * L == nd ? nd / L : 0) {
          case 2: gather_rows<2>(b, h, d0, nd, ring.data()); break;
          case 4: gather_rows<4>(b, h, d0, nd, ring.data()); break;
          case 8: gather_rows<8>(b, h, d0, nd, ring.data()); break;
          default: gather_rows<0>(b, h, d0, nd, ring.data());
        }
      }
    }
    return ok;
  }

  // ---- scalar channels (integers, the channels after the last whole vector, huge cells)
  // Cells in TF's order; an element's first covering cell assigns, later ones add.
  bool cell_scalars(int64_t b, int64_t i, int64_t j, int64_t d0, int64_t d1) const {
    const int64_t r0 = g.rows.start[i], r1 = g.rows.end[i];
    const int64_t c0 = g.cols.start[j], c1 = g.cols.end[j];
    const int64_t k_out = ((b * OH + i) * OW + j) * C;
    bool ok = true;
    for (int64_t d = d0; d < d1; ++d) {
      const auto m = cell_max_scalar(x + b * sN + d, sH, sW, r0, r1, c0, c1);
      const int64_t bh = m.h, bw = m.w;
      ok &= m.value == static_cast<A>(y[k_out + d]);
      const A grad = static_cast<A>(dy[k_out + d]);
      for (int64_t h = r0; h <= r1; ++h) {
        for (int64_t w = c0; w <= c1; ++w) {
          const A v = (h == bh && w == bw) ? grad : A(0);
          scalar_t* o = dx + ((b * H + h) * W + w) * C + d;
          if (g.rows.first[h] == i && g.cols.first[w] == j) {
            *o = static_cast<scalar_t>(A(0) + v);  // 0 + dy as TF's scatter-add: -0 -> +0
          } else if constexpr (std::is_integral_v<A>) {
            *o = wrap_add(static_cast<A>(*o), v);
          } else {
            *o = static_cast<scalar_t>(static_cast<A>(*o) + v);
          }
        }
      }
    }
    return ok;
  }

  // The end of the whole vectors in [d0, d1) (d0 where only scalars apply).
  int64_t vector_end(int64_t d0, int64_t d1) const {
    return std::is_integral_v<scalar_t> || scalar_only ? d0 : d0 + (d1 - d0) / L * L;
  }

  // Disjoint cells: cell row i of image b, all channels.
  bool disjoint_row(int64_t b, int64_t i) const {
    const int64_t dv = vector_end(0, C);
    bool ok = true;
    if (dv < C)
      for (int64_t j = 0; j < OW; ++j) ok &= cell_scalars(b, i, j, dv, C);
    if constexpr (!std::is_integral_v<scalar_t>) {  // integers: scalars only
      if (dv == 0) return ok;
      switch (g.rows.count(i)) {
        case 1: return cell_row<1>(b, i, 0, dv) && ok;
        case 2: return cell_row<2>(b, i, 0, dv) && ok;
        case 3: return cell_row<3>(b, i, 0, dv) && ok;
        default: return cell_row<0>(b, i, 0, dv) && ok;
      }
    }
    return ok;
  }

  // Overlapping cells: image b, channels [d0, d1).
  bool overlapping_block(int64_t b, int64_t d0, int64_t d1) const {
    const int64_t dv = vector_end(d0, d1);
    bool ok = true;
    if (dv < d1)
      for (int64_t i = 0; i < OH; ++i)
        for (int64_t j = 0; j < OW; ++j) ok &= cell_scalars(b, i, j, dv, d1);
    if constexpr (!std::is_integral_v<scalar_t>)  // integers: scalars only
      if (dv > d0) ok &= shared_image(b, d0, dv);
    return ok;
  }
};

template <typename scalar_t>
void max_grad_kernel(const at::Tensor& x, const at::Tensor& y, const at::Tensor& dy,
                     at::Tensor& dx, const GradPlan& g, bool overlapping) {
  const int64_t OH = g.rows.cells, C = g.C;
  MaxGradPass<scalar_t> pass(x, g);
  pass.set_gradient(y, dy, dx, overlapping);
  pass.stream = std::is_same_v<scalar_t, float> && C % 8 == 0 &&
                reinterpret_cast<uintptr_t>(dx.const_data_ptr()) % 32 == 0 &&
                worth_streaming(dx.numel() * 4);
  // Sequences that do not start at 0 or end at the input's size leave rows/columns that no
  // cell covers (and the pass never writes): their gradient is zero.
  if (!g.rows.covers_all() || !g.cols.covers_all()) dx.zero_();
  // Float channels in whole 16-lane vectors: the AVX-512 kernel where the CPU has it.
  std::unique_ptr<fracpool::MaxGradAvx512> wide;
  if constexpr (std::is_same_v<scalar_t, float>) {
    if (C % 16 == 0 && !pass.scalar_only && avx512_enabled())
      wide = std::make_unique<fracpool::MaxGradAvx512>(
          pass.x, pass.sN, pass.sH, pass.sW, pass.y, pass.dy, pass.dx, g, overlapping,
          pass.stream && reinterpret_cast<uintptr_t>(pass.dx) % 64 == 0);
  }
  std::atomic<bool> same{true};
  const int64_t cell_row = (g.H / OH + 1) * g.W * C;
  if (!overlapping) {  // cells are disjoint: any cell row is its own task
    at::parallel_for(0, g.N * OH, grain_for(cell_row), [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t)
        if (!(wide ? wide->disjoint_row(t / OH, t % OH) : pass.disjoint_row(t / OH, t % OH)))
          same = false;
      if (pass.stream) stream_fence();
    });
  } else {  // boundaries are shared between cell rows: one task per image and channel block
    constexpr int64_t kBlock = 64;
    const int64_t blocks = (C + kBlock - 1) / kBlock;
    at::parallel_for(0, g.N * blocks, 1, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const int64_t d0 = (t % blocks) * kBlock, d1 = std::min(C, d0 + kBlock);
        if (!(wide ? wide->overlapping_block(t / blocks, d0, d1)
                   : pass.overlapping_block(t / blocks, d0, d1)))
          same = false;
      }
      if (pass.stream) stream_fence();
    });
  }
  TORCH_CHECK(same, "fractional_max_pool_grad: argument 'orig_output': ",
              fracpool::kOutputMismatch,
              " (orig_output is not the fractional max pool of orig_input with these sequences)");
}

at::Tensor fractional_max_pool_grad_cpu(const at::Tensor& orig_input,
                                        const at::Tensor& orig_output,
                                        const at::Tensor& out_backprop,
                                        const at::Tensor& row_pooling_sequence,
                                        const at::Tensor& col_pooling_sequence,
                                        bool overlapping) {
  constexpr const char* op = "fractional_max_pool_grad";
  const GradPlan g = fracpool::check_max_grad(op, orig_input, orig_output, out_backprop,
                                              row_pooling_sequence, col_pooling_sequence,
                                              overlapping);
  const at::Tensor x = channels_contiguous(orig_input);
  const at::Tensor y = orig_output.contiguous();
  const at::Tensor dy = out_backprop.contiguous();
  at::Tensor dx = at::empty({g.N, g.H, g.W, g.C}, orig_input.options());
  fracpool::dispatch_value_types(x.scalar_type(), [&](auto tag) {
    max_grad_kernel<decltype(tag)>(x, y, dy, dx, g, overlapping);
  });
  return dx;
}

// ---- backward of the gradient ops (double backward) -----------------------------------------
at::Tensor fractional_avg_pool_grad_backward_cpu(const at::Tensor& grad,
                                                 const at::Tensor& row_pooling_sequence,
                                                 const at::Tensor& col_pooling_sequence,
                                                 bool overlapping) {
  constexpr const char* op = "_fractional_avg_pool_grad_backward";
  const GradPlan g = fracpool::check_pool_with_sequences(op, grad, row_pooling_sequence,
                                                         col_pooling_sequence, overlapping);
  const at::Tensor x = channels_contiguous(grad);
  at::Tensor out = at::empty({g.N, g.rows.cells, g.cols.cells, g.C}, grad.options());
  if (out.numel() == 0) return out;
  fracpool::dispatch_value_types(x.scalar_type(), [&](auto tag) {
    pool_kernel<decltype(tag), false>(x, out, g.rows, g.cols);
  });
  return out;
}

// Double backward of the max gradient: out[b, i, j, d] = grad at the cell's argmax (the
// gradient's own argmax and tie rule). Whole channel vectors select branch-free over the
// cell's positions (straight-line per cell-row height and widest cell, as the gradient);
// other channels (and integers, and huge cells) one at a time with exact int64 positions.
template <typename scalar_t, int RH, int CW>
void select_argmax_row(const MaxGradPass<scalar_t>& p, const scalar_t* gin, scalar_t* out,
                       int64_t b, int64_t i, int64_t dv) {
  using A = acc_t<scalar_t>;
  using Wd = Widen<scalar_t, A>;
  using Vec = Vectorized<A>;
  constexpr int64_t L = Vec::size();
  const GradPlan& g = p.g;
  const int64_t r0 = g.rows.start[i], rh = RH > 0 ? RH : g.rows.end[i] - r0 + 1;
  const int64_t C = p.C, grow = p.W * C, stride = CW > 0 ? CW : p.cw_max;
  for (int64_t j = 0; j < p.OW; ++j) {
    const int64_t c0 = g.cols.start[j], last = g.cols.end[j] - c0;
    const int64_t cw = CW > 0 ? CW : last + 1;
    const scalar_t* xc = p.x + b * p.sN + r0 * p.sH + c0 * p.sW;
    const scalar_t* gc = gin + ((b * p.H + r0) * p.W + c0) * C;
    scalar_t* o = out + ((b * p.OH + i) * p.OW + j) * C;
    for (int64_t d = 0; !std::is_integral_v<scalar_t> && d < dv; d += L) {
      Vec best, at, v(A(0));
      MaxGradPass<scalar_t>::template cell_argmax<RH, CW>(xc + d, rh, last, stride, p.sH,
                                                          p.sW, best, at);
#pragma GCC unroll 4
      for (int64_t h = 0; h < rh; ++h)
#pragma GCC unroll 4
        for (int64_t w = 0; w < cw; ++w)  // a repeated column's position never matches
          v = Vec::blendv(v, Wd::load(gc + h * grow + (CW > 0 ? std::min(w, last) : w) * C + d),
                          at == Vec(static_cast<A>(h * stride + w)));
      Wd::store(o + d, v);
    }
    for (int64_t d = dv; d < C; ++d) {
      const auto m = cell_max_scalar(p.x + b * p.sN + d, p.sH, p.sW, r0, g.rows.end[i], c0,
                                     g.cols.end[j]);
      o[d] = gin[((b * p.H + m.h) * p.W + m.w) * C + d];
    }
  }
}

template <typename scalar_t, int RH>
void select_argmax_row(const MaxGradPass<scalar_t>& p, const scalar_t* gin, scalar_t* out,
                       int64_t b, int64_t i, int64_t dv) {
  switch (dv > 0 ? p.cw_max : 0) {
    case 1: return select_argmax_row<scalar_t, RH, 1>(p, gin, out, b, i, dv);
    case 2: return select_argmax_row<scalar_t, RH, 2>(p, gin, out, b, i, dv);
    case 3: return select_argmax_row<scalar_t, RH, 3>(p, gin, out, b, i, dv);
    default: return select_argmax_row<scalar_t, 0, 0>(p, gin, out, b, i, dv);
  }
}

at::Tensor fractional_max_pool_grad_backward_cpu(const at::Tensor& orig_input,
                                                 const at::Tensor& orig_output,
                                                 const at::Tensor& grad,
                                                 const at::Tensor& row_pooling_sequence,
                                                 const at::Tensor& col_pooling_sequence,
                                                 bool overlapping) {
  constexpr const char* op = "_fractional_max_pool_grad_backward";
  const GradPlan g = fracpool::check_max_grad(op, orig_input, orig_output, orig_output,
                                              row_pooling_sequence, col_pooling_sequence,
                                              overlapping);
  TORCH_CHECK(grad.sizes() == orig_input.sizes() && grad.scalar_type() ==
              orig_input.scalar_type(), op, ": argument 'grad' must have the shape and dtype "
              "of orig_input");
  const at::Tensor x = channels_contiguous(orig_input);
  const at::Tensor gin = grad.contiguous();
  at::Tensor out = at::empty(orig_output.sizes(), grad.options());
  fracpool::dispatch_value_types(x.scalar_type(), [&](auto tag) {
    using scalar_t = decltype(tag);
    const MaxGradPass<scalar_t> pass(x, g);  // (the orig_output check was the gradient's)
    const int64_t dv = pass.vector_end(0, g.C), OH = g.rows.cells;
    const scalar_t* src = gin.const_data_ptr<scalar_t>();
    scalar_t* dst = out.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, g.N * OH, grain_for((g.H / OH + 1) * g.W * g.C),
                     [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const int64_t b = t / OH, i = t % OH;
        switch (g.rows.count(i)) {
          case 1: select_argmax_row<scalar_t, 1>(pass, src, dst, b, i, dv); break;
          case 2: select_argmax_row<scalar_t, 2>(pass, src, dst, b, i, dv); break;
          case 3: select_argmax_row<scalar_t, 3>(pass, src, dst, b, i, dv); break;
          default: select_argmax_row<scalar_t, 0>(pass, src, dst, b, i, dv);
        }
      }
    });
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(tfgrads, CPU, m) {
  m.impl("_fractional_avg_pool_grad_backward", &fractional_avg_pool_grad_backward_cpu);
  m.impl("_fractional_max_pool_grad_backward", &fractional_max_pool_grad_backward_cpu);
  m.impl("fractional_avg_pool", &fractional_pool_cpu<false>);
  m.impl("fractional_max_pool", &fractional_pool_cpu<true>);
  m.impl("fractional_avg_pool_grad", &fractional_avg_pool_grad_cpu);
  m.impl("fractional_max_pool_grad", &fractional_max_pool_grad_cpu);
}

}  // namespace torch_tfgrads
