// The float32 tile of small_gemm.h with AVX-512: 12 rows by two 16-lane vectors, so 24 of the
// 32 registers accumulate (the 16-register AVX2 tile holds 6 rows by two 8-lane vectors). On
// an AVX-512 Zen 4 host it ran the step products 5-15% faster than the AVX2 tile
// (docs/perf-notes/cudnn_rnn.md). Compiled for AVX-512 after the `#pragma GCC target`, called
// only when avx512_enabled() says so (B was packed 32 columns wide then).
#include "cpu/small_gemm.h"

#include <algorithm>

#ifdef TFGRADS_HAVE_AVX512_KERNELS
#include <immintrin.h>

namespace torch_tfgrads {
namespace small_gemm {
namespace {

TFGRADS_AVX512_BEGIN

constexpr int kMR = 12;

// MR rows of C times one panel; nn <= 32 columns of C are valid.
template <int MR>
inline void tile(int64_t K, const float* a, int64_t lda, const float* panel, float* c, int64_t ldc,
                 int64_t nn, bool accumulate) {
  const __mmask16 m0 = nn >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << nn) - 1);
  const __mmask16 m1 = nn >= 32  ? __mmask16(0xFFFF)
                       : nn > 16 ? __mmask16((1u << (nn - 16)) - 1)
                                 : __mmask16(0);
  __m512 acc0[MR], acc1[MR];
  for (int r = 0; r < MR; ++r) {
    acc0[r] = accumulate ? _mm512_maskz_loadu_ps(m0, c + r * ldc) : _mm512_setzero_ps();
    acc1[r] = accumulate ? _mm512_maskz_loadu_ps(m1, c + r * ldc + 16) : _mm512_setzero_ps();
  }
  for (int64_t k = 0; k < K; ++k) {
    const __m512 b0 = _mm512_loadu_ps(panel + k * 32), b1 = _mm512_loadu_ps(panel + k * 32 + 16);
    for (int r = 0; r < MR; ++r) {
      const __m512 av = _mm512_set1_ps(a[r * lda + k]);
      acc0[r] = _mm512_fmadd_ps(av, b0, acc0[r]);
      acc1[r] = _mm512_fmadd_ps(av, b1, acc1[r]);
    }
  }
  for (int r = 0; r < MR; ++r) {
    _mm512_mask_storeu_ps(c + r * ldc, m0, acc0[r]);
    _mm512_mask_storeu_ps(c + r * ldc + 16, m1, acc1[r]);
  }
}

template <int MR>
inline void rest(int64_t rows, int64_t K, const float* a, int64_t lda, const float* panel, float* c,
                 int64_t ldc, int64_t nn, bool accumulate) {
  if constexpr (MR > 0) {
    if (rows == MR) return tile<MR>(K, a, lda, panel, c, ldc, nn, accumulate);
    rest<MR - 1>(rows, K, a, lda, panel, c, ldc, nn, accumulate);
  }
}

}  // namespace

void gemm_avx512(int64_t M, const float* a, int64_t lda, const Packed& b, float* c, int64_t ldc,
                 bool accumulate) {
  const int64_t K = b.K, N = b.N;
  const float* bp = b.panels.data_ptr<float>();
  for (int64_t p = 0; p * kAvx512NR < N; ++p) {
    const float* panel = bp + p * K * kAvx512NR;
    const int64_t nn = std::min(kAvx512NR, N - p * kAvx512NR);
    float* cp = c + p * kAvx512NR;
    int64_t i = 0;
    for (; i + kMR <= M; i += kMR)
      tile<kMR>(K, a + i * lda, lda, panel, cp + i * ldc, ldc, nn, accumulate);
    rest<kMR - 1>(M - i, K, a + i * lda, lda, panel, cp + i * ldc, ldc, nn, accumulate);
  }
}

TFGRADS_AVX512_END

}  // namespace small_gemm
}  // namespace torch_tfgrads
#endif
