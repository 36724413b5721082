// fused_batch_norm_grad_v3 on the CPU: the per-channel sums of dy and dy * (x - mean) in
// chunks (totals in double), then one elementwise pass for x_backprop in the input's physical
// layout.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <utility>
#include <vector>

#include "common/fused_batch_norm.h"
#include "cpu/fused_batch_norm_cpu.h"
#include "cpu/fused_batch_norm_grad_kernels.h"
#include "cpu/widen.h"

namespace torch_tfgrads {
namespace bn_cpu {
namespace {

// dx[r, c] = A[c] * dy[r, c] over rows [r0, r1) (inference-mode input gradient)
template <typename scalar_t, typename acc_t>
inline void rows_scale(scalar_t* dx, const scalar_t* dy, int64_t r0, int64_t r1, int64_t C,
                       const acc_t* A) {
  using W = Widen<scalar_t, acc_t>;
  using Vec = typename W::Vec;
  for (int64_t i0 = r0 * C; i0 < r1 * C; i0 += C) {
    int64_t c = 0;
    for (; c + Vec::size() <= C; c += Vec::size())
      W::store(dx + i0 + c, Vec::loadu(A + c) * W::load(dy + i0 + c));
    for (; c < C; ++c) dx[i0 + c] = static_cast<scalar_t>(A[c] * static_cast<acc_t>(dy[i0 + c]));
  }
}

// dx = A * dy over the L values of one plane (inference-mode input gradient: x is not read)
template <typename scalar_t, typename acc_t>
inline void plane_scale(scalar_t* dx, const scalar_t* dy, int64_t L, acc_t A) {
  using W = Widen<scalar_t, acc_t>;
  using Vec = typename W::Vec;
  const Vec vA(A);
  int64_t i = 0;
  for (; i + Vec::size() <= L; i += Vec::size()) W::store(dx + i, vA * W::load(dy + i));
  for (; i < L; ++i) dx[i] = static_cast<scalar_t>(A * static_cast<acc_t>(dy[i]));
}

template <typename scalar_t>
void backward_kernel(bn::Backward& b, const at::Tensor& scale, const at::Tensor& rs1,
                     const at::Tensor& rs2, double epsilon, bool is_training) {
  using acc_t = at::opmath_type<scalar_t>;
  const bool is_double = std::is_same<scalar_t, double>::value;
  const acc_t eps = is_double ? acc_t(epsilon) : acc_t(static_cast<float>(epsilon));
  const int64_t C = b.layout.C;
  const int64_t n = b.x_phys.numel() / C;
  const at::Tensor scale_c = scale.contiguous(), rs1_c = rs1.contiguous(), rs2_c = rs2.contiguous();
  const acc_t* sc = scale_c.const_data_ptr<acc_t>();
  const acc_t* mu = rs1_c.const_data_ptr<acc_t>();
  const acc_t* var = rs2_c.const_data_ptr<acc_t>();
  const scalar_t* x = b.x_phys.const_data_ptr<scalar_t>();
  const scalar_t* dy = b.dy_phys.const_data_ptr<scalar_t>();
  scalar_t* dx = b.dx_phys.data_ptr<scalar_t>();

  std::vector<acc_t> m(mu, mu + C);
  std::vector<double> sdy, sdyxc;
  grad_sums<scalar_t, acc_t>(b.layout, dy, x, m.data(), sdy, sdyxc);

  std::vector<acc_t> A(C), mdy(C), B(C);
  acc_t* gscale = b.scale_backprop.data_ptr<acc_t>();
  acc_t* goffset = b.offset_backprop.data_ptr<acc_t>();
  const acc_t inv_n = acc_t(1) / static_cast<acc_t>(n);
  for (int64_t c = 0; c < C; ++c) {
    const acc_t inv = acc_t(1) / std::sqrt(var[c] + eps);
    const acc_t s1 = static_cast<acc_t>(sdy[c]), s2 = static_cast<acc_t>(sdyxc[c]);
    goffset[c] = s1;
    gscale[c] = s2 * inv;
    A[c] = sc[c] * inv;
    mdy[c] = s1 * inv_n;
    B[c] = inv * inv * (s2 / static_cast<acc_t>(n));
  }
  if (is_training) {
    grad_input_pass<scalar_t, acc_t>(b.layout, dx, b.dx_phys.numel(), dy, x, A.data(), mdy.data(),
                                     m.data(), B.data());
  } else {
    const int64_t S = b.layout.inner;
    for_each_span(
        b.layout,
        [&](int64_t r0, int64_t r1) { rows_scale<scalar_t, acc_t>(dx, dy, r0, r1, C, A.data()); },
        [&](int64_t p, int64_t c) {
          plane_scale<scalar_t, acc_t>(dx + p * S, dy + p * S, S, A[c]);
        });
  }
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
fused_batch_norm_grad_v3_cpu(const at::Tensor& y_backprop, const at::Tensor& x,
                             const at::Tensor& scale, const at::Tensor& reserve_space_1,
                             const at::Tensor& reserve_space_2, const at::Tensor& reserve_space_3,
                             double epsilon, c10::string_view data_format, bool is_training) {
  (void)reserve_space_3;  // TF's CPU kernel does not inspect it either
  auto b = bn::prepare_backward(y_backprop, x, scale, reserve_space_1, reserve_space_2,
                                data_format);
  if (!b.done) {
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), bn::kBwd, [&] {
      backward_kernel<scalar_t>(b, scale, reserve_space_1, reserve_space_2, epsilon, is_training);
    });
  }
  return {b.x_backprop, b.scale_backprop, b.offset_backprop, b.rs4, b.rs5};
}

}  // namespace bn_cpu
}  // namespace torch_tfgrads
