// FractionalMaxPoolGrad on the CPU and its double backward (see fractional_pool.cpp for the
// family's design). Float channels in whole 16-lane vectors take the AVX-512 kernel of
// fractional_max_pool_grad_avx512.cpp where the CPU has it.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <atomic>
#include <limits>
#include <memory>
#include <type_traits>
#include <vector>

#include "common/fractional_pool.h"
#include "cpu/fractional_max_pool_grad_avx512.h"
#include "cpu/fractional_pool_cpu.h"
#include "cpu/isa.h"
#include "cpu/widen.h"

namespace torch_tfgrads {
namespace fracpool_cpu {
namespace {

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

// The gradient, with each cell's argmax (first maximum in scan order, TF's tie rule) recomputed
// and checked against orig_output.
// * Disjoint cells: one pass over the cells; each writes its elements, dy where it is the
//   maximum and 0 elsewhere. One task per cell row.
// * Overlapping cells: per image and channel block, the argmaxes of a cell row go to a
//   two-row ring, then every dx row that no later cell row covers is gathered, element by
//   element, from the (at most 2x2) cells covering it, in TF's cell order starting from 0 as
//   TF's scatter-add does: dx is written once, without read-modify-write of shared boundaries.
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
  // Non-temporal stores in the overlapping cells' gather (float, whole aligned vectors, dx
  // beyond the L2 caches): every element is written exactly once, so reading dx's lines in
  // first is wasted.
  bool stream = false;
  // Overlapping cells, per input column: its first covering cell `ja` and its column in it,
  // and the next cell `jb` (where the column is that cell's first) or, if none covers it, `ja`
  // again with the column NaN (a position no element has). Uncovered columns: NaN for both.
  struct ColumnCells {
    int64_t ja, jb;
    A ka, kb;
  };
  std::vector<ColumnCells> columns;

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

