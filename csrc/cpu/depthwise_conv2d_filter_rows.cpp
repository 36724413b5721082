// The filter gradient of short rows of 3-column filters: the row plan of the AVX-512 row pass
// (row_tiles_3x3, filter_row_pass), and on the 8-lane path, at source step 1, the direct order:
// every product goes straight into its filter tap's sum, rows in order, each row's columns in
// order, the nine sums of a vector of channels held in registers across a chunk's rows
// (filter_row_3x3<.., true> adds in the same order in 16 lanes, so both paths agree bit for
// bit).
//
// Where pixels alias in L1 (256, 512, 1024 float channels) a chunk's rows are first copied, a
// range of channels at a time, into blocks of 16 channels (one 64-byte line per pixel, a block's
// pixels contiguous): read in place, every pixel of a row falls into the same L1 set, so the
// sums' reads went to L2 again and again, and an 8-lane vector uses half a line per read. The
// copy reads each pixel's channels in a row and uses each line once; the sums then run from L1.
// (out_backprop, read once per vector, is copied too except at 4 KiB pixels.)
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "cpu/depthwise_conv2d_avx512.h"
#include "cpu/depthwise_conv2d_cpu.h"

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
// the image.
struct Segment {
  const float* x0;
  const float* d0;
  int64_t xrs, drs, px, lo, i0, i1, dpx;
};

// An output column's taps: filter columns [klo, khi) (none: klo = khi), filter column k
// reading source column s0 + k (consecutive taps, as row_tiles_3x3 admits).
struct ColumnTaps {
  int64_t s0;
  int klo, khi;
};

// One filter row's three sums against source row xr, for one column's taps.
template <typename V>
inline __attribute__((always_inline)) void column_taps(const float* xr, const V& d,
                                                       const ColumnTaps& ct, int64_t px, V& p0,
                                                       V& p1, V& p2) {
  // (Each address formed only for a tap that exists: s0 is -1 or -2 at a left border.)
  if (ct.klo == 0 && ct.khi > 0) p0 = fma_(V::loadu(xr + ct.s0 * px), d, p0);
  if (ct.klo <= 1 && ct.khi > 1) p1 = fma_(V::loadu(xr + (ct.s0 + 1) * px), d, p1);
  if (ct.khi > 2) p2 = fma_(V::loadu(xr + (ct.s0 + 2) * px), d, p2);
}

// One filter row's sums of filter columns [KLO, KHI) for one column; xs: filter column KLO's
// source pixel (the next ones px apart).
template <typename V, int KLO, int KHI>
inline __attribute__((always_inline)) void fixed_taps(const float* xs, const V& d, int64_t px,
                                                      V& p0, V& p1, V& p2) {
  if constexpr (KLO == 0) p0 = fma_(V::loadu(xs), d, p0);
  if constexpr (KLO <= 1 && KHI > 1) p1 = fma_(V::loadu(xs + (1 - KLO) * px), d, p1);
  if constexpr (KHI > 2) p2 = fma_(V::loadu(xs + (2 - KLO) * px), d, p2);
}

// The three filter rows' (those in MASK) sums of filter columns [KLO, KHI) for one column whose
// filter column KLO reads pixel o of each source row xr[kr].
template <typename V, int MASK, int KLO, int KHI>
inline __attribute__((always_inline)) void fixed_column(const float* const* xr, int64_t o,
                                                        const V& d, int64_t px, V& p00, V& p01,
                                                        V& p02, V& p10, V& p11, V& p12, V& p20,
                                                        V& p21, V& p22) {
  if (MASK & 1) fixed_taps<V, KLO, KHI>(xr[0] + o, d, px, p00, p01, p02);
  if (MASK & 2) fixed_taps<V, KLO, KHI>(xr[1] + o, d, px, p10, p11, p12);
  if (MASK & 4) fixed_taps<V, KLO, KHI>(xr[2] + o, d, px, p20, p21, p22);
}

