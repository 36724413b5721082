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
#include <utility>
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

// ---- channels-last building blocks: blocks of channels swept down rows ----------------------
// The per-channel sums need an accumulator for every vector of a row. Keeping them in arrays
// costs a load and a store beside each data vector, so a span of rows is cut into tiles that
// stay in L1, and each tile is swept one block of at most NV channel vectors at a time with
// that block's accumulators in registers. Each channel still sees its rows in order: the sums
// are bit for bit those of a row-by-row loop. (Measured against row by row, interleaved:
// training forward 0.6-0.95x the time at every benchmark shape; the gradient's sums
// 0.7-0.9x up to 64 channels, slower above, where they stay row by row.)

// Rows per L1 tile: about 16 KiB of float per stream.
inline int64_t tile_rows(int64_t C) { return std::max<int64_t>(1, 4096 / std::max<int64_t>(C, 1)); }

// Channel vectors per block: 4 accumulators (8 for the gradient's two sums, plus 4 means) fit
// in the 16 vector registers.
constexpr int kBlockVecs = 4;

// block(nv, a, b, c): rows [a, b), channels [c, c + nv * V) (nv an integral_constant, at most
// kBlockVecs); tail(a, b, c): rows [a, b), channels [c, C) one at a time.
template <typename acc_t, typename Block, typename Tail>
inline void channel_blocks(int64_t r0, int64_t r1, int64_t C, Block&& block, Tail&& tail) {
  constexpr int64_t V = Vectorized<acc_t>::size(), NV = kBlockVecs;
  const int64_t cv = C / V * V, step = tile_rows(C);
  for (int64_t a = r0; a < r1; a += step) {
    const int64_t b = std::min(r1, a + step);
    int64_t c = 0;
    for (; c + NV * V <= cv; c += NV * V) block(std::integral_constant<int, NV>{}, a, b, c);
    switch ((cv - c) / V) {  // the last, narrower block
      case 1: block(std::integral_constant<int, 1>{}, a, b, c); break;
      case 2: block(std::integral_constant<int, 2>{}, a, b, c); break;
      case 3: block(std::integral_constant<int, 3>{}, a, b, c); break;
      default: break;
    }
    if (cv < C) tail(a, b, cv);
  }
}

// acc[c] += x[r, c] over rows [r0, r1)
template <typename scalar_t, typename acc_t>
inline void rows_add(acc_t* acc, const scalar_t* x, int64_t r0, int64_t r1, int64_t C) {
  using W = Widen<scalar_t, acc_t>;
  using Vec = typename W::Vec;
  constexpr int64_t V = Vec::size();
  channel_blocks<acc_t>(r0, r1, C, [&](auto nv, int64_t a, int64_t b, int64_t c) {
    constexpr int NV = decltype(nv)::value;
    Vec s[NV];
    for (int v = 0; v < NV; ++v) s[v] = Vec::loadu(acc + c + v * V);
    for (int64_t r = a; r < b; ++r)
      for (int v = 0; v < NV; ++v) s[v] = s[v] + W::load(x + r * C + c + v * V);
    for (int v = 0; v < NV; ++v) s[v].store(acc + c + v * V);
  }, [&](int64_t a, int64_t b, int64_t c0) {
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
  channel_blocks<acc_t>(r0, r1, C, [&](auto nv, int64_t a, int64_t b, int64_t c) {
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
  }, [&](int64_t a, int64_t b, int64_t c0) {
    for (int64_t r = a; r < b; ++r)
      for (int64_t c = c0; c < C; ++c) {
        const acc_t d = static_cast<acc_t>(x[r * C + c]) - m[c];
        acc[c] += d * d;
      }
  });
}

// sdy[c] += dy[r, c], sdyxc[c] += dy[r, c] * (x[r, c] - m[c]) over one row (the gradient's sums
// above 64 channels: there the tiled sweep below measured 1.05-1.25x slower at C = 512).
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
  channel_blocks<acc_t>(r0, r1, C, [&](auto nv, int64_t a, int64_t b, int64_t c) {
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
  }, [&](int64_t a, int64_t b, int64_t c0) {
    for (int64_t r = a; r < b; ++r)
      for (int64_t c = c0; c < C; ++c) {
        const acc_t g = static_cast<acc_t>(dy[r * C + c]);
        sdy[c] += g;
        sdyxc[c] += g * (static_cast<acc_t>(x[r * C + c]) - m[c]);
      }
  });
}

// Vectorised store of float (non-temporal when kStream: p 32-byte aligned) or widened values.
template <bool kStream, typename scalar_t, typename acc_t>
inline void put(scalar_t* p, const Vectorized<acc_t>& v) {
  if constexpr (kStream && std::is_same_v<scalar_t, float>)
    stream_store(p, v);
  else
    Widen<scalar_t, acc_t>::store(p, v);
}

// The elementwise channels-last passes loop over a thread's rows inside one call (a call per
// row through the span callback measured 1.2x slower for the forward at 32x28x28x64), reading
// the coefficients from their L1-resident arrays: sweeping channel blocks down a tile instead,
// with the coefficients in registers, reads memory in a strided order and measured slower (up
// to 2x for the gradient, whose non-temporal stores then write partial lines).

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
    for (; c < C; ++c) y[c] = static_cast<scalar_t>((static_cast<acc_t>(x[c]) - m[c]) * k[c] + o[c]);
  }
}

