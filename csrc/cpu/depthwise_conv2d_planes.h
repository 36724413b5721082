// The channels-first kernels' zero-padded, stride-phase-split planes (see depthwise_conv2d.cpp),
// shared by the forward, input-gradient and filter-gradient kernels of that layout.
#pragma once

#include <algorithm>
#include <cstdint>

#include "cpu/depthwise_conv2d_cpu.h"
#include "cpu/widen.h"

namespace torch_tfgrads {
namespace depthwise_cpu {

// A zero-padded plane split into sW column phases: element (R, Q) of the padded plane (R = h +
// pt, Q = w + pl) is buf[((Q % sW) * rows + R) * pitch + Q / sW]. Tap (di, dj) of output (i, j)
// is then buf[phase(dj)][i*sH + di*dH][j + shift(dj)]: contiguous in j for every stride.
struct PhasePlane {
  int64_t rows, pitch, sW;
  int64_t size() const { return sW * rows * pitch; }
  int64_t at(int64_t R, int64_t Q) const { return ((Q % sW) * rows + R) * pitch + Q / sW; }
  int64_t tap(int64_t R, int64_t dj_off) const {  // dj_off = dj * dW
    return ((dj_off % sW) * rows + R) * pitch + dj_off / sW;
  }
};

template <typename A>
PhasePlane phase_plane(const Geometry& g) {
  constexpr int64_t L = Vectorized<A>::size();
  PhasePlane pp;
  pp.sW = g.sW;
  pp.rows = std::max(g.H + g.pt, (g.Ho - 1) * g.sH + (g.fh - 1) * g.dH + 1);
  const int64_t wo_pad = (g.Wo + L - 1) / L * L;  // vector overrun of the last column block
  const int64_t cols = std::max(g.W + g.pl, (wo_pad - 1) * g.sW + (g.fw - 1) * g.dW + 1);
  pp.pitch = (cols + g.sW - 1) / g.sW + 1;
  return pp;
}

template <typename scalar_t, typename A>
inline void load_plane(const scalar_t* x, const Geometry& g, const PhasePlane& pp, A* buf) {
  std::fill(buf, buf + pp.size(), A(0));
  for (int64_t h = 0; h < g.H; ++h)
    for (int64_t w = 0; w < g.W; ++w)
      buf[pp.at(h + g.pt, w + g.pl)] = static_cast<A>(x[h * g.W + w]);
}

// Up to n (< L) elements widened into a vector, the rest zero.
template <typename scalar_t, typename A>
inline Vectorized<A> load_partial(const scalar_t* p, int64_t n) {
  A tmp[Vectorized<A>::size()] = {};
  for (int64_t i = 0; i < n; ++i) tmp[i] = static_cast<A>(p[i]);
  return Vectorized<A>::loadu(tmp);
}

template <typename scalar_t, typename A>
inline void store_partial(scalar_t* p, const Vectorized<A>& v, int64_t n) {
  A tmp[Vectorized<A>::size()];
  v.store(tmp);
  for (int64_t i = 0; i < n; ++i) p[i] = static_cast<scalar_t>(tmp[i]);
}

// Parallel grain of the per-plane kernels: about 16K multiply-adds per task.
inline int64_t plane_grain(const Geometry& g) {
  return std::max<int64_t>(1, 16384 / std::max<int64_t>(1, g.Ho * g.Wo * g.fh * g.fw));
}

}  // namespace depthwise_cpu
}  // namespace torch_tfgrads
