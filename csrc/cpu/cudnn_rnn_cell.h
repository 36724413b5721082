// The fused per-step cell of the CudnnRNN family on the CPU (gate activations, state update,
// saved activations) and its gradient, for one batch row's units, vectorised with at::vec: the
// formulas shared with the CUDA kernel (common/cudnn_rnn_cells.h) on vectors of units.
// Shared by the per-step kernels (cudnn_rnn.cpp) and the fused BRGEMM steps
// (cudnn_rnn_brgemm.cpp), which inline the same cells.
#pragma once

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "common/cudnn_rnn.h"
#include "common/cudnn_rnn_cells.h"

namespace torch_tfgrads {
namespace cudnn_rnn {

using at::vec::Vectorized;

// The gate nonlinearities dominate the cell kernels, so they use fast forms: exp_u20 (a few
// ulp) for the sigmoid, and for float tanh Eigen's rational approximation, the one TF's own
// CPU kernels evaluate (clamped to +-7.9, odd degree-13 over even degree-6 polynomial; within a
// few ulp). float64 keeps Sleef's tanh.
template <typename T>
C10_ALWAYS_INLINE Vectorized<T> sigmoid(const Vectorized<T>& x) {
  const Vectorized<T> one(T(1));
  return one / (one + x.neg().exp_u20());
}

template <typename T>
C10_ALWAYS_INLINE Vectorized<T> fast_tanh(const Vectorized<T>& x) {
  return x.tanh();
}

template <>
C10_ALWAYS_INLINE Vectorized<float> fast_tanh(const Vectorized<float>& a) {
  using Vec = Vectorized<float>;
  const Vec clamp(7.90531110763549805f);
  const Vec x = at::vec::minimum(at::vec::maximum(a, -clamp), clamp);
  const Vec x2 = x * x;
  Vec p = at::vec::fmadd(x2, Vec(-2.76076847742355e-16f), Vec(2.00018790482477e-13f));
  p = at::vec::fmadd(x2, p, Vec(-8.60467152213735e-11f));
  p = at::vec::fmadd(x2, p, Vec(5.12229709037114e-08f));
  p = at::vec::fmadd(x2, p, Vec(1.48572235717979e-05f));
  p = at::vec::fmadd(x2, p, Vec(6.37261928875436e-04f));
  p = at::vec::fmadd(x2, p, Vec(4.89352455891786e-03f));
  p = x * p;
  Vec q = at::vec::fmadd(x2, Vec(1.19825839466702e-06f), Vec(1.18534705686654e-04f));
  q = at::vec::fmadd(x2, q, Vec(2.26843463243900e-03f));
  q = at::vec::fmadd(x2, q, Vec(4.89352518554385e-03f));
  // |a| < 4e-4: tanh(a) == a to float precision (and keeps signed zeros and tiny values exact).
  return Vec::blendv(p / q, a, a.abs() < Vec(0.0004f));
}

// The activations of the CPU cells, for the shared formulas (common/cudnn_rnn_cells.h).
template <typename T>
struct VecMath {
  using V = Vectorized<T>;
  static C10_ALWAYS_INLINE V one() { return V(T(1)); }
  static C10_ALWAYS_INLINE V sigmoid(const V& x) { return cudnn_rnn::sigmoid(x); }
  static C10_ALWAYS_INLINE V tanh(const V& x) { return fast_tanh(x); }
  static C10_ALWAYS_INLINE V relu(const V& x) { return at::vec::maximum(x, V(T(0))); }
  static C10_ALWAYS_INLINE V relu_grad(const V& h, const V& dh) {
    return V::blendv(V(T(0)), dh, h > V(T(0)));
  }
};

// Calls f(b) for every batch row; rows are independent, so split them over threads once a
// step has enough work to pay for it.
template <typename F>
void for_rows(int64_t B, int64_t row_work, const F& f) {
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, row_work));
  at::parallel_for(0, B, grain, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) f(b);
  });
}

// A per-thread buffer of at least n elements, kept between steps and calls: the fused step
// loops need one per step (gate pre-activations, dh) and would otherwise allocate it each time.
template <typename T>
T* thread_buffer(int64_t n) {
  thread_local std::vector<T> buf;
  if (static_cast<int64_t>(buf.size()) < n) buf.resize(n);
  return buf.data();
}

