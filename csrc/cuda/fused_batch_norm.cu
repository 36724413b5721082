// CUDA kernels of fused_batch_norm_v3 / fused_batch_norm_grad_v3 (same semantics as the CPU
// kernels; reserve_space_2 is the biased variance on every device, unlike TF's cuDNN path).
//
// Per op: (1) a partial-reduction kernel over both layouts, coalesced on the innermost
// dimension (channels-last: a warp reads 32 consecutive channels of a row; channels-first: a
// block reads a contiguous span of one channel's planes), reduced in registers, with warp
// shuffles and through shared memory; (2) a per-channel finalize kernel that merges the
// partials in double (Chan's formula for the moments), 16 threads per channel; (3) an
// elementwise kernel.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>

#include "common/fused_batch_norm.h"
#include "common/fused_batch_norm_cells.h"
#include "common/fused_batch_norm_sync.h"
#include "common/launch_geometry.h"

namespace torch_tfgrads {
namespace {

constexpr int kWarp = bn::kWarp;
constexpr int kRowsPerBlock = bn::kRowsPerBlock;  // channels-last: 32 channels x 8 rows
constexpr int kThreads = bn::kFirstThreads;       // channels-first and elementwise blocks

using bn::GradSums;
using bn::PushGrad;
using bn::PushX;
using bn::Welford;

// Warp shuffles of the accumulators (common/fused_batch_norm_cells.h holds their arithmetic).
template <typename acc_t>
__device__ Welford<acc_t> shfl_down(const Welford<acc_t>& a, int offset) {
  Welford<acc_t> o{};
  o.n = __shfl_down_sync(0xffffffff, a.n, offset);
  o.mean = __shfl_down_sync(0xffffffff, a.mean, offset);
  o.m2 = __shfl_down_sync(0xffffffff, a.m2, offset);
  return o;
}

template <typename acc_t>
__device__ GradSums<acc_t> shfl_down(const GradSums<acc_t>& a, int offset) {
  GradSums<acc_t> o{};
  o.sdy = __shfl_down_sync(0xffffffff, a.sdy, offset);
  o.sdyxc = __shfl_down_sync(0xffffffff, a.sdyxc, offset);
  return o;
}

// Channels-last partials: block (32, 8) covers 32 channels and a span of rows.
template <typename Acc, typename Push>
__global__ void partials_channels_last(int64_t rows, int64_t C, int64_t rows_per_block, Push push,
                                       Acc* out) {
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t c = blockIdx.x * int64_t(kWarp) + tx;
  int64_t r0, r1;
  bn::part_range(blockIdx.y, rows_per_block, rows, &r0, &r1);
  Acc a{};
  if (c < C)
    for (int64_t r = r0 + ty; r < r1; r += kRowsPerBlock) push(a, r * C + c, c);
  __shared__ Acc sm[kRowsPerBlock][kWarp];
  sm[ty][tx] = a;
  __syncthreads();
  if (ty == 0 && c < C) {
    for (int k = 1; k < kRowsPerBlock; ++k) a.merge(sm[k][tx]);
    out[blockIdx.y * C + c] = a;
  }
}

// Channels-first partials: block blockIdx.x = channel, reading a span of that channel's
// elements (plane after plane) with consecutive threads on consecutive addresses.
template <typename Acc, typename Push>
__global__ void partials_channels_first(int64_t N, int64_t C, int64_t S, int64_t span, Push push,
                                        Acc* out) {
  const int64_t c = blockIdx.x;
  int64_t j0, j1;
  bn::part_range(blockIdx.y, span, N * S, &j0, &j1);
  Acc a{};
  for (int64_t j = j0 + threadIdx.x; j < j1; j += blockDim.x) {
    const int64_t n = j / S, s = j - n * S;
    push(a, (n * C + c) * S + s, c);
  }
  for (int offset = kWarp / 2; offset > 0; offset /= 2) a.merge(shfl_down(a, offset));
  __shared__ Acc sm[kThreads / kWarp];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  if (lane == 0) sm[warp] = a;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < int(blockDim.x / kWarp); ++w) a.merge(sm[w]);
    out[blockIdx.y * C + c] = a;
  }
}

