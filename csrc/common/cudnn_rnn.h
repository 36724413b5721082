// The CudnnRNN family (docs/ops/cudnn_rnn.md): configuration, argument
// checks, the opaque params layout and the device-independent driver of the forward and
// backward passes. The driver does the GEMMs with ATen (MKL/oneDNN on CPU, cuBLAS on CUDA) and
// calls a per-device fused cell kernel once per time step (csrc/cpu/cudnn_rnn_cell.h,
// csrc/cuda/cudnn_rnn.cu).
//
// Internals are time-major: a batch-major input is transposed once on entry and the output
// once on exit (the recurrence reads one [B, *] slab per step, which must be contiguous for
// the step GEMM). Half types run in float32 (TF does the same for bfloat16); their reserve
// space holds float32 values reinterpreted as the input dtype.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/string_view.h>

#include <cstdint>
#include <tuple>
#include <vector>

namespace torch_tfgrads {
namespace cudnn_rnn {

enum class Mode { kRnnRelu, kRnnTanh, kLstm, kGru };

// Everything fixed by the attrs and the shapes. Notation: L layers, D directions,
// T steps, B batch, I input size, U units, P projection (0: none), Hh = P ? P : U.
struct Config {
  Mode mode = Mode::kLstm;
  int64_t G = 4;            // gates per cell
  bool skip_input = false;  // resolved: auto_select is skip_input when I == U
  int64_t L = 1, D = 1, T = 0, B = 0, I = 0, U = 0, P = 0, Hh = 0;
  bool time_major = true;
  // sequence_lengths read once to the host (int64 [B]) by check_forward; undefined otherwise.
  at::Tensor host_lengths;