// Whether a direction's W and R, in elements of elem_size bytes, exceed the size above which a
// bidirectional layer's directions take turns (rnn_directions_in_turn_above_bytes, cpu/isa.h).
inline bool direction_weights_above(const Config& cfg, int64_t layer, int64_t elem_size,
                                    int64_t above) {
  const int64_t in = cfg.has_input_weights(layer) ? cfg.in_width(layer) : 0;
  return cfg.GU() * (in + cfg.Hh) * elem_size > above;
}

template <typename T>
void copy_row(T* dst, const T* src, int64_t n) {
  std::memcpy(dst, src, n * sizeof(T));
}

template <typename T>
const T* ptr(const at::Tensor& t) {
  return t.defined() ? t.data_ptr<T>() : nullptr;
}
template <typename T>
T* mut(const at::Tensor& t) {
  return t.defined() ? t.data_ptr<T>() : nullptr;
}

// One batch row's units [u0, u0 + n) of one step. Every pointer is already offset to u0; gate g
// of a unit is `g * stride` further on (the strides differ between the [B, G*U] step buffers
// and the per-block buffers of the fused path below).
template <typename T>
struct FwdSeg {
  const T* x;
  int64_t x_gate;  // W x_t + bW
  const T* r;
  int64_t r_gate;  // R h (+ bR when bR == nullptr)
  const T* bR;     // recurrent bias (gate stride U) or nullptr
  int64_t U;
  const T *c_prev, *h_prev;
  T *c_out, *h_out, *acts;  // acts: gate stride U, may be nullptr
};

// Calls f(std::integral_constant<Mode, m>) for the runtime mode m, so that the cells below are
// compiled per mode and inline into the step loops (the fused path calls them for one
// vector of eight units per row, where a call and a mode switch per vector dominate).
template <typename F>
void with_mode(Mode mode, const F& f) {
  switch (mode) {
    case Mode::kLstm: return f(std::integral_constant<Mode, Mode::kLstm>{});
    case Mode::kGru: return f(std::integral_constant<Mode, Mode::kGru>{});
    case Mode::kRnnTanh: return f(std::integral_constant<Mode, Mode::kRnnTanh>{});
    case Mode::kRnnRelu: return f(std::integral_constant<Mode, Mode::kRnnRelu>{});
  }
}

template <Mode mode, typename T>
C10_ALWAYS_INLINE void forward_cell(const FwdSeg<T>& p, int64_t n, bool active, bool projected) {
  using Vec = Vectorized<T>;
  constexpr int64_t kV = Vec::size();
  const int64_t U = p.U;
  if (!active) {  // past this row's length: the state is carried
    if (mode == Mode::kLstm) copy_row(p.c_out, p.c_prev, n);
    if (!projected) copy_row(p.h_out, p.h_prev, n);
    if (p.acts)  // the reserve space is never left uninitialised
      for (int64_t g = 0; g < (mode == Mode::kLstm || mode == Mode::kGru ? 4 : 1); ++g)
        std::fill(p.acts + g * U, p.acts + g * U + n, T(0));
    return;
  }
  for (int64_t u = 0; u < n; u += kV) {
    const int64_t m = std::min(kV, n - u);
    auto rec = [&](int64_t g) C10_ALWAYS_INLINE_ATTRIBUTE {
      Vec v = Vec::loadu(p.r + g * p.r_gate + u, m);
      return p.bR ? v + Vec::loadu(p.bR + g * U + u, m) : v;
    };
    auto pre = [&](int64_t g) C10_ALWAYS_INLINE_ATTRIBUTE {
      return Vec::loadu(p.x + g * p.x_gate + u, m) + rec(g);
    };
    T* ac = p.acts ? p.acts + u : nullptr;
    switch (mode) {
      case Mode::kLstm: {
        const auto s = cells::lstm_forward<VecMath<T>>(pre(0), pre(1), pre(2), pre(3),
                                                       Vec::loadu(p.c_prev + u, m));
        s.c.store(p.c_out + u, m);
        s.h.store(p.h_out + u, m);
        if (ac) {
          s.i.store(ac, m);
          s.f.store(ac + U, m);
          s.g.store(ac + 2 * U, m);
          s.o.store(ac + 3 * U, m);
        }
        break;
      }
      case Mode::kGru: {
        const Vec ghn = rec(2);
        const auto s = cells::gru_forward<VecMath<T>>(pre(0), pre(1),
                                                      Vec::loadu(p.x + 2 * p.x_gate + u, m), ghn,
                                                      Vec::loadu(p.h_prev + u, m));
        s.h.store(p.h_out + u, m);
        if (ac) {
          s.r.store(ac, m);
          s.z.store(ac + U, m);
          s.n.store(ac + 2 * U, m);
          ghn.store(ac + 3 * U, m);
        }
        break;
      }
      case Mode::kRnnTanh:
      case Mode::kRnnRelu: {
        const Vec h = cells::rnn_forward<VecMath<T>, mode>(pre(0));
        h.store(p.h_out + u, m);
        if (ac) h.store(ac, m);
        break;
      }
    }
  }
}

