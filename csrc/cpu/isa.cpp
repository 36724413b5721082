#include "cpu/isa.h"

#include <ATen/Version.h>
#include <c10/util/Exception.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace torch_tfgrads {

namespace {

// TFGRADS_CPU_CAPABILITY: "avx2" turns our AVX-512 kernels off (ATen keeps its own), "avx512"
// insists on them, unset or empty picks by the CPU. Read once per process.
std::string forced_capability() {
  const char* v = std::getenv("TFGRADS_CPU_CAPABILITY");
  return v == nullptr ? std::string() : std::string(v);
}

// A TFGRADS_DISABLE_* switch: unset, empty or "0" leaves the path on.
bool not_disabled(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr || std::string(v).empty() || std::string(v) == "0";
}

}  // namespace

bool cpu_has_avx512() {
#ifdef TFGRADS_HAVE_AVX512_KERNELS
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
#else
  return false;
#endif
}

bool avx512_enabled() {
  static const bool on = [] {
    const std::string forced = forced_capability();
    TORCH_CHECK_VALUE(forced.empty() || forced == "avx2" || forced == "avx512",
                      "TFGRADS_CPU_CAPABILITY must be avx2, avx512 or unset, got '", forced, "'");
    if (forced == "avx2") return false;
    const bool able = cpu_has_avx512() && at::get_cpu_capability() == "AVX512";
    TORCH_CHECK(forced.empty() || able,
                "TFGRADS_CPU_CAPABILITY=avx512, but this CPU lacks AVX-512 F/BW/VL/DQ or ATen "
                "does not run at AVX512 (ATen: ",
                at::get_cpu_capability(), ")");
    return able;
  }();
  return on;
}

bool brgemm_allowed() {
  static const bool on = not_disabled("TFGRADS_DISABLE_BRGEMM");
  return on;
}

bool streaming_stores_allowed() {
  static const bool on = not_disabled("TFGRADS_DISABLE_STREAMING");
  return on;
}

// C stdio, not a C++ file stream: built there by the GPU machines' g++ (/opt/gcc, CUDA torch),
// the extension carries its own copy of libstdc++, whose file streams segfaulted in operator>>
// (docs/development.md, "On a GPU machine"). Read once per process; every depthwise call asks.
int64_t l3_reported_bytes() {
  static const int64_t bytes = []() -> int64_t {
    for (int i = 0; i < 8; ++i) {
      const std::string base = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i);
      int lv = 0;
      long long n = 0;
      char unit = '\0';
      if (std::FILE* f = std::fopen((base + "/level").c_str(), "r")) {
        if (std::fscanf(f, "%d", &lv) != 1) lv = 0;
        std::fclose(f);
      }
      if (lv != 3) continue;
      std::FILE* f = std::fopen((base + "/size").c_str(), "r");
      if (f == nullptr) continue;
      const int got = std::fscanf(f, "%lld%c", &n, &unit);
      std::fclose(f);
      if (got < 1 || n <= 0) continue;
      const int64_t mul = got < 2       ? 1
                          : unit == 'K' ? int64_t{1} << 10
                          : unit == 'M' ? int64_t{1} << 20
                          : unit == 'G' ? int64_t{1} << 30
                                        : 1;
      return static_cast<int64_t>(n) * mul;
    }
    return 0;
  }();
  return bytes;
}

int64_t l3_cache_bytes() {
  static const int64_t bytes = []() -> int64_t {
    if (const char* v = std::getenv("TFGRADS_L3_BYTES")) {
      char* end = nullptr;
      const long long forced = std::strtoll(v, &end, 10);
      TORCH_CHECK_VALUE(end != v && *end == '\0' && forced > 0,
                        "TFGRADS_L3_BYTES must be a positive byte count, got '", v, "'");
      return forced;
    }
    const int64_t reported = l3_reported_bytes();
    return reported > 0 ? reported : int64_t{32} << 20;
  }();
  return bytes;
}

namespace {
// 'p' forced pixel by pixel, 't' forced tiles, 0 not forced.
char depthwise_aliasing_forced() {
  static const char forced = [] {
    const char* v = std::getenv("TFGRADS_DEPTHWISE_ALIASING");
    const std::string s = v == nullptr ? std::string() : std::string(v);
    TORCH_CHECK_VALUE(s.empty() || s == "by_pixel" || s == "tiles",
                      "TFGRADS_DEPTHWISE_ALIASING must be by_pixel, tiles or unset, got '", s, "'");
    return s.empty() ? '\0' : s[0] == 'b' ? 'p' : 't';
  }();
  return forced;
}
}  // namespace

bool depthwise_aliasing_by_pixel(bool short_correlation_rows) {
  const char forced = depthwise_aliasing_forced();
  if (forced) return forced == 'p';
  return !cpu_has_avx512() || short_correlation_rows;
}

const char* depthwise_aliasing_name() {
  const char forced = depthwise_aliasing_forced();
  if (forced) return forced == 'p' ? "by_pixel" : "tiles";
  return cpu_has_avx512() ? "tiles_from_8_columns" : "by_pixel";
}

}  // namespace torch_tfgrads