// One output row's products, columns in order: the edge columns (some filter columns clipped)
// tap by tap, the interior columns [ja, jb) (all three filter columns) straight. MASK bit kr:
// filter row kr has a tap in this row, source row xr[kr]. SAME1: the columns of a 3x3 SAME
// layer at source step 1 (one edge column on each side, filter columns 1-2 and 0-1), whose
// edges then need no tests per tap (0.89-0.97x the time).
template <typename V, int MASK, bool SAME1>
inline __attribute__((always_inline)) void
direct_row(const float* const* xr, const float* dr, int64_t px, int64_t dpx, const ColumnTaps* cols,
           int64_t Wo, int64_t ja, int64_t jb, V& p00, V& p01, V& p02, V& p10, V& p11, V& p12,
           V& p20, V& p21, V& p22) {
  const auto edge = [&](int64_t j) {
    const V d = V::loadu(dr + j * dpx);
    if (MASK & 1) column_taps<V>(xr[0], d, cols[j], px, p00, p01, p02);
    if (MASK & 2) column_taps<V>(xr[1], d, cols[j], px, p10, p11, p12);
    if (MASK & 4) column_taps<V>(xr[2], d, cols[j], px, p20, p21, p22);
  };
  if constexpr (SAME1)
    fixed_column<V, MASK, 1, 3>(xr, 0, V::loadu(dr), px, p00, p01, p02, p10, p11, p12, p20, p21,
                                p22);
  else
    for (int64_t j = 0; j < ja; ++j) edge(j);
  const int64_t s0 = ja < jb ? cols[ja].s0 * px : 0;
  for (int64_t j = ja; j < jb; ++j)
    fixed_column<V, MASK, 0, 3>(xr, s0 + (j - ja) * px, V::loadu(dr + j * dpx), px, p00, p01, p02,
                                p10, p11, p12, p20, p21, p22);
  if constexpr (SAME1)
    fixed_column<V, MASK, 0, 2>(xr, (Wo - 2) * px, V::loadu(dr + (Wo - 1) * dpx), px, p00, p01, p02,
                                p10, p11, p12, p20, p21, p22);
  else
    for (int64_t j = std::max(ja, jb); j < Wo; ++j) edge(j);
}

// One vector (or channel) of the partial pc (filter taps ps apart, fh filter rows) over a
// segment's output rows.
template <typename V, bool SAME1>
void direct_rows(const Segment& sg, const AxisTaps& rows, int64_t fh, const ColumnTaps* cols,
                 int64_t Wo, int64_t ja, int64_t jb, float* pc, int64_t ps) {
  // Nine named sums, not an array: GCC kept an array of them on the stack (a store and a
  // reload around every FMA, 1.3x the time).
  const auto ld = [&](int kr, int k) { return kr < fh ? V::loadu(pc + (kr * 3 + k) * ps) : V{}; };
  V p00 = ld(0, 0), p01 = ld(0, 1), p02 = ld(0, 2);
  V p10 = ld(1, 0), p11 = ld(1, 1), p12 = ld(1, 2);
  V p20 = ld(2, 0), p21 = ld(2, 1), p22 = ld(2, 2);
  for (int64_t i = sg.i0; i < sg.i1; ++i) {
    const float* xr[3] = {sg.x0, sg.x0, sg.x0};
    int mask = 0;
    for (int64_t e = rows.offset[i]; e < rows.offset[i + 1]; ++e) {
      xr[rows.k[e]] = sg.x0 + (rows.src[e] - sg.lo) * sg.xrs;
      mask |= 1 << rows.k[e];
    }
    const float* dr = sg.d0 + (i - sg.i0) * sg.drs;
    switch (mask) {
#define TFGRADS_ROW(M)                                                                             \
  case M:                                                                                          \
    direct_row<V, M, SAME1>(xr, dr, sg.px, sg.dpx, cols, Wo, ja, jb, p00, p01, p02, p10, p11, p12, \
                            p20, p21, p22);                                                        \
    break;
      TFGRADS_ROW(1)
      TFGRADS_ROW(2)
      TFGRADS_ROW(3)
      TFGRADS_ROW(4)
      TFGRADS_ROW(5)
      TFGRADS_ROW(6)
      TFGRADS_ROW(7)
#undef TFGRADS_ROW
      default: break;  // no tap row: padding only
    }
  }
  const auto st = [&](int kr, int k, const V& v) {
    if (kr < fh) v.store(pc + (kr * 3 + k) * ps);
  };
  st(0, 0, p00), st(0, 1, p01), st(0, 2, p02);
  st(1, 0, p10), st(1, 1, p11), st(1, 2, p12);
  st(2, 0, p20), st(2, 1, p21), st(2, 2, p22);
}

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
  using Kernel = int64_t (*)(const float* const*, const float*, const RowTile*, int64_t, int64_t,
                             int64_t, int64_t, float* const*, int64_t);
  static constexpr Kernel kernels[2][2][3] = {
      {{filter_row_3x3<1, 1, false>, filter_row_3x3<1, 2, false>, filter_row_3x3<1, 3, false>},
       {filter_row_3x3<2, 1, false>, filter_row_3x3<2, 2, false>, filter_row_3x3<2, 3, false>}},
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
  return !tiles.empty() && g.sW == 1 && (g.Wo <= 16 || (g.Wo <= 32 && C <= 64));
}

