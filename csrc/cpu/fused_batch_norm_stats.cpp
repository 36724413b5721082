// The training forward's per-channel statistics: the data cut into cache-sized chunks, an exact
// two-pass mean and sum of squared deviations per chunk while it is hot in cache, the chunks
// merged in double with Chan's formula (see fused_batch_norm.cpp).
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

// Per-channel (count, mean, M2), merged part by part with Chan et al.'s pairwise formula. Every
// channel sees the same counts, so the merge's scalar factors are computed once per part and
// the per-channel updates are plain vectorisable arithmetic (no division per channel).
struct ChannelMoments {
  double n = 0;
  std::vector<double> mean, m2;
  explicit ChannelMoments(int64_t C) : mean(C, 0.0), m2(C, 0.0) {}
  // Merges a part of nb elements per channel: its means mb[c * stride], M2s m2b[c * stride].
  void merge(double nb, const double* mb, const double* m2b, int64_t stride = 1) {
    if (nb == 0) return;
    const double nt = n + nb, f = nb / nt, g = n * nb / nt;
    const int64_t C = static_cast<int64_t>(mean.size());
    for (int64_t c = 0; c < C; ++c) {
      const double delta = mb[c * stride] - mean[c];
      mean[c] += delta * f;
      m2[c] += m2b[c * stride] + delta * delta * g;
    }
    n = nt;
  }
};

// acc[c] += x[r, c] over rows [r0, r1)
template <typename scalar_t, typename acc_t>
inline void rows_add(acc_t* acc, const scalar_t* x, int64_t r0, int64_t r1, int64_t C) {
  using W = Widen<scalar_t, acc_t>;
  using Vec = typename W::Vec;
  constexpr int64_t V = Vec::size();
  channel_blocks<acc_t>(
      r0, r1, C,
      [&](auto nv, int64_t a, int64_t b, int64_t c) {
        constexpr int NV = decltype(nv)::value;
        Vec s[NV];
        for (int v = 0; v < NV; ++v) s[v] = Vec::loadu(acc + c + v * V);
        for (int64_t r = a; r < b; ++r)
          for (int v = 0; v < NV; ++v) s[v] = s[v] + W::load(x + r * C + c + v * V);
        for (int v = 0; v < NV; ++v) s[v].store(acc + c + v * V);
      },
      [&](int64_t a, int64_t b, int64_t c0) {
        for (int64_t r = a; r < b; ++r)
          for (int64_t c = c0; c < C; ++c) acc[c] += static_cast<acc_t>(x[r * C + c]);
      });
}

// acc[c] += (x[r, c] - m[c])^2 over rows [r0, r1)
template <typename scalar_t, typename acc_t>
inline void rows_add_sqdev(acc_t* acc, const scalar_t* x, const acc_t* m, int64_t r0, int64_t r1,
                           int64_t C) {
  using W = Widen<scalar_t, acc_t>;
  using Vec = typename W::Vec;
  constexpr int64_t V = Vec::size();
  channel_blocks<acc_t>(
      r0, r1, C,
      [&](auto nv, int64_t a, int64_t b, int64_t c) {
        constexpr int NV = decltype(nv)::value;
        Vec s[NV], vm[NV];
        for (int v = 0; v < NV; ++v) {
          s[v] = Vec::loadu(acc + c + v * V);
          vm[v] = Vec::loadu(m + c + v * V);
        }
        for (int64_t r = a; r < b; ++r)
          for (int v = 0; v < NV; ++v) {
            const Vec d = W::load(x + r * C + c + v * V) - vm[v];
            s[v] = s[v] + d * d;
          }
        for (int v = 0; v < NV; ++v) s[v].store(acc + c + v * V);
      },
      [&](int64_t a, int64_t b, int64_t c0) {
        for (int64_t r = a; r < b; ++r)
          for (int64_t c = c0; c < C; ++c) {
            const acc_t d = static_cast<acc_t>(x[r * C + c]) - m[c];
            acc[c] += d * d;
          }
      });
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

}  // namespace

// Per-channel mean and biased variance of x (both layouts).
template <typename scalar_t, typename acc_t>
void batch_moments(const ChannelLayout& l, const scalar_t* x, std::vector<double>& mean,
                   std::vector<double>& var) {
  const int64_t C = l.C;
  ChannelMoments total(C);
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
        rows_add<scalar_t, acc_t>(acc.data(), x, r0, r1, C);
        for (int64_t c = 0; c < C; ++c) cm[c] = acc[c] / static_cast<acc_t>(r1 - r0);
        std::fill(acc.begin(), acc.end(), acc_t(0));
        rows_add_sqdev<scalar_t, acc_t>(acc.data(), x, cm.data(), r0, r1, C);
        for (int64_t c = 0; c < C; ++c) {
          pmean[k * C + c] = cm[c];
          pm2[k * C + c] = acc[c];
        }
      }
    });
    for (int64_t k = 0; k < nchunk; ++k) {
      const double n = static_cast<double>(std::min(rows, (k + 1) * R) - k * R);
      total.merge(n, &pmean[k * C], &pm2[k * C]);
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
    // Each channel merges its parts in (n, j) order; part (n, c, j) is at (n * C + c) * nsub + j.
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < nsub; ++j) {
        const int64_t p = n * C * nsub + j;
        const double len = static_cast<double>(std::min(S, (j + 1) * L) - j * L);
        total.merge(len, &pmean[p], &pm2[p], nsub);
      }
  }
  mean = std::move(total.mean);
  var.resize(C);
  for (int64_t c = 0; c < C; ++c) var[c] = total.m2[c] / total.n;
}

template void batch_moments<float, float>(const ChannelLayout&, const float*, std::vector<double>&,
                                          std::vector<double>&);
template void batch_moments<double, double>(const ChannelLayout&, const double*,
                                            std::vector<double>&, std::vector<double>&);
template void batch_moments<c10::Half, float>(const ChannelLayout&, const c10::Half*,
                                              std::vector<double>&, std::vector<double>&);
template void batch_moments<c10::BFloat16, float>(const ChannelLayout&, const c10::BFloat16*,
                                                  std::vector<double>&, std::vector<double>&);

}  // namespace bn_cpu
}  // namespace torch_tfgrads
