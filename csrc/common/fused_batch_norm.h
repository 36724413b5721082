// FusedBatchNormV3 / FusedBatchNormGradV3: argument checks (TF's, in TF's order, with TF's
// messages prefixed by the op and argument name), output allocation and the empty-input cases.
// Shared by the CPU and CUDA kernels, so that both devices accept and reject the same inputs;
// torch_tfgrads/_meta.py repeats the same checks for fake tensors.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <limits>
#include <string>

#include "common/channel_layout.h"
#include "common/checks.h"

namespace torch_tfgrads {
namespace bn {

constexpr const char* kFwd = "fused_batch_norm_v3";
constexpr const char* kBwd = "fused_batch_norm_grad_v3";

// NHWC/NDHWC: channels last (C is the last dim); NCHW/NCDHW: channel dim 1. As in TF, the
// format family decides, not the rank (TF accepts a 5-D x with "NHWC").
inline bool parse_channels_first(c10::string_view fmt, const char* op) {
  if (fmt == "NHWC" || fmt == "NDHWC") return false;
  if (fmt == "NCHW" || fmt == "NCDHW") return true;
  TORCH_CHECK_VALUE(false, op, ": argument 'data_format': Value for attr 'data_format' of \"",
                    std::string(fmt),
                    "\" is not in the list of allowed values: \"NHWC\", \"NCHW\", "
                    "\"NDHWC\", \"NCDHW\"");
  return false;
}

// Statistics and parameters are float32 (TF's U), or float64 when x is (gradcheck).
inline at::ScalarType param_dtype(const at::Tensor& x, const char* op, const char* name) {
  const auto t = x.scalar_type();
  TORCH_CHECK_TYPE(t == at::kFloat || t == at::kDouble || t == at::kHalf || t == at::kBFloat16, op,
                   ": argument '", name,
                   "' must be float16, bfloat16, float32 or float64, "
                   "got ",
                   c10::toString(t));
  return t == at::kDouble ? at::kDouble : at::kFloat;
}

constexpr const char* kParamWhy = "float32 for float16/bfloat16/float32 x, float64 for float64 x";

inline void check_rank_4_or_5(const at::Tensor& t, const char* op, const char* name) {
  TORCH_CHECK(t.dim() == 4 || t.dim() == 5, op, ": argument '", name,
              "': input must be 4 or 5-dimensional", tf_shape(t.sizes()));
}

inline void check_vector(const at::Tensor& t, const char* op, const char* name,
                         const char* tf_name) {
  TORCH_CHECK(t.dim() == 1, op, ": argument '", name, "': ", tf_name, " must be 1-dimensional",
              tf_shape(t.sizes()));
}

inline void check_channels(const at::Tensor& t, int64_t C, const char* op, const char* name,
                           const char* prefix = "") {
  TORCH_CHECK(t.numel() == C, op, ": argument '", name, "': ", prefix, name,
              " must have the same number of elements as the channels of x, got ", t.numel(),
              " and ", C);
}

// Everything the kernels need to know after the checks.
struct Forward {
  bool channels_first_format = false;
  bool training = true;
  bool uses_running_stats = false;  // mean/variance are read (inference, or factor != 1)
  ChannelLayout layout;
  at::Tensor x_phys;  // x, dense in layout's physical order (a view unless x had odd strides)
  at::Tensor y, y_phys;
  at::Tensor batch_mean, batch_variance, rs1, rs2, rs3;
  bool done = false;  // empty input: every output is already final
};

inline Forward prepare_forward(const at::Tensor& x, const at::Tensor& scale,
                               const at::Tensor& offset, const at::Tensor& mean,
                               const at::Tensor& variance, double exponential_avg_factor,
                               c10::string_view data_format, bool is_training) {
  const char* op = kFwd;
  Forward f;
  f.channels_first_format = parse_channels_first(data_format, op);
  f.training = is_training;
  const auto pdt = param_dtype(x, op, "x");
  check_rank_4_or_5(x, op, "x");
  check_vector(scale, op, "scale", "scale");
  check_vector(offset, op, "offset", "offset");
  check_vector(mean, op, "mean", "estimated_mean");
  check_vector(variance, op, "variance", "estimated_variance");
  const int64_t cdim = f.channels_first_format ? 1 : x.dim() - 1;
  const int64_t C = x.size(cdim);
  check_channels(scale, C, op, "scale");
  check_channels(offset, C, op, "offset");
  // TF reads (and checks) the running statistics only when it uses them; with is_training and
  // a factor of exactly 1 they may have any size (float32 comparison, as TF's attr is a float).
  f.uses_running_stats = !is_training || static_cast<float>(exponential_avg_factor) != 1.0f;
  if (f.uses_running_stats) {
    const char* prefix = is_training ? "When exponential_avg_factor != 1, "
                                     : "When is_training=false, ";
    check_channels(mean, C, op, "mean", prefix);
    check_channels(variance, C, op, "variance", prefix);
  }
  check_dtype(scale, pdt, op, "scale", kParamWhy);
  check_dtype(offset, pdt, op, "offset", kParamWhy);
  check_same_device(x, scale, op, "x", "scale");
  check_same_device(x, offset, op, "x", "offset");
  if (f.uses_running_stats) {
    check_dtype(mean, pdt, op, "mean", kParamWhy);
    check_dtype(variance, pdt, op, "variance", kParamWhy);
    check_same_device(x, mean, op, "x", "mean");
    check_same_device(x, variance, op, "x", "variance");
  }

  f.layout = choose_channel_layout(x, cdim, !f.channels_first_format);
  f.x_phys = to_physical(x, f.layout);
  f.y = empty_in_layout(x.sizes(), f.layout, x.options());
  f.y_phys = f.y.permute(f.layout.perm);
  const auto popts = x.options().dtype(pdt);
  f.batch_mean = at::empty({C}, popts);
  f.batch_variance = at::empty({C}, popts);
  f.rs1 = at::empty({C}, popts);
  f.rs2 = at::empty({C}, popts);
  f.rs3 = at::zeros({}, popts);  // TF's Eigen kernel: a scalar 0 (oneDNN/XLA: shape [0])
  if (is_training) {
    // TF does not read mean/variance here; we copy nothing and compute everything below.
  } else {
    f.rs1.copy_(mean);  // TF's Eigen kernel leaves these uninitialised; we define them
    f.rs2.copy_(variance);
  }
  if (x.numel() == 0) {
    // TF: the statistics of an empty batch are NaN, in training and in inference alike. In
    // training the reserve spaces (the batch moments) are NaN too; in inference they keep the
    // copies of mean/variance made above.
    const double nan = std::numeric_limits<double>::quiet_NaN();
    f.batch_mean.fill_(nan);
    f.batch_variance.fill_(nan);
    if (is_training) {
      f.rs1.fill_(nan);
      f.rs2.fill_(nan);
    }
    f.done = true;
  } else if (!is_training) {
    f.batch_mean.copy_(mean);
    f.batch_variance.copy_(variance);
  }
  return f;
}

struct Backward {
  bool channels_first_format = false;
  ChannelLayout layout;
  at::Tensor x_phys, dy_phys;
  at::Tensor x_backprop, dx_phys, scale_backprop, offset_backprop, rs4, rs5;
  bool done = false;
};

inline Backward prepare_backward(const at::Tensor& y_backprop, const at::Tensor& x,
                                 const at::Tensor& scale, const at::Tensor& reserve_space_1,
                                 const at::Tensor& reserve_space_2, c10::string_view data_format) {
  const char* op = kBwd;
  Backward b;
  b.channels_first_format = parse_channels_first(data_format, op);
  const auto pdt = param_dtype(x, op, "x");
  TORCH_CHECK_TYPE(y_backprop.scalar_type() == x.scalar_type(), op,
                   ": argument 'y_backprop' must have the dtype of x (",
                   c10::toString(x.scalar_type()), "), got ",
                   c10::toString(y_backprop.scalar_type()));
  check_rank_4_or_5(y_backprop, op, "y_backprop");
  check_rank_4_or_5(x, op, "x");
  check_vector(scale, op, "scale", "scale");
  check_vector(reserve_space_1, op, "reserve_space_1", "saved mean");
  check_vector(reserve_space_2, op, "reserve_space_2", "saved variance");
  TORCH_CHECK(x.sizes() == y_backprop.sizes(), op,
              ": argument 'y_backprop': x and y_backprop must have same shape, but x has shape ",
              tf_shape(x.sizes()), " and y_backprop has shape ", tf_shape(y_backprop.sizes()));
  const int64_t cdim = b.channels_first_format ? 1 : x.dim() - 1;
  const int64_t C = x.size(cdim);
  check_channels(scale, C, op, "scale");
  check_channels(reserve_space_1, C, op, "reserve_space_1");
  check_channels(reserve_space_2, C, op, "reserve_space_2");
  check_dtype(scale, pdt, op, "scale", kParamWhy);
  check_dtype(reserve_space_1, pdt, op, "reserve_space_1", kParamWhy);
  check_dtype(reserve_space_2, pdt, op, "reserve_space_2", kParamWhy);
  check_same_device(x, y_backprop, op, "x", "y_backprop");
  check_same_device(x, scale, op, "x", "scale");
  check_same_device(x, reserve_space_1, op, "x", "reserve_space_1");
  check_same_device(x, reserve_space_2, op, "x", "reserve_space_2");

  b.layout = choose_channel_layout(x, cdim, !b.channels_first_format);
  b.x_phys = to_physical(x, b.layout);
  b.dy_phys = to_physical(y_backprop, b.layout);  // copies only if dy's strides differ from x's
  b.x_backprop = empty_in_layout(x.sizes(), b.layout, x.options());
  b.dx_phys = b.x_backprop.permute(b.layout.perm);
  const auto popts = x.options().dtype(pdt);
  b.scale_backprop = at::empty({C}, popts);
  b.offset_backprop = at::empty({C}, popts);
  b.rs4 = at::empty({0}, popts);  // TF's Eigen kernel: empty placeholders
  b.rs5 = at::empty({0}, popts);
  if (x.numel() == 0) {
    b.scale_backprop.zero_();
    b.offset_backprop.zero_();
    b.done = true;
  }
  return b;
}

}  // namespace bn
}  // namespace torch_tfgrads