void direct_filter_rows(const float* x, const float* dy, const Geometry& g, int64_t C,
                        const AxisTaps& rows, const AxisTaps& cols, int64_t r0, int64_t r1,
                        float* pc, int64_t ps, std::vector<float>& buf) {
  std::vector<ColumnTaps> taps(static_cast<size_t>(g.Wo));
  for (int64_t j = 0; j < g.Wo; ++j) {
    const int64_t o = cols.offset[j], nc = cols.count(j);
    const int klo = nc ? static_cast<int>(cols.k[o]) : 0;
    taps[j] = {nc ? cols.src[o] - klo : 0, klo, klo + static_cast<int>(nc)};
  }
  const ColumnTaps* ct = taps.data();
  // The interior columns [ja, jb): all three filter columns, source columns one apart.
  int64_t ja = 0;
  while (ja < g.Wo && !(ct[ja].klo == 0 && ct[ja].khi == 3)) ++ja;
  int64_t jb = ja;
  while (jb < g.Wo && ct[jb].klo == 0 && ct[jb].khi == 3 && ct[jb].s0 == ct[ja].s0 + (jb - ja))
    ++jb;
  const int64_t last = g.Wo - 1;
  const bool same1 = g.Wo >= 3 && ja == 1 && jb == last && ct[0].klo == 1 && ct[0].khi == 3 &&
                     ct[0].s0 == -1 && ct[last].klo == 0 && ct[last].khi == 2 &&
                     ct[last].s0 == last - 1;
  const auto vec_rows = same1 ? direct_rows<Vec, true> : direct_rows<Vec, false>;
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
      Segment sg{ximg, dyimg, g.W * C, g.Wo * C, C, lo, i0, i1, C};
      int64_t c = 0;
      for (; c + L <= C; c += L, sg.x0 += L, sg.d0 += L)
        vec_rows(sg, rows, g.fh, ct, g.Wo, ja, jb, pc + c, ps);
      for (; c < C; ++c, ++sg.x0, ++sg.d0)
        direct_rows<One, false>(sg, rows, g.fh, ct, g.Wo, ja, jb, pc + c, ps);
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
        for (int64_t v = 0; v < kBlock; v += L) {
          const int64_t c = c0 + b * kBlock + v;
          const float* d0 = dy_in_place ? dyimg + c : db + b * dbs + v;
          const int64_t drs = dy_in_place ? g.Wo * C : g.Wo * kBlock;
          const Segment sg{xb + b * xbs + v,        d0, g.W * kBlock, drs, kBlock, lo, i0, i1,
                           dy_in_place ? C : kBlock};
          vec_rows(sg, rows, g.fh, ct, g.Wo, ja, jb, pc + c, ps);
        }
    }
  }
}

}  // namespace depthwise_cpu
}  // namespace torch_tfgrads
