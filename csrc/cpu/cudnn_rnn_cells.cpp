// A host run of the CudnnRNN CUDA kernels' per-element bodies, for the CPU tests only
// (tfgrads_test::cudnn_rnn_host_cells): the shared driver (common/cudnn_rnn_driver.cpp) with
// cell kernels that loop over (batch row, unit) and call common/cudnn_rnn_cells.h's
// cell_forward_element / cell_backward_element, exactly what each CUDA thread calls. Runs the
// forward and, in training, the backward with the given output gradients; returns [output,
// output_h, output_c] and, in training, [input, input_h, input_c, params] backprop after them.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <vector>

#include "common/cudnn_rnn.h"
#include "common/cudnn_rnn_cells.h"

namespace torch_tfgrads {
namespace cudnn_rnn {
namespace {

constexpr int64_t kGrain = 1024;

void host_forward(const Config& cfg, const CellForward& a) {
  AT_DISPATCH_FLOATING_TYPES(a.gx.scalar_type(), "cudnn_rnn_host_cells", [&] {
    const auto args = cells::step_args<scalar_t>(cfg, a);
    at::parallel_for(0, cfg.B * cfg.U, kGrain, [&](int64_t k0, int64_t k1) {
      for (int64_t k = k0; k < k1; ++k) cells::cell_forward_element(cfg.mode, args, k);
    });
  });
}

void host_backward(const Config& cfg, const CellBackward& a) {
  AT_DISPATCH_FLOATING_TYPES(a.dgx.scalar_type(), "cudnn_rnn_host_cells", [&] {
    const auto args = cells::step_args<scalar_t>(cfg, a);
    at::parallel_for(0, cfg.B * cfg.U, kGrain, [&](int64_t k0, int64_t k1) {
      for (int64_t k = k0; k < k1; ++k) cells::cell_backward_element(cfg.mode, args, k);
    });
  });
}

constexpr CellKernels kHostCells{&host_forward, &host_backward};

std::vector<at::Tensor> host_cells(const at::Tensor& input, const at::Tensor& input_h,
                                   const at::Tensor& input_c, const at::Tensor& params,
                                   const at::Tensor& sequence_lengths,
                                   const at::Tensor& output_backprop,
                                   const at::Tensor& output_h_backprop,
                                   const at::Tensor& output_c_backprop, c10::string_view rnn_mode,
                                   c10::string_view direction, int64_t num_proj, bool is_training) {
  const auto [y, hy, cy, reserve, host_reserved] = forward(
      input, input_h, input_c, params, sequence_lengths, rnn_mode, "linear_input", direction, 0.0,
      0, 0, num_proj, is_training, true, kHostCells);
  if (!is_training) return {y, hy, cy};
  const auto [dx, dh, dc, dp] = backward(input, input_h, input_c, params, sequence_lengths, y, hy,
                                         cy, output_backprop, output_h_backprop, output_c_backprop,
                                         reserve, host_reserved, rnn_mode, "linear_input",
                                         direction, 0.0, 0, 0, num_proj, true, kHostCells);
  return {y, hy, cy, dx, dh, dc, dp};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(tfgrads_test, m) {
  m.def(
      "cudnn_rnn_host_cells(Tensor input, Tensor input_h, Tensor input_c, Tensor params, "
      "Tensor sequence_lengths, Tensor output_backprop, Tensor output_h_backprop, "
      "Tensor output_c_backprop, str rnn_mode, str direction, int num_proj, bool is_training) "
      "-> Tensor[]");
}

TORCH_LIBRARY_IMPL(tfgrads_test, CPU, m) { m.impl("cudnn_rnn_host_cells", &host_cells); }

}  // namespace cudnn_rnn
}  // namespace torch_tfgrads
