// The register-tiled GEMM of small_gemm.h at the build's vector width (at::vec).
#include "cpu/small_gemm.h"

#include <ATen/Functions.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "cpu/isa.h"

namespace torch_tfgrads {
namespace small_gemm {
namespace {

template <typename T>
constexpr int64_t kVecs = 2;  // vectors per panel row
template <typename T>
constexpr int64_t kNR = kVecs<T> * at::vec::Vectorized<T>::size();
// Rows per tile: 12 accumulators, 2 B vectors and a broadcast fill the 16 registers of AVX2.
constexpr int64_t kMR = 6;

// MR rows of C times one panel; nn <= NR columns of C are valid.
template <int MR, typename T>
C10_ALWAYS_INLINE void tile(int64_t K, const T* a, int64_t lda, const T* panel, T* c, int64_t ldc,
                            int64_t nn, bool accumulate) {
  using Vec = at::vec::Vectorized<T>;
  constexpr int64_t kV = Vec::size(), NV = kVecs<T>;
  Vec acc[MR][NV];
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) {
      const int64_t left = std::min<int64_t>(kV, nn - v * kV);
      acc[r][v] = accumulate && left > 0 ? Vec::loadu(c + r * ldc + v * kV, left) : Vec(T(0));
    }
  for (int64_t k = 0; k < K; ++k) {
    Vec bv[NV];
    for (int v = 0; v < NV; ++v) bv[v] = Vec::loadu(panel + k * NV * kV + v * kV);
    for (int r = 0; r < MR; ++r) {
      const Vec av(a[r * lda + k]);
      for (int v = 0; v < NV; ++v) acc[r][v] = at::vec::fmadd(av, bv[v], acc[r][v]);
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) {
      const int64_t left = nn - v * kV;
      if (left >= kV)
        acc[r][v].store(c + r * ldc + v * kV);
      else if (left > 0)
        acc[r][v].store(c + r * ldc + v * kV, left);
    }
}

template <typename T>
void gemm_vec(int64_t M, const T* a, int64_t lda, const Packed& b, T* c, int64_t ldc,
              bool accumulate) {
  const int64_t K = b.K, N = b.N, NR = kNR<T>;
  const T* bp = b.panels.data_ptr<T>();
  for (int64_t p = 0; p * NR < N; ++p) {
    const T* panel = bp + p * K * NR;
    const int64_t nn = std::min(NR, N - p * NR);
    T* cp = c + p * NR;
    int64_t i = 0;
    for (; i + kMR <= M; i += kMR)
      tile<kMR>(K, a + i * lda, lda, panel, cp + i * ldc, ldc, nn, accumulate);
    const T* ai = a + i * lda;
    T* ci = cp + i * ldc;
    switch (M - i) {
      case 5: tile<5>(K, ai, lda, panel, ci, ldc, nn, accumulate); break;
      case 4: tile<4>(K, ai, lda, panel, ci, ldc, nn, accumulate); break;
      case 3: tile<3>(K, ai, lda, panel, ci, ldc, nn, accumulate); break;
      case 2: tile<2>(K, ai, lda, panel, ci, ldc, nn, accumulate); break;
      case 1: tile<1>(K, ai, lda, panel, ci, ldc, nn, accumulate); break;
      default: break;
    }
  }
}

template <typename T>
int64_t panel_width() {
#ifdef TFGRADS_HAVE_AVX512_KERNELS
  if (std::is_same_v<T, float> && avx512_enabled()) return kAvx512NR;
#endif
  return kNR<T>;
}

}  // namespace

template <typename T>
Packed pack_storage(int64_t K, int64_t N, const at::TensorOptions& opts) {
  const int64_t NR = panel_width<T>(), panels = (N + NR - 1) / NR;
  return Packed{at::empty({panels, K, NR}, opts), K, N, NR};
}

template <typename T>
void pack_into(Packed& into, const T* b, int64_t sk, int64_t sn, int64_t K, int64_t N) {
  const int64_t NR = into.NR, panels = (N + NR - 1) / NR;
  TORCH_INTERNAL_ASSERT(panels * K * NR <= into.panels.numel(), "small_gemm: storage too small");
  into.K = K;
  into.N = N;
  T* dst = into.panels.data_ptr<T>();
  at::parallel_for(0, panels, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t n0 = p * NR, nn = std::min(NR, N - n0);
      T* d = dst + p * K * NR;
      if (sn == 1) {
        for (int64_t k = 0; k < K; ++k) {
          std::memcpy(d + k * NR, b + k * sk + n0, nn * sizeof(T));
          std::fill(d + k * NR + nn, d + (k + 1) * NR, T(0));
        }
      } else {  // column by column: each source column is a contiguous row of the stored matrix
        for (int64_t k = 0; k < K; ++k) std::fill(d + k * NR + nn, d + (k + 1) * NR, T(0));
        for (int64_t q = 0; q < nn; ++q)
          for (int64_t k = 0; k < K; ++k) d[k * NR + q] = b[k * sk + (n0 + q) * sn];
      }
    }
  });
}

template <typename T>
Packed pack(const T* b, int64_t sk, int64_t sn, int64_t K, int64_t N,
            const at::TensorOptions& opts) {
  Packed out = pack_storage<T>(K, N, opts);
  pack_into(out, b, sk, sn, K, N);
  return out;
}

template <typename T>
void gemm(int64_t M, const T* a, int64_t lda, const Packed& b, T* c, int64_t ldc, bool accumulate) {
  if (M == 0 || b.N == 0) return;
  // A tile broadcasts from its rows in turn, each row's line reused for several k. Rows a
  // multiple of 2 KiB apart fall in the same few L1 sets (4 KiB apart: all in one set, more
  // rows than ways), so each line would be evicted before its reuse: copy A to rows one cache
  // line further apart.
  if (M > 1 && (lda * sizeof(T)) % 2048 == 0) {
    const int64_t K = b.K, ld = lda + 64 / sizeof(T);
    thread_local std::vector<T> rows;
    if (static_cast<int64_t>(rows.size()) < M * ld) rows.resize(M * ld);
    for (int64_t i = 0; i < M; ++i) std::memcpy(rows.data() + i * ld, a + i * lda, K * sizeof(T));
    a = rows.data();
    lda = ld;
  }
#ifdef TFGRADS_HAVE_AVX512_KERNELS
  if constexpr (std::is_same_v<T, float>) {
    if (b.NR == kAvx512NR) return gemm_avx512(M, a, lda, b, c, ldc, accumulate);
  }
#endif
  TORCH_INTERNAL_ASSERT(b.NR == kNR<T>, "small_gemm: B packed for another tile");
  gemm_vec(M, a, lda, b, c, ldc, accumulate);
}

template Packed pack_storage<float>(int64_t, int64_t, const at::TensorOptions&);
template void pack_into<float>(Packed&, const float*, int64_t, int64_t, int64_t, int64_t);
template Packed pack<float>(const float*, int64_t, int64_t, int64_t, int64_t,
                            const at::TensorOptions&);
template Packed pack<double>(const double*, int64_t, int64_t, int64_t, int64_t,
                             const at::TensorOptions&);
template void gemm<float>(int64_t, const float*, int64_t, const Packed&, float*, int64_t, bool);
template void gemm<double>(int64_t, const double*, int64_t, const Packed&, double*, int64_t, bool);

}  // namespace small_gemm
}  // namespace torch_tfgrads
