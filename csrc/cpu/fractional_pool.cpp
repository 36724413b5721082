// CPU kernels of the FractionalPool family, bit-identical to TF 2.21's Eigen kernels for TF's
// dtypes (docs/ops/fractional_pool.md).
//
// Design:
// * NHWC with any batch/row/column strides is read in place (one copy only when the channels
//   are not contiguous); the output is contiguous NHWC.
// * Forward: parallel over (batch, output row); each cell is reduced over channel blocks held
//   in Vectorized registers, in TF's scan order (rows outer, columns inner), so every lane
//   performs exactly TF's sequence of float operations, as straight-line code per cell-row
//   height and widest cell (row_vectors). Half types accumulate in float.
// * Avg gradient: gathers instead of scattering: each input element sums the contributions of
//   the (at most 2x2) cells covering it, in TF's cell order. No atomics, no races,
//   deterministic, and the same rounding as TF's scatter (double accumulator, then one cast).
// * Max gradient: each cell's argmax (first maximum in scan order, TF's tie rule) is
//   recomputed and checked against orig_output. Disjoint cells then write their elements, dy
//   at the argmax and 0 elsewhere (MaxGradPass); overlapping cells are walked once, dx row by
//   dx row, each element visited for every cell covering it and written once, its terms added
//   in TF's order (OnePassMaxGrad; the AVX-512 kernel keeps a cell row's argmaxes and gathers
//   each dx row from them). Its double backward selects grad at the same argmax.
//
// Files: this one holds the pooling, the avg gradient and its double backward, and registers
// the family's ops; fractional_max_pool_grad.cpp (with fractional_max_pool_grad_pass.h,
// fractional_max_pool_grad_one_pass.h and, for AVX-512, fractional_max_pool_grad_avx512.cpp)
// the max gradient and its double backward;
// fractional_pool_cpu.h what they share.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "common/fractional_pool.h"
#include "cpu/fractional_pool_cpu.h"
#include "cpu/widen.h"