  // The gradient's tensors (and, for overlapping cells, the column table of the gather).
  void set_gradient(const at::Tensor& y_, const at::Tensor& dy_, at::Tensor& dx_,
                    bool overlapping) {
    y = y_.const_data_ptr<scalar_t>();
    dy = dy_.const_data_ptr<scalar_t>();
    dx = dx_.mutable_data_ptr<scalar_t>();
    if (!overlapping) return;
    const A none = std::numeric_limits<A>::quiet_NaN();
    columns.resize(W);
    for (int64_t w = 0; w < W; ++w) {
      const int64_t f = g.cols.first[w], l = g.cols.last[w];
      columns[w] = f > l ? ColumnCells{0, 0, none, none}
                         : ColumnCells{f, l, static_cast<A>(w - g.cols.start[f]),
                                       l > f ? A(0) : none};
    }
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

  template <bool kStream>
  static C10_ALWAYS_INLINE void put(scalar_t* o, const Vec& v) {
    if constexpr (kStream && std::is_same_v<scalar_t, float>)
      stream_store(o, v);
    else
      Wd::store(o, v);
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
  template <int CW, int NV>
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
        for (int k = 0; k < NV; ++k) Wd::store(out + k * L, grad[k] & (at[k] == here));
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
  // reloaded after each one. Its stores are ordinary ones: unlike the overlapping cells'
  // gather, non-temporal ones measured slower here, in cache and beyond it.
  template <int RH, int CW>
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
          write_vectors<CW, decltype(nv)::value>(pj + d, gc + d, o + d, rh, last, stride, orow, c);
        });
      }
    }
    return mismatch == 0;
  }
  template <int RH>
  bool cell_row(int64_t b, int64_t i, int64_t dv) const {
    switch (cw_max) {
      case 1: return cells_of_row<RH, 1>(b, i, dv);
      case 2: return cells_of_row<RH, 2>(b, i, dv);
      case 3: return cells_of_row<RH, 3>(b, i, dv);
      default: return cells_of_row<0, 0>(b, i, dv);
    }
  }

  // ---- overlapping cells
  // Argmaxes of cell row i, channels [d0, d1) in whole vectors, into pos[OW][d1 - d0].
  template <int RH, int CW>
  bool argmax_cells(int64_t b, int64_t i, int64_t d0, int64_t d1, A* pos) const {
    const int64_t r0 = g.rows.start[i], rh = RH > 0 ? RH : g.rows.end[i] - r0 + 1;
    const int64_t row = sH, pixel = sW, nd = d1 - d0, stride = CW > 0 ? CW : cw_max;
    int mismatch = 0;
    for (int64_t j = 0; j < OW; ++j) {
      const int64_t c0 = g.cols.start[j], last = g.cols.end[j] - c0;
      const scalar_t* xc = x + b * sN + r0 * row + c0 * pixel + d0;
      const scalar_t* yc = y + ((b * OH + i) * OW + j) * C + d0;
      A* pj = pos + j * nd;
      for_vector_groups(nd, [&](int64_t d, auto nv) {
        mismatch |= argmax_vectors<RH, CW, decltype(nv)::value>(xc + d, yc + d, pj + d, rh, last,
                                                                stride, row, pixel);
      });
    }
    return mismatch == 0;
  }
  template <int RH>
  bool argmax_row(int64_t b, int64_t i, int64_t d0, int64_t d1, A* pos) const {
    switch (cw_max) {
      case 2: return argmax_cells<RH, 2>(b, i, d0, d1, pos);
      case 3: return argmax_cells<RH, 3>(b, i, d0, d1, pos);
      default: return argmax_cells<0, 0>(b, i, d0, d1, pos);
    }
  }

  // Non-temporal stores exist for float only: the other types compile one variant.
  static constexpr bool kCanStreamType = std::is_same_v<scalar_t, float>;

  // dx row h of image b, channels d0 + [0, nd): each element is 0 plus, in TF's cell order,
  // dy of each covering cell whose argmax it is. Cell rows ia and ib cover the row (kTwo: two
  // of them, and h is ib's first row); their argmaxes are in the ring. NV > 0: nd = NV * L.
  template <bool kTwo, int NV, bool kStream>
  void gather_row(int64_t b, int64_t h, int64_t d0, int64_t nd_, const A* ring) const {
    const int64_t nd = NV > 0 ? NV * L : nd_;
    const int64_t ia = g.rows.first[h], ib = g.rows.last[h], cells = OW * nd, c = C;
    const Vec ra(static_cast<A>((h - g.rows.start[ia]) * cw_max));
    const A *pa = ring + (ia & 1) * cells, *pb = ring + (ib & 1) * cells;
    const scalar_t* ga = dy + (b * OH + ia) * OW * C + d0;
    const scalar_t* gb = dy + (b * OH + ib) * OW * C + d0;
    scalar_t* o = dx + (b * H + h) * W * C + d0;
    const ColumnCells* cols = columns.data();
    for (int64_t w = 0; w < W; ++w, o += c) {
      const ColumnCells m = cols[w];
      const Vec ka(m.ka), kb(m.kb), ca = ra + ka, cb = ra + kb;
      const int64_t a = m.ja * nd, bb = m.jb * nd, ag = m.ja * c, bg = m.jb * c;
#pragma GCC unroll 8
      for (int64_t d = 0; d < nd; d += L) {
        Vec acc = Vec(A(0)) + (Wd::load(ga + ag + d) & (Vec::loadu(pa + a + d) == ca));
        acc = acc + (Wd::load(ga + bg + d) & (Vec::loadu(pa + bb + d) == cb));
        if (kTwo) {
          acc = acc + (Wd::load(gb + ag + d) & (Vec::loadu(pb + a + d) == ka));
          acc = acc + (Wd::load(gb + bg + d) & (Vec::loadu(pb + bb + d) == kb));
        }
        put<kStream>(o + d, acc);
      }
    }
  }
  template <int NV>
  void gather_rows(int64_t b, int64_t h, int64_t d0, int64_t nd, const A* ring) const {
    const bool two = g.rows.first[h] < g.rows.last[h];
    if (g.rows.first[h] > g.rows.last[h]) return;  // no cell covers the row
    if constexpr (kCanStreamType) {
      if (stream) {
        two ? gather_row<true, NV, true>(b, h, d0, nd, ring)
            : gather_row<false, NV, true>(b, h, d0, nd, ring);
        return;
      }
    }
    two ? gather_row<true, NV, false>(b, h, d0, nd, ring)
        : gather_row<false, NV, false>(b, h, d0, nd, ring);
  }

  // Image b, channels [d0, d1) in whole vectors.
  bool shared_image(int64_t b, int64_t d0, int64_t d1) const {
    const int64_t nd = d1 - d0;
    std::vector<A> ring(2 * OW * nd);
    bool ok = true;
    int64_t h = 0;
    for (int64_t i = 0; i < OH; ++i) {
      A* pos = ring.data() + (i & 1) * OW * nd;
      switch (g.rows.count(i)) {
        case 2: ok &= argmax_row<2>(b, i, d0, d1, pos); break;
        case 3: ok &= argmax_row<3>(b, i, d0, d1, pos); break;
        default: ok &= argmax_row<0>(b, i, d0, d1, pos);
      }
      for (; h < H && g.rows.last[h] <= i; ++h) {  // rows no later cell row covers
        switch (nd / L * L == nd ? nd / L : 0) {
          case 2: gather_rows<2>(b, h, d0, nd, ring.data()); break;
          case 4: gather_rows<4>(b, h, d0, nd, ring.data()); break;
          case 8: gather_rows<8>(b, h, d0, nd, ring.data()); break;
          default: gather_rows<0>(b, h, d0, nd, ring.data());
        }
      }
    }
    return ok;
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

  // Overlapping cells: image b, channels [d0, d1).
  bool overlapping_block(int64_t b, int64_t d0, int64_t d1) const {
    const int64_t dv = vector_end(d0, d1);
    bool ok = true;
    constexpr bool kWiden = !std::is_integral_v<A> && !std::is_same_v<A, scalar_t>;
    if (dv < d1) {
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
      if (dv > d0) ok &= shared_image(b, d0, dv);
    return ok;
  }
};

template <typename scalar_t>
void max_grad_kernel(const at::Tensor& x, const at::Tensor& y, const at::Tensor& dy, at::Tensor& dx,
                     const GradPlan& g, bool overlapping) {
  const int64_t OH = g.rows.cells, C = g.C;
  MaxGradPass<scalar_t> pass(x, g);
  pass.set_gradient(y, dy, dx, overlapping);
  const bool stream = std::is_same_v<scalar_t, float> && C % 8 == 0 &&
                      reinterpret_cast<uintptr_t>(dx.const_data_ptr()) % 32 == 0 &&
                      worth_streaming(dx.numel() * 4);
  pass.stream = stream && overlapping;  // (see cells_of_row)
  // Sequences that do not start at 0 or end at the input's size leave rows/columns that no
  // cell covers (and the pass never writes): their gradient is zero.
  if (!g.rows.covers_all() || !g.cols.covers_all()) dx.zero_();
  // Float channels in whole 16-lane vectors: the AVX-512 kernel where the CPU has it.
  std::unique_ptr<fracpool::MaxGradAvx512> wide;
  if constexpr (std::is_same_v<scalar_t, float>) {
    if (C % 16 == 0 && !pass.scalar_only && avx512_enabled())
      wide = std::make_unique<fracpool::MaxGradAvx512>(
          pass.x, pass.sN, pass.sH, pass.sW, pass.y, pass.dy, pass.dx, g, overlapping,
          stream && reinterpret_cast<uintptr_t>(pass.dx) % 64 == 0);
  }
  std::atomic<bool> same{true};
  const int64_t cell_row = (g.H / OH + 1) * g.W * C;
  if (!overlapping) {  // cells are disjoint: any cell row is its own task
    at::parallel_for(0, g.N * OH, grain_for(cell_row), [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t)
        if (!(wide ? wide->disjoint_row(t / OH, t % OH) : pass.disjoint_row(t / OH, t % OH)))
          same = false;
      if (stream) stream_fence();
    });
  } else {  // boundaries are shared between cell rows: one task per image and channel block
    constexpr int64_t kBlock = 64;
    const int64_t blocks = (C + kBlock - 1) / kBlock;
    at::parallel_for(0, g.N * blocks, 1, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const int64_t d0 = (t % blocks) * kBlock, d1 = std::min(C, d0 + kBlock);
        if (!(wide ? wide->overlapping_block(t / blocks, d0, d1)
                   : pass.overlapping_block(t / blocks, d0, d1)))
          same = false;
      }
      if (stream) stream_fence();
    });
  }
  TORCH_CHECK(same, "fractional_max_pool_grad: argument 'orig_output': ", fracpool::kOutputMismatch,
              " (orig_output is not the fractional max pool of orig_input with these sequences)");
}

