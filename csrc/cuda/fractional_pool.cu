// CUDA kernels of the FractionalPool family: the same cells, arithmetic and accumulation order
// as the CPU kernels (and TF's CPU kernels; TF has no GPU kernels for these ops). Each kernel is a
// grid-stride loop around a host-device body in common/fractional_pool_cells.h, which the CPU
// tests also run on the host against the CPU kernels.
//
// * The sequences and the per-axis cell plans are made on the host (common/fractional_pool.h)
//   and copied to the device in one packed int64 buffer.
// * Forward: one thread per output element, channels fastest, so a warp reads consecutive
//   channels of a cell row (coalesced for NHWC).
// * Gradients gather: one thread per input element sums the <= 2x2 cells covering it in TF's
//   order (avg: in double, then one rounding), so the results are deterministic and equal to
//   the CPU's bit for bit, with no atomics.
// * Max gradient: an argmax kernel (first maximum in scan order) that also flags any mismatch
//   with orig_output, then the gather. The flag is read back (one small sync) to raise TF's error.
#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>

#include "common/checks.h"
#include "common/fractional_pool.h"
#include "common/fractional_pool_cells.h"

namespace torch_tfgrads {
namespace {

using fracpool::channels_contiguous;
using fracpool::GradPlan;
using fracpool::PackedPlan;

constexpr int kThreads = 256;

int blocks_for(int64_t n) {
  return static_cast<int>(
      std::max<int64_t>(1, std::min<int64_t>((n + kThreads - 1) / kThreads, 1 << 20)));
}

using DevicePlan = fracpool::PlanView;  // the cell plans, on the device

DevicePlan device_plan(const at::Tensor& packed, const PackedPlan& o) {
  const int64_t* p = packed.const_data_ptr<int64_t>();
  return {p + o.row_start, p + o.row_end, p + o.row_first, p + o.row_last,
          p + o.col_start, p + o.col_end, p + o.col_first, p + o.col_last};
}

at::Tensor upload_plan(const GradPlan& g, const at::Device& device, PackedPlan* offsets) {
  return fracpool::pack_plans(g.rows, g.cols, offsets).to(device);
}

using fracpool::sum_t;

// ---- forward ------------------------------------------------------------------------------
template <typename scalar_t, bool kMax>
__global__ void pool_kernel(const scalar_t* __restrict__ x, int64_t sN, int64_t sH, int64_t sW,
                            DevicePlan plan, int64_t OH, int64_t OW, int64_t C, int64_t total,
                            scalar_t* __restrict__ out) {
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < total;
       k += int64_t(gridDim.x) * blockDim.x)
    out[k] = fracpool::pool_cell<scalar_t, kMax>(x, sN, sH, sW, plan, OH, OW, C, k);
}

template <bool kMax>
void launch_pool(const at::Tensor& x, at::Tensor& out, const GradPlan& g) {
  PackedPlan offsets;
  const at::Tensor packed = upload_plan(g, x.device(), &offsets);
  const DevicePlan plan = device_plan(packed, offsets);
  const int64_t total = out.numel();
  if (total == 0) return;
  auto stream = c10::cuda::getCurrentCUDAStream();
  auto run = [&](auto tag) {
    using scalar_t = decltype(tag);
    pool_kernel<scalar_t, kMax><<<blocks_for(total), kThreads, 0, stream>>>(
        x.const_data_ptr<scalar_t>(), x.stride(0), x.stride(1), x.stride(2), plan, g.rows.cells,
        g.cols.cells, g.C, total, out.mutable_data_ptr<scalar_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  };
  fracpool::dispatch_value_types(x.scalar_type(), run);
}

template <bool kMax>
std::tuple<at::Tensor, at::Tensor, at::Tensor> fractional_pool_cuda(
    const at::Tensor& value, c10::ArrayRef<double> pooling_ratio, bool pseudo_random,
    bool overlapping, bool deterministic, int64_t seed, int64_t seed2) {
  constexpr const char* op = kMax ? "fractional_max_pool" : "fractional_avg_pool";
  c10::cuda::CUDAGuard guard(value.device());
  const auto s = fracpool::check_pool(op, kMax, value, pooling_ratio, deterministic, seed, seed2);
  auto [rows, cols] = fracpool::pooling_sequences(s, pseudo_random, seed, seed2);
  GradPlan g{s.N,
             s.H,
             s.W,
             s.C,
             fracpool::plan_axis(rows.data_ptr<int64_t>(), s.out_h, overlapping, s.H),
             fracpool::plan_axis(cols.data_ptr<int64_t>(), s.out_w, overlapping, s.W)};
  const at::Tensor x = channels_contiguous(value);
  at::Tensor out = at::empty({s.N, s.out_h, s.out_w, s.C}, value.options());
  launch_pool<kMax>(x, out, g);
  return {out, rows.to(value.device()), cols.to(value.device())};
}

// ---- FractionalAvgPoolGrad ----------------------------------------------------------------
template <typename scalar_t>
__global__ void avg_grad_kernel(const scalar_t* __restrict__ dy, int64_t sN, int64_t sH, int64_t sW,
                                DevicePlan plan, int64_t H, int64_t W, int64_t C, int64_t total,
                                scalar_t* __restrict__ dx) {
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < total;
       k += int64_t(gridDim.x) * blockDim.x)
    dx[k] = fracpool::avg_grad_element(dy, sN, sH, sW, plan, H, W, C, k);
}

at::Tensor fractional_avg_pool_grad_cuda(c10::SymIntArrayRef orig_input_tensor_shape,
                                         const at::Tensor& out_backprop,
                                         const at::Tensor& row_pooling_sequence,
                                         const at::Tensor& col_pooling_sequence, bool overlapping) {
  c10::cuda::CUDAGuard guard(out_backprop.device());
  const GradPlan g = fracpool::check_avg_grad(
      "fractional_avg_pool_grad", C10_AS_INTARRAYREF_SLOW(orig_input_tensor_shape), out_backprop,
      row_pooling_sequence, col_pooling_sequence, overlapping);
  const at::Tensor dy = channels_contiguous(fracpool::pad_out_backprop(out_backprop, g));
  at::Tensor dx = at::empty({g.N, g.H, g.W, g.C}, out_backprop.options());
  PackedPlan offsets;
  const at::Tensor packed = upload_plan(g, dy.device(), &offsets);
  const DevicePlan plan = device_plan(packed, offsets);
  const int64_t total = dx.numel();
  auto stream = c10::cuda::getCurrentCUDAStream();
  auto run = [&](auto tag) {
    using scalar_t = decltype(tag);
    avg_grad_kernel<scalar_t><<<blocks_for(total), kThreads, 0, stream>>>(
        dy.const_data_ptr<scalar_t>(), dy.stride(0), dy.stride(1), dy.stride(2), plan, g.H, g.W,
        g.C, total, dx.mutable_data_ptr<scalar_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  };
  fracpool::dispatch_value_types(dy.scalar_type(), run);
  return dx;
}

// ---- FractionalMaxPoolGrad ----------------------------------------------------------------
// argmax[k] = flat NHWC index of the first maximum of output element k's cell; *mismatch set
// when the maximum differs from orig_output (TF's "tensor_out_dup" check).
template <typename scalar_t>
__global__ void argmax_kernel(const scalar_t* __restrict__ x, int64_t sN, int64_t sH, int64_t sW,
                              const scalar_t* __restrict__ y, DevicePlan plan, int64_t H, int64_t W,
                              int64_t OH, int64_t OW, int64_t C, int64_t total,
                              int64_t* __restrict__ argmax, int* mismatch) {
  using A = sum_t<scalar_t>;
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < total;
       k += int64_t(gridDim.x) * blockDim.x) {
    A best;
    argmax[k] = fracpool::argmax_cell(x, sN, sH, sW, plan, H, W, OH, OW, C, k, &best);
    if (y != nullptr && !(best == static_cast<A>(y[k]))) *mismatch = 1;
  }
}

template <typename scalar_t>
__global__ void max_grad_gather_kernel(const scalar_t* __restrict__ dy,
                                       const int64_t* __restrict__ argmax, DevicePlan plan,
                                       int64_t H, int64_t W, int64_t OH, int64_t OW, int64_t C,
                                       int64_t total, scalar_t* __restrict__ dx) {
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < total;
       k += int64_t(gridDim.x) * blockDim.x)
    dx[k] = fracpool::max_grad_element(dy, argmax, plan, H, W, OH, OW, C, k);
}

