// The arithmetic of the FusedBatchNorm CUDA reductions as host-device code: the accumulators
// (Welford moments, gradient sums), what one thread pushes, how partials merge, which elements a
// partial covers, and the per-channel merge in double. The CUDA kernels
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

// ---- The per-channel merge of the partials, in double --------------------------------------
// A finalize block has kMergeGroups rows of 32 threads: thread (row g, lane) owns channel
// blockIdx.x * 32 + lane and merges its partials g, g + kMergeGroups, g + 2 * kMergeGroups, ...
// in that order (consecutive lanes read consecutive channels of one partial: coalesced); then
// row 0 merges rows 1..kMergeGroups-1 in row order. At 1024 partials that is 64 + 15 merges in
// a chain instead of 1024.
constexpr int kMergeGroups = 16;

// Group g's share of channel c's moments (Chan's formula; empty partials are skipped, and the
// first non-empty one is taken exactly).
template <typename acc_t>
C10_HOST_DEVICE inline Welford<double> merge_moments_group(const Welford<acc_t>* parts,
                                                           int64_t nparts, int64_t C, int64_t c,
                                                           int g) {
  Welford<double> t{0, 0, 0};
  for (int64_t p = g; p < nparts; p += kMergeGroups) {
    const Welford<acc_t> w = parts[p * C + c];
    t.merge(Welford<double>{double(w.n), double(w.mean), double(w.m2)});
  }
  return t;
}

// Group g's share of channel c's gradient sums.
template <typename acc_t>
C10_HOST_DEVICE inline GradSums<double> merge_grad_sums_group(const GradSums<acc_t>* parts,
                                                              int64_t nparts, int64_t C, int64_t c,
                                                              int g) {
  GradSums<double> t{0, 0};
  for (int64_t p = g; p < nparts; p += kMergeGroups)
    t.merge(GradSums<double>{double(parts[p * C + c].sdy), double(parts[p * C + c].sdyxc)});
  return t;
}

// Row 0's merge of the groups' results (groups[g * stride]) in group order.
template <typename Acc>
C10_HOST_DEVICE inline Acc merge_groups(const Acc* groups, int stride) {
  Acc a = groups[0];
  for (int g = 1; g < kMergeGroups; ++g) a.merge(groups[g * stride]);
  return a;
}

}  // namespace bn
}  // namespace torch_tfgrads
