// CUDA kernels of the DepthwiseConv2dNative family, on the memory order the tensors already
// have (channels-last: NHWC or channels_last NCHW; channels-first: NCHW), as on the CPU.
//
// * Forward: one thread per output element, gathering its fh*fw taps (padding, strides and
//   dilations are bounds/divisibility tests). Channels fastest in channels-last memory, columns
//   fastest in channels-first memory: a warp reads and writes consecutive addresses.
// * Input gradient: one thread per input element, gathering every (m, tap) whose window covers
//   it: no atomics, deterministic.
// * Filter gradient: partial sums over fixed chunks of output pixels (the chunking depends only
//   on the sizes), reduced in a fixed order inside each block, then the chunks summed in order
//   by a second kernel: deterministic, with enough blocks to fill the GPU.
// Half types accumulate in float (at::opmath_type). The per-element arithmetic and the filter
// gradient's partition live in common/depthwise_conv2d_cells.h, which the CPU tests replay.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>

#include "common/channel_layout.h"
#include "common/depthwise_conv2d.h"
#include "common/depthwise_conv2d_cells.h"
#include "common/launch_geometry.h"

namespace torch_tfgrads {
namespace {

using depthwise::Geometry;

constexpr const char* kFwd = "depthwise_conv2d_native";
constexpr const char* kBwdInput = "depthwise_conv2d_native_backprop_input";
constexpr const char* kBwdFilter = "depthwise_conv2d_native_backprop_filter";
constexpr int kThreads = 256;

int blocks_for(int64_t n) {
  return static_cast<int>(
      std::max<int64_t>(1, std::min<int64_t>((n + kThreads - 1) / kThreads, 1 << 20)));
}

using depthwise::Dims;

Dims dims_of(const Geometry& g) {
  return Dims{g.N, g.H, g.W, g.C, g.M, g.fh, g.fw, g.Ho, g.Wo, g.sH, g.sW, g.dH, g.dW, g.pt, g.pl};
}

template <typename scalar_t, bool kChannelsLast>
__global__ void forward_kernel(const scalar_t* __restrict__ x, const scalar_t* __restrict__ f,
                               scalar_t* __restrict__ out, Dims d, int64_t total) {
  using acc_t = at::opmath_type<scalar_t>;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[e] = depthwise::forward_element<scalar_t, acc_t, kChannelsLast>(x, f, d, e);
}

template <typename scalar_t, bool kChannelsLast>
__global__ void backprop_input_kernel(const scalar_t* __restrict__ f,
                                      const scalar_t* __restrict__ dy, scalar_t* __restrict__ dx,
                                      Dims d, int64_t total) {
  using acc_t = at::opmath_type<scalar_t>;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dx[e] = depthwise::backprop_input_element<scalar_t, acc_t, kChannelsLast>(f, dy, d, e);
}

// Filter gradient, pass 1. Block (32, 8): threadIdx.x picks the output channel (coalesced in
// channels-last memory), threadIdx.y strides over the chunk's pixels; the 8 partial sums are
// added in a fixed order. Grid: (channel groups, taps, chunks). part[chunk][tap][oc].
template <typename scalar_t, bool kChannelsLast>
__global__ void filter_grad_partial_kernel(const scalar_t* __restrict__ x,
                                           const scalar_t* __restrict__ dy,
                                           at::opmath_type<scalar_t>* __restrict__ part, Dims d,
                                           int64_t pixels_per_chunk) {
  using acc_t = at::opmath_type<scalar_t>;
  __shared__ acc_t red[depthwise::kFilterGradRows][depthwise::kFilterGradLanes];
  const int64_t CM = d.C * d.M, P = d.N * d.Ho * d.Wo;
  const int64_t oc = blockIdx.x * int64_t(depthwise::kFilterGradLanes) + threadIdx.x;
  int64_t p0, p1;
  depthwise::chunk_range(blockIdx.z, pixels_per_chunk, P, &p0, &p1);
  for (int64_t tap = blockIdx.y; tap < d.fh * d.fw; tap += gridDim.y) {
    red[threadIdx.y][threadIdx.x] =
        oc < CM ? depthwise::filter_grad_thread<scalar_t, acc_t, kChannelsLast>(x, dy, d, oc, tap,
                                                                                p0, p1, threadIdx.y)
                : acc_t(0);
    __syncthreads();
    if (threadIdx.y == 0 && oc < CM)
      part[(blockIdx.z * d.fh * d.fw + tap) * CM + oc] = depthwise::filter_grad_block_sum(
          &red[0][threadIdx.x], depthwise::kFilterGradLanes);
    __syncthreads();  // red is reused by the next tap
  }
}

// Filter gradient, pass 2: the chunks of each filter element summed in chunk order.
template <typename scalar_t>
__global__ void filter_grad_sum_kernel(const at::opmath_type<scalar_t>* __restrict__ part,
                                       scalar_t* __restrict__ df, int64_t elems, int64_t chunks) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < elems;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x)
    df[e] = depthwise::filter_grad_chunks_sum<scalar_t>(part, elems, chunks, e);
}

