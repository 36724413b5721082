// Run-time choice of the CPU kernels' ISA paths (docs/benchmarks.md, "ISA paths"): the few
// AVX-512 kernels, and the RNN's oneDNN BRGEMM path.
//
// AVX-512 kernels. The extension is built for AVX2; a kernel that
// gains from 16-lane vectors and mask registers is written with intrinsics in a
// `#pragma GCC target` region (TFGRADS_AVX512_BEGIN / _END) and called only when
// avx512_enabled() says so, so one build runs on AVX2-only CPUs too.
#pragma once

#include <cstdint>

#if defined(__x86_64__) && defined(__GNUC__)
#define TFGRADS_HAVE_AVX512_KERNELS 1
#define TFGRADS_AVX512_BEGIN \
  _Pragma("GCC push_options") _Pragma("GCC target(\"avx512f,avx512bw,avx512vl,avx512dq\")")
#define TFGRADS_AVX512_END _Pragma("GCC pop_options")
#endif

namespace torch_tfgrads {

// The CPU has AVX-512 F/BW/VL/DQ (and this build has the AVX-512 kernels), whatever runs.
bool cpu_has_avx512();

// The CPU has AVX-512 F/BW/VL/DQ and ATen's own kernels run at AVX512 (so
// ATEN_CPU_CAPABILITY=avx2 switches ours off too, which the tests use to compare both), unless
// TFGRADS_CPU_CAPABILITY=avx2 turns ours off alone (=avx512 makes their absence an error).
bool avx512_enabled();

// The RNN may use oneDNN's BRGEMM micro-kernels (where ATen has them): TFGRADS_DISABLE_BRGEMM=1
// forces the per-step cells and ATen's GEMMs, to measure and test that path on any host.
bool brgemm_allowed();

// Non-temporal stores for the large outputs of the memory-bound kernels (worth_streaming in
// widen.h), unless TFGRADS_DISABLE_STREAMING=1 makes them ordinary stores, so that both can be
// measured on any host: which wins depends on whether the output could stay in the L3 (32 MiB
// on the AMD hosts measured, 300 MiB on the Intel one). Results are the same either way.
bool streaming_stores_allowed();

// The L3 cache that CPU 0 shares, as Linux's sysfs reports it (a VM's share, where
// sysconf reports the whole socket's); 0 where it is not reported (cpu.l3_bytes() in Python).
int64_t l3_reported_bytes();
// The L3 size the kernels plan with (whether a tensor comes from memory): TFGRADS_L3_BYTES=
// <bytes> where set, else the reported one, else 32 MiB.
int64_t l3_cache_bytes();

// Whether the RNN's BRGEMM path runs here: compiled into ATen, supported by this CPU, allowed
// (cudnn_rnn_brgemm.cpp).
bool rnn_brgemm_available();

// Whether the RNN's batched GEMMs (weight gradients, GRU's input projection) run on BRGEMM too,
// or through ATen: oneDNN's micro-kernels beat MKL there with AVX-512 (an AMD Zen 4 host, where
// MKL runs AVX2 code), MKL beats them on AVX2 hosts (docs/perf-notes/cudnn_rnn.md). So BRGEMM
// when it is available and our AVX-512 kernels are on (TFGRADS_CPU_CAPABILITY=avx2 forces ATen).
bool rnn_batched_gemms_on_brgemm();

// A bidirectional layer's two directions run each on its own thread of a two-thread CPU,
// except (with the fused BRGEMM steps, or the register tiles with rows to share) when a
// direction's weights, W and R, take more than this many bytes: then they run one after the
// other, each with both threads, as a unidirectional layer does (both directions' weights at
// once compete for the L3; docs/perf-notes/cudnn_rnn.md). The driver's per-step loop keeps a
// thread per direction. torch_tfgrads.cpu.cpu_paths() reports it.
constexpr int64_t kDirectionsInTurnAboveBytes = int64_t{3} << 20;
int64_t rnn_directions_in_turn_above_bytes();

// Where our AVX-512 kernels are off, BRGEMM's fused steps split each step's unit blocks between
// the threads (cudnn_rnn_brgemm.cpp), which costs a barrier per step and a share of h, or of dG,
// crossing cores. The register tiles (below) give each thread its own batch rows instead, at the
// price of every thread streaming the direction's W and R each step. So a direction that the
// threads share runs on the tiles while its W and R take at most this many bytes (the same size
// as kDirectionsInTurnAboveBytes, past which both layouts stream weights from the L3), 0 where
// BRGEMM's own rows run (AVX-512) or BRGEMM is not available. cpu_paths() reports it.
int64_t rnn_tiles_before_brgemm_up_to_bytes();

// Where BRGEMM does not run, the RNN's steps run on register tiles with each thread owning
// batch rows (cudnn_rnn_rows.h) once every thread gets at least this many (one thread: any);
// with fewer the driver's per-step loop splits each step's GEMM instead, as each thread would
// otherwise stream all of R once per step for a handful of rows. cpu_paths() reports it.
constexpr int64_t kRnnTiledStepsMinRowsPerThread = 8;

// Depthwise layers whose pixels alias in L1 (depthwise_conv2d_cpu.h), on the 8-lane path: the
// filter gradient and the 3x3 forward and input gradient run pixel by pixel over all channels,
// or as the sliding tiles. Pixel by pixel was the faster on a CPU without AVX-512 (Zen 3), the
// tiles when a CPU with AVX-512 runs the 8-lane kernels (Zen 4, TFGRADS_CPU_CAPABILITY=avx2),
// except for the forward and input gradient of rows of fewer than kAliasingTileColumns columns
// (Zen 5: 7-column rows took 0.59-0.83x the tiles' time pixel by pixel; their 4-column tiles
// leave a 3-column one per row); docs/perf-notes/depthwise_conv2d*.md. So pixel by pixel where
// the CPU lacks AVX-512, and for such short rows of those two ops everywhere, unless
// TFGRADS_DEPTHWISE_ALIASING=by_pixel|tiles forces either (to measure and test both anywhere).
// `short_correlation_rows`: the caller is the forward or input gradient and its destination
// rows have fewer than kAliasingTileColumns columns.
constexpr int64_t kAliasingTileColumns = 8;
bool depthwise_aliasing_by_pixel(bool short_correlation_rows = false);
// "by_pixel", "tiles" (forced) or "tiles_from_8_columns" (the default with AVX-512), for
// cpu_paths().
const char* depthwise_aliasing_name();

}  // namespace torch_tfgrads
