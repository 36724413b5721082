// The channels-last correlation of the forward and the input gradient (depthwise_conv2d.cpp):
// sliding-window tiles of destination pixels that share each filter load, planned once per call
// per destination row (column_plan), run over (batch, row) in parallel.
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "cpu/depthwise_conv2d_avx512.h"
#include "cpu/depthwise_conv2d_cpu.h"
#include "cpu/depthwise_conv2d_row_staging.h"
#include "cpu/isa.h"
#include "cpu/widen.h"

namespace torch_tfgrads {
namespace depthwise_cpu {
namespace {

struct RowSpan {
  int64_t lo = 0, hi = 0;  // source rows [lo, hi)
};

// T pixels (destination columns q + t*qstep, sharing the taps of q, sources + t*sstep) by K
// channel vectors from channel c: acc in registers, each filter vector loaded once per tap.
template <typename scalar_t, int T, int K>
inline void correlate_block(const Correlation<scalar_t>& p, const scalar_t* simg, const int64_t* rk,
                            const int64_t* rs, int64_t nr, const int64_t* ck, const int64_t* cs,
                            int64_t nc, int64_t c, scalar_t* out) {
  using A = acc_t<scalar_t>;
  using Vec = Vectorized<A>;
  using Wd = Widen<scalar_t, A>;
  constexpr int64_t L = Vec::size();
  const int64_t C = p.C, sstep = p.sstep * C, dstep = p.qstep * C;
  Vec acc[T][K];
  for (int t = 0; t < T; ++t)
    for (int k = 0; k < K; ++k) acc[t][k] = Vec(A(0));
  for (int64_t a = 0; a < nr; ++a) {
    const scalar_t* srow = simg + rs[a] * p.Ws * C + c;
    const scalar_t* frow = p.filt + rk[a] * p.fw * C + c;
    for (int64_t b = 0; b < nc; ++b) {
      const scalar_t* sp = srow + cs[b] * C;
      const scalar_t* fp = frow + ck[b] * C;
      Vec fv[K];
      for (int k = 0; k < K; ++k) fv[k] = Wd::load(fp + k * L);
      for (int t = 0; t < T; ++t)
        for (int k = 0; k < K; ++k)
          acc[t][k] = at::vec::fmadd(Wd::load(sp + t * sstep + k * L), fv[k], acc[t][k]);
    }
  }
  for (int t = 0; t < T; ++t)
    for (int k = 0; k < K; ++k) Wd::store(out + t * dstep + k * L + c, acc[t][k]);
}

// The channels after the last full vector, one at a time.
template <typename scalar_t, int T>
inline void correlate_tail(const Correlation<scalar_t>& p, const scalar_t* simg, const int64_t* rk,
                           const int64_t* rs, int64_t nr, const int64_t* ck, const int64_t* cs,
                           int64_t nc, int64_t c0, int64_t c1, scalar_t* out) {
  using A = acc_t<scalar_t>;
  const int64_t C = p.C;
  for (int t = 0; t < T; ++t) {
    for (int64_t c = c0; c < c1; ++c) {
      A acc = 0;
      for (int64_t a = 0; a < nr; ++a) {
        const scalar_t* srow = simg + rs[a] * p.Ws * C + t * p.sstep * C + c;
        const scalar_t* frow = p.filt + rk[a] * p.fw * C + c;
        for (int64_t b = 0; b < nc; ++b)
          acc += static_cast<A>(srow[cs[b] * C]) * static_cast<A>(frow[ck[b] * C]);
      }
      out[t * p.qstep * C + c] = static_cast<scalar_t>(acc);
    }
  }
}

template <typename scalar_t, int T, int K>
void correlate_pixels(const Correlation<scalar_t>& p, const scalar_t* simg, const int64_t* rk,
                      const int64_t* rs, int64_t nr, const RowSpan& next, int64_t q, int64_t c0,
                      int64_t c1, scalar_t* drow) {
  constexpr int64_t L = Vectorized<acc_t<scalar_t>>::size();
  const AxisTaps& cols = *p.cols;
  const int64_t* ck = cols.k.data() + cols.offset[q];
  const int64_t* cs = cols.src.data() + cols.offset[q];
  const int64_t nc = cols.count(q);
  for (int64_t r = next.lo; r < next.hi; ++r)  // as in slide_pixels
    for (int64_t b = 0; b < nc; ++b)
      for (int t = 0; t < T; ++t) {
        prefetch_pixels(simg + (r * p.Ws + cs[b] + t * p.sstep) * p.C, 1, p.C, c0, c1, 1);
      }
  scalar_t* out = drow + q * p.C;
  int64_t c = c0;
  for (; c + K * L <= c1; c += K * L)
    correlate_block<scalar_t, T, K>(p, simg, rk, rs, nr, ck, cs, nc, c, out);
  for (; c + L <= c1; c += L)
    correlate_block<scalar_t, T, 1>(p, simg, rk, rs, nr, ck, cs, nc, c, out);
  if (c < c1) correlate_tail<scalar_t, T>(p, simg, rk, rs, nr, ck, cs, nc, c, c1, out);
}

// Sliding-window fast path (3x3, 5x5, ... with unit dilation along W, source step 1 or 2):
// a tile's column taps read NC consecutive source columns s0, s0 + 1, ..., s0 + NC - 1 (the
// filter columns in order for the forward, reversed for the input gradient). Each source
// vector is then loaded once and feeds every pixel of the tile that uses it, with the NC
// filter vectors of the tap row held in registers: ~0.5 loads per FMA for a 3x3 forward.
constexpr int kMaxSlide = 5;

struct SlideTaps {
  int64_t s0 = 0, nc = 0;
  int64_t fidx[kMaxSlide] = {};  // filter column of source column s0 + b
  int64_t fresh = 0;  // source columns before s0 + fresh were prefetched by the previous tile
};

bool slide_taps(const int64_t* ck, const int64_t* cs, int64_t nc, SlideTaps* st) {
  if (nc < 1 || nc > kMaxSlide) return false;
  bool up = true, down = true;
  for (int64_t b = 0; b < nc; ++b) {
    up = up && cs[b] == cs[0] + b;
    down = down && cs[b] == cs[0] - b;
  }
  if (!up && !down) return false;
  st->nc = nc;
  st->s0 = up ? cs[0] : cs[nc - 1];
  for (int64_t b = 0; b < nc; ++b) st->fidx[b] = up ? ck[b] : ck[nc - 1 - b];
  return true;
}

// K channel vectors per step: K = 2 consumes whole 64-byte lines, for layers whose pixels alias
// in L1 (a line's second half would be evicted before the next step reads it); the AVX-512
// tiles take K / 2 16-lane vectors per step (one at least: a 16-lane vector is a line). Clip: the tile
// reaches into the padding (st from the unclipped taps, s0 possibly negative): its sources
// outside [0, Ws) are skipped, in whole vectors only (C % L == 0, so there is no channel tail).
template <typename scalar_t, int NC, int S, int T, int K, bool Clip>
void slide_pixels(const Correlation<scalar_t>& p, const scalar_t* simg, const int64_t* rk,
                  const int64_t* rs, int64_t nr, const SlideTaps& st, const RowSpan& next,
                  int64_t c0, int64_t c1, scalar_t* out) {
  using A = acc_t<scalar_t>;
  using Vec = Vectorized<A>;
  using Wd = Widen<scalar_t, A>;
  constexpr int64_t L = Vec::size();
  constexpr int U = (T - 1) * S + NC;  // source columns of one tap row
  const int64_t C = p.C, dstep = p.qstep * C, s0 = st.s0;
  // The source columns s0 + u that exist: u in [ulo, uhi).
  const int ulo = Clip ? static_cast<int>(std::clamp<int64_t>(-s0, 0, U)) : 0;
  const int uhi = Clip ? static_cast<int>(std::clamp<int64_t>(p.Ws - s0, ulo, U)) : U;
  // The channel loop below revisits each pixel with a stride the hardware prefetchers do not
  // follow: prefetch, over this tile's columns, the source rows the next destination row adds
  // (from memory) into L2, one row of work ahead. (Also prefetching the next tile into L1 does
  // not pay, here or in the filter gradient.)
  const int64_t fresh = std::max<int64_t>(ulo, st.fresh);
  if (fresh < uhi)
    for (int64_t r = next.lo; r < next.hi; ++r)
      prefetch_pixels(simg + (r * p.Ws + s0 + fresh) * C, uhi - fresh, C, c0, c1, 1);
  int64_t c = c0;
#ifdef TFGRADS_HAVE_AVX512_KERNELS
  if constexpr (std::is_same_v<scalar_t, float>) {
    if (p.wide) {
      c = depthwise_avx512::slide_tile<NC, S, T, Clip, std::max(1, K / 2)>(
          simg, p.Ws * C, s0, ulo, uhi, p.filt, p.fw * C, rk, rs, nr, st.fidx, C, c0, c1, out,
          dstep, p.stream && reinterpret_cast<uintptr_t>(out) % 64 == 0);
    }
  }
#endif
  for (; c + K * L <= c1; c += K * L) {
    Vec acc[T][K];
    for (int t = 0; t < T; ++t)
      for (int k = 0; k < K; ++k) acc[t][k] = Vec(A(0));
    for (int64_t a = 0; a < nr; ++a) {
      const scalar_t* xp = simg + rs[a] * p.Ws * C + c;
      const scalar_t* fr = p.filt + rk[a] * p.fw * C + c;
      Vec fv[NC][K];
#pragma GCC unroll 8
      for (int b = 0; b < NC; ++b)
        for (int k = 0; k < K; ++k) fv[b][k] = Wd::load(fr + st.fidx[b] * C + k * L);
#pragma GCC unroll 32
      for (int u = 0; u < U; ++u) {
        if (Clip && (u < ulo || u >= uhi)) continue;
        for (int k = 0; k < K; ++k) {
          const Vec xv = Wd::load(xp + (s0 + u) * C + k * L);
#pragma GCC unroll 16
          for (int t = 0; t < T; ++t) {
            const int b = u - t * S;
            if (b >= 0 && b < NC) acc[t][k] = at::vec::fmadd(xv, fv[b][k], acc[t][k]);
          }
        }
      }
    }
    for (int t = 0; t < T; ++t)
      for (int k = 0; k < K; ++k) {
        scalar_t* o = out + t * dstep + c + k * L;
        if constexpr (K == 2 && std::is_same_v<scalar_t, float>)
          if (p.stream) {  // whole lines: one 64-byte line per pixel and step
            stream_store(o, acc[t][k]);
            continue;
          }
        Wd::store(o, acc[t][k]);
      }
  }
  if (K > 1 && c + L <= c1) {
    slide_pixels<scalar_t, NC, S, T, 1, Clip>(p, simg, rk, rs, nr, st, RowSpan{}, c, c1, out);
    return;
  }
  if constexpr (!Clip) {
    if (c < c1) {  // channel tail through the general path
      int64_t ck[kMaxSlide], cs[kMaxSlide];
      for (int b = 0; b < NC; ++b) {
        ck[b] = st.fidx[b];
        cs[b] = s0 + b;
      }
      correlate_tail<scalar_t, T>(p, simg, rk, rs, nr, ck, cs, NC, c, c1, out);
    }
  }
}

// One piece of a destination row's work: the kernel for the pixels from column q. The column
// taps do not depend on the row, so the pieces of a row are planned once per call (column_plan)
// and every row runs the same plan.
template <typename scalar_t>
struct ColumnStep {
  using Fn = void (*)(const Correlation<scalar_t>&, const scalar_t*, const int64_t*, const int64_t*,
                      int64_t, const SlideTaps&, const RowSpan&, int64_t, int64_t, int64_t,
                      scalar_t*);
  Fn fn = nullptr;
  int64_t q = 0, t = 0;  // first column, pixels (tiles)
  SlideTaps st;
};

template <typename scalar_t, int NC, int S, int T, int K, bool Clip>
void slide_step(const Correlation<scalar_t>& p, const scalar_t* simg, const int64_t* rk,
                const int64_t* rs, int64_t nr, const SlideTaps& st, const RowSpan& next, int64_t q,
                int64_t c0, int64_t c1, scalar_t* drow) {
  slide_pixels<scalar_t, NC, S, T, K, Clip>(p, simg, rk, rs, nr, st, next, c0, c1, drow + q * p.C);
}

template <typename scalar_t, int T, int K>
void pixels_step(const Correlation<scalar_t>& p, const scalar_t* simg, const int64_t* rk,
                 const int64_t* rs, int64_t nr, const SlideTaps&, const RowSpan& next, int64_t q,
                 int64_t c0, int64_t c1, scalar_t* drow) {
  correlate_pixels<scalar_t, T, K>(p, simg, rk, rs, nr, next, q, c0, c1, drow);
}

// Only float layers tile into the padding (column_plan).
template <typename scalar_t, int NC, int S, int T, int K>
typename ColumnStep<scalar_t>::Fn slide_fn(bool clip) {
  if constexpr (std::is_same_v<scalar_t, float>)
    if (clip) return slide_step<scalar_t, NC, S, T, K, true>;
  return slide_step<scalar_t, NC, S, T, K, false>;
}

// The T-pixel sliding-window step for the pixels from column q, if their column taps (cols:
// p.cols, or the unclipped p.vcols) slide; clipped where the tile reaches into the padding.
template <typename scalar_t, int T, int K = 1>
bool slide_at(const Correlation<scalar_t>& p, const AxisTaps& cols, int64_t q,
              ColumnStep<scalar_t>* step) {
  if (p.sstep > 2) return false;
  if (!slide_taps(cols.k.data() + cols.offset[q], cols.src.data() + cols.offset[q], cols.count(q),
                  &step->st))
    return false;
  step->q = q;
  step->t = T;
  const int64_t U = (T - 1) * p.sstep + step->st.nc;
  const bool clip = step->st.s0 < 0 || step->st.s0 + U > p.Ws;
#define TFGRADS_SLIDE(NC)                                            \
  case NC:                                                           \
    step->fn = p.sstep == 1 ? slide_fn<scalar_t, NC, 1, T, K>(clip)  \
                            : slide_fn<scalar_t, NC, 2, T, K>(clip); \
    return true;
  switch (step->st.nc) {
    TFGRADS_SLIDE(1)
    TFGRADS_SLIDE(2)
    TFGRADS_SLIDE(3)
    TFGRADS_SLIDE(4)
    TFGRADS_SLIDE(5)
    default: return false;
  }
#undef TFGRADS_SLIDE
}

// A sliding-window tile that only float layers take (the AVX-512 tiles of
// correlate_channels_last, and the unclipped plan's short tiles): 13 columns; 7 columns of two
// 16-lane vectors (a 128-byte piece of each pixel) per step (K = 4 8-lane vectors); the short
// tiles below.
template <typename scalar_t, int T, int K = 1>
bool float_slide_at(const Correlation<scalar_t>& p, const AxisTaps& cols, int64_t q,
                    ColumnStep<scalar_t>* step) {
  if constexpr (std::is_same_v<scalar_t, float>) return slide_at<scalar_t, T, K>(p, cols, q, step);
  return false;
}

// A tile of the last 1-3 pixels of a run (float layers: the unclipped plan's row ends).
template <typename scalar_t>
bool short_tile_at(const Correlation<scalar_t>& p, const AxisTaps& cols, int64_t q, int64_t n,
                   ColumnStep<scalar_t>* step) {
  switch (n) {
    case 1: return float_slide_at<scalar_t, 1>(p, cols, q, step);
    case 2: return float_slide_at<scalar_t, 2>(p, cols, q, step);
    case 3: return float_slide_at<scalar_t, 3>(p, cols, q, step);
    default: return false;
  }
}

// The widest sliding-window tile for the pixels from column q (in phase q0) given the runs of
// columns whose taps are shifted copies (run over cols); advances q past them. short_tiles (the
// unclipped plan): a run's last 1-3 pixels as one short tile, else as a 4-pixel tile that
// starts earlier; and with line_pairs, 3-tap runs of 7 or more in 7-column two-vector tiles.
template <typename scalar_t>
bool tile_step(const Correlation<scalar_t>& p, const AxisTaps& cols,
               const std::vector<int64_t>& run, bool narrow_tiles, bool whole_13, bool line_pairs,
               bool short_tiles, int64_t q0, int64_t* qp, ColumnStep<scalar_t>* s) {
  const int64_t q = *qp, n = run[q], step = p.qstep;
  // The end of a run shorter than a tile is done as a tile that starts earlier in the same run
  // (recomputing a few pixels) rather than pixel by pixel.
  const int64_t back4 = q - (4 - n) * step;
  const bool back = back4 >= q0 && run[back4] >= 4;
  int64_t next = q;
  // Narrow tiles take two channel vectors (a whole 64-byte line) per step.
  if (line_pairs && short_tiles && n >= 7 && cols.count(q) == 3 &&
      float_slide_at<scalar_t, 7, 4>(p, cols, q, s)) {
    next = q + 7 * step;
  } else if (whole_13 && n >= 13 && cols.count(q) == 3 &&
             float_slide_at<scalar_t, 13>(p, cols, q, s)) {
    next = q + 13 * step;
  } else if (short_tiles && n < 4 && short_tile_at(p, cols, q, n, s)) {
    next = q + n * step;
  } else if (narrow_tiles && n >= 4 && slide_at<scalar_t, 4, 2>(p, cols, q, s)) {
    next = q + 4 * step;
  } else if (narrow_tiles && back && slide_at<scalar_t, 4, 2>(p, cols, back4, s)) {
    next = q + n * step;
  } else if (n >= 12 && cols.count(q) == 3 && slide_at<scalar_t, 12>(p, cols, q, s)) {
    next = q + 12 * step;  // 3 taps: 12 accumulators hide the FMA latency better
  } else if (n >= 10 && cols.count(q) == 5 && slide_at<scalar_t, 10>(p, cols, q, s)) {
    next = q + 10 * step;  // 5 taps: 10 accumulators
  } else if (n >= 8 && slide_at<scalar_t, 8>(p, cols, q, s)) {
    next = q + 8 * step;
  } else if (n >= 4 && slide_at<scalar_t, 4>(p, cols, q, s)) {
    next = q + 4 * step;
  } else if (back && slide_at<scalar_t, 4>(p, cols, back4, s)) {
    next = q + n * step;
  } else {
    return false;
  }
  *qp = next;
  return true;
}

// The pieces of every destination row, left to right within each column phase. Float layers
// in whole vectors plan their tiles on the unclipped taps (p.vcols), so a row's border pixels
// (SAME padding: 2 of 112 at each end for 5x5, a large share of the time when done pixel by
// pixel) join the tiles as clipped ones; other layers, and columns whose
// unclipped taps do not slide (dilation, over 5 taps), tile their in-bounds taps or go pixel by
// pixel.
template <typename scalar_t>
std::vector<ColumnStep<scalar_t>> column_plan(const Correlation<scalar_t>& p, bool narrow_tiles,
                                              bool whole_13, bool line_pairs) {
  constexpr int64_t L = Vectorized<acc_t<scalar_t>>::size();
  const bool unclipped = std::is_same_v<scalar_t, float> && p.vcols != nullptr && p.C % L == 0;
  const std::vector<int64_t> run = shifted_runs(*p.cols, p.Wd, p.qstep, p.sstep);
  const std::vector<int64_t> vrun = unclipped ? shifted_runs(*p.vcols, p.Wd, p.qstep, p.sstep)
                                              : std::vector<int64_t>{};
  std::vector<ColumnStep<scalar_t>> plan;
  for (int64_t q0 = 0; q0 < std::min(p.qstep, p.Wd); ++q0) {
    int64_t prefetched = std::numeric_limits<int64_t>::min();  // source columns up to here
    for (int64_t q = q0; q < p.Wd;) {
      ColumnStep<scalar_t> s;
      if ((unclipped &&
           tile_step(p, *p.vcols, vrun, narrow_tiles, whole_13, line_pairs, true, q0, &q, &s)) ||
          tile_step(p, *p.cols, run, narrow_tiles, whole_13, line_pairs, false, q0, &q, &s)) {
        // A tile prefetches only the source columns the tile before it did not.
        const int64_t end = s.st.s0 + (s.t - 1) * p.sstep + s.st.nc;
        s.st.fresh = std::clamp<int64_t>(prefetched - s.st.s0, 0, end - s.st.s0);
        prefetched = end;
        plan.push_back(s);
        continue;
      }
      prefetched = std::numeric_limits<int64_t>::min();
      s.q = q;
      if (run[q] >= 2) {
        s.fn = pixels_step<scalar_t, 2, 4>;
        q += 2 * p.qstep;
      } else {
        s.fn = pixels_step<scalar_t, 1, 4>;
        q += p.qstep;
      }
      plan.push_back(s);
    }
  }
  return plan;
}

}  // namespace

template <typename scalar_t>
void correlate_channels_last(const Correlation<scalar_t>& p) {
  if (few_taps_per_pixel(p)) {
    correlate_by_pixel(p);
    return;
  }
  if (aliasing_by_pixel(p)) {
    correlate_by_pixel(p, /*ascending_columns=*/true);
    return;
  }
  const AxisTaps& rows = *p.rows;
  const std::vector<int64_t> last_src = furthest_sources(rows, p.Hd);
  const int64_t taps = std::max<int64_t>(1, rows.k.size() / std::max<int64_t>(1, p.Hd)) *
                       std::max<int64_t>(1, p.cols->k.size() / std::max<int64_t>(1, p.Wd));
  const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, p.Wd * p.C * taps));
  // Layers whose pixels alias in L1 use 4-column tiles (wider tiles evict their own source
  // pixels) of two channel vectors, which use each source line whole before it can be evicted.
  const bool narrow_tiles = pixels_alias_in_l1<scalar_t>(p.C);
  // Large outputs (far beyond the caches, where a consumer could not find them anyway) are
  // written with non-temporal stores: no read-for-ownership of the output lines, no cache
  // pollution. Each row is computed into an L1/L2-resident buffer and streamed from there,
  // except where the tiles fill whole lines and stream straight from registers (p.stream; edge
  // pixels store normally): float layers with narrow tiles (two 8-lane vectors per step) and
  // AVX-512 tiles (one 16-lane vector is a line), which beat the staged rows. (Streaming 8-lane
  // tiles directly, half lines at a time, is much slower.)
  const int64_t row_elems = p.Wd * p.C;
  const bool large = large_output(p);
  Correlation<scalar_t> pd = p;
  pd.wide = std::is_same_v<scalar_t, float> && p.C % 16 == 0 && avx512_enabled();
  pd.stream = (narrow_tiles || pd.wide) && streams_whole_lines(p);
  const bool streaming = large && !pd.stream;  // through the row buffer
  // A 16-lane vector is a whole line, so AVX-512 tiles need not be narrow where pixels alias in
  // L1: there, a 3-tap run of 13 or more columns (28x28x256 at stride 2: 13) starts with one
  // 13-column tile instead of 4-column ones and a tile that recomputes 3 pixels.
  const bool whole_13 = pd.wide && narrow_tiles;
  // There, on the unclipped plan (the forward's), 3-tap runs take 7-column tiles that read two
  // channel vectors (128 contiguous bytes of each pixel) per step instead: these tiles wait
  // for source lines a pixel (1 KiB or more) apart, which come from the L3 at a third of the
  // rate of lines read in order, and two adjacent lines per pixel and step halve the jumps.
  // The 14 columns of 28x28 at stride 2 or 14x14 at stride 1 are then two tiles, with no
  // 1-pixel tile. Not at stride 2 on rows of fewer than 14 columns, where one clipped tile per
  // row was slower (perf notes).
  const bool line_pairs = whole_13 && (p.sstep == 1 || p.Wd >= 14);
  const std::vector<ColumnStep<scalar_t>> plan = column_plan(pd, narrow_tiles, whole_13,
                                                             line_pairs);
  // Strided layers from memory: the tiles read copies of the source rows (SourceRing).
  const int64_t src_row_bytes = p.Ws * p.C * static_cast<int64_t>(sizeof(scalar_t));
  const int64_t src_bytes = p.N * p.Hs * src_row_bytes;
  const int64_t chunk = correlation_chunk<scalar_t>(p.C, src_bytes);  // channels per sweep
  const bool ring = source_ring_applies(src_bytes, src_row_bytes, p.Hs, rows, p.Hd,
                                        SourceRing<scalar_t>::kSlots);
  at::parallel_for(0, p.N * p.Hd, grain, [&](int64_t begin, int64_t end) {
    StagedRows<scalar_t> rows_out(streaming, row_elems);
    SourceRing<scalar_t> sources(ring, p.Ws * p.C);
    int64_t ring_rows[SourceRing<scalar_t>::kSlots];
    // Tile steps per row, roughly: the previous row goes out in that many slices.
    const int64_t steps = std::max<int64_t>(1, p.Wd / 8) * ((p.C + chunk - 1) / chunk);
    for (int64_t nr = begin; nr < end; ++nr) {
      const int64_t n = nr / p.Hd, r = nr % p.Hd;
      const scalar_t* simg = p.src + n * p.Hs * p.Ws * p.C;
      scalar_t* const dst_row = p.dst + nr * row_elems;
      scalar_t* drow = rows_out.row(nr, dst_row);
      const int64_t* rk = rows.k.data() + rows.offset[r];
      const int64_t* rs = rows.src.data() + rows.offset[r];
      const int64_t nrt = rows.count(r);
      RowSpan next;
      if (sources.on()) {  // the tiles read the ring's copies (no prefetch)
        simg = sources.map(simg, n, rs, nrt, ring_rows);
        rs = ring_rows;
      } else if (r + 1 < p.Hd) {
        next.lo = last_src[r] + 1;
        next.hi = last_src[r + 1] + 1;
      }
      for (int64_t c0 = 0; c0 < p.C; c0 += chunk) {
        const int64_t c1 = std::min(p.C, c0 + chunk);
        for (const ColumnStep<scalar_t>& step : plan) {
          rows_out.step();
          step.fn(pd, simg, rk, rs, nrt, step.st, next, step.q, c0, c1, drow);
        }
      }
      rows_out.done(nr, dst_row, steps);
    }
    rows_out.finish();
    if (large) stream_fence();
  });
}

template void correlate_channels_last<float>(const Correlation<float>&);
template void correlate_channels_last<double>(const Correlation<double>&);
template void correlate_channels_last<c10::Half>(const Correlation<c10::Half>&);
template void correlate_channels_last<c10::BFloat16>(const Correlation<c10::BFloat16>&);

}  // namespace depthwise_cpu
}  // namespace torch_tfgrads
