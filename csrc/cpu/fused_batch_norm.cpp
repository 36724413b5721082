// CPU kernels of fused_batch_norm_v3 / fused_batch_norm_grad_v3 (TF's Eigen-kernel semantics).
//
// Design:
// * Both physical layouts are computed on in place (common/channel_layout.h): channels-last
//   vectorises across C within a row, channels-first vectorises along the contiguous spatial
//   plane. No transposing copies.
// * Statistics: the data is cut into cache-sized chunks; each chunk gets an exact two-pass
//   (mean, then sum of squared deviations about that mean) while it is hot in cache, and the
//   chunks are merged in double with Chan's formula. One pass over memory, no E[x^2]-E[x]^2
//   cancellation, deterministic (the chunking does not depend on the thread count).
// * Half/bfloat16 are widened to float in registers; every accumulation is in float (double
//   for float64 x), chunk totals in double.
//
// Files: fused_batch_norm_stats.cpp (the statistics), fused_batch_norm_forward.cpp,
// fused_batch_norm_grad.cpp, fused_batch_norm_cpu.h (what they share); this file registers the
// ops.
#include <torch/library.h>

#include "cpu/fused_batch_norm_cpu.h"

namespace torch_tfgrads {

TORCH_LIBRARY_IMPL(tfgrads, CPU, m) {
  m.impl("fused_batch_norm_v3", &bn_cpu::fused_batch_norm_v3_cpu);
  m.impl("fused_batch_norm_grad_v3", &bn_cpu::fused_batch_norm_grad_v3_cpu);
}

}  // namespace torch_tfgrads
