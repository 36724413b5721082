// What the CPU kernels of the FractionalPool family share across their files
// (fractional_pool.cpp: the pooling and the avg gradient; fractional_max_pool_grad.cpp and
// fractional_max_pool_grad_pass.h: the max gradient and its double backward).
#pragma once

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "common/fractional_pool.h"

namespace torch_tfgrads {
namespace fracpool_cpu {

using fracpool::AxisPlan;
using fracpool::channels_contiguous;
using fracpool::GradPlan;

template <typename scalar_t>
using acc_t = std::conditional_t<std::is_same_v<scalar_t, c10::Half> ||
                                     std::is_same_v<scalar_t, c10::BFloat16>,
                                 float, scalar_t>;

// Parallel grain: about 32K input elements per task.
inline int64_t grain_for(int64_t elems_per_item) {
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

// fractional_max_pool_grad.cpp.
at::Tensor fractional_max_pool_grad_cpu(const at::Tensor& orig_input, const at::Tensor& orig_output,
                                        const at::Tensor& out_backprop,
                                        const at::Tensor& row_pooling_sequence,
                                        const at::Tensor& col_pooling_sequence, bool overlapping);
at::Tensor fractional_max_pool_grad_backward_cpu(const at::Tensor& orig_input,
                                                 const at::Tensor& orig_output,
                                                 const at::Tensor& grad,
                                                 const at::Tensor& row_pooling_sequence,
                                                 const at::Tensor& col_pooling_sequence,
                                                 bool overlapping);

}  // namespace fracpool_cpu
}  // namespace torch_tfgrads
