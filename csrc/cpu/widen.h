// Vectorised loads and stores that widen float16/bfloat16 to float in registers (fp32
// accumulation for the half types); float and double pass through. Shared by the CPU kernels.
#pragma once

#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include "cpu/isa.h"

#if defined(CPU_CAPABILITY_AVX2)
#include <immintrin.h>
#endif

namespace torch_tfgrads {

using at::vec::Vectorized;

// Loads/stores Vectorized<acc_t>::size() elements of scalar_t, widened to acc_t.
template <typename scalar_t, typename acc_t>
struct Widen {
  using Vec = Vectorized<acc_t>;
  static Vec load(const scalar_t* p) { return Vec::loadu(p); }
  static void store(scalar_t* p, const Vec& v) { v.store(p); }
};
template <typename half_t>
struct WidenReduced {
  using Vec = Vectorized<float>;
  static Vec load(const half_t* p) {
    Vec v;
    at::vec::load_to_float<half_t>(p, v);
    return v;
  }
  static void store(half_t* p, const Vec& v) {
    at::vec::convert_from_float<half_t>(v, v).store(p, Vec::size());
  }
};
template <>
struct Widen<c10::BFloat16, float> : WidenReduced<c10::BFloat16> {};
template <>
struct Widen<c10::Half, float> : WidenReduced<c10::Half> {};

// Non-temporal stores of whole float vectors (AVX2 builds; p 32-byte aligned), for outputs
// far beyond the caches that are written once: no read-for-ownership of their lines, no
// eviction of the inputs. stream_fence() before the writing thread's work is published.
#if defined(CPU_CAPABILITY_AVX2)
constexpr bool kCanStream = true;
inline void stream_store(float* p, const Vectorized<float>& v) { _mm256_stream_ps(p, v); }
inline void stream_fence() { _mm_sfence(); }
#else
constexpr bool kCanStream = false;
inline void stream_store(float* p, const Vectorized<float>& v) { v.store(p); }
inline void stream_fence() {}
#endif

// Whether an output of this many bytes is worth non-temporal stores: beyond the two cores'
// L2 caches, where a consumer could not find it in cache anyway (measured per kernel; a
// kernel whose only other stream is its input passes a larger threshold, see its caller), and
// unless TFGRADS_DISABLE_STREAMING=1 (cpu/isa.h).
inline bool worth_streaming(int64_t bytes, int64_t above = int64_t{4} << 20) {
  return kCanStream && bytes > above && streaming_stores_allowed();
}

}  // namespace torch_tfgrads
