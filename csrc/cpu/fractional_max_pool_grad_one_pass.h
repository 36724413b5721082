// FractionalMaxPoolGrad with overlapping cells, in one pass over the input: the vector kernel
// of every dtype on the 8-lane (AVX2) path. `Lanes` is the register type and its operations,
// MaxGradPass's Vectorized lanes (fractional_max_pool_grad_pass.h); the kernel itself knows no
// ISA, and the headers it includes are plain C++ (a 16-lane AVX-512 set of lanes compiled it in
// a target region: no faster than these 8 lanes in cache on an AVX-512 Zen 4 host, and slower
// than the AVX-512 kernel of fractional_max_pool_grad_avx512.cpp in the benchmark's timing).
//
// TF recomputes each cell's argmax (the first maximum in scan order), checks the maximum against
// orig_output and adds dy at the argmax into a zeroed dx, cell by cell. Overlapping cells share
// their boundary rows and columns, so an element adds up to four cells' dy, in TF's cell order.
// This kernel walks dx row by row, and each row cell by cell, visiting every element once per
// cell covering it, with the cell's state in registers:
// * `r`: dy while the cell has not met orig_output's value y, then 0. An element equal to y
//   takes r (TF's argmax: the maximum equals y, so the first element equal to y is the first
//   maximum) and zeroes it, so ties go to the first in scan order, as in TF.
// * `m`: TF's maximum so far, a max_keep chain from the cell's first element (a NaN later is
//   skipped, a NaN first element stays and fails the check); at the cell's last row it is
//   checked against y.
// Both carry from one row to the next in a two-row ring (a cell row's state, [OW][nd] each).
// A row shared by two cell rows (the last row of `ia`, the first of `ib`) visits each element
// for both. The column a cell shares with the next is the cell's last visit and the next one's
// first: the cell's term is carried in registers and added when the next cell reaches it.
//
// dx is the same float sum as TF's: an element starts at +0 and adds, in TF's cell order, the
// terms of the cells covering it; a term is dy where the element is the cell's argmax and +0
// elsewhere, and adding +0 changes nothing but a -0 sum, which cannot occur (dy enters as 0 + dy,
// as TF's first add turns a -0 into +0).
//
// On the 8-lane path this replaced an argmax pass into a ring and a gather of dx rows from it,
// which loaded every element once per covering cell twice and compared positions in the gather
// (0.77-0.86x its time in cache; docs/perf-notes/fractional_pool.md).
#pragma once

#include <cstdint>
#include <type_traits>

#include "common/fractional_pool.h"

// The per-cell lambdas must inline: GCC left them out of line, and their state (carried sums,
// the cell's registers) went through memory, 1.4-1.7x the time.
#if defined(__GNUC__)
#define TFGRADS_INLINE_LAMBDA __attribute__((always_inline))
#else
#define TFGRADS_INLINE_LAMBDA
#endif

namespace torch_tfgrads {
namespace fracpool {

// Lanes: scalar_t (memory), acc_t (registers and ring), Vec, Mask (a compare's result), Flags
// (mismatches so far), size (lanes per Vec), kTuned (instantiate the paired and grouped
// variants), and static load(const scalar_t*) (widened), load_acc / store_acc (the ring),
// put<kStream>(scalar_t*, Vec), zero(), add, equal (-> Mask), take(r, e) (r where e, else +0),
// drop(r, e) (+0 where e, else r), max_keep(v, acc) (VMAXPS: v where v > acc, else acc),
// no_flags(), differ(Flags, m, y) (adds the lanes where m != y), merge(Flags, Flags),
// any(Flags).
template <typename Lanes>
struct OnePassMaxGrad {
  using T = typename Lanes::scalar_t;
  using A = typename Lanes::acc_t;
  using Vec = typename Lanes::Vec;
  using Flags = typename Lanes::Flags;
  static constexpr int64_t L = Lanes::size;
  static constexpr int kMaxVectors = 64 / L;  // channel blocks of at most 64 channels

