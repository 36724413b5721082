// The arithmetic of the FusedBatchNorm CUDA reductions as host-device code: the accumulators
// (Welford moments, gradient sums), what one thread pushes, how partials merge, which elements a
// partial covers, and the per-channel finalisation in double. The CUDA kernels
// (cuda/fused_batch_norm.cu) run them in their thread, warp and block order; a host emulation of
// that exact order (tfgrads_test::fused_batch_norm_partials, cpu/fused_batch_norm_cells.cpp) runs
// the same functions, so the CPU tests check the merge at geometries a test GPU would need (1024
// partials per channel, empty partials, channel groups with idle threads).
#pragma once

#include <c10/macros/Macros.h>

#include <cstdint>

namespace torch_tfgrads {
namespace bn {

// The partial kernels' blocks: channels-last (32 channels x 8 rows of threads), channels-first
// (256 threads, 8 warps of 32, on one channel).
constexpr int kWarp = 32;
constexpr int kRowsPerBlock = 8;
constexpr int kFirstThreads = 256;

// Running (count, mean, M2) of one thread or block.
template <typename acc_t>
struct Welford {
  acc_t n, mean, m2;  // no initialisers: __shared__ arrays need a trivial constructor
  C10_HOST_DEVICE void push(acc_t v) {
    n += 1;
    const acc_t d = v - mean;
    mean += d / n;
    m2 += d * (v - mean);
  }
  C10_HOST_DEVICE void merge(const Welford& o) {
    if (o.n == 0) return;
    const acc_t nt = n + o.n, d = o.mean - mean;
    mean += d * (o.n / nt);
    m2 += o.m2 + d * d * (n * o.n / nt);
    n = nt;
  }
};

// Sums of dy and dy * (x - mean).
template <typename acc_t>
struct GradSums {
  acc_t sdy, sdyxc;
  C10_HOST_DEVICE void merge(const GradSums& o) {
    sdy += o.sdy;
    sdyxc += o.sdyxc;
  }
};

template <typename scalar_t, typename acc_t>
struct PushX {
  const scalar_t* x;
  C10_HOST_DEVICE void operator()(Welford<acc_t>& a, int64_t i, int64_t) const {
    a.push(static_cast<acc_t>(x[i]));
  }
};

template <typename scalar_t, typename acc_t>
struct PushGrad {
  const scalar_t* dy;
  const scalar_t* x;
  const acc_t* mean;
  C10_HOST_DEVICE void operator()(GradSums<acc_t>& a, int64_t i, int64_t c) const {
    const acc_t g = static_cast<acc_t>(dy[i]);
    a.sdy += g;
    a.sdyxc += g * (static_cast<acc_t>(x[i]) - mean[c]);
  }
};

// The elements [begin, end) of partial p when each covers `per_part` of `total` (rows for
// channels-last, a channel's elements for channels-first); trailing partials may be empty.
C10_HOST_DEVICE inline void part_range(int64_t p, int64_t per_part, int64_t total, int64_t* begin,
                                       int64_t* end) {
  const int64_t b = p * per_part, e = b + per_part;
  *begin = b < total ? b : total;
  *end = e < total ? e : total;
}

// Channel c's moments from its partials (parts[p * C + c]), merged in partial order in double
// with Chan's formula; empty partials are skipped.
template <typename acc_t>
C10_HOST_DEVICE inline void merge_moments(const Welford<acc_t>* parts, int64_t nparts, int64_t C,
                                          int64_t c, double* count, double* mean, double* m2) {
  double tn = 0, tm = 0, tm2 = 0;
  for (int64_t p = 0; p < nparts; ++p) {
    const Welford<acc_t> w = parts[p * C + c];
    if (w.n == 0) continue;
    const double nt = tn + w.n, d = double(w.mean) - tm;
    tm += d * (w.n / nt);
    tm2 += double(w.m2) + d * d * (tn * w.n / nt);
    tn = nt;
  }
  *count = tn;
  *mean = tm;
  *m2 = tm2;
}

// Channel c's gradient sums from its partials, in partial order in double.
template <typename acc_t>
C10_HOST_DEVICE inline void merge_grad_sums(const GradSums<acc_t>* parts, int64_t nparts, int64_t C,
                                            int64_t c, double* sdy, double* sdyxc) {
  double s1 = 0, s2 = 0;
  for (int64_t p = 0; p < nparts; ++p) {
    s1 += parts[p * C + c].sdy;
    s2 += parts[p * C + c].sdyxc;
  }
  *sdy = s1;
  *sdyxc = s2;
}

}  // namespace bn
}  // namespace torch_tfgrads
