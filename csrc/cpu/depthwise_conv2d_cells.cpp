// A host replay of the DepthwiseConv2dNative CUDA kernels for the CPU tests only
// (tfgrads_test::depthwise_conv2d_cells): the same checks, layout choice and launch plan, each
// output element through the kernels' host-device bodies (common/depthwise_conv2d_cells.h), and
// the filter gradient in the GPU's order: every (chunk, tap, channel) block's 8 thread rows, their
// row-order sum, then the chunks in order. Returns the result and [chunks, pixels per chunk,
// workspace bytes] of the filter gradient's plan (zeros for the other kinds).
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "common/channel_layout.h"
#include "common/depthwise_conv2d.h"
#include "common/depthwise_conv2d_cells.h"
#include "common/launch_geometry.h"

namespace torch_tfgrads {
namespace {

using depthwise::Dims;
using depthwise::Geometry;

constexpr const char* kOp = "tfgrads_test::depthwise_conv2d_cells";

Dims dims_of(const Geometry& g) {
  return Dims{g.N, g.H, g.W, g.C, g.M, g.fh, g.fw, g.Ho, g.Wo, g.sH, g.sW, g.dH, g.dW, g.pt, g.pl};
}

// out[e] = body(e) for every element, with the layout's channels-last flag as a template value.
template <typename Body>
void for_each(at::Tensor& out, bool channels_last, const Body& body) {
  at::parallel_for(0, out.numel(), 4096, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      if (channels_last)
        body(std::true_type{}, i);
      else
        body(std::false_type{}, i);
    }
  });
}

template <typename scalar_t, bool kCL>
void filter_grad(const scalar_t* x, const scalar_t* dy, const Dims& d,
                 const launch::DwFilterGradPlan& plan, scalar_t* df) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t CM = d.C * d.M, taps = d.fh * d.fw, P = d.N * d.Ho * d.Wo, elems = taps * CM;
  std::vector<acc_t> part(static_cast<size_t>(plan.chunks * elems));
  at::parallel_for(0, plan.chunks * taps, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t k = t / taps, tap = t % taps;
      int64_t p0, p1;
      depthwise::chunk_range(k, plan.per_chunk, P, &p0, &p1);
      for (int64_t oc = 0; oc < CM; ++oc) {
        acc_t rows[depthwise::kFilterGradRows];
        for (int r = 0; r < depthwise::kFilterGradRows; ++r)
          rows[r] = depthwise::filter_grad_thread<scalar_t, acc_t, kCL>(x, dy, d, oc, tap, p0, p1,
                                                                        r);
        part[(k * taps + tap) * CM + oc] = depthwise::filter_grad_block_sum(rows, 1);
      }
    }
  });
  for (int64_t e = 0; e < elems; ++e)
    df[e] = depthwise::filter_grad_chunks_sum<scalar_t>(part.data(), elems, plan.chunks, e);
}