  const T* x;  // orig_input, channels contiguous (strides sN, sH, sW)
  int64_t sN, sH, sW;
  const T *y, *dy;  // orig_output and out_backprop, contiguous NHWC
  T* dx;            // the result, contiguous NHWC
  const GradPlan& g;

  // Image b, channels [d0, d0 + nd) (whole vectors, nd <= 64), the band of cell rows [i0, i1)
  // (AxisPlan::band_start: the rows it owns); ring: 4 * OW * nd elements. False: a cell's
  // maximum differs from orig_output.
  template <bool kStream>
  bool band(int64_t b, int64_t d0, int64_t nd, int64_t i0, int64_t i1, A* ring) const {
    const int64_t n = nd / L;
    if constexpr (Lanes::kTuned) {
      // Two channel vectors per visit share the pointer work; four spill past AVX2's 16
      // registers (1.09-1.35x the time at 32 channels).
      switch (n) {
        case 1: return rows<kStream, 1, 1>(b, d0, nd, i0, i1, ring);
        case 2: return rows<kStream, 2, 1>(b, d0, nd, i0, i1, ring);
        case 4: return rows<kStream, 2, 2>(b, d0, nd, i0, i1, ring);
        case 8: return rows<kStream, 2, 4>(b, d0, nd, i0, i1, ring);
        default: break;
      }
    }
    return rows<kStream, 1, 0>(b, d0, nd, i0, i1, ring);
  }

 private:
  // A row's walk through its cells: cell j, whose first column is c0; x and dx there, and
  // orig_output and out_backprop of the cell (of cell rows iy and ig).
  struct Cursor {
    const T* xp;
    T* op;
    const T* yp;
    const T* gp;
    int64_t c0, j;
    // To cell j + 1: the cell's last column is the next one's first.
    void next(int64_t last, int64_t pixel, int64_t C) {
      c0 += last;
      xp += last * pixel;
      op += last * C;
      yp += C;
      gp += C;
      ++j;
    }
  };
  Cursor cursor(int64_t b, int64_t h, int64_t iy, int64_t ig, int64_t d0) const {
    const int64_t C = g.C, OW = g.cols.cells, c0 = g.cols.start[0];
    return {x + b * sN + h * sH + d0 + c0 * sW,
            dx + (b * g.H + h) * g.W * C + d0 + c0 * C,
            y + (b * g.rows.cells + iy) * OW * C + d0,
            dy + (b * g.rows.cells + ig) * OW * C + d0,
            c0,
            0};
  }

  // NV channel vectors per visit, in G groups (0: nd / (NV * L), at run time).
  template <bool kStream, int NV, int G>
  bool rows(int64_t b, int64_t d0, int64_t nd, int64_t i0, int64_t i1, A* ring) const {
    Flags bad = Lanes::no_flags();
    const int64_t h0 = g.rows.band_start(i0), h1 = g.rows.band_start(i1);
    // A band below the first starts inside cell row i0: its state after the boundary row
    // (which the band above owns and writes) is recomputed into the ring first.
    if (i0 > 0 && h0 < h1)
      bad = Lanes::merge(bad, one_row<kStream, NV, G, true>(b, h0 - 1, i0, d0, nd, ring));
    for (int64_t h = h0; h < h1; ++h) {
      const int64_t ia = g.rows.first[h], ib = g.rows.last[h];
      if (ia > ib) continue;  // no cell covers the row (its dx was zeroed)
      if (ia < ib)
        bad = Lanes::merge(bad, two_rows<kStream, NV, G>(b, h, ia, ib, d0, nd, ring));
      else
        bad = Lanes::merge(bad, one_row<kStream, NV, G>(b, h, ia, d0, nd, ring));
    }
    return !Lanes::any(bad);
  }

