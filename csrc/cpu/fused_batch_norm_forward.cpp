// fused_batch_norm_v3 on the CPU: the statistics (training; fused_batch_norm_stats.cpp), then
// one elementwise pass y = (x - m) * k + o in the input's physical layout.
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
#include "cpu/widen.h"

namespace torch_tfgrads {
namespace bn_cpu {
namespace {

// out[r, c] = (a[r, c] - m[c]) * k[c] + o[c] over rows [r0, r1). kStream: float out, non-temporal
// (out 32-byte aligned, C % 8 == 0).
template <typename scalar_t, typename acc_t, bool kStream>
inline void rows_affine(scalar_t* out, const scalar_t* a, int64_t r0, int64_t r1, int64_t C,
                        const acc_t* m, const acc_t* k, const acc_t* o) {
  using W = Widen<scalar_t, acc_t>;
  using Vec = typename W::Vec;
  for (int64_t r = r0; r < r1; ++r) {
    scalar_t* y = out + r * C;
    const scalar_t* x = a + r * C;
    int64_t c = 0;
    for (; c + Vec::size() <= C; c += Vec::size())
      put<kStream, scalar_t, acc_t>(
          y + c, (W::load(x + c) - Vec::loadu(m + c)) * Vec::loadu(k + c) + Vec::loadu(o + c));
    for (; c < C; ++c)
      y[c] = static_cast<scalar_t>((static_cast<acc_t>(x[c]) - m[c]) * k[c] + o[c]);
  }
}

// out = (a - m) * k + o over the L values of one plane. kStream: float out, non-temporal (out
// 32-byte aligned, L whole vectors).
template <typename scalar_t, typename acc_t, bool kStream>
inline void plane_affine(scalar_t* out, const scalar_t* a, int64_t L, acc_t m, acc_t k, acc_t o) {
  using W = Widen<scalar_t, acc_t>;
  using Vec = typename W::Vec;
  const Vec vm(m), vk(k), vo(o);
  int64_t i = 0;
  for (; i + Vec::size() <= L; i += Vec::size())
    put<kStream, scalar_t, acc_t>(out + i, (W::load(a + i) - vm) * vk + vo);
  for (; i < L; ++i) out[i] = static_cast<scalar_t>((static_cast<acc_t>(a[i]) - m) * k + o);
}

template <typename scalar_t>
void forward_kernel(bn::Forward& f, const at::Tensor& scale, const at::Tensor& offset,
                    const at::Tensor& mean, const at::Tensor& variance, double epsilon,
                    double exponential_avg_factor) {
  using acc_t = at::opmath_type<scalar_t>;
  // TF's attrs are float32: use them as such except for float64 x.
  const bool is_double = std::is_same<scalar_t, double>::value;
  const acc_t eps = is_double ? acc_t(epsilon) : acc_t(static_cast<float>(epsilon));
  const int64_t C = f.layout.C;
  // Keep the (tiny) contiguous parameter copies alive while their pointers are used.
  const at::Tensor scale_c = scale.contiguous(), offset_c = offset.contiguous();
  const acc_t* sc = scale_c.const_data_ptr<acc_t>();
  const acc_t* of = offset_c.const_data_ptr<acc_t>();
  std::vector<acc_t> m(C), k(C), o(of, of + C);
  const scalar_t* x = f.x_phys.const_data_ptr<scalar_t>();
  if (f.training) {
    std::vector<double> dmean, dvar;
    batch_moments<scalar_t, acc_t>(f.layout, x, dmean, dvar);
    const int64_t n = f.layout.C ? f.x_phys.numel() / C : 0;
    const acc_t adjust = static_cast<acc_t>(n) / static_cast<acc_t>(std::max<int64_t>(n - 1, 1));
    const acc_t fac = is_double ? acc_t(exponential_avg_factor)
                                : acc_t(static_cast<float>(exponential_avg_factor));
    acc_t* bm = f.batch_mean.data_ptr<acc_t>();
    acc_t* bv = f.batch_variance.data_ptr<acc_t>();
    acc_t* r1 = f.rs1.data_ptr<acc_t>();
    acc_t* r2 = f.rs2.data_ptr<acc_t>();
    const at::Tensor mean_c = f.uses_running_stats ? mean.contiguous() : at::Tensor();
    const at::Tensor var_c = f.uses_running_stats ? variance.contiguous() : at::Tensor();
    const acc_t* rm = f.uses_running_stats ? mean_c.const_data_ptr<acc_t>() : nullptr;
    const acc_t* rv = f.uses_running_stats ? var_c.const_data_ptr<acc_t>() : nullptr;
    for (int64_t c = 0; c < C; ++c) {
      const acc_t mu = static_cast<acc_t>(dmean[c]), vb = static_cast<acc_t>(dvar[c]);
      m[c] = mu;
      k[c] = acc_t(1) / std::sqrt(vb + eps) * sc[c];
      r1[c] = mu;
      r2[c] = vb;  // biased: TF's CPU reserve_space_2
      if (!f.uses_running_stats) {
        bm[c] = mu;
        bv[c] = vb * adjust;  // Bessel-corrected, as TF
      } else {
        const acc_t g = acc_t(1) - fac;
        bm[c] = g * rm[c] + fac * mu;
        bv[c] = g * rv[c] + (fac * adjust) * vb;
      }
    }
  } else {
    const at::Tensor mean_c = mean.contiguous(), var_c = variance.contiguous();
    const acc_t* pm = mean_c.const_data_ptr<acc_t>();
    const acc_t* pv = var_c.const_data_ptr<acc_t>();
    for (int64_t c = 0; c < C; ++c) {
      m[c] = pm[c];
      k[c] = acc_t(1) / std::sqrt(pv[c] + eps) * sc[c];
    }
  }
  scalar_t* y = f.y_phys.data_ptr<scalar_t>();
  const int64_t S = f.layout.inner;
  // A large float y is written with non-temporal stores: no read-for-ownership of its lines,
  // and the x this pass reads again (after the statistics) is not evicted by y. Where x and y
  // both fit in the L3 (a few MB), streaming y to memory is slower, hence the 8 MiB threshold
  // (twice the gradient's, whose dx shares the caches with two inputs).
  with_stream(can_stream(f.layout, y, f.y_phys.numel(), int64_t{8} << 20), [&](auto streamed) {
    constexpr bool kStream = decltype(streamed)::value;
    for_each_span(
        f.layout,
        [&](int64_t r0, int64_t r1) {
          rows_affine<scalar_t, acc_t, kStream>(y, x, r0, r1, C, m.data(), k.data(), o.data());
        },
        [&](int64_t p, int64_t c) {
          plane_affine<scalar_t, acc_t, kStream>(y + p * S, x + p * S, S, m[c], k[c], o[c]);
        },
        kStream);
  });
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
fused_batch_norm_v3_cpu(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& offset,
                        const at::Tensor& mean, const at::Tensor& variance, double epsilon,
                        double exponential_avg_factor, c10::string_view data_format,
                        bool is_training) {
  auto f = bn::prepare_forward(x, scale, offset, mean, variance, exponential_avg_factor,
                               data_format, is_training);
  if (!f.done) {
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), bn::kFwd, [&] {
      forward_kernel<scalar_t>(f, scale, offset, mean, variance, epsilon, exponential_avg_factor);
    });
  }
  return {f.y, f.batch_mean, f.batch_variance, f.rs1, f.rs2, f.rs3};
}

}  // namespace bn_cpu
}  // namespace torch_tfgrads
