// FractionalMaxPoolGrad, float, 16 channels per AVX-512 register (see the header). The
// structure is MaxGradPass's (fractional_max_pool_grad_pass.h): disjoint cells write their
// elements straight after their argmax sweep; overlapping cells keep a cell row's argmaxes in
// a two-row ring and gather each dx row once, cell by cell, from the (at most 2x2) cells
// covering it. Everything after the `#pragma GCC target` is compiled for AVX-512 and only
// called when avx512_enabled() says so.
#include "cpu/fractional_max_pool_grad_avx512.h"

#include <algorithm>

#include "cpu/isa.h"

#ifdef TFGRADS_HAVE_AVX512_KERNELS
#include <immintrin.h>
#endif

namespace torch_tfgrads {
namespace fracpool {

MaxGradAvx512::MaxGradAvx512(const float* x_, int64_t sN_, int64_t sH_, int64_t sW_,
                             const float* y_, const float* dy_, float* dx_, const GradPlan& plan,
                             bool stream_)
    : x(x_),
      sN(sN_),
      sH(sH_),
      sW(sW_),
      y(y_),
      dy(dy_),
      dx(dx_),
      g(plan),
      H(plan.H),
      W(plan.W),
      C(plan.C),
      OH(plan.rows.cells),
      OW(plan.cols.cells),
      cw_max(0),
      stream(stream_) {
  for (int64_t j = 0; j < OW; ++j) cw_max = std::max(cw_max, g.cols.count(j));
}

#ifdef TFGRADS_HAVE_AVX512_KERNELS
namespace {

TFGRADS_AVX512_BEGIN

constexpr int64_t L = 16;
constexpr __mmask16 kAll = 0xFFFF;

inline void put(float* p, __m512 v, bool stream) {
  if (stream) {
    _mm512_stream_ps(p, v);
  } else {
    _mm512_storeu_ps(p, v);
  }
}

// The argmax of K items (cells, or channel vectors of one cell) of compile-time size, their
// chains interleaved: item k's channels [0, 16) at its CW column pointers col[k][w] (a narrower
// cell's last column repeated) and rows `row` apart, so no address arithmetic per element (x86
// addressing folds the row offsets for RH <= 3). `at`: the position h * CW + w of orig_output's
// value m[k] in the cell, i.e. the first element equal to it in scan order, found by a reverse
// sweep whose last hit wins (a repeated column is visited before its real one, which then
// wins). TF's recomputed maximum `dup` is max(v, dup) from the first element on: VMAXPS returns
// its second operand when either is NaN, so a NaN later in the cell is skipped and a NaN first
// element stays, as in TF. The lanes where dup equals m stay set in `same`; where it does, m
// is the cell's maximum and its first occurrence is TF's argmax (first maximum in scan order;
// a -0/+0 tie is equal in both).
template <int RH, int CW, int K>
inline void sweep(const float* const (*col)[CW], const __m512* m, int64_t row, __mmask16& same,
                  __m512* at) {
  __m512 e0[K], dup[K];
  for (int k = 0; k < K; ++k) {
    e0[k] = dup[k] = _mm512_loadu_ps(col[k][0]);
    at[k] = _mm512_setzero_ps();
  }
#pragma GCC unroll 4
  for (int h = RH - 1; h >= 0; --h) {
#pragma GCC unroll 4
    for (int w = CW - 1; w >= (h == 0 ? 1 : 0); --w) {
      const __m512 here = _mm512_set1_ps(static_cast<float>(h * CW + w));
#pragma GCC unroll 2
      for (int k = 0; k < K; ++k) {
        const __m512 v = _mm512_loadu_ps(col[k][w] + h * row);
        dup[k] = _mm512_max_ps(v, dup[k]);
        at[k] = _mm512_mask_mov_ps(at[k], _mm512_cmp_ps_mask(v, m[k], _CMP_EQ_OQ), here);
      }
    }
  }
  for (int k = 0; k < K; ++k) {
    at[k] = _mm512_mask_mov_ps(at[k], _mm512_cmp_ps_mask(e0[k], m[k], _CMP_EQ_OQ),
                               _mm512_setzero_ps());
    same = _mm512_mask_cmp_ps_mask(same, dup[k], m[k], _CMP_EQ_OQ);
  }
}

// The same for one cell of runtime size (rows [0, rh), columns [0, last] of xc at row/pixel
// strides; positions h * stride + w).
inline __m512 sweep_any(const float* xc, __m512 m, int64_t rh, int64_t last, int64_t stride,
                        int64_t row, int64_t pixel, __mmask16& same) {
  const __m512 e0 = _mm512_loadu_ps(xc);
  __m512 dup = e0, at = _mm512_setzero_ps();
  for (int64_t h = rh - 1; h >= 0; --h) {
    for (int64_t w = last; w >= (h == 0 ? 1 : 0); --w) {
      const __m512 v = _mm512_loadu_ps(xc + h * row + w * pixel);
      dup = _mm512_max_ps(v, dup);
      at = _mm512_mask_mov_ps(at, _mm512_cmp_ps_mask(v, m, _CMP_EQ_OQ),
                              _mm512_set1_ps(static_cast<float>(h * stride + w)));
    }
  }
  same = _mm512_mask_cmp_ps_mask(same, dup, m, _CMP_EQ_OQ);
  return _mm512_mask_mov_ps(at, _mm512_cmp_ps_mask(e0, m, _CMP_EQ_OQ), _mm512_setzero_ps());
}

// ---- disjoint cells
// Cell row i of image b, all channels, cell by cell: argmax, then dy where the position
// matches and 0 elsewhere. RH, CW > 0: compile-time sizes, a narrower cell's repeated last
// column stored first so that its real column's store wins; 0: runtime sizes.
template <int RH, int CW, bool kStream>
bool cells_of_row(const MaxGradAvx512& p, int64_t b, int64_t i) {
  const GradPlan& g = p.g;
  const int64_t C = p.C, row = p.sH, pixel = p.sW, orow = p.W * C, r0 = g.rows.start[i];
  const int64_t rh = RH > 0 ? RH : g.rows.end[i] - r0 + 1;
  const float* xr = p.x + b * p.sN + r0 * row;
  const float* yr = p.y + (b * p.OH + i) * p.OW * C;
  const float* gr = p.dy + (b * p.OH + i) * p.OW * C;
  float* o = p.dx + (b * p.H + r0) * orow;
  constexpr int kCols = CW > 0 ? CW : 1;
  __mmask16 same = kAll;
  for (int64_t j = 0; j < p.OW; ++j) {
    const int64_t c0 = g.cols.start[j], last = g.cols.end[j] - c0;
    const float* col[1][kCols];
    float* ocol[kCols];
#pragma GCC unroll 4
    for (int w = 0; w < kCols; ++w) {
      const int64_t c = c0 + std::min<int64_t>(w, last);
      col[0][w] = xr + c * pixel;
      ocol[w] = o + c * C;
    }
    for (int64_t d = 0; d < C; d += L) {
      const __m512 m = _mm512_loadu_ps(yr + j * C + d);
      __m512 at;
      if constexpr (CW > 0) {
        sweep<RH, CW, 1>(col, &m, row, same, &at);
      } else {
        at = sweep_any(col[0][0], m, rh, last, p.cw_max, row, pixel, same);
      }
      // 0 + dy as TF's scatter-add (-0 -> +0).
      const __m512 grad = _mm512_add_ps(_mm512_setzero_ps(), _mm512_loadu_ps(gr + j * C + d));
#pragma GCC unroll 4
      for (int64_t h = 0; h < rh; ++h) {
        if constexpr (CW > 0) {
#pragma GCC unroll 4
          for (int w = CW - 1; w >= 0; --w) {
            const __mmask16 here = _mm512_cmp_ps_mask(
                at, _mm512_set1_ps(static_cast<float>(h * CW + w)), _CMP_EQ_OQ);
            put(ocol[w] + h * orow + d, _mm512_maskz_mov_ps(here, grad), kStream);
          }
        } else {
          for (int64_t w = 0; w <= last; ++w) {
            const __mmask16 here = _mm512_cmp_ps_mask(
                at, _mm512_set1_ps(static_cast<float>(h * p.cw_max + w)), _CMP_EQ_OQ);
            put(ocol[0] + h * orow + w * C + d, _mm512_maskz_mov_ps(here, grad), kStream);
          }
        }
      }
#pragma GCC unroll 4
      for (int w = 0; w < kCols; ++w) col[0][w] += L;
    }
  }
  return same == kAll;
}

template <int RH, bool kStream>
bool cell_row(const MaxGradAvx512& p, int64_t b, int64_t i) {
  switch (p.cw_max) {
    case 1: return cells_of_row<RH, 1, kStream>(p, b, i);
    case 2: return cells_of_row<RH, 2, kStream>(p, b, i);
    case 3: return cells_of_row<RH, 3, kStream>(p, b, i);
    default: return cells_of_row<0, 0, kStream>(p, b, i);
  }
}

template <bool kStream>
bool disjoint_row(const MaxGradAvx512& p, int64_t b, int64_t i) {
  switch (p.g.rows.count(i)) {
    case 1: return cell_row<1, kStream>(p, b, i);
    case 2: return cell_row<2, kStream>(p, b, i);
    case 3: return cell_row<3, kStream>(p, b, i);
    default: return cells_of_row<0, 0, kStream>(p, b, i);
  }
}

// ---- overlapping cells
// Argmaxes of cell row i, channels [d0, d1), into pos[OW][d1 - d0]: two items (cells, or
// channel vectors of one cell) at a time, so that two independent chains hide each other's
// latency.
template <int RH, int CW>
bool argmax_cells(const MaxGradAvx512& p, int64_t b, int64_t i, int64_t d0, int64_t d1,
                  float* pos) {
  const GradPlan& g = p.g;
  const int64_t row = p.sH, pixel = p.sW, nd = d1 - d0, C = p.C, OW = p.OW;
  const float* xr = p.x + b * p.sN + g.rows.start[i] * row + d0;
  const float* yr = p.y + (b * p.OH + i) * OW * C + d0;
  auto columns = [&](int64_t j, int64_t d, const float** col) {
    const int64_t c0 = g.cols.start[j], last = g.cols.end[j] - c0;
    const float* base = xr + c0 * pixel + d;
#pragma GCC unroll 4
    for (int w = 0; w < CW; ++w) col[w] = base + std::min<int64_t>(w, last) * pixel;
  };
  __mmask16 same = kAll;
  const float* col[2][CW];
  __m512 m[2], at[2];
  if (nd == L) {
    int64_t j = 0;
    for (; j + 1 < OW; j += 2) {
      columns(j, 0, col[0]);
      columns(j + 1, 0, col[1]);
      m[0] = _mm512_loadu_ps(yr + j * C);
      m[1] = _mm512_loadu_ps(yr + (j + 1) * C);
      sweep<RH, CW, 2>(col, m, row, same, at);
      _mm512_storeu_ps(pos + j * L, at[0]);
      _mm512_storeu_ps(pos + (j + 1) * L, at[1]);
    }
    if (j < OW) {
      columns(j, 0, col[0]);
      m[0] = _mm512_loadu_ps(yr + j * C);
      sweep<RH, CW, 1>(col, m, row, same, at);
      _mm512_storeu_ps(pos + j * L, at[0]);
    }
    return same == kAll;
  }
  for (int64_t j = 0; j < OW; ++j) {
    int64_t d = 0;
    for (; d + L < nd; d += 2 * L) {
      columns(j, d, col[0]);
      for (int w = 0; w < CW; ++w) col[1][w] = col[0][w] + L;
      m[0] = _mm512_loadu_ps(yr + j * C + d);
      m[1] = _mm512_loadu_ps(yr + j * C + d + L);
      sweep<RH, CW, 2>(col, m, row, same, at);
      _mm512_storeu_ps(pos + j * nd + d, at[0]);
      _mm512_storeu_ps(pos + j * nd + d + L, at[1]);
    }
    if (d < nd) {
      columns(j, d, col[0]);
      m[0] = _mm512_loadu_ps(yr + j * C + d);
      sweep<RH, CW, 1>(col, m, row, same, at);
      _mm512_storeu_ps(pos + j * nd + d, at[0]);
    }
  }
  return same == kAll;
}

// Cells of runtime size, one item at a time.
bool argmax_cells_any(const MaxGradAvx512& p, int64_t b, int64_t i, int64_t d0, int64_t d1,
                      float* pos) {
  const GradPlan& g = p.g;
  const int64_t r0 = g.rows.start[i], rh = g.rows.end[i] - r0 + 1, nd = d1 - d0;
  const float* xr = p.x + b * p.sN + r0 * p.sH + d0;
  const float* yr = p.y + (b * p.OH + i) * p.OW * p.C + d0;
  __mmask16 same = kAll;
  for (int64_t j = 0; j < p.OW; ++j) {
    const int64_t c0 = g.cols.start[j], last = g.cols.end[j] - c0;
    for (int64_t d = 0; d < nd; d += L) {
      const __m512 m = _mm512_loadu_ps(yr + j * p.C + d);
      _mm512_storeu_ps(pos + j * nd + d,
                       sweep_any(xr + c0 * p.sW + d, m, rh, last, p.cw_max, p.sH, p.sW, same));
    }
  }
  return same == kAll;
}

template <int RH>
bool argmax_row(const MaxGradAvx512& p, int64_t b, int64_t i, int64_t d0, int64_t d1, float* pos) {
  switch (p.cw_max) {
    case 2: return argmax_cells<RH, 2>(p, b, i, d0, d1, pos);
    case 3: return argmax_cells<RH, 3>(p, b, i, d0, d1, pos);
    default: return argmax_cells_any(p, b, i, d0, d1, pos);
  }
}

// acc plus grad where the argmax `at` is the position `here`.
inline __m512 add(__m512 acc, __m512 at, __m512 here, __m512 grad) {
  return _mm512_mask_add_ps(acc, _mm512_cmp_ps_mask(at, here, _CMP_EQ_OQ), acc, grad);
}

// dx row h of image b, channels d0 + [0, nd): 0 plus, in TF's cell order, dy of each covering
// cell whose argmax the element is. Cell row ia covers the row; kTwo: so does ib (h is its
// first row). The walk goes cell by cell: cell j's argmaxes and dy stay in registers for its
// columns, and its first column (the last of cell j - 1, for j > 0) adds j - 1's terms first.
// The running positions `ra`, `rb` step through the cell's columns. G: channel vectors at once.
template <bool kTwo, int G, bool kStream>
void gather_row(const MaxGradAvx512& p, int64_t b, int64_t h, int64_t d0, int64_t nd,
                const float* ring) {
  const GradPlan& g = p.g;
  const int64_t ia = g.rows.first[h], ib = g.rows.last[h], cells = p.OW * nd, C = p.C;
  const int64_t OW = p.OW;
  const float *pa = ring + (ia & 1) * cells, *pb = ring + (ib & 1) * cells;
  const float* ga = p.dy + (b * p.OH + ia) * OW * C + d0;
  const float* gb = p.dy + (b * p.OH + ib) * OW * C + d0;
  float* o = p.dx + (b * p.H + h) * p.W * C + d0;
  const __m512 zero = _mm512_setzero_ps(), one = _mm512_set1_ps(1.0f);
  const __m512 base_a = _mm512_set1_ps(static_cast<float>((h - g.rows.start[ia]) * p.cw_max));
  for (int64_t d = 0; d < nd; d += G * L) {
    __m512 at_a[G], dy_a[G], at_b[G], dy_b[G];      // cell j
    __m512 pat_a[G], pdy_a[G], pat_b[G], pdy_b[G];  // cell j - 1
    __m512 ra = base_a, rb = zero;  // positions of the current column in cells (ia|ib, j - 1)
    for (int64_t j = 0; j < OW; ++j) {
      const int64_t c0 = g.cols.start[j], last = g.cols.end[j] - c0;
      for (int k = 0; k < G; ++k) {
        at_a[k] = _mm512_loadu_ps(pa + j * nd + d + k * L);
        dy_a[k] = _mm512_loadu_ps(ga + j * C + d + k * L);
        if (kTwo) {
          at_b[k] = _mm512_loadu_ps(pb + j * nd + d + k * L);
          dy_b[k] = _mm512_loadu_ps(gb + j * C + d + k * L);
        }
      }
      float* out = o + c0 * C + d;
      for (int k = 0; k < G; ++k) {  // column 0 of cell j
        __m512 acc = zero;
        if (j > 0) acc = add(acc, pat_a[k], ra, pdy_a[k]);
        acc = add(acc, at_a[k], base_a, dy_a[k]);
        if (kTwo && j > 0) acc = add(acc, pat_b[k], rb, pdy_b[k]);
        if (kTwo) acc = add(acc, at_b[k], zero, dy_b[k]);
        put(out + k * L, acc, kStream);
      }
      ra = _mm512_add_ps(base_a, one);
      rb = one;
      // The last column of a cell before the last is the next cell's column 0.
      const int64_t q1 = j + 1 < OW ? last - 1 : last;
      for (int64_t q = 1; q <= q1; ++q) {
        out += C;
        for (int k = 0; k < G; ++k) {
          __m512 acc = add(zero, at_a[k], ra, dy_a[k]);
          if (kTwo) acc = add(acc, at_b[k], rb, dy_b[k]);
          put(out + k * L, acc, kStream);
        }
        ra = _mm512_add_ps(ra, one);
        rb = _mm512_add_ps(rb, one);
      }
      for (int k = 0; k < G; ++k) {
        pat_a[k] = at_a[k];
        pdy_a[k] = dy_a[k];
        if (kTwo) {
          pat_b[k] = at_b[k];
          pdy_b[k] = dy_b[k];
        }
      }
    }
  }
}

template <bool kStream, int G>
void gather_rows(const MaxGradAvx512& p, int64_t b, int64_t h, int64_t d0, int64_t nd,
                 const float* ring) {
  if (p.g.rows.first[h] == p.g.rows.last[h]) gather_row<false, G, kStream>(p, b, h, d0, nd, ring);
  if (p.g.rows.first[h] < p.g.rows.last[h]) gather_row<true, G, kStream>(p, b, h, d0, nd, ring);
}

// A band's rows need the argmaxes of its cell rows and of the next one (the shared boundary).
template <bool kStream>
bool overlapping_block(const MaxGradAvx512& p, int64_t b, int64_t d0, int64_t d1, int64_t i0,
                       int64_t i1, float* buffer) {
  const GradPlan& g = p.g;
  const int64_t nd = d1 - d0;
  // 64-byte aligned (malloc aligns to 16 bytes): a vector that straddles two cache lines
  // costs two accesses.
  float* ring = buffer + (L - reinterpret_cast<uintptr_t>(buffer) / 4 % L) % L;
  bool ok = true;
  int64_t h = g.rows.band_start(i0);
  const int64_t h1 = g.rows.band_start(i1);
  for (int64_t i = i0; i < p.OH && h < h1; ++i) {
    float* pos = ring + (i & 1) * p.OW * nd;
    switch (g.rows.count(i)) {
      case 2: ok &= argmax_row<2>(p, b, i, d0, d1, pos); break;
      case 3: ok &= argmax_row<3>(p, b, i, d0, d1, pos); break;
      default: ok &= argmax_cells_any(p, b, i, d0, d1, pos);
    }
    for (; h < h1 && g.rows.last[h] <= i; ++h) {  // rows no later cell row covers
      if (nd % (2 * L) == 0) {
        gather_rows<kStream, 2>(p, b, h, d0, nd, ring);
      } else {
        gather_rows<kStream, 1>(p, b, h, d0, nd, ring);
      }
    }
  }
  return ok;
}

TFGRADS_AVX512_END

}  // namespace

bool MaxGradAvx512::disjoint_row(int64_t b, int64_t i) const {
  return stream ? fracpool::disjoint_row<true>(*this, b, i)
                : fracpool::disjoint_row<false>(*this, b, i);
}
bool MaxGradAvx512::overlapping_block(int64_t b, int64_t d0, int64_t d1, int64_t i0, int64_t i1,
                                      float* ring) const {
  return stream ? fracpool::overlapping_block<true>(*this, b, d0, d1, i0, i1, ring)
                : fracpool::overlapping_block<false>(*this, b, d0, d1, i0, i1, ring);
}
#else
bool MaxGradAvx512::disjoint_row(int64_t, int64_t) const { return false; }
bool MaxGradAvx512::overlapping_block(int64_t, int64_t, int64_t, int64_t, int64_t, float*) const {
  return false;
}
#endif

}  // namespace fracpool
}  // namespace torch_tfgrads
