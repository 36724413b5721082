// What the CPU kernels of the DepthwiseConv2dNative family share across their files: the
// accumulation type, the channels-last correlation's description (Correlation) and kernels, the
// cache helpers of the channels-last kernels, and the three ops' entry points (registered in
// depthwise_conv2d.cpp). The layout of the kernels is described in depthwise_conv2d.cpp.
#pragma once

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "common/depthwise_conv2d.h"
#include "cpu/isa.h"
#include "cpu/widen.h"

namespace torch_tfgrads {
namespace depthwise_avx512 {
struct RowTile;
}  // namespace depthwise_avx512
namespace depthwise_cpu {

using depthwise::AxisTaps;
using depthwise::Geometry;

template <typename scalar_t>
using acc_t = std::conditional_t<std::is_same_v<scalar_t, c10::Half> ||
                                     std::is_same_v<scalar_t, c10::BFloat16>,
                                 float, scalar_t>;

// Channels are processed in chunks of this many: a tile's source pixels (tap rows x tile
// columns x chunk) stay within L1 however many channels there are.
constexpr int64_t kChannelChunk = 64;

// The channels one sweep of the correlation's tiles takes: every channel where pixels are a
// multiple of 4 KiB apart (1024 float channels). Such pixels all fall into the same L1 sets, so
// chunks (a 256-byte piece of each of a tile's source pixels) evict themselves; whole pixels are
// read line after line, each line in the next set. Where pixels are a multiple of 1 KiB apart
// (256, 512 float channels) and the source (src_bytes) fits in half the L3, sweeps of
// 256 channels: fewer passes over rows that come from the cache. From memory they were slower
// (perf notes for both).
template <typename scalar_t>
int64_t correlation_chunk(int64_t C, int64_t src_bytes) {
  const int64_t pixel = C * static_cast<int64_t>(sizeof(scalar_t));
  if (pixel % 4096 == 0) return C;
  if (pixel % 1024 == 0 && src_bytes <= l3_cache_bytes() / 2) return std::min<int64_t>(C, 256);
  return kChannelChunk;
}

// Whether pixels of C channels are a multiple of 1 KiB apart (e.g. 256 / 512 float channels):
// they then all fall into one or two L1 sets, and a tile's source pixels evict each other.
template <typename scalar_t>
bool pixels_alias_in_l1(int64_t C) {
  return (C * static_cast<int64_t>(sizeof(scalar_t))) % 1024 == 0;
}

// Channels [c0, c1) of n consecutive pixels of C channels; locality 3: into L1, 1: into L2.
template <typename T>
inline void prefetch_pixels(const T* first, int64_t n, int64_t C, int64_t c0, int64_t c1,
                            int locality) {
  for (int64_t i = 0; i < n; ++i) {
    const char* p = reinterpret_cast<const char*>(first + i * C + c0);
    const char* e = reinterpret_cast<const char*>(first + i * C + c1);
    for (; p < e; p += 64) {
      if (locality == 3)
        __builtin_prefetch(p, 0, 3);
      else
        __builtin_prefetch(p, 0, 1);
    }
  }
}

// run[q]: how many destination columns q, q+qstep, ... have taps that are copies of q's taps
// with sources shifted by sstep per step (q included).
inline std::vector<int64_t> shifted_runs(const AxisTaps& cols, int64_t dst, int64_t qstep,
                                         int64_t sstep) {
  std::vector<int64_t> run(dst, 1);
  for (int64_t q = dst - 1 - qstep; q >= 0; --q) {
    const int64_t a = cols.offset[q], b = cols.offset[q + qstep], n = cols.count(q);
    bool same = n == cols.count(q + qstep);
    for (int64_t t = 0; same && t < n; ++t)
      same = cols.k[a + t] == cols.k[b + t] && cols.src[a + t] + sstep == cols.src[b + t];
    if (same) run[q] = run[q + qstep] + 1;
  }
  return run;
}

// last[r]: the furthest source row that destination rows 0..r read (-1 before any): the rows
// r + 1 adds are (last[r], last[r + 1]], those to prefetch one row of work ahead.
inline std::vector<int64_t> furthest_sources(const AxisTaps& rows, int64_t dst) {
  std::vector<int64_t> last(dst, -1);
  for (int64_t r = 0; r < dst; ++r) {
    for (int64_t a = rows.offset[r]; a < rows.offset[r + 1]; ++a)
      last[r] = std::max(last[r], rows.src[a]);
    if (r > 0) last[r] = std::max(last[r], last[r - 1]);
  }
  return last;
}

// Source/destination of one correlation (channels-last, M = 1, C channels).
template <typename scalar_t>
struct Correlation {
  const scalar_t* src;   // [N, Hs, Ws, C]
  const scalar_t* filt;  // [fh, fw, C]
  scalar_t* dst;         // [N, Hd, Wd, C]
  int64_t N, Hs, Ws, Hd, Wd, C, fw;
  const AxisTaps* rows;
  const AxisTaps* cols;
  const AxisTaps* vcols;  // the column taps unclipped (in_bounds = false), or nullptr
  int64_t qstep, sstep;   // destination / source column step between tiled pixels
  bool stream = false;    // the two-vector sliding-window tiles store non-temporally (float)
  bool wide = false;      // float, C % 16 == 0, AVX-512: the sliding-window tiles use it
};

// Whether a correlation's output goes beyond the caches (worth non-temporal stores), and whether
// it can be streamed straight from registers: float pixels of whole 64-byte lines.
template <typename scalar_t>
bool large_output(const Correlation<scalar_t>& p) {
  return worth_streaming(p.N * p.Hd * p.Wd * p.C * static_cast<int64_t>(sizeof(scalar_t)));
}
template <typename scalar_t>
bool streams_whole_lines(const Correlation<scalar_t>& p) {
  return large_output(p) && std::is_same_v<scalar_t, float> && p.C % 16 == 0 &&
         reinterpret_cast<uintptr_t>(p.dst) % 64 == 0;
}

// dst = the correlation of p (channels-last, M = 1): the sliding-window tiles, or pixel by pixel
// where the destination pixels have few taps (depthwise_conv2d_tiles.cpp). The forward and the
// input gradient.
template <typename scalar_t>
void correlate_channels_last(const Correlation<scalar_t>& p);

// Whether p's destination pixels have so few taps that correlate_by_pixel beats the tiles;
// whether p is a float layer whose pixels alias in L1 that correlate_by_pixel runs instead of
// the 8-lane tiles, in their order (aliasing_by_pixel); and that path, with each tap row's
// column taps in ascending source order (the sliding tiles' order) or as listed
// (depthwise_conv2d_by_pixel.cpp).
template <typename scalar_t>
bool few_taps_per_pixel(const Correlation<scalar_t>& p);
template <typename scalar_t>
bool aliasing_by_pixel(const Correlation<scalar_t>& p);
template <typename scalar_t>
void correlate_by_pixel(const Correlation<scalar_t>& p, bool ascending_columns = false);

// The columns of the next tile of a run (rest columns left, nc column taps): 8, then 4, then
// the rest; more than 16 taps: the whole run, one channel at a time (filter_grad_scalar); with
// merge_3, a 3-tap run's last 16 or fewer columns as one tile.
inline int64_t tile_columns(int64_t rest, int64_t nc, bool merge_3) {
  return nc > 16                            ? rest
         : merge_3 && nc == 3 && rest <= 16 ? rest
         : rest >= 8                        ? 8
         : rest >= 4                        ? 4
                                            : rest;
}

// The filter gradient of short rows (depthwise_conv2d_filter_rows.cpp). The tiles of every
// output row (tile_columns) for the AVX-512 row pass (filter_row_pass), or none where it does
// not apply: 3-column filters of at most 3 rows, taps on consecutive columns, source step 1 or
// 2, short rows.
std::vector<depthwise_avx512::RowTile> row_tiles_3x3(const Geometry& g, int64_t C,
                                                     const AxisTaps& cols,
                                                     const std::vector<int64_t>& run, bool merge_3);
// One output row's sums for channels [c0, c1) in filter_row_3x3 (AVX-512; its n tap rows x[a]
// add into partial rows part[a], filter columns ps apart), in the direct order or the tiles'.
void filter_row_pass(const float* const* x, float* const* part, int64_t n, const float* dyrow,
                     const std::vector<depthwise_avx512::RowTile>& tiles, int64_t sW, int64_t C,
                     int64_t c0, int64_t c1, int64_t ps, bool direct);
// The filter gradient in the direct order on the 8-lane path (float): whether a layer whose
// rows' tiles are `tiles` (row_tiles_3x3) takes that order (on every path: filter_row_3x3 too),
// and the sums of output rows [r0, r1) (of N * Ho) into a chunk's partial pc (filter taps ps
// apart), buf the thread's scratch (depthwise_conv2d_filter_rows.cpp).
bool direct_filter_rows_apply(const Geometry& g, int64_t C,
                              const std::vector<depthwise_avx512::RowTile>& tiles);
// Whether the AVX-512 path runs direct_filter_rows (wide = true, 16 lanes) rather than the row
// pass (filter_row_pass) for such a layer; the two give the same bits.
bool direct_filter_rows_wide(const Geometry& g, int64_t C);
void direct_filter_rows(const float* x, const float* dy, const Geometry& g, int64_t C,
                        const AxisTaps& rows, const AxisTaps& cols, int64_t r0, int64_t r1,
                        float* pc, int64_t ps, std::vector<float>& buf, bool wide = false);

// [.., C] -> [.., C*M], each channel repeated M times (output channel c*M+m reads channel c).
inline at::Tensor repeat_channels(const at::Tensor& t_cl, int64_t M) {
  if (M == 1) return t_cl;
  auto s = t_cl.sizes().vec();
  const int64_t C = s.back();
  auto e = t_cl.unsqueeze(-1).expand({s[0], s[1], s[2], C, M});
  s.back() = C * M;
  return e.reshape(s);
}

// The physical NHWC view [N, H, W, C] of a logical tensor in a channels-last layout.
inline at::Tensor nhwc_view(const at::Tensor& t, const Geometry& g) {
  return g.nchw ? t.permute({0, 2, 3, 1}) : t;
}

// The ops (depthwise_conv2d_forward.cpp, _backprop_input.cpp, _backprop_filter.cpp).
at::Tensor depthwise_conv2d_native_cpu(const at::Tensor& input, const at::Tensor& filter,
                                       at::IntArrayRef strides, c10::string_view padding,
                                       at::OptionalIntArrayRef explicit_paddings,
                                       c10::string_view data_format, at::IntArrayRef dilations);
at::Tensor depthwise_conv2d_native_backprop_input_cpu(
    c10::SymIntArrayRef input_sizes, const at::Tensor& filter, const at::Tensor& out_backprop,
    at::IntArrayRef strides, c10::string_view padding, at::OptionalIntArrayRef explicit_paddings,
    c10::string_view data_format, at::IntArrayRef dilations);
at::Tensor depthwise_conv2d_native_backprop_filter_cpu(
    const at::Tensor& input, c10::SymIntArrayRef filter_sizes, const at::Tensor& out_backprop,
    at::IntArrayRef strides, c10::string_view padding, at::OptionalIntArrayRef explicit_paddings,
    c10::string_view data_format, at::IntArrayRef dilations);

}  // namespace depthwise_cpu
}  // namespace torch_tfgrads