// Launches the partial reduction for the layout with the plan's partials per channel
// (common/launch_geometry.h; the workspace is sized by need: plan.parts * C accumulators).
template <typename Acc, typename Push>
void launch_partials(const ChannelLayout& l, const launch::BnPlan& plan, Push push, Acc* out,
                     cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(plan.grid_x), static_cast<unsigned>(plan.parts));
  if (l.channels_last) {
    partials_channels_last<Acc>
        <<<grid, dim3(kWarp, kRowsPerBlock), 0, stream>>>(l.outer, l.C, plan.per_part, push, out);
  } else {
    partials_channels_first<Acc>
        <<<grid, kThreads, 0, stream>>>(l.outer, l.C, l.inner, plan.per_part, push, out);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

launch::BnPlan plan_for(const ChannelLayout& l) {
  return launch::bn_plan(l.channels_last, l.C, l.outer, l.inner);
}

// The finalize kernels' merge of channel c's partials (common/fused_batch_norm_cells.h): block
// (32 lanes, kMergeGroups rows) on 32 channels; row g merges its share of the partials, then row
// 0 merges the rows. True in row 0 for a channel < C, with the result in *out.
template <typename Acc, typename Group>
__device__ bool merge_channel(int64_t C, const Group& group, Acc* out) {
  __shared__ Acc sm[bn::kMergeGroups][kWarp];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t c = blockIdx.x * int64_t(kWarp) + tx;
  if (c < C) sm[ty][tx] = group(c, ty);
  __syncthreads();
  if (ty != 0 || c >= C) return false;
  *out = bn::merge_groups(&sm[0][tx], kWarp);
  return true;
}

// Launch geometry of the finalize kernels.
dim3 finalize_grid(int64_t C) { return dim3(static_cast<unsigned>(launch::ceil_div(C, kWarp))); }
const dim3 kFinalizeBlock(kWarp, bn::kMergeGroups);

template <typename acc_t>
__global__ void finalize_moments(const Welford<acc_t>* parts, int64_t nparts, int64_t C, int64_t n,
                                 const acc_t* run_mean, const acc_t* run_var, bool uses_running,
                                 acc_t factor, acc_t* bm, acc_t* bv, acc_t* rs1, acc_t* rs2) {
  Welford<double> w;
  const auto group = [&](int64_t c, int g) {
    return bn::merge_moments_group(parts, nparts, C, c, g);
  };
  if (!merge_channel(C, group, &w)) return;
  const int64_t c = blockIdx.x * int64_t(kWarp) + threadIdx.x;
  const double tn = w.n, tm = w.mean, tm2 = w.m2;
  const acc_t mu = acc_t(tm), vb = acc_t(tm2 / tn);
  const acc_t adjust = acc_t(n) / acc_t(n > 1 ? n - 1 : 1);
  rs1[c] = mu;
  rs2[c] = vb;
  if (!uses_running) {
    bm[c] = mu;
    bv[c] = vb * adjust;
  } else {
    const acc_t g = acc_t(1) - factor;
    bm[c] = g * run_mean[c] + factor * mu;
    bv[c] = g * run_var[c] + (factor * adjust) * vb;
  }
}

template <typename scalar_t, typename acc_t>
__global__ void apply_normalize(const scalar_t* x, scalar_t* y, int64_t numel, int64_t C, int64_t S,
                                bool channels_last, const acc_t* mean, const acc_t* var,
                                const acc_t* scale, const acc_t* offset, acc_t eps) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < numel;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t c = channels_last ? i % C : (i / S) % C;
    const acc_t k = acc_t(1) / sqrt(var[c] + eps) * scale[c];
    y[i] = static_cast<scalar_t>((static_cast<acc_t>(x[i]) - mean[c]) * k + offset[c]);
  }
}

