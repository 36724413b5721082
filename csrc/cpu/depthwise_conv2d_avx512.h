// The depthwise sliding-window tile (slide_pixels in depthwise_conv2d_tiles.cpp) for float
// channels in 16-lane AVX-512 vectors, chosen at run time (cpu/isa.h). The tiles are bound by FMA
// throughput (a 5x5 forward keeps both FMA pipes busy); a 512-bit FMA does twice the work of a
// 256-bit one on CPUs with full-width AVX-512 units. Same FMAs in the same order per lane as
// the AVX2 tile, so the results are bit-identical.
#pragma once

#include <cstdint>

#include "cpu/isa.h"

namespace torch_tfgrads {
namespace depthwise_avx512 {

// One tile of a filter-gradient row (filter_row_3x3): output columns [q, q + len) whose NC
// column taps read consecutive source columns s0 + t * S + b, filter columns K0 + b.
struct RowTile {
  int64_t q, len, s0;
  int nc, k0;
};

}  // namespace depthwise_avx512
}  // namespace torch_tfgrads

#ifdef TFGRADS_HAVE_AVX512_KERNELS
#include <immintrin.h>

namespace torch_tfgrads {
namespace depthwise_avx512 {

TFGRADS_AVX512_BEGIN

// Keeps a loaded vector in a register: the empty asm must be assumed to read and change it.
// Left alone, GCC folds a load into each FMA that uses the vector as a memory operand (up to
// one 64-byte load per FMA instead of one per vector), and the tiles below, which reuse each
// source vector for several pixels or taps, then issue about as many loads as FMAs.
inline void pin_in_register(__m512& v) { asm("" : "+v"(v)); }

// T destination pixels (out + t * dstep) of channels [c, c1) in whole vectors: each sums, over
// the tap rows a (source row rs[a], filter row rk[a]) and the NC column taps b, source column
// s0 + t * S + b of the image `src` times filter column fidx[b]. Each source vector is loaded
// once and feeds every pixel that uses it; the tap row's NC x K filter vectors stay in registers.
// Clip: only the source columns s0 + u with u in [ulo, uhi) exist (the others are padding, and
// their taps are left out), so border pixels run as tiles too. stream: non-temporal stores
// (out 64-byte aligned, C % 16 == 0). Returns the first channel not done. Each source vector is
// pinned (pin_in_register), so that it is loaded once, not once per FMA. K vectors of channels
// per step (K = 2: 128 contiguous bytes of each source pixel, the tile's remaining channels one
// vector at a time); each lane's sum is the same chain of FMAs for every K. The arrays are flat
// because GCC kept [T][K] ones in memory (spilled accumulators) even at K = 1.
template <int NC, int S, int T, bool Clip, int K = 1>
int64_t slide_tile(const float* src, int64_t row, int64_t s0, int ulo, int uhi, const float* filt,
                   int64_t frow, const int64_t* rk, const int64_t* rs, int64_t nr,
                   const int64_t* fidx, int64_t C, int64_t c, int64_t c1, float* out, int64_t dstep,
                   bool stream) {
  constexpr int U = (T - 1) * S + NC;  // source columns of one tap row
  for (; c + 16 * K <= c1; c += 16 * K) {
    __m512 acc[T * K];
    for (int i = 0; i < T * K; ++i) acc[i] = _mm512_setzero_ps();
    for (int64_t a = 0; a < nr; ++a) {
      const float* xp = src + rs[a] * row + c;
      const float* fr = filt + rk[a] * frow + c;
      __m512 fv[NC * K];
#pragma GCC unroll 8
      for (int i = 0; i < NC * K; ++i) fv[i] = _mm512_loadu_ps(fr + fidx[i / K] * C + 16 * (i % K));
#pragma GCC unroll 64
      for (int v = 0; v < U * K; ++v) {
        const int u = v / K, k = v % K;
        if (Clip && (u < ulo || u >= uhi)) continue;
        __m512 xv = _mm512_loadu_ps(xp + (s0 + u) * C + 16 * k);
        pin_in_register(xv);
#pragma GCC unroll 16
        for (int t = 0; t < T; ++t) {
          const int b = u - t * S;
          if (b >= 0 && b < NC) acc[t * K + k] = _mm512_fmadd_ps(xv, fv[b * K + k], acc[t * K + k]);
        }
      }
    }
    for (int i = 0; i < T * K; ++i) {
      float* o = out + (i / K) * dstep + c + 16 * (i % K);
      if (stream) {
        _mm512_stream_ps(o, acc[i]);
      } else {
        _mm512_storeu_ps(o, acc[i]);
      }
    }
  }
  if constexpr (K > 1)
    return slide_tile<NC, S, T, Clip>(src, row, s0, ulo, uhi, filt, frow, rk, rs, nr, fidx, C, c,
                                      c1, out, dstep, stream);
  return c;
}

// Filter gradient, 3x3 interior (filter_grad_run_3x3): the three tap rows xrows[a] of the
// len output columns from q (source columns s0 + t * S + b) against dyrow, channels [c, c1)
// in whole vectors, added into parts[a] at offsets ko[b] (filter columns). The 3 - S source
// columns a step shares with the next stay in registers. Returns the first channel not done.
template <int S>
int64_t filter_run_3x3(const float* const* xrows, const float* dyrow, const int64_t* ko, int64_t s0,
                       int64_t q, int64_t len, int64_t C, int64_t c, int64_t c1,
                       float* const* parts) {
  static_assert(S == 1 || S == 2, "source step 1 or 2");
  for (; c + 16 <= c1; c += 16) {
    __m512 acc[3][3], xv[3][3];
    const float* xp[3];
    for (int a = 0; a < 3; ++a) {
      xp[a] = xrows[a] + s0 * C + c;
      for (int b = 0; b < 3; ++b) acc[a][b] = _mm512_setzero_ps();
      for (int b = 0; b < 3 - S; ++b) xv[a][b] = _mm512_loadu_ps(xp[a] + b * C);
    }
    const float* dp = dyrow + q * C + c;
    for (int64_t t = 0; t < len; ++t) {
      const __m512 d = _mm512_loadu_ps(dp + t * C);
#pragma GCC unroll 3
      for (int a = 0; a < 3; ++a) {
        for (int b = 3 - S; b < 3; ++b) xv[a][b] = _mm512_loadu_ps(xp[a] + (t * S + b) * C);
        for (int b = 0; b < 3; ++b) acc[a][b] = _mm512_fmadd_ps(xv[a][b], d, acc[a][b]);
        for (int b = 0; b < 3 - S; ++b) xv[a][b] = xv[a][b + S];
      }
    }
    for (int a = 0; a < 3; ++a)
      for (int b = 0; b < 3; ++b) {
        float* pp = parts[a] + ko[b] + c;
        _mm512_storeu_ps(pp, _mm512_add_ps(_mm512_loadu_ps(pp), acc[a][b]));
      }
  }
  return c;
}

// Filter gradient, one tap row of an 8-column tile (filter_grad_tile): NC column taps reading
// consecutive source columns s0 + t * S + b, channels [c, c1) in whole vectors, added into
// part at offsets ko[b] (filter columns). Returns the first channel not done. The 8
// out_backprop vectors stay in registers and each source vector is loaded once
// (pin_in_register). Per lane acc[b] still sums t = 0..7 in order.
template <int NC, int S>
int64_t filter_tile(const float* xrow, const float* dyrow, const int64_t* ko, int64_t s0, int64_t q,
                    int64_t C, int64_t c, int64_t c1, float* part) {
  constexpr int T = 8;
  constexpr int U = (T - 1) * S + NC;  // source columns of the tile
  for (; c + 16 <= c1; c += 16) {
    __m512 acc[NC], d[T];
    for (int b = 0; b < NC; ++b) acc[b] = _mm512_setzero_ps();
    const float* dp = dyrow + q * C + c;
    const float* xp = xrow + s0 * C + c;
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) d[t] = _mm512_loadu_ps(dp + t * C);
#pragma GCC unroll 32
    for (int u = 0; u < U; ++u) {
      __m512 xv = _mm512_loadu_ps(xp + u * C);
      pin_in_register(xv);
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) {
        const int b = u - t * S;
        if (b >= 0 && b < NC) acc[b] = _mm512_fmadd_ps(xv, d[t], acc[b]);
      }
    }
    for (int b = 0; b < NC; ++b) {
      float* pp = part + ko[b] + c;
      _mm512_storeu_ps(pp, _mm512_add_ps(_mm512_loadu_ps(pp), acc[b]));
    }
  }
  return c;
}

