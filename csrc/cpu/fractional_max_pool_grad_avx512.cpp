// FractionalMaxPoolGrad, float, 16 channels per AVX-512 register (see the header). The
// structure is MaxGradPass's (fractional_max_pool_grad.cpp): disjoint cells write their
// elements straight after their argmax sweep; overlapping cells keep a cell row's argmaxes in a two-row ring and
// gather each dx row once from the (at most 2x2) cells covering it. Everything after the
// `#pragma GCC target` is compiled for AVX-512 and only called when avx512_enabled() says so.
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
                             bool overlapping, bool stream_)
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
  if (!overlapping) return;
  for (int64_t w = 0; w < W; ++w) {
    const int64_t f = g.cols.first[w], l = g.cols.last[w];
    if (f > l) continue;
    (l > f ? shared : single).push_back({w, f, static_cast<float>(w - g.cols.start[f])});
  }
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

// K independent sweeps at once (their chains interleave), each over one cell's channels
// xc[k][0, 16) (rows [0, rh), columns [0, last[k]] at row/pixel strides): the position of
// orig_output's value m[k] in the cell, i.e. the first element equal to it in scan order,
// found by a reverse sweep whose last hit wins. TF's recomputed maximum `dup` is max(v, dup)
// from the first element on: VMAXPS returns its second operand when either is NaN, so a NaN
// later in the cell is skipped and a NaN first element stays, as in TF. The lanes where dup
// equals m are AND-ed into `same`; where it does, m is the cell's maximum and its first
// occurrence is TF's argmax (first maximum in scan order; a -0/+0 tie is equal in both).
// CW > 0: swept as exactly CW columns, the extra ones repeating the last (a repeat is
// visited before its real column, which then wins). RH = CW = 0: runtime sizes, K = 1.
template <int RH, int CW, int K>
inline void find_argmax(const float* const* xc, const __m512* m, const int64_t* last, int64_t rh,
                        int64_t stride, int64_t row, int64_t pixel, __mmask16& same, __m512* at) {
  static_assert(K == 1 || CW > 0, "runtime cell widths sweep one cell at a time");
  const int64_t cw = CW > 0 ? CW : last[0] + 1;
  __m512 e0[K], dup[K];
  for (int k = 0; k < K; ++k) {
    e0[k] = dup[k] = _mm512_loadu_ps(xc[k]);
    at[k] = _mm512_setzero_ps();
  }
#pragma GCC unroll 4
  for (int64_t h = (RH > 0 ? RH : rh) - 1; h >= 0; --h) {
#pragma GCC unroll 4
    for (int64_t w = cw - 1; w >= (h == 0 ? 1 : 0); --w) {
      const __m512 here = _mm512_set1_ps(static_cast<float>(h * stride + w));
#pragma GCC unroll 2
      for (int k = 0; k < K; ++k) {
        const __m512 v = _mm512_loadu_ps(xc[k] + h * row +
                                         (CW > 0 ? std::min(w, last[k]) : w) * pixel);
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

// ---- disjoint cells
// One cell, all channels: argmax, then dy where the position matches and 0 elsewhere. A row's
// columns are stored last to first, so a repeated column's 0 is overwritten by its real column.
template <int RH, int CW>
bool cell(const MaxGradAvx512& p, int64_t b, int64_t i, int64_t j) {
  const GradPlan& g = p.g;
  const int64_t r0 = g.rows.start[i], c0 = g.cols.start[j];
  const int64_t rh = RH > 0 ? RH : g.rows.end[i] - r0 + 1;
  const int64_t last = g.cols.end[j] - c0;
  const int64_t cw = CW > 0 ? CW : last + 1;
  const int64_t C = p.C, row = p.sH, pixel = p.sW, orow = p.W * C, stride = CW > 0 ? CW : p.cw_max,
                k = ((b * p.OH + i) * p.OW + j) * C;
  const float* xc = p.x + b * p.sN + r0 * row + c0 * pixel;
  float* o = p.dx + ((b * p.H + r0) * p.W + c0) * C;
  const bool stream = p.stream;
  __mmask16 same = kAll;
  for (int64_t d = 0; d < C; d += L) {
    const float* src = xc + d;
    const __m512 m = _mm512_loadu_ps(p.y + k + d);
    __m512 at;
    find_argmax<RH, CW, 1>(&src, &m, &last, rh, stride, row, pixel, same, &at);
    // 0 + dy as TF's scatter-add (-0 -> +0).
    const __m512 grad = _mm512_add_ps(_mm512_setzero_ps(), _mm512_loadu_ps(p.dy + k + d));
#pragma GCC unroll 4
    for (int64_t h = 0; h < rh; ++h) {
      __m512 out[CW > 0 ? CW : 1];
#pragma GCC unroll 4
      for (int64_t w = 0; w < cw; ++w) {
        const __mmask16 here = _mm512_cmp_ps_mask(
            at, _mm512_set1_ps(static_cast<float>(h * stride + w)), _CMP_EQ_OQ);
        out[CW > 0 ? w : 0] = _mm512_maskz_mov_ps(here, grad);
        if (CW == 0) put(o + h * orow + w * C + d, out[0], stream);
      }
#pragma GCC unroll 4
      for (int64_t w = cw - 1; CW > 0 && w >= 0; --w)
        put(o + h * orow + std::min(w, last) * C + d, out[CW > 0 ? w : 0], stream);
    }
  }
  return same == kAll;
}

template <int RH, int CW>
bool cells_of_row(const MaxGradAvx512& p, int64_t b, int64_t i) {
  bool ok = true;
  for (int64_t j = 0; j < p.OW; ++j) ok &= cell<RH, CW>(p, b, i, j);
  return ok;
}

template <int RH>
bool cell_row(const MaxGradAvx512& p, int64_t b, int64_t i) {
  switch (p.cw_max) {
    case 1: return cells_of_row<RH, 1>(p, b, i);
    case 2: return cells_of_row<RH, 2>(p, b, i);
    case 3: return cells_of_row<RH, 3>(p, b, i);
    default: return cells_of_row<0, 0>(p, b, i);
  }
}

bool disjoint_row(const MaxGradAvx512& p, int64_t b, int64_t i) {
  switch (p.g.rows.count(i)) {
    case 1: return cell_row<1>(p, b, i);
    case 2: return cell_row<2>(p, b, i);
    case 3: return cell_row<3>(p, b, i);
    default: return cell_row<0>(p, b, i);
  }
}

// ---- overlapping cells
// Argmaxes of cell row i, channels [d0, d1), into pos[OW][d1 - d0].
template <int RH, int CW>
bool argmax_cells(const MaxGradAvx512& p, int64_t b, int64_t i, int64_t d0, int64_t d1,
                  float* pos) {
  const GradPlan& g = p.g;
  const int64_t r0 = g.rows.start[i], rh = RH > 0 ? RH : g.rows.end[i] - r0 + 1;
  const int64_t row = p.sH, pixel = p.sW, nd = d1 - d0, stride = CW > 0 ? CW : p.cw_max;
  const float* xr = p.x + b * p.sN + r0 * row;
  const float* yr = p.y + (b * p.OH + i) * p.OW * p.C;
  // Items (cell j, channel vector v) in order, two at a time where the cells' widths are
  // compile-time: two independent chains interleave and hide each other's latency.
  const int64_t per = nd / L, items = p.OW * per;
  const float* xc[2];
  __m512 m[2], at[2];
  int64_t last[2];
  auto item = [&](int64_t t, int k) {
    const int64_t j = t / per, d = d0 + (t % per) * L, c0 = g.cols.start[j];
    xc[k] = xr + c0 * pixel + d;
    m[k] = _mm512_loadu_ps(yr + j * p.C + d);
    last[k] = g.cols.end[j] - c0;
  };
  auto position = [&](int64_t t) { return pos + (t / per) * nd + (t % per) * L; };
  __mmask16 same = kAll;
  int64_t t = 0;
  constexpr int kPair = CW > 0 ? 2 : 1;
  if (kPair == 2) {
    for (; t + 1 < items; t += 2) {
      item(t, 0);
      item(t + 1, 1);
      find_argmax<RH, CW, kPair>(xc, m, last, rh, stride, row, pixel, same, at);
      _mm512_storeu_ps(position(t), at[0]);
      _mm512_storeu_ps(position(t + 1), at[1]);
    }
  }
  for (; t < items; ++t) {
    item(t, 0);
    find_argmax<RH, CW, 1>(xc, m, last, rh, stride, row, pixel, same, at);
    _mm512_storeu_ps(position(t), at[0]);
  }
  return same == kAll;
}

template <int RH>
bool argmax_row(const MaxGradAvx512& p, int64_t b, int64_t i, int64_t d0, int64_t d1, float* pos) {
  switch (p.cw_max) {
    case 2: return argmax_cells<RH, 2>(p, b, i, d0, d1, pos);
    case 3: return argmax_cells<RH, 3>(p, b, i, d0, d1, pos);
    default: return argmax_cells<0, 0>(p, b, i, d0, d1, pos);
  }
}

// dx row h of image b, channels d0 + [0, nd), at the listed columns: 0 plus, in TF's cell
// order, dy of each covering cell whose argmax the element is. Cell rows ia and ib cover the
// row (kTwo: two of them, and h is ib's first row); kShared: cells j and j + 1 cover each
// column (it is j + 1's first). Their argmaxes are in the ring. NV > 0: nd = NV * 16.
template <bool kTwo, bool kShared, int NV>
void gather_columns(const MaxGradAvx512& p, int64_t b, int64_t h, int64_t d0, int64_t nd_,
                    const float* ring, const std::vector<MaxGradAvx512::Column>& columns) {
  const GradPlan& g = p.g;
  const int64_t nd = NV > 0 ? NV * L : nd_;
  const int64_t ia = g.rows.first[h], ib = g.rows.last[h], cells = p.OW * nd, C = p.C;
  const float ra = static_cast<float>((h - g.rows.start[ia]) * p.cw_max);
  const float *pa = ring + (ia & 1) * cells, *pb = ring + (ib & 1) * cells;
  const float* ga = p.dy + (b * p.OH + ia) * p.OW * C + d0;
  const float* gb = p.dy + (b * p.OH + ib) * p.OW * C + d0;
  float* o = p.dx + (b * p.H + h) * p.W * C + d0;
  const bool stream = p.stream;
  const __m512 zero = _mm512_setzero_ps(), first_row = _mm512_set1_ps(ra);
  // One cell's contribution: dy where its argmax (in the ring) is this element's position.
  auto add = [](__m512 acc, const float* at, __m512 here, const float* grad) {
    return _mm512_mask_add_ps(acc, _mm512_cmp_ps_mask(_mm512_loadu_ps(at), here, _CMP_EQ_OQ), acc,
                              _mm512_loadu_ps(grad));
  };
  for (const MaxGradAvx512::Column& m : columns) {
    const __m512 ka = _mm512_set1_ps(m.k), ca = _mm512_set1_ps(ra + m.k);
    const int64_t a = m.j * nd, ag = m.j * C, a2 = a + nd, ag2 = ag + C;
    float* out = o + m.w * C;
#pragma GCC unroll 4
    for (int64_t d = 0; d < nd; d += L) {
      __m512 acc = add(zero, pa + a + d, ca, ga + ag + d);
      if (kShared) acc = add(acc, pa + a2 + d, first_row, ga + ag2 + d);
      if (kTwo) acc = add(acc, pb + a + d, ka, gb + ag + d);
      if (kTwo && kShared) acc = add(acc, pb + a2 + d, zero, gb + ag2 + d);
      put(out + d, acc, stream);
    }
  }
}

template <bool kTwo, int NV>
void gather_row(const MaxGradAvx512& p, int64_t b, int64_t h, int64_t d0, int64_t nd,
                const float* ring) {
  gather_columns<kTwo, false, NV>(p, b, h, d0, nd, ring, p.single);
  gather_columns<kTwo, true, NV>(p, b, h, d0, nd, ring, p.shared);
}

template <int NV>
void gather_rows(const MaxGradAvx512& p, int64_t b, int64_t h, int64_t d0, int64_t nd,
                 const float* ring) {
  if (p.g.rows.first[h] == p.g.rows.last[h]) gather_row<false, NV>(p, b, h, d0, nd, ring);
  if (p.g.rows.first[h] < p.g.rows.last[h]) gather_row<true, NV>(p, b, h, d0, nd, ring);
}

bool overlapping_block(const MaxGradAvx512& p, int64_t b, int64_t d0, int64_t d1) {
  const GradPlan& g = p.g;
  const int64_t nd = d1 - d0;
  // 64-byte aligned (malloc aligns to 16 bytes): a vector that straddles two cache lines
  // costs two accesses.
  std::vector<float> buffer(2 * p.OW * nd + L);
  float* ring = buffer.data() + (L - reinterpret_cast<uintptr_t>(buffer.data()) / 4 % L) % L;
  bool ok = true;
  int64_t h = 0;
  for (int64_t i = 0; i < p.OH; ++i) {
    float* pos = ring + (i & 1) * p.OW * nd;
    switch (g.rows.count(i)) {
      case 2: ok &= argmax_row<2>(p, b, i, d0, d1, pos); break;
      case 3: ok &= argmax_row<3>(p, b, i, d0, d1, pos); break;
      default: ok &= argmax_row<0>(p, b, i, d0, d1, pos);
    }
    for (; h < p.H && g.rows.last[h] <= i; ++h) {  // rows no later cell row covers
      switch (nd / L) {
        case 1: gather_rows<1>(p, b, h, d0, nd, ring); break;
        case 2: gather_rows<2>(p, b, h, d0, nd, ring); break;
        case 4: gather_rows<4>(p, b, h, d0, nd, ring); break;
        default: gather_rows<0>(p, b, h, d0, nd, ring);
      }
    }
  }
  return ok;
}

TFGRADS_AVX512_END

}  // namespace

bool MaxGradAvx512::disjoint_row(int64_t b, int64_t i) const {
  return fracpool::disjoint_row(*this, b, i);
}
bool MaxGradAvx512::overlapping_block(int64_t b, int64_t d0, int64_t d1) const {
  return fracpool::overlapping_block(*this, b, d0, d1);
}
#else
bool MaxGradAvx512::disjoint_row(int64_t, int64_t) const { return false; }
bool MaxGradAvx512::overlapping_block(int64_t, int64_t, int64_t) const { return false; }
#endif

}  // namespace fracpool
}  // namespace torch_tfgrads
