// FractionalMaxPoolGrad with disjoint cells, float, 16 channels per AVX-512 register (see the
// header). The structure is MaxGradPass's (fractional_max_pool_grad_pass.h): each cell writes
// its elements straight after its argmax sweep. Everything after the `#pragma GCC target` is
// compiled for AVX-512 and only called when avx512_enabled() says so.
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

TFGRADS_AVX512_END

}  // namespace

bool MaxGradAvx512::disjoint_row(int64_t b, int64_t i) const {
  return stream ? fracpool::disjoint_row<true>(*this, b, i)
                : fracpool::disjoint_row<false>(*this, b, i);
}
#else
bool MaxGradAvx512::disjoint_row(int64_t, int64_t) const { return false; }
#endif

}  // namespace fracpool
}  // namespace torch_tfgrads
