// MaxGradPass: FractionalMaxPoolGrad's CPU kernel for every dtype (Vectorized<acc_t> lanes,
// the channels after the last whole vector and integers one at a time), and the cell argmax
// that the double backward shares with it. fractional_max_pool_grad.cpp runs it (or, for float
// channels in whole 16-lane vectors on AVX-512 CPUs, fractional_max_pool_grad_avx512.cpp).
#pragma once

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <limits>
#include <type_traits>
#include <vector>

#include "common/fractional_pool.h"
#include "cpu/fractional_max_pool_grad_one_pass.h"
#include "cpu/fractional_pool_cpu.h"
#include "cpu/widen.h"

namespace torch_tfgrads {
namespace fracpool_cpu {

// TF's argmax of one channel of a cell, one element at a time with exact int64 coordinates:
// the first element, then `best < v` takes v (the first maximum in scan order; NaN never
// taken). xb: x at (b, 0, 0, d).
template <typename scalar_t>
struct ScalarMax {
  acc_t<scalar_t> value;
  int64_t h, w;
};
template <typename scalar_t>
ScalarMax<scalar_t> cell_max_scalar(const scalar_t* xb, int64_t sH, int64_t sW, int64_t r0,
                                    int64_t r1, int64_t c0, int64_t c1) {
  using A = acc_t<scalar_t>;
  ScalarMax<scalar_t> m{static_cast<A>(xb[r0 * sH + c0 * sW]), r0, c0};
  for (int64_t h = r0; h <= r1; ++h) {
    for (int64_t w = c0; w <= c1; ++w) {
      const A v = static_cast<A>(xb[h * sH + w * sW]);
      if (m.value < v) m = {v, h, w};
    }
  }
  return m;
}

// Whether every in-cell position (row-major index, < rows x cols of the largest cell) is an
// exact value of A (below 2^24 for float).
template <typename A>
bool exact_positions(const GradPlan& g) {
  return std::is_integral_v<A> ||
         widest(g.rows) * widest(g.cols) <= (int64_t{1} << std::numeric_limits<A>::digits);
}

// OnePassMaxGrad's lanes (fractional_max_pool_grad_one_pass.h): Vectorized<acc_t>, every dtype
// that has vectors (half types widened to float), 8 float lanes in this AVX2 build.
template <typename scalar_t_>
struct VecLanes {
  using scalar_t = scalar_t_;
  using acc_t = fracpool_cpu::acc_t<scalar_t>;
  using Vec = Vectorized<acc_t>;
  using Mask = Vec;
  using Flags = Vec;
  using Wd = Widen<scalar_t, acc_t>;
  static constexpr int64_t size = Vec::size();
  // Float is the tuned type: the other types compile the one generic variant (each variant
  // multiplies the instantiations, and the sanitizer build's compile time).
  static constexpr bool kTuned = std::is_same_v<scalar_t, float>;

  static C10_ALWAYS_INLINE Vec load(const scalar_t* p) { return Wd::load(p); }
  static C10_ALWAYS_INLINE Vec load_acc(const acc_t* p) { return Vec::loadu(p); }
  static C10_ALWAYS_INLINE void store_acc(acc_t* p, const Vec& v) { v.store(p); }
  template <bool kStream>
  static C10_ALWAYS_INLINE void put(scalar_t* p, const Vec& v) {
    if constexpr (kStream && std::is_same_v<scalar_t, float>)
      stream_store(p, v);
    else
      Wd::store(p, v);
  }
  static C10_ALWAYS_INLINE Vec zero() { return Vec(acc_t(0)); }
  static C10_ALWAYS_INLINE Vec add(const Vec& a, const Vec& b) { return a + b; }
  static C10_ALWAYS_INLINE Mask equal(const Vec& a, const Vec& b) { return a == b; }
  static C10_ALWAYS_INLINE Vec take(const Vec& r, const Mask& e) { return r & e; }
  static C10_ALWAYS_INLINE Vec drop(const Vec& r, const Mask& e) {
#if defined(CPU_CAPABILITY_AVX2)
    if constexpr (std::is_same_v<acc_t, float>) return _mm256_andnot_ps(e, r);
    if constexpr (std::is_same_v<acc_t, double>) return _mm256_andnot_pd(e, r);
#endif
    return Vec::blendv(r, zero(), e);
  }
  // VMAXPS's rule: v where v > acc, else acc (a NaN acc stays, a NaN v is skipped), which is
  // TF's `best < v` update without its select.
  static C10_ALWAYS_INLINE Vec max_keep(const Vec& v, const Vec& acc) {
#if defined(CPU_CAPABILITY_AVX2)
    if constexpr (std::is_same_v<acc_t, float>) return _mm256_max_ps(v, acc);
    if constexpr (std::is_same_v<acc_t, double>) return _mm256_max_pd(v, acc);
#endif
    return Vec::blendv(acc, v, acc < v);
  }
  static C10_ALWAYS_INLINE Flags no_flags() { return zero(); }
  static C10_ALWAYS_INLINE Flags differ(const Flags& f, const Vec& m, const Vec& y) {
    return f | (m != y);
  }
  static C10_ALWAYS_INLINE Flags merge(const Flags& f, const Flags& g) { return f | g; }
  static C10_ALWAYS_INLINE bool any(const Flags& f) { return (f == zero()).zero_mask() != 0; }
};

// The gradient, with each cell's argmax (first maximum in scan order, TF's tie rule) recomputed
// and checked against orig_output.
// * Disjoint cells: one pass over the cells; each writes its elements, dy where it is the
//   maximum and 0 elsewhere. One task per cell row.
// * Overlapping cells: per image and channel block, OnePassMaxGrad over whole vectors
//   (fractional_max_pool_grad_one_pass.h), the cells' sweeps below for the other channels.
// Tasks never share an element.
template <typename scalar_t>
struct MaxGradPass {
  using A = acc_t<scalar_t>;
  using Wd = Widen<scalar_t, A>;
  using Vec = Vectorized<A>;
  static constexpr int64_t L = Vec::size();