// The NR tap rows of one tile for the channel vector at xp[a] / dp (source rows xp, pixels C
// apart): each (row, column tap) sums its products over the tile's columns from 0, in order, and
// adds the sum into P[a][K0 + b]; Direct: each product goes straight into P[a][K0 + b], in
// column order (the direct order of direct_filter_rows). The NC - S source columns a step
// shares with the next stay in registers.
template <int S, int NR, int NC, int K0, bool Direct>
inline __attribute__((always_inline)) void filter_row_tile(const float* const* xp, const float* dp,
                                                           const RowTile& tl, int64_t C,
                                                           __m512 (&P)[NR][3]) {
  constexpr int keep = NC - S > 0 ? NC - S : 0;
  __m512 acc[NR][NC], xv[NR][NC];
  for (int a = 0; a < NR; ++a)
    for (int b = 0; b < NC; ++b) {
      acc[a][b] = _mm512_setzero_ps();
      if (b < keep) xv[a][b] = _mm512_loadu_ps(xp[a] + (tl.s0 + b) * C);
    }
  const float* d0 = dp + tl.q * C;
  for (int64_t t = 0; t < tl.len; ++t) {
    const __m512 d = _mm512_loadu_ps(d0 + t * C);
#pragma GCC unroll 3
    for (int a = 0; a < NR; ++a) {
      for (int b = keep; b < NC; ++b) xv[a][b] = _mm512_loadu_ps(xp[a] + (tl.s0 + t * S + b) * C);
      for (int b = 0; b < NC; ++b) {
        if (Direct)
          P[a][K0 + b] = _mm512_fmadd_ps(xv[a][b], d, P[a][K0 + b]);
        else
          acc[a][b] = _mm512_fmadd_ps(xv[a][b], d, acc[a][b]);
      }
      for (int b = 0; b < keep; ++b) xv[a][b] = xv[a][b + S];
    }
  }
  if (!Direct)
    for (int a = 0; a < NR; ++a)
      for (int b = 0; b < NC; ++b) P[a][K0 + b] = _mm512_add_ps(P[a][K0 + b], acc[a][b]);
}

