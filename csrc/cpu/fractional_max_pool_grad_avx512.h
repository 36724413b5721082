// FractionalMaxPoolGrad's float kernel in 16-lane AVX-512 registers, for CPUs that have
// AVX-512 and channel counts that are a multiple of 16. The rest of the extension is built for
// AVX2; this kernel alone is compiled for AVX-512 (function-level target) and chosen at run
// time: its argmax sweeps compare into mask registers and select with masked moves (AVX2: a
// compare, then a blend) on twice the lanes, and its 32 registers hold two cells' sweeps, or
// a cell's argmaxes and dy across the gather's columns.
//
// The argmax search: TF's recomputed maximum is a VMAXPS chain that is checked against
// orig_output, and where they are equal TF's argmax (the first maximum in scan order) is the
// first element equal to orig_output, which a reverse sweep finds without a compare-select
// chain. Each dx element adds its dy contributions in TF's cell order starting from 0, so dx
// is bit-identical to MaxGradPass's (tests/test_fractional_pool.py runs both and compares the
// bits). Overlapping cells keep this argmax-then-gather scheme here: the 8-lane kernel's one
// pass (fractional_max_pool_grad_one_pass.h) took 1.2-1.6x its time in the benchmark's
// timing on an AVX-512 Zen 4 host (docs/perf-notes/fractional_pool.md).
#pragma once

#include <cstdint>

#include "common/fractional_pool.h"

namespace torch_tfgrads {
namespace fracpool {

// Construct and run only where avx512_enabled() (cpu/isa.h).
struct MaxGradAvx512 {
  // x: orig_input with channels contiguous (strides sN, sH, sW); y, dy: orig_output and
  // out_backprop, contiguous NHWC; dx: the contiguous NHWC result. plan.C % 16 == 0.
  // stream: non-temporal stores (dx 64-byte aligned, large).
  MaxGradAvx512(const float* x, int64_t sN, int64_t sH, int64_t sW, const float* y, const float* dy,
                float* dx, const GradPlan& plan, bool stream);

  // Disjoint cells: cell row i of image b, all channels. False: an orig_output mismatch.
  bool disjoint_row(int64_t b, int64_t i) const;
  // Overlapping cells: image b, channels [d0, d1) (multiples of 16), the band of cell rows
  // [i0, i1) (AxisPlan::band_start). ring: ring_size() floats.
  int64_t ring_size() const { return 2 * OW * 64 + 16; }
  bool overlapping_block(int64_t b, int64_t d0, int64_t d1, int64_t i0, int64_t i1,
                         float* ring) const;

  const float* x;
  int64_t sN, sH, sW;
  const float *y, *dy;
  float* dx;
  const GradPlan& g;
  int64_t H, W, C, OH, OW;
  int64_t cw_max;  // widest cell; the position of (h, w) in a cell is h * cw_max + w
  bool stream;
};

}  // namespace fracpool
}  // namespace torch_tfgrads