template <typename scalar_t>
__global__ void gather_at_kernel(const scalar_t* __restrict__ src,
                                 const int64_t* __restrict__ index, int64_t total,
                                 scalar_t* __restrict__ dst) {
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < total;
       k += int64_t(gridDim.x) * blockDim.x)
    dst[k] = src[index[k]];
}

// mode 0: the gradient (checks orig_output, gathers dy); mode 1: its backward (reads g at the
// argmax of every output element).
at::Tensor max_grad_common(const char* op, const at::Tensor& orig_input,
                           const at::Tensor& orig_output, const at::Tensor& grad_in,
                           const at::Tensor& row_seq, const at::Tensor& col_seq, bool overlapping,
                           bool backward_of_grad) {
  c10::cuda::CUDAGuard guard(orig_input.device());
  const GradPlan g = fracpool::check_max_grad(op, orig_input, orig_output,
                                              backward_of_grad ? orig_output : grad_in, row_seq,
                                              col_seq, overlapping);
  if (backward_of_grad) {
    check_same_device(orig_input, grad_in, op, "orig_input", "grad");
    TORCH_CHECK(
        grad_in.sizes() == orig_input.sizes() && grad_in.scalar_type() == orig_input.scalar_type(),
        op, ": argument 'grad' must have the shape and dtype of orig_input");
  }
  const at::Tensor x = channels_contiguous(orig_input);
  const at::Tensor y = orig_output.contiguous();
  const at::Tensor gin = grad_in.contiguous();
  PackedPlan offsets;
  const at::Tensor packed = upload_plan(g, x.device(), &offsets);
  const DevicePlan plan = device_plan(packed, offsets);
  const int64_t n_out = y.numel();
  at::Tensor argmax = at::empty({n_out}, x.options().dtype(at::kLong));
  at::Tensor flag = at::zeros({1}, x.options().dtype(at::kInt));
  at::Tensor result = at::empty(backward_of_grad ? y.sizes() : x.sizes(), x.options());
  auto stream = c10::cuda::getCurrentCUDAStream();
  auto run = [&](auto tag) {
    using scalar_t = decltype(tag);
    argmax_kernel<scalar_t><<<blocks_for(n_out), kThreads, 0, stream>>>(
        x.const_data_ptr<scalar_t>(), x.stride(0), x.stride(1), x.stride(2),
        backward_of_grad ? nullptr : y.const_data_ptr<scalar_t>(), plan, g.H, g.W, g.rows.cells,
        g.cols.cells, g.C, n_out, argmax.mutable_data_ptr<int64_t>(), flag.mutable_data_ptr<int>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    if (backward_of_grad) {
      gather_at_kernel<scalar_t><<<blocks_for(n_out), kThreads, 0, stream>>>(
          gin.const_data_ptr<scalar_t>(), argmax.const_data_ptr<int64_t>(), n_out,
          result.mutable_data_ptr<scalar_t>());
    } else {
      max_grad_gather_kernel<scalar_t><<<blocks_for(result.numel()), kThreads, 0, stream>>>(
          gin.const_data_ptr<scalar_t>(), argmax.const_data_ptr<int64_t>(), plan, g.H, g.W,
          g.rows.cells, g.cols.cells, g.C, result.numel(), result.mutable_data_ptr<scalar_t>());
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  };
  fracpool::dispatch_value_types(x.scalar_type(), run);
  if (!backward_of_grad) {
    const bool mismatch = flag.to(at::kCPU).const_data_ptr<int>()[0] != 0;  // syncs the stream
    TORCH_CHECK(!mismatch, op, ": argument 'orig_output': ", fracpool::kOutputMismatch,
                " (orig_output is not the fractional max pool of orig_input with these "
                "sequences)");
  }
  return result;
}

at::Tensor fractional_max_pool_grad_cuda(const at::Tensor& orig_input,
                                         const at::Tensor& orig_output,
                                         const at::Tensor& out_backprop,
                                         const at::Tensor& row_pooling_sequence,
                                         const at::Tensor& col_pooling_sequence, bool overlapping) {
  return max_grad_common("fractional_max_pool_grad", orig_input, orig_output, out_backprop,
                         row_pooling_sequence, col_pooling_sequence, overlapping, false);
}

at::Tensor fractional_max_pool_grad_backward_cuda(const at::Tensor& orig_input,
                                                  const at::Tensor& orig_output,
                                                  const at::Tensor& grad,
                                                  const at::Tensor& row_pooling_sequence,
                                                  const at::Tensor& col_pooling_sequence,
                                                  bool overlapping) {
  return max_grad_common("_fractional_max_pool_grad_backward", orig_input, orig_output, grad,
                         row_pooling_sequence, col_pooling_sequence, overlapping, true);
}

at::Tensor fractional_avg_pool_grad_backward_cuda(const at::Tensor& grad,
                                                  const at::Tensor& row_pooling_sequence,
                                                  const at::Tensor& col_pooling_sequence,
                                                  bool overlapping) {
  c10::cuda::CUDAGuard guard(grad.device());
  const GradPlan g = fracpool::check_pool_with_sequences("_fractional_avg_pool_grad_backward", grad,
                                                         row_pooling_sequence, col_pooling_sequence,
                                                         overlapping);
  const at::Tensor x = channels_contiguous(grad);
  at::Tensor out = at::empty({g.N, g.rows.cells, g.cols.cells, g.C}, grad.options());
  launch_pool<false>(x, out, g);
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(tfgrads, CUDA, m) {
  m.impl("fractional_avg_pool", &fractional_pool_cuda<false>);
  m.impl("fractional_max_pool", &fractional_pool_cuda<true>);
  m.impl("fractional_avg_pool_grad", &fractional_avg_pool_grad_cuda);
  m.impl("fractional_max_pool_grad", &fractional_max_pool_grad_cuda);
  m.impl("_fractional_avg_pool_grad_backward", &fractional_avg_pool_grad_backward_cuda);
  m.impl("_fractional_max_pool_grad_backward", &fractional_max_pool_grad_backward_cuda);
}

}  // namespace torch_tfgrads