// Filter gradient of a whole output row of a 3-column filter, channels [c, c1) in whole
// vectors: the NR tap rows xrows[a] (partial rows parts[a], filter columns ps apart) and the
// row's tiles in order. Per lane the additions into the partial are the tiles' (filter_tile,
// filter_run_3x3, filter_grad_run), in the same order, so the same bits; the partial is read
// and written once per row instead of once per tile, and the edge tiles run in 16 lanes.
// Direct: the direct order instead, the same bits as the 8-lane direct_filter_rows.
// Returns the first channel not done. The tiles are of the kinds row_tiles_3x3 admits (NC
// consecutive column taps from filter column K0, K0 + NC <= 3).
template <int S, int NR, bool Direct>
int64_t filter_row_3x3(const float* const* xrows, const float* dyrow, const RowTile* tiles,
                       int64_t ntiles, int64_t C, int64_t c, int64_t c1, float* const* parts,
                       int64_t ps) {
  for (; c + 16 <= c1; c += 16) {
    __m512 P[NR][3];
    const float* xp[NR];
    for (int a = 0; a < NR; ++a) {
      xp[a] = xrows[a] + c;
      for (int k = 0; k < 3; ++k) P[a][k] = _mm512_loadu_ps(parts[a] + k * ps + c);
    }
    for (int64_t i = 0; i < ntiles; ++i) {
      const RowTile& tl = tiles[i];
      const int kind = tl.nc * 4 + tl.k0;
      switch (kind) {
        case 3 * 4 + 0: filter_row_tile<S, NR, 3, 0, Direct>(xp, dyrow + c, tl, C, P); break;
        case 2 * 4 + 0: filter_row_tile<S, NR, 2, 0, Direct>(xp, dyrow + c, tl, C, P); break;
        case 2 * 4 + 1: filter_row_tile<S, NR, 2, 1, Direct>(xp, dyrow + c, tl, C, P); break;
        case 1 * 4 + 0: filter_row_tile<S, NR, 1, 0, Direct>(xp, dyrow + c, tl, C, P); break;
        case 1 * 4 + 1: filter_row_tile<S, NR, 1, 1, Direct>(xp, dyrow + c, tl, C, P); break;
        case 1 * 4 + 2: filter_row_tile<S, NR, 1, 2, Direct>(xp, dyrow + c, tl, C, P); break;
        default: break;
      }
    }
    for (int a = 0; a < NR; ++a)
      for (int k = 0; k < 3; ++k) _mm512_storeu_ps(parts[a] + k * ps + c, P[a][k]);
  }
  return c;
}

