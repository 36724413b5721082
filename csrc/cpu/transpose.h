// Row-major float transposes in 8x8 register blocks, over the threads in 64x64 tiles. ATen's
// transposing copies run on one thread, far below the memory bandwidth; the RNN's GEMM operands
// and weight gradients go through these instead.
#pragma once

#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cstdint>

namespace torch_tfgrads {

// dst[N, M] = src[M, N]^T, both row-major with leading dimensions, on the calling thread.
inline void transpose_block(int64_t M, int64_t N, const float* src, int64_t ld_src, float* dst,
                            int64_t ld_dst) {
  for (int64_t i = 0; i < M; i += 8)
    for (int64_t j = 0; j < N; j += 8) {
      const float* s = src + i * ld_src + j;
      float* d = dst + j * ld_dst + i;
      if (i + 8 <= M && j + 8 <= N)
        at::vec::transpose_mxn<float, 8, 8>(s, ld_src, d, ld_dst);
      else
        at::vec::transpose_mxn<float>(s, ld_src, d, ld_dst, std::min<int64_t>(8, M - i),
                                      std::min<int64_t>(8, N - j));
    }
}

// The same in 64x64 tiles over the threads.
inline void transpose(int64_t M, int64_t N, const float* src, int64_t ld_src, float* dst,
                      int64_t ld_dst) {
  constexpr int64_t kBlock = 64;
  const int64_t bm = (M + kBlock - 1) / kBlock, bn = (N + kBlock - 1) / kBlock;
  at::parallel_for(0, bm * bn, 4, [&](int64_t b0, int64_t b1) {
    for (int64_t blk = b0; blk < b1; ++blk) {
      const int64_t i = blk / bn * kBlock, j = blk % bn * kBlock;
      transpose_block(std::min(kBlock, M - i), std::min(kBlock, N - j), src + i * ld_src + j,
                      ld_src, dst + j * ld_dst + i, ld_dst);
    }
  });
}

}  // namespace torch_tfgrads
