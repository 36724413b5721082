// The filter gradient of short rows of 3-column filters: the row plan of the AVX-512 row pass
// (row_tiles_3x3, filter_row_pass), and at source step 1 (or 2 where pixels do not alias in
// L1: direct_filter_rows_apply) the direct order: every product goes straight into its filter
// tap's sum, rows in order, each row's columns in order, the nine sums of a vector of channels
// held in registers across a chunk's rows (direct_filter_rows, with the sums of
// depthwise_conv2d_filter_rows_sums.h in 8 lanes, or in 16 on the AVX-512 path where that beat
// the row pass; filter_row_3x3<.., true> adds in the same order, so every path gives the same
// bits).
//
// Where pixels alias in L1 (256, 512, 1024 float channels) a chunk's rows are first copied, a
// range of channels at a time, into blocks of 16 channels (one 64-byte line per pixel, a block's
// pixels contiguous): read in place, every pixel of a row falls into the same L1 set, so the
// sums' reads went to L2 again and again, and an 8-lane vector uses half a line per read. The
// copy reads each pixel's channels in a row and uses each line once; the sums then run from L1.
// (out_backprop, read once per vector, is copied too except at 4 KiB pixels.)
#include <ATen/cpu/vec/vec.h>
#include <c10/util/Exception.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "cpu/depthwise_conv2d_avx512.h"
#include "cpu/depthwise_conv2d_cpu.h"
#include "cpu/isa.h"