// Double backward of the max gradient: out[b, i, j, d] = grad at the cell's argmax (the
// gradient's own argmax and tie rule). Whole channel vectors select branch-free over the
// cell's positions (straight-line per cell-row height and widest cell, as the gradient);
// other channels (and integers, and huge cells) one at a time with exact int64 positions.
template <typename scalar_t, int RH, int CW>
void select_argmax_row(const MaxGradPass<scalar_t>& p, const scalar_t* gin, scalar_t* out,
                       int64_t b, int64_t i, int64_t dv) {
  using A = acc_t<scalar_t>;
  using Wd = Widen<scalar_t, A>;
  using Vec = Vectorized<A>;
  constexpr int64_t L = Vec::size();
  const GradPlan& g = p.g;
  const int64_t r0 = g.rows.start[i], rh = RH > 0 ? RH : g.rows.end[i] - r0 + 1;
  const int64_t C = p.C, grow = p.W * C, stride = CW > 0 ? CW : p.cw_max;
  for (int64_t j = 0; j < p.OW; ++j) {
    const int64_t c0 = g.cols.start[j], last = g.cols.end[j] - c0;
    const int64_t cw = CW > 0 ? CW : last + 1;
    const scalar_t* xc = p.x + b * p.sN + r0 * p.sH + c0 * p.sW;
    const scalar_t* gc = gin + ((b * p.H + r0) * p.W + c0) * C;
    scalar_t* o = out + ((b * p.OH + i) * p.OW + j) * C;
    for (int64_t d = 0; !std::is_integral_v<scalar_t> && d < dv; d += L) {
      Vec best, at, v(A(0));
      MaxGradPass<scalar_t>::template cell_argmax<RH, CW>(xc + d, rh, last, stride, p.sH, p.sW,
                                                          best, at);
#pragma GCC unroll 4
      for (int64_t h = 0; h < rh; ++h)
#pragma GCC unroll 4
        for (int64_t w = 0; w < cw; ++w)  // a repeated column's position never matches
          v = Vec::blendv(v, Wd::load(gc + h * grow + (CW > 0 ? std::min(w, last) : w) * C + d),
                          at == Vec(static_cast<A>(h * stride + w)));
      Wd::store(o + d, v);
    }
    for (int64_t d = dv; d < C; ++d) {
      const auto m = cell_max_scalar(p.x + b * p.sN + d, p.sH, p.sW, r0, g.rows.end[i], c0,
                                     g.cols.end[j]);
      o[d] = gin[((b * p.H + m.h) * p.W + m.w) * C + d];
    }
  }
}

