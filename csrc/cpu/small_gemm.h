// A register-tiled GEMM for products with few rows against one operand reused many times: the
// recurrent steps of the CudnnRNN family where oneDNN's BRGEMM does not run
// (cudnn_rnn_rows.cpp). C[M, N] (+)= A[M, K] B[K, N]: B packed once into panels of NR columns
// (k-major, the last panel zero-padded), A read in place, one element broadcast at a time.
//
// Why not the BLAS: a step's product has 8-32 rows per thread, and the BLAS packs all of B on
// every call and then runs its small-M kernels; at these shapes the tiles below ran 1.4-2.8x
// its single-thread speed (docs/perf-notes/cudnn_rnn.md). One at::vec source serves every ISA
// at the build's vector width (float32 and float64); float32 has an AVX-512 tile too, used
// where our AVX-512 kernels are on (small_gemm_avx512.cpp).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "cpu/isa.h"

namespace torch_tfgrads {
namespace small_gemm {

// B as panels: [panels, K, NR], panel p holding columns p*NR.. of B.
struct Packed {
  at::Tensor panels;
  int64_t K = 0, N = 0, NR = 0;
};

// Packs B, whose element (k, n) is b[k * sk + n * sn]: a row-major [K, N] matrix has sk = N,
// sn = 1; the transpose of a row-major [N, K] one (R^T for R [G*U, U]) sk = 1, sn = K. The
// panel width follows the tile the calling CPU runs. Uses the threads when called outside a
// parallel region.
template <typename T>
Packed pack(const T* b, int64_t sk, int64_t sn, int64_t K, int64_t N,
            const at::TensorOptions& opts);

// Storage for packing up to K x N (pack_into), allocated once and reused; and the packing
// into it (the same layout as pack's, `into.K` and `into.N` set to this B's sizes).
template <typename T>
Packed pack_storage(int64_t K, int64_t N, const at::TensorOptions& opts);
template <typename T>
void pack_into(Packed& into, const T* b, int64_t sk, int64_t sn, int64_t K, int64_t N);

// C[M, N] (row-major, ldc) = A[M, K] (row-major, lda) B, or += with accumulate; on the calling
// thread.
template <typename T>
void gemm(int64_t M, const T* a, int64_t lda, const Packed& b, T* c, int64_t ldc,
          bool accumulate = false);

#ifdef TFGRADS_HAVE_AVX512_KERNELS
constexpr int64_t kAvx512NR = 32;  // two 16-lane vectors
void gemm_avx512(int64_t M, const float* a, int64_t lda, const Packed& b, float* c, int64_t ldc,
                 bool accumulate);
#endif

}  // namespace small_gemm
}  // namespace torch_tfgrads
