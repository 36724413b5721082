// The CudnnRNN family's float32 fast path on oneDNN's BRGEMM micro-kernel (cudnn_rnn_brgemm.cpp),
// where ATen's cpublas has it (CPUBLAS_BRGEMM_F32F32F32): the fused steps of a direction and
// the driver's batched GEMMs. Each returns false where it does not apply (the driver then uses
// the per-step cells and ATen's GEMMs).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/native/CPUBlas.h>

#include "common/cudnn_rnn.h"

#ifdef CPUBLAS_BRGEMM_F32F32F32
namespace torch_tfgrads {
namespace cudnn_rnn {

bool forward_direction(const Config& cfg, const DirectionForward& d);
bool backward_direction(const Config& cfg, const DirectionBackward& d);
bool cpu_matmul(const at::Tensor& a, const at::Tensor& b, const at::Tensor& bias,
                const at::Tensor& out, bool accumulate);
bool cpu_weight_grads(const at::Tensor& x, const at::Tensor& h0, const at::Tensor& h,
                      const at::Tensor& dg, const at::Tensor& gW, const at::Tensor& gR,
                      const at::Tensor& gb);
// Whether the two directions of a bidirectional layer run one after the other on a two-thread
// CPU (rnn_directions_in_turn_above_bytes in cpu/isa.h), where the fused steps apply.
bool directions_in_turn(const Config& cfg, int64_t layer, const at::Tensor& like);

}  // namespace cudnn_rnn
}  // namespace torch_tfgrads
#endif