template <typename scalar_t, int RH>
void select_argmax_row(const MaxGradPass<scalar_t>& p, const scalar_t* gin, scalar_t* out,
                       int64_t b, int64_t i, int64_t dv) {
  switch (dv > 0 ? p.cw_max : 0) {
    case 1: return select_argmax_row<scalar_t, RH, 1>(p, gin, out, b, i, dv);
    case 2: return select_argmax_row<scalar_t, RH, 2>(p, gin, out, b, i, dv);
    case 3: return select_argmax_row<scalar_t, RH, 3>(p, gin, out, b, i, dv);
    default: return select_argmax_row<scalar_t, 0, 0>(p, gin, out, b, i, dv);
  }
}

}  // namespace

at::Tensor fractional_max_pool_grad_cpu(const at::Tensor& orig_input, const at::Tensor& orig_output,
                                        const at::Tensor& out_backprop,
                                        const at::Tensor& row_pooling_sequence,
                                        const at::Tensor& col_pooling_sequence, bool overlapping) {
  constexpr const char* op = "fractional_max_pool_grad";
  const GradPlan g = fracpool::check_max_grad(op, orig_input, orig_output, out_backprop,
                                              row_pooling_sequence, col_pooling_sequence,
                                              overlapping);
  const at::Tensor x = channels_contiguous(orig_input);
  const at::Tensor y = orig_output.contiguous();
  const at::Tensor dy = out_backprop.contiguous();
  at::Tensor dx = at::empty({g.N, g.H, g.W, g.C}, orig_input.options());
  fracpool::dispatch_value_types(x.scalar_type(), [&](auto tag) {
    max_grad_kernel<decltype(tag)>(x, y, dy, dx, g, overlapping);
  });
  return dx;
}

