// The CudnnRNN cells' formulas as host-device code: one step of one unit (LSTM, GRU, plain RNN)
// and its gradient, generic over a math policy M that names the value type (a scalar on the GPU,
// an at::vec::Vectorized on the CPU) and its sigmoid and tanh. The CPU cells
// (cpu/cudnn_rnn_cell.h) run them on vectors of units with TF's fast CPU activations; the CUDA
// kernel (cuda/cudnn_rnn.cu) runs cell_forward_element / cell_backward_element below, one thread
// per (batch row, unit), with CUDA's exp and tanh; tfgrads_test::cudnn_rnn_host_cells
// (cpu/cudnn_rnn_cells.cpp) runs those same element bodies on the host, so the CPU tests check
// the GPU's indexing, length handling and formulas.
#pragma once

#include <c10/macros/Macros.h>

#include <cmath>
#include <cstdint>

#include "common/cudnn_rnn.h"

namespace torch_tfgrads {
namespace cudnn_rnn {
namespace cells {

// ---- Gate formulas (pre: the pre-activations W x + bW + R h + bR per gate) -----------------
template <typename V>
struct Lstm {
  V i, f, g, o, c, h;  // gates, new cell state, new h (before projection)
};

template <typename M, typename V = typename M::V>
C10_HOST_DEVICE C10_ALWAYS_INLINE Lstm<V> lstm_forward(const V& pi, const V& pf, const V& pg,
                                                       const V& po, const V& c_prev) {
  Lstm<V> r;
  r.i = M::sigmoid(pi);
  r.f = M::sigmoid(pf);
  r.g = M::tanh(pg);
  r.o = M::sigmoid(po);
  r.c = r.f * c_prev + r.i * r.g;
  r.h = r.o * M::tanh(r.c);
  return r;
}

template <typename V>
struct Gru {
  V r, z, n, h;  // reset and update gates, candidate, new h
};

// x_*: the input path (W x + bW); r_r, r_z: the recurrent path with its bias; ghn: R_n h + bR_n
// (the reset gate's operand, saved for the gradient).
template <typename M, typename V = typename M::V>
C10_HOST_DEVICE C10_ALWAYS_INLINE Gru<V> gru_forward(const V& pr, const V& pz, const V& x_n,
                                                     const V& ghn, const V& h_prev) {
  Gru<V> r;
  r.r = M::sigmoid(pr);
  r.z = M::sigmoid(pz);
  r.n = M::tanh(x_n + r.r * ghn);
  r.h = r.n + r.z * (h_prev - r.n);  // (1 - z) n + z h
  return r;
}

template <typename M, Mode mode, typename V = typename M::V>
C10_HOST_DEVICE C10_ALWAYS_INLINE V rnn_forward(const V& pre) {
  return mode == Mode::kRnnTanh ? M::tanh(pre) : M::relu(pre);
}

template <typename V>
struct LstmGrad {
  V di, df, dg, do_, dc_prev;  // pre-activation gradients, gradient w.r.t. c_prev
};

// dh: gradient w.r.t. the step's h (before projection), dc: w.r.t. its c.
template <typename M, typename V = typename M::V>
C10_HOST_DEVICE C10_ALWAYS_INLINE LstmGrad<V> lstm_backward(const V& i, const V& f, const V& g,
                                                            const V& o, const V& c_cur,
                                                            const V& c_prev, const V& dh,
                                                            const V& dc) {
  const V one = M::one();
  const V tc = M::tanh(c_cur);
  const V dct = dc + dh * o * (one - tc * tc);
  LstmGrad<V> r;
  r.di = dct * i * (one - i) * g;
  r.df = dct * f * (one - f) * c_prev;
  r.dg = dct * i * (one - g * g);
  r.do_ = dh * tc * o * (one - o);
  r.dc_prev = dct * f;
  return r;
}

template <typename V>
struct GruGrad {
  V dr, dz, dn, dgh_n, carry;  // carry: the part of dh_prev not through R (dh * z)
};

template <typename M, typename V = typename M::V>
C10_HOST_DEVICE C10_ALWAYS_INLINE GruGrad<V> gru_backward(const V& r, const V& z, const V& n,
                                                          const V& ghn, const V& h_prev,
                                                          const V& dh) {
  const V one = M::one();
  GruGrad<V> g;
  g.dn = dh * (one - z) * (one - n * n);
  g.dz = dh * (h_prev - n) * z * (one - z);
  g.dr = g.dn * ghn * r * (one - r);
  g.dgh_n = g.dn * r;
  g.carry = dh * z;
  return g;
}

// h: the saved output of the step.
template <typename M, Mode mode, typename V = typename M::V>
C10_HOST_DEVICE C10_ALWAYS_INLINE V rnn_backward(const V& h, const V& dh) {
  return mode == Mode::kRnnTanh ? dh * (M::one() - h * h) : M::relu_grad(h, dh);
}

// ---- The GPU's per-element bodies ---------------------------------------------------------
// CUDA's activations on a scalar (expf/tanhf, exp/tanh in double).
template <typename T>
struct ScalarMath {
  using V = T;
  C10_HOST_DEVICE static T one() { return T(1); }
  C10_HOST_DEVICE static T sigmoid(T x) {
    using std::exp;
    return T(1) / (T(1) + exp(-x));
  }
  C10_HOST_DEVICE static T tanh(T x) {
    using std::tanh;
    return tanh(x);
  }
  C10_HOST_DEVICE static T relu(T x) { return x > T(0) ? x : T(0); }
  C10_HOST_DEVICE static T relu_grad(T h, T dh) { return h > T(0) ? dh : T(0); }
};

// Pointers of one step, all [B, *] row-major (common/cudnn_rnn.h's CellForward/CellBackward).
template <typename T>
struct FwdArgs {
  const T *gx, *gh, *h_prev, *c_prev;
  const int* lens;  // [B] or nullptr: every row active
  T *acts, *c_out, *h_out;
  int64_t B, U, Hh, GU, AW, step;  // GU: gate width G*U; AW: saved activations per row
  bool projected;
};

template <typename T>
struct BwdArgs {
  const T *acts, *c_cur, *c_prev, *h_prev, *dh, *dc;
  const int* lens;
  T *dgx, *dgh, *dc_prev, *carry;
  int64_t B, U, Hh, GU, AW, step;
};

// The arguments of one step from the driver's tensors (host code).
template <typename T>
const T* data_or_null(const at::Tensor& t) {
  return t.defined() ? t.data_ptr<T>() : nullptr;
}
template <typename T>
T* mutable_or_null(const at::Tensor& t) {
  return t.defined() ? t.data_ptr<T>() : nullptr;
}

template <typename T>
FwdArgs<T> step_args(const Config& cfg, const CellForward& a) {
  return {data_or_null<T>(a.gx),
          data_or_null<T>(a.gh),
          data_or_null<T>(a.h_prev),
          data_or_null<T>(a.c_prev),
          data_or_null<int>(a.lens),
          mutable_or_null<T>(a.acts),
          mutable_or_null<T>(a.c_out),
          mutable_or_null<T>(a.h_out),
          cfg.B,
          cfg.U,
          cfg.Hh,
          cfg.GU(),
          cfg.act_width(),
          a.step,
          a.projected};
}

template <typename T>
BwdArgs<T> step_args(const Config& cfg, const CellBackward& a) {
  return {data_or_null<T>(a.acts),
          data_or_null<T>(a.c_cur),
          data_or_null<T>(a.c_prev),
          data_or_null<T>(a.h_prev),
          data_or_null<T>(a.dh),
          data_or_null<T>(a.dc),
          data_or_null<int>(a.lens),
          mutable_or_null<T>(a.dgx),
          mutable_or_null<T>(a.dgh),
          mutable_or_null<T>(a.dc_prev),
          mutable_or_null<T>(a.dh_carry),
          cfg.B,
          cfg.U,
          cfg.Hh,
          cfg.GU(),
          cfg.act_width(),
          a.step};
}

// Element k = b * U + u of one forward step.
template <typename T>
C10_HOST_DEVICE inline void cell_forward_element(Mode mode, const FwdArgs<T>& a, int64_t k) {
  using M = ScalarMath<T>;
  const int64_t U = a.U, b = k / U, u = k % U;
  if (a.lens && a.step >= a.lens[b]) {  // past this row's length: the state is carried
    if (mode == Mode::kLstm) a.c_out[k] = a.c_prev[k];
    if (!a.projected) a.h_out[k] = a.h_prev[b * a.Hh + u];
    if (a.acts)  // the reserve space is never left uninitialised
      for (int64_t g = 0; g < a.AW; g += U) a.acts[b * a.AW + u + g] = T(0);
    return;
  }
  const T* x = a.gx + b * a.GU + u;
  const T* r = a.gh + b * a.GU + u;
  T* ac = a.acts ? a.acts + b * a.AW + u : nullptr;
  if (mode == Mode::kLstm) {
    const Lstm<T> s = lstm_forward<M>(x[0] + r[0], x[U] + r[U], x[2 * U] + r[2 * U],
                                      x[3 * U] + r[3 * U], a.c_prev[k]);
    a.c_out[k] = s.c;
    a.h_out[k] = s.h;
    if (ac) {
      ac[0] = s.i;
      ac[U] = s.f;
      ac[2 * U] = s.g;
      ac[3 * U] = s.o;
    }
  } else if (mode == Mode::kGru) {
    const T ghn = r[2 * U];
    const Gru<T> s = gru_forward<M>(x[0] + r[0], x[U] + r[U], x[2 * U], ghn,
                                    a.h_prev[b * a.Hh + u]);
    a.h_out[k] = s.h;
    if (ac) {
      ac[0] = s.r;
      ac[U] = s.z;
      ac[2 * U] = s.n;
      ac[3 * U] = ghn;
    }
  } else {
    const T pre = x[0] + r[0];
    const T h = mode == Mode::kRnnTanh ? rnn_forward<M, Mode::kRnnTanh>(pre)
                                       : rnn_forward<M, Mode::kRnnRelu>(pre);
    a.h_out[k] = h;
    if (ac) ac[0] = h;
  }
}

// Element k = b * U + u of one backward step.
template <typename T>
C10_HOST_DEVICE inline void cell_backward_element(Mode mode, const BwdArgs<T>& a, int64_t k) {
  using M = ScalarMath<T>;
  const int64_t U = a.U, GU = a.GU, b = k / U, u = k % U;
  T* gx = a.dgx + b * GU + u;
  const T dh = a.dh[k];  // [B, U]: Hh == U, or the projected-space gradient mapped to U
  if (a.lens && a.step >= a.lens[b]) {  // zero gate gradients; dc and dh pass through
    for (int64_t g = 0; g < GU; g += U) gx[g] = T(0);
    if (mode == Mode::kGru)
      for (int64_t g = 0; g < GU; g += U) a.dgh[b * GU + u + g] = T(0);
    if (mode == Mode::kLstm) a.dc_prev[k] = a.dc[k];
    if (a.carry) a.carry[b * a.Hh + u] = dh;
    return;
  }
  const T* ac = a.acts + b * a.AW + u;
  if (mode == Mode::kLstm) {
    const LstmGrad<T> d = lstm_backward<M>(ac[0], ac[U], ac[2 * U], ac[3 * U], a.c_cur[k],
                                           a.c_prev[k], dh, a.dc[k]);
    gx[0] = d.di;
    gx[U] = d.df;
    gx[2 * U] = d.dg;
    gx[3 * U] = d.do_;
    a.dc_prev[k] = d.dc_prev;
    if (a.carry) a.carry[b * a.Hh + u] = T(0);
  } else if (mode == Mode::kGru) {
    const GruGrad<T> d = gru_backward<M>(ac[0], ac[U], ac[2 * U], ac[3 * U], a.h_prev[b * a.Hh + u],
                                         dh);
    T* gr = a.dgh + b * GU + u;
    gx[0] = gr[0] = d.dr;
    gx[U] = gr[U] = d.dz;
    gx[2 * U] = d.dn;
    gr[2 * U] = d.dgh_n;
    a.carry[b * a.Hh + u] = d.carry;
  } else {
    gx[0] = mode == Mode::kRnnTanh ? rnn_backward<M, Mode::kRnnTanh>(ac[0], dh)
                                   : rnn_backward<M, Mode::kRnnRelu>(ac[0], dh);
    a.carry[b * a.Hh + u] = T(0);
  }
}

}  // namespace cells
}  // namespace cudnn_rnn
}  // namespace torch_tfgrads