template <typename acc_t>
__global__ void finalize_grad(const GradSums<acc_t>* parts, int64_t nparts, int64_t C, int64_t n,
                              const acc_t* scale, const acc_t* var, acc_t eps, acc_t* gscale,
                              acc_t* goffset, acc_t* coef /* [3, C]: A, mean(dy), B */) {
  GradSums<double> sums;
  const auto group = [&](int64_t c, int g) {
    return bn::merge_grad_sums_group(parts, nparts, C, c, g);
  };
  if (!merge_channel(C, group, &sums)) return;
  const int64_t c = blockIdx.x * int64_t(kWarp) + threadIdx.x;
  const double s1 = sums.sdy, s2 = sums.sdyxc;
  const acc_t inv = acc_t(1) / sqrt(var[c] + eps), a1 = acc_t(s1), a2 = acc_t(s2);
  goffset[c] = a1;
  gscale[c] = a2 * inv;
  coef[c] = scale[c] * inv;
  coef[C + c] = a1 * (acc_t(1) / acc_t(n));
  coef[2 * C + c] = inv * inv * (a2 / acc_t(n));
}

template <typename scalar_t, typename acc_t>
__global__ void apply_grad_input(const scalar_t* dy, const scalar_t* x, scalar_t* dx, int64_t numel,
                                 int64_t C, int64_t S, bool channels_last, bool training,
                                 const acc_t* mean, const acc_t* coef) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < numel;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t c = channels_last ? i % C : (i / S) % C;
    const acc_t g = static_cast<acc_t>(dy[i]);
    acc_t r;
    if (training)
      r = coef[c] * ((g - coef[C + c]) - (static_cast<acc_t>(x[i]) - mean[c]) * coef[2 * C + c]);
    else
      r = coef[c] * g;
    dx[i] = static_cast<scalar_t>(r);
  }
}

int elementwise_blocks(int64_t numel) {
  return static_cast<int>(std::min<int64_t>((numel + kThreads - 1) / kThreads, 65536));
}

