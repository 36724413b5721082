// CPU kernels of the DepthwiseConv2dNative family (docs/ops/depthwise_conv2d.md).
//
// Each op computes on whichever dense physical order its main tensor already has (never a
// transposing copy): channels-last memory (NHWC, or NCHW in channels_last format) or
// channels-first memory (NCHW, or a permuted NHWC). Half types accumulate in float.
//
// Channels-last, vectorised over channels. Forward and backprop-input are the same gathered
// correlation (depthwise::AxisTaps give, per destination row / column, the in-bounds
// (filter index, source index) pairs; strides, dilations and padding live only there):
//   dst[n, r, q, c] = sum_{(kr, sr) in rows[r]} sum_{(kq, sq) in cols[q]} src[n, sr, sq, c] * f[kr, kq, c]
// Consecutive destination columns whose taps are shifted copies of each other (the interior,
// for any padding) are computed as tiles of 8 or 4 pixels that share each filter load, so the
// inner loop issues ~1.1 loads per FMA; edge pixels take the general path. Parallel over
// (batch, row). The filter gradient accumulates per row into registers (taps x channel
// vectors), then into one partial per fixed chunk of rows (chunks do not depend on the thread
// count), summed in chunk order: deterministic. Depth multiplier M > 1 runs the same kernels
// on C*M channels (input channels repeated M times; the input gradient sums them back).
//
// Channels-first, vectorised over output columns: each (n, c) plane is copied once into a
// zero-padded, stride-phase-split float buffer, so every tap of every stride and dilation reads
// contiguous columns without bounds checks. Parallel over planes; the input gradient scatters
// into the plane's own buffer and the filter gradient keeps one partial per plane, summed over
// the batch in order: deterministic.
//
// Files: depthwise_conv2d_forward.cpp, _backprop_input.cpp and _backprop_filter.cpp hold the
// three ops (both layouts each); depthwise_conv2d_tiles.cpp and _by_pixel.cpp the channels-last
// correlation that the forward and the input gradient share; depthwise_conv2d_cpu.h what the
// files share; this file registers the ops.
#include <torch/library.h>

#include "cpu/depthwise_conv2d_cpu.h"

namespace torch_tfgrads {

TORCH_LIBRARY_IMPL(tfgrads, CPU, m) {
  m.impl("depthwise_conv2d_native", &depthwise_cpu::depthwise_conv2d_native_cpu);
  m.impl("depthwise_conv2d_native_backprop_input",
         &depthwise_cpu::depthwise_conv2d_native_backprop_input_cpu);
  m.impl("depthwise_conv2d_native_backprop_filter",
         &depthwise_cpu::depthwise_conv2d_native_backprop_filter_cpu);
}

}  // namespace torch_tfgrads
