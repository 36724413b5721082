// FractionalMaxPoolGrad on the CPU and its double backward (see fractional_pool.cpp for the
// family's design): MaxGradPass (fractional_max_pool_grad_pass.h) over tasks that never share
// an element. Float channels in whole 16-lane vectors take the AVX-512 kernel of
// fractional_max_pool_grad_avx512.cpp where the CPU has it.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <atomic>
#include <limits>
#include <memory>
#include <type_traits>
#include <vector>

#include "common/fractional_pool.h"
#include "cpu/fractional_max_pool_grad_avx512.h"
#include "cpu/fractional_max_pool_grad_pass.h"
#include "cpu/fractional_pool_cpu.h"
#include "cpu/isa.h"
#include "cpu/parallel.h"
#include "cpu/widen.h"

namespace torch_tfgrads {
namespace fracpool_cpu {
namespace {

// Bands per image of overlapping cells: the fewest that give the threads equal shares of the
// tasks to within 10% (whole images left a batch of one on one core, and three images on two
// threads took 1.3x the time of two bands each; docs/perf-notes/fractional_pool.md).
int64_t bands_per_image(int64_t images, int64_t threads, int64_t max_bands) {
  int64_t b = 1;
  for (; b < max_bands; ++b) {
    const int64_t tasks = images * b, share = (tasks + threads - 1) / threads;
    if (share * threads * 10 <= tasks * 11) break;
  }
  return b;
}

template <typename scalar_t>
void max_grad_kernel(const at::Tensor& x, const at::Tensor& y, const at::Tensor& dy, at::Tensor& dx,
                     const GradPlan& g, bool overlapping) {
  const int64_t OH = g.rows.cells, C = g.C;
  MaxGradPass<scalar_t> pass(x, g);
  pass.set_gradient(y, dy, dx);
  const bool stream = std::is_same_v<scalar_t, float> && C % 8 == 0 &&
                      reinterpret_cast<uintptr_t>(dx.const_data_ptr()) % 32 == 0 &&
                      worth_streaming(dx.numel() * 4);
  // Overlapping cells stream dx everywhere; disjoint cells only where the CPU has AVX-512 (the
  // AVX2 kernel runs there for channel counts that are not a multiple of 16, or when forced):
  // ordinary stores were the faster on a CPU without it (Zen 3), streaming as fast or faster on
  // one with it (Zen 4); docs/perf-notes/fractional_pool.md.
  pass.stream = stream && (overlapping || cpu_has_avx512());
  // Sequences that do not start at 0 or end at the input's size leave rows/columns that no
  // cell covers (and the pass never writes): their gradient is zero.
  if (!g.rows.covers_all() || !g.cols.covers_all()) dx.zero_();
  // Float channels in whole 16-lane vectors: the AVX-512 kernel where the CPU has it.
  std::unique_ptr<fracpool::MaxGradAvx512> wide;
  if constexpr (std::is_same_v<scalar_t, float>) {
    if (C % 16 == 0 && !pass.scalar_only && avx512_enabled())
      wide = std::make_unique<fracpool::MaxGradAvx512>(
          pass.x, pass.sN, pass.sH, pass.sW, pass.y, pass.dy, pass.dx, g,
          stream && reinterpret_cast<uintptr_t>(pass.dx) % 64 == 0);
  }
  std::atomic<bool> same{true};
  const int64_t cell_row = (g.H / OH + 1) * g.W * C;
  // Tasks are claimed a few at a time from a shared counter (parallel_claim), not split in
  // fixed slices: a core slowed by a neighbour no longer holds the others up at the end.
  if (!overlapping) {  // cells are disjoint: any cell row is its own task
    const int64_t tasks = g.N * OH;
    const int64_t chunk = std::max(grain_for(cell_row), tasks / (8 * at::get_num_threads()));
    parallel_claim(tasks, chunk, [&](auto&& claim) {
      for (int64_t begin, end; claim(begin, end);)
        for (int64_t t = begin; t < end; ++t)
          if (!(wide ? wide->disjoint_row(t / OH, t % OH) : pass.disjoint_row(t / OH, t % OH)))
            same = false;
      if (stream) stream_fence();
    });
  } else {
    // Boundaries are shared between cell rows: a task is an image, a block of channels and a
    // band of cell rows (AxisPlan::band_start). A band other than the first recomputes one cell
    // row's state or argmaxes, so images are split only as far as the threads' shares need.
    constexpr int64_t kBlock = 64;
    const int64_t blocks = (C + kBlock - 1) / kBlock, images = g.N * blocks;
    const int64_t bands = bands_per_image(images, at::get_num_threads(),
                                          wide || pass.banded() ? OH / 2 : 1);
    parallel_claim(images * bands, 1, [&](auto&& claim) {
      // the ring of the one pass or of the AVX-512 argmaxes, once per thread
      std::vector<acc_t<scalar_t>> ring(wide ? wide->ring_size() : pass.ring_size());
      for (int64_t t, end; claim(t, end);) {
#if defined(__SANITIZE_ADDRESS__)
        // Sanitizer builds (CI's second run of the suite): no task may read what another left
        // in the ring (a band starts from its own recomputed state).
        std::fill(ring.begin(), ring.end(), std::numeric_limits<acc_t<scalar_t>>::quiet_NaN());
#endif
        const int64_t band = t % bands, b = t / bands / blocks, d0 = t / bands % blocks * kBlock;
        const int64_t d1 = std::min(C, d0 + kBlock);
        const int64_t i0 = band * OH / bands, i1 = (band + 1) * OH / bands;
        bool ok;
        if constexpr (std::is_same_v<scalar_t, float>)
          ok = wide ? wide->overlapping_block(b, d0, d1, i0, i1, ring.data())
                    : pass.overlapping_block(b, d0, d1, i0, i1, ring.data());
        else
          ok = pass.overlapping_block(b, d0, d1, i0, i1, ring.data());
        if (!ok) same = false;
      }
      if (stream) stream_fence();
    });
  }
  TORCH_CHECK(same, "fractional_max_pool_grad: argument 'orig_output': ", fracpool::kOutputMismatch,
              " (orig_output is not the fractional max pool of orig_input with these sequences)");
}

// Double backward of the max gradient: out[b, i, j, d] = grad at the cell's argmax (the
// gradient's own argmax and tie rule). Whole channel vectors select branch-free over the
// cell's positions (straight-line per cell-row height and widest cell, as the gradient);
// other channels (and integers, and huge cells) one at a time with exact int64 positions.
template <typename scalar_t, int RH, int CW>
void select_argmax_row(const MaxGradPass<scalar_t>& p, const scalar_t* gin, scalar_t* out,
                       int64_t b, int64_t i, int64_t dv) {
  using A = acc_t<scalar_t>;
  using Wd = Widen<scalar_t, A>;
  using Vec = Vectorized<A>;
  constexpr int64_t L = Vec::size();
  const GradPlan& g = p.g;
  const int64_t r0 = g.rows.start[i], rh = RH > 0 ? RH : g.rows.end[i] - r0 + 1;
  const int64_t C = p.C, grow = p.W * C, stride = CW > 0 ? CW : p.cw_max;
  for (int64_t j = 0; j < p.OW; ++j) {
    const int64_t c0 = g.cols.start[j], last = g.cols.end[j] - c0;
    const int64_t cw = CW > 0 ? CW : last + 1;
    const scalar_t* xc = p.x + b * p.sN + r0 * p.sH + c0 * p.sW;
    const scalar_t* gc = gin + ((b * p.H + r0) * p.W + c0) * C;
    scalar_t* o = out + ((b * p.OH + i) * p.OW + j) * C;
    for (int64_t d = 0; !std::is_integral_v<scalar_t> && d < dv; d += L) {
      Vec best, at, v(A(0));
      MaxGradPass<scalar_t>::template cell_argmax<RH, CW>(xc + d, rh, last, stride, p.sH, p.sW,
                                                          best, at);
#pragma GCC unroll 4
      for (int64_t h = 0; h < rh; ++h)
#pragma GCC unroll 4
        for (int64_t w = 0; w < cw; ++w)  // a repeated column's position never matches
          v = Vec::blendv(v, Wd::load(gc + h * grow + (CW > 0 ? std::min(w, last) : w) * C + d),
                          at == Vec(static_cast<A>(h * stride + w)));
      Wd::store(o + d, v);
    }
    for (int64_t d = dv; d < C; ++d) {
      const auto m = cell_max_scalar(p.x + b * p.sN + d, p.sH, p.sW, r0, g.rows.end[i], c0,
                                     g.cols.end[j]);
      o[d] = gin[((b * p.H + m.h) * p.W + m.w) * C + d];
    }
  }
}

template <typename scalar_t, int RH>
void select_argmax_row(const MaxGradPass<scalar_t>& p, const scalar_t* gin, scalar_t* out,
                       int64_t b, int64_t i, int64_t dv) {
  switch (dv > 0 ? p.cw_max : 0) {
    case 1: return select_argmax_row<scalar_t, RH, 1>(p, gin, out, b, i, dv);
    case 2: return select_argmax_row<scalar_t, RH, 2>(p, gin, out, b, i, dv);
    case 3: return select_argmax_row<scalar_t, RH, 3>(p, gin, out, b, i, dv);
    default: return select_argmax_row<scalar_t, 0, 0>(p, gin, out, b, i, dv);
  }
}

}  // namespace

at::Tensor fractional_max_pool_grad_cpu(const at::Tensor& orig_input, const at::Tensor& orig_output,
                                        const at::Tensor& out_backprop,
                                        const at::Tensor& row_pooling_sequence,
                                        const at::Tensor& col_pooling_sequence, bool overlapping) {
  constexpr const char* op = "fractional_max_pool_grad";
  const GradPlan g = fracpool::check_max_grad(op, orig_input, orig_output, out_backprop,
                                              row_pooling_sequence, col_pooling_sequence,
                                              overlapping);
  const at::Tensor x = channels_contiguous(orig_input);
  const at::Tensor y = orig_output.contiguous();
  const at::Tensor dy = out_backprop.contiguous();
  at::Tensor dx = at::empty({g.N, g.H, g.W, g.C}, orig_input.options());
  fracpool::dispatch_value_types(x.scalar_type(), [&](auto tag) {
    max_grad_kernel<decltype(tag)>(x, y, dy, dx, g, overlapping);
  });
  return dx;
}

at::Tensor fractional_max_pool_grad_backward_cpu(const at::Tensor& orig_input,
                                                 const at::Tensor& orig_output,
                                                 const at::Tensor& grad,
                                                 const at::Tensor& row_pooling_sequence,
                                                 const at::Tensor& col_pooling_sequence,
                                                 bool overlapping) {
  constexpr const char* op = "_fractional_max_pool_grad_backward";
  const GradPlan g = fracpool::check_max_grad(op, orig_input, orig_output, orig_output,
                                              row_pooling_sequence, col_pooling_sequence,
                                              overlapping);
  TORCH_CHECK(grad.sizes() == orig_input.sizes() && grad.scalar_type() == orig_input.scalar_type(),
              op,
              ": argument 'grad' must have the shape and dtype "
              "of orig_input");
  const at::Tensor x = channels_contiguous(orig_input);
  const at::Tensor gin = grad.contiguous();
  at::Tensor out = at::empty(orig_output.sizes(), grad.options());
  fracpool::dispatch_value_types(x.scalar_type(), [&](auto tag) {
    using scalar_t = decltype(tag);
    const MaxGradPass<scalar_t> pass(x, g);  // (the orig_output check was the gradient's)
    const int64_t dv = pass.vector_end(0, g.C), OH = g.rows.cells;
    const scalar_t* src = gin.const_data_ptr<scalar_t>();
    scalar_t* dst = out.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, g.N * OH, grain_for((g.H / OH + 1) * g.W * g.C),
                     [&](int64_t begin, int64_t end) {
                       for (int64_t t = begin; t < end; ++t) {
                         const int64_t b = t / OH, i = t % OH;
                         switch (g.rows.count(i)) {
                           case 1: select_argmax_row<scalar_t, 1>(pass, src, dst, b, i, dv); break;
                           case 2: select_argmax_row<scalar_t, 2>(pass, src, dst, b, i, dv); break;
                           case 3: select_argmax_row<scalar_t, 3>(pass, src, dst, b, i, dv); break;
                           default: select_argmax_row<scalar_t, 0>(pass, src, dst, b, i, dv);
                         }
                       }
                     });
  });
  return out;
}

}  // namespace fracpool_cpu
}  // namespace torch_tfgrads