namespace torch_tfgrads {
namespace depthwise_cpu {
namespace {

using at::vec::Vectorized;
using depthwise_avx512::RowTile;
using Vec = Vectorized<float>;
constexpr int64_t L = Vec::size();
constexpr int64_t kBlock = 16;  // channels per packed block: a 64-byte line of floats
static_assert(kBlock % L == 0, "a block holds whole vectors");
// Channels copied at a time: a 7x7 chunk's blocks then take about 100 KiB (within L2).
constexpr int64_t kPackChannels = 256;

// Pixels [0, nx) of xs and [0, nd) of ds (C channels each, from channel c0) into nb blocks
// each, pixel p of block b at xd + b * xbs + p * kBlock (dd, dbs for ds): the two tensors'
// pixels in turn, two streams of loads in flight.
void pack_pixels(const float* xs, int64_t nx, float* xd, int64_t xbs, const float* ds, int64_t nd,
                 float* dd, int64_t dbs, int64_t C, int64_t c0, int64_t nb) {
  const auto pixel = [nb](const float* src, float* dst, int64_t bstride) {
    for (int64_t b = 0; b < nb; ++b)
      for (int64_t v = 0; v < kBlock; v += L)
        Vec::loadu(src + b * kBlock + v).store(dst + b * bstride + v);
  };
  for (int64_t p = 0; p < std::max(nx, nd); ++p) {
    if (p < nx) pixel(xs + p * C + c0, xd + p * kBlock, xbs);
    if (p < nd) pixel(ds + p * C + c0, dd + p * kBlock, dbs);
  }
}

// One channel (a layer's last C % 8), with the same fused multiply-add as a vector's lane.
struct One {
  float v;
  static One loadu(const float* p) { return {*p}; }
  void store(float* p) const { *p = v; }
};
inline One fma_(One a, One b, One c) { return {std::fma(a.v, b.v, c.v)}; }
inline Vec fma_(const Vec& a, const Vec& b, const Vec& c) { return at::vec::fmadd(a, b, c); }

// Where one segment's rows are: source rows from x0 (row stride xrs, pixel stride px), output
// rows from d0 (row stride drs, pixel stride dpx), source row lo first; output rows [i0, i1) of
// the image; sx: from one output column's source pixel to the next one's (px times the step).
struct Segment {
  const float* x0;
  const float* d0;
  int64_t xrs, drs, px, lo, i0, i1, dpx, sx;
};

// An output column's taps: filter columns [klo, khi) (none: klo = khi), filter column k
// reading source column s0 + k (consecutive taps, as row_tiles_3x3 admits).
struct ColumnTaps {
  int64_t s0;
  int klo, khi;
};

namespace lanes8 {
#include "cpu/depthwise_conv2d_filter_rows_sums.h"  // NOLINT(build/include)
}  // namespace lanes8

#ifdef TFGRADS_HAVE_AVX512_KERNELS
TFGRADS_AVX512_BEGIN
namespace lanes16 {
// A 16-lane vector for the sums' templates: the same fused multiply-add per lane.
struct V16 {
  __m512 v;
  static V16 loadu(const float* p) { return {_mm512_loadu_ps(p)}; }
  void store(float* p) const { _mm512_storeu_ps(p, v); }
};
inline V16 fma_(const V16& a, const V16& b, const V16& c) {
  return {_mm512_fmadd_ps(a.v, b.v, c.v)};
}
#include "cpu/depthwise_conv2d_filter_rows_sums.h"  // NOLINT(build/include)
}  // namespace lanes16
TFGRADS_AVX512_END
#endif

using RowsFn = void (*)(const Segment&, const AxisTaps&, int64_t, const ColumnTaps*, int64_t,
                        int64_t, int64_t, float*, int64_t);

}  // namespace

// The row pass is limited to rows of up to 16 columns (or 32 at up to 128 channels): on longer
// rows the tiles, which keep a tile's pixels in L1 for all of a chunk's channel vectors, were
// faster (perf notes).
std::vector<RowTile> row_tiles_3x3(const Geometry& g, int64_t C, const AxisTaps& cols,
                                   const std::vector<int64_t>& run, bool merge_3) {
  std::vector<RowTile> tiles;
  if (g.fw != 3 || g.fh > 3 || g.sW > 2 || !(g.Wo <= 16 || (g.Wo <= 32 && C <= 128))) return tiles;
  for (int64_t q = 0; q < g.Wo; q += run[q]) {
    const int64_t o = cols.offset[q], nc = cols.count(q);
    for (int64_t t0 = 0, tl = 0; t0 < run[q]; t0 += tl) {
      tl = tile_columns(run[q] - t0, nc, merge_3);
      if (nc == 0) continue;
      bool ok = nc <= 3 && cols.k[o] + nc <= 3;
      for (int64_t b = 1; ok && b < nc; ++b)
        ok = cols.src[o + b] == cols.src[o] + b && cols.k[o + b] == cols.k[o] + b;
      if (!ok) return {};
      tiles.push_back(
          {q + t0, tl, cols.src[o] + t0 * g.sW, static_cast<int>(nc), static_cast<int>(cols.k[o])});
    }
  }
  return tiles;
}

void filter_row_pass(const float* const* x, float* const* part, int64_t n, const float* dyrow,
                     const std::vector<RowTile>& tiles, int64_t sW, int64_t C, int64_t c0,
                     int64_t c1, int64_t ps, bool direct) {
#ifdef TFGRADS_HAVE_AVX512_KERNELS
  using depthwise_avx512::filter_row_3x3;
  using depthwise_avx512::filter_row_3x3_k;
  using Kernel = int64_t (*)(const float* const*, const float*, const RowTile*, int64_t, int64_t,
                             int64_t, int64_t, float* const*, int64_t);
  // Source step 2 in the tiles' order takes two channel vectors per pass (filter_row_3x3_k):
  // 128 contiguous bytes of each source pixel, where one vector read a single line of pixels
  // that alias in L1 (perf notes).
  static constexpr Kernel kernels[2][2][3] = {
      {{filter_row_3x3<1, 1, false>, filter_row_3x3<1, 2, false>, filter_row_3x3<1, 3, false>},
       {filter_row_3x3_k<2, 1, 2>, filter_row_3x3_k<2, 2, 2>, filter_row_3x3_k<2, 3, 2>}},
      {{filter_row_3x3<1, 1, true>, filter_row_3x3<1, 2, true>, filter_row_3x3<1, 3, true>},
       {filter_row_3x3<2, 1, true>, filter_row_3x3<2, 2, true>, filter_row_3x3<2, 3, true>}}};
  kernels[direct][sW - 1][n - 1](x, dyrow, tiles.data(), static_cast<int64_t>(tiles.size()), C, c0,
                                 c1, part, ps);
#else
  (void)x, (void)part, (void)n, (void)dyrow, (void)tiles, (void)sW, (void)C, (void)c0, (void)c1,
      (void)ps, (void)direct;
#endif
}

bool direct_filter_rows_apply(const Geometry& g, int64_t C, const std::vector<RowTile>& tiles) {
  // At source step 2 only where pixels do not alias in L1: at 256 and 512 channels the 8-lane
  // direct order (on copied blocks) was slower than the 8-lane tiles (perf notes).
  return !tiles.empty() && (g.sW == 1 || (g.sW == 2 && !pixels_alias_in_l1<float>(C))) &&
         (g.Wo <= 16 || (g.Wo <= 32 && C <= 64));
}

bool direct_filter_rows_wide(const Geometry& g, int64_t C) {
  // Read in place (0.82-0.98x the row pass's time at six layers of 32-128 channels, 1.07 at
  // 14x14x64), or 7x7 rows at 1024 channels, whose out_backprop is read in place too
  // (0.80-0.85x). Copied blocks at 256-1024 channels on longer rows were 1.04-1.36x.
  return !pixels_alias_in_l1<float>(C) || (C % 1024 == 0 && g.Wo <= 8);
}

void direct_filter_rows(const float* x, const float* dy, const Geometry& g, int64_t C,
                        const AxisTaps& rows, const AxisTaps& cols, int64_t r0, int64_t r1,
                        float* pc, int64_t ps, std::vector<float>& buf, bool wide) {
  // Rows of at most 32 columns (direct_filter_rows_apply): the column taps on the stack, not a
  // heap allocation per chunk.
  TORCH_INTERNAL_ASSERT(g.Wo <= 32);
  ColumnTaps taps[32];
  for (int64_t j = 0; j < g.Wo; ++j) {
    const int64_t o = cols.offset[j], nc = cols.count(j);
    const int klo = nc ? static_cast<int>(cols.k[o]) : 0;
    taps[j] = {nc ? cols.src[o] - klo : 0, klo, klo + static_cast<int>(nc)};
  }
  const ColumnTaps* ct = taps;
  // The interior columns [ja, jb): all three filter columns, source columns one apart.
  int64_t ja = 0;
  while (ja < g.Wo && !(ct[ja].klo == 0 && ct[ja].khi == 3)) ++ja;
  int64_t jb = ja;
  while (jb < g.Wo && ct[jb].klo == 0 && ct[jb].khi == 3 &&
         ct[jb].s0 == ct[ja].s0 + (jb - ja) * g.sW)
    ++jb;
  const int64_t last = g.Wo - 1;
  const bool same1 = g.sW == 1 && g.Wo >= 3 && ja == 1 && jb == last && ct[0].klo == 1 &&
                     ct[0].khi == 3 && ct[0].s0 == -1 && ct[last].klo == 0 && ct[last].khi == 2 &&
                     ct[last].s0 == last - 1;
  RowsFn vec_rows = same1 ? lanes8::direct_rows<Vec, true> : lanes8::direct_rows<Vec, false>;
  int64_t lanes = L;
#ifdef TFGRADS_HAVE_AVX512_KERNELS
  if (wide) {  // C % 16 == 0
    vec_rows = same1 ? lanes16::direct_rows<lanes16::V16, true>
                     : lanes16::direct_rows<lanes16::V16, false>;
    lanes = 16;
  }
#endif
  const bool pack = C % kBlock == 0 && pixels_alias_in_l1<float>(C);
  // out_backprop, read once per vector, stays in place where pixels are 4 KiB apart (1024
  // channels: 0.81-0.92x the time of copying it too; at 512 channels 1.09x, perf notes).
  const bool dy_in_place = C % 1024 == 0;
  const int64_t chunk_c = std::min(C, kPackChannels);
  for (int64_t s = r0; s < r1;) {
    // The chunk's rows of one image: output rows [i0, i1) reading source rows [lo, hi].
    const int64_t n = s / g.Ho, i0 = s % g.Ho, i1 = std::min(g.Ho, i0 + (r1 - s));
    s += i1 - i0;
    int64_t lo = g.H, hi = -1;
    for (int64_t a = rows.offset[i0]; a < rows.offset[i1]; ++a) {
      lo = std::min(lo, rows.src[a]);
      hi = std::max(hi, rows.src[a]);
    }
    if (hi < lo) continue;  // every row padding
    const float* ximg = x + (n * g.H + lo) * g.W * C;
    const float* dyimg = dy + (n * g.Ho + i0) * g.Wo * C;
    if (!pack) {
      Segment sg{ximg, dyimg, g.W * C, g.Wo * C, C, lo, i0, i1, C, g.sW * C};
      int64_t c = 0;
      for (; c + lanes <= C; c += lanes, sg.x0 += lanes, sg.d0 += lanes)
        vec_rows(sg, rows, g.fh, ct, g.Wo, ja, jb, pc + c, ps);
      for (; c < C; ++c, ++sg.x0, ++sg.d0)
        lanes8::direct_rows<One, false>(sg, rows, g.fh, ct, g.Wo, ja, jb, pc + c, ps);
      continue;
    }
    const int64_t nx = (hi - lo + 1) * g.W, nd = (i1 - i0) * g.Wo;
    const int64_t xbs = nx * kBlock, dbs = nd * kBlock, nb_max = chunk_c / kBlock;
    if (static_cast<int64_t>(buf.size()) < nb_max * (xbs + dbs) + kBlock)
      buf.resize(static_cast<size_t>(nb_max * (xbs + dbs) + kBlock));
    // Blocks on whole lines: a block across two lines costs two lines per pixel.
    float* xb = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(buf.data()) + 63) &
                                         ~uintptr_t{63});
    float* db = xb + nb_max * xbs;
    for (int64_t c0 = 0; c0 < C; c0 += chunk_c) {
      const int64_t nb = std::min(chunk_c, C - c0) / kBlock;
      pack_pixels(ximg, nx, xb, xbs, dyimg, dy_in_place ? 0 : nd, db, dbs, C, c0, nb);
      for (int64_t b = 0; b < nb; ++b)
        for (int64_t v = 0; v < kBlock; v += lanes) {
          const int64_t c = c0 + b * kBlock + v;
          const float* d0 = dy_in_place ? dyimg + c : db + b * dbs + v;
          const int64_t drs = dy_in_place ? g.Wo * C : g.Wo * kBlock;
          const Segment sg{
              xb + b * xbs + v,         d0,           g.W * kBlock, drs, kBlock, lo, i0, i1,
              dy_in_place ? C : kBlock, g.sW * kBlock};
          vec_rows(sg, rows, g.fh, ct, g.Wo, ja, jb, pc + c, ps);
        }
    }
  }
}

}  // namespace depthwise_cpu
}  // namespace torch_tfgrads
