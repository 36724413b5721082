// DepthwiseConv2dNativeBackpropFilter on the CPU. Channels-last: each output row's tap rows
// accumulate into registers, then into one partial per fixed chunk of rows, summed in chunk
// order. Channels-first: one partial per (n, c) plane, summed over the batch in order. Both are
// deterministic (the chunks do not depend on the thread count).
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/channel_layout.h"
#include "common/depthwise_conv2d.h"
#include "common/depthwise_conv2d_cells.h"
#include "cpu/depthwise_conv2d_avx512.h"
#include "cpu/depthwise_conv2d_cpu.h"
#include "cpu/depthwise_conv2d_planes.h"
#include "cpu/depthwise_conv2d_row_staging.h"
#include "cpu/isa.h"
#include "cpu/widen.h"

namespace torch_tfgrads {
namespace depthwise_cpu {
namespace {

using depthwise_avx512::RowTile;

constexpr const char* kBwdFilter = "depthwise_conv2d_native_backprop_filter";

// ---- filter gradient, channels-last -----------------------------------------------------------
// One row of out_backprop (n, i) against one source row (tap row kr): for the output columns
// [q, q + len) sharing q's NC column taps (shifted by sW per column), K channel vectors from c:
//   part[kr, ck[b], c..] += sum_t x[h, cs[b] + t*sW, c..] * dy[i, q + t, c..]
// where the tap row's partial is `part` and filter column ck[b] starts at ko[b] in it (its
// columns are the partial's stride ps apart, see filter_grad_channels_last).
template <typename scalar_t, int NC, int K>
inline void filter_grad_run(const scalar_t* xrow, const scalar_t* dyrow, const int64_t* ko,
                            const int64_t* cs, int64_t q, int64_t len, int64_t sW, int64_t C,
                            int64_t c, acc_t<scalar_t>* part) {
  using A = acc_t<scalar_t>;
  using Vec = Vectorized<A>;
  using Wd = Widen<scalar_t, A>;
  constexpr int64_t L = Vec::size();
  Vec acc[NC][K];
  for (int b = 0; b < NC; ++b)
    for (int k = 0; k < K; ++k) acc[b][k] = Vec(A(0));
  const scalar_t* dp = dyrow + q * C + c;
  const scalar_t* xp = xrow + c;
  const int64_t xstep = sW * C;
  int64_t xo[NC];
  for (int b = 0; b < NC; ++b) xo[b] = cs[b] * C;
  for (int64_t t = 0; t < len; ++t, dp += C, xp += xstep) {
    Vec d[K];
    for (int k = 0; k < K; ++k) d[k] = Wd::load(dp + k * L);
    for (int b = 0; b < NC; ++b)
      for (int k = 0; k < K; ++k)
        acc[b][k] = at::vec::fmadd(Wd::load(xp + xo[b] + k * L), d[k], acc[b][k]);
  }
  for (int b = 0; b < NC; ++b) {
    A* pp = part + ko[b] + c;
    for (int k = 0; k < K; ++k) (Vec::loadu(pp + k * L) + acc[b][k]).store(pp + k * L);
  }
}

// The same for a tile of exactly 8 columns whose taps read consecutive source columns (unit
// dilation along W) at source step S: fully unrolled, so each source vector is loaded once and
// reused by every (column, tap) pair that reads it (S = 1: 10 loads instead of 24 for 3 taps).
template <typename scalar_t, int NC, int K, int S>
inline void filter_grad_tile(const scalar_t* xrow, const scalar_t* dyrow, const int64_t* ko,
                             int64_t s0, int64_t q, int64_t C, int64_t c, acc_t<scalar_t>* part) {
  using A = acc_t<scalar_t>;
  using Vec = Vectorized<A>;
  using Wd = Widen<scalar_t, A>;
  constexpr int64_t L = Vec::size();
  constexpr int T = 8;
  Vec acc[NC][K];
  for (int b = 0; b < NC; ++b)
    for (int k = 0; k < K; ++k) acc[b][k] = Vec(A(0));
  const scalar_t* dp = dyrow + q * C + c;
  const scalar_t* xp = xrow + s0 * C + c;
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) {
    Vec d[K];
#pragma GCC unroll 4
    for (int k = 0; k < K; ++k) d[k] = Wd::load(dp + t * C + k * L);
#pragma GCC unroll 8
    for (int b = 0; b < NC; ++b)
#pragma GCC unroll 4
      for (int k = 0; k < K; ++k)
        acc[b][k] = at::vec::fmadd(Wd::load(xp + (t * S + b) * C + k * L), d[k], acc[b][k]);
  }
  for (int b = 0; b < NC; ++b) {
    A* pp = part + ko[b] + c;
    for (int k = 0; k < K; ++k) (Vec::loadu(pp + k * L) + acc[b][k]).store(pp + k * L);
  }
}

// 3x3 interior: the three tap rows of an 8- or 4-column tile at once (9 accumulators of one channel
// vector), so each out_backprop vector is loaded once for all nine taps.
template <typename scalar_t, int S, int T>
inline void filter_grad_tile_3x3(const scalar_t* const* xrows, const scalar_t* dyrow,
                                 const int64_t* ko, int64_t s0, int64_t q, int64_t C, int64_t c,
                                 acc_t<scalar_t>* const* parts) {
  using A = acc_t<scalar_t>;
  using Vec = Vectorized<A>;
  using Wd = Widen<scalar_t, A>;
  Vec acc[3][3];
  for (int a = 0; a < 3; ++a)
    for (int b = 0; b < 3; ++b) acc[a][b] = Vec(A(0));
  const scalar_t* dp = dyrow + q * C + c;
  const scalar_t* x0 = xrows[0] + s0 * C + c;
  const scalar_t* x1 = xrows[1] + s0 * C + c;
  const scalar_t* x2 = xrows[2] + s0 * C + c;
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) {
    const Vec d = Wd::load(dp + t * C);
#pragma GCC unroll 3
    for (int b = 0; b < 3; ++b) {
      const int64_t o = (t * S + b) * C;
      acc[0][b] = at::vec::fmadd(Wd::load(x0 + o), d, acc[0][b]);
      acc[1][b] = at::vec::fmadd(Wd::load(x1 + o), d, acc[1][b]);
      acc[2][b] = at::vec::fmadd(Wd::load(x2 + o), d, acc[2][b]);
    }
  }
  for (int a = 0; a < 3; ++a)
    for (int b = 0; b < 3; ++b) {
      A* pp = parts[a] + ko[b] + c;
      (Vec::loadu(pp) + acc[a][b]).store(pp);
    }
}

// 3x3 interior, a run of any length: the three tap rows of len columns whose taps read
// consecutive source columns at source step S, at once (9 accumulators of one channel vector),
// so each out_backprop vector is loaded once for all nine taps and the 3 - S source columns a
// step shares with the next stay in registers. Per lane the sums of filter_grad_run, in order.
template <typename scalar_t, int S>
inline void filter_grad_run_3x3(const scalar_t* const* xrows, const scalar_t* dyrow,
                                const int64_t* ko, int64_t s0, int64_t q, int64_t len, int64_t C,
                                int64_t c, acc_t<scalar_t>* const* parts) {
  using A = acc_t<scalar_t>;
  using Vec = Vectorized<A>;
  using Wd = Widen<scalar_t, A>;
  Vec acc[3][3], xv[3][3];
  const scalar_t* xp[3];
  for (int a = 0; a < 3; ++a) {
    xp[a] = xrows[a] + s0 * C + c;
    for (int b = 0; b < 3; ++b) acc[a][b] = Vec(A(0));
    for (int b = 0; b < 3 - S; ++b) xv[a][b] = Wd::load(xp[a] + b * C);
  }
  const scalar_t* dp = dyrow + q * C + c;
  for (int64_t t = 0; t < len; ++t) {
    const Vec d = Wd::load(dp + t * C);
#pragma GCC unroll 3
    for (int a = 0; a < 3; ++a) {
      for (int b = 3 - S; b < 3; ++b) xv[a][b] = Wd::load(xp[a] + (t * S + b) * C);
      for (int b = 0; b < 3; ++b) acc[a][b] = at::vec::fmadd(xv[a][b], d, acc[a][b]);
      for (int b = 0; b < 3 - S; ++b) xv[a][b] = xv[a][b + S];
    }
  }
  for (int a = 0; a < 3; ++a)
    for (int b = 0; b < 3; ++b) {
      A* pp = parts[a] + ko[b] + c;
      (Vec::loadu(pp) + acc[a][b]).store(pp);
    }
}

// Any number of column taps, one channel at a time (edges of unusual filters, channel tails).
template <typename scalar_t>
inline void filter_grad_scalar(const scalar_t* xrow, const scalar_t* dyrow, const int64_t* ko,
                               const int64_t* cs, int64_t nc, int64_t q, int64_t len, int64_t sW,
                               int64_t C, int64_t c0, int64_t c1, acc_t<scalar_t>* part) {
  using A = acc_t<scalar_t>;
  for (int64_t b = 0; b < nc; ++b) {
    for (int64_t c = c0; c < c1; ++c) {
      A acc = 0;
      for (int64_t t = 0; t < len; ++t)
        acc += static_cast<A>(xrow[(cs[b] + t * sW) * C + c]) *
               static_cast<A>(dyrow[(q + t) * C + c]);
      part[ko[b] + c] += acc;
    }
  }
}

// The source rows of one output row (tap rows) and the partial filter rows they add into.
template <typename scalar_t>
struct TapRows {
  const scalar_t* x[64];
  acc_t<scalar_t>* part[64];
  int64_t n = 0;
};

// All tap rows of one output row over the columns [q, q + len) (at most a tile), channel
// block by channel block: the tile's pixels stay in L1 while every channel is done.
template <typename scalar_t, int NC>
void filter_grad_columns(const TapRows<scalar_t>& rows, const scalar_t* dyrow, const int64_t* ko,
                         const int64_t* cs, int64_t q, int64_t len, int64_t sW, int64_t C,
                         int64_t c0, int64_t c1, bool wide) {
  constexpr int64_t L = Vectorized<acc_t<scalar_t>>::size();
  constexpr int K = NC <= 3 ? 2 : 1;
  // Taps that read consecutive source columns (unit dilation along W) at source step 1 or 2.
  bool consecutive = sW <= 2;
  for (int b = 1; consecutive && b < NC; ++b) consecutive = cs[b] == cs[0] + b;
  int64_t c = c0;
  // Where pixels alias in L1 (as in the correlation) each tap row takes the two-vector tiles
  // below, which use a source line whole before it can be evicted (the one-vector 3x3 tile was
  // slower there in 8-lane vectors). A 16-lane vector is a whole line: the AVX-512 3x3 run
  // takes every layer.
  const bool aliasing = pixels_alias_in_l1<scalar_t>(C);
  const bool run_3x3 = NC == 3 && consecutive && rows.n == 3;
#ifdef TFGRADS_HAVE_AVX512_KERNELS
  if constexpr (std::is_same_v<scalar_t, float>) {
    if (wide) {  // the same tiles in 16-lane vectors (one is a whole line)
      if (run_3x3) {
        c = sW == 1 ? depthwise_avx512::filter_run_3x3<1>(rows.x, dyrow, ko, cs[0], q, len, C, c,
                                                          c1, rows.part)
                    : depthwise_avx512::filter_run_3x3<2>(rows.x, dyrow, ko, cs[0], q, len, C, c,
                                                          c1, rows.part);
      } else if (consecutive && len == 8) {
        int64_t end = c;
        for (int64_t a = 0; a < rows.n; ++a)
          end = sW == 1 ? depthwise_avx512::filter_tile<NC, 1>(rows.x[a], dyrow, ko, cs[0], q, C, c,
                                                               c1, rows.part[a])
                        : depthwise_avx512::filter_tile<NC, 2>(rows.x[a], dyrow, ko, cs[0], q, C, c,
                                                               c1, rows.part[a]);
        c = end;
      }
    }
  }
#endif
  if (run_3x3 && !aliasing) {
    // 8- and 4-column tiles fully unrolled (in 8 lanes the run's loop was slower on them),
    // other lengths as a run: the same sums either way.
    const auto* xr = rows.x;
    for (; c + L <= c1; c += L) {
      if (sW == 1 && len == 8)
        filter_grad_tile_3x3<scalar_t, 1, 8>(xr, dyrow, ko, cs[0], q, C, c, rows.part);
      else if (sW == 1 && len == 4)
        filter_grad_tile_3x3<scalar_t, 1, 4>(xr, dyrow, ko, cs[0], q, C, c, rows.part);
      else if (sW == 1)
        filter_grad_run_3x3<scalar_t, 1>(xr, dyrow, ko, cs[0], q, len, C, c, rows.part);
      else if (len == 8)
        filter_grad_tile_3x3<scalar_t, 2, 8>(xr, dyrow, ko, cs[0], q, C, c, rows.part);
      else if (len == 4)
        filter_grad_tile_3x3<scalar_t, 2, 4>(xr, dyrow, ko, cs[0], q, C, c, rows.part);
      else
        filter_grad_run_3x3<scalar_t, 2>(xr, dyrow, ko, cs[0], q, len, C, c, rows.part);
    }
  }
  if (consecutive && len == 8) {
    for (; c + K * L <= c1; c += K * L)
      for (int64_t a = 0; a < rows.n; ++a) {
        if (sW == 1)
          filter_grad_tile<scalar_t, NC, K, 1>(rows.x[a], dyrow, ko, cs[0], q, C, c, rows.part[a]);
        else
          filter_grad_tile<scalar_t, NC, K, 2>(rows.x[a], dyrow, ko, cs[0], q, C, c, rows.part[a]);
      }
  }
  for (; c + K * L <= c1; c += K * L)
    for (int64_t a = 0; a < rows.n; ++a)
      filter_grad_run<scalar_t, NC, K>(rows.x[a], dyrow, ko, cs, q, len, sW, C, c, rows.part[a]);
  for (; c + L <= c1; c += L)
    for (int64_t a = 0; a < rows.n; ++a)
      filter_grad_run<scalar_t, NC, 1>(rows.x[a], dyrow, ko, cs, q, len, sW, C, c, rows.part[a]);
  if (c < c1)
    for (int64_t a = 0; a < rows.n; ++a)
      filter_grad_scalar(rows.x[a], dyrow, ko, cs, NC, q, len, sW, C, c, c1, rows.part[a]);
}

// The same sums for one tile of columns [q, q + len) (1 to 7 column taps, whole channel
// vectors), pixel by pixel: each (column, tap) pair adds its products over every channel, a
// contiguous sweep, into tmp (rows.n * nc * C accumulators, the first column's products
// starting from 0), and the last column's sums go into the partials. Per lane these are the
// tiles' operations in the tiles' order, so the same bits. Where pixels alias in L1, the tiles'
// channel-block sweeps read one line of each pixel at a time, from sets that evict each other;
// these sweeps read each pixel's lines in a row.
template <typename scalar_t>
void filter_grad_tile_by_pixel(const TapRows<scalar_t>& rows, const scalar_t* dyrow,
                               const int64_t* ko, const int64_t* cs, int64_t nc, int64_t q,
                               int64_t len, int64_t sW, int64_t C, acc_t<scalar_t>* tmp) {
  using A = acc_t<scalar_t>;
  using Vec = Vectorized<A>;
  using Wd = Widen<scalar_t, A>;
  constexpr int64_t L = Vec::size();
  for (int64_t t = 0; t < len; ++t) {
    const scalar_t* dp = dyrow + (q + t) * C;
    const bool first = t == 0, last = t == len - 1;
    for (int64_t a = 0; a < rows.n; ++a) {
      for (int64_t b = 0; b < nc; ++b) {
        const scalar_t* xp = rows.x[a] + (cs[b] + t * sW) * C;
        A* tp = tmp + (a * nc + b) * C;
        A* pp = rows.part[a] + ko[b];
#pragma GCC unroll 4
        for (int64_t c = 0; c < C; c += L) {
          const Vec sum = at::vec::fmadd(Wd::load(xp + c), Wd::load(dp + c),
                                         first ? Vec(A(0)) : Vec::loadu(tp + c));
          if (last)
            (Vec::loadu(pp + c) + sum).store(pp + c);
          else
            sum.store(tp + c);
        }
      }
    }
  }
}

template <typename scalar_t>
void filter_grad_segment(const TapRows<scalar_t>& rows, const scalar_t* dyrow, const int64_t* ko,
                         const int64_t* cs, int64_t nc, int64_t q, int64_t len, int64_t sW,
                         int64_t C, int64_t c0, int64_t c1, bool wide) {
#define TFGRADS_FG(NC) \
  case NC:             \
    return filter_grad_columns<scalar_t, NC>(rows, dyrow, ko, cs, q, len, sW, C, c0, c1, wide);
  switch (nc) {
    case 0:
      return;
      TFGRADS_FG(1)
      TFGRADS_FG(2)
      TFGRADS_FG(3)
      TFGRADS_FG(4)
      TFGRADS_FG(5)
      TFGRADS_FG(6)
      TFGRADS_FG(7)
    default:
      for (int64_t a = 0; a < rows.n; ++a)
        filter_grad_scalar(rows.x[a], dyrow, ko, cs, nc, q, len, sW, C, c0, c1, rows.part[a]);
  }
#undef TFGRADS_FG
}

// df[fh, fw, C] (M = 1) from x [N, H, W, C] and dy [N, Ho, Wo, C].
template <typename scalar_t>
void filter_grad_channels_last(const scalar_t* x, const scalar_t* dy, scalar_t* df,
                               const Geometry& g, int64_t C, const AxisTaps& rows,
                               const AxisTaps& cols) {
  using A = acc_t<scalar_t>;
  const std::vector<int64_t> run = shifted_runs(cols, g.Wo, 1, g.sW);
  const int64_t R = g.N * g.Ho;
  const bool wide = std::is_same_v<scalar_t, float> && C % 16 == 0 && avx512_enabled();
  // Fixed chunks of rows (independent of the thread count): deterministic sums. Their number
  // is rounded up to a multiple of 16 (exactly where the rows divide so), so that 2, 4, 8 or 16
  // threads get as many chunks each: with 25 chunks one of two threads did 13 (perf notes).
  const int64_t least_rows = std::max<int64_t>(
      1, std::max<int64_t>((R + 63) / 64, 65536 / std::max<int64_t>(1, g.Wo * C)));
  const int64_t even_chunks = ((R + least_rows - 1) / least_rows + 15) / 16 * 16;
  const int64_t rows_per_chunk = (R + even_chunks - 1) / even_chunks;
  const int64_t chunks = (R + rows_per_chunk - 1) / rows_per_chunk;
  // Each chunk's partial is zeroed by the thread that fills it, in the parallel region. Its
  // filter columns are ps apart: where pixels alias in L1, one line more than C, so that a
  // partial's columns do not fall into the L1 sets of the pixels being read as well.
  const int64_t ps = C + (pixels_alias_in_l1<scalar_t>(C) ? 64 / int64_t{sizeof(A)} : 0);
  const int64_t taps = g.fh * g.fw, PF = taps * ps;
  std::unique_ptr<A[]> part(new A[static_cast<size_t>(chunks * PF)]);
  // Source rows [first_new[i], last_src[i]] are those output row i reads that row i - 1 does
  // not (all of them for i = 0): the rows to prefetch one output row ahead. Prefetching all of
  // the next row's tap rows instead, most of them already in cache, spent much of the driver's
  // time on the prefetches themselves.
  const std::vector<int64_t> last_src = furthest_sources(rows, g.Ho);
  // Layers whose pixels alias in L1 (256 / 512 float channels: short rows of few pixels) take
  // the last 16 or fewer columns of a 3-tap run as one tile, which adds its sums into the
  // partial once, instead of tiles of 8 + 4 + rest. (On layers with longer rows such a tail is
  // slower than 8 + 4 + rest, hence only where pixels alias.)
  const bool merge_3 = pixels_alias_in_l1<scalar_t>(C);
  // There, on the 8-lane path, the tiles run pixel by pixel over all channels at once
  // (filter_grad_tile_by_pixel, up to 7 column taps; the AVX-512 tiles read whole lines and
  // keep their sweeps), where depthwise_aliasing_by_pixel() says so (cpu/isa.h).
  int64_t most_taps = 0;
  for (int64_t q = 0; q < g.Wo; ++q) most_taps = std::max(most_taps, cols.count(q));
  const bool by_pixel = merge_3 && !wide && C % Vectorized<A>::size() == 0 && most_taps <= 7 &&
                        depthwise_aliasing_by_pixel();
  std::vector<int64_t> first_new(g.Ho, g.H);
  for (int64_t i = 1; i < g.Ho; ++i) first_new[i] = last_src[i - 1] + 1;
  for (int64_t a = rows.offset[0]; a < rows.offset[1]; ++a)
    first_new[0] = std::min(first_new[0], rows.src[a]);
  // The partial's offsets of the column taps.
  std::vector<int64_t> kofs(cols.k.size());
  for (size_t b = 0; b < kofs.size(); ++b) kofs[b] = cols.k[b] * ps;
  // Short rows of 3-column filters: on the AVX-512 path each output row in one pass per channel
  // vector (filter_row_3x3), where the row's tiles allow it. Where direct_filter_rows_apply
  // says so (source step 1, or 2 at channel counts whose pixels do not alias in L1, on rows of
  // the lengths it takes), every path sums them in the direct order (each product straight
  // into its tap's sum): direct_filter_rows, which keeps a vector's nine sums in registers
  // across the chunk (8 lanes; 16 where direct_filter_rows_wide says so), or
  // filter_row_3x3<.., true>. The tiles' order needs 9 more registers than 8-lane code has.
  const bool is_float = std::is_same_v<scalar_t, float>;
  const std::vector<RowTile> row_tiles = is_float ? row_tiles_3x3(g, C, cols, run, merge_3)
                                                  : std::vector<RowTile>{};
  const bool direct = is_float && direct_filter_rows_apply(g, C, row_tiles);
  // On the AVX-512 path the row pass stays where direct_filter_rows in 16 lanes was slower.
  const bool direct_rows_in_16_lanes = wide && direct && direct_filter_rows_wide(g, C);
  // Strided layers from memory read copies of the source rows (SourceRing), where the tiles run
  // (the AVX-512 row pass was slower with them: it reads its rows a chunk at a time).
  const bool ring = !(wide && !row_tiles.empty()) &&
                    source_ring_applies(
                        g.N * g.H * g.W * C * static_cast<int64_t>(sizeof(scalar_t)),
                        g.W * C * static_cast<int64_t>(sizeof(scalar_t)), g.H, rows, g.Ho,
                        SourceRing<scalar_t>::kSlots);
  // Adds output row nr's products into the chunk's partial pc.
  auto add_row = [&](int64_t nr, A* pc, std::vector<A>& tmp, SourceRing<scalar_t>& sr) {
    const int64_t n = nr / g.Ho, i = nr % g.Ho;
    const int64_t n1 = (nr + 1) / g.Ho, i1 = (nr + 1) % g.Ho;  // the next output row
    const scalar_t* dyrow = dy + nr * g.Wo * C;
    int64_t local[SourceRing<scalar_t>::kSlots];  // the ring's slots of the tap rows
    const scalar_t* rbase = sr.on() ? sr.map(x + n * g.H * g.W * C, n,
                                             rows.src.data() + rows.offset[i], rows.count(i), local)
                                    : nullptr;
    for (int64_t a0 = rows.offset[i]; a0 < rows.offset[i + 1]; a0 += 64) {
      TapRows<scalar_t> tr;  // (more than 64 tap rows: in groups of 64)
      for (int64_t a = a0; a < std::min(rows.offset[i + 1], a0 + 64); ++a, ++tr.n) {
        tr.x[tr.n] = rbase ? rbase + local[a - rows.offset[i]] * g.W * C
                           : x + (n * g.H + rows.src[a]) * g.W * C;
        tr.part[tr.n] = pc + rows.k[a] * g.fw * ps;
      }
      if (wide && !row_tiles.empty() && tr.n <= 3) {
        // The next output row's new rows into L2 a chunk at a time, then the chunk's sums. (This
        // and the tiles' prefetch below stay written out: one lambda for both made the tiles
        // of 32,56,56,64 2x slower.)
        for (int64_t c0 = 0; c0 < C; c0 += kChannelChunk) {
          const int64_t c1 = std::min(C, c0 + kChannelChunk);
          if (nr + 1 < R) {
            prefetch_pixels(dyrow + g.Wo * C, g.Wo, C, c0, c1, 1);
            for (int64_t h = first_new[i1]; h <= last_src[i1] && !rbase; ++h)
              prefetch_pixels(x + (n1 * g.H + h) * g.W * C, g.W, C, c0, c1, 1);
          }
          if constexpr (std::is_same_v<scalar_t, float>)
            filter_row_pass(tr.x, tr.part, tr.n, dyrow, row_tiles, g.sW, C, c0, c1, ps, direct);
        }
        continue;
      }
      // Channels in chunks of kChannelChunk: a tile's pixels stay within L1.
      for (int64_t c0 = 0; c0 < C; c0 += by_pixel ? C : kChannelChunk) {
        const int64_t c1 = by_pixel ? C : std::min(C, c0 + kChannelChunk);
        for (int64_t q = 0; q < g.Wo;) {
          const int64_t len = run[q], o = cols.offset[q], nc = cols.count(q);
          // Tiles of 8 (then 4) columns of a run share q's taps, shifted by sW per column.
          for (int64_t t0 = 0, tl = 0; t0 < len; t0 += tl) {
            int64_t cs[16];
            const int64_t* src = cols.src.data() + o;
            const bool fits = nc <= 16;
            if (fits)
              for (int64_t b = 0; b < nc; ++b) cs[b] = src[b] + t0 * g.sW;
            tl = tile_columns(len - t0, nc, merge_3);
            // The next output row's new rows into L2. (Also prefetching the next tile of
            // this row into L1 made it slower or no faster at every shape tried.)
            if (nr + 1 < R && fits && nc > 0 && !by_pixel) {
              prefetch_pixels(dyrow + (g.Wo + q + t0) * C, tl, C, c0, c1, 1);
              for (int64_t h = first_new[i1]; h <= last_src[i1] && !rbase; ++h)
                prefetch_pixels(x + ((n1 * g.H + h) * g.W + cs[0]) * C,
                                std::min(tl * g.sW + nc, g.W - cs[0]), C, c0, c1, 1);
            }
            if (by_pixel && nc > 0) {
              const size_t need = static_cast<size_t>(tr.n * nc * C);
              if (tmp.size() < need) tmp.resize(need);
              filter_grad_tile_by_pixel(tr, dyrow, kofs.data() + o, cs, nc, q + t0, tl, g.sW, C,
                                        tmp.data());
            } else {
              filter_grad_segment(tr, dyrow, kofs.data() + o, fits ? cs : src, nc, q + t0, tl, g.sW,
                                  C, c0, c1, wide);
            }
            if (!fits) break;
          }
          q += len;
        }
      }
    }
  };
  at::parallel_for(0, chunks, 1, [&](int64_t cb, int64_t ce) {
    std::vector<A> tmp;  // filter_grad_tile_by_pixel's accumulators, or direct_filter_rows' blocks
    SourceRing<scalar_t> sr(ring, g.W * C);
    for (int64_t ch = cb; ch < ce; ++ch) {
      A* pc = part.get() + ch * PF;
      std::fill(pc, pc + PF, A(0));
      const int64_t r0 = ch * rows_per_chunk, r1 = std::min(R, (ch + 1) * rows_per_chunk);
      if constexpr (std::is_same_v<scalar_t, float>) {
        if (direct && (!wide || direct_rows_in_16_lanes)) {
          direct_filter_rows(x, dy, g, C, rows, cols, r0, r1, pc, ps, tmp, wide);
          continue;
        }
      }
      for (int64_t nr = r0; nr < r1; ++nr) add_row(nr, pc, tmp, sr);
    }
  });
  // The partials summed in chunk order, a vector of filter values at a time (each value's sum
  // is the same as one at a time; the loop over values one at a time was slow: strided loads).
  at::parallel_for(0, taps, std::max<int64_t>(1, 2048 / C), [&](int64_t tb, int64_t te) {
    using Vec = Vectorized<A>;
    constexpr int64_t L = Vec::size();
    for (int64_t t = tb; t < te; ++t) {
      const A* pt = part.get() + t * ps;
      int64_t c = 0;
      for (; c + L <= C; c += L) {
        Vec s(A(0));
        for (int64_t ch = 0; ch < chunks; ++ch) s = s + Vec::loadu(pt + ch * PF + c);
        Widen<scalar_t, A>::store(df + t * C + c, s);
      }
      for (; c < C; ++c)
        df[t * C + c] = depthwise::filter_grad_chunks_sum<scalar_t>(pt, PF, chunks, c);
    }
  });
}

template <typename scalar_t>
void filter_grad_channels_first(const scalar_t* x, const scalar_t* dy, scalar_t* df,
                                const Geometry& g) {
  using A = acc_t<scalar_t>;
  using Vec = Vectorized<A>;
  using Wd = Widen<scalar_t, A>;
  constexpr int64_t L = Vec::size();
  const PhasePlane pp = phase_plane<A>(g);
  const int64_t taps = g.fh * g.fw, CM = g.C * g.M;
  // part[n][c*M+m][tap], one writer per (n, c): summed over n in order afterwards.
  std::vector<A> part(static_cast<size_t>(g.N * CM * taps), A(0));
  at::parallel_for(0, g.N * g.C, plane_grain(g), [&](int64_t begin, int64_t end) {
    std::vector<A> buf(pp.size());
    for (int64_t nc = begin; nc < end; ++nc) {
      const int64_t n = nc / g.C, c = nc % g.C;
      load_plane(x + nc * g.H * g.W, g, pp, buf.data());
      for (int64_t m = 0; m < g.M; ++m) {
        const int64_t oc = c * g.M + m;
        const scalar_t* d = dy + (n * CM + oc) * g.Ho * g.Wo;
        for (int64_t di = 0; di < g.fh; ++di) {
          for (int64_t dj = 0; dj < g.fw; ++dj) {
            Vec acc(A(0));
            for (int64_t i = 0; i < g.Ho; ++i) {
              const A* bp = buf.data() + pp.tap(i * g.sH + di * g.dH, dj * g.dW);
              const scalar_t* dp = d + i * g.Wo;
              int64_t j = 0;
              for (; j + L <= g.Wo; j += L)
                acc = at::vec::fmadd(Vec::loadu(bp + j), Wd::load(dp + j), acc);
              if (j < g.Wo)
                acc = at::vec::fmadd(Vec::loadu(bp + j),
                                     load_partial<scalar_t, A>(dp + j, g.Wo - j), acc);
            }
            A lanes[L];
            acc.store(lanes);
            A s = 0;
            for (int64_t l = 0; l < L; ++l) s += lanes[l];
            part[(n * CM + oc) * taps + di * g.fw + dj] = s;
          }
        }
      }
    }
  });
  at::parallel_for(0, CM * taps, 1024, [&](int64_t b, int64_t e) {
    for (int64_t k = b; k < e; ++k) {
      const int64_t oc = k / taps, t = k % taps;
      A s = 0;
      for (int64_t n = 0; n < g.N; ++n) s += part[(n * CM + oc) * taps + t];
      df[t * CM + oc] = static_cast<scalar_t>(s);
    }
  });
}

}  // namespace

