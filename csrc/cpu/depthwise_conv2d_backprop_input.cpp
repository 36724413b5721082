// DepthwiseConv2dNativeBackpropInput on the CPU: the forward's channels-last correlation with
// the backward taps (depthwise_conv2d_tiles.cpp), or on channels-first memory a scatter into
// each plane's phase-split buffer.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "common/channel_layout.h"
#include "common/depthwise_conv2d.h"
#include "cpu/depthwise_conv2d_cpu.h"
#include "cpu/depthwise_conv2d_planes.h"
#include "cpu/widen.h"

namespace torch_tfgrads {
namespace depthwise_cpu {
namespace {

constexpr const char* kBwdInput = "depthwise_conv2d_native_backprop_input";

template <typename scalar_t>
void backprop_input_channels_first(const scalar_t* f, const scalar_t* dy, scalar_t* dx,
                                   const Geometry& g) {
  using A = acc_t<scalar_t>;
  using Vec = Vectorized<A>;
  using Wd = Widen<scalar_t, A>;
  constexpr int64_t L = Vec::size();
  const PhasePlane pp = phase_plane<A>(g);
  const int64_t CM = g.C * g.M;
  at::parallel_for(0, g.N * g.C, plane_grain(g), [&](int64_t begin, int64_t end) {
    std::vector<A> buf(pp.size());
    for (int64_t nc = begin; nc < end; ++nc) {
      const int64_t n = nc / g.C, c = nc % g.C;
      std::fill(buf.begin(), buf.end(), A(0));
      for (int64_t m = 0; m < g.M; ++m) {
        const scalar_t* d = dy + (n * CM + c * g.M + m) * g.Ho * g.Wo;
        for (int64_t i = 0; i < g.Ho; ++i) {
          for (int64_t j = 0; j < g.Wo; j += L) {
            const Vec dv = j + L <= g.Wo ? Wd::load(d + i * g.Wo + j)
                                         : load_partial<scalar_t, A>(d + i * g.Wo + j, g.Wo - j);
            for (int64_t di = 0; di < g.fh; ++di) {
              for (int64_t dj = 0; dj < g.fw; ++dj) {
                A* bp = buf.data() + pp.tap(i * g.sH + di * g.dH, dj * g.dW) + j;
                const Vec fv(static_cast<A>(f[(di * g.fw + dj) * CM + c * g.M + m]));
                at::vec::fmadd(dv, fv, Vec::loadu(bp)).store(bp);
              }
            }
          }
        }
      }
      scalar_t* o = dx + nc * g.H * g.W;
      for (int64_t h = 0; h < g.H; ++h) {
        if (g.sW == 1) {
          const A* row = buf.data() + pp.at(h + g.pt, g.pl);
          int64_t w = 0;
          for (; w + L <= g.W; w += L) Wd::store(o + h * g.W + w, Vec::loadu(row + w));
          for (; w < g.W; ++w) o[h * g.W + w] = static_cast<scalar_t>(row[w]);
        } else {
          for (int64_t w = 0; w < g.W; ++w)
            o[h * g.W + w] = static_cast<scalar_t>(buf[pp.at(h + g.pt, w + g.pl)]);
        }
      }
    }
  });
}

}  // namespace

at::Tensor depthwise_conv2d_native_backprop_input_cpu(
    c10::SymIntArrayRef input_sizes, const at::Tensor& filter, const at::Tensor& out_backprop,
    at::IntArrayRef strides, c10::string_view padding, at::OptionalIntArrayRef explicit_paddings,
    c10::string_view data_format, at::IntArrayRef dilations) {
  const Geometry g = depthwise::check_backprop_input(
      kBwdInput, C10_AS_INTARRAYREF_SLOW(input_sizes), filter, out_backprop, strides, padding,
      explicit_paddings.value_or(at::IntArrayRef{}), data_format, dilations);
  const ChannelLayout l = choose_channel_layout(out_backprop, g.cdim(), !g.nchw);
  at::Tensor dx = empty_in_layout(g.input_shape(), l, out_backprop.options());
  if (dx.numel() == 0) return dx;
  if (out_backprop.numel() == 0 || filter.numel() == 0) return dx.zero_();
  const at::Tensor dy = to_physical(out_backprop, l);
  const at::Tensor f = filter.contiguous();
  depthwise::dispatch_float_types(filter.scalar_type(), [&](auto tag) {
    using scalar_t = decltype(tag);
    if (!l.channels_last) {
      backprop_input_channels_first(f.data_ptr<scalar_t>(), dy.data_ptr<scalar_t>(),
                                    dx.data_ptr<scalar_t>(), g);
      return;
    }
    const AxisTaps rows = depthwise::backward_taps(g.H, g.Ho, g.fh, g.sH, g.dH, g.pt);
    const AxisTaps cols = depthwise::backward_taps(g.W, g.Wo, g.fw, g.sW, g.dW, g.pl);
    const AxisTaps vcols = depthwise::backward_taps(g.W, g.Wo, g.fw, g.sW, g.dW, g.pl, false);
    if (g.M == 1) {
      const Correlation<scalar_t> p{dy.data_ptr<scalar_t>(),
                                    f.data_ptr<scalar_t>(),
                                    nhwc_view(dx, g).data_ptr<scalar_t>(),
                                    g.N,
                                    g.Ho,
                                    g.Wo,
                                    g.H,
                                    g.W,
                                    g.C,
                                    g.fw,
                                    &rows,
                                    &cols,
                                    &vcols,
                                    g.sW,
                                    1};
      correlate_channels_last(p);
      return;
    }
    // C*M channel gradients in the accumulation type, then the M of each channel summed.
    using A = acc_t<scalar_t>;
    const auto acc_type = c10::CppTypeToScalarType<A>::value;
    const at::Tensor dya = dy.to(acc_type), fa = f.to(acc_type);
    at::Tensor dxe = at::empty({g.N, g.H, g.W, g.C * g.M}, dya.options());
    const Correlation<A> p{dya.data_ptr<A>(),
                           fa.data_ptr<A>(),
                           dxe.data_ptr<A>(),
                           g.N,
                           g.Ho,
                           g.Wo,
                           g.H,
                           g.W,
                           g.C * g.M,
                           g.fw,
                           &rows,
                           &cols,
                           &vcols,
                           g.sW,
                           1};
    correlate_channels_last(p);
    nhwc_view(dx, g).copy_(dxe.view({g.N, g.H, g.W, g.C, g.M}).sum(-1));
  });
  return dx;
}

}  // namespace depthwise_cpu
}  // namespace torch_tfgrads