// filter_row_3x3's tiles' order (Direct = false) for K channel vectors at a time: K * 16
// contiguous floats of each source pixel per load, where one vector reads a single 64-byte line
// of each pixel (whose pixels are C floats apart). The K x NR x NC tile sums and the kept source
// vectors fill the registers, so each tile adds its sums into the partial rows pc[a] (filter
// columns ps apart) in memory rather than into a row's sums held in registers; each lane sees
// the same additions in the same order as in filter_row_3x3, so the same bits.
template <int S, int NR, int NC, int K0, int K>
inline __attribute__((always_inline)) void filter_row_tile_k(const float* const* xp,
                                                             const float* dp, const RowTile& tl,
                                                             int64_t C, float* const* pc,
                                                             int64_t ps) {
  constexpr int keep = NC - S > 0 ? NC - S : 0;
  __m512 xv[NR * NC * K], acc[NR * NC * K];  // [a][b][v] at (a * NC + b) * K + v
  for (int a = 0; a < NR; ++a)
    for (int b = 0; b < NC; ++b)
      for (int v = 0; v < K; ++v) {
        acc[(a * NC + b) * K + v] = _mm512_setzero_ps();
        if (b < keep) xv[(a * NC + b) * K + v] = _mm512_loadu_ps(xp[a] + (tl.s0 + b) * C + 16 * v);
      }
  const float* d0 = dp + tl.q * C;
  for (int64_t t = 0; t < tl.len; ++t) {
    __m512 d[K];
    for (int v = 0; v < K; ++v) d[v] = _mm512_loadu_ps(d0 + t * C + 16 * v);
#pragma GCC unroll 3
    for (int a = 0; a < NR; ++a) {
      for (int b = keep; b < NC; ++b)
        for (int v = 0; v < K; ++v)
          xv[(a * NC + b) * K + v] = _mm512_loadu_ps(xp[a] + (tl.s0 + t * S + b) * C + 16 * v);
      for (int i = a * NC * K; i < (a + 1) * NC * K; ++i)
        acc[i] = _mm512_fmadd_ps(xv[i], d[i % K], acc[i]);
      for (int b = 0; b < keep; ++b)
        for (int v = 0; v < K; ++v) xv[(a * NC + b) * K + v] = xv[(a * NC + b + S) * K + v];
    }
  }
  for (int a = 0; a < NR; ++a)
    for (int b = 0; b < NC; ++b)
      for (int v = 0; v < K; ++v) {
        float* q = pc[a] + (K0 + b) * ps + 16 * v;
        _mm512_storeu_ps(q, _mm512_add_ps(_mm512_loadu_ps(q), acc[(a * NC + b) * K + v]));
      }
}

// filter_row_3x3<S, NR, false> for K channel vectors per pass (filter_row_tile_k), the
// remaining vectors one at a time (filter_row_3x3).
template <int S, int NR, int K>
int64_t filter_row_3x3_k(const float* const* xrows, const float* dyrow, const RowTile* tiles,
                         int64_t ntiles, int64_t C, int64_t c, int64_t c1, float* const* parts,
                         int64_t ps) {
  for (; c + 16 * K <= c1; c += 16 * K) {
    const float* xp[NR];
    float* pc[NR];
    for (int a = 0; a < NR; ++a) xp[a] = xrows[a] + c, pc[a] = parts[a] + c;
    for (int64_t i = 0; i < ntiles; ++i) {
      const RowTile& tl = tiles[i];
      switch (tl.nc * 4 + tl.k0) {
#define TFGRADS_TILE(NC, K0) \
  case NC * 4 + K0: filter_row_tile_k<S, NR, NC, K0, K>(xp, dyrow + c, tl, C, pc, ps); break;
        TFGRADS_TILE(3, 0)
        TFGRADS_TILE(2, 0)
        TFGRADS_TILE(2, 1)
        TFGRADS_TILE(1, 0)
        TFGRADS_TILE(1, 1)
        TFGRADS_TILE(1, 2)
#undef TFGRADS_TILE
        default: break;
      }
    }
  }
  return filter_row_3x3<S, NR, false>(xrows, dyrow, tiles, ntiles, C, c, c1, parts, ps);
}

TFGRADS_AVX512_END

}  // namespace depthwise_avx512
}  // namespace torch_tfgrads
#endif