at::Tensor fractional_max_pool_grad_backward_cpu(const at::Tensor& orig_input,
                                                 const at::Tensor& orig_output,
                                                 const at::Tensor& grad,
                                                 const at::Tensor& row_pooling_sequence,
                                                 const at::Tensor& col_pooling_sequence,
                                                 bool overlapping) {
  constexpr const char* op = "_fractional_max_pool_grad_backward";
  const GradPlan g = fracpool::check_max_grad(op, orig_input, orig_output, orig_output,
                                              row_pooling_sequence, col_pooling_sequence,
                                              overlapping);
  TORCH_CHECK(grad.sizes() == orig_input.sizes() && grad.scalar_type() == orig_input.scalar_type(),
              op,
              ": argument 'grad' must have the shape and dtype "
              "of orig_input");
  const at::Tensor x = channels_contiguous(orig_input);
  const at::Tensor gin = grad.contiguous();
  at::Tensor out = at::empty(orig_output.sizes(), grad.options());
  fracpool::dispatch_value_types(x.scalar_type(), [&](auto tag) {
    using scalar_t = decltype(tag);
    const MaxGradPass<scalar_t> pass(x, g);  // (the orig_output check was the gradient's)
    const int64_t dv = pass.vector_end(0, g.C), OH = g.rows.cells;
    const scalar_t* src = gin.const_data_ptr<scalar_t>();
    scalar_t* dst = out.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, g.N * OH, grain_for((g.H / OH + 1) * g.W * g.C),
                     [&](int64_t begin, int64_t end) {
                       for (int64_t t = begin; t < end; ++t) {
                         const int64_t b = t / OH, i = t % OH;
                         switch (g.rows.count(i)) {
                           case 1: select_argmax_row<scalar_t, 1>(pass, src, dst, b, i, dv); break;
                           case 2: select_argmax_row<scalar_t, 2>(pass, src, dst, b, i, dv); break;
                           case 3: select_argmax_row<scalar_t, 3>(pass, src, dst, b, i, dv); break;
                           default: select_argmax_row<scalar_t, 0>(pass, src, dst, b, i, dv);
                         }
                       }
                     });
  });
  return out;
}

}  // namespace fracpool_cpu
}  // namespace torch_tfgrads