  // Row h, covered by cell row i alone. kPrime: the first row of cell row i, for its state
  // alone (no dx; the row's other cell row writes it).
  template <bool kStream, int NV, int G, bool kPrime = false>
  Flags one_row(int64_t b, int64_t h, int64_t i, int64_t d0, int64_t nd, A* ring) const {
    Flags bad = Lanes::no_flags();
    const bool starts = h == g.rows.start[i], ends = h == g.rows.end[i];
    const int groups = G > 0 ? G : static_cast<int>(nd / (NV * L));
    const int64_t C = g.C, OW = g.cols.cells, pixel = sW, cnd = OW * nd;
    const int64_t* ce = g.cols.end.data();
    Cursor at = cursor(b, h, i, i, d0);
    A* rs = ring + (i & 1) * 2 * cnd;  // r, then m
    const Vec zero = Lanes::zero();
    Vec carry[kMaxVectors];
    for (int k = 0; k < groups * NV; ++k) carry[k] = zero;
    auto cell = [&](auto final) TFGRADS_INLINE_LAMBDA {
      constexpr bool kFinal = decltype(final)::value;
      const int64_t last = ce[at.j] - at.c0;
#pragma GCC unroll 4
      for (int gi = 0; gi < groups; ++gi) {
        const int64_t d = gi * NV * L;
        Vec r[NV], m[NV], t[NV];
        for (int k = 0; k < NV; ++k) {
          r[k] = starts ? Lanes::add(zero, Lanes::load(at.gp + d + k * L))
                        : Lanes::load_acc(rs + d + k * L);
          m[k] = starts ? Lanes::load(at.xp + d + k * L) : Lanes::load_acc(rs + cnd + d + k * L);
        }
        auto visit = [&](int64_t q) TFGRADS_INLINE_LAMBDA {
          for (int k = 0; k < NV; ++k) {
            const Vec v = Lanes::load(at.xp + q * pixel + d + k * L);
            const auto e = Lanes::equal(v, Lanes::load(at.yp + d + k * L));
            t[k] = Lanes::take(r[k], e);
            r[k] = Lanes::drop(r[k], e);
            m[k] = Lanes::max_keep(v, m[k]);
          }
        };
        visit(0);
        if constexpr (!kPrime)
          for (int k = 0; k < NV; ++k)
            Lanes::template put<kStream>(at.op + d + k * L, Lanes::add(carry[gi * NV + k], t[k]));
        const int64_t q1 = kFinal || kPrime ? last : last - 1;
        for (int64_t q = 1; q <= q1; ++q) {
          visit(q);
          if constexpr (!kPrime)
            for (int k = 0; k < NV; ++k)
              Lanes::template put<kStream>(at.op + q * C + d + k * L, t[k]);
        }
        if constexpr (!kFinal && !kPrime) {  // the last column is the next cell's first
          visit(last);
          for (int k = 0; k < NV; ++k) carry[gi * NV + k] = t[k];
        }
        for (int k = 0; k < NV; ++k) {
          if (ends) {
            bad = Lanes::differ(bad, m[k], Lanes::load(at.yp + d + k * L));
          } else {
            Lanes::store_acc(rs + d + k * L, r[k]);
            Lanes::store_acc(rs + cnd + d + k * L, m[k]);
          }
        }
      }
      at.next(last, pixel, C);
      rs += nd;
    };
    while (at.j + 1 < OW) cell(std::false_type{});
    cell(std::true_type{});
    return bad;
  }

