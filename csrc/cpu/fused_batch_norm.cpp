// CPU kernels of fused_batch_norm_v3 / fused_batch_norm_grad_v3 (TF's Eigen-kernel semantics).
//
// Design:
// * Both physical layouts are computed on in place (common/channel_layout.h): channels-last
//   vectorises across C within a row, channels-first vectorises along the contiguous spatial
//   plane. No transposing copies.
// * Statistics: the data is cut into cache-sized chunks; each chunk gets an exact two-pass
//   (mean, then sum of squared deviations about that mean) while it is hot in cache, and the
//   chunks are merged in double with Chan's formula. One pass over memory, no E[x^2]-E[x]^2
//   cancellation, deterministic (the chunking does not depend on the thread count).
// * Half/bfloat16 are widened to float in registers; every accumulation is in float (double
//   for float64 x), chunk totals in double.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "common/fused_batch_norm.h"
#include "cpu/widen.h"

namespace torch_tfgrads {
namespace {

using at::vec::Vectorized;

// Elements per chunk: 64 KiB of float per stream stays in L2 for the chunk's second pass.
constexpr int64_t kChunkElems = 16384;

template <typename acc_t>
acc_t hsum(const Vectorized<acc_t>& v) {
  alignas(64) acc_t tmp[Vectorized<acc_t>::size()];
  v.store(tmp);
  acc_t s = 0;
  for (int i = 0; i < Vectorized<acc_t>::size(); ++i) s += tmp[i];
  return s;
}

// (count, mean, M2) of one chunk of one channel, merged with Chan et al.'s pairwise formula.
struct Moments {
  double n = 0, mean = 0, m2 = 0;
  void merge(double nb, double mb, double m2b) {
    if (nb == 0) return;
    const double nt = n + nb, delta = mb - mean;
    mean += delta * (nb / nt);
    m2 += m2b + delta * delta * (n * nb / nt);
    n = nt;
  }
};

// ---- per-row (channels-last) and per-plane (channels-first) building blocks ----------------

template <typename scalar_t, typename acc_t>
inline void row_add(acc_t* acc, const scalar_t* x, int64_t C) {
  using W = Widen<scalar_t, acc_t>;
  using Vec = typename W::Vec;
  int64_t c = 0;
  for (; c + Vec::size() <= C; c += Vec::size())
    (Vec::loadu(acc + c) + W::load(x + c)).store(acc + c);
  for (; c < C; ++c) acc[c] += static_cast<acc_t>(x[c]);
}

template <typename scalar_t, typename acc_t>
inline void row_add_sqdev(acc_t* acc, const scalar_t* x, const acc_t* m, int64_t C) {
  using W = Widen<scalar_t, acc_t>;
  using Vec = typename W::Vec;
  int64_t c = 0;
  for (; c + Vec::size() <= C; c += Vec::size()) {
    const Vec d = W::load(x + c) - Vec::loadu(m + c);
    (Vec::loadu(acc + c) + d * d).store(acc + c);
  }
  for (; c < C; ++c) {
    const acc_t d = static_cast<acc_t>(x[c]) - m[c];
    acc[c] += d * d;
  }
}

// sdy += dy, sdyxc += dy * (x - m)
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

template <typename scalar_t, typename acc_t>
inline acc_t plane_sum(const scalar_t* x, int64_t L) {
  using W = Widen<scalar_t, acc_t>;
  using Vec = typename W::Vec;
  constexpr int64_t V = Vec::size();
  Vec a0(0), a1(0), a2(0), a3(0);
  int64_t i = 0;
  for (; i + 4 * V <= L; i += 4 * V) {
    a0 = a0 + W::load(x + i);
    a1 = a1 + W::load(x + i + V);
    a2 = a2 + W::load(x + i + 2 * V);
    a3 = a3 + W::load(x + i + 3 * V);
  }
  for (; i + V <= L; i += V) a0 = a0 + W::load(x + i);
  acc_t s = hsum<acc_t>((a0 + a1) + (a2 + a3));
  for (; i < L; ++i) s += static_cast<acc_t>(x[i]);
  return s;
}

template <typename scalar_t, typename acc_t>
inline acc_t plane_sqdev(const scalar_t* x, int64_t L, acc_t m) {
  using W = Widen<scalar_t, acc_t>;
  using Vec = typename W::Vec;
  constexpr int64_t V = Vec::size();
  const Vec vm(m);
  Vec a0(0), a1(0);
  int64_t i = 0;
  for (; i + 2 * V <= L; i += 2 * V) {
    const Vec d0 = W::load(x + i) - vm, d1 = W::load(x + i + V) - vm;
    a0 = a0 + d0 * d0;
    a1 = a1 + d1 * d1;
  }
  for (; i + V <= L; i += V) {
    const Vec d = W::load(x + i) - vm;
    a0 = a0 + d * d;
  }
  acc_t s = hsum<acc_t>(a0 + a1);
  for (; i < L; ++i) {
    const acc_t d = static_cast<acc_t>(x[i]) - m;
    s += d * d;
  }
  return s;
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

// out = (a - m) * k + o, elementwise over L values sharing scalar (m, k, o)  [channels-first]
// or per-channel arrays (m[c], k[c], o[c])                                   [channels-last]
template <typename scalar_t, typename acc_t, bool kPerChannel>
inline void affine(scalar_t* out, const scalar_t* a, int64_t L, const acc_t* m, const acc_t* k,
                   const acc_t* o) {
  using W = Widen<scalar_t, acc_t>;
  using Vec = typename W::Vec;
  int64_t i = 0;
  if (kPerChannel) {
    for (; i + Vec::size() <= L; i += Vec::size())
      W::store(out + i, (W::load(a + i) - Vec::loadu(m + i)) * Vec::loadu(k + i) + Vec::loadu(o + i));
    for (; i < L; ++i)
      out[i] = static_cast<scalar_t>((static_cast<acc_t>(a[i]) - m[i]) * k[i] + o[i]);
  } else {
    const Vec vm(*m), vk(*k), vo(*o);
    for (; i + Vec::size() <= L; i += Vec::size())
      W::store(out + i, (W::load(a + i) - vm) * vk + vo);
    for (; i < L; ++i)
      out[i] = static_cast<scalar_t>((static_cast<acc_t>(a[i]) - *m) * *k + *o);
  }
}

// dx = A * ((dy - mdy) - (x - m) * B)   (training-mode input gradient)
// kStream: float dx written with non-temporal stores (dx + i 32-byte aligned, L whole vectors).
template <typename scalar_t, typename acc_t, bool kPerChannel, bool kStream = false>
inline void grad_input(scalar_t* dx, const scalar_t* dy, const scalar_t* x, int64_t L,
                       const acc_t* A, const acc_t* mdy, const acc_t* m, const acc_t* B) {
  using W = Widen<scalar_t, acc_t>;
  using Vec = typename W::Vec;
  auto put = [](scalar_t* p, const Vec& v) {
    if constexpr (kStream && std::is_same_v<scalar_t, float>)
      stream_store(p, v);
    else
      W::store(p, v);
  };
  int64_t i = 0;
  const int64_t s = kPerChannel ? 1 : 0;  // stride of the coefficient arrays
  if (kPerChannel) {
    for (; i + Vec::size() <= L; i += Vec::size()) {
      const Vec r = (W::load(dy + i) - Vec::loadu(mdy + i)) -
                    (W::load(x + i) - Vec::loadu(m + i)) * Vec::loadu(B + i);
      put(dx + i, Vec::loadu(A + i) * r);
    }
  } else {
    const Vec vA(*A), vmdy(*mdy), vm(*m), vB(*B);
    for (; i + Vec::size() <= L; i += Vec::size())
      put(dx + i, vA * ((W::load(dy + i) - vmdy) - (W::load(x + i) - vm) * vB));
  }
  for (; i < L; ++i) {
    const acc_t r = (static_cast<acc_t>(dy[i]) - mdy[i * s]) -
                    (static_cast<acc_t>(x[i]) - m[i * s]) * B[i * s];
    dx[i] = static_cast<scalar_t>(A[i * s] * r);
  }
}

// dx = A * dy   (inference-mode input gradient: x is not read)
template <typename scalar_t, typename acc_t, bool kPerChannel>
inline void scale_only(scalar_t* dx, const scalar_t* dy, int64_t L, const acc_t* A) {
  using W = Widen<scalar_t, acc_t>;
  using Vec = typename W::Vec;
  int64_t i = 0;
  if (kPerChannel) {
    for (; i + Vec::size() <= L; i += Vec::size())
      W::store(dx + i, Vec::loadu(A + i) * W::load(dy + i));
    for (; i < L; ++i) dx[i] = static_cast<scalar_t>(A[i] * static_cast<acc_t>(dy[i]));
  } else {
    const Vec vA(*A);
    for (; i + Vec::size() <= L; i += Vec::size()) W::store(dx + i, vA * W::load(dy + i));
    for (; i < L; ++i) dx[i] = static_cast<scalar_t>(*A * static_cast<acc_t>(dy[i]));
  }
}

// ---- whole-tensor passes ---------------------------------------------------------------------

// Per-channel mean and biased variance of x (both layouts).
template <typename scalar_t, typename acc_t>
void batch_moments(const ChannelLayout& l, const scalar_t* x, std::vector<double>& mean,
                   std::vector<double>& var) {
  const int64_t C = l.C;
  std::vector<Moments> total(C);
  if (l.channels_last) {
    const int64_t rows = l.outer;
    const int64_t R = std::max<int64_t>(1, kChunkElems / C);
    const int64_t nchunk = (rows + R - 1) / R;
    std::vector<double> pmean(nchunk * C), pm2(nchunk * C);
    at::parallel_for(0, nchunk, 1, [&](int64_t b, int64_t e) {
      std::vector<acc_t> acc(C), cm(C);
      for (int64_t k = b; k < e; ++k) {
        const int64_t r0 = k * R, r1 = std::min(rows, r0 + R);
        std::fill(acc.begin(), acc.end(), acc_t(0));
        for (int64_t r = r0; r < r1; ++r) row_add<scalar_t, acc_t>(acc.data(), x + r * C, C);
        for (int64_t c = 0; c < C; ++c) cm[c] = acc[c] / static_cast<acc_t>(r1 - r0);
        std::fill(acc.begin(), acc.end(), acc_t(0));
        for (int64_t r = r0; r < r1; ++r)
          row_add_sqdev<scalar_t, acc_t>(acc.data(), x + r * C, cm.data(), C);
        for (int64_t c = 0; c < C; ++c) {
          pmean[k * C + c] = cm[c];
          pm2[k * C + c] = acc[c];
        }
      }
    });
    for (int64_t k = 0; k < nchunk; ++k) {
      const double n = static_cast<double>(std::min(rows, (k + 1) * R) - k * R);
      for (int64_t c = 0; c < C; ++c) total[c].merge(n, pmean[k * C + c], pm2[k * C + c]);
    }
  } else {
    const int64_t N = l.outer, S = l.inner;
    const int64_t L = std::min<int64_t>(S, kChunkElems), nsub = (S + L - 1) / L;
    const int64_t nparts = N * C * nsub;
    std::vector<double> pmean(nparts), pm2(nparts);
    at::parallel_for(0, nparts, std::max<int64_t>(1, kChunkElems / L), [&](int64_t b, int64_t e) {
      for (int64_t p = b; p < e; ++p) {
        const int64_t plane = p / nsub, j = p % nsub;  // plane = n * C + c
        const int64_t s0 = j * L, len = std::min(S, s0 + L) - s0;
        const scalar_t* xp = x + plane * S + s0;
        const acc_t m = plane_sum<scalar_t, acc_t>(xp, len) / static_cast<acc_t>(len);
        pmean[p] = m;
        pm2[p] = plane_sqdev<scalar_t, acc_t>(xp, len, m);
      }
    });
    for (int64_t n = 0; n < N; ++n)
      for (int64_t c = 0; c < C; ++c)
        for (int64_t j = 0; j < nsub; ++j) {
          const int64_t p = (n * C + c) * nsub + j;
          const double len = static_cast<double>(std::min(S, (j + 1) * L) - j * L);
          total[c].merge(len, pmean[p], pm2[p]);
        }
  }
  mean.resize(C);
  var.resize(C);
  for (int64_t c = 0; c < C; ++c) {
    mean[c] = total[c].mean;
    var[c] = total[c].m2 / total[c].n;
  }
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
        for (int64_t r = k * R; r < std::min(rows, (k + 1) * R); ++r)
          row_grad_sums<scalar_t, acc_t>(a1.data(), a2.data(), dy + r * C, x + r * C, m, C);
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

// Runs body(out, in..., L, offset-of-channel-arrays) over the tensor in parallel chunks:
// channels-last rows (per-channel coefficient arrays) or channels-first planes (scalars).
// fence: body streams its stores (stream_fence() at the end of each thread's range).
template <typename F>
void for_each_span(const ChannelLayout& l, F&& body, bool fence = false) {
  const int64_t C = l.C;
  if (l.channels_last) {
    at::parallel_for(0, l.outer, std::max<int64_t>(1, kChunkElems / C), [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) body(r * C, C, int64_t(0), /*per_channel=*/true);
      if (fence) stream_fence();
    });
  } else {
    const int64_t S = l.inner;
    at::parallel_for(0, l.outer * C, std::max<int64_t>(1, kChunkElems / S), [&](int64_t b, int64_t e) {
      for (int64_t plane = b; plane < e; ++plane) body(plane * S, S, plane % C, false);
      if (fence) stream_fence();
    });
  }
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
  for_each_span(f.layout, [&](int64_t off, int64_t L, int64_t c, bool per_channel) {
    if (per_channel)
      affine<scalar_t, acc_t, true>(y + off, x + off, L, m.data(), k.data(), o.data());
    else
      affine<scalar_t, acc_t, false>(y + off, x + off, L, &m[c], &k[c], &o[c]);
  });
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
    const int64_t span = b.layout.channels_last ? C : b.layout.inner;
    const bool stream = std::is_same_v<scalar_t, float> && span % 8 == 0 &&
                        reinterpret_cast<uintptr_t>(dx) % 32 == 0 &&
                        worth_streaming(b.dx_phys.numel() * 4);
    auto pass = [&](auto streamed) {
      constexpr bool kStream = decltype(streamed)::value;
      for_each_span(b.layout, [&](int64_t off, int64_t L, int64_t c, bool per_channel) {
        if (per_channel)
          grad_input<scalar_t, acc_t, true, kStream>(dx + off, dy + off, x + off, L, A.data(),
                                                     mdy.data(), m.data(), B.data());
        else
          grad_input<scalar_t, acc_t, false, kStream>(dx + off, dy + off, x + off, L, &A[c],
                                                      &mdy[c], &m[c], &B[c]);
      }, kStream);
    };
    if (stream)
      pass(std::true_type{});
    else
      pass(std::false_type{});
  } else {
    for_each_span(b.layout, [&](int64_t off, int64_t L, int64_t c, bool per_channel) {
      if (per_channel)
        scale_only<scalar_t, acc_t, true>(dx + off, dy + off, L, A.data());
      else
        scale_only<scalar_t, acc_t, false>(dx + off, dy + off, L, &A[c]);
    });
  }
}

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

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
fused_batch_norm_grad_v3_cpu(const at::Tensor& y_backprop, const at::Tensor& x,
                             const at::Tensor& scale, const at::Tensor& reserve_space_1,
                             const at::Tensor& reserve_space_2, const at::Tensor& reserve_space_3,
                             double epsilon, c10::string_view data_format, bool is_training) {
  (void)reserve_space_3;  // TF's CPU kernel does not inspect it either
  auto b = bn::prepare_backward(y_backprop, x, scale, reserve_space_1, reserve_space_2, data_format);
  if (!b.done) {
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), bn::kBwd, [&] {
      backward_kernel<scalar_t>(b, scale, reserve_space_1, reserve_space_2, epsilon, is_training);
    });
  }
  return {b.x_backprop, b.scale_backprop, b.offset_backprop, b.rs4, b.rs5};
}

}  // namespace

TORCH_LIBRARY_IMPL(tfgrads, CPU, m) {
  m.impl("fused_batch_norm_v3", &fused_batch_norm_v3_cpu);
  m.impl("fused_batch_norm_grad_v3", &fused_batch_norm_grad_v3_cpu);
}

}  // namespace torch_tfgrads
