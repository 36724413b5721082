// The synchronized batch norm's ops (fused_batch_norm_sync_stats / _grad_sums /
// _backprop_input): argument checks in the style of the FusedBatchNorm family's (same messages
// for the same faults), output allocation and the empty-input cases, shared by the CPU and CUDA
// kernels; torch_tfgrads/ops/fused_batch_norm.py repeats them for fake tensors.
//
// The ops are the local halves of a batch norm whose statistics are summed over processes
// (torch_tfgrads/distributed/sync_batch_norm.py): per-channel sums go out, are all-reduced,
// and come back as arguments. The packed buffers are what travels: one collective per
// direction.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>

#include <utility>

#include "common/channel_layout.h"
#include "common/checks.h"
#include "common/fused_batch_norm.h"

namespace torch_tfgrads {
namespace bn_sync {

constexpr const char* kStats = "fused_batch_norm_sync_stats";
constexpr const char* kGradSums = "fused_batch_norm_sync_grad_sums";
constexpr const char* kBackpropInput = "fused_batch_norm_sync_backprop_input";

// What a kernel needs after the checks: x (and dy) dense in the layout's physical order.
struct Prepared {
  ChannelLayout layout;
  at::Tensor x_phys, dy_phys;
  at::ScalarType pdt = at::kFloat;
  int64_t C = 0;
  int64_t count = 0;  // elements per channel: the product of every other dimension
};

inline Prepared prepare_x(const at::Tensor& x, c10::string_view data_format, const char* op) {
  Prepared p;
  const bool cf = bn::parse_channels_first(data_format, op);
  p.pdt = bn::param_dtype(x, op, "x");
  bn::check_rank_4_or_5(x, op, "x");
  const int64_t cdim = cf ? 1 : x.dim() - 1;
  p.C = x.size(cdim);
  p.count = 1;  // well defined when C == 0 too, so every process reports the same kind of count
  for (int64_t d = 0; d < x.dim(); ++d)
    if (d != cdim) p.count *= x.size(d);
  p.layout = choose_channel_layout(x, cdim, !cf);
  p.x_phys = to_physical(x, p.layout);
  return p;
}

// [sum of x | sum of x^2 | count] per channel: 2C + 1 values of the parameter dtype.
inline Prepared prepare_stats(const at::Tensor& x, c10::string_view data_format) {
  return prepare_x(x, data_format, kStats);
}

// y_backprop like x; mean [C].
inline Prepared prepare_grad(const at::Tensor& y_backprop, const at::Tensor& x,
                             const at::Tensor& mean, c10::string_view data_format, const char* op) {
  Prepared p = prepare_x(x, data_format, op);
  TORCH_CHECK_TYPE(y_backprop.scalar_type() == x.scalar_type(), op,
                   ": argument 'y_backprop' must have the dtype of x (",
                   c10::toString(x.scalar_type()), "), got ",
                   c10::toString(y_backprop.scalar_type()));
  TORCH_CHECK(x.sizes() == y_backprop.sizes(), op,
              ": argument 'y_backprop': x and y_backprop must have same shape, but x has shape ",
              tf_shape(x.sizes()), " and y_backprop has shape ", tf_shape(y_backprop.sizes()));
  bn::check_vector(mean, op, "mean", "mean");
  bn::check_channels(mean, p.C, op, "mean");
  check_dtype(mean, p.pdt, op, "mean", bn::kParamWhy);
  check_same_device(x, y_backprop, op, "x", "y_backprop");
  check_same_device(x, mean, op, "x", "mean");
  p.dy_phys = to_physical(y_backprop, p.layout);
  return p;
}

// A packed buffer argument: 1-D, `n` elements, the parameter dtype, on x's device.
inline void check_packed(const at::Tensor& t, int64_t n, const at::Tensor& x, at::ScalarType pdt,
                         const char* op, const char* name, const char* what) {
  TORCH_CHECK(t.dim() == 1 && t.numel() == n, op, ": argument '", name,
              "' must be a 1-D tensor of ", n, " elements (", what, "), got shape ",
              tf_shape(t.sizes()));
  check_dtype(t, pdt, op, name, bn::kParamWhy);
  check_same_device(x, t, op, "x", name);
}

inline Prepared prepare_backprop_input(const at::Tensor& y_backprop, const at::Tensor& x,
                                       const at::Tensor& scale, const at::Tensor& mean,
                                       const at::Tensor& variance, const at::Tensor& grad_sums,
                                       const at::Tensor& count, c10::string_view data_format) {
  const char* op = kBackpropInput;
  Prepared p = prepare_grad(y_backprop, x, mean, data_format, op);
  for (const auto& [t, name] :
       {std::pair<const at::Tensor&, const char*>{scale, "scale"}, {variance, "variance"}}) {
    bn::check_vector(t, op, name, name);
    bn::check_channels(t, p.C, op, name);
    check_dtype(t, p.pdt, op, name, bn::kParamWhy);
    check_same_device(x, t, op, "x", name);
  }
  check_packed(grad_sums, 2 * p.C, x, p.pdt, op, "grad_sums",
               "the all-reduced sums of y_backprop and y_backprop * (x - mean)");
  check_packed(count, 1, x, p.pdt, op, "count", "the all-reduced element count per channel");
  return p;
}

}  // namespace bn_sync
}  // namespace torch_tfgrads