template <typename T>
struct BwdSeg {
  const T* acts;  // gate stride U
  int64_t U;
  const T *c_cur, *c_prev, *h_prev, *dh, *dc;
  T *dgx, *dgh;        // gate stride U; dgh only for GRU
  T *dc_prev, *carry;  // carry may be nullptr (projection)
};

template <Mode mode, typename T>
C10_ALWAYS_INLINE void backward_cell(const BwdSeg<T>& p, int64_t n, bool active) {
  using Vec = Vectorized<T>;
  constexpr int64_t kV = Vec::size();
  const int64_t U = p.U;
  const Vec zero(T(0));
  if (!active) {  // zero gate gradients; dc and dh pass through
    for (int64_t g = 0; g < gates_of(mode); ++g) {
      std::fill(p.dgx + g * U, p.dgx + g * U + n, T(0));
      if (mode == Mode::kGru) std::fill(p.dgh + g * U, p.dgh + g * U + n, T(0));
    }
    if (mode == Mode::kLstm) copy_row(p.dc_prev, p.dc, n);
    if (p.carry) copy_row(p.carry, p.dh, n);
    return;
  }
  for (int64_t u = 0; u < n; u += kV) {
    const int64_t m = std::min(kV, n - u);
    const Vec g_h = Vec::loadu(p.dh + u, m);
    const T* ac = p.acts + u;
    T* gx = p.dgx + u;
    switch (mode) {
      case Mode::kLstm: {
        const auto d = cells::lstm_backward<VecMath<T>>(
            Vec::loadu(ac, m), Vec::loadu(ac + U, m), Vec::loadu(ac + 2 * U, m),
            Vec::loadu(ac + 3 * U, m), Vec::loadu(p.c_cur + u, m), Vec::loadu(p.c_prev + u, m), g_h,
            Vec::loadu(p.dc + u, m));
        d.di.store(gx, m);
        d.df.store(gx + U, m);
        d.dg.store(gx + 2 * U, m);
        d.do_.store(gx + 3 * U, m);
        d.dc_prev.store(p.dc_prev + u, m);
        if (p.carry) zero.store(p.carry + u, m);
        break;
      }
      case Mode::kGru: {
        const auto d = cells::gru_backward<VecMath<T>>(
            Vec::loadu(ac, m), Vec::loadu(ac + U, m), Vec::loadu(ac + 2 * U, m),
            Vec::loadu(ac + 3 * U, m), Vec::loadu(p.h_prev + u, m), g_h);
        T* gr = p.dgh + u;
        d.dr.store(gx, m);
        d.dz.store(gx + U, m);
        d.dn.store(gx + 2 * U, m);
        d.dr.store(gr, m);
        d.dz.store(gr + U, m);
        d.dgh_n.store(gr + 2 * U, m);
        d.carry.store(p.carry + u, m);
        break;
      }
      case Mode::kRnnTanh:
      case Mode::kRnnRelu: {
        cells::rnn_backward<VecMath<T>, mode>(Vec::loadu(ac, m), g_h).store(gx, m);
        zero.store(p.carry + u, m);
        break;
      }
    }
  }
}

}  // namespace cudnn_rnn
}  // namespace torch_tfgrads