template <typename scalar_t>
void forward_cuda(bn::Forward& f, const at::Tensor& scale, const at::Tensor& offset,
                  const at::Tensor& mean, const at::Tensor& variance, double epsilon,
                  double exponential_avg_factor) {
  using acc_t = at::opmath_type<scalar_t>;
  constexpr bool is_double = std::is_same<scalar_t, double>::value;
  const acc_t eps = is_double ? acc_t(epsilon) : acc_t(static_cast<float>(epsilon));
  const auto& l = f.layout;
  auto stream = c10::cuda::getCurrentCUDAStream();
  const at::Tensor scale_c = scale.contiguous(), offset_c = offset.contiguous();
  const scalar_t* x = f.x_phys.const_data_ptr<scalar_t>();
  const int64_t numel = f.x_phys.numel();
  if (f.training) {
    const launch::BnPlan plan = plan_for(l);
    at::Tensor ws = at::empty({int64_t(sizeof(Welford<acc_t>)) * plan.parts * l.C},
                              f.x_phys.options().dtype(at::kByte));
    auto* parts = reinterpret_cast<Welford<acc_t>*>(ws.data_ptr());
    launch_partials(l, plan, PushX<scalar_t, acc_t>{x}, parts, stream);
    const int64_t nparts = plan.parts;
    const at::Tensor mean_c = f.uses_running_stats ? mean.contiguous() : f.rs1;
    const at::Tensor var_c = f.uses_running_stats ? variance.contiguous() : f.rs2;
    const acc_t factor = is_double ? acc_t(exponential_avg_factor)
                                   : acc_t(static_cast<float>(exponential_avg_factor));
    finalize_moments<acc_t><<<finalize_grid(l.C), kFinalizeBlock, 0, stream>>>(
        parts, nparts, l.C, numel / l.C, mean_c.const_data_ptr<acc_t>(),
        var_c.const_data_ptr<acc_t>(), f.uses_running_stats, factor, f.batch_mean.data_ptr<acc_t>(),
        f.batch_variance.data_ptr<acc_t>(), f.rs1.data_ptr<acc_t>(), f.rs2.data_ptr<acc_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  apply_normalize<scalar_t, acc_t><<<elementwise_blocks(numel), kThreads, 0, stream>>>(
      x, f.y_phys.data_ptr<scalar_t>(), numel, l.C, l.inner, l.channels_last,
      f.rs1.const_data_ptr<acc_t>(), f.rs2.const_data_ptr<acc_t>(),  // inference: input copies
      scale_c.const_data_ptr<acc_t>(), offset_c.const_data_ptr<acc_t>(), eps);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename scalar_t>
void backward_cuda(bn::Backward& b, const at::Tensor& scale, const at::Tensor& rs1,
                   const at::Tensor& rs2, double epsilon, bool is_training) {
  using acc_t = at::opmath_type<scalar_t>;
  constexpr bool is_double = std::is_same<scalar_t, double>::value;
  const acc_t eps = is_double ? acc_t(epsilon) : acc_t(static_cast<float>(epsilon));
  const auto& l = b.layout;
  auto stream = c10::cuda::getCurrentCUDAStream();
  const at::Tensor scale_c = scale.contiguous(), rs1_c = rs1.contiguous(), rs2_c = rs2.contiguous();
  const scalar_t* x = b.x_phys.const_data_ptr<scalar_t>();
  const scalar_t* dy = b.dy_phys.const_data_ptr<scalar_t>();
  const int64_t numel = b.x_phys.numel();
  const launch::BnPlan plan = plan_for(l);
  at::Tensor ws = at::empty({int64_t(sizeof(GradSums<acc_t>)) * plan.parts * l.C},
                            b.x_phys.options().dtype(at::kByte));
  auto* parts = reinterpret_cast<GradSums<acc_t>*>(ws.data_ptr());
  launch_partials(l, plan, PushGrad<scalar_t, acc_t>{dy, x, rs1_c.const_data_ptr<acc_t>()}, parts,
                  stream);
  const int64_t nparts = plan.parts;
  at::Tensor coef = at::empty({3 * l.C}, rs1_c.options());
  finalize_grad<acc_t><<<finalize_grid(l.C), kFinalizeBlock, 0, stream>>>(
      parts, nparts, l.C, numel / l.C, scale_c.const_data_ptr<acc_t>(),
      rs2_c.const_data_ptr<acc_t>(), eps, b.scale_backprop.data_ptr<acc_t>(),
      b.offset_backprop.data_ptr<acc_t>(), coef.data_ptr<acc_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  apply_grad_input<scalar_t, acc_t><<<elementwise_blocks(numel), kThreads, 0, stream>>>(
      dy, x, b.dx_phys.data_ptr<scalar_t>(), numel, l.C, l.inner, l.channels_last, is_training,
      rs1_c.const_data_ptr<acc_t>(), coef.const_data_ptr<acc_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
fused_batch_norm_v3_cuda(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& offset,
                         const at::Tensor& mean, const at::Tensor& variance, double epsilon,
                         double exponential_avg_factor, c10::string_view data_format,
                         bool is_training) {
  c10::cuda::CUDAGuard guard(x.device());
  auto f = bn::prepare_forward(x, scale, offset, mean, variance, exponential_avg_factor,
                               data_format, is_training);
  if (!f.done) {
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), bn::kFwd, [&] {
      forward_cuda<scalar_t>(f, scale, offset, mean, variance, epsilon, exponential_avg_factor);
    });
  }
  return {f.y, f.batch_mean, f.batch_variance, f.rs1, f.rs2, f.rs3};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
fused_batch_norm_grad_v3_cuda(const at::Tensor& y_backprop, const at::Tensor& x,
                              const at::Tensor& scale, const at::Tensor& reserve_space_1,
                              const at::Tensor& reserve_space_2, const at::Tensor& reserve_space_3,
                              double epsilon, c10::string_view data_format, bool is_training) {
  (void)reserve_space_3;
  c10::cuda::CUDAGuard guard(x.device());
  auto b = bn::prepare_backward(y_backprop, x, scale, reserve_space_1, reserve_space_2,
                                data_format);
  if (!b.done) {
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), bn::kBwd, [&] {
      backward_cuda<scalar_t>(b, scale, reserve_space_1, reserve_space_2, epsilon, is_training);
    });
  }
  return {b.x_backprop, b.scale_backprop, b.offset_backprop, b.rs4, b.rs5};
}

// ---- synchronized batch norm's local ops (common/fused_batch_norm_sync.h) -----------------
// The sums are the gradient's partials (PushGrad; x * (x - 0) for the sum of squares), merged
// in double like finalize_grad; count (elements per channel) goes to out[2C] when given.
template <typename acc_t>
__global__ void finalize_sums(const GradSums<acc_t>* parts, int64_t nparts, int64_t C,
                              bool with_count, acc_t count, acc_t* out) {
  if (blockIdx.x == 0 && threadIdx.x == 0 && threadIdx.y == 0 && with_count) out[2 * C] = count;
  GradSums<double> sums;
  const auto group = [&](int64_t c, int g) {
    return bn::merge_grad_sums_group(parts, nparts, C, c, g);
  };
  if (!merge_channel(C, group, &sums)) return;
  const int64_t c = blockIdx.x * int64_t(kWarp) + threadIdx.x;
  out[c] = acc_t(sums.sdy);
  out[C + c] = acc_t(sums.sdyxc);
}

// The input gradient's coefficients (A, mean(dy), B as in finalize_grad) from the all-reduced
// sums and count; divide_no_nan when the global count is 0.
template <typename acc_t>
__global__ void sync_grad_coef(const acc_t* sums, const acc_t* count, int64_t C, const acc_t* scale,
                               const acc_t* var, acc_t eps, acc_t* coef) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  const acc_t n = count[0];
  const acc_t inv = acc_t(1) / sqrt(var[c] + eps);
  coef[c] = scale[c] * inv;
  coef[C + c] = n == acc_t(0) ? acc_t(0) : sums[c] * (acc_t(1) / n);
  coef[2 * C + c] = n == acc_t(0) ? acc_t(0) : inv * inv * (sums[C + c] / n);
}

// Per-channel sums of dy and dy * (x - mean) into out[0:2C] (and the count into out[2C]).
template <typename scalar_t>
void sync_sums_cuda(const bn_sync::Prepared& p, const scalar_t* dy, const at::Tensor& mean,
                    bool with_count, at::Tensor& out) {
  using acc_t = at::opmath_type<scalar_t>;
  const auto& l = p.layout;
  auto stream = c10::cuda::getCurrentCUDAStream();
  const launch::BnPlan plan = plan_for(l);
  at::Tensor ws = at::empty({int64_t(sizeof(GradSums<acc_t>)) * plan.parts * l.C},
                            p.x_phys.options().dtype(at::kByte));
  auto* parts = reinterpret_cast<GradSums<acc_t>*>(ws.data_ptr());
  const at::Tensor mean_c = mean.contiguous();
  launch_partials(l, plan,
                  PushGrad<scalar_t, acc_t>{dy, p.x_phys.const_data_ptr<scalar_t>(),
                                            mean_c.const_data_ptr<acc_t>()},
                  parts, stream);
  const int64_t nparts = plan.parts;
  finalize_sums<acc_t><<<finalize_grid(l.C), kFinalizeBlock, 0, stream>>>(
      parts, nparts, l.C, with_count, acc_t(p.count), out.data_ptr<acc_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

at::Tensor sync_stats_cuda(const at::Tensor& x, c10::string_view data_format) {
  c10::cuda::CUDAGuard guard(x.device());
  auto p = bn_sync::prepare_stats(x, data_format);
  at::Tensor out = at::zeros({2 * p.C + 1}, x.options().dtype(p.pdt));
  if (x.numel() == 0) {
    out[2 * p.C].fill_(static_cast<double>(p.count));
    return out;
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), bn_sync::kStats, [&] {
    const at::Tensor zero = at::zeros({p.C}, out.options());  // sum x * (x - 0)
    sync_sums_cuda<scalar_t>(p, p.x_phys.const_data_ptr<scalar_t>(), zero, true, out);
  });
  return out;
}

at::Tensor sync_grad_sums_cuda(const at::Tensor& y_backprop, const at::Tensor& x,
                               const at::Tensor& mean, c10::string_view data_format) {
  c10::cuda::CUDAGuard guard(x.device());
  auto p = bn_sync::prepare_grad(y_backprop, x, mean, data_format, bn_sync::kGradSums);
  at::Tensor out = at::zeros({2 * p.C}, x.options().dtype(p.pdt));
  if (x.numel() == 0) return out;
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, x.scalar_type(), bn_sync::kGradSums,
      [&] { sync_sums_cuda<scalar_t>(p, p.dy_phys.const_data_ptr<scalar_t>(), mean, false, out); });
  return out;
}

at::Tensor sync_backprop_input_cuda(const at::Tensor& y_backprop, const at::Tensor& x,
                                    const at::Tensor& scale, const at::Tensor& mean,
                                    const at::Tensor& variance, const at::Tensor& grad_sums,
                                    const at::Tensor& count, double epsilon,
                                    c10::string_view data_format) {
  c10::cuda::CUDAGuard guard(x.device());
  auto p = bn_sync::prepare_backprop_input(y_backprop, x, scale, mean, variance, grad_sums, count,
                                           data_format);
  at::Tensor dx = empty_in_layout(x.sizes(), p.layout, x.options());
  if (x.numel() == 0) return dx;
  at::Tensor dx_phys = dx.permute(p.layout.perm);
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, x.scalar_type(), bn_sync::kBackpropInput, [&] {
        using acc_t = at::opmath_type<scalar_t>;
        constexpr bool is_double = std::is_same<scalar_t, double>::value;
        const acc_t eps = is_double ? acc_t(epsilon) : acc_t(static_cast<float>(epsilon));
        const auto& l = p.layout;
        auto stream = c10::cuda::getCurrentCUDAStream();
        const at::Tensor sc = scale.contiguous(), mu = mean.contiguous(),
                         var = variance.contiguous(), gs = grad_sums.contiguous();
        at::Tensor coef = at::empty({3 * l.C}, mu.options());
        sync_grad_coef<acc_t><<<(l.C + 127) / 128, 128, 0, stream>>>(
            gs.const_data_ptr<acc_t>(), count.const_data_ptr<acc_t>(), l.C,
            sc.const_data_ptr<acc_t>(), var.const_data_ptr<acc_t>(), eps, coef.data_ptr<acc_t>());
        C10_CUDA_KERNEL_LAUNCH_CHECK();
        const int64_t numel = p.x_phys.numel();
        apply_grad_input<scalar_t, acc_t><<<elementwise_blocks(numel), kThreads, 0, stream>>>(
            p.dy_phys.const_data_ptr<scalar_t>(), p.x_phys.const_data_ptr<scalar_t>(),
            dx_phys.data_ptr<scalar_t>(), numel, l.C, l.inner, l.channels_last, true,
            mu.const_data_ptr<acc_t>(), coef.const_data_ptr<acc_t>());
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
  return dx;
}

}  // namespace

TORCH_LIBRARY_IMPL(tfgrads, CUDA, m) {
  m.impl("fused_batch_norm_v3", &fused_batch_norm_v3_cuda);
  m.impl("fused_batch_norm_grad_v3", &fused_batch_norm_grad_v3_cuda);
  m.impl("fused_batch_norm_sync_stats", &sync_stats_cuda);
  m.impl("fused_batch_norm_sync_grad_sums", &sync_grad_sums_cuda);
  m.impl("fused_batch_norm_sync_backprop_input", &sync_backprop_input_cuda);
}

}  // namespace torch_tfgrads
