// CPU kernels of the FractionalPool family, bit-identical to TF 2.21's Eigen kernels for TF's
// dtypes (../shared/spec/batchnorm_fracpool.md §8-§10).
//
// Design:
// * NHWC with any batch/row/column strides is read in place (one copy only when the channels
//   are not contiguous); the output is contiguous NHWC.
// * Forward: parallel over (batch, output row); each cell is reduced over channel blocks held
//   in Vectorized registers, in TF's scan order (rows outer, columns inner), so every lane
//   performs exactly TF's sequence of float operations. Half types accumulate in float.
// * Gradients gather instead of scattering: each input element sums the contributions of the
//   (at most 2x2) cells covering it, in TF's cell order. No atomics, no races, deterministic,
//   and the same rounding as TF's scatter (avg: double accumulator, then one cast).
// * Max gradient: pass 1 recomputes every cell's argmax (first maximum in scan order, TF's tie
//   rule) and checks it against orig_output; pass 2 gathers out_backprop through it.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <limits>
#include <type_traits>
#include <vector>

#include "common/fractional_pool.h"
#include "cpu/widen.h"

namespace torch_tfgrads {
namespace {

using fracpool::AxisPlan;
using fracpool::GradPlan;

template <typename scalar_t>
using acc_t = std::conditional_t<std::is_same_v<scalar_t, c10::Half> ||
                                     std::is_same_v<scalar_t, c10::BFloat16>,
                                 float, scalar_t>;

// Channels contiguous (stride 1), any other strides: used in place.
at::Tensor channels_contiguous(const at::Tensor& t) {
  return (t.size(3) <= 1 || t.stride(3) == 1) ? t : t.contiguous();
}

// Parallel grain: about 32K input elements per task.
int64_t grain_for(int64_t elems_per_item) {
  return std::max<int64_t>(1, 32768 / std::max<int64_t>(1, elems_per_item));
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
  at::parallel_for(0, N * OH, grain_for(per_row), [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / OH, i = item % OH;
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
    if (at::isIntegralType(x.scalar_type(), /*includeBool=*/false)) {
      AT_DISPATCH_INDEX_TYPES(x.scalar_type(), op, [&] {
        pool_kernel<index_t, kMax>(x, out, rp, cp);
      });
    } else {
      AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), op, [&] {
        pool_kernel<scalar_t, kMax>(x, out, rp, cp);
      });
    }
  }
  return {out, rows, cols};
}

// ---- FractionalAvgPoolGrad --------------------------------------------------------------------
// dx[b,h,w,:] = T(sum over covering cells (r, c), in TF's order, of double(dy[b,r,c,:]) / n).
template <typename scalar_t>
void avg_grad_kernel(const at::Tensor& dy, at::Tensor& dx, const GradPlan& g) {
  const int64_t H = g.H, W = g.W, C = g.C;
  const int64_t sN = dy.stride(0), sH = dy.stride(1), sW = dy.stride(2);
  const scalar_t* dyp = dy.const_data_ptr<scalar_t>();
  scalar_t* dxp = dx.mutable_data_ptr<scalar_t>();
  const AxisPlan& rows = g.rows;
  const AxisPlan& cols = g.cols;
  at::parallel_for(0, g.N * H, grain_for(W * C), [&](int64_t begin, int64_t end) {
    std::vector<double> acc(C);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / H, h = item % H;
      const int64_t r_first = rows.first[h], r_last = rows.last[h];
      for (int64_t w = 0; w < W; ++w) {
        scalar_t* o = dxp + (item * W + w) * C;
        const int64_t c_first = cols.first[w], c_last = cols.last[w];
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t r = r_first; r <= r_last; ++r) {
          for (int64_t c = c_first; c <= c_last; ++c) {
            const double n = static_cast<double>(rows.count(r) * cols.count(c));
            const scalar_t* p = dyp + b * sN + r * sH + c * sW;
            double* a = acc.data();
            for (int64_t d = 0; d < C; ++d) a[d] += static_cast<double>(p[d]) / n;
          }
        }
        if constexpr (std::is_integral_v<scalar_t>) {
          // TF's static_cast truncates toward zero; we also saturate instead of overflowing.
          constexpr double lo = static_cast<double>(std::numeric_limits<scalar_t>::lowest());
          constexpr double hi = static_cast<double>(std::numeric_limits<scalar_t>::max());
          for (int64_t d = 0; d < C; ++d)
            o[d] = acc[d] <= lo ? std::numeric_limits<scalar_t>::lowest()
                 : acc[d] >= hi ? std::numeric_limits<scalar_t>::max()
                                : static_cast<scalar_t>(acc[d]);
        } else {
          for (int64_t d = 0; d < C; ++d) o[d] = static_cast<scalar_t>(acc[d]);
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
  const at::Tensor dy = channels_contiguous(out_backprop);
  at::Tensor dx = at::empty({g.N, g.H, g.W, g.C}, out_backprop.options());
  if (at::isIntegralType(dy.scalar_type(), false)) {
    AT_DISPATCH_INDEX_TYPES(dy.scalar_type(), op, [&] { avg_grad_kernel<index_t>(dy, dx, g); });
  } else {
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dy.scalar_type(), op, [&] {
      avg_grad_kernel<scalar_t>(dy, dx, g);
    });
  }
  return dx;
}

// ---- FractionalMaxPoolGrad --------------------------------------------------------------------
// Pass 1: argmax of every (b, i, j, d) as the flat NHWC index into x; false if a recomputed max
// differs from orig_output (TF's "tensor_out_dup" check; a NaN first in its cell fails it).
template <typename scalar_t>
bool argmax_pass(const at::Tensor& x, const at::Tensor& y, int64_t* argmax, const GradPlan& g) {
  using A = acc_t<scalar_t>;
  const int64_t H = g.H, W = g.W, C = g.C, OH = g.rows.cells, OW = g.cols.cells;
  const int64_t sN = x.stride(0), sH = x.stride(1), sW = x.stride(2);
  const scalar_t* xp = x.const_data_ptr<scalar_t>();
  const scalar_t* yp = y.const_data_ptr<scalar_t>();
  std::atomic<bool> same{true};
  at::parallel_for(0, g.N * OH, grain_for((H / OH + 1) * W * C), [&](int64_t begin, int64_t end) {
    std::vector<A> best(C);
    bool ok = true;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / OH, i = item % OH;
      const int64_t r0 = g.rows.start[i], r1 = g.rows.end[i];
      for (int64_t j = 0; j < OW; ++j) {
        const int64_t c0 = g.cols.start[j], c1 = g.cols.end[j];
        int64_t* arg = argmax + (item * OW + j) * C;
        // The first element of the cell is taken unconditionally (TF's `arg == -1` branch).
        const scalar_t* first = xp + b * sN + r0 * sH + c0 * sW;
        const int64_t first_index = ((b * H + r0) * W + c0) * C;
        for (int64_t d = 0; d < C; ++d) {
          best[d] = static_cast<A>(first[d]);
          arg[d] = first_index + d;
        }
        for (int64_t h = r0; h <= r1; ++h) {
          for (int64_t w = (h == r0 ? c0 + 1 : c0); w <= c1; ++w) {
            const scalar_t* p = xp + b * sN + h * sH + w * sW;
            const int64_t index = ((b * H + h) * W + w) * C;
            for (int64_t d = 0; d < C; ++d) {
              const A v = static_cast<A>(p[d]);
              if (best[d] < v) {
                best[d] = v;
                arg[d] = index + d;
              }
            }
          }
        }
        const scalar_t* out = yp + (item * OW + j) * C;
        for (int64_t d = 0; d < C; ++d) ok &= (best[d] == static_cast<A>(out[d]));
      }
    }
    if (!ok) same = false;
  });
  return same;
}

// Pass 2: dx[e] = sum, over the cells covering e in TF's order, of dy where argmax == e.
template <typename scalar_t>
void max_grad_gather(const at::Tensor& dy, const int64_t* argmax, at::Tensor& dx,
                     const GradPlan& g) {
  using A = acc_t<scalar_t>;
  const int64_t H = g.H, W = g.W, C = g.C, OH = g.rows.cells, OW = g.cols.cells;
  const scalar_t* dyp = dy.const_data_ptr<scalar_t>();
  scalar_t* dxp = dx.mutable_data_ptr<scalar_t>();
  at::parallel_for(0, g.N * H, grain_for(W * C), [&](int64_t begin, int64_t end) {
    std::vector<A> acc(C);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / H, h = item % H;
      for (int64_t w = 0; w < W; ++w) {
        const int64_t index = (item * W + w) * C;
        std::fill(acc.begin(), acc.end(), A(0));
        for (int64_t r = g.rows.first[h]; r <= g.rows.last[h]; ++r) {
          for (int64_t c = g.cols.first[w]; c <= g.cols.last[w]; ++c) {
            const int64_t k = ((b * OH + r) * OW + c) * C;
            const int64_t* arg = argmax + k;
            const scalar_t* grad = dyp + k;
            for (int64_t d = 0; d < C; ++d) {
              const A v = arg[d] == index + d ? static_cast<A>(grad[d]) : A(0);
              if constexpr (std::is_integral_v<A>) {
                acc[d] = wrap_add(acc[d], v);
              } else {
                acc[d] = acc[d] + v;  // + 0 where not the argmax: same value, same rounding
              }
            }
          }
        }
        for (int64_t d = 0; d < C; ++d) dxp[index + d] = static_cast<scalar_t>(acc[d]);
      }
    }
  });
}

template <typename scalar_t>
void max_grad_kernel(const at::Tensor& x, const at::Tensor& y, const at::Tensor& dy,
                     at::Tensor& dx, const GradPlan& g) {
  std::vector<int64_t> argmax(static_cast<size_t>(y.numel()));
  TORCH_CHECK(argmax_pass<scalar_t>(x, y, argmax.data(), g), "fractional_max_pool_grad: "
              "argument 'orig_output': ", fracpool::kOutputMismatch,
              " (orig_output is not the fractional max pool of orig_input with these sequences)");
  max_grad_gather<scalar_t>(dy, argmax.data(), dx, g);
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
  if (at::isIntegralType(x.scalar_type(), false)) {
    AT_DISPATCH_INDEX_TYPES(x.scalar_type(), op, [&] {
      max_grad_kernel<index_t>(x, y, dy, dx, g);
    });
  } else {
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), op, [&] {
      max_grad_kernel<scalar_t>(x, y, dy, dx, g);
    });
  }
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
  if (at::isIntegralType(x.scalar_type(), false)) {
    AT_DISPATCH_INDEX_TYPES(x.scalar_type(), op, [&] {
      pool_kernel<index_t, false>(x, out, g.rows, g.cols);
    });
  } else {
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), op, [&] {
      pool_kernel<scalar_t, false>(x, out, g.rows, g.cols);
    });
  }
  return out;
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
  const at::Tensor y = orig_output.contiguous();
  const at::Tensor gin = grad.contiguous();
  at::Tensor out = at::empty(y.sizes(), grad.options());
  std::vector<int64_t> argmax(static_cast<size_t>(y.numel()));
  auto gather = [&](auto tag) {
    using scalar_t = decltype(tag);
    argmax_pass<scalar_t>(x, y, argmax.data(), g);  // a mismatch was reported by the grad op
    const scalar_t* src = gin.const_data_ptr<scalar_t>();
    scalar_t* dst = out.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, y.numel(), 32768, [&](int64_t begin, int64_t end) {
      for (int64_t k = begin; k < end; ++k) dst[k] = src[argmax[k]];
    });
  };
  if (at::isIntegralType(x.scalar_type(), false)) {
    AT_DISPATCH_INDEX_TYPES(x.scalar_type(), op, [&] { gather(index_t{}); });
  } else {
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), op, [&] {
      gather(scalar_t{});
    });
  }
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
