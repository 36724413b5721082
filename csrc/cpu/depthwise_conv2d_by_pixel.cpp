// The channels-last correlation pixel by pixel, for destination pixels with few taps (the
// input gradient of a strided layer), where the sliding-window tiles of
// depthwise_conv2d_tiles.cpp cost more in setup than in FMAs.
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <type_traits>
#include <vector>

#include "cpu/depthwise_conv2d_cpu.h"
#include "cpu/depthwise_conv2d_row_staging.h"
#include "cpu/isa.h"
#include "cpu/widen.h"

namespace torch_tfgrads {
namespace depthwise_cpu {
namespace {

// ---- few taps per destination pixel -----------------------------------------------------------
// The input gradient of a strided layer gives each dx pixel few taps (3x3 stride 2: 4, 2, 2 or
// 1; 2.25 on average), too few for the sliding-window tiles, whose setup per tile then costs
// more than their FMAs. Instead each pixel runs over all its channels with its taps' source and
// filter pointers fixed (NT taps unrolled): no per-tile setup, the sources are read in memory
// order, and a streamed pixel's lines are written whole, one after another.
template <typename scalar_t, int NT>
inline void correlate_pixels_run(const scalar_t* const* sp, const scalar_t* const* fp, int64_t nt,
                                 int64_t C, int64_t npix, int64_t sstep, int64_t dstep, bool stream,
                                 scalar_t* out) {
  using A = acc_t<scalar_t>;
  using Vec = Vectorized<A>;
  using Wd = Widen<scalar_t, A>;
  constexpr int64_t L = Vec::size();
  const int64_t n = NT > 0 ? NT : nt;  // NT = 0: any count, looped
  for (int64_t j = 0; j < npix; ++j, out += dstep) {
    const int64_t shift = j * sstep;
    int64_t c = 0;
    for (; c + L <= C; c += L) {
      Vec acc(A(0));
#pragma GCC unroll 9
      for (int64_t t = 0; t < n; ++t)
        acc = at::vec::fmadd(Wd::load(sp[t] + shift + c), Wd::load(fp[t] + c), acc);
      if constexpr (std::is_same_v<scalar_t, float>)
        if (stream) {
          stream_store(out + c, acc);
          continue;
        }
      Wd::store(out + c, acc);
    }
    for (; c < C; ++c) {
      A acc = 0;
      for (int64_t t = 0; t < n; ++t)
        acc += static_cast<A>(sp[t][shift + c]) * static_cast<A>(fp[t][c]);
      out[c] = static_cast<scalar_t>(acc);
    }
  }
}

// Average taps per destination pixel up to which correlate_by_pixel beats the tiles (input
// gradients at stride 2: 3x3 has 2.25 taps per pixel, 5x5 6.25, where only wide layers gain).
constexpr double kFewTaps = 4.5, kFewTapsWide = 7;
constexpr int64_t kWideChannels = 128;
constexpr int64_t kMaxPixelTaps = 16;
// Source and destination bytes up to which the few-taps path stores ordinarily (see
// correlate_by_pixel): at 8-10 MB (dx of 6.4-8 MB) ordinary stores took 0.53-0.63x the
// streamed time on Zen 5; at 12-16 MB streaming was as fast or faster.
constexpr int64_t kFewTapsCachedBytes = int64_t{10} << 20;

int64_t max_count(const AxisTaps& taps, int64_t dst) {
  int64_t m = 0;
  for (int64_t i = 0; i < dst; ++i) m = std::max(m, taps.count(i));
  return m;
}

}  // namespace

template <typename scalar_t>
bool few_taps_per_pixel(const Correlation<scalar_t>& p) {
  const double taps = static_cast<double>(p.rows->k.size()) * p.cols->k.size() /
                      std::max<double>(1, static_cast<double>(p.Hd) * p.Wd);
  const double limit = p.C >= kWideChannels ? kFewTapsWide : kFewTaps;
  return taps <= limit && p.C >= 8 &&
         max_count(*p.rows, p.Hd) * max_count(*p.cols, p.Wd) <= kMaxPixelTaps;
}

// Float layers whose pixels alias in L1 on the 8-lane path, with pixels of 2 KiB or more (512
// channels) or a source step of 2: their tiles are 4 columns of two channel vectors, which
// reread each source pixel line by line; pixel by pixel, each source pixel's lines are read in
// a row, for twice the loads per FMA. (At 256 channels and source step 1 the tiles stay ahead;
// measurements in docs/perf-notes/depthwise_conv2d.md.) The tiles of a float layer slide over
// every destination pixel (clipped at the borders) and sum each tap row's column taps in
// ascending source order: with unit dilation along W (consecutive sources) and the taps in
// that order, these are the tiles' sums in the tiles' order, so the same bits. (The AVX-512
// tiles read whole lines and keep the tiles; so do 5x5 layers, over kMaxPixelTaps; and so does
// every layer where depthwise_aliasing_by_pixel() says no: on CPUs with AVX-512, rows of 8 or
// more columns; see cpu/isa.h.)
template <typename scalar_t>
bool aliasing_by_pixel(const Correlation<scalar_t>& p) {
  if (!std::is_same_v<scalar_t, float> || !pixels_alias_in_l1<scalar_t>(p.C) ||
      (p.C * static_cast<int64_t>(sizeof(scalar_t)) < 2048 && p.sstep != 2) ||
      (p.C % 16 == 0 && avx512_enabled()) ||
      !depthwise_aliasing_by_pixel(p.Wd < kAliasingTileColumns) ||
      max_count(*p.rows, p.Hd) * max_count(*p.cols, p.Wd) > kMaxPixelTaps)
    return false;
  const AxisTaps& cols = *p.cols;
  for (int64_t q = 0; q < p.Wd; ++q)
    for (int64_t b = cols.offset[q] + 1; b < cols.offset[q + 1]; ++b)
      if (std::abs(cols.src[b] - cols.src[b - 1]) != 1) return false;
  return true;
}

template <typename scalar_t>
void correlate_by_pixel(const Correlation<scalar_t>& p, bool ascending_columns) {
  const AxisTaps& rows = *p.rows;
  const AxisTaps& cols = *p.cols;
  const int64_t C = p.C, row_elems = p.Wd * C;
  const std::vector<int64_t> run = shifted_runs(cols, p.Wd, p.qstep, p.sstep);
  // A large output is written with non-temporal stores: straight from the registers when
  // every pixel is whole 64-byte lines (float, C % 16 == 0; the phases write pixels out of
  // order), else through a staging row streamed out while the next row is computed. Few-taps
  // layers (strided input gradients) read a source a quarter of their output's size: while
  // both together fit in kFewTapsCachedBytes, ordinary stores leave the output in the L3 for
  // the next call or consumer, and beat the non-temporal ones, whose trips to memory also
  // varied the most with the host's load (perf notes, session 35).
  const int64_t src_bytes = p.N * p.Hs * p.Ws * C * static_cast<int64_t>(sizeof(scalar_t));
  const int64_t dst_bytes = p.N * p.Hd * row_elems * static_cast<int64_t>(sizeof(scalar_t));
  const bool cached = !ascending_columns && src_bytes + dst_bytes <= kFewTapsCachedBytes;
  const bool large = large_output(p) && !cached, stream = streams_whole_lines(p) && !cached;
  const bool staged = large && !stream;
  const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, row_elems));
  at::parallel_for(0, p.N * p.Hd, grain, [&](int64_t begin, int64_t end) {
    const scalar_t* sp[kMaxPixelTaps];
    const scalar_t* fp[kMaxPixelTaps];
    StagedRows<scalar_t> rows_out(staged, row_elems);
    for (int64_t nr = begin; nr < end; ++nr) {
      const int64_t n = nr / p.Hd, r = nr % p.Hd;
      const scalar_t* simg = p.src + n * p.Hs * p.Ws * C;
      scalar_t* const dst_row = p.dst + nr * row_elems;
      scalar_t* drow = rows_out.row(nr, dst_row);
      // Pixel by pixel within each column phase: a run of pixels whose taps are shifted copies
      // shares one set of tap pointers and one unrolled kernel.
      for (int64_t q0 = 0; q0 < std::min(p.qstep, p.Wd); ++q0) {
        for (int64_t q = q0; q < p.Wd; q += run[q] * p.qstep) {
          int64_t nt = 0;
          const int64_t b0 = cols.offset[q], nb = cols.count(q);
          const bool reverse = ascending_columns && nb > 1 && cols.src[b0] > cols.src[b0 + 1];
          for (int64_t a = rows.offset[r]; a < rows.offset[r + 1]; ++a)
            for (int64_t i = 0; i < nb; ++i, ++nt) {
              const int64_t b = reverse ? b0 + nb - 1 - i : b0 + i;
              sp[nt] = simg + (rows.src[a] * p.Ws + cols.src[b]) * C;
              fp[nt] = p.filt + (rows.k[a] * p.fw + cols.k[b]) * C;
            }
          rows_out.step();
          scalar_t* out = drow + q * C;
          const int64_t npix = run[q], ss = p.sstep * C, ds = p.qstep * C;
          switch (nt) {
            case 0:
              for (int64_t j = 0; j < npix; ++j) std::fill_n(out + j * ds, C, scalar_t(0));
              break;
#define TFGRADS_PIXELS(NT) \
  case NT: correlate_pixels_run<scalar_t, NT>(sp, fp, nt, C, npix, ss, ds, stream, out); break;
              TFGRADS_PIXELS(1)
              TFGRADS_PIXELS(2)
              TFGRADS_PIXELS(3)
              TFGRADS_PIXELS(4)
              TFGRADS_PIXELS(6)
              TFGRADS_PIXELS(9)
#undef TFGRADS_PIXELS
            default: correlate_pixels_run<scalar_t, 0>(sp, fp, nt, C, npix, ss, ds, stream, out);
          }
        }
      }
      rows_out.done(nr, dst_row, p.qstep * (p.Wd > 8 ? 4 : 1));  // about its runs
    }
    rows_out.finish();
    if (large) stream_fence();
  });
}

template bool aliasing_by_pixel<float>(const Correlation<float>&);
template bool aliasing_by_pixel<double>(const Correlation<double>&);
template bool aliasing_by_pixel<c10::Half>(const Correlation<c10::Half>&);
template bool aliasing_by_pixel<c10::BFloat16>(const Correlation<c10::BFloat16>&);
template bool few_taps_per_pixel<float>(const Correlation<float>&);
template bool few_taps_per_pixel<double>(const Correlation<double>&);
template bool few_taps_per_pixel<c10::Half>(const Correlation<c10::Half>&);
template bool few_taps_per_pixel<c10::BFloat16>(const Correlation<c10::BFloat16>&);
template void correlate_by_pixel<float>(const Correlation<float>&, bool);
template void correlate_by_pixel<double>(const Correlation<double>&, bool);
template void correlate_by_pixel<c10::Half>(const Correlation<c10::Half>&, bool);
template void correlate_by_pixel<c10::BFloat16>(const Correlation<c10::BFloat16>&, bool);

}  // namespace depthwise_cpu
}  // namespace torch_tfgrads