at::Tensor depthwise_conv2d_native_cuda(const at::Tensor& input, const at::Tensor& filter,
                                        at::IntArrayRef strides, c10::string_view padding,
                                        at::OptionalIntArrayRef explicit_paddings,
                                        c10::string_view data_format, at::IntArrayRef dilations) {
  const Geometry g = depthwise::check_forward(kFwd, input, filter, strides, padding,
                                              explicit_paddings.value_or(at::IntArrayRef{}),
                                              data_format, dilations);
  c10::cuda::CUDAGuard guard(input.device());
  const ChannelLayout l = choose_channel_layout(input, g.cdim(), !g.nchw);
  at::Tensor out = empty_in_layout(g.output_shape(), l, input.options());
  if (out.numel() == 0) return out;
  const at::Tensor x = to_physical(input, l), f = filter.contiguous();
  auto stream = c10::cuda::getCurrentCUDAStream();
  const int64_t total = out.numel();
  depthwise::dispatch_float_types(input.scalar_type(), [&](auto tag) {
    using scalar_t = decltype(tag);
    if (l.channels_last)
      forward_kernel<scalar_t, true><<<blocks_for(total), kThreads, 0, stream>>>(
          x.data_ptr<scalar_t>(), f.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), dims_of(g),
          total);
    else
      forward_kernel<scalar_t, false><<<blocks_for(total), kThreads, 0, stream>>>(
          x.data_ptr<scalar_t>(), f.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), dims_of(g),
          total);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return out;
}