  // orig_input, and for the gradient orig_output, out_backprop and the result (the double
  // backward reads x only).
  const scalar_t* x;
  const scalar_t *y = nullptr, *dy = nullptr;
  scalar_t* dx = nullptr;
  int64_t sN, sH, sW, H, W, C, OH, OW;
  const GradPlan& g;
  int64_t cw_max;  // widest cell; the position of (h, w) in a cell is h * cw_max + w
  // Positions in a cell are compared as acc_t values: exact below 2^24 for float. Cells with
  // more elements (a huge input pooled to a few cells) take the int64 scalar path.
  bool scalar_only = false;
  // Non-temporal stores of dx (float, whole aligned vectors, dx beyond the L2 caches): every
  // element is written exactly once, so reading dx's lines in first is wasted. The caller
  // decides per cell kind and CPU (max_grad_kernel).
  bool stream = false;

  MaxGradPass(const at::Tensor& x_, const GradPlan& plan)
      : x(x_.const_data_ptr<scalar_t>()),
        sN(x_.stride(0)),
        sH(x_.stride(1)),
        sW(x_.stride(2)),
        H(plan.H),
        W(plan.W),
        C(plan.C),
        OH(plan.rows.cells),
        OW(plan.cols.cells),
        g(plan),
        cw_max(widest(plan.cols)),
        scalar_only(!exact_positions<A>(plan)) {}

  // The gradient's tensors.
  void set_gradient(const at::Tensor& y_, const at::Tensor& dy_, at::Tensor& dx_) {
    y = y_.const_data_ptr<scalar_t>();
    dy = dy_.const_data_ptr<scalar_t>();
    dx = dx_.mutable_data_ptr<scalar_t>();
  }

  // Channel vector xc[0, L) of one cell (rows [0, rh), columns [0, last] at row/pixel
  // strides): the maximum and its position, with TF's update (`best < v` takes v: the first
  // maximum in scan order wins, a NaN is never taken, a NaN first element stays and then fails
  // the orig_output check). RH > 0: rh at compile time; CW > 0: the cell is swept as exactly CW
  // columns (CW = cw_max), the extra ones repeating its last column, so the sweep is
  // straight-line code; a repeat never wins (its column came first). RH = CW = 0: runtime sizes.
  template <int RH, int CW>
  static void cell_argmax(const scalar_t* xc, int64_t rh, int64_t last, int64_t stride, int64_t row,
                          int64_t pixel, Vec& best, Vec& at) {
    cell_argmaxes<RH, CW, 1>(xc, rh, last, stride, row, pixel, &best, &at);
  }
  // The same for NV consecutive channel vectors of the cell (xc + k * L): their chains are
  // independent and interleave, where one vector's compare-and-select chain alone waits on
  // its latency.
  template <int RH, int CW, int NV>
  static C10_ALWAYS_INLINE void cell_argmaxes(const scalar_t* xc, int64_t rh, int64_t last,
                                              int64_t stride, int64_t row, int64_t pixel, Vec* best,
                                              Vec* at) {
    const int64_t cw = CW > 0 ? CW : last + 1;
    for (int k = 0; k < NV; ++k) {
      best[k] = Wd::load(xc + k * L);
      at[k] = Vec(A(0));
    }
#pragma GCC unroll 4
    for (int64_t h = 0; h < (RH > 0 ? RH : rh); ++h) {
#pragma GCC unroll 4
      for (int64_t w = (h == 0 ? 1 : 0); w < cw; ++w) {
        const scalar_t* p = xc + h * row + (CW > 0 ? std::min(w, last) : w) * pixel;
        const Vec here(static_cast<A>(h * stride + w));
#pragma GCC unroll 4
        for (int k = 0; k < NV; ++k) {
          const Vec v = Wd::load(p + k * L);
          const Vec take = best[k] < v;
          best[k] = Vec::blendv(best[k], v, take);
          at[k] = Vec::blendv(at[k], here, take);
        }
      }
    }
  }

