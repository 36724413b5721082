// CPU kernels of the CudnnRNN family: the fused per-step cell (gate activations, state update,
// saved activations) and its gradient, vectorised over units with at::vec and parallel over
// batch rows; the GEMMs and the step loop are in csrc/common/cudnn_rnn_driver.cpp.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>

#include "../common/cudnn_rnn.h"

namespace torch_tfgrads {
namespace cudnn_rnn {
namespace {

using at::vec::Vectorized;

template <typename T>
Vectorized<T> sigmoid(const Vectorized<T>& x) {
  const Vectorized<T> one(T(1));
  return one / (one + x.neg().exp());
}

// Calls f(b) for every batch row; rows are independent, so split them over threads once a
// step has enough work to pay for it.
template <typename F>
void for_rows(int64_t B, int64_t row_work, const F& f) {
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, row_work));
  at::parallel_for(0, B, grain, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) f(b);
  });
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

template <typename T>
void cell_forward_typed(const Config& cfg, const CellForward& a) {
  using Vec = Vectorized<T>;
  constexpr int64_t kV = Vec::size();
  const int64_t U = cfg.U, GU = cfg.GU(), Hh = cfg.Hh, AW = cfg.act_width();
  const T *gx = ptr<T>(a.gx), *gh = ptr<T>(a.gh), *h_prev = ptr<T>(a.h_prev);
  const T* c_prev = ptr<T>(a.c_prev);
  const int* lens = a.lens.defined() ? a.lens.data_ptr<int>() : nullptr;
  T *acts = mut<T>(a.acts), *c_out = mut<T>(a.c_out), *h_out = mut<T>(a.h_out);
  const Mode mode = cfg.mode;
  const int64_t step = a.step;
  const bool projected = a.projected;
  for_rows(cfg.B, GU, [&](int64_t b) {
    const T* x = gx + b * GU;
    const T* r = gh + b * GU;
    const T* hp = h_prev + b * Hh;
    T* ho = h_out + b * U;
    T* ac = acts ? acts + b * AW : nullptr;
    if (lens && step >= lens[b]) {  // past this row's length: the state is carried
      if (mode == Mode::kLstm) copy_row(c_out + b * U, c_prev + b * U, U);
      if (!projected) copy_row(ho, hp, U);
      if (ac) std::fill(ac, ac + AW, T(0));  // the reserve space is never left uninitialised
      return;
    }
    for (int64_t u = 0; u < U; u += kV) {
      const int64_t n = std::min(kV, U - u);
      auto pre = [&](int64_t g) { return Vec::loadu(x + g * U + u, n) + Vec::loadu(r + g * U + u, n); };
      switch (mode) {
        case Mode::kLstm: {
          const Vec i = sigmoid(pre(0)), f = sigmoid(pre(1)), g = pre(2).tanh(),
                    o = sigmoid(pre(3));
          const Vec c = f * Vec::loadu(c_prev + b * U + u, n) + i * g;
          c.store(c_out + b * U + u, n);
          (o * c.tanh()).store(ho + u, n);
          if (ac) {
            i.store(ac + u, n);
            f.store(ac + U + u, n);
            g.store(ac + 2 * U + u, n);
            o.store(ac + 3 * U + u, n);
          }
          break;
        }
        case Mode::kGru: {
          const Vec rg = sigmoid(pre(0)), z = sigmoid(pre(1));
          const Vec ghn = Vec::loadu(r + 2 * U + u, n);
          const Vec nn = (Vec::loadu(x + 2 * U + u, n) + rg * ghn).tanh();
          const Vec h = Vec::loadu(hp + u, n);
          (nn + z * (h - nn)).store(ho + u, n);  // (1-z) n + z h
          if (ac) {
            rg.store(ac + u, n);
            z.store(ac + U + u, n);
            nn.store(ac + 2 * U + u, n);
            ghn.store(ac + 3 * U + u, n);
          }
          break;
        }
        case Mode::kRnnTanh:
        case Mode::kRnnRelu: {
          const Vec h = mode == Mode::kRnnTanh ? pre(0).tanh()
                                               : at::vec::maximum(pre(0), Vec(T(0)));
          h.store(ho + u, n);
          if (ac) h.store(ac + u, n);
          break;
        }
      }
    }
  });
}