at::Tensor depthwise_conv2d_native_backprop_filter_cpu(
    const at::Tensor& input, c10::SymIntArrayRef filter_sizes, const at::Tensor& out_backprop,
    at::IntArrayRef strides, c10::string_view padding, at::OptionalIntArrayRef explicit_paddings,
    c10::string_view data_format, at::IntArrayRef dilations) {
  const Geometry g = depthwise::check_backprop_filter(
      kBwdFilter, input, C10_AS_INTARRAYREF_SLOW(filter_sizes), out_backprop, strides, padding,
      explicit_paddings.value_or(at::IntArrayRef{}), data_format, dilations);
  at::Tensor df = at::empty(g.filter_shape(), input.options());
  if (df.numel() == 0) return df;
  if (out_backprop.numel() == 0 || input.numel() == 0) return df.zero_();
  // Both big tensors in the input's physical order (out_backprop copied only if it differs).
  const ChannelLayout l = choose_channel_layout(input, g.cdim(), !g.nchw);
  const at::Tensor x = to_physical(input, l), dy = to_physical(out_backprop, l);
  depthwise::dispatch_float_types(input.scalar_type(), [&](auto tag) {
    using scalar_t = decltype(tag);
    if (!l.channels_last) {
      filter_grad_channels_first(x.data_ptr<scalar_t>(), dy.data_ptr<scalar_t>(),
                                 df.data_ptr<scalar_t>(), g);
      return;
    }
    const at::Tensor xe = repeat_channels(x, g.M).contiguous();
    const AxisTaps rows = depthwise::forward_taps(g.Ho, g.H, g.fh, g.sH, g.dH, g.pt);
    const AxisTaps cols = depthwise::forward_taps(g.Wo, g.W, g.fw, g.sW, g.dW, g.pl);
    filter_grad_channels_last(xe.data_ptr<scalar_t>(), dy.data_ptr<scalar_t>(),
                              df.data_ptr<scalar_t>(), g, g.C * g.M, rows, cols);
  });
  return df;
}

}  // namespace depthwise_cpu
}  // namespace torch_tfgrads