  int64_t GU() const { return G * U; }
  // Width of layer `layer`'s input: I for layer 0, D*Hh above it.
  int64_t in_width(int64_t layer) const { return layer == 0 ? I : D * Hh; }
  bool has_input_weights(int64_t layer) const { return !(skip_input && layer == 0); }
  // Saved activations per step and batch row: LSTM i,f,g,o; GRU r,z,n and R_h h + bR_h (the
  // reset gate's operand); plain RNN the new h.
  int64_t act_width() const { return mode == Mode::kLstm || mode == Mode::kGru ? 4 * U : U; }
  bool lstm() const { return mode == Mode::kLstm; }
};

Mode parse_mode(const char* op, c10::string_view rnn_mode);
int64_t gates_of(Mode mode);
int64_t parse_dirs(const char* op, c10::string_view direction);
// Returns true for skip_input (auto_select resolved with input_size == num_units).
bool parse_skip_input(const char* op, c10::string_view input_mode, int64_t input_size,
                      int64_t num_units);

// Config from the size attrs of the params-conversion ops (num_layers, num_units, input_size).
Config config_from_sizes(const char* op, int64_t num_layers, int64_t num_units, int64_t input_size,
                         c10::string_view rnn_mode, c10::string_view input_mode,
                         c10::string_view direction, int64_t num_proj);

// CudnnRNNParamsSize: number of elements of the opaque buffer.
int64_t params_size(const char* op, const Config& cfg);

// Views into a flat opaque params buffer (or its gradient), for pseudo-layer p = layer*D + dir:
// W = [W_0; ..; W_{G-1}] as [G*U, in] (undefined for skip_input's layer 0), R as [G*U, Hh],
// bW and bR as [G*U], Wp as [P, U] (undefined without projection). Layout (TF's and cuDNN's
// canonical order, docs/ops/cudnn_rnn.md): per
// pseudo-layer the gate input matrices, the gate recurrent matrices, the input biases, the
// recurrent biases, then the projection.
struct LayerParams {
  at::Tensor W, R, bW, bR, Wp;
};
std::vector<LayerParams> layer_params(const Config& cfg, const at::Tensor& flat);

// Canonical shapes in TF's ParamsToCanonical order (weights, biases).
// How many tensors the canonical lists hold, without building them.
int64_t canonical_weight_count(const Config& cfg);
int64_t canonical_bias_count(const Config& cfg);
std::vector<std::vector<int64_t>> canonical_weight_shapes(const Config& cfg);
std::vector<std::vector<int64_t>> canonical_bias_shapes(const Config& cfg);

// Reserve space, in elements of the compute dtype: per pseudo-layer the saved activations
// [T,B,act_width], the cell states [T,B,U] (LSTM) and hidden states [T,B,Hh] after every
// step (in processing order: the reverse direction's step s is time len-1-s); per layer below
// the top its output as fed to the next layer [T,B,D*Hh] and, with dropout, the dropout
// scale mask [T,B,D*Hh].
int64_t reserve_elements(const Config& cfg, bool with_dropout);

// Forward-op checks (TF's ExtractForwardInput, in its order with its messages, plus the checks
// TF lacks) -> the config.
Config check_forward(const char* op, const at::Tensor& input, const at::Tensor& input_h,
                     const at::Tensor& input_c, const at::Tensor& params,
                     const at::Tensor& sequence_lengths, c10::string_view rnn_mode,
                     c10::string_view input_mode, c10::string_view direction, double dropout,
                     int64_t num_proj, bool time_major);

// The params conversions (device-independent; registered per device).
at::Tensor canonical_to_params(int64_t num_layers, int64_t num_units, int64_t input_size,
                               at::TensorList weights, at::TensorList biases,
                               c10::string_view rnn_mode, c10::string_view input_mode,
                               c10::string_view direction, int64_t num_proj);
std::tuple<std::vector<at::Tensor>, std::vector<at::Tensor>> params_to_canonical(
    int64_t num_layers, int64_t num_units, int64_t input_size, const at::Tensor& params,
    int64_t num_params_weights, int64_t num_params_biases, c10::string_view rnn_mode,
    c10::string_view input_mode, c10::string_view direction, int64_t num_proj);

// ---- Per-device cell kernels ---------------------------------------------------------------
// One time step of one pseudo-layer for all B rows, in the compute dtype, all [B, *] row-major.
// Row b is active when `lens` is undefined or step < lens[b]; inactive rows keep their state.
struct CellForward {
  at::Tensor gx;      // [B, GU]: W x_t + bW (skip_input: x_t + bW)
  at::Tensor gh;      // [B, GU]: R h + bR
  at::Tensor h_prev;  // [B, Hh]
  at::Tensor c_prev;  // [B, U] (LSTM)
  at::Tensor lens;    // [B] int32 on the device, or undefined: every row active
  int64_t step = 0;
  at::Tensor acts;   // [B, act_width] or undefined (inference)
  at::Tensor c_out;  // [B, U] (LSTM), inactive rows: c_prev
  // [B, U]: the new h (inactive rows: h_prev); with projection o*tanh(c') for every row.
  at::Tensor h_out;
  bool projected = false;
};
// Gradients of one step given the gradient w.r.t. the cell's new h (with projection: w.r.t.
// o*tanh(c')) and w.r.t. its new c. Inactive rows: zero gate gradients, dc and dh pass through.
struct CellBackward {
  at::Tensor acts, c_cur, c_prev, h_prev;  // saved state of this step (c: LSTM, h_prev: GRU)
  at::Tensor lens;
  int64_t step = 0;
  at::Tensor dh;       // [B, U or Hh]
  at::Tensor dc;       // [B, U] (LSTM): gradient w.r.t. this step's c
  at::Tensor dgx;      // out [B, GU]: d pre-activation, input path
  at::Tensor dgh;      // out [B, GU]: d pre-activation, recurrent path (GRU; else == dgx)
  at::Tensor dc_prev;  // out [B, U] (LSTM)
  // out [B, Hh]: the part of dh_prev not through R (GRU: dh*z; inactive rows: dh); undefined
  // with projection (the driver carries it in projected space).
  at::Tensor dh_carry;
};
// All T steps of one direction at once (processing order), for devices that fuse the step's
// GEMM with its cell (no projection). The driver falls back to the per-step calls when the
// hook is absent or returns false.
struct DirectionForward {
  at::Tensor gx;            // [T, B, GU] projected inputs, or undefined: then x, W, bW
  at::Tensor x, W, bW;      // [T, B, in_width], [GU, in_width], [GU]
  at::Tensor R, bR;         // [GU, Hh], [GU]
  at::Tensor h0, c0, lens;  // [B, Hh], [B, U] (LSTM), [B] int32 or undefined
  at::Tensor acts, c, h;    // out: [T, B, act_width] (or undefined), [T, B, U], [T, B, Hh]
};
struct DirectionBackward {
  at::Tensor acts, c, h, h0, c0, R, lens;  // as saved by the forward
  at::Tensor dy;                           // [T, B, Hh], zero past each length
  at::Tensor dh_n, dc_n;                   // [B, Hh], [B, U]
  at::Tensor dgx, dgh;                     // out [T, B, GU] (dgh: GRU, else == dgx)
  at::Tensor dh0, dc0;                     // out [B, Hh], [B, U]
  // Optional: the layer input's gradient dx = dG W ([T, B, in_width], processing order) may be
  // computed step by step as well; *dx_done tells whether it was.
  at::Tensor W, dx;
  bool* dx_done = nullptr;
};
struct CellKernels {
  void (*forward)(const Config&, const CellForward&);
  void (*backward)(const Config&, const CellBackward&);
  bool (*forward_direction)(const Config&, const DirectionForward&) = nullptr;
  bool (*backward_direction)(const Config&, const DirectionBackward&) = nullptr;
  // Optional GEMM for the batched products: out (+)= a @ b (+ bias on every row), 2-D, any
  // strides for a and b; false when it does not apply (the driver then uses ATen).
  bool (*matmul)(const at::Tensor& a, const at::Tensor& b, const at::Tensor& bias,
                 const at::Tensor& out, bool accumulate) = nullptr;
  // Optional: a layer's weight and bias gradients when the input and recurrent weights see the
  // same gate gradients dG [T, B, GU] (all modes but GRU): gW = dG^T x, gR = dG^T h_prev
  // (h_prev: h0, then h of steps 0..T-2), gb = the column sums of dG; false when it does not
  // apply.
  bool (*weight_grads)(const at::Tensor& x, const at::Tensor& h0, const at::Tensor& h,
                       const at::Tensor& dg, const at::Tensor& gW, const at::Tensor& gR,
                       const at::Tensor& gb) = nullptr;
  // Optional: true where the two directions of a bidirectional layer should run one after the
  // other, each over all the threads, although the driver would give each its own thread (two
  // CPU threads; see for_each_direction in cudnn_rnn_driver.cpp). `like`: the layer's input.
  bool (*directions_in_turn)(const Config&, int64_t layer, const at::Tensor& like) = nullptr;
};

// out (+)= a @ b (+ bias) through the device's GEMM hook, or ATen.
void matmul_into(const CellKernels& k, const at::Tensor& out, const at::Tensor& a,
                 const at::Tensor& b, bool accumulate, const at::Tensor& bias = at::Tensor());

using ForwardResult = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;
ForwardResult forward(const at::Tensor& input, const at::Tensor& input_h, const at::Tensor& input_c,
                      const at::Tensor& params, const at::Tensor& sequence_lengths,
                      c10::string_view rnn_mode, c10::string_view input_mode,
                      c10::string_view direction, double dropout, int64_t seed, int64_t seed2,
                      int64_t num_proj, bool is_training, bool time_major,
                      const CellKernels& cells);

using BackwardResult = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;
BackwardResult backward(const at::Tensor& input, const at::Tensor& input_h,
                        const at::Tensor& input_c, const at::Tensor& params,
                        const at::Tensor& sequence_lengths, const at::Tensor& output,
                        const at::Tensor& output_h, const at::Tensor& output_c,
                        const at::Tensor& output_backprop, const at::Tensor& output_h_backprop,
                        const at::Tensor& output_c_backprop, const at::Tensor& reserve_space,
                        const at::Tensor& host_reserved, c10::string_view rnn_mode,
                        c10::string_view input_mode, c10::string_view direction, double dropout,
                        int64_t seed, int64_t seed2, int64_t num_proj, bool time_major,
                        const CellKernels& cells);

// The two op kernels of one device, bound to that device's cell kernels: register
// `&forward_op<kCells>` / `&backward_op<kCells>` (ATen's own ops guard their devices, and so do
// the cell kernels).
template <const CellKernels& cells>
ForwardResult forward_op(const at::Tensor& input, const at::Tensor& input_h,
                         const at::Tensor& input_c, const at::Tensor& params,
                         const at::Tensor& sequence_lengths, c10::string_view rnn_mode,
                         c10::string_view input_mode, c10::string_view direction, double dropout,
                         int64_t seed, int64_t seed2, int64_t num_proj, bool is_training,
                         bool time_major) {
  return forward(input, input_h, input_c, params, sequence_lengths, rnn_mode, input_mode, direction,
                 dropout, seed, seed2, num_proj, is_training, time_major, cells);
}

template <const CellKernels& cells>
BackwardResult backward_op(const at::Tensor& input, const at::Tensor& input_h,
                           const at::Tensor& input_c, const at::Tensor& params,
                           const at::Tensor& sequence_lengths, const at::Tensor& output,
                           const at::Tensor& output_h, const at::Tensor& output_c,
                           const at::Tensor& output_backprop, const at::Tensor& output_h_backprop,
                           const at::Tensor& output_c_backprop, const at::Tensor& reserve_space,
                           const at::Tensor& host_reserved, c10::string_view rnn_mode,
                           c10::string_view input_mode, c10::string_view direction, double dropout,
                           int64_t seed, int64_t seed2, int64_t num_proj, bool time_major) {
  return backward(input, input_h, input_c, params, sequence_lengths, output, output_h, output_c,
                  output_backprop, output_h_backprop, output_c_backprop, reserve_space,
                  host_reserved, rnn_mode, input_mode, direction, dropout, seed, seed2, num_proj,
                  time_major, cells);
}

}  // namespace cudnn_rnn
}  // namespace torch_tfgrads