  // Row h, the last of cell row ia and the first of ib = ia + 1 (and its last too where ib is
  // one row high). Cell row ia's maximum needs only this row's maximum per cell, which ib's m
  // is: both start from the same first column here, and where that element is a NaN, ib fails
  // its own check.
  template <bool kStream, int NV, int G>
  Flags two_rows(int64_t b, int64_t h, int64_t ia, int64_t ib, int64_t d0, int64_t nd,
                 A* ring) const {
    Flags bad = Lanes::no_flags();
    const int groups = G > 0 ? G : static_cast<int>(nd / (NV * L));
    const int64_t C = g.C, OW = g.cols.cells, pixel = sW, cnd = OW * nd;
    const int64_t* ce = g.cols.end.data();
    Cursor at = cursor(b, h, ia, ib, d0);
    const int64_t ab = OW * C;  // ib's orig_output from ia's
    A* pa = ring + (ia & 1) * 2 * cnd;
    A* pb = ring + (ib & 1) * 2 * cnd;
    const Vec zero = Lanes::zero();
    Vec ca[kMaxVectors], cb[kMaxVectors];  // carried: ia's sum so far, ib's term
    for (int k = 0; k < groups * NV; ++k) ca[k] = cb[k] = zero;
    auto cell = [&](auto final) TFGRADS_INLINE_LAMBDA {
      constexpr bool kFinal = decltype(final)::value;
      const int64_t last = ce[at.j] - at.c0;
#pragma GCC unroll 4
      for (int gi = 0; gi < groups; ++gi) {
        const int64_t d = gi * NV * L;
        Vec ra[NV], rb[NV], mb[NV], ta[NV], tb[NV];
        for (int k = 0; k < NV; ++k) {
          ra[k] = Lanes::load_acc(pa + d + k * L);
          rb[k] = Lanes::add(zero, Lanes::load(at.gp + d + k * L));
          mb[k] = Lanes::load(at.xp + d + k * L);
        }
        auto visit = [&](int64_t q, auto first) TFGRADS_INLINE_LAMBDA {
          for (int k = 0; k < NV; ++k) {
            const Vec v = Lanes::load(at.xp + q * pixel + d + k * L);
            const auto ea = Lanes::equal(v, Lanes::load(at.yp + d + k * L));
            ta[k] = Lanes::take(ra[k], ea);
            ra[k] = Lanes::drop(ra[k], ea);
            const auto eb = Lanes::equal(v, Lanes::load(at.yp + ab + d + k * L));
            tb[k] = Lanes::take(rb[k], eb);
            rb[k] = Lanes::drop(rb[k], eb);
            if constexpr (!decltype(first)::value) mb[k] = Lanes::max_keep(v, mb[k]);
          }
        };
        // TF's cell order: (ia, j - 1), (ia, j), (ib, j - 1), (ib, j).
        visit(0, std::true_type{});
        for (int k = 0; k < NV; ++k) {
          const int e = gi * NV + k;
          const Vec sum = Lanes::add(Lanes::add(Lanes::add(ca[e], ta[k]), cb[e]), tb[k]);
          Lanes::template put<kStream>(at.op + d + k * L, sum);
        }
        const int64_t q1 = kFinal ? last : last - 1;
        for (int64_t q = 1; q <= q1; ++q) {
          visit(q, std::false_type{});
          for (int k = 0; k < NV; ++k)
            Lanes::template put<kStream>(at.op + q * C + d + k * L, Lanes::add(ta[k], tb[k]));
        }
        if constexpr (!kFinal) {  // the last column is the next cell's first
          visit(last, std::false_type{});
          for (int k = 0; k < NV; ++k) {
            ca[gi * NV + k] = ta[k];
            cb[gi * NV + k] = tb[k];
          }
        }
        for (int k = 0; k < NV; ++k) {
          const Vec ma = Lanes::max_keep(mb[k], Lanes::load_acc(pa + cnd + d + k * L));
          bad = Lanes::differ(bad, ma, Lanes::load(at.yp + d + k * L));
          Lanes::store_acc(pb + d + k * L, rb[k]);
          Lanes::store_acc(pb + cnd + d + k * L, mb[k]);
        }
      }
      at.next(last, pixel, C);
      pa += nd;
      pb += nd;
    };
    while (at.j + 1 < OW) cell(std::false_type{});
    cell(std::true_type{});
    if (h == g.rows.end[ib]) {  // ib is one row high (the last cell row): its check is now
      const T* yb = y + (b * g.rows.cells + ib) * OW * C + d0;
      A* mbs = ring + (ib & 1) * 2 * cnd + cnd;
      for (int64_t jj = 0; jj < OW; ++jj)
        for (int64_t e = 0; e < nd; e += L)
          bad = Lanes::differ(bad, Lanes::load_acc(mbs + jj * nd + e),
                              Lanes::load(yb + jj * C + e));
    }
    return bad;
  }
};

}  // namespace fracpool
}  // namespace torch_tfgrads