  // Non-temporal stores exist for float only: the other types compile one variant.
  static constexpr bool kCanStreamType = std::is_same_v<scalar_t, float>;

  template <bool kStream>
  static C10_ALWAYS_INLINE void put(scalar_t* o, const Vec& v) {
    VecLanes<scalar_t>::template put<kStream>(o, v);
  }

  // Calls f(d, nv) for the channel vectors [0, dv) in groups of nv vectors
  // (std::integral_constant): 4, 2 or 1 for float, the tuned type; 1 for the others, since every
  // group size multiplies the sweeps' instantiations (and the sanitizer build's compile time).
  template <typename F>
  static C10_ALWAYS_INLINE void for_vector_groups(int64_t dv, const F& f) {
    int64_t d = 0;
    if constexpr (std::is_same_v<scalar_t, float>) {
      for (; d + 4 * L <= dv; d += 4 * L) f(d, std::integral_constant<int, 4>{});
      if (d + 2 * L <= dv) {
        f(d, std::integral_constant<int, 2>{});
        d += 2 * L;
      }
    }
    for (; d < dv; d += L) f(d, std::integral_constant<int, 1>{});
  }

  // NV channel vectors of one cell: the argmaxes into pos; returns the lanes whose maximum
  // differs from orig_output.
  template <int RH, int CW, int NV>
  C10_ALWAYS_INLINE int argmax_vectors(const scalar_t* xc, const scalar_t* yc, A* pos, int64_t rh,
                                       int64_t last, int64_t stride, int64_t row,
                                       int64_t pixel) const {
    Vec best[NV], at[NV];
    cell_argmaxes<RH, CW, NV>(xc, rh, last, stride, row, pixel, best, at);
    int mismatch = 0;
    for (int k = 0; k < NV; ++k) {
      at[k].store(pos + k * L);
      mismatch |= (best[k] == Wd::load(yc + k * L)).zero_mask();
    }
    return mismatch;
  }

  // ---- disjoint cells
  // NV channel vectors of one cell from its argmaxes (pos): dy where the position matches and
  // 0 elsewhere. A row's columns are stored last to first, so a repeated column's 0 is
  // overwritten by its real column.
  template <int CW, int NV, bool kStream>
  static C10_ALWAYS_INLINE void write_vectors(const A* pos, const scalar_t* gc, scalar_t* o,
                                              int64_t rh, int64_t last, int64_t stride,
                                              int64_t orow, int64_t opixel) {
    const int64_t cw = CW > 0 ? CW : last + 1;
    Vec at[NV], grad[NV];
    for (int k = 0; k < NV; ++k) {
      at[k] = Vec::loadu(pos + k * L);
      grad[k] = Vec(A(0)) + Wd::load(gc + k * L);  // 0 + dy as TF's scatter-add: -0 -> +0
    }
#pragma GCC unroll 4
    for (int64_t h = 0; h < rh; ++h) {
#pragma GCC unroll 4
      for (int64_t w = cw - 1; w >= 0; --w) {
        const Vec here(static_cast<A>(h * stride + w));
        scalar_t* out = o + h * orow + (CW > 0 ? std::min(w, last) : w) * opixel;
#pragma GCC unroll 4
        for (int k = 0; k < NV; ++k) put<kStream>(out + k * L, grad[k] & (at[k] == here));
      }
    }
  }