at::Tensor depthwise_conv2d_native_backprop_input_cuda(
    c10::SymIntArrayRef input_sizes, const at::Tensor& filter, const at::Tensor& out_backprop,
    at::IntArrayRef strides, c10::string_view padding, at::OptionalIntArrayRef explicit_paddings,
    c10::string_view data_format, at::IntArrayRef dilations) {
  const Geometry g = depthwise::check_backprop_input(
      kBwdInput, C10_AS_INTARRAYREF_SLOW(input_sizes), filter, out_backprop, strides, padding,
      explicit_paddings.value_or(at::IntArrayRef{}), data_format, dilations);
  c10::cuda::CUDAGuard guard(out_backprop.device());
  const ChannelLayout l = choose_channel_layout(out_backprop, g.cdim(), !g.nchw);
  at::Tensor dx = empty_in_layout(g.input_shape(), l, out_backprop.options());
  if (dx.numel() == 0) return dx;
  const at::Tensor dy = to_physical(out_backprop, l), f = filter.contiguous();
  auto stream = c10::cuda::getCurrentCUDAStream();
  const int64_t total = dx.numel();
  depthwise::dispatch_float_types(filter.scalar_type(), [&](auto tag) {
    using scalar_t = decltype(tag);
    if (l.channels_last)
      backprop_input_kernel<scalar_t, true><<<blocks_for(total), kThreads, 0, stream>>>(
          f.data_ptr<scalar_t>(), dy.data_ptr<scalar_t>(), dx.data_ptr<scalar_t>(), dims_of(g),
          total);
    else
      backprop_input_kernel<scalar_t, false><<<blocks_for(total), kThreads, 0, stream>>>(
          f.data_ptr<scalar_t>(), dy.data_ptr<scalar_t>(), dx.data_ptr<scalar_t>(), dims_of(g),
          total);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return dx;
}

at::Tensor depthwise_conv2d_native_backprop_filter_cuda(
    const at::Tensor& input, c10::SymIntArrayRef filter_sizes, const at::Tensor& out_backprop,
    at::IntArrayRef strides, c10::string_view padding, at::OptionalIntArrayRef explicit_paddings,
    c10::string_view data_format, at::IntArrayRef dilations) {
  const Geometry g = depthwise::check_backprop_filter(
      kBwdFilter, input, C10_AS_INTARRAYREF_SLOW(filter_sizes), out_backprop, strides, padding,
      explicit_paddings.value_or(at::IntArrayRef{}), data_format, dilations);
  c10::cuda::CUDAGuard guard(input.device());
  at::Tensor df = at::empty(g.filter_shape(), input.options());
  if (df.numel() == 0) return df;
  if (out_backprop.numel() == 0 || input.numel() == 0) return df.zero_();
  const ChannelLayout l = choose_channel_layout(input, g.cdim(), !g.nchw);
  const at::Tensor x = to_physical(input, l), dy = to_physical(out_backprop, l);
  const int64_t CM = g.C * g.M, taps = g.fh * g.fw, P = g.N * g.Ho * g.Wo;
  auto stream = c10::cuda::getCurrentCUDAStream();
  depthwise::dispatch_float_types(input.scalar_type(), [&](auto tag) {
    using scalar_t = decltype(tag);
    using acc_t = at::opmath_type<scalar_t>;
    const auto acc_type = c10::CppTypeToScalarType<acc_t>::value;
    // Fixed chunks of pixels (sizes only, never the device: deterministic sums), the partials'
    // workspace bounded (common/launch_geometry.h).
    const launch::DwFilterGradPlan plan = launch::dw_filter_grad_plan(P, taps, CM, sizeof(acc_t));
    const int64_t chunks = plan.chunks, per_chunk = plan.per_chunk;
    at::Tensor part = at::empty({chunks, taps, CM}, input.options().dtype(acc_type));
    const dim3 grid(static_cast<unsigned>(plan.grid_x), static_cast<unsigned>(plan.grid_y),
                    static_cast<unsigned>(chunks));
    const dim3 block(depthwise::kFilterGradLanes, depthwise::kFilterGradRows);
    if (l.channels_last)
      filter_grad_partial_kernel<scalar_t, true>
          <<<grid, block, 0, stream>>>(x.data_ptr<scalar_t>(), dy.data_ptr<scalar_t>(),
                                       part.data_ptr<acc_t>(), dims_of(g), per_chunk);
    else
      filter_grad_partial_kernel<scalar_t, false>
          <<<grid, block, 0, stream>>>(x.data_ptr<scalar_t>(), dy.data_ptr<scalar_t>(),
                                       part.data_ptr<acc_t>(), dims_of(g), per_chunk);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    const int64_t elems = taps * CM;
    filter_grad_sum_kernel<scalar_t><<<blocks_for(elems), kThreads, 0, stream>>>(
        part.data_ptr<acc_t>(), df.data_ptr<scalar_t>(), elems, chunks);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return df;
}

}  // namespace

TORCH_LIBRARY_IMPL(tfgrads, CUDA, m) {
  m.impl("depthwise_conv2d_native", &depthwise_conv2d_native_cuda);
  m.impl("depthwise_conv2d_native_backprop_input", &depthwise_conv2d_native_backprop_input_cuda);
  m.impl("depthwise_conv2d_native_backprop_filter", &depthwise_conv2d_native_backprop_filter_cuda);
}

}  // namespace torch_tfgrads
