// What the CPU kernels of fused_batch_norm_v3 / fused_batch_norm_grad_v3 share across their
// files (fused_batch_norm.cpp describes the design): the chunking, the channels-last channel
// blocks, the elementwise passes' span loop and store kinds, and the two ops' entry points.
#pragma once

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cstdint>
#include <tuple>
#include <type_traits>
#include <vector>

#include "common/fused_batch_norm.h"
#include "cpu/widen.h"

namespace torch_tfgrads {
namespace bn_cpu {

using at::vec::Vectorized;

// Elements per chunk: 64 KiB of float per stream stays in L2 for the chunk's second pass.
constexpr int64_t kChunkElems = 16384;

template <typename acc_t>
acc_t hsum(const Vectorized<acc_t>& v) {
  alignas(64) acc_t tmp[Vectorized<acc_t>::size()];
  v.store(tmp);
  acc_t s = 0;
  for (int i = 0; i < Vectorized<acc_t>::size(); ++i) s += tmp[i];
  return s;
}

// ---- channels-last building blocks: blocks of channels swept down rows ----------------------
// The per-channel sums need an accumulator for every vector of a row. Keeping them in arrays
// costs a load and a store beside each data vector, so a span of rows is cut into tiles that
// stay in L1, and each tile is swept one block of at most NV channel vectors at a time with
// that block's accumulators in registers. Each channel still sees its rows in order: the sums
// are bit for bit those of a row-by-row loop. (The gradient's sums gain only up to 64
// channels; above, they stay row by row.)

// Rows per L1 tile: about 16 KiB of float per stream.
inline int64_t tile_rows(int64_t C) { return std::max<int64_t>(1, 4096 / std::max<int64_t>(C, 1)); }

// Channel vectors per block: 4 accumulators (8 for the gradient's two sums, plus 4 means) fit
// in the 16 vector registers.
constexpr int kBlockVecs = 4;

// block(nv, a, b, c): rows [a, b), channels [c, c + nv * V) (nv an integral_constant, at most
// kBlockVecs); tail(a, b, c): rows [a, b), channels [c, C) one at a time.
template <typename acc_t, typename Block, typename Tail>
inline void channel_blocks(int64_t r0, int64_t r1, int64_t C, Block&& block, Tail&& tail) {
  constexpr int64_t V = Vectorized<acc_t>::size(), NV = kBlockVecs;
  const int64_t cv = C / V * V, step = tile_rows(C);
  for (int64_t a = r0; a < r1; a += step) {
    const int64_t b = std::min(r1, a + step);
    int64_t c = 0;
    for (; c + NV * V <= cv; c += NV * V) block(std::integral_constant<int, NV>{}, a, b, c);
    switch ((cv - c) / V) {  // the last, narrower block
      case 1: block(std::integral_constant<int, 1>{}, a, b, c); break;
      case 2: block(std::integral_constant<int, 2>{}, a, b, c); break;
      case 3: block(std::integral_constant<int, 3>{}, a, b, c); break;
      default: break;
    }
    if (cv < C) tail(a, b, cv);
  }
}

// Vectorised store of float (non-temporal when kStream: p 32-byte aligned) or widened values.
template <bool kStream, typename scalar_t, typename acc_t>
inline void put(scalar_t* p, const Vectorized<acc_t>& v) {
  if constexpr (kStream && std::is_same_v<scalar_t, float>)
    stream_store(p, v);
  else
    Widen<scalar_t, acc_t>::store(p, v);
}

// The elementwise channels-last passes loop over a thread's rows inside one call (not a call
// per row through the span callback), reading the coefficients from their L1-resident arrays:
// sweeping channel blocks down a tile instead, with the coefficients in registers, reads memory
// in a strided order and is slower (the gradient's non-temporal stores then write partial
// lines).

// Runs the elementwise pass in parallel chunks: rows(r0, r1) over spans of channels-last rows,
// or plane(n * C + c, c) over channels-first planes.
// fence: the bodies stream their stores (stream_fence() at the end of each thread's range).
template <typename Rows, typename Plane>
void for_each_span(const ChannelLayout& l, Rows&& rows, Plane&& plane, bool fence = false) {
  const int64_t C = l.C;
  if (l.channels_last) {
    at::parallel_for(0, l.outer, std::max<int64_t>(1, kChunkElems / C), [&](int64_t b, int64_t e) {
      rows(b, e);
      if (fence) stream_fence();
    });
  } else {
    const int64_t S = l.inner;
    at::parallel_for(0, l.outer * C, std::max<int64_t>(1, kChunkElems / S),
                     [&](int64_t b, int64_t e) {
                       for (int64_t p = b; p < e; ++p) plane(p, p % C);
                       if (fence) stream_fence();
                     });
  }
}

// Whether an elementwise pass may write `out` (the layout's whole float tensor of `numel`
// elements) with non-temporal stores: every span (a channels-last row or a channels-first
// plane) whole aligned vectors, and more than `above` bytes (see worth_streaming).
template <typename scalar_t>
bool can_stream(const ChannelLayout& l, const scalar_t* out, int64_t numel, int64_t above) {
  const int64_t span = l.channels_last ? l.C : l.inner;
  return std::is_same_v<scalar_t, float> && span % 8 == 0 &&
         reinterpret_cast<uintptr_t>(out) % 32 == 0 &&
         worth_streaming(numel * static_cast<int64_t>(sizeof(scalar_t)), above);
}

// pass(std::true_type{}) when stream, else pass(std::false_type{}): both store kinds compiled.
template <typename Pass>
void with_stream(bool stream, Pass&& pass) {
  if (stream)
    pass(std::true_type{});
  else
    pass(std::false_type{});
}

// Per-channel mean and biased variance of x (both layouts): exact two-pass moments per chunk,
// merged in double (fused_batch_norm_stats.cpp).
template <typename scalar_t, typename acc_t>
void batch_moments(const ChannelLayout& l, const scalar_t* x, std::vector<double>& mean,
                   std::vector<double>& var);

// The ops (fused_batch_norm_forward.cpp, fused_batch_norm_grad.cpp).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
fused_batch_norm_v3_cpu(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& offset,
                        const at::Tensor& mean, const at::Tensor& variance, double epsilon,
                        double exponential_avg_factor, c10::string_view data_format,
                        bool is_training);
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
fused_batch_norm_grad_v3_cpu(const at::Tensor& y_backprop, const at::Tensor& x,
                             const at::Tensor& scale, const at::Tensor& reserve_space_1,
                             const at::Tensor& reserve_space_2, const at::Tensor& reserve_space_3,
                             double epsilon, c10::string_view data_format, bool is_training);

}  // namespace bn_cpu
}  // namespace torch_tfgrads
