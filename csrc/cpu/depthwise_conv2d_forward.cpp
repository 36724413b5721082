// DepthwiseConv2dNative on the CPU: the channels-last correlation (depthwise_conv2d_tiles.cpp)
// or, on channels-first memory, the phase-split planes (depthwise_conv2d.cpp describes both).
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

constexpr const char* kFwd = "depthwise_conv2d_native";

template <typename scalar_t>
void forward_channels_first(const scalar_t* x, const scalar_t* f, scalar_t* out,
                            const Geometry& g) {
  using A = acc_t<scalar_t>;
  using Vec = Vectorized<A>;
  using Wd = Widen<scalar_t, A>;
  constexpr int64_t L = Vec::size();
  const PhasePlane pp = phase_plane<A>(g);
  const int64_t taps = g.fh * g.fw, CM = g.C * g.M;
  at::parallel_for(0, g.N * g.C, plane_grain(g), [&](int64_t begin, int64_t end) {
    std::vector<A> buf(pp.size());
    std::vector<int64_t> off(taps);
    std::vector<Vec> fv(taps);
    for (int64_t nc = begin; nc < end; ++nc) {
      const int64_t n = nc / g.C, c = nc % g.C;
      load_plane(x + nc * g.H * g.W, g, pp, buf.data());
      for (int64_t m = 0; m < g.M; ++m) {
        for (int64_t t = 0; t < taps; ++t) fv[t] = Vec(static_cast<A>(f[t * CM + c * g.M + m]));
        scalar_t* o = out + (n * CM + c * g.M + m) * g.Ho * g.Wo;
        for (int64_t i = 0; i < g.Ho; ++i) {
          for (int64_t di = 0; di < g.fh; ++di)
            for (int64_t dj = 0; dj < g.fw; ++dj)
              off[di * g.fw + dj] = pp.tap(i * g.sH + di * g.dH, dj * g.dW);
          for (int64_t j = 0; j < g.Wo; j += L) {
            Vec acc(A(0));
            for (int64_t t = 0; t < taps; ++t)
              acc = at::vec::fmadd(Vec::loadu(buf.data() + off[t] + j), fv[t], acc);
            if (j + L <= g.Wo)
              Wd::store(o + i * g.Wo + j, acc);
            else
              store_partial(o + i * g.Wo + j, acc, g.Wo - j);
          }
        }
      }
    }
  });
}

}  // namespace

at::Tensor depthwise_conv2d_native_cpu(const at::Tensor& input, const at::Tensor& filter,
                                       at::IntArrayRef strides, c10::string_view padding,
                                       at::OptionalIntArrayRef explicit_paddings,
                                       c10::string_view data_format, at::IntArrayRef dilations) {
  const Geometry g = depthwise::check_forward(kFwd, input, filter, strides, padding,
                                              explicit_paddings.value_or(at::IntArrayRef{}),
                                              data_format, dilations);
  const ChannelLayout l = choose_channel_layout(input, g.cdim(), !g.nchw);
  at::Tensor out = empty_in_layout(g.output_shape(), l, input.options());
  if (out.numel() == 0) return out;
  if (g.fh == 0 || g.fw == 0 || g.H == 0 || g.W == 0) return out.zero_();
  const at::Tensor x = to_physical(input, l);
  const at::Tensor f = filter.contiguous();
  depthwise::dispatch_float_types(input.scalar_type(), [&](auto tag) {
    using scalar_t = decltype(tag);
    if (!l.channels_last) {
      forward_channels_first(x.data_ptr<scalar_t>(), f.data_ptr<scalar_t>(),
                             out.data_ptr<scalar_t>(), g);
      return;
    }
    const at::Tensor xe = repeat_channels(x, g.M).contiguous();
    const AxisTaps rows = depthwise::forward_taps(g.Ho, g.H, g.fh, g.sH, g.dH, g.pt);
    const AxisTaps cols = depthwise::forward_taps(g.Wo, g.W, g.fw, g.sW, g.dW, g.pl);
    const AxisTaps vcols = depthwise::forward_taps(g.Wo, g.W, g.fw, g.sW, g.dW, g.pl, false);
    const Correlation<scalar_t> p{xe.data_ptr<scalar_t>(),
                                  f.data_ptr<scalar_t>(),
                                  nhwc_view(out, g).data_ptr<scalar_t>(),
                                  g.N,
                                  g.H,
                                  g.W,
                                  g.Ho,
                                  g.Wo,
                                  g.C * g.M,
                                  g.fw,
                                  &rows,
                                  &cols,
                                  &vcols,
                                  1,
                                  g.sW};
    correlate_channels_last(p);
  });
  return out;
}

}  // namespace depthwise_cpu
}  // namespace torch_tfgrads
