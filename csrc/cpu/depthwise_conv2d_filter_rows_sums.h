// The direct order's sums (depthwise_conv2d_filter_rows.cpp), generic in the vector type V:
// this file is included twice there, each time inside its own namespace, once for the 8-lane
// path and once inside the AVX-512 target region (16 lanes). It includes nothing itself; it uses
// Segment, ColumnTaps, AxisTaps and an fma_(a, b, c) for V from the including file.
// NOLINT(build/header_guard): no include guard, on purpose.

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
direct_row(const float* const* xr, const float* dr, int64_t px, int64_t sx, int64_t dpx,
           const ColumnTaps* cols, int64_t Wo, int64_t ja, int64_t jb, V& p00, V& p01, V& p02,
           V& p10, V& p11, V& p12, V& p20, V& p21, V& p22) {
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
    fixed_column<V, MASK, 0, 3>(xr, s0 + (j - ja) * sx, V::loadu(dr + j * dpx), px, p00, p01, p02,
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
#define TFGRADS_ROW(M)                                                                          \
  case M:                                                                                       \
    direct_row<V, M, SAME1>(xr, dr, sg.px, sg.sx, sg.dpx, cols, Wo, ja, jb, p00, p01, p02, p10, \
                            p11, p12, p20, p21, p22);                                           \
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
