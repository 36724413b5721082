#include "cpu/avx512.h"

#include <ATen/Version.h>

namespace torch_tfgrads {

bool avx512_enabled() {
#ifdef TFGRADS_HAVE_AVX512_KERNELS
  static const bool on = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                         at::get_cpu_capability() == "AVX512";
  return on;
#else
  return false;
#endif
}

}  // namespace torch_tfgrads