  // One row of cells in order, channels [0, dv), swept as cw_max columns, in chunks of cells:
  // first every argmax of the chunk (the loads of x), then every store of dx. x and dx have the
  // same size, and their addresses often differ by a pixel or two modulo 4 KiB: a load of x
  // right after a store to dx with the same low 12 address bits waits for that store (4K
  // aliasing), which cost up to 2x when loads and stores alternated per cell. (Visiting disjoint
  // cells grouped by width instead, each group with its exact width, saves the repeated columns
  // but is slower on inputs beyond L2: the hardware prefetchers lose the row streams.) The
  // row's invariants stay in locals: vector stores may alias anything, so members would be
  // reloaded after each one. kStream: non-temporal stores (see `stream`).
  template <int RH, int CW, bool kStream>
  bool cells_of_row(int64_t b, int64_t i, int64_t dv) const {
    const int64_t r0 = g.rows.start[i], rh = RH > 0 ? RH : g.rows.end[i] - r0 + 1;
    const int64_t row = sH, pixel = sW, c = C, orow = W * C, stride = CW > 0 ? CW : cw_max;
    const int64_t* starts = g.cols.start.data();
    const int64_t* ends = g.cols.end.data();
    const scalar_t* xr = x + b * sN + r0 * sH;
    const scalar_t* yr = y + (b * OH + i) * OW * C;
    const scalar_t* gr = dy + (b * OH + i) * OW * C;
    scalar_t* orr = dx + (b * H + r0) * W * C;
    constexpr int64_t kChunk = 2048;  // argmax positions of a chunk of cells (L1-resident)
    A stack[kChunk];
    std::vector<A> heap(dv > kChunk ? dv : 0);
    A* pos = dv > kChunk ? heap.data() : stack;
    const int64_t per = std::max<int64_t>(1, kChunk / std::max<int64_t>(1, dv));
    int mismatch = 0;
    for (int64_t j0 = 0, n = OW; j0 < n; j0 += per) {
      const int64_t j1 = std::min(n, j0 + per);
      for (int64_t j = j0; j < j1; ++j) {
        const int64_t c0 = starts[j], last = ends[j] - c0;
        const scalar_t *xc = xr + c0 * pixel, *yc = yr + j * c;
        A* pj = pos + (j - j0) * dv;
        for_vector_groups(dv, [&](int64_t d, auto nv) {
          mismatch |= argmax_vectors<RH, CW, decltype(nv)::value>(xc + d, yc + d, pj + d, rh, last,
                                                                  stride, row, pixel);
        });
      }
      for (int64_t j = j0; j < j1; ++j) {
        const int64_t c0 = starts[j], last = ends[j] - c0;
        const A* pj = pos + (j - j0) * dv;
        const scalar_t* gc = gr + j * c;
        scalar_t* o = orr + c0 * c;
        for_vector_groups(dv, [&](int64_t d, auto nv) {
          write_vectors<CW, decltype(nv)::value, kStream>(pj + d, gc + d, o + d, rh, last, stride,
                                                          orow, c);
        });
      }
    }
    return mismatch == 0;
  }
  template <int RH, bool kStream>
  bool cell_row_as(int64_t b, int64_t i, int64_t dv) const {
    switch (cw_max) {
      case 1: return cells_of_row<RH, 1, kStream>(b, i, dv);
      case 2: return cells_of_row<RH, 2, kStream>(b, i, dv);
      case 3: return cells_of_row<RH, 3, kStream>(b, i, dv);
      default: return cells_of_row<0, 0, kStream>(b, i, dv);
    }
  }
  template <int RH>
  bool cell_row(int64_t b, int64_t i, int64_t dv) const {
    if constexpr (kCanStreamType) {
      if (stream) return cell_row_as<RH, true>(b, i, dv);
    }
    return cell_row_as<RH, false>(b, i, dv);
  }

