// A host emulation of the FusedBatchNorm CUDA reductions in their exact order, for the CPU tests
// only (tfgrads_test::fused_batch_norm_partials): the same layout choice and launch plan, every
// thread's pushes, the 8-row merge of a channels-last block, the warp-shuffle tree and warp merge
// of a channels-first block, then the per-channel merge in double (kMergeGroups rows, then row
// 0), all with the functions the kernels use (common/fused_batch_norm_cells.h). Returns the
// partials' element counts [parts, C] and, per channel, [count, mean, M2] (dy given: [sum dy,
// sum dy * (x - mean)]).
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "common/channel_layout.h"
#include "common/fused_batch_norm_cells.h"
#include "common/launch_geometry.h"

namespace torch_tfgrads {
namespace {

// One channels-last block: channel c, partial p (32 x 8 threads; row ty of threads pushes rows
// r0 + ty, r0 + ty + 8, ...; then thread row 0 merges rows 1..7 in order).
template <typename Acc, typename Push>
Acc channels_last_block(int64_t rows, int64_t C, int64_t per_part, int64_t p, int64_t c,
                        const Push& push) {
  int64_t r0, r1;
  bn::part_range(p, per_part, rows, &r0, &r1);
  Acc sm[bn::kRowsPerBlock];
  for (int ty = 0; ty < bn::kRowsPerBlock; ++ty) {
    Acc a{};
    for (int64_t r = r0 + ty; r < r1; r += bn::kRowsPerBlock) push(a, r * C + c, c);
    sm[ty] = a;
  }
  Acc a = sm[0];
  for (int k = 1; k < bn::kRowsPerBlock; ++k) a.merge(sm[k]);
  return a;
}

// One channels-first block: channel c, partial p (256 threads; thread t pushes j0 + t, j0 + t +
// 256, ...; each warp reduces with shfl_down by 16, 8, 4, 2, 1, where a lane past the warp's end
// reads its own value; thread 0 merges warps 1..7 into warp 0's result, in order).
template <typename Acc, typename Push>
Acc channels_first_block(int64_t N, int64_t C, int64_t S, int64_t per_part, int64_t p, int64_t c,
                         const Push& push) {
  int64_t j0, j1;
  bn::part_range(p, per_part, N * S, &j0, &j1);
  constexpr int kWarps = bn::kFirstThreads / bn::kWarp;
  Acc warp_result[kWarps];
  for (int w = 0; w < kWarps; ++w) {
    Acc lane[bn::kWarp];
    for (int l = 0; l < bn::kWarp; ++l) {
      Acc a{};
      for (int64_t j = j0 + w * bn::kWarp + l; j < j1; j += bn::kFirstThreads) {
        const int64_t n = j / S, s = j - n * S;
        push(a, (n * C + c) * S + s, c);
      }
      lane[l] = a;
    }
    for (int offset = bn::kWarp / 2; offset > 0; offset /= 2) {
      Acc next[bn::kWarp];
      for (int l = 0; l < bn::kWarp; ++l) {
        next[l] = lane[l];
        next[l].merge(l + offset < bn::kWarp ? lane[l + offset] : lane[l]);
      }
      for (int l = 0; l < bn::kWarp; ++l) lane[l] = next[l];
    }
    warp_result[w] = lane[0];
  }
  Acc a = warp_result[0];
  for (int w = 1; w < kWarps; ++w) a.merge(warp_result[w]);
  return a;
}

template <typename Acc, typename Push>
std::vector<Acc> partials(const ChannelLayout& l, const launch::BnPlan& plan, const Push& push) {
  std::vector<Acc> out(static_cast<size_t>(plan.parts * l.C));
  for (int64_t p = 0; p < plan.parts; ++p)
    for (int64_t c = 0; c < l.C; ++c)
      out[p * l.C + c] = l.channels_last
                             ? channels_last_block<Acc>(l.outer, l.C, plan.per_part, p, c, push)
                             : channels_first_block<Acc>(l.outer, l.C, l.inner, plan.per_part, p, c,
                                                         push);
  return out;
}

// One channel's finalize: row g of the block merges its group, then row 0 merges the rows.
template <typename Group>
auto finalize(const Group& group) {
  using Acc = decltype(group(0));
  Acc rows[bn::kMergeGroups];
  for (int g = 0; g < bn::kMergeGroups; ++g) rows[g] = group(g);
  return bn::merge_groups(rows, 1);
}

// The elements each partial covers: the count of its Welford (a push per element).
template <typename acc_t>
at::Tensor part_counts(const std::vector<bn::Welford<acc_t>>& parts, int64_t nparts, int64_t C) {
  at::Tensor t = at::empty({nparts, C}, at::kDouble);
  double* p = t.data_ptr<double>();
  for (int64_t i = 0; i < nparts * C; ++i) p[i] = static_cast<double>(parts[i].n);
  return t;
}

std::tuple<at::Tensor, at::Tensor> fused_batch_norm_partials(const at::Tensor& x,
                                                             const std::optional<at::Tensor>& dy,
                                                             const std::optional<at::Tensor>& mean,
                                                             c10::string_view data_format) {
  const std::string fmt(data_format);
  const bool first = fmt == "NCHW" || fmt == "NCDHW";
  const int64_t cdim = first ? 1 : x.dim() - 1;
  const ChannelLayout l = choose_channel_layout(x, cdim, !first);
  const launch::BnPlan plan = launch::bn_plan(l.channels_last, l.C, l.outer, l.inner);
  const at::Tensor xp = to_physical(x, l);
  at::Tensor counts, stats = at::empty({dy ? 2 : 3, l.C}, at::kDouble);
  double* out = stats.data_ptr<double>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "partials", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    if (!dy) {
      const auto parts = partials<bn::Welford<acc_t>>(
          l, plan, bn::PushX<scalar_t, acc_t>{xp.const_data_ptr<scalar_t>()});
      counts = part_counts(parts, plan.parts, l.C);
      for (int64_t c = 0; c < l.C; ++c) {
        const auto w = finalize(
            [&](int g) { return bn::merge_moments_group(parts.data(), plan.parts, l.C, c, g); });
        out[c] = w.n;
        out[l.C + c] = w.mean;
        out[2 * l.C + c] = w.m2;
      }
    } else {
      TORCH_CHECK(mean.has_value(), "fused_batch_norm_partials: dy needs mean");
      const at::Tensor dyp = to_physical(*dy, l);
      const at::Tensor m = mean->to(c10::CppTypeToScalarType<acc_t>::value).contiguous();
      const auto parts = partials<bn::GradSums<acc_t>>(
          l, plan,
          bn::PushGrad<scalar_t, acc_t>{dyp.const_data_ptr<scalar_t>(),
                                        xp.const_data_ptr<scalar_t>(), m.const_data_ptr<acc_t>()});
      counts = at::zeros({plan.parts, l.C}, at::kDouble);
      for (int64_t c = 0; c < l.C; ++c) {
        const auto s = finalize(
            [&](int g) { return bn::merge_grad_sums_group(parts.data(), plan.parts, l.C, c, g); });
        out[c] = s.sdy;
        out[l.C + c] = s.sdyxc;
      }
    }
  });
  return {counts, stats};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(tfgrads_test, m) {
  m.def(
      "fused_batch_norm_partials(Tensor x, Tensor? dy, Tensor? mean, str data_format) -> "
      "(Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(tfgrads_test, CPU, m) {
  m.impl("fused_batch_norm_partials", &fused_batch_norm_partials);
}

}  // namespace torch_tfgrads
