// CPU kernels of the CudnnRNN family: the fused per-step cell (gate activations, state update,
// saved activations) and its gradient, vectorised over units with at::vec and parallel over
// batch rows; the GEMMs and the step loop are in csrc/common/cudnn_rnn_driver.cpp.
// The per-step cells are in cudnn_rnn_cell.h; the float32 fast path on oneDNN's BRGEMM
// (fused steps and batched GEMMs) in cudnn_rnn_brgemm.cpp.
#include <ATen/Dispatch.h>
#include <ATen/Functions.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>

#include "common/cudnn_rnn.h"
#include "cpu/cudnn_rnn_brgemm.h"
#include "cpu/cudnn_rnn_cell.h"
#include "cpu/cudnn_rnn_rows.h"
#include "cpu/isa.h"
#include "cpu/transpose.h"

namespace torch_tfgrads {
namespace cudnn_rnn {
namespace {

template <typename T>
void cell_forward_typed(const Config& cfg, const CellForward& a) {
  const int64_t U = cfg.U, GU = cfg.GU(), Hh = cfg.Hh, AW = cfg.act_width();
  const T *gx = ptr<T>(a.gx), *gh = ptr<T>(a.gh), *h_prev = ptr<T>(a.h_prev);
  const T* c_prev = ptr<T>(a.c_prev);
  const int* lens = a.lens.defined() ? a.lens.data_ptr<int>() : nullptr;
  T *acts = mut<T>(a.acts), *c_out = mut<T>(a.c_out), *h_out = mut<T>(a.h_out);
  for_rows(cfg.B, GU, [&](int64_t b) {
    const bool lstm = cfg.mode == Mode::kLstm;
    FwdSeg<T> seg{gx + b * GU,
                  U,
                  gh + b * GU,
                  U,
                  nullptr,
                  U,
                  lstm ? c_prev + b * U : nullptr,
                  h_prev + b * Hh,
                  lstm ? c_out + b * U : nullptr,
                  h_out + b * U,
                  acts ? acts + b * AW : nullptr};
    with_mode(cfg.mode, [&](auto m) {
      forward_cell<decltype(m)::value>(seg, U, !lens || a.step < lens[b], a.projected);
    });
  });
}

template <typename T>
void cell_backward_typed(const Config& cfg, const CellBackward& a) {
  const int64_t U = cfg.U, GU = cfg.GU(), Hh = cfg.Hh, AW = cfg.act_width();
  const int* lens = a.lens.defined() ? a.lens.data_ptr<int>() : nullptr;
  const bool lstm = cfg.mode == Mode::kLstm, gru = cfg.mode == Mode::kGru;
  for_rows(cfg.B, GU, [&](int64_t b) {
    // with projection dh is [B, U]; otherwise Hh == U
    BwdSeg<T> seg{ptr<T>(a.acts) + b * AW,
                  U,
                  lstm ? ptr<T>(a.c_cur) + b * U : nullptr,
                  lstm ? ptr<T>(a.c_prev) + b * U : nullptr,
                  ptr<T>(a.h_prev) + b * Hh,
                  ptr<T>(a.dh) + b * U,
                  lstm ? ptr<T>(a.dc) + b * U : nullptr,
                  mut<T>(a.dgx) + b * GU,
                  gru ? mut<T>(a.dgh) + b * GU : nullptr,
                  lstm ? mut<T>(a.dc_prev) + b * U : nullptr,
                  a.dh_carry.defined() ? mut<T>(a.dh_carry) + b * Hh : nullptr};
    with_mode(cfg.mode, [&](auto m) {
      backward_cell<decltype(m)::value>(seg, U, !lens || a.step < lens[b]);
    });
  });
}

// [gW | gR | gb]^T = [x | h_prev | 1]^T dG as one GEMM through ATen (MKL's sgemm on x86),
// which reads the [T*B, I + Hh + 1] operand transposed in place: dG is read once for all three,
// where the driver's own fallback runs two GEMMs, a concatenation of h_prev and a column sum.
bool aten_weight_grads(const at::Tensor& x, const at::Tensor& h0, const at::Tensor& h,
                       const at::Tensor& dg, const at::Tensor& gW, const at::Tensor& gR,
                       const at::Tensor& gb) {
  if (tiled_weight_grads(x, h0, h, dg, gW, gR, gb)) return true;
  const int64_t T = h.size(0), B = h.size(1), Hh = h.size(2), I = x.size(2), GU = dg.size(2);
  const int64_t K = T * B, M = I + Hh + 1;
  if (K == 0) return false;
  at::Tensor X = at::empty({K, M}, dg.options());
  X.narrow(1, 0, I).copy_(x.reshape({K, I}));
  at::Tensor Xh = X.narrow(1, I, Hh);
  Xh.narrow(0, 0, B).copy_(h0);
  Xh.narrow(0, B, K - B).copy_(h.reshape({K, Hh}).narrow(0, 0, K - B));
  X.select(1, M - 1).fill_(1);
  const at::Tensor tmp = at::mm(X.t(), dg.reshape({K, GU}));  // [M, GU]
  auto transpose_into = [&](const at::Tensor& dst, int64_t row0, int64_t rows) {
    const at::Tensor src = tmp.narrow(0, row0, rows);
    if (dst.scalar_type() == at::kFloat && dst.stride(1) == 1)
      transpose(rows, GU, src.data_ptr<float>(), GU, dst.data_ptr<float>(), dst.stride(0));
    else
      dst.copy_(src.t());
  };
  transpose_into(gW, 0, I);
  transpose_into(gR, I, Hh);
  gb.copy_(tmp.select(0, M - 1));
  return true;
}

void cell_forward(const Config& cfg, const CellForward& a) {
  AT_DISPATCH_FLOATING_TYPES(a.gx.scalar_type(), "cudnn_rnn_cell_forward",
                             [&] { cell_forward_typed<scalar_t>(cfg, a); });
}

void cell_backward(const Config& cfg, const CellBackward& a) {
  AT_DISPATCH_FLOATING_TYPES(a.dgx.scalar_type(), "cudnn_rnn_cell_backward",
                             [&] { cell_backward_typed<scalar_t>(cfg, a); });
}

// The fused steps on oneDNN's BRGEMM at every batch size (float32; the step cells with ATen's
// GEMMs for the other types, or where BRGEMM is unavailable or disabled), with the batched GEMMs
// on BRGEMM too, or through ATen (rnn_batched_gemms_on_brgemm in cpu/isa.h). The step cells
// used to take over from 32 batch rows per thread, a rule measured on an AVX2 host only; on an
// AVX-512 host the fused steps were faster at those sizes too (docs/perf-notes/cudnn_rnn.md).
// A direction's fused steps: on BRGEMM where it runs, otherwise rows owned per thread on the
// register tiles (cudnn_rnn_rows.h); false sends the driver to its per-step loop. On the 8-lane
// path the tiles come first for a direction the threads share whose weights are small
// (rows_before_brgemm, rnn_tiles_before_brgemm_up_to_bytes in cpu/isa.h).
bool steps_forward(const Config& cfg, const DirectionForward& d) {
#ifdef CPUBLAS_BRGEMM_F32F32F32
  if (!rows_before_brgemm(cfg, d.W, d.R) && forward_direction(cfg, d)) return true;
#endif
  return rows_forward_direction(cfg, d);
}

bool steps_backward(const Config& cfg, const DirectionBackward& d) {
#ifdef CPUBLAS_BRGEMM_F32F32F32
  if (!rows_before_brgemm(cfg, d.W, d.R) && backward_direction(cfg, d)) return true;
#endif
  return rows_backward_direction(cfg, d);
}

// Whether a bidirectional layer's directions run one after the other, each over all threads:
// on BRGEMM's fused steps or on the tiles, by the same weight-size rule (cpu/isa.h).
bool directions_turn(const Config& cfg, int64_t layer, const at::Tensor& like) {
#ifdef CPUBLAS_BRGEMM_F32F32F32
  if (directions_in_turn(cfg, layer, like)) return true;
#endif
  return rows_directions_in_turn(cfg, layer, like);
}

#ifdef CPUBLAS_BRGEMM_F32F32F32
constexpr CellKernels kCpuCells{&cell_forward, &cell_backward,    &steps_forward,  &steps_backward,
                                &cpu_matmul,   &cpu_weight_grads, &directions_turn};
constexpr CellKernels kCpuCellsAtenGemms{&cell_forward,   &cell_backward, &steps_forward,
                                         &steps_backward, nullptr,        &aten_weight_grads,
                                         &directions_turn};
#else
constexpr CellKernels kCpuCells{&cell_forward, &cell_backward,     &steps_forward,  &steps_backward,
                                nullptr,       &aten_weight_grads, &directions_turn};
constexpr CellKernels kCpuCellsAtenGemms = kCpuCells;
#endif

ForwardResult cpu_forward(const at::Tensor& input, const at::Tensor& input_h,
                          const at::Tensor& input_c, const at::Tensor& params,
                          const at::Tensor& sequence_lengths, c10::string_view rnn_mode,
                          c10::string_view input_mode, c10::string_view direction, double dropout,
                          int64_t seed, int64_t seed2, int64_t num_proj, bool is_training,
                          bool time_major) {
  auto op = rnn_batched_gemms_on_brgemm() ? &forward_op<kCpuCells>
                                          : &forward_op<kCpuCellsAtenGemms>;
  return op(input, input_h, input_c, params, sequence_lengths, rnn_mode, input_mode, direction,
            dropout, seed, seed2, num_proj, is_training, time_major);
}

BackwardResult cpu_backward(const at::Tensor& input, const at::Tensor& input_h,
                            const at::Tensor& input_c, const at::Tensor& params,
                            const at::Tensor& sequence_lengths, const at::Tensor& output,
                            const at::Tensor& output_h, const at::Tensor& output_c,
                            const at::Tensor& output_backprop, const at::Tensor& output_h_backprop,
                            const at::Tensor& output_c_backprop, const at::Tensor& reserve_space,
                            const at::Tensor& host_reserved, c10::string_view rnn_mode,
                            c10::string_view input_mode, c10::string_view direction, double dropout,
                            int64_t seed, int64_t seed2, int64_t num_proj, bool time_major) {
  auto op = rnn_batched_gemms_on_brgemm() ? &backward_op<kCpuCells>
                                          : &backward_op<kCpuCellsAtenGemms>;
  return op(input, input_h, input_c, params, sequence_lengths, output, output_h, output_c,
            output_backprop, output_h_backprop, output_c_backprop, reserve_space, host_reserved,
            rnn_mode, input_mode, direction, dropout, seed, seed2, num_proj, time_major);
}

}  // namespace

TORCH_LIBRARY_IMPL(tfgrads, CPU, m) {
  m.impl("cudnn_rnn_v3", &cpu_forward);
  m.impl("cudnn_rnn_backprop_v3", &cpu_backward);
  m.impl("cudnn_rnn_canonical_to_params_v2", &canonical_to_params);
  m.impl("cudnn_rnn_params_to_canonical_v2", &params_to_canonical);
}

}  // namespace cudnn_rnn
}  // namespace torch_tfgrads
