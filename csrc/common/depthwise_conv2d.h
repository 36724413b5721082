// Argument checks and geometry shared by the CPU and CUDA kernels of the DepthwiseConv2dNative
// family (docs/ops/depthwise_conv2d.md). Host side only.
//
// TF's Eigen-kernel checks with TF's messages (prefixed by op and argument), in TF's order,
// except where we are deliberately more general: unequal row/column strides and dilations are
// supported in all three ops (TF's backprops silently ignore dilations), NCHW runs everywhere.
// Output sizes follow TF's kernel rule (GetWindowedOutputSizeVerbose: C++ truncating
// division), with dilation.
#pragma once

#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/string_view.h>

#include <cstdint>
#include <vector>

namespace torch_tfgrads {
namespace depthwise {

// Everything a kernel needs. Logical shapes: input [N,H,W,C] (NHWC) or [N,C,H,W] (NCHW),
// filter [fh,fw,C,M], output [N,Ho,Wo,C*M] or [N,C*M,Ho,Wo]; output channel c*M+m reads input
// channel c. pt/pl are the top/left zero paddings (bottom/right follow from the sizes).
struct Geometry {
  int64_t N = 0, H = 0, W = 0, C = 0, M = 0, fh = 0, fw = 0, Ho = 0, Wo = 0;
  int64_t sH = 1, sW = 1, dH = 1, dW = 1, pt = 0, pl = 0;
  bool nchw = false;
  int64_t cdim() const { return nchw ? 1 : 3; }
  std::vector<int64_t> input_shape() const;   // in data_format order
  std::vector<int64_t> output_shape() const;  // in data_format order
  std::vector<int64_t> filter_shape() const { return {fh, fw, C, M}; }
};

Geometry check_forward(const char* op, const at::Tensor& input, const at::Tensor& filter,
                       c10::IntArrayRef strides, c10::string_view padding,
                       c10::IntArrayRef explicit_paddings, c10::string_view data_format,
                       c10::IntArrayRef dilations);

Geometry check_backprop_input(const char* op, c10::IntArrayRef input_sizes,
                              const at::Tensor& filter, const at::Tensor& out_backprop,
                              c10::IntArrayRef strides, c10::string_view padding,
                              c10::IntArrayRef explicit_paddings, c10::string_view data_format,
                              c10::IntArrayRef dilations);

Geometry check_backprop_filter(const char* op, const at::Tensor& input,
                               c10::IntArrayRef filter_sizes, const at::Tensor& out_backprop,
                               c10::IntArrayRef strides, c10::string_view padding,
                               c10::IntArrayRef explicit_paddings, c10::string_view data_format,
                               c10::IntArrayRef dilations);

// One axis of the convolution as lists of taps. For every destination index, the (filter
// index, source index) pairs that contribute to it, in filter order, all in bounds:
//   forward / filter grad: dst = output index o, src = input index  o*s + k*d - p
//   backprop input:        dst = input index x,  src = output index (x + p - k*d) / s, exact
// CSR: taps of dst are [offset[dst], offset[dst+1]).
// in_bounds = false keeps the taps that fall into the padding too (src < 0 or >= the source
// size, within +-2^40): the unclipped pattern that lets the CPU tiles treat the border columns
// like the interior ones, skipping the out-of-bounds sources.
struct AxisTaps {
  std::vector<int64_t> offset, k, src;
  int64_t count(int64_t dst) const { return offset[dst + 1] - offset[dst]; }
};
AxisTaps forward_taps(int64_t out, int64_t in, int64_t k, int64_t s, int64_t d, int64_t p,
                      bool in_bounds = true);
AxisTaps backward_taps(int64_t in, int64_t out, int64_t k, int64_t s, int64_t d, int64_t p,
                       bool in_bounds = true);

// The family's dtypes (TF's): float16, bfloat16, float32, float64.
template <typename Fn>
void dispatch_float_types(at::ScalarType t, Fn&& fn) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, t, "depthwise_conv2d",
                                  [&] { fn(scalar_t{}); });
}

}  // namespace depthwise
}  // namespace torch_tfgrads
