// Run-time choice of the few AVX-512 kernels. The extension is built for AVX2; a kernel that
// gains from 16-lane vectors and mask registers is written with intrinsics in a
// `#pragma GCC target` region (TFGRADS_AVX512_BEGIN / _END) and called only when
// avx512_enabled() says so, so one build runs on AVX2-only CPUs too.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__)
#define TFGRADS_HAVE_AVX512_KERNELS 1
#define TFGRADS_AVX512_BEGIN \
  _Pragma("GCC push_options") _Pragma("GCC target(\"avx512f,avx512bw,avx512vl,avx512dq\")")
#define TFGRADS_AVX512_END _Pragma("GCC pop_options")
#endif

namespace torch_tfgrads {

// The CPU has AVX-512 F/BW/VL/DQ and ATen's own kernels run at AVX512 (so
// ATEN_CPU_CAPABILITY=avx2 switches ours off too, which the tests use to compare both).
bool avx512_enabled();

}  // namespace torch_tfgrads
