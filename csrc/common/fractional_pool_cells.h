// The per-element bodies of the FractionalPool CUDA kernels, as host-device functions: the CUDA
// kernels are grid-stride loops around them, and a host loop around the same functions
// (tfgrads_test::fractional_pool_cells, csrc/cpu/fractional_pool_cells.cpp) is compared with the
// CPU kernels bit for bit by the CPU test suite, so the GPU's arithmetic is checked where no GPU
// exists. Each body computes one output element from its linear NHWC index k.
#pragma once

#include <ATen/OpMathType.h>
#include <c10/macros/Macros.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <limits>
#include <type_traits>

namespace torch_tfgrads {
namespace fracpool {

// The cell plans (AxisPlan's arrays, common/fractional_pool.h) as raw pointers, on the device or
// on the host.
struct PlanView {
  const int64_t *row_start, *row_end, *row_first, *row_last;
  const int64_t *col_start, *col_end, *col_first, *col_last;
};

// Sum type: TF sums in T; half types in float.
template <typename scalar_t>
using sum_t =
    std::conditional_t<std::is_integral<scalar_t>::value, scalar_t, at::opmath_type<scalar_t>>;

template <typename T>
C10_HOST_DEVICE inline T cell_add(T a, T b) {
  if constexpr (std::is_integral<T>::value) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));  // wraps like TF's int sum
  } else {
    return a + b;
  }
}

template <typename scalar_t>
C10_HOST_DEVICE inline scalar_t cell_lowest() {
  if constexpr (std::is_same<scalar_t, at::Half>::value) {
    return at::Half(0xFBFF, at::Half::from_bits());  // -65504
  } else if constexpr (std::is_same<scalar_t, at::BFloat16>::value) {
    return at::BFloat16(0xFF7F, at::BFloat16::from_bits());
  } else {
    return std::numeric_limits<scalar_t>::lowest();
  }
}

// Output element k of the pool over x (strides sN, sH, sW; channels contiguous).
template <typename scalar_t, bool kMax>
C10_HOST_DEVICE inline scalar_t pool_cell(const scalar_t* x, int64_t sN, int64_t sH, int64_t sW,
                                          const PlanView& plan, int64_t OH, int64_t OW, int64_t C,
                                          int64_t k) {
  using A = sum_t<scalar_t>;
  const int64_t d = k % C, j = (k / C) % OW, i = (k / (C * OW)) % OH, b = k / (C * OW * OH);
  const int64_t r0 = plan.row_start[i], r1 = plan.row_end[i];
  const int64_t c0 = plan.col_start[j], c1 = plan.col_end[j];
  const scalar_t* base = x + b * sN + d;
  A acc = kMax ? static_cast<A>(cell_lowest<scalar_t>()) : A(0);
  for (int64_t h = r0; h <= r1; ++h) {
    for (int64_t w = c0; w <= c1; ++w) {
      const A v = static_cast<A>(base[h * sH + w * sW]);
      if constexpr (kMax) {
        acc = acc < v ? v : acc;  // TF's CPU max: first of equals, NaN skipped
      } else {
        acc = cell_add(acc, v);
      }
    }
  }
  if constexpr (!kMax) acc = acc / static_cast<A>((r1 - r0 + 1) * (c1 - c0 + 1));
  return static_cast<scalar_t>(acc);
}

// Input element k of FractionalAvgPoolGrad: the covering cells' dy / count, summed in double in
// TF's order, one rounding (integers saturate).
template <typename scalar_t>
C10_HOST_DEVICE inline scalar_t avg_grad_element(const scalar_t* dy, int64_t sN, int64_t sH,
                                                 int64_t sW, const PlanView& plan, int64_t H,
                                                 int64_t W, int64_t C, int64_t k) {
  const int64_t d = k % C, w = (k / C) % W, h = (k / (C * W)) % H, b = k / (C * W * H);
  double acc = 0.0;
  for (int64_t r = plan.row_first[h]; r <= plan.row_last[h]; ++r) {
    const int64_t rows = plan.row_end[r] - plan.row_start[r] + 1;
    for (int64_t c = plan.col_first[w]; c <= plan.col_last[w]; ++c) {
      const double n = static_cast<double>(rows * (plan.col_end[c] - plan.col_start[c] + 1));
      acc += static_cast<double>(dy[b * sN + r * sH + c * sW + d]) / n;
    }
  }
  if constexpr (std::is_integral<scalar_t>::value) {
    const double lo = static_cast<double>(std::numeric_limits<scalar_t>::lowest());
    const double hi = static_cast<double>(std::numeric_limits<scalar_t>::max());
    return acc <= lo   ? std::numeric_limits<scalar_t>::lowest()
           : acc >= hi ? std::numeric_limits<scalar_t>::max()
                       : static_cast<scalar_t>(acc);
  } else {
    return static_cast<scalar_t>(acc);
  }
}

// The flat NHWC input index of the first maximum of output element k's cell (TF's scan order);
// *best receives the maximum, for the check against orig_output.
template <typename scalar_t>
C10_HOST_DEVICE inline int64_t argmax_cell(const scalar_t* x, int64_t sN, int64_t sH, int64_t sW,
                                           const PlanView& plan, int64_t H, int64_t W, int64_t OH,
                                           int64_t OW, int64_t C, int64_t k,
                                           sum_t<scalar_t>* best) {
  using A = sum_t<scalar_t>;
  const int64_t d = k % C, j = (k / C) % OW, i = (k / (C * OW)) % OH, b = k / (C * OW * OH);
  const int64_t r0 = plan.row_start[i], r1 = plan.row_end[i];
  const int64_t c0 = plan.col_start[j], c1 = plan.col_end[j];
  const scalar_t* base = x + b * sN + d;
  A top = static_cast<A>(base[r0 * sH + c0 * sW]);  // first element: TF's `arg == -1` case
  int64_t arg = ((b * H + r0) * W + c0) * C + d;
  for (int64_t h = r0; h <= r1; ++h) {
    for (int64_t w = (h == r0 ? c0 + 1 : c0); w <= c1; ++w) {
      const A v = static_cast<A>(base[h * sH + w * sW]);
      if (top < v) {
        top = v;
        arg = ((b * H + h) * W + w) * C + d;
      }
    }
  }
  *best = top;
  return arg;
}

// Input element k of FractionalMaxPoolGrad: dy of the covering cells whose argmax is k, summed
// in the sum type in TF's order (half types: in float32, rounded once, as documented).
template <typename scalar_t>
C10_HOST_DEVICE inline scalar_t max_grad_element(const scalar_t* dy, const int64_t* argmax,
                                                 const PlanView& plan, int64_t H, int64_t W,
                                                 int64_t OH, int64_t OW, int64_t C, int64_t k) {
  using A = sum_t<scalar_t>;
  const int64_t d = k % C, w = (k / C) % W, h = (k / (C * W)) % H, b = k / (C * W * H);
  A acc = A(0);
  for (int64_t r = plan.row_first[h]; r <= plan.row_last[h]; ++r) {
    for (int64_t c = plan.col_first[w]; c <= plan.col_last[w]; ++c) {
      const int64_t o = ((b * OH + r) * OW + c) * C + d;
      if (argmax[o] == k) acc = cell_add(acc, static_cast<A>(dy[o]));
    }
  }
  return static_cast<scalar_t>(acc);
}

}  // namespace fracpool
}  // namespace torch_tfgrads