std::tuple<at::Tensor, at::Tensor> depthwise_conv2d_cells(
    c10::string_view kind, const at::Tensor& a, const at::Tensor& b, c10::IntArrayRef sizes,
    c10::IntArrayRef strides, c10::string_view padding, c10::IntArrayRef explicit_paddings,
    c10::string_view data_format, c10::IntArrayRef dilations) {
  const std::string k(kind);
  std::vector<int64_t> info{0, 0, 0};
  at::Tensor out;
  if (k == "forward") {  // a = input, b = filter
    const Geometry g = depthwise::check_forward(kOp, a, b, strides, padding, explicit_paddings,
                                                data_format, dilations);
    const ChannelLayout l = choose_channel_layout(a, g.cdim(), !g.nchw);
    out = empty_in_layout(g.output_shape(), l, a.options());
    const at::Tensor x = to_physical(a, l), f = b.contiguous();
    at::Tensor o = out.permute(l.perm);  // dense in the layout's order
    const Dims d = dims_of(g);
    depthwise::dispatch_float_types(a.scalar_type(), [&](auto tag) {
      using scalar_t = decltype(tag);
      using acc_t = at::opmath_type<scalar_t>;
      const scalar_t *px = x.const_data_ptr<scalar_t>(), *pf = f.const_data_ptr<scalar_t>();
      scalar_t* po = o.data_ptr<scalar_t>();
      for_each(o, l.channels_last, [&](auto cl, int64_t e) {
        po[e] = depthwise::forward_element<scalar_t, acc_t, decltype(cl)::value>(px, pf, d, e);
      });
    });
  } else if (k == "backprop_input") {  // sizes = input_sizes, a = filter, b = out_backprop
    const Geometry g = depthwise::check_backprop_input(kOp, sizes, a, b, strides, padding,
                                                       explicit_paddings, data_format, dilations);
    const ChannelLayout l = choose_channel_layout(b, g.cdim(), !g.nchw);
    out = empty_in_layout(g.input_shape(), l, b.options());
    const at::Tensor dy = to_physical(b, l), f = a.contiguous();
    at::Tensor o = out.permute(l.perm);
    const Dims d = dims_of(g);
    depthwise::dispatch_float_types(a.scalar_type(), [&](auto tag) {
      using scalar_t = decltype(tag);
      using acc_t = at::opmath_type<scalar_t>;
      const scalar_t *pf = f.const_data_ptr<scalar_t>(), *pdy = dy.const_data_ptr<scalar_t>();
      scalar_t* po = o.data_ptr<scalar_t>();
      for_each(o, l.channels_last, [&](auto cl, int64_t e) {
        po[e] = depthwise::backprop_input_element<scalar_t, acc_t, decltype(cl)::value>(pf, pdy, d,
                                                                                        e);
      });
    });
  } else {  // backprop_filter: a = input, sizes = filter_sizes, b = out_backprop
    TORCH_CHECK(k == "backprop_filter", kOp, ": kind must be forward, backprop_input or ",
                "backprop_filter");
    const Geometry g = depthwise::check_backprop_filter(kOp, a, sizes, b, strides, padding,
                                                        explicit_paddings, data_format, dilations);
    out = at::zeros(g.filter_shape(), a.options());
    if (out.numel() == 0 || a.numel() == 0 || b.numel() == 0)
      return {out, at::tensor(info, at::kLong)};
    const ChannelLayout l = choose_channel_layout(a, g.cdim(), !g.nchw);
    const at::Tensor x = to_physical(a, l), dy = to_physical(b, l);
    const Dims d = dims_of(g);
    depthwise::dispatch_float_types(a.scalar_type(), [&](auto tag) {
      using scalar_t = decltype(tag);
      using acc_t = at::opmath_type<scalar_t>;
      const launch::DwFilterGradPlan plan = launch::dw_filter_grad_plan(
          g.N * g.Ho * g.Wo, g.fh * g.fw, g.C * g.M, sizeof(acc_t));
      info = {plan.chunks, plan.per_chunk, plan.workspace_bytes};
      if (l.channels_last)
        filter_grad<scalar_t, true>(x.const_data_ptr<scalar_t>(), dy.const_data_ptr<scalar_t>(), d,
                                    plan, out.data_ptr<scalar_t>());
      else
        filter_grad<scalar_t, false>(x.const_data_ptr<scalar_t>(), dy.const_data_ptr<scalar_t>(), d,
                                     plan, out.data_ptr<scalar_t>());
    });
  }
  return {out, at::tensor(info, at::kLong)};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(tfgrads_test, m) {
  m.def(
      "depthwise_conv2d_cells(str kind, Tensor a, Tensor b, int[] sizes, int[] strides, "
      "str padding, int[] explicit_paddings, str data_format, int[] dilations) -> (Tensor, "
      "Tensor)");
}

TORCH_LIBRARY_IMPL(tfgrads_test, CPU, m) {
  m.impl("depthwise_conv2d_cells", &depthwise_conv2d_cells);
}

}  // namespace torch_tfgrads