namespace torch_tfgrads {
namespace fracpool_cpu {
namespace {

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

// The cells of one output row, channels [0, dv) in whole vectors, as straight-line code for
// cells of RH rows and at most CW columns: loops over the irregular 1-2-1-2 cell sizes
// mispredict at almost every cell. A narrower cell repeats its last column: for the max that
// never changes the result (TF's `out < v` keeps the first of equal values); the average adds
// it masked to +0, which leaves TF's row-major sum unchanged (a sum from +0 is never -0).
template <typename scalar_t, bool kMax, int RH, int CW>
void row_vectors(const scalar_t* xr, int64_t sH, int64_t sW, const AxisPlan& cols, int64_t C,
                 int64_t dv, scalar_t* out) {
  using A = acc_t<scalar_t>;
  using Wd = Widen<scalar_t, A>;
  using Vec = Vectorized<A>;
  constexpr int64_t L = Vec::size();
  const Vec init(kMax ? static_cast<A>(std::numeric_limits<scalar_t>::lowest()) : A(0));
  const Vec keep[2] = {Vec(A(0)), Vec(A(0)) == Vec(A(0))};  // all bits clear, all set
  for (int64_t j = 0; j < cols.cells; ++j) {
    const int64_t c0 = cols.start[j], last = cols.end[j] - c0;
    const scalar_t* xc = xr + c0 * sW;
    scalar_t* o = out + j * C;
    const Vec count(static_cast<A>(RH * (last + 1)));
    for (int64_t d = 0; d < dv; d += L) {
      Vec acc = init;
#pragma GCC unroll 4
      for (int64_t h = 0; h < RH; ++h) {
#pragma GCC unroll 4
        for (int64_t w = 0; w < CW; ++w) {
          const Vec v = Wd::load(xc + h * sH + std::min(w, last) * sW + d);
          if constexpr (kMax)
            acc = Vec::blendv(acc, v, acc < v);
          else
            acc = acc + (v & keep[w <= last]);
        }
      }
      if constexpr (!kMax) acc = acc / count;
      Wd::store(o + d, acc);
    }
  }
}

// The straight-line row for this cell-row height and widest cell; false if none applies.
template <typename scalar_t, bool kMax, int RH>
bool row_fixed(const scalar_t* xr, int64_t sH, int64_t sW, const AxisPlan& cols, int64_t cw_max,
               int64_t C, int64_t dv, scalar_t* out) {
  switch (cw_max) {
    case 1: row_vectors<scalar_t, kMax, RH, 1>(xr, sH, sW, cols, C, dv, out); return true;
    case 2: row_vectors<scalar_t, kMax, RH, 2>(xr, sH, sW, cols, C, dv, out); return true;
    case 3: row_vectors<scalar_t, kMax, RH, 3>(xr, sH, sW, cols, C, dv, out); return true;
    default: return false;
  }
}

template <typename scalar_t, bool kMax>
void pool_kernel(const at::Tensor& x, at::Tensor& out, const AxisPlan& rows, const AxisPlan& cols) {
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
      if constexpr (kVector) {
        const int64_t dv = C / L * L;
        const scalar_t* xr = xp + b * sN + rows.start[i] * sH;
        scalar_t* o = op + item * OW * C;
        bool done = false;
        switch (rows.count(i)) {
          case 1: done = row_fixed<scalar_t, kMax, 1>(xr, sH, sW, cols, cw_max, C, dv, o); break;
          case 2: done = row_fixed<scalar_t, kMax, 2>(xr, sH, sW, cols, cw_max, C, dv, o); break;
          case 3: done = row_fixed<scalar_t, kMax, 3>(xr, sH, sW, cols, cw_max, C, dv, o); break;
        }
        if (done) {
          if (dv < C)
            for (int64_t j = 0; j < OW; ++j)
              reduce_scalars<scalar_t, kMax>(
                  Cell{xp + b * sN, sH, sW, rows.start[i], rows.end[i], cols.start[j], cols.end[j]},
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
    fracpool::dispatch_value_types(
        x.scalar_type(), [&](auto tag) { pool_kernel<decltype(tag), kMax>(x, out, rp, cp); });
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
      return v <= lo   ? std::numeric_limits<scalar_t>::lowest()
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
                                        const at::Tensor& col_pooling_sequence, bool overlapping) {
  constexpr const char* op = "fractional_avg_pool_grad";
  const auto shape = C10_AS_INTARRAYREF_SLOW(orig_input_tensor_shape);
  const GradPlan g = fracpool::check_avg_grad(op, shape, out_backprop, row_pooling_sequence,
                                              col_pooling_sequence, overlapping);
  const at::Tensor dy = channels_contiguous(fracpool::pad_out_backprop(out_backprop, g));
  at::Tensor dx = at::empty({g.N, g.H, g.W, g.C}, out_backprop.options());
  fracpool::dispatch_value_types(dy.scalar_type(),
                                 [&](auto tag) { avg_grad_kernel<decltype(tag)>(dy, dx, g); });
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

}  // namespace
}  // namespace fracpool_cpu

TORCH_LIBRARY_IMPL(tfgrads, CPU, m) {
  using namespace fracpool_cpu;
  m.impl("_fractional_avg_pool_grad_backward", &fractional_avg_pool_grad_backward_cpu);
  m.impl("_fractional_max_pool_grad_backward", &fractional_max_pool_grad_backward_cpu);
  m.impl("fractional_avg_pool", &fractional_pool_cpu<false>);
  m.impl("fractional_max_pool", &fractional_pool_cpu<true>);
  m.impl("fractional_avg_pool_grad", &fractional_avg_pool_grad_cpu);
  m.impl("fractional_max_pool_grad", &fractional_max_pool_grad_cpu);
}

}  // namespace torch_tfgrads