// dx[r, c] = A[c] * ((dy[r, c] - mdy[c]) - (x[r, c] - m[c]) * B[c]) over rows [r0, r1)
// (training-mode input gradient). kStream: float dx, non-temporal (dx 32-byte aligned, C % 8 == 0).
template <typename scalar_t, typename acc_t, bool kStream>
inline void rows_grad_input(scalar_t* dx, const scalar_t* dy, const scalar_t* x, int64_t r0,
                            int64_t r1, int64_t C, const acc_t* A, const acc_t* mdy,
                            const acc_t* m, const acc_t* B) {
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
      const acc_t r = (static_cast<acc_t>(dy[i]) - mdy[c]) - (static_cast<acc_t>(x[i]) - m[c]) * B[c];
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

// ---- channels-first building blocks: one plane (n, c) at a time ------------------------------

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
    put<kStream, scalar_t, acc_t>(dx + i, vA * ((W::load(dy + i) - vmdy) - (W::load(x + i) - vm) * vB));
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

// ---- whole-tensor passes ---------------------------------------------------------------------

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

// Runs the elementwise pass in parallel chunks: rows(r0, r1) over spans of channels-last rows,
// or plane(n * C + c, c) over channels-first planes.
// fence: the bodies stream their stores (stream_fence() at the end of each thread's range).
template <typename Rows, typename Plane>
void for_each_span(const ChannelLayout& l, Rows&& rows, Plane&& plane, bool fence = false) {
  const int64_t C = l.C;
  if (l.channels_last) {
    at::parallel_for(0, l.outer, std::max<int64_t>(1, kChunkElems / C), [&](int64_t b, int64_t e) {
      rows(b, e);
      if (fence) stream_fence();
    });
  } else {
    const int64_t S = l.inner;
    at::parallel_for(0, l.outer * C, std::max<int64_t>(1, kChunkElems / S), [&](int64_t b, int64_t e) {
      for (int64_t p = b; p < e; ++p) plane(p, p % C);
      if (fence) stream_fence();
    });
  }
}

// Whether an elementwise pass may write `out` (the layout's whole float tensor of `numel`
// elements) with non-temporal stores: every span (a channels-last row or a channels-first
// plane) whole aligned vectors, and more than `above` bytes (see worth_streaming).
template <typename scalar_t>
bool can_stream(const ChannelLayout& l, const scalar_t* out, int64_t numel, int64_t above) {
  const int64_t span = l.channels_last ? l.C : l.inner;
  return std::is_same_v<scalar_t, float> && span % 8 == 0 &&
         reinterpret_cast<uintptr_t>(out) % 32 == 0 &&
         worth_streaming(numel * static_cast<int64_t>(sizeof(scalar_t)), above);
}

// pass(std::true_type{}) when stream, else pass(std::false_type{}): both store kinds compiled.
template <typename Pass>
void with_stream(bool stream, Pass&& pass) {
  if (stream)
    pass(std::true_type{});
  else
    pass(std::false_type{});
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
  // and the x this pass reads again (after the statistics) is not evicted by y. Measured,
  // interleaved in one process, NHWC: 8x56x56x128 (y 12.8 MB) 0.66-0.74x the time,
  // 16x112x112x32 0.71-1.0x; at 6.4 MB x and y both fit in the L3 and streaming y to memory
  // took 1.2-1.5x the time, hence the 8 MiB threshold (twice the gradient's, whose dx shares
  // the caches with two inputs).
  with_stream(can_stream(f.layout, y, f.y_phys.numel(), int64_t{8} << 20), [&](auto streamed) {
    constexpr bool kStream = decltype(streamed)::value;
    for_each_span(f.layout, [&](int64_t r0, int64_t r1) {
      rows_affine<scalar_t, acc_t, kStream>(y, x, r0, r1, C, m.data(), k.data(), o.data());
    }, [&](int64_t p, int64_t c) {
      plane_affine<scalar_t, acc_t, kStream>(y + p * S, x + p * S, S, m[c], k[c], o[c]);
    }, kStream);
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
    const int64_t S = b.layout.inner;
    const bool stream = can_stream(b.layout, dx, b.dx_phys.numel(), int64_t{4} << 20);
    with_stream(stream, [&](auto streamed) {
      constexpr bool kStream = decltype(streamed)::value;
      for_each_span(b.layout, [&](int64_t r0, int64_t r1) {
        rows_grad_input<scalar_t, acc_t, kStream>(dx, dy, x, r0, r1, C, A.data(), mdy.data(),
                                                  m.data(), B.data());
      }, [&](int64_t p, int64_t c) {
        plane_grad_input<scalar_t, acc_t, kStream>(dx + p * S, dy + p * S, x + p * S, S, A[c],
                                                   mdy[c], m[c], B[c]);
      }, kStream);
    });
  } else {
    const int64_t S = b.layout.inner;
    for_each_span(b.layout, [&](int64_t r0, int64_t r1) {
      rows_scale<scalar_t, acc_t>(dx, dy, r0, r1, C, A.data());
    }, [&](int64_t p, int64_t c) {
      plane_scale<scalar_t, acc_t>(dx + p * S, dy + p * S, S, A[c]);
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
