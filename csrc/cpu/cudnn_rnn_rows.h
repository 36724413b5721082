// The fused steps of the CudnnRNN family where oneDNN's BRGEMM path does not run (other
// dtypes, no BRGEMM in ATen or on this CPU, TFGRADS_DISABLE_BRGEMM=1, units the BRGEMM blocks
// do not divide): each thread owns batch rows and runs every step for them, the step's GEMM on
// the register tiles of small_gemm.h (weights packed once per call) then the rows' cells. Rows are
// independent through the recurrence, so there is no barrier and no parallel region per step,
// where the per-step driver loop pays both, twice per step, plus the dispatch of its ops.
// Float32 and float64, no projection; false where it does not apply (the driver's loop runs).
#pragma once

#include "common/cudnn_rnn.h"

namespace torch_tfgrads {
namespace cudnn_rnn {

bool rows_forward_direction(const Config& cfg, const DirectionForward& d);
bool rows_backward_direction(const Config& cfg, const DirectionBackward& d);
// CellKernels::directions_in_turn for the tiles: a direction's weights above
// rnn_directions_in_turn_above_bytes (cpu/isa.h) and rows enough for every thread.
bool rows_directions_in_turn(const Config& cfg, int64_t layer, const at::Tensor& like);
// Whether a direction goes to the tiles before BRGEMM is tried: the threads share it (rows
// enough for each) and its W and R (W undefined: R alone) take at most
// rnn_tiles_before_brgemm_up_to_bytes (cpu/isa.h).
bool rows_before_brgemm(const Config& cfg, const at::Tensor& W, const at::Tensor& R);
// The weight gradients of CellKernels::weight_grads on the same tiles (float32).
bool tiled_weight_grads(const at::Tensor& x, const at::Tensor& h0, const at::Tensor& h,
                        const at::Tensor& dg, const at::Tensor& gW, const at::Tensor& gR,
                        const at::Tensor& gb);

}  // namespace cudnn_rnn
}  // namespace torch_tfgrads