  // ---- scalar channels (integers, the channels after the last whole vector, huge cells)
  // Cells in TF's order; an element's first covering cell assigns, later ones add. With `buf`
  // (half types, overlapping cells: [H][W][d1 - d0] in A) the sums stay in A and the caller
  // rounds each once, the float32 accumulation of the vector path and of the CUDA kernel.
  bool cell_scalars(int64_t b, int64_t i, int64_t j, int64_t d0, int64_t d1,
                    A* buf = nullptr) const {
    const int64_t r0 = g.rows.start[i], r1 = g.rows.end[i];
    const int64_t c0 = g.cols.start[j], c1 = g.cols.end[j];
    const int64_t k_out = ((b * OH + i) * OW + j) * C;
    bool ok = true;
    for (int64_t d = d0; d < d1; ++d) {
      const auto m = cell_max_scalar(x + b * sN + d, sH, sW, r0, r1, c0, c1);
      const int64_t bh = m.h, bw = m.w;
      ok &= m.value == static_cast<A>(y[k_out + d]);
      const A grad = static_cast<A>(dy[k_out + d]);
      for (int64_t h = r0; h <= r1; ++h) {
        for (int64_t w = c0; w <= c1; ++w) {
          const A v = (h == bh && w == bw) ? grad : A(0);
          const bool first = g.rows.first[h] == i && g.cols.first[w] == j;
          if (buf != nullptr) {
            A* acc = buf + (h * W + w) * (d1 - d0) + (d - d0);
            *acc = first ? A(0) + v : *acc + v;
            continue;
          }
          scalar_t* o = dx + ((b * H + h) * W + w) * C + d;
          if (first) {
            *o = static_cast<scalar_t>(A(0) + v);  // 0 + dy as TF's scatter-add: -0 -> +0
          } else if constexpr (std::is_integral_v<A>) {
            *o = wrap_add(static_cast<A>(*o), v);
          } else {
            *o = static_cast<scalar_t>(static_cast<A>(*o) + v);
          }
        }
      }
    }
    return ok;
  }

  // The end of the whole vectors in [d0, d1) (d0 where only scalars apply).
  int64_t vector_end(int64_t d0, int64_t d1) const {
    return std::is_integral_v<scalar_t> || scalar_only ? d0 : d0 + (d1 - d0) / L * L;
  }

  // Disjoint cells: cell row i of image b, all channels.
  bool disjoint_row(int64_t b, int64_t i) const {
    const int64_t dv = vector_end(0, C);
    bool ok = true;
    if (dv < C)
      for (int64_t j = 0; j < OW; ++j) ok &= cell_scalars(b, i, j, dv, C);
    if constexpr (!std::is_integral_v<scalar_t>) {  // integers: scalars only
      if (dv == 0) return ok;
      switch (g.rows.count(i)) {
        case 1: return cell_row<1>(b, i, dv) && ok;
        case 2: return cell_row<2>(b, i, dv) && ok;
        case 3: return cell_row<3>(b, i, dv) && ok;
        default: return cell_row<0>(b, i, dv) && ok;
      }
    }
    return ok;
  }

  // Overlapping cells: image b, channels [d0, d1) (at most 64), the band of cell rows [i0, i1)
  // (AxisPlan::band_start); bands other than [0, OH) need whole vectors (banded()). ring:
  // ring_size() elements.
  int64_t ring_size() const { return 4 * OW * std::min<int64_t>(C, 64); }
  bool banded() const {
    return !std::is_integral_v<scalar_t> && !scalar_only && vector_end(0, C) == C;
  }
  bool overlapping_block(int64_t b, int64_t d0, int64_t d1, int64_t i0, int64_t i1, A* ring) const {
    const int64_t dv = vector_end(d0, d1);
    bool ok = true;
    constexpr bool kWiden = !std::is_integral_v<A> && !std::is_same_v<A, scalar_t>;
    if (dv < d1) {  // the cells' sweeps cover whole images (banded() is false here)
      TORCH_INTERNAL_ASSERT(i0 == 0 && i1 == OH, "fractional_max_pool_grad: a band of scalars");
      std::vector<A> buf(kWiden ? H * W * (d1 - dv) : 0);
      for (int64_t i = 0; i < OH; ++i)
        for (int64_t j = 0; j < OW; ++j)
          ok &= cell_scalars(b, i, j, dv, d1, kWiden ? buf.data() : nullptr);
      if constexpr (kWiden) {
        for (int64_t h = 0; h < H; ++h) {
          if (g.rows.first[h] > g.rows.last[h]) continue;  // no cell: stays zero
          for (int64_t w = 0; w < W; ++w) {
            if (g.cols.first[w] > g.cols.last[w]) continue;
            const A* acc = buf.data() + (h * W + w) * (d1 - dv);
            scalar_t* o = dx + ((b * H + h) * W + w) * C;
            for (int64_t d = dv; d < d1; ++d) o[d] = static_cast<scalar_t>(acc[d - dv]);
          }
        }
      }
    }
    if constexpr (!std::is_integral_v<scalar_t>)  // integers: scalars only
      if (dv > d0) {
        const fracpool::OnePassMaxGrad<VecLanes<scalar_t>> pass{x, sN, sH, sW, y, dy, dx, g};
        ok &= stream ? pass.template band<true>(b, d0, dv - d0, i0, i1, ring)
                     : pass.template band<false>(b, d0, dv - d0, i0, i1, ring);
      }
    return ok;
  }
};

}  // namespace fracpool_cpu
}  // namespace torch_tfgrads
