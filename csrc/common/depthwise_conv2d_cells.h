// The per-element bodies of the DepthwiseConv2dNative CUDA kernels as host-device functions: the
// kernels (cuda/depthwise_conv2d.cu) are grid-stride loops or blocks around them, and a host loop
// around the same functions (tfgrads_test::depthwise_conv2d_cells, cpu/depthwise_conv2d_cells.cpp)
// replays them, the filter gradient in the GPU's exact partition and summation order, for the CPU
// tests. Accumulation is in acc_t (at::opmath_type: float for half types).
#pragma once

#include <c10/macros/Macros.h>

#include <cstdint>

namespace torch_tfgrads {
namespace depthwise {

// The geometry as kernel arguments (a trivially copyable struct).
struct Dims {
  int64_t N, H, W, C, M, fh, fw, Ho, Wo, sH, sW, dH, dW, pt, pl;
};

// The filter gradient's blocks: 32 output channels x 8 rows of threads over a chunk's pixels.
constexpr int kFilterGradLanes = 32;
constexpr int kFilterGradRows = 8;

// Offset of (n, c, h, w) in a dense tensor of `Cn` channels and rows x cols pixels.
template <bool kChannelsLast>
C10_HOST_DEVICE inline int64_t offset(int64_t n, int64_t c, int64_t h, int64_t w, int64_t Cn,
                                      int64_t rows, int64_t cols) {
  return kChannelsLast ? ((n * rows + h) * cols + w) * Cn + c
                       : ((n * Cn + c) * rows + h) * cols + w;
}

// Decodes a linear index in the layout's order into (n, c, h, w).
template <bool kChannelsLast>
C10_HOST_DEVICE inline void decode(int64_t e, int64_t Cn, int64_t rows, int64_t cols, int64_t* n,
                                   int64_t* c, int64_t* h, int64_t* w) {
  if (kChannelsLast) {
    *c = e % Cn;
    e /= Cn;
    *w = e % cols;
    e /= cols;
    *h = e % rows;
    *n = e / rows;
  } else {
    *w = e % cols;
    e /= cols;
    *h = e % rows;
    e /= rows;
    *c = e % Cn;
    *n = e / Cn;
  }
}

// Output element e: its fh * fw taps in row-major order (padding, strides and dilations as
// bounds tests).
template <typename scalar_t, typename acc_t, bool kChannelsLast>
C10_HOST_DEVICE inline scalar_t forward_element(const scalar_t* x, const scalar_t* f, const Dims& d,
                                                int64_t e) {
  const int64_t CM = d.C * d.M;
  int64_t n, oc, i, j;
  decode<kChannelsLast>(e, CM, d.Ho, d.Wo, &n, &oc, &i, &j);
  const int64_t c = oc / d.M;
  acc_t acc = 0;
  for (int64_t di = 0; di < d.fh; ++di) {
    const int64_t h = i * d.sH + di * d.dH - d.pt;
    if (h < 0 || h >= d.H) continue;
    for (int64_t dj = 0; dj < d.fw; ++dj) {
      const int64_t w = j * d.sW + dj * d.dW - d.pl;
      if (w < 0 || w >= d.W) continue;
      acc += static_cast<acc_t>(x[offset<kChannelsLast>(n, c, h, w, d.C, d.H, d.W)]) *
             static_cast<acc_t>(f[(di * d.fw + dj) * CM + oc]);
    }
  }
  return static_cast<scalar_t>(acc);
}

// Input element e: every (tap, m) whose window covers it, taps in row-major order.
template <typename scalar_t, typename acc_t, bool kChannelsLast>
C10_HOST_DEVICE inline scalar_t backprop_input_element(const scalar_t* f, const scalar_t* dy,
                                                       const Dims& d, int64_t e) {
  const int64_t CM = d.C * d.M;
  int64_t n, c, h, w;
  decode<kChannelsLast>(e, d.C, d.H, d.W, &n, &c, &h, &w);
  acc_t acc = 0;
  for (int64_t di = 0; di < d.fh; ++di) {
    const int64_t num_h = h + d.pt - di * d.dH;
    if (num_h < 0 || num_h % d.sH != 0 || num_h / d.sH >= d.Ho) continue;
    const int64_t i = num_h / d.sH;
    for (int64_t dj = 0; dj < d.fw; ++dj) {
      const int64_t num_w = w + d.pl - dj * d.dW;
      if (num_w < 0 || num_w % d.sW != 0 || num_w / d.sW >= d.Wo) continue;
      const int64_t j = num_w / d.sW;
      for (int64_t m = 0; m < d.M; ++m) {
        const int64_t oc = c * d.M + m;
        acc += static_cast<acc_t>(dy[offset<kChannelsLast>(n, oc, i, j, CM, d.Ho, d.Wo)]) *
               static_cast<acc_t>(f[(di * d.fw + dj) * CM + oc]);
      }
    }
  }
  return static_cast<scalar_t>(acc);
}

// One thread's share of filter element (tap, oc) over a chunk of output pixels [p0, p1): the
// pixels p0 + row, p0 + row + 8, ... (row = the thread's row in its block).
template <typename scalar_t, typename acc_t, bool kChannelsLast>
C10_HOST_DEVICE inline acc_t filter_grad_thread(const scalar_t* x, const scalar_t* dy,
                                                const Dims& d, int64_t oc, int64_t tap, int64_t p0,
                                                int64_t p1, int row) {
  const int64_t CM = d.C * d.M, c = oc / d.M, di = tap / d.fw, dj = tap % d.fw;
  acc_t acc = 0;
  for (int64_t p = p0 + row; p < p1; p += kFilterGradRows) {
    const int64_t j = p % d.Wo, i = (p / d.Wo) % d.Ho, n = p / (d.Wo * d.Ho);
    const int64_t h = i * d.sH + di * d.dH - d.pt, w = j * d.sW + dj * d.dW - d.pl;
    if (h < 0 || h >= d.H || w < 0 || w >= d.W) continue;
    acc += static_cast<acc_t>(x[offset<kChannelsLast>(n, c, h, w, d.C, d.H, d.W)]) *
           static_cast<acc_t>(dy[offset<kChannelsLast>(n, oc, i, j, CM, d.Ho, d.Wo)]);
  }
  return acc;
}

// The pixels [p0, p1) of chunk k.
C10_HOST_DEVICE inline void chunk_range(int64_t k, int64_t per_chunk, int64_t P, int64_t* p0,
                                        int64_t* p1) {
  *p0 = k * per_chunk;
  *p1 = *p0 + per_chunk < P ? *p0 + per_chunk : P;
}

// A block's partial: its 8 thread rows' sums, added in row order from 0.
template <typename acc_t>
C10_HOST_DEVICE inline acc_t filter_grad_block_sum(const acc_t* rows, int stride) {
  acc_t s = 0;
  for (int k = 0; k < kFilterGradRows; ++k) s += rows[k * stride];
  return s;
}

// Filter element e of the gradient: the chunks' partials part[k * elems + e] in chunk order.
template <typename scalar_t, typename acc_t>
C10_HOST_DEVICE inline scalar_t filter_grad_chunks_sum(const acc_t* part, int64_t elems,
                                                       int64_t chunks, int64_t e) {
  acc_t s = 0;
  for (int64_t k = 0; k < chunks; ++k) s += part[k * elems + e];
  return static_cast<scalar_t>(s);
}

}  // namespace depthwise
}  // namespace torch_tfgrads