template <typename T>
void cell_backward_typed(const Config& cfg, const CellBackward& a) {
  using Vec = Vectorized<T>;
  constexpr int64_t kV = Vec::size();
  const int64_t U = cfg.U, GU = cfg.GU(), Hh = cfg.Hh, AW = cfg.act_width();
  const T *acts = ptr<T>(a.acts), *c_cur = ptr<T>(a.c_cur), *c_prev = ptr<T>(a.c_prev);
  const T *h_prev = ptr<T>(a.h_prev), *dh = ptr<T>(a.dh), *dc = ptr<T>(a.dc);
  const int* lens = a.lens.defined() ? a.lens.data_ptr<int>() : nullptr;
  T *dgx = mut<T>(a.dgx), *dgh = mut<T>(a.dgh), *dc_prev = mut<T>(a.dc_prev);
  T* carry = mut<T>(a.dh_carry);
  const Mode mode = cfg.mode;
  const int64_t step = a.step;
  const Vec one(T(1)), zero(T(0));
  for_rows(cfg.B, GU, [&](int64_t b) {
    T* gx = dgx + b * GU;
    const T* ac = acts + b * AW;
    const T* dhb = dh + b * U;  // with projection dh is [B, U]; otherwise Hh == U
    if (lens && step >= lens[b]) {
      std::fill(gx, gx + GU, T(0));
      if (mode == Mode::kGru) std::fill(dgh + b * GU, dgh + (b + 1) * GU, T(0));
      if (mode == Mode::kLstm) copy_row(dc_prev + b * U, dc + b * U, U);
      if (carry) copy_row(carry + b * Hh, dhb, Hh);
      return;
    }
    for (int64_t u = 0; u < U; u += kV) {
      const int64_t n = std::min(kV, U - u);
      const Vec g_h = Vec::loadu(dhb + u, n);
      switch (mode) {
        case Mode::kLstm: {
          const Vec i = Vec::loadu(ac + u, n), f = Vec::loadu(ac + U + u, n),
                    g = Vec::loadu(ac + 2 * U + u, n), o = Vec::loadu(ac + 3 * U + u, n);
          const Vec tc = Vec::loadu(c_cur + b * U + u, n).tanh();
          const Vec dct = Vec::loadu(dc + b * U + u, n) + g_h * o * (one - tc * tc);
          (dct * i * (one - i) * g).store(gx + u, n);
          (dct * f * (one - f) * Vec::loadu(c_prev + b * U + u, n)).store(gx + U + u, n);
          (dct * i * (one - g * g)).store(gx + 2 * U + u, n);
          (g_h * tc * o * (one - o)).store(gx + 3 * U + u, n);
          (dct * f).store(dc_prev + b * U + u, n);
          if (carry) zero.store(carry + b * Hh + u, n);
          break;
        }
        case Mode::kGru: {
          const Vec rg = Vec::loadu(ac + u, n), z = Vec::loadu(ac + U + u, n),
                    nn = Vec::loadu(ac + 2 * U + u, n), ghn = Vec::loadu(ac + 3 * U + u, n);
          const Vec h = Vec::loadu(h_prev + b * Hh + u, n);
          const Vec dn = g_h * (one - z) * (one - nn * nn);
          const Vec dz = g_h * (h - nn) * z * (one - z);
          const Vec dr = dn * ghn * rg * (one - rg);
          T* gr = dgh + b * GU;
          dr.store(gx + u, n);
          dz.store(gx + U + u, n);
          dn.store(gx + 2 * U + u, n);
          dr.store(gr + u, n);
          dz.store(gr + U + u, n);
          (dn * rg).store(gr + 2 * U + u, n);
          (g_h * z).store(carry + b * Hh + u, n);
          break;
        }
        case Mode::kRnnTanh: {
          const Vec h = Vec::loadu(ac + u, n);
          (g_h * (one - h * h)).store(gx + u, n);
          zero.store(carry + b * Hh + u, n);
          break;
        }
        case Mode::kRnnRelu: {
          const Vec h = Vec::loadu(ac + u, n);
          Vec::blendv(zero, g_h, h > zero).store(gx + u, n);
          zero.store(carry + b * Hh + u, n);
          break;
        }
      }
    }
  });
}

void cell_forward(const Config& cfg, const CellForward& a) {
  AT_DISPATCH_FLOATING_TYPES(a.gx.scalar_type(), "cudnn_rnn_cell_forward",
                             [&] { cell_forward_typed<scalar_t>(cfg, a); });
}

void cell_backward(const Config& cfg, const CellBackward& a) {
  AT_DISPATCH_FLOATING_TYPES(a.dgx.scalar_type(), "cudnn_rnn_cell_backward",
                             [&] { cell_backward_typed<scalar_t>(cfg, a); });
}

constexpr CellKernels kCpuCells{&cell_forward, &cell_backward};

ForwardResult cudnn_rnn_v3_cpu(const at::Tensor& input, const at::Tensor& input_h,
                               const at::Tensor& input_c, const at::Tensor& params,
                               const at::Tensor& sequence_lengths, c10::string_view rnn_mode,
                               c10::string_view input_mode, c10::string_view direction,
                               double dropout, int64_t seed, int64_t seed2, int64_t num_proj,
                               bool is_training, bool time_major) {
  return forward(input, input_h, input_c, params, sequence_lengths, rnn_mode, input_mode,
                 direction, dropout, seed, seed2, num_proj, is_training, time_major, kCpuCells);
}

BackwardResult cudnn_rnn_backprop_v3_cpu(
    const at::Tensor& input, const at::Tensor& input_h, const at::Tensor& input_c,
    const at::Tensor& params, const at::Tensor& sequence_lengths, const at::Tensor& output,
    const at::Tensor& output_h, const at::Tensor& output_c, const at::Tensor& output_backprop,
    const at::Tensor& output_h_backprop, const at::Tensor& output_c_backprop,
    const at::Tensor& reserve_space, const at::Tensor& host_reserved, c10::string_view rnn_mode,
    c10::string_view input_mode, c10::string_view direction, double dropout, int64_t seed,
    int64_t seed2, int64_t num_proj, bool time_major) {
  return backward(input, input_h, input_c, params, sequence_lengths, output, output_h, output_c,
                  output_backprop, output_h_backprop, output_c_backprop, reserve_space,
                  host_reserved, rnn_mode, input_mode, direction, dropout, seed, seed2, num_proj,
                  time_major, kCpuCells);
}

}  // namespace

TORCH_LIBRARY_IMPL(tfgrads, CPU, m) {
  m.impl("cudnn_rnn_v3", &cudnn_rnn_v3_cpu);
  m.impl("cudnn_rnn_backprop_v3", &cudnn_rnn_backprop_v3_cpu);
  m.impl("cudnn_rnn_canonical_to_params_v2", &canonical_to_params);
  m.impl("cudnn_rnn_params_to_canonical_v2", &params_to_canonical);
}

}  // namespace cudnn_rnn
}  // namespace torch_tfgrads
