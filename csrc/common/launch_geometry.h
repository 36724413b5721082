// Launch geometry and workspace sizes of the CUDA kernels that reduce (csrc/cuda/*.cu), as pure
// functions of the sizes: the kernels take them from here, and the tests check them at sizes no
// test GPU reaches (torch_tfgrads._C._launch_plan): every grid dimension within CUDA's limits
// (x < 2^31, y and z <= 65535), at least one block, bounded workspaces, every element covered.
#pragma once

#include <algorithm>
#include <cstdint>

namespace torch_tfgrads {
namespace launch {

constexpr int64_t kMaxGridYZ = 65535;

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// ---- FusedBatchNorm: partial reductions over the layout, then a per-channel merge ----------
// Channels-last: blocks of (32 channels x 8 rows of threads) over spans of rows; channels-first:
// one block per (channel, span of the channel's elements). Partials per channel: enough for
// work per block, at most kBnMaxParts (merged per channel in double by 16 threads, then one).
constexpr int64_t kBnMaxParts = 1024;
constexpr int64_t kBnRowsPerPart = 64;  // channels-last rows per partial, at least
constexpr int64_t kBnSpan = 4096;       // channels-first elements per partial, at least

struct BnPlan {
  int64_t parts = 1;     // partials per channel (grid.y), 1..kBnMaxParts
  int64_t per_part = 0;  // rows (channels-last) or elements (channels-first) per partial
  int64_t grid_x = 1;    // channel groups of 32 (channels-last) or channels (channels-first)
};

inline BnPlan bn_plan(bool channels_last, int64_t C, int64_t outer, int64_t inner) {
  BnPlan p;
  const int64_t total = channels_last ? outer : outer * inner;
  const int64_t unit = channels_last ? kBnRowsPerPart : kBnSpan;
  p.parts = std::max<int64_t>(1, std::min<int64_t>(kBnMaxParts, ceil_div(total, unit)));
  p.per_part = ceil_div(total, p.parts);
  p.grid_x = std::max<int64_t>(1, channels_last ? ceil_div(C, 32) : C);
  return p;
}

// ---- DepthwiseConv2dNative's filter gradient: partial sums over fixed chunks of output pixels
// (from the sizes only, never the device: deterministic sums), then the chunks summed in order.
// The partials take chunks * taps * CM accumulators: at most kDwWorkspaceBytes (a 7x7 filter on
// 2048 channels would otherwise take 411 MB at 1024 chunks).
constexpr int64_t kDwMaxChunks = 1024;
constexpr int64_t kDwPixelsPerChunk = 2048;  // at least, before the workspace bound
constexpr int64_t kDwWorkspaceBytes = int64_t{64} << 20;

struct DwFilterGradPlan {
  int64_t chunks = 1, per_chunk = 0;  // grid.z and the pixels of each chunk
  int64_t grid_x = 1, grid_y = 1;     // channel groups of 32; taps (the kernel strides past)
  int64_t workspace_bytes = 0;
};

inline DwFilterGradPlan dw_filter_grad_plan(int64_t P, int64_t taps, int64_t CM,
                                            int64_t acc_bytes) {
  DwFilterGradPlan p;
  const int64_t per_chunk_bytes = std::max<int64_t>(1, taps * CM * acc_bytes);
  const int64_t by_work = std::min<int64_t>(kDwMaxChunks, P / kDwPixelsPerChunk);
  const int64_t by_memory = kDwWorkspaceBytes / per_chunk_bytes;
  p.chunks = std::max<int64_t>(1, std::min(by_work, by_memory));
  p.per_chunk = std::max<int64_t>(1, ceil_div(P, p.chunks));
  p.chunks = std::max<int64_t>(1, ceil_div(P, p.per_chunk));  // no empty trailing chunk
  p.grid_x = std::max<int64_t>(1, ceil_div(CM, 32));
  p.grid_y = std::max<int64_t>(1, std::min(taps, kMaxGridYZ));
  p.workspace_bytes = p.chunks * taps * CM * acc_bytes;
  return p;
}

}  // namespace launch
}  // namespace torch_tfgrads
