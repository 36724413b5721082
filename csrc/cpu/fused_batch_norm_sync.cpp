// CPU kernels of the synchronized batch norm's local ops (common/fused_batch_norm_sync.h has
// the contract). Both reductions are fused_batch_norm_grad_v3's own (grad_sums: chunks of a
// fixed size, accumulated in float or double, chunk totals in double), so the per-process sums
// do not depend on the thread count, and the input gradient is its elementwise pass with
// coefficients from the all-reduced sums.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <cmath>
#include <vector>

#include "common/fused_batch_norm_sync.h"
#include "cpu/fused_batch_norm_cpu.h"
#include "cpu/fused_batch_norm_grad_kernels.h"

namespace torch_tfgrads {
namespace bn_cpu {
namespace {

at::Tensor sync_stats_cpu(const at::Tensor& x, c10::string_view data_format) {
  auto p = bn_sync::prepare_stats(x, data_format);
  const int64_t C = p.C;
  at::Tensor out = at::zeros({2 * C + 1}, x.options().dtype(p.pdt));
  if (x.numel() > 0) {
    AT_DISPATCH_FLOATING_TYPES_AND2(
        at::kHalf, at::kBFloat16, x.scalar_type(), bn_sync::kStats, [&] {
          using acc_t = at::opmath_type<scalar_t>;
          const scalar_t* px = p.x_phys.const_data_ptr<scalar_t>();
          const std::vector<acc_t> zero(C, acc_t(0));
          std::vector<double> s1, s2;
          // sum x * (x - 0): the sum of squares in the same order
          grad_sums<scalar_t, acc_t>(p.layout, px, px, zero.data(), s1, s2);
          acc_t* o = out.data_ptr<acc_t>();
          for (int64_t c = 0; c < C; ++c) {
            o[c] = static_cast<acc_t>(s1[c]);
            o[C + c] = static_cast<acc_t>(s2[c]);
          }
        });
  }
  out[2 * C].fill_(static_cast<double>(p.count));
  return out;
}

at::Tensor sync_grad_sums_cpu(const at::Tensor& y_backprop, const at::Tensor& x,
                              const at::Tensor& mean, c10::string_view data_format) {
  auto p = bn_sync::prepare_grad(y_backprop, x, mean, data_format, bn_sync::kGradSums);
  const int64_t C = p.C;
  at::Tensor out = at::zeros({2 * C}, x.options().dtype(p.pdt));
  if (x.numel() == 0) return out;
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, x.scalar_type(), bn_sync::kGradSums, [&] {
        using acc_t = at::opmath_type<scalar_t>;
        const at::Tensor mean_c = mean.contiguous();
        const acc_t* mu = mean_c.const_data_ptr<acc_t>();
        const std::vector<acc_t> m(mu, mu + C);
        std::vector<double> s1, s2;
        grad_sums<scalar_t, acc_t>(p.layout, p.dy_phys.const_data_ptr<scalar_t>(),
                                   p.x_phys.const_data_ptr<scalar_t>(), m.data(), s1, s2);
        acc_t* o = out.data_ptr<acc_t>();
        for (int64_t c = 0; c < C; ++c) {
          o[c] = static_cast<acc_t>(s1[c]);
          o[C + c] = static_cast<acc_t>(s2[c]);
        }
      });
  return out;
}

template <typename scalar_t>
void backprop_input_kernel(const bn_sync::Prepared& p, at::Tensor& dx_phys, const at::Tensor& scale,
                           const at::Tensor& mean, const at::Tensor& variance,
                           const at::Tensor& grad_sums, const at::Tensor& count, double epsilon) {
  using acc_t = at::opmath_type<scalar_t>;
  constexpr bool is_double = std::is_same_v<scalar_t, double>;
  const acc_t eps = is_double ? acc_t(epsilon) : acc_t(static_cast<float>(epsilon));
  const int64_t C = p.C;
  const at::Tensor sc_c = scale.contiguous(), mu_c = mean.contiguous(),
                   var_c = variance.contiguous(), gs_c = grad_sums.contiguous();
  const acc_t *sc = sc_c.const_data_ptr<acc_t>(), *mu = mu_c.const_data_ptr<acc_t>(),
              *var = var_c.const_data_ptr<acc_t>(), *gs = gs_c.const_data_ptr<acc_t>();
  const acc_t n = count.const_data_ptr<acc_t>()[0];
  // divide_no_nan, as Keras divides by the global count: no process has data when it is 0.
  const acc_t inv_n = n == acc_t(0) ? acc_t(0) : acc_t(1) / n;
  std::vector<acc_t> A(C), mdy(C), B(C), m(mu, mu + C);
  for (int64_t c = 0; c < C; ++c) {
    const acc_t inv = acc_t(1) / std::sqrt(var[c] + eps);
    A[c] = sc[c] * inv;
    mdy[c] = gs[c] * inv_n;
    B[c] = n == acc_t(0) ? acc_t(0) : inv * inv * (gs[C + c] / n);
  }
  grad_input_pass<scalar_t, acc_t>(
      p.layout, dx_phys.data_ptr<scalar_t>(), dx_phys.numel(), p.dy_phys.const_data_ptr<scalar_t>(),
      p.x_phys.const_data_ptr<scalar_t>(), A.data(), mdy.data(), m.data(), B.data());
}

at::Tensor sync_backprop_input_cpu(const at::Tensor& y_backprop, const at::Tensor& x,
                                   const at::Tensor& scale, const at::Tensor& mean,
                                   const at::Tensor& variance, const at::Tensor& grad_sums,
                                   const at::Tensor& count, double epsilon,
                                   c10::string_view data_format) {
  auto p = bn_sync::prepare_backprop_input(y_backprop, x, scale, mean, variance, grad_sums, count,
                                           data_format);
  at::Tensor dx = empty_in_layout(x.sizes(), p.layout, x.options());
  at::Tensor dx_phys = dx.permute(p.layout.perm);
  if (x.numel() > 0) {
    AT_DISPATCH_FLOATING_TYPES_AND2(
        at::kHalf, at::kBFloat16, x.scalar_type(), bn_sync::kBackpropInput, [&] {
          backprop_input_kernel<scalar_t>(p, dx_phys, scale, mean, variance, grad_sums, count,
                                          epsilon);
        });
  }
  return dx;
}

}  // namespace

TORCH_LIBRARY_IMPL(tfgrads, CPU, m) {
  m.impl("fused_batch_norm_sync_stats", &sync_stats_cpu);
  m.impl("fused_batch_norm_sync_grad_sums", &sync_grad_sums_cpu);
  m.impl("fused_batch_norm_sync_backprop_input", &sync_backprop_input_cpu);
}

}  // namespace bn_cpu
}  // namespace torch_tfgrads
