// The gradient's building blocks that fused_batch_norm_grad_v3 and the synchronized batch
// norm's ops share (fused_batch_norm_grad.cpp, fused_batch_norm_sync.cpp): the per-channel sums
// of dy and dy * (x - m) over both layouts, and the training-mode input-gradient loops. One
// source, so that the synchronized path reduces in the same order as the local one.
#pragma once

#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <vector>

#include "cpu/fused_batch_norm_cpu.h"
#include "cpu/widen.h"

namespace torch_tfgrads {
namespace bn_cpu {

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

// dx = A * ((dy - mdy) - (x - m) * B) per channel over the whole tensor (both layouts), numel
// elements: the training-mode input gradient's elementwise pass.
template <typename scalar_t, typename acc_t>
void grad_input_pass(const ChannelLayout& l, scalar_t* dx, int64_t numel, const scalar_t* dy,
                     const scalar_t* x, const acc_t* A, const acc_t* mdy, const acc_t* m,
                     const acc_t* B) {
  const int64_t C = l.C, S = l.inner;
  // A dx beyond the caches is written with non-temporal stores: no read-for-ownership of
  // its lines, and x and dy are not evicted. Above 8 MiB, as the forward's y: smaller ones
  // were as fast or faster with ordinary stores (docs/perf-notes/fused_batch_norm.md).
  // (Walking this second pass backwards, to start on the x and dy the sums pass read last,
  // measured no gain: the L3 does not keep them.)
  const bool stream = can_stream(l, dx, numel, int64_t{8} << 20);
  with_stream(stream, [&](auto streamed) {
    constexpr bool kStream = decltype(streamed)::value;
    for_each_span(
        l,
        [&](int64_t r0, int64_t r1) {
          rows_grad_input<scalar_t, acc_t, kStream>(dx, dy, x, r0, r1, C, A, mdy, m, B);
        },
        [&](int64_t p, int64_t c) {
          plane_grad_input<scalar_t, acc_t, kStream>(dx + p * S, dy + p * S, x + p * S, S, A[c],
                                                     mdy[c], m[c], B[c]);
        },
        kStream);
  });
}

}  // namespace bn_cpu
}  // namespace torch_tfgrads
