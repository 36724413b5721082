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
#include "cpu/widen.h"

namespace torch_tfgrads {
namespace bn_cpu {
namespace {

// sdy[c] += dy[r, c], sdyxc[c] += dy[r, c] * (x[r, c] - m[c]) over one row (the gradient's sums
// above 64 channels, where the tiled sweep below is slower).
template <typename scalar_t, typename acc_t>
inline void row_grad_sums(acc_t* sdy, acc_t* sdyxc, const scalar_t* dy, const scalar_t* x,
                          const acc_t* m, int64_t C) {
  using W = Widen<scalar_t, acc_t>;
  using Vec = typename W::Vec;
  int64_t c = 0;
  for (; c + Vec::size() <= C; c += Vec::size()) {
    const Vec g = W::load(dy + c);
    (Vec::loadu(sdy + c) + g).store(sdy + c);
    (Vec::loadu(sdyxc + c) + g * (W::load(x + c) - Vec::loadu(m + c))).store(sdyxc + c);
  }
  for (; c < C; ++c) {
    const acc_t g = static_cast<acc_t>(dy[c]);
    sdy[c] += g;
    sdyxc[c] += g * (static_cast<acc_t>(x[c]) - m[c]);
  }
}

// sdy[c] += dy[r, c], sdyxc[c] += dy[r, c] * (x[r, c] - m[c]) over rows [r0, r1)
template <typename scalar_t, typename acc_t>
inline void rows_grad_sums(acc_t* sdy, acc_t* sdyxc, const scalar_t* dy, const scalar_t* x,
                           const acc_t* m, int64_t r0, int64_t r1, int64_t C) {
  using W = Widen<scalar_t, acc_t>;
  using Vec = typename W::Vec;
  constexpr int64_t V = Vec::size();
  channel_blocks<acc_t>(
      r0, r1, C,
      [&](auto nv, int64_t a, int64_t b, int64_t c) {
        constexpr int NV = decltype(nv)::value;
        Vec s[NV], t[NV], vm[NV];
        for (int v = 0; v < NV; ++v) {
          s[v] = Vec::loadu(sdy + c + v * V);
          t[v] = Vec::loadu(sdyxc + c + v * V);
          vm[v] = Vec::loadu(m + c + v * V);
        }
        for (int64_t r = a; r < b; ++r)
          for (int v = 0; v < NV; ++v) {
            const int64_t i = r * C + c + v * V;
            const Vec g = W::load(dy + i);
            s[v] = s[v] + g;
            t[v] = t[v] + g * (W::load(x + i) - vm[v]);
          }
        for (int v = 0; v < NV; ++v) {
          s[v].store(sdy + c + v * V);
          t[v].store(sdyxc + c + v * V);
        }
      },
      [&](int64_t a, int64_t b, int64_t c0) {
        for (int64_t r = a; r < b; ++r)
          for (int64_t c = c0; c < C; ++c) {
            const acc_t g = static_cast<acc_t>(dy[r * C + c]);
            sdy[c] += g;
            sdyxc[c] += g * (static_cast<acc_t>(x[r * C + c]) - m[c]);
          }
      });
}

// dx[r, c] = A[c] * ((dy[r, c] - mdy[c]) - (x[r, c] - m[c]) * B[c]) over rows [r0, r1)
// (training-mode input gradient). kStream: float dx, non-temporal (dx 32-byte aligned, C % 8 == 0).
template <typename scalar_t, typename acc_t, bool kStream>
inline void rows_grad_input(scalar_t* dx, const scalar_t* dy, const scalar_t* x, int64_t r0,
                            int64_t r1, int64_t C, const acc_t* A, const acc_t* mdy, const acc_t* m,
                            const acc_t* B) {
  using W = Widen<scalar_t, acc_t>;
  using Vec = typename W::Vec;
  for (int64_t i0 = r0 * C; i0 < r1 * C; i0 += C) {
    int64_t c = 0;
    for (; c + Vec::size() <= C; c += Vec::size()) {
      const int64_t i = i0 + c;
      const Vec r = (W::load(dy + i) - Vec::loadu(mdy + c)) -
                    (W::load(x + i) - Vec::loadu(m + c)) * Vec::loadu(B + c);
      put<kStream, scalar_t, acc_t>(dx + i, Vec::loadu(A + c) * r);
    }
    for (; c < C; ++c) {
      const int64_t i = i0 + c;
      const acc_t r = (static_cast<acc_t>(dy[i]) - mdy[c]) -
                      (static_cast<acc_t>(x[i]) - m[c]) * B[c];
      dx[i] = static_cast<scalar_t>(A[c] * r);
    }
  }
}

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

template <typename scalar_t, typename acc_t>
inline void plane_grad_sums(const scalar_t* dy, const scalar_t* x, int64_t L, acc_t m,
                            acc_t& out_sdy, acc_t& out_sdyxc) {
  using W = Widen<scalar_t, acc_t>;
  using Vec = typename W::Vec;
  constexpr int64_t V = Vec::size();
  const Vec vm(m);
  Vec s0(0), s1(0), t0(0), t1(0);
  int64_t i = 0;
  for (; i + 2 * V <= L; i += 2 * V) {
    const Vec g0 = W::load(dy + i), g1 = W::load(dy + i + V);
    s0 = s0 + g0;
    s1 = s1 + g1;
    t0 = t0 + g0 * (W::load(x + i) - vm);
    t1 = t1 + g1 * (W::load(x + i + V) - vm);
  }
  for (; i + V <= L; i += V) {
    const Vec g = W::load(dy + i);
    s0 = s0 + g;
    t0 = t0 + g * (W::load(x + i) - vm);
  }
  acc_t sdy = hsum<acc_t>(s0 + s1), sdyxc = hsum<acc_t>(t0 + t1);
  for (; i < L; ++i) {
    const acc_t g = static_cast<acc_t>(dy[i]);
    sdy += g;
    sdyxc += g * (static_cast<acc_t>(x[i]) - m);
  }
  out_sdy = sdy;
  out_sdyxc = sdyxc;
}

// dx = A * ((dy - mdy) - (x - m) * B) over the L values of one plane (training-mode input
// gradient). kStream: float dx, non-temporal (dx 32-byte aligned, L whole vectors).
template <typename scalar_t, typename acc_t, bool kStream>
inline void plane_grad_input(scalar_t* dx, const scalar_t* dy, const scalar_t* x, int64_t L,
                             acc_t A, acc_t mdy, acc_t m, acc_t B) {
  using W = Widen<scalar_t, acc_t>;
  using Vec = typename W::Vec;
  const Vec vA(A), vmdy(mdy), vm(m), vB(B);
  int64_t i = 0;
  for (; i + Vec::size() <= L; i += Vec::size())
    put<kStream, scalar_t, acc_t>(dx + i,
                                  vA * ((W::load(dy + i) - vmdy) - (W::load(x + i) - vm) * vB));
  for (; i < L; ++i) {
    const acc_t r = (static_cast<acc_t>(dy[i]) - mdy) - (static_cast<acc_t>(x[i]) - m) * B;
    dx[i] = static_cast<scalar_t>(A * r);
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

// Per-channel sums of dy and dy * (x - m) (both layouts), accumulated in chunks, totals in double.
template <typename scalar_t, typename acc_t>
void grad_sums(const ChannelLayout& l, const scalar_t* dy, const scalar_t* x, const acc_t* m,
               std::vector<double>& sdy, std::vector<double>& sdyxc) {
  const int64_t C = l.C;
  sdy.assign(C, 0.0);
  sdyxc.assign(C, 0.0);
  if (l.channels_last) {
    const int64_t rows = l.outer;
    const int64_t R = std::max<int64_t>(1, kChunkElems / C);
    const int64_t nchunk = (rows + R - 1) / R;
    std::vector<double> p1(nchunk * C), p2(nchunk * C);
    at::parallel_for(0, nchunk, 1, [&](int64_t b, int64_t e) {
      std::vector<acc_t> a1(C), a2(C);
      for (int64_t k = b; k < e; ++k) {
        std::fill(a1.begin(), a1.end(), acc_t(0));
        std::fill(a2.begin(), a2.end(), acc_t(0));
        const int64_t r0 = k * R, r1 = std::min(rows, (k + 1) * R);
        if (C <= 64) {
          rows_grad_sums<scalar_t, acc_t>(a1.data(), a2.data(), dy, x, m, r0, r1, C);
        } else {
          for (int64_t r = r0; r < r1; ++r)
            row_grad_sums<scalar_t, acc_t>(a1.data(), a2.data(), dy + r * C, x + r * C, m, C);
        }
        std::copy(a1.begin(), a1.end(), p1.begin() + k * C);
        std::copy(a2.begin(), a2.end(), p2.begin() + k * C);
      }
    });
    for (int64_t k = 0; k < nchunk; ++k)
      for (int64_t c = 0; c < C; ++c) {
        sdy[c] += p1[k * C + c];
        sdyxc[c] += p2[k * C + c];
      }
  } else {
    const int64_t N = l.outer, S = l.inner;
    std::vector<double> p1(N * C), p2(N * C);
    at::parallel_for(0, N * C, std::max<int64_t>(1, kChunkElems / S), [&](int64_t b, int64_t e) {
      for (int64_t plane = b; plane < e; ++plane) {
        acc_t a1, a2;
        plane_grad_sums<scalar_t, acc_t>(dy + plane * S, x + plane * S, S, m[plane % C], a1, a2);
        p1[plane] = a1;
        p2[plane] = a2;
      }
    });
    for (int64_t plane = 0; plane < N * C; ++plane) {
      sdy[plane % C] += p1[plane];
      sdyxc[plane % C] += p2[plane];
    }
  }
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
    // A dx beyond the caches is written with non-temporal stores: no read-for-ownership of
    // its lines, and x and dy are not evicted. (Walking this second pass backwards, to start
    // on the x and dy the sums pass read last, measured no gain: the L3 does not keep them.)
    const int64_t S = b.layout.inner;
    const bool stream = can_stream(b.layout, dx, b.dx_phys.numel(), int64_t{4} << 20);
    with_stream(stream, [&](auto streamed) {
      constexpr bool kStream = decltype(streamed)::value;
      for_each_span(
          b.layout,
          [&](int64_t r0, int64_t r1) {
            rows_grad_input<scalar_t, acc_t, kStream>(dx, dy, x, r0, r1, C, A.data(), mdy.data(),
                                                      m.data(), B.data());
          },
          [&](int64_t p, int64_t c) {
            plane_grad_input<scalar_t, acc_t, kStream>(dx + p * S, dy + p * S, x + p * S, S, A[c],
                                                       mdy[c], m[c], B[c]);
          },
          kStream);
    });
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
