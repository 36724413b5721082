// CPU kernels of the DepthwiseConv2dNative family (../shared/spec/depthwise_cudnn_rnn.md A4-A6).
//
// Each op computes on whichever dense physical order its main tensor already has (never a
// transposing copy): channels-last memory (NHWC, or NCHW in channels_last format) or
// channels-first memory (NCHW, or a permuted NHWC). Half types accumulate in float.
//
// Channels-last, vectorised over channels. Forward and backprop-input are the same gathered
// correlation (depthwise::AxisTaps give, per destination row / column, the in-bounds
// (filter index, source index) pairs; strides, dilations and padding live only there):
//   dst[n, r, q, c] = sum_{(kr, sr) in rows[r]} sum_{(kq, sq) in cols[q]} src[n, sr, sq, c] * f[kr, kq, c]
// Consecutive destination columns whose taps are shifted copies of each other (the interior,
// for any padding) are computed as tiles of 8 or 4 pixels that share each filter load, so the
// inner loop issues ~1.1 loads per FMA; edge pixels take the general path. Parallel over
// (batch, row). The filter gradient accumulates per row into registers (taps x channel
// vectors), then into one partial per fixed chunk of rows (chunks do not depend on the thread
// count), summed in chunk order: deterministic. Depth multiplier M > 1 runs the same kernels
// on C*M channels (input channels repeated M times; the input gradient sums them back).
//
// Channels-first, vectorised over output columns: each (n, c) plane is copied once into a
// zero-padded, stride-phase-split float buffer, so every tap of every stride and dilation reads
// contiguous columns without bounds checks. Parallel over planes; the input gradient scatters
// into the plane's own buffer and the filter gradient keeps one partial per plane, summed over
// the batch in order: deterministic.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "common/channel_layout.h"
#include "common/depthwise_conv2d.h"
#include "cpu/avx512.h"
#include "cpu/depthwise_conv2d_avx512.h"
#include "cpu/widen.h"

#if defined(CPU_CAPABILITY_AVX2)
#include <immintrin.h>
#endif

namespace torch_tfgrads {
namespace {

using depthwise::AxisTaps;
using depthwise::Geometry;

template <typename scalar_t>
using acc_t = std::conditional_t<std::is_same_v<scalar_t, c10::Half> ||
                                     std::is_same_v<scalar_t, c10::BFloat16>,
                                 float, scalar_t>;

constexpr const char* kFwd = "depthwise_conv2d_native";
constexpr const char* kBwdInput = "depthwise_conv2d_native_backprop_input";
constexpr const char* kBwdFilter = "depthwise_conv2d_native_backprop_filter";

// ============================== channels-last ===============================================

// Non-temporal copy of whole 32-byte chunks (dst 32-byte aligned); AVX2 builds only.
#if defined(CPU_CAPABILITY_AVX2)
// src is 32-byte aligned; dst is aligned up with ordinary stores, then streamed in 32-byte
// chunks, the tail copied.
inline void stream_copy(void* dst, const void* src, int64_t bytes) {
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  const int64_t head = std::min<int64_t>(bytes, (32 - reinterpret_cast<uintptr_t>(d) % 32) % 32);
  std::memcpy(d, s, head);
  int64_t i = head;
  if (head == 0) {  // src and dst equally aligned: aligned loads
    for (; i + 32 <= bytes; i += 32)
      _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i),
                          _mm256_load_si256(reinterpret_cast<const __m256i*>(s + i)));
  } else {
    for (; i + 32 <= bytes; i += 32)
      _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i),
                          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i)));
  }
  std::memcpy(d + i, s + i, bytes - i);
}
#else
inline void stream_copy(void* dst, const void* src, int64_t bytes) { std::memcpy(dst, src, bytes); }
#endif

// Streams a staged row to its destination a slice at a time while the next row is computed:
// issued in one burst at the end of a row, the non-temporal stores stall on the few
// write-combining buffers; spread over the next row's tiles they drain behind its FMAs.
class RowStreamer {
 public:
  // Finishes the previous row, then queues this one (bytes to go out in `slices` steps).
  void start(void* dst, const void* src, int64_t bytes, int64_t slices) {
    finish();
    dst_ = static_cast<char*>(dst);
    src_ = static_cast<const char*>(src);
    left_ = bytes;
    slice_ = (bytes / std::max<int64_t>(1, slices) + 63) / 64 * 64;
  }
  void step() { copy(std::min(slice_, left_)); }
  void finish() { copy(left_); }

 private:
  void copy(int64_t n) {
    if (n <= 0) return;
    stream_copy(dst_, src_, n);
    dst_ += n;
    src_ += n;
    left_ -= n;
  }
  char* dst_ = nullptr;
  const char* src_ = nullptr;
  int64_t left_ = 0, slice_ = 0;
};

// Rows of a thread's destination computed into two L1/L2-resident staging rows (one being
// computed, the previous one streaming out in slices) when `on`, else straight in place.
template <typename scalar_t>
class StagedRows {
 public:
  StagedRows(bool on, int64_t row_elems) : on_(on), elems_(row_elems) {
    if (!on) return;
    const int64_t padded = (row_elems + 63) / 64 * 64;
    buf_.resize(2 * padded + 64);
    auto addr = (reinterpret_cast<uintptr_t>(buf_.data()) + 63) & ~uintptr_t{63};
    stage_[0] = reinterpret_cast<scalar_t*>(addr);
    stage_[1] = stage_[0] + padded;
  }
  // Where row i (destination dst) is computed.
  scalar_t* row(int64_t i, scalar_t* dst) const { return on_ ? stage_[i & 1] : dst; }
  // Between the row's pieces of work: the previous row's next slice goes out.
  void step() {
    if (on_) out_.step();
  }
  // Row i is complete: it goes out in `slices` steps during the next row.
  void done(int64_t i, scalar_t* dst, int64_t slices) {
    if (on_) out_.start(dst, stage_[i & 1], elems_ * sizeof(scalar_t), slices);
  }
  void finish() { out_.finish(); }

 private:
  bool on_;
  int64_t elems_;
  std::vector<scalar_t> buf_;
  scalar_t* stage_[2] = {nullptr, nullptr};
  RowStreamer out_;
};

// Whether pixels of C channels are a multiple of 1 KiB apart (e.g. 256 / 512 float channels):
// they then all fall into one or two L1 sets, and a tile's source pixels evict each other.
template <typename scalar_t>
bool pixels_alias_in_l1(int64_t C) {
  return (C * static_cast<int64_t>(sizeof(scalar_t))) % 1024 == 0;
}

// Channels [c0, c1) of n consecutive pixels of C channels; locality 3: into L1, 1: into L2.
template <typename T>
inline void prefetch_pixels(const T* first, int64_t n, int64_t C, int64_t c0, int64_t c1,
                            int locality) {
  for (int64_t i = 0; i < n; ++i) {
    const char* p = reinterpret_cast<const char*>(first + i * C + c0);
    const char* e = reinterpret_cast<const char*>(first + i * C + c1);
    for (; p < e; p += 64) {
      if (locality == 3)
        __builtin_prefetch(p, 0, 3);
      else
        __builtin_prefetch(p, 0, 1);
    }
  }
}

// run[q]: how many destination columns q, q+qstep, ... have taps that are copies of q's taps
// with sources shifted by sstep per step (q included).
std::vector<int64_t> shifted_runs(const AxisTaps& cols, int64_t dst, int64_t qstep,
                                  int64_t sstep) {
  std::vector<int64_t> run(dst, 1);
  for (int64_t q = dst - 1 - qstep; q >= 0; --q) {
    const int64_t a = cols.offset[q], b = cols.offset[q + qstep], n = cols.count(q);
    bool same = n == cols.count(q + qstep);
    for (int64_t t = 0; same && t < n; ++t)
      same = cols.k[a + t] == cols.k[b + t] && cols.src[a + t] + sstep == cols.src[b + t];
    if (same) run[q] = run[q + qstep] + 1;
  }
  return run;
}

struct RowSpan {
  int64_t lo = 0, hi = 0;  // source rows [lo, hi)
};

// Source/destination of one correlation (channels-last, M = 1, C channels).
template <typename scalar_t>
struct Correlation {
  const scalar_t* src;  // [N, Hs, Ws, C]
  const scalar_t* filt;  // [fh, fw, C]
  scalar_t* dst;  // [N, Hd, Wd, C]
  int64_t N, Hs, Ws, Hd, Wd, C, fw;
  const AxisTaps* rows;
  const AxisTaps* cols;
  const AxisTaps* vcols;  // the column taps unclipped (in_bounds = false), or nullptr
  int64_t qstep, sstep;  // destination / source column step between tiled pixels
  bool stream = false;   // the two-vector sliding-window tiles store non-temporally (float)
  bool wide = false;     // float, C % 16 == 0, AVX-512: the sliding-window tiles use it
};

// T pixels (destination columns q + t*qstep, sharing the taps of q, sources + t*sstep) by K
// channel vectors from channel c: acc in registers, each filter vector loaded once per tap.
template <typename scalar_t, int T, int K>
inline void correlate_block(const Correlation<scalar_t>& p, const scalar_t* simg,
                           const int64_t* rk, const int64_t* rs, int64_t nr, const int64_t* ck,
                           const int64_t* cs, int64_t nc, int64_t c, scalar_t* out) {
  using A = acc_t<scalar_t>;
  using Vec = Vectorized<A>;
  using Wd = Widen<scalar_t, A>;
  constexpr int64_t L = Vec::size();
  const int64_t C = p.C, sstep = p.sstep * C, dstep = p.qstep * C;
  Vec acc[T][K];
  for (int t = 0; t < T; ++t)
    for (int k = 0; k < K; ++k) acc[t][k] = Vec(A(0));
  for (int64_t a = 0; a < nr; ++a) {
    const scalar_t* srow = simg + rs[a] * p.Ws * C + c;
    const scalar_t* frow = p.filt + rk[a] * p.fw * C + c;
    for (int64_t b = 0; b < nc; ++b) {
      const scalar_t* sp = srow + cs[b] * C;
      const scalar_t* fp = frow + ck[b] * C;
      Vec fv[K];
      for (int k = 0; k < K; ++k) fv[k] = Wd::load(fp + k * L);
      for (int t = 0; t < T; ++t)
        for (int k = 0; k < K; ++k)
          acc[t][k] = at::vec::fmadd(Wd::load(sp + t * sstep + k * L), fv[k], acc[t][k]);
    }
  }
  for (int t = 0; t < T; ++t)
    for (int k = 0; k < K; ++k) Wd::store(out + t * dstep + k * L + c, acc[t][k]);
}

// The channels after the last full vector, one at a time.
template <typename scalar_t, int T>
inline void correlate_tail(const Correlation<scalar_t>& p, const scalar_t* simg,
                           const int64_t* rk, const int64_t* rs, int64_t nr, const int64_t* ck,
                           const int64_t* cs, int64_t nc, int64_t c0, int64_t c1,
                           scalar_t* out) {
  using A = acc_t<scalar_t>;
  const int64_t C = p.C;
  for (int t = 0; t < T; ++t) {
    for (int64_t c = c0; c < c1; ++c) {
      A acc = 0;
      for (int64_t a = 0; a < nr; ++a) {
        const scalar_t* srow = simg + rs[a] * p.Ws * C + t * p.sstep * C + c;
        const scalar_t* frow = p.filt + rk[a] * p.fw * C + c;
        for (int64_t b = 0; b < nc; ++b)
          acc += static_cast<A>(srow[cs[b] * C]) * static_cast<A>(frow[ck[b] * C]);
      }
      out[t * p.qstep * C + c] = static_cast<scalar_t>(acc);
    }
  }
}

template <typename scalar_t, int T, int K>
void correlate_pixels(const Correlation<scalar_t>& p, const scalar_t* simg, const int64_t* rk,
                      const int64_t* rs, int64_t nr, const RowSpan& next, int64_t q,
                      int64_t c0, int64_t c1, scalar_t* drow) {
  constexpr int64_t L = Vectorized<acc_t<scalar_t>>::size();
  const AxisTaps& cols = *p.cols;
  const int64_t* ck = cols.k.data() + cols.offset[q];
  const int64_t* cs = cols.src.data() + cols.offset[q];
  const int64_t nc = cols.count(q);
  for (int64_t r = next.lo; r < next.hi; ++r)  // as in slide_pixels
    for (int64_t b = 0; b < nc; ++b)
      for (int t = 0; t < T; ++t) {
        prefetch_pixels(simg + (r * p.Ws + cs[b] + t * p.sstep) * p.C, 1, p.C, c0, c1, 1);
      }
  scalar_t* out = drow + q * p.C;
  int64_t c = c0;
  for (; c + K * L <= c1; c += K * L)
    correlate_block<scalar_t, T, K>(p, simg, rk, rs, nr, ck, cs, nc, c, out);
  for (; c + L <= c1; c += L)
    correlate_block<scalar_t, T, 1>(p, simg, rk, rs, nr, ck, cs, nc, c, out);
  if (c < c1) correlate_tail<scalar_t, T>(p, simg, rk, rs, nr, ck, cs, nc, c, c1, out);
}

// Sliding-window fast path (3x3, 5x5, ... with unit dilation along W, source step 1 or 2):
// a tile's column taps read NC consecutive source columns s0, s0 + 1, ..., s0 + NC - 1 (the
// filter columns in order for the forward, reversed for the input gradient). Each source
// vector is then loaded once and feeds every pixel of the tile that uses it, with the NC
// filter vectors of the tap row held in registers: ~0.5 loads per FMA for a 3x3 forward.
constexpr int kMaxSlide = 5;
constexpr int64_t kChannelChunk = 64;

struct SlideTaps {
  int64_t s0 = 0, nc = 0;
  int64_t fidx[kMaxSlide] = {};  // filter column of source column s0 + b
  int64_t fresh = 0;  // source columns before s0 + fresh were prefetched by the previous tile
};

bool slide_taps(const int64_t* ck, const int64_t* cs, int64_t nc, SlideTaps* st) {
  if (nc < 1 || nc > kMaxSlide) return false;
  bool up = true, down = true;
  for (int64_t b = 0; b < nc; ++b) {
    up = up && cs[b] == cs[0] + b;
    down = down && cs[b] == cs[0] - b;
  }
  if (!up && !down) return false;
  st->nc = nc;
  st->s0 = up ? cs[0] : cs[nc - 1];
  for (int64_t b = 0; b < nc; ++b) st->fidx[b] = up ? ck[b] : ck[nc - 1 - b];
  return true;
}

// K channel vectors per step: K = 2 consumes whole 64-byte lines, for layers whose pixels alias
// in L1 (a line's second half would be evicted before the next step reads it). Clip: the tile
// reaches into the padding (st from the unclipped taps, s0 possibly negative): its sources
// outside [0, Ws) are skipped, in whole vectors only (C % L == 0, so there is no channel tail).
template <typename scalar_t, int NC, int S, int T, int K, bool Clip>
void slide_pixels(const Correlation<scalar_t>& p, const scalar_t* simg, const int64_t* rk,
                  const int64_t* rs, int64_t nr, const SlideTaps& st, const RowSpan& next,
                  int64_t c0, int64_t c1, scalar_t* out) {
  using A = acc_t<scalar_t>;
  using Vec = Vectorized<A>;
  using Wd = Widen<scalar_t, A>;
  constexpr int64_t L = Vec::size();
  constexpr int U = (T - 1) * S + NC;  // source columns of one tap row
  const int64_t C = p.C, dstep = p.qstep * C, s0 = st.s0;
  // The source columns s0 + u that exist: u in [ulo, uhi).
  const int ulo = Clip ? static_cast<int>(std::clamp<int64_t>(-s0, 0, U)) : 0;
  const int uhi = Clip ? static_cast<int>(std::clamp<int64_t>(p.Ws - s0, ulo, U)) : U;
  // The channel loop below revisits each pixel with a stride the hardware prefetchers do not
  // follow: prefetch, over this tile's columns, the source rows the next destination row adds
  // (from memory) into L2, one row of work ahead. (Measured: also prefetching the next tile into
  // L1 does not pay, here or in the filter gradient.)
  const int64_t fresh = std::max<int64_t>(ulo, st.fresh);
  if (fresh < uhi)
    for (int64_t r = next.lo; r < next.hi; ++r)
      prefetch_pixels(simg + (r * p.Ws + s0 + fresh) * C, uhi - fresh, C, c0, c1, 1);
  int64_t c = c0;
#ifdef TFGRADS_HAVE_AVX512_KERNELS
  if constexpr (std::is_same_v<scalar_t, float>) {
    if (p.wide) {  // one 16-lane vector is a whole line: K = 1
      c = depthwise_avx512::slide_tile<NC, S, T, Clip>(
          simg, p.Ws * C, s0, ulo, uhi, p.filt, p.fw * C, rk, rs, nr, st.fidx, C, c0, c1, out,
          dstep, p.stream && reinterpret_cast<uintptr_t>(out) % 64 == 0);
    }
  }
#endif
  for (; c + K * L <= c1; c += K * L) {
    Vec acc[T][K];
    for (int t = 0; t < T; ++t)
      for (int k = 0; k < K; ++k) acc[t][k] = Vec(A(0));
    for (int64_t a = 0; a < nr; ++a) {
      const scalar_t* xp = simg + rs[a] * p.Ws * C + c;
      const scalar_t* fr = p.filt + rk[a] * p.fw * C + c;
      Vec fv[NC][K];
#pragma GCC unroll 8
      for (int b = 0; b < NC; ++b)
        for (int k = 0; k < K; ++k) fv[b][k] = Wd::load(fr + st.fidx[b] * C + k * L);
#pragma GCC unroll 32
      for (int u = 0; u < U; ++u) {
        if (Clip && (u < ulo || u >= uhi)) continue;
        for (int k = 0; k < K; ++k) {
          const Vec xv = Wd::load(xp + (s0 + u) * C + k * L);
#pragma GCC unroll 16
          for (int t = 0; t < T; ++t) {
            const int b = u - t * S;
            if (b >= 0 && b < NC) acc[t][k] = at::vec::fmadd(xv, fv[b][k], acc[t][k]);
          }
        }
      }
    }
    for (int t = 0; t < T; ++t)
      for (int k = 0; k < K; ++k) {
        scalar_t* o = out + t * dstep + c + k * L;
        if constexpr (K == 2 && std::is_same_v<scalar_t, float>)
          if (p.stream) {  // whole lines: one 64-byte line per pixel and step
            stream_store(o, acc[t][k]);
            continue;
          }
        Wd::store(o, acc[t][k]);
      }
  }
  if (K > 1 && c + L <= c1) {
    slide_pixels<scalar_t, NC, S, T, 1, Clip>(p, simg, rk, rs, nr, st, RowSpan{}, c, c1, out);
    return;
  }
  if constexpr (!Clip) {
    if (c < c1) {  // channel tail through the general path
      int64_t ck[kMaxSlide], cs[kMaxSlide];
      for (int b = 0; b < NC; ++b) {
        ck[b] = st.fidx[b];
        cs[b] = s0 + b;
      }
      correlate_tail<scalar_t, T>(p, simg, rk, rs, nr, ck, cs, NC, c, c1, out);
    }
  }
}

// One piece of a destination row's work: the kernel for the pixels from column q. The column
// taps do not depend on the row, so the pieces of a row are planned once per call (column_plan)
// and every row runs the same plan.
template <typename scalar_t>
struct ColumnStep {
  using Fn = void (*)(const Correlation<scalar_t>&, const scalar_t*, const int64_t*,
                      const int64_t*, int64_t, const SlideTaps&, const RowSpan&, int64_t,
                      int64_t, int64_t, scalar_t*);
  Fn fn = nullptr;
  int64_t q = 0, t = 0;  // first column, pixels (tiles)
  SlideTaps st;
};

template <typename scalar_t, int NC, int S, int T, int K, bool Clip>
void slide_step(const Correlation<scalar_t>& p, const scalar_t* simg, const int64_t* rk,
                const int64_t* rs, int64_t nr, const SlideTaps& st, const RowSpan& next,
                int64_t q, int64_t c0, int64_t c1, scalar_t* drow) {
  slide_pixels<scalar_t, NC, S, T, K, Clip>(p, simg, rk, rs, nr, st, next, c0, c1,
                                            drow + q * p.C);
}

template <typename scalar_t, int T, int K>
void pixels_step(const Correlation<scalar_t>& p, const scalar_t* simg, const int64_t* rk,
                 const int64_t* rs, int64_t nr, const SlideTaps&, const RowSpan& next,
                 int64_t q, int64_t c0, int64_t c1, scalar_t* drow) {
  correlate_pixels<scalar_t, T, K>(p, simg, rk, rs, nr, next, q, c0, c1, drow);
}

// Only float layers tile into the padding (column_plan).
template <typename scalar_t, int NC, int S, int T, int K>
typename ColumnStep<scalar_t>::Fn slide_fn(bool clip) {
  if constexpr (std::is_same_v<scalar_t, float>)
    if (clip) return slide_step<scalar_t, NC, S, T, K, true>;
  return slide_step<scalar_t, NC, S, T, K, false>;
}

// The T-pixel sliding-window step for the pixels from column q, if their column taps (cols:
// p.cols, or the unclipped p.vcols) slide; clipped where the tile reaches into the padding.
template <typename scalar_t, int T, int K = 1>
bool slide_at(const Correlation<scalar_t>& p, const AxisTaps& cols, int64_t q,
              ColumnStep<scalar_t>* step) {
  if (p.sstep > 2) return false;
  if (!slide_taps(cols.k.data() + cols.offset[q], cols.src.data() + cols.offset[q],
                  cols.count(q), &step->st))
    return false;
  step->q = q;
  step->t = T;
  const int64_t U = (T - 1) * p.sstep + step->st.nc;
  const bool clip = step->st.s0 < 0 || step->st.s0 + U > p.Ws;
#define TFGRADS_SLIDE(NC)                                                               \
  case NC:                                                                              \
    step->fn = p.sstep == 1 ? slide_fn<scalar_t, NC, 1, T, K>(clip)                     \
                            : slide_fn<scalar_t, NC, 2, T, K>(clip);                    \
    return true;
  switch (step->st.nc) {
    TFGRADS_SLIDE(1)
    TFGRADS_SLIDE(2)
    TFGRADS_SLIDE(3)
    TFGRADS_SLIDE(4)
    TFGRADS_SLIDE(5)
    default: return false;
  }
#undef TFGRADS_SLIDE
}

// A 13-column sliding-window tile, float layers only (the AVX-512 tiles of correlate_channels_last).
template <typename scalar_t>
bool slide_13_at(const Correlation<scalar_t>& p, const AxisTaps& cols, int64_t q,
                 ColumnStep<scalar_t>* step) {
  if constexpr (std::is_same_v<scalar_t, float>) return slide_at<scalar_t, 13>(p, cols, q, step);
  return false;
}

// last[r]: the furthest source row that destination rows 0..r read (-1 before any): the rows
// r + 1 adds are (last[r], last[r + 1]], those to prefetch one row of work ahead.
std::vector<int64_t> furthest_sources(const AxisTaps& rows, int64_t dst) {
  std::vector<int64_t> last(dst, -1);
  for (int64_t r = 0; r < dst; ++r) {
    for (int64_t a = rows.offset[r]; a < rows.offset[r + 1]; ++a)
      last[r] = std::max(last[r], rows.src[a]);
    if (r > 0) last[r] = std::max(last[r], last[r - 1]);
  }
  return last;
}

// Whether a correlation's output goes beyond the caches (worth non-temporal stores), and whether
// it can be streamed straight from registers: float pixels of whole 64-byte lines.
template <typename scalar_t>
bool large_output(const Correlation<scalar_t>& p) {
  return worth_streaming(p.N * p.Hd * p.Wd * p.C * static_cast<int64_t>(sizeof(scalar_t)));
}
template <typename scalar_t>
bool streams_whole_lines(const Correlation<scalar_t>& p) {
  return large_output(p) && std::is_same_v<scalar_t, float> && p.C % 16 == 0 &&
         reinterpret_cast<uintptr_t>(p.dst) % 64 == 0;
}

// ---- few taps per destination pixel -----------------------------------------------------------
// The input gradient of a strided layer gives each dx pixel few taps (3x3 stride 2: 4, 2, 2 or
// 1; 2.25 on average), too few for the sliding-window tiles, whose setup per tile then costs
// more than their FMAs. Instead each pixel runs over all its channels with its taps' source and
// filter pointers fixed (NT taps unrolled): no per-tile setup, the sources are read in memory
// order, and a streamed pixel's lines are written whole, one after another.
template <typename scalar_t, int NT>
inline void correlate_pixels_run(const scalar_t* const* sp, const scalar_t* const* fp,
                                 int64_t nt, int64_t C, int64_t npix, int64_t sstep,
                                 int64_t dstep, bool stream, scalar_t* out) {
  using A = acc_t<scalar_t>;
  using Vec = Vectorized<A>;
  using Wd = Widen<scalar_t, A>;
  constexpr int64_t L = Vec::size();
  const int64_t n = NT > 0 ? NT : nt;  // NT = 0: any count, looped
  for (int64_t j = 0; j < npix; ++j, out += dstep) {
    const int64_t shift = j * sstep;
    int64_t c = 0;
    for (; c + L <= C; c += L) {
      Vec acc(A(0));
#pragma GCC unroll 9
      for (int64_t t = 0; t < n; ++t)
        acc = at::vec::fmadd(Wd::load(sp[t] + shift + c), Wd::load(fp[t] + c), acc);
      if constexpr (std::is_same_v<scalar_t, float>)
        if (stream) {
          stream_store(out + c, acc);
          continue;
        }
      Wd::store(out + c, acc);
    }
    for (; c < C; ++c) {
      A acc = 0;
      for (int64_t t = 0; t < n; ++t)
        acc += static_cast<A>(sp[t][shift + c]) * static_cast<A>(fp[t][c]);
      out[c] = static_cast<scalar_t>(acc);
    }
  }
}

// Average taps per destination pixel up to which correlate_by_pixel beats the tiles (measured,
// input gradients at stride 2: 3x3 (2.25 taps) 0.5-0.9x the tiles' time from 16 channels up;
// 5x5 (6.25 taps) 0.8x at 144 and 240 channels, 1.0-1.08x at 32 and 64).
constexpr double kFewTaps = 4.5, kFewTapsWide = 7;
constexpr int64_t kWideChannels = 128;
constexpr int64_t kMaxPixelTaps = 16;

int64_t max_count(const AxisTaps& taps, int64_t dst) {
  int64_t m = 0;
  for (int64_t i = 0; i < dst; ++i) m = std::max(m, taps.count(i));
  return m;
}

template <typename scalar_t>
bool few_taps_per_pixel(const Correlation<scalar_t>& p) {
  const double taps = static_cast<double>(p.rows->k.size()) * p.cols->k.size() /
                      std::max<double>(1, static_cast<double>(p.Hd) * p.Wd);
  const double limit = p.C >= kWideChannels ? kFewTapsWide : kFewTaps;
  return taps <= limit && p.C >= 8 &&
         max_count(*p.rows, p.Hd) * max_count(*p.cols, p.Wd) <= kMaxPixelTaps;
}

template <typename scalar_t>
void correlate_by_pixel(const Correlation<scalar_t>& p) {
  const AxisTaps& rows = *p.rows;
  const AxisTaps& cols = *p.cols;
  const int64_t C = p.C, row_elems = p.Wd * C;
  const std::vector<int64_t> run = shifted_runs(cols, p.Wd, p.qstep, p.sstep);
  // A large output is written with non-temporal stores: straight from the registers when
  // every pixel is whole 64-byte lines (float, C % 16 == 0; the phases write pixels out of
  // order), else through a staging row streamed out while the next row is computed.
  const bool large = large_output(p), stream = streams_whole_lines(p);
  const bool staged = large && !stream;
  const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, row_elems));
  at::parallel_for(0, p.N * p.Hd, grain, [&](int64_t begin, int64_t end) {
    const scalar_t* sp[kMaxPixelTaps];
    const scalar_t* fp[kMaxPixelTaps];
    StagedRows<scalar_t> rows_out(staged, row_elems);
    for (int64_t nr = begin; nr < end; ++nr) {
      const int64_t n = nr / p.Hd, r = nr % p.Hd;
      const scalar_t* simg = p.src + n * p.Hs * p.Ws * C;
      scalar_t* const dst_row = p.dst + nr * row_elems;
      scalar_t* drow = rows_out.row(nr, dst_row);
      // Pixel by pixel within each column phase: a run of pixels whose taps are shifted copies
      // shares one set of tap pointers and one unrolled kernel.
      for (int64_t q0 = 0; q0 < std::min(p.qstep, p.Wd); ++q0) {
        for (int64_t q = q0; q < p.Wd; q += run[q] * p.qstep) {
          int64_t nt = 0;
          for (int64_t a = rows.offset[r]; a < rows.offset[r + 1]; ++a)
            for (int64_t b = cols.offset[q]; b < cols.offset[q + 1]; ++b, ++nt) {
              sp[nt] = simg + (rows.src[a] * p.Ws + cols.src[b]) * C;
              fp[nt] = p.filt + (rows.k[a] * p.fw + cols.k[b]) * C;
            }
          rows_out.step();
          scalar_t* out = drow + q * C;
          const int64_t npix = run[q], ss = p.sstep * C, ds = p.qstep * C;
          switch (nt) {
            case 0:
              for (int64_t j = 0; j < npix; ++j) std::fill_n(out + j * ds, C, scalar_t(0));
              break;
#define TFGRADS_PIXELS(NT) \
  case NT: correlate_pixels_run<scalar_t, NT>(sp, fp, nt, C, npix, ss, ds, stream, out); break;
            TFGRADS_PIXELS(1)
            TFGRADS_PIXELS(2)
            TFGRADS_PIXELS(3)
            TFGRADS_PIXELS(4)
            TFGRADS_PIXELS(6)
            TFGRADS_PIXELS(9)
#undef TFGRADS_PIXELS
            default:
              correlate_pixels_run<scalar_t, 0>(sp, fp, nt, C, npix, ss, ds, stream, out);
          }
        }
      }
      rows_out.done(nr, dst_row, p.qstep * (p.Wd > 8 ? 4 : 1));  // about its runs
    }
    rows_out.finish();
    if (large) stream_fence();
  });
}

// A tile of the last 1-3 pixels of a run (float layers: the unclipped plan's row ends).
template <typename scalar_t>
bool short_tile_at(const Correlation<scalar_t>& p, const AxisTaps& cols, int64_t q, int64_t n,
                   ColumnStep<scalar_t>* step) {
  if constexpr (std::is_same_v<scalar_t, float>) {
    switch (n) {
      case 1: return slide_at<scalar_t, 1>(p, cols, q, step);
      case 2: return slide_at<scalar_t, 2>(p, cols, q, step);
      case 3: return slide_at<scalar_t, 3>(p, cols, q, step);
      default: return false;
    }
  }
  return false;
}

// The widest sliding-window tile for the pixels from column q (in phase q0) given the runs of
// columns whose taps are shifted copies (run over cols); advances q past them. short_tiles:
// a run's last 1-3 pixels as one short tile, else as a 4-pixel tile that starts earlier.
template <typename scalar_t>
bool tile_step(const Correlation<scalar_t>& p, const AxisTaps& cols,
               const std::vector<int64_t>& run, bool narrow_tiles, bool whole_13,
               bool short_tiles, int64_t q0, int64_t* qp, ColumnStep<scalar_t>* s) {
  const int64_t q = *qp, n = run[q], step = p.qstep;
  // The end of a run shorter than a tile is done as a tile that starts earlier in the same run
  // (recomputing a few pixels) rather than pixel by pixel.
  const int64_t back4 = q - (4 - n) * step;
  const bool back = back4 >= q0 && run[back4] >= 4;
  int64_t next = q;
  // Narrow tiles take two channel vectors (a whole 64-byte line) per step.
  if (whole_13 && n >= 13 && cols.count(q) == 3 && slide_13_at(p, cols, q, s)) {
    next = q + 13 * step;
  } else if (short_tiles && n < 4 && short_tile_at(p, cols, q, n, s)) {
    next = q + n * step;
  } else if (narrow_tiles && n >= 4 && slide_at<scalar_t, 4, 2>(p, cols, q, s)) {
    next = q + 4 * step;
  } else if (narrow_tiles && back && slide_at<scalar_t, 4, 2>(p, cols, back4, s)) {
    next = q + n * step;
  } else if (n >= 12 && cols.count(q) == 3 && slide_at<scalar_t, 12>(p, cols, q, s)) {
    next = q + 12 * step;  // 3 taps: 12 accumulators hide the FMA latency better
  } else if (n >= 10 && cols.count(q) == 5 && slide_at<scalar_t, 10>(p, cols, q, s)) {
    next = q + 10 * step;  // 5 taps: 10 accumulators
  } else if (n >= 8 && slide_at<scalar_t, 8>(p, cols, q, s)) {
    next = q + 8 * step;
  } else if (n >= 4 && slide_at<scalar_t, 4>(p, cols, q, s)) {
    next = q + 4 * step;
  } else if (back && slide_at<scalar_t, 4>(p, cols, back4, s)) {
    next = q + n * step;
  } else {
    return false;
  }
  *qp = next;
  return true;
}

// The pieces of every destination row, left to right within each column phase. Float layers
// in whole vectors plan their tiles on the unclipped taps (p.vcols), so a row's border pixels
// (SAME padding: 2 of 112 at each end for 5x5, which pixel by pixel took 17% of the forward's
// time at 16x112x112x32) join the tiles as clipped ones; other layers, and columns whose
// unclipped taps do not slide (dilation, over 5 taps), tile their in-bounds taps or go pixel by
// pixel.
template <typename scalar_t>
std::vector<ColumnStep<scalar_t>> column_plan(const Correlation<scalar_t>& p, bool narrow_tiles,
                                              bool whole_13) {
  constexpr int64_t L = Vectorized<acc_t<scalar_t>>::size();
  const bool unclipped = std::is_same_v<scalar_t, float> && p.vcols != nullptr && p.C % L == 0;
  const std::vector<int64_t> run = shifted_runs(*p.cols, p.Wd, p.qstep, p.sstep);
  const std::vector<int64_t> vrun =
      unclipped ? shifted_runs(*p.vcols, p.Wd, p.qstep, p.sstep) : std::vector<int64_t>{};
  std::vector<ColumnStep<scalar_t>> plan;
  for (int64_t q0 = 0; q0 < std::min(p.qstep, p.Wd); ++q0) {
    int64_t prefetched = std::numeric_limits<int64_t>::min();  // source columns up to here
    for (int64_t q = q0; q < p.Wd;) {
      ColumnStep<scalar_t> s;
      if ((unclipped && tile_step(p, *p.vcols, vrun, narrow_tiles, whole_13, true, q0, &q, &s)) ||
          tile_step(p, *p.cols, run, narrow_tiles, whole_13, false, q0, &q, &s)) {
        // A tile prefetches only the source columns the tile before it did not.
        const int64_t end = s.st.s0 + (s.t - 1) * p.sstep + s.st.nc;
        s.st.fresh = std::clamp<int64_t>(prefetched - s.st.s0, 0, end - s.st.s0);
        prefetched = end;
        plan.push_back(s);
        continue;
      }
      prefetched = std::numeric_limits<int64_t>::min();
      s.q = q;
      if (run[q] >= 2) {
        s.fn = pixels_step<scalar_t, 2, 4>;
        q += 2 * p.qstep;
      } else {
        s.fn = pixels_step<scalar_t, 1, 4>;
        q += p.qstep;
      }
      plan.push_back(s);
    }
  }
  return plan;
}

template <typename scalar_t>
void correlate_channels_last(const Correlation<scalar_t>& p) {
  if (few_taps_per_pixel(p)) {
    correlate_by_pixel(p);
    return;
  }
  const AxisTaps& rows = *p.rows;
  const std::vector<int64_t> last_src = furthest_sources(rows, p.Hd);
  const int64_t taps = std::max<int64_t>(1, rows.k.size() / std::max<int64_t>(1, p.Hd)) *
                       std::max<int64_t>(1, p.cols->k.size() / std::max<int64_t>(1, p.Wd));
  const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, p.Wd * p.C * taps));
  // Layers whose pixels alias in L1 use 4-column tiles (measured in cache, 14x14x512: 4-column
  // tiles 1.06x PyTorch's time, 12-column 1.51x) of two channel vectors, which use each source
  // line whole before it can be evicted (another 1.2x faster than one vector per step).
  const bool narrow_tiles = pixels_alias_in_l1<scalar_t>(p.C);
  // Large outputs (far beyond the caches, where a consumer could not find them anyway) are
  // written with non-temporal stores: no read-for-ownership of the output lines, no cache
  // pollution. Each row is computed into an L1/L2-resident buffer and streamed from there,
  // except where the tiles fill whole lines and stream straight from registers (p.stream; edge
  // pixels store normally): float layers with narrow tiles (two 8-lane vectors per step) and
  // AVX-512 tiles (one 16-lane vector is a line; 0.86-0.89x the staged rows' time at
  // 32x56x56x64 and 16x112x112x32). (Streaming 8-lane tiles directly, half lines at a time,
  // made the 56x56x64 forward 2.5x slower.)
  const int64_t row_elems = p.Wd * p.C;
  const bool large = large_output(p);
  Correlation<scalar_t> pd = p;
  pd.wide = std::is_same_v<scalar_t, float> && p.C % 16 == 0 && avx512_enabled();
  pd.stream = (narrow_tiles || pd.wide) && streams_whole_lines(p);
  const bool streaming = large && !pd.stream;  // through the row buffer
  // A 16-lane vector is a whole line, so AVX-512 tiles need not be narrow where pixels alias in
  // L1: there, a 3-tap run of 13 or more columns (28x28x256 at stride 2: 13) starts with one
  // 13-column tile instead of 4-column ones and a tile that recomputes 3 pixels. Paired in one
  // process: 0.71-0.86x the time in four of six pairs at 32x28x28x256 stride 2, 1.09-1.10x in
  // two taken in a slow phase of the host; 0.73-0.79x at N = 8.
  const bool whole_13 = pd.wide && narrow_tiles;
  const std::vector<ColumnStep<scalar_t>> plan = column_plan(pd, narrow_tiles, whole_13);
  at::parallel_for(0, p.N * p.Hd, grain, [&](int64_t begin, int64_t end) {
    StagedRows<scalar_t> rows_out(streaming, row_elems);
    // Tile steps per row, roughly: the previous row goes out in that many slices.
    const int64_t steps =
        std::max<int64_t>(1, p.Wd / 8) * ((p.C + kChannelChunk - 1) / kChannelChunk);
    for (int64_t nr = begin; nr < end; ++nr) {
      const int64_t n = nr / p.Hd, r = nr % p.Hd;
      const scalar_t* simg = p.src + n * p.Hs * p.Ws * p.C;
      scalar_t* const dst_row = p.dst + nr * row_elems;
      scalar_t* drow = rows_out.row(nr, dst_row);
      const int64_t* rk = rows.k.data() + rows.offset[r];
      const int64_t* rs = rows.src.data() + rows.offset[r];
      const int64_t nrt = rows.count(r);
      RowSpan next;
      if (r + 1 < p.Hd) {
        next.lo = last_src[r] + 1;
        next.hi = last_src[r + 1] + 1;
      }
      // Channels in chunks of kChannelChunk: a tile's source pixels (tap rows x tile columns x
      // chunk) stay within L1 however many channels there are.
      for (int64_t c0 = 0; c0 < p.C; c0 += kChannelChunk) {
        const int64_t c1 = std::min(p.C, c0 + kChannelChunk);
        for (const ColumnStep<scalar_t>& step : plan) {
          rows_out.step();
          step.fn(pd, simg, rk, rs, nrt, step.st, next, step.q, c0, c1, drow);
        }
      }
      rows_out.done(nr, dst_row, steps);
    }
    rows_out.finish();
    if (large) stream_fence();
  });
}

// ---- filter gradient, channels-last -----------------------------------------------------------
// One row of out_backprop (n, i) against one source row (tap row kr): for the output columns
// [q, q + len) sharing q's NC column taps (shifted by sW per column), K channel vectors from c:
//   part[kr, ck[b], c..] += sum_t x[h, cs[b] + t*sW, c..] * dy[i, q + t, c..]
template <typename scalar_t, int NC, int K>
inline void filter_grad_run(const scalar_t* xrow, const scalar_t* dyrow, const int64_t* ck,
                            const int64_t* cs, int64_t q, int64_t len, int64_t sW, int64_t C,
                            int64_t c, acc_t<scalar_t>* part) {
  using A = acc_t<scalar_t>;
  using Vec = Vectorized<A>;
  using Wd = Widen<scalar_t, A>;
  constexpr int64_t L = Vec::size();
  Vec acc[NC][K];
  for (int b = 0; b < NC; ++b)
    for (int k = 0; k < K; ++k) acc[b][k] = Vec(A(0));
  const scalar_t* dp = dyrow + q * C + c;
  const scalar_t* xp = xrow + c;
  const int64_t xstep = sW * C;
  int64_t xo[NC];
  for (int b = 0; b < NC; ++b) xo[b] = cs[b] * C;
  for (int64_t t = 0; t < len; ++t, dp += C, xp += xstep) {
    Vec d[K];
    for (int k = 0; k < K; ++k) d[k] = Wd::load(dp + k * L);
    for (int b = 0; b < NC; ++b)
      for (int k = 0; k < K; ++k)
        acc[b][k] = at::vec::fmadd(Wd::load(xp + xo[b] + k * L), d[k], acc[b][k]);
  }
  for (int b = 0; b < NC; ++b) {
    A* pp = part + ck[b] * C + c;
    for (int k = 0; k < K; ++k) (Vec::loadu(pp + k * L) + acc[b][k]).store(pp + k * L);
  }
}

// The same for a tile of exactly 8 columns whose taps read consecutive source columns (unit
// dilation along W) at source step S: fully unrolled, so each source vector is loaded once and
// reused by every (column, tap) pair that reads it (S = 1: 10 loads instead of 24 for 3 taps).
template <typename scalar_t, int NC, int K, int S>
inline void filter_grad_tile(const scalar_t* xrow, const scalar_t* dyrow, const int64_t* ck,
                             int64_t s0, int64_t q, int64_t C, int64_t c, acc_t<scalar_t>* part) {
  using A = acc_t<scalar_t>;
  using Vec = Vectorized<A>;
  using Wd = Widen<scalar_t, A>;
  constexpr int64_t L = Vec::size();
  constexpr int T = 8;
  Vec acc[NC][K];
  for (int b = 0; b < NC; ++b)
    for (int k = 0; k < K; ++k) acc[b][k] = Vec(A(0));
  const scalar_t* dp = dyrow + q * C + c;
  const scalar_t* xp = xrow + s0 * C + c;
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) {
    Vec d[K];
#pragma GCC unroll 4
    for (int k = 0; k < K; ++k) d[k] = Wd::load(dp + t * C + k * L);
#pragma GCC unroll 8
    for (int b = 0; b < NC; ++b)
#pragma GCC unroll 4
      for (int k = 0; k < K; ++k)
        acc[b][k] = at::vec::fmadd(Wd::load(xp + (t * S + b) * C + k * L), d[k], acc[b][k]);
  }
  for (int b = 0; b < NC; ++b) {
    A* pp = part + ck[b] * C + c;
    for (int k = 0; k < K; ++k) (Vec::loadu(pp + k * L) + acc[b][k]).store(pp + k * L);
  }
}

// 3x3 interior: the three tap rows of an 8- or 4-column tile at once (9 accumulators of one channel
// vector), so each out_backprop vector is loaded once for all nine taps.
template <typename scalar_t, int S, int T>
inline void filter_grad_tile_3x3(const scalar_t* const* xrows, const scalar_t* dyrow,
                                 const int64_t* ck, int64_t s0, int64_t q, int64_t C, int64_t c,
                                 acc_t<scalar_t>* const* parts) {
  using A = acc_t<scalar_t>;
  using Vec = Vectorized<A>;
  using Wd = Widen<scalar_t, A>;
  Vec acc[3][3];
  for (int a = 0; a < 3; ++a)
    for (int b = 0; b < 3; ++b) acc[a][b] = Vec(A(0));
  const scalar_t* dp = dyrow + q * C + c;
  const scalar_t* x0 = xrows[0] + s0 * C + c;
  const scalar_t* x1 = xrows[1] + s0 * C + c;
  const scalar_t* x2 = xrows[2] + s0 * C + c;
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) {
    const Vec d = Wd::load(dp + t * C);
#pragma GCC unroll 3
    for (int b = 0; b < 3; ++b) {
      const int64_t o = (t * S + b) * C;
      acc[0][b] = at::vec::fmadd(Wd::load(x0 + o), d, acc[0][b]);
      acc[1][b] = at::vec::fmadd(Wd::load(x1 + o), d, acc[1][b]);
      acc[2][b] = at::vec::fmadd(Wd::load(x2 + o), d, acc[2][b]);
    }
  }
  for (int a = 0; a < 3; ++a)
    for (int b = 0; b < 3; ++b) {
      A* pp = parts[a] + ck[b] * C + c;
      (Vec::loadu(pp) + acc[a][b]).store(pp);
    }
}

// 3x3 interior, a run of any length: the three tap rows of len columns whose taps read
// consecutive source columns at source step S, at once (9 accumulators of one channel vector),
// so each out_backprop vector is loaded once for all nine taps and the 3 - S source columns a
// step shares with the next stay in registers. Per lane the sums of filter_grad_run, in order.
template <typename scalar_t, int S>
inline void filter_grad_run_3x3(const scalar_t* const* xrows, const scalar_t* dyrow,
                                const int64_t* ck, int64_t s0, int64_t q, int64_t len,
                                int64_t C, int64_t c, acc_t<scalar_t>* const* parts) {
  using A = acc_t<scalar_t>;
  using Vec = Vectorized<A>;
  using Wd = Widen<scalar_t, A>;
  Vec acc[3][3], xv[3][3];
  const scalar_t* xp[3];
  for (int a = 0; a < 3; ++a) {
    xp[a] = xrows[a] + s0 * C + c;
    for (int b = 0; b < 3; ++b) acc[a][b] = Vec(A(0));
    for (int b = 0; b < 3 - S; ++b) xv[a][b] = Wd::load(xp[a] + b * C);
  }
  const scalar_t* dp = dyrow + q * C + c;
  for (int64_t t = 0; t < len; ++t) {
    const Vec d = Wd::load(dp + t * C);
#pragma GCC unroll 3
    for (int a = 0; a < 3; ++a) {
      for (int b = 3 - S; b < 3; ++b) xv[a][b] = Wd::load(xp[a] + (t * S + b) * C);
      for (int b = 0; b < 3; ++b) acc[a][b] = at::vec::fmadd(xv[a][b], d, acc[a][b]);
      for (int b = 0; b < 3 - S; ++b) xv[a][b] = xv[a][b + S];
    }
  }
  for (int a = 0; a < 3; ++a)
    for (int b = 0; b < 3; ++b) {
      A* pp = parts[a] + ck[b] * C + c;
      (Vec::loadu(pp) + acc[a][b]).store(pp);
    }
}

// Any number of column taps, one channel at a time (edges of unusual filters, channel tails).
template <typename scalar_t>
inline void filter_grad_scalar(const scalar_t* xrow, const scalar_t* dyrow, const int64_t* ck,
                               const int64_t* cs, int64_t nc, int64_t q, int64_t len, int64_t sW,
                               int64_t C, int64_t c0, int64_t c1, acc_t<scalar_t>* part) {
  using A = acc_t<scalar_t>;
  for (int64_t b = 0; b < nc; ++b) {
    for (int64_t c = c0; c < c1; ++c) {
      A acc = 0;
      for (int64_t t = 0; t < len; ++t)
        acc += static_cast<A>(xrow[(cs[b] + t * sW) * C + c]) *
               static_cast<A>(dyrow[(q + t) * C + c]);
      part[ck[b] * C + c] += acc;
    }
  }
}

// The source rows of one output row (tap rows) and the partial filter rows they add into.
template <typename scalar_t>
struct TapRows {
  const scalar_t* x[64];
  acc_t<scalar_t>* part[64];
  int64_t n = 0;
};

// All tap rows of one output row over the columns [q, q + len) (at most a tile), channel
// block by channel block: the tile's pixels stay in L1 while every channel is done.
template <typename scalar_t, int NC>
void filter_grad_columns(const TapRows<scalar_t>& rows, const scalar_t* dyrow, const int64_t* ck,
                         const int64_t* cs, int64_t q, int64_t len, int64_t sW, int64_t C,
                         int64_t c0, int64_t c1, bool wide) {
  constexpr int64_t L = Vectorized<acc_t<scalar_t>>::size();
  constexpr int K = NC <= 3 ? 2 : 1;
  // Taps that read consecutive source columns (unit dilation along W) at source step 1 or 2.
  bool consecutive = sW <= 2;
  for (int b = 1; consecutive && b < NC; ++b) consecutive = cs[b] == cs[0] + b;
  int64_t c = c0;
  // Where pixels alias in L1 (as in the correlation) each tap row takes the two-vector tiles
  // below, which use a source line whole before it can be evicted (the one-vector 3x3 tile was
  // 8-10% slower on 14x14x512 and 28x28x256 in 8-lane vectors). A 16-lane vector is a whole
  // line: the AVX-512 3x3 run takes every layer.
  const bool aliasing = pixels_alias_in_l1<scalar_t>(C);
  const bool run_3x3 = NC == 3 && consecutive && rows.n == 3;
#ifdef TFGRADS_HAVE_AVX512_KERNELS
  if constexpr (std::is_same_v<scalar_t, float>) {
    if (wide) {  // the same tiles in 16-lane vectors (one is a whole line)
      if (run_3x3) {
        c = sW == 1 ? depthwise_avx512::filter_run_3x3<1>(rows.x, dyrow, ck, cs[0], q, len, C,
                                                          c, c1, rows.part)
                    : depthwise_avx512::filter_run_3x3<2>(rows.x, dyrow, ck, cs[0], q, len, C,
                                                          c, c1, rows.part);
      } else if (consecutive && len == 8) {
        int64_t end = c;
        for (int64_t a = 0; a < rows.n; ++a)
          end = sW == 1 ? depthwise_avx512::filter_tile<NC, 1>(rows.x[a], dyrow, ck, cs[0], q, C,
                                                               c, c1, rows.part[a])
                        : depthwise_avx512::filter_tile<NC, 2>(rows.x[a], dyrow, ck, cs[0], q, C,
                                                               c, c1, rows.part[a]);
        c = end;
      }
    }
  }
#endif
  if (run_3x3 && !aliasing) {
    // 8- and 4-column tiles fully unrolled (in 8 lanes the run's loop was slower on them at
    // 56x56x64), other lengths as a run: the same sums either way.
    const auto* xr = rows.x;
    for (; c + L <= c1; c += L) {
      if (sW == 1 && len == 8)
        filter_grad_tile_3x3<scalar_t, 1, 8>(xr, dyrow, ck, cs[0], q, C, c, rows.part);
      else if (sW == 1 && len == 4)
        filter_grad_tile_3x3<scalar_t, 1, 4>(xr, dyrow, ck, cs[0], q, C, c, rows.part);
      else if (sW == 1)
        filter_grad_run_3x3<scalar_t, 1>(xr, dyrow, ck, cs[0], q, len, C, c, rows.part);
      else if (len == 8)
        filter_grad_tile_3x3<scalar_t, 2, 8>(xr, dyrow, ck, cs[0], q, C, c, rows.part);
      else if (len == 4)
        filter_grad_tile_3x3<scalar_t, 2, 4>(xr, dyrow, ck, cs[0], q, C, c, rows.part);
      else
        filter_grad_run_3x3<scalar_t, 2>(xr, dyrow, ck, cs[0], q, len, C, c, rows.part);
    }
  }
  if (consecutive && len == 8) {
    for (; c + K * L <= c1; c += K * L)
      for (int64_t a = 0; a < rows.n; ++a) {
        if (sW == 1)
          filter_grad_tile<scalar_t, NC, K, 1>(rows.x[a], dyrow, ck, cs[0], q, C, c,
                                               rows.part[a]);
        else
          filter_grad_tile<scalar_t, NC, K, 2>(rows.x[a], dyrow, ck, cs[0], q, C, c,
                                               rows.part[a]);
      }
  }
  for (; c + K * L <= c1; c += K * L)
    for (int64_t a = 0; a < rows.n; ++a)
      filter_grad_run<scalar_t, NC, K>(rows.x[a], dyrow, ck, cs, q, len, sW, C, c, rows.part[a]);
  for (; c + L <= c1; c += L)
    for (int64_t a = 0; a < rows.n; ++a)
      filter_grad_run<scalar_t, NC, 1>(rows.x[a], dyrow, ck, cs, q, len, sW, C, c, rows.part[a]);
  if (c < c1)
    for (int64_t a = 0; a < rows.n; ++a)
      filter_grad_scalar(rows.x[a], dyrow, ck, cs, NC, q, len, sW, C, c, c1, rows.part[a]);
}

template <typename scalar_t>
void filter_grad_segment(const TapRows<scalar_t>& rows, const scalar_t* dyrow, const int64_t* ck,
                         const int64_t* cs, int64_t nc, int64_t q, int64_t len, int64_t sW,
                         int64_t C, int64_t c0, int64_t c1, bool wide) {
#define TFGRADS_FG(NC)                                                                    \
  case NC:                                                                                \
    return filter_grad_columns<scalar_t, NC>(rows, dyrow, ck, cs, q, len, sW, C, c0, c1, wide);
  switch (nc) {
    case 0: return;
    TFGRADS_FG(1)
    TFGRADS_FG(2)
    TFGRADS_FG(3)
    TFGRADS_FG(4)
    TFGRADS_FG(5)
    TFGRADS_FG(6)
    TFGRADS_FG(7)
    default:
      for (int64_t a = 0; a < rows.n; ++a)
        filter_grad_scalar(rows.x[a], dyrow, ck, cs, nc, q, len, sW, C, c0, c1, rows.part[a]);
  }
#undef TFGRADS_FG
}

// df[fh, fw, C] (M = 1) from x [N, H, W, C] and dy [N, Ho, Wo, C].
template <typename scalar_t>
void filter_grad_channels_last(const scalar_t* x, const scalar_t* dy, scalar_t* df,
                               const Geometry& g, int64_t C, const AxisTaps& rows,
                               const AxisTaps& cols) {
  using A = acc_t<scalar_t>;
  const std::vector<int64_t> run = shifted_runs(cols, g.Wo, 1, g.sW);
  const int64_t R = g.N * g.Ho, F = g.fh * g.fw * C;
  const bool wide = std::is_same_v<scalar_t, float> && C % 16 == 0 && avx512_enabled();
  // Fixed chunks of rows (independent of the thread count): deterministic sums.
  const int64_t rows_per_chunk = std::max<int64_t>(
      1, std::max<int64_t>((R + 63) / 64, 65536 / std::max<int64_t>(1, g.Wo * C)));
  const int64_t chunks = (R + rows_per_chunk - 1) / rows_per_chunk;
  std::vector<A> part(static_cast<size_t>(chunks * F), A(0));
  // Source rows [first_new[i], last_src[i]] are those output row i reads that row i - 1 does
  // not (all of them for i = 0): the rows to prefetch one output row ahead. Prefetching all of
  // the next row's tap rows instead, most of them already in cache, made the prefetches a third
  // of the driver's samples; measured against it, this takes 0.86-0.98x the time at 12 of 13
  // shapes (1.04 at 56x56x128 stride 2).
  const std::vector<int64_t> last_src = furthest_sources(rows, g.Ho);
  // Layers whose pixels alias in L1 (256 / 512 float channels: short rows of few pixels) take
  // the last 16 or fewer columns of a 3-tap run as one tile, which adds its sums into the
  // partial once. Measured against 8 + 4 + rest, paired in one process: 28x28x256 stride 2
  // (13 columns) 0.83-0.90x the time with AVX-512, 14x14x512 (12) 0.82x with AVX-512 and 0.90x
  // with AVX2. (At 56x56x64 a 14-column tail in AVX2 took 1.13x the time of 8 + 4 + 2.)
  const bool merge_3 = pixels_alias_in_l1<scalar_t>(C);
  std::vector<int64_t> first_new(g.Ho, g.H);
  for (int64_t i = 1; i < g.Ho; ++i) first_new[i] = last_src[i - 1] + 1;
  for (int64_t a = rows.offset[0]; a < rows.offset[1]; ++a)
    first_new[0] = std::min(first_new[0], rows.src[a]);
  at::parallel_for(0, chunks, 1, [&](int64_t cb, int64_t ce) {
    for (int64_t ch = cb; ch < ce; ++ch) {
      A* pc = part.data() + ch * F;
      for (int64_t nr = ch * rows_per_chunk; nr < std::min(R, (ch + 1) * rows_per_chunk); ++nr) {
        const int64_t n = nr / g.Ho, i = nr % g.Ho;
        const int64_t n1 = (nr + 1) / g.Ho, i1 = (nr + 1) % g.Ho;  // the next output row
        const scalar_t* dyrow = dy + nr * g.Wo * C;
        for (int64_t a0 = rows.offset[i]; a0 < rows.offset[i + 1]; a0 += 64) {
          TapRows<scalar_t> tr;  // (more than 64 tap rows: in groups of 64)
          for (int64_t a = a0; a < std::min(rows.offset[i + 1], a0 + 64); ++a, ++tr.n) {
            tr.x[tr.n] = x + (n * g.H + rows.src[a]) * g.W * C;
            tr.part[tr.n] = pc + rows.k[a] * g.fw * C;
          }
          // Channels in chunks (as the correlation): a tile's pixels stay within L1.
          for (int64_t c0 = 0; c0 < C; c0 += kChannelChunk) {
            const int64_t c1 = std::min(C, c0 + kChannelChunk);
            for (int64_t q = 0; q < g.Wo;) {
              const int64_t len = run[q], o = cols.offset[q], nc = cols.count(q);
              // Tiles of 8 (then 4) columns of a run share q's taps, shifted by sW per column.
              for (int64_t t0 = 0, tl = 0; t0 < len; t0 += tl) {
                int64_t cs[16];
                const int64_t* src = cols.src.data() + o;
                const bool fits = nc <= 16;
                if (fits)
                  for (int64_t b = 0; b < nc; ++b) cs[b] = src[b] + t0 * g.sW;
                const int64_t rest = len - t0;
                tl = !fits                              ? len
                     : merge_3 && nc == 3 && rest <= 16 ? rest
                     : rest >= 8                        ? 8
                     : rest >= 4                        ? 4
                                                        : rest;
                // The next output row's new rows into L2. (The next tile of this row was also
                // prefetched into L1 until measured on Zen 4, paired in one process: without
                // it 0.79x the time at 32x56x56x64 (0.81x at AVX2), 0.84x at 16x112x112x32 5x5,
                // 0.91x at 32x28x28x256 stride 2, 1.0x at 64x14x14x512.)
                if (nr + 1 < R && fits && nc > 0) {
                  prefetch_pixels(dyrow + (g.Wo + q + t0) * C, tl, C, c0, c1, 1);
                  for (int64_t h = first_new[i1]; h <= last_src[i1]; ++h)
                    prefetch_pixels(x + ((n1 * g.H + h) * g.W + cs[0]) * C,
                                    std::min(tl * g.sW + nc, g.W - cs[0]), C, c0, c1, 1);
                }
                filter_grad_segment(tr, dyrow, cols.k.data() + o, fits ? cs : src, nc, q + t0,
                                    tl, g.sW, C, c0, c1, wide);
                if (!fits) break;
              }
              q += len;
            }
          }
        }
      }
    }
  });
  at::parallel_for(0, F, 2048, [&](int64_t b, int64_t e) {
    for (int64_t f = b; f < e; ++f) {
      A s = 0;
      for (int64_t ch = 0; ch < chunks; ++ch) s += part[ch * F + f];
      df[f] = static_cast<scalar_t>(s);
    }
  });
}

// ============================== channels-first ==============================================

// A zero-padded plane split into sW column phases: element (R, Q) of the padded plane (R = h +
// pt, Q = w + pl) is buf[((Q % sW) * rows + R) * pitch + Q / sW]. Tap (di, dj) of output (i, j)
// is then buf[phase(dj)][i*sH + di*dH][j + shift(dj)]: contiguous in j for every stride.
struct PhasePlane {
  int64_t rows, pitch, sW;
  int64_t size() const { return sW * rows * pitch; }
  int64_t at(int64_t R, int64_t Q) const { return ((Q % sW) * rows + R) * pitch + Q / sW; }
  int64_t tap(int64_t R, int64_t dj_off) const {  // dj_off = dj * dW
    return ((dj_off % sW) * rows + R) * pitch + dj_off / sW;
  }
};

template <typename A>
PhasePlane phase_plane(const Geometry& g) {
  constexpr int64_t L = Vectorized<A>::size();
  PhasePlane pp;
  pp.sW = g.sW;
  pp.rows = std::max(g.H + g.pt, (g.Ho - 1) * g.sH + (g.fh - 1) * g.dH + 1);
  const int64_t wo_pad = (g.Wo + L - 1) / L * L;  // vector overrun of the last column block
  const int64_t cols = std::max(g.W + g.pl, (wo_pad - 1) * g.sW + (g.fw - 1) * g.dW + 1);
  pp.pitch = (cols + g.sW - 1) / g.sW + 1;
  return pp;
}

template <typename scalar_t, typename A>
inline void load_plane(const scalar_t* x, const Geometry& g, const PhasePlane& pp, A* buf) {
  std::fill(buf, buf + pp.size(), A(0));
  for (int64_t h = 0; h < g.H; ++h)
    for (int64_t w = 0; w < g.W; ++w)
      buf[pp.at(h + g.pt, w + g.pl)] = static_cast<A>(x[h * g.W + w]);
}

// Up to n (< L) elements widened into a vector, the rest zero.
template <typename scalar_t, typename A>
inline Vectorized<A> load_partial(const scalar_t* p, int64_t n) {
  A tmp[Vectorized<A>::size()] = {};
  for (int64_t i = 0; i < n; ++i) tmp[i] = static_cast<A>(p[i]);
  return Vectorized<A>::loadu(tmp);
}

template <typename scalar_t, typename A>
inline void store_partial(scalar_t* p, const Vectorized<A>& v, int64_t n) {
  A tmp[Vectorized<A>::size()];
  v.store(tmp);
  for (int64_t i = 0; i < n; ++i) p[i] = static_cast<scalar_t>(tmp[i]);
}

// Parallel grain of the per-plane kernels: about 16K multiply-adds per task.
int64_t plane_grain(const Geometry& g) {
  return std::max<int64_t>(1, 16384 / std::max<int64_t>(1, g.Ho * g.Wo * g.fh * g.fw));
}

template <typename scalar_t>
void forward_channels_first(const scalar_t* x, const scalar_t* f, scalar_t* out,
                            const Geometry& g) {
  using A = acc_t<scalar_t>;
  using Vec = Vectorized<A>;
  using Wd = Widen<scalar_t, A>;
  constexpr int64_t L = Vec::size();
  const PhasePlane pp = phase_plane<A>(g);
  const int64_t taps = g.fh * g.fw, CM = g.C * g.M;
  at::parallel_for(0, g.N * g.C, plane_grain(g), [&](int64_t begin, int64_t end) {
    std::vector<A> buf(pp.size());
    std::vector<int64_t> off(taps);
    std::vector<Vec> fv(taps);
    for (int64_t nc = begin; nc < end; ++nc) {
      const int64_t n = nc / g.C, c = nc % g.C;
      load_plane(x + nc * g.H * g.W, g, pp, buf.data());
      for (int64_t m = 0; m < g.M; ++m) {
        for (int64_t t = 0; t < taps; ++t)
          fv[t] = Vec(static_cast<A>(f[t * CM + c * g.M + m]));
        scalar_t* o = out + (n * CM + c * g.M + m) * g.Ho * g.Wo;
        for (int64_t i = 0; i < g.Ho; ++i) {
          for (int64_t di = 0; di < g.fh; ++di)
            for (int64_t dj = 0; dj < g.fw; ++dj)
              off[di * g.fw + dj] = pp.tap(i * g.sH + di * g.dH, dj * g.dW);
          for (int64_t j = 0; j < g.Wo; j += L) {
            Vec acc(A(0));
            for (int64_t t = 0; t < taps; ++t)
              acc = at::vec::fmadd(Vec::loadu(buf.data() + off[t] + j), fv[t], acc);
            if (j + L <= g.Wo)
              Wd::store(o + i * g.Wo + j, acc);
            else
              store_partial(o + i * g.Wo + j, acc, g.Wo - j);
          }
        }
      }
    }
  });
}

template <typename scalar_t>
void backprop_input_channels_first(const scalar_t* f, const scalar_t* dy, scalar_t* dx,
                                   const Geometry& g) {
  using A = acc_t<scalar_t>;
  using Vec = Vectorized<A>;
  using Wd = Widen<scalar_t, A>;
  constexpr int64_t L = Vec::size();
  const PhasePlane pp = phase_plane<A>(g);
  const int64_t CM = g.C * g.M;
  at::parallel_for(0, g.N * g.C, plane_grain(g), [&](int64_t begin, int64_t end) {
    std::vector<A> buf(pp.size());
    for (int64_t nc = begin; nc < end; ++nc) {
      const int64_t n = nc / g.C, c = nc % g.C;
      std::fill(buf.begin(), buf.end(), A(0));
      for (int64_t m = 0; m < g.M; ++m) {
        const scalar_t* d = dy + (n * CM + c * g.M + m) * g.Ho * g.Wo;
        for (int64_t i = 0; i < g.Ho; ++i) {
          for (int64_t j = 0; j < g.Wo; j += L) {
            const Vec dv = j + L <= g.Wo ? Wd::load(d + i * g.Wo + j)
                                         : load_partial<scalar_t, A>(d + i * g.Wo + j, g.Wo - j);
            for (int64_t di = 0; di < g.fh; ++di) {
              for (int64_t dj = 0; dj < g.fw; ++dj) {
                A* bp = buf.data() + pp.tap(i * g.sH + di * g.dH, dj * g.dW) + j;
                const Vec fv(static_cast<A>(f[(di * g.fw + dj) * CM + c * g.M + m]));
                at::vec::fmadd(dv, fv, Vec::loadu(bp)).store(bp);
              }
            }
          }
        }
      }
      scalar_t* o = dx + nc * g.H * g.W;
      for (int64_t h = 0; h < g.H; ++h) {
        if (g.sW == 1) {
          const A* row = buf.data() + pp.at(h + g.pt, g.pl);
          int64_t w = 0;
          for (; w + L <= g.W; w += L) Wd::store(o + h * g.W + w, Vec::loadu(row + w));
          for (; w < g.W; ++w) o[h * g.W + w] = static_cast<scalar_t>(row[w]);
        } else {
          for (int64_t w = 0; w < g.W; ++w)
            o[h * g.W + w] = static_cast<scalar_t>(buf[pp.at(h + g.pt, w + g.pl)]);
        }
      }
    }
  });
}

template <typename scalar_t>
void filter_grad_channels_first(const scalar_t* x, const scalar_t* dy, scalar_t* df,
                                const Geometry& g) {
  using A = acc_t<scalar_t>;
  using Vec = Vectorized<A>;
  using Wd = Widen<scalar_t, A>;
  constexpr int64_t L = Vec::size();
  const PhasePlane pp = phase_plane<A>(g);
  const int64_t taps = g.fh * g.fw, CM = g.C * g.M;
  // part[n][c*M+m][tap], one writer per (n, c): summed over n in order afterwards.
  std::vector<A> part(static_cast<size_t>(g.N * CM * taps), A(0));
  at::parallel_for(0, g.N * g.C, plane_grain(g), [&](int64_t begin, int64_t end) {
    std::vector<A> buf(pp.size());
    for (int64_t nc = begin; nc < end; ++nc) {
      const int64_t n = nc / g.C, c = nc % g.C;
      load_plane(x + nc * g.H * g.W, g, pp, buf.data());
      for (int64_t m = 0; m < g.M; ++m) {
        const int64_t oc = c * g.M + m;
        const scalar_t* d = dy + (n * CM + oc) * g.Ho * g.Wo;
        for (int64_t di = 0; di < g.fh; ++di) {
          for (int64_t dj = 0; dj < g.fw; ++dj) {
            Vec acc(A(0));
            for (int64_t i = 0; i < g.Ho; ++i) {
              const A* bp = buf.data() + pp.tap(i * g.sH + di * g.dH, dj * g.dW);
              const scalar_t* dp = d + i * g.Wo;
              int64_t j = 0;
              for (; j + L <= g.Wo; j += L)
                acc = at::vec::fmadd(Vec::loadu(bp + j), Wd::load(dp + j), acc);
              if (j < g.Wo)
                acc = at::vec::fmadd(Vec::loadu(bp + j),
                                     load_partial<scalar_t, A>(dp + j, g.Wo - j), acc);
            }
            A lanes[L];
            acc.store(lanes);
            A s = 0;
            for (int64_t l = 0; l < L; ++l) s += lanes[l];
            part[(n * CM + oc) * taps + di * g.fw + dj] = s;
          }
        }
      }
    }
  });
  at::parallel_for(0, CM * taps, 1024, [&](int64_t b, int64_t e) {
    for (int64_t k = b; k < e; ++k) {
      const int64_t oc = k / taps, t = k % taps;
      A s = 0;
      for (int64_t n = 0; n < g.N; ++n) s += part[(n * CM + oc) * taps + t];
      df[t * CM + oc] = static_cast<scalar_t>(s);
    }
  });
}

// ============================== entry points ================================================

// [.., C] -> [.., C*M], each channel repeated M times (output channel c*M+m reads channel c).
at::Tensor repeat_channels(const at::Tensor& t_cl, int64_t M) {
  if (M == 1) return t_cl;
  auto s = t_cl.sizes().vec();
  const int64_t C = s.back();
  auto e = t_cl.unsqueeze(-1).expand({s[0], s[1], s[2], C, M});
  s.back() = C * M;
  return e.reshape(s);
}

// The physical NHWC view [N, H, W, C] of a logical tensor in a channels-last layout.
at::Tensor nhwc_view(const at::Tensor& t, const Geometry& g) {
  return g.nchw ? t.permute({0, 2, 3, 1}) : t;
}

at::Tensor depthwise_conv2d_native_cpu(const at::Tensor& input, const at::Tensor& filter,
                                       at::IntArrayRef strides, c10::string_view padding,
                                       at::IntArrayRef explicit_paddings,
                                       c10::string_view data_format, at::IntArrayRef dilations) {
  const Geometry g = depthwise::check_forward(kFwd, input, filter, strides, padding,
                                              explicit_paddings, data_format, dilations);
  const ChannelLayout l = choose_channel_layout(input, g.cdim(), !g.nchw);
  at::Tensor out = empty_in_layout(g.output_shape(), l, input.options());
  if (out.numel() == 0) return out;
  if (g.fh == 0 || g.fw == 0 || g.H == 0 || g.W == 0) return out.zero_();
  const at::Tensor x = to_physical(input, l);
  const at::Tensor f = filter.contiguous();
  depthwise::dispatch_float_types(input.scalar_type(), [&](auto tag) {
    using scalar_t = decltype(tag);
    if (!l.channels_last) {
      forward_channels_first(x.data_ptr<scalar_t>(), f.data_ptr<scalar_t>(),
                             out.data_ptr<scalar_t>(), g);
      return;
    }
    const at::Tensor xe = repeat_channels(x, g.M).contiguous();
    const AxisTaps rows = depthwise::forward_taps(g.Ho, g.H, g.fh, g.sH, g.dH, g.pt);
    const AxisTaps cols = depthwise::forward_taps(g.Wo, g.W, g.fw, g.sW, g.dW, g.pl);
    const AxisTaps vcols = depthwise::forward_taps(g.Wo, g.W, g.fw, g.sW, g.dW, g.pl, false);
    const Correlation<scalar_t> p{xe.data_ptr<scalar_t>(), f.data_ptr<scalar_t>(),
                                  nhwc_view(out, g).data_ptr<scalar_t>(), g.N, g.H, g.W, g.Ho,
                                  g.Wo, g.C * g.M, g.fw, &rows, &cols, &vcols, 1, g.sW};
    correlate_channels_last(p);
  });
  return out;
}

at::Tensor depthwise_conv2d_native_backprop_input_cpu(
    c10::SymIntArrayRef input_sizes, const at::Tensor& filter, const at::Tensor& out_backprop,
    at::IntArrayRef strides, c10::string_view padding, at::IntArrayRef explicit_paddings,
    c10::string_view data_format, at::IntArrayRef dilations) {
  const Geometry g = depthwise::check_backprop_input(
      kBwdInput, C10_AS_INTARRAYREF_SLOW(input_sizes), filter, out_backprop, strides, padding,
      explicit_paddings, data_format, dilations);
  const ChannelLayout l = choose_channel_layout(out_backprop, g.cdim(), !g.nchw);
  at::Tensor dx = empty_in_layout(g.input_shape(), l, out_backprop.options());
  if (dx.numel() == 0) return dx;
  if (out_backprop.numel() == 0 || filter.numel() == 0) return dx.zero_();
  const at::Tensor dy = to_physical(out_backprop, l);
  const at::Tensor f = filter.contiguous();
  depthwise::dispatch_float_types(filter.scalar_type(), [&](auto tag) {
    using scalar_t = decltype(tag);
    if (!l.channels_last) {
      backprop_input_channels_first(f.data_ptr<scalar_t>(), dy.data_ptr<scalar_t>(),
                                    dx.data_ptr<scalar_t>(), g);
      return;
    }
    const AxisTaps rows = depthwise::backward_taps(g.H, g.Ho, g.fh, g.sH, g.dH, g.pt);
    const AxisTaps cols = depthwise::backward_taps(g.W, g.Wo, g.fw, g.sW, g.dW, g.pl);
    const AxisTaps vcols = depthwise::backward_taps(g.W, g.Wo, g.fw, g.sW, g.dW, g.pl, false);
    if (g.M == 1) {
      const Correlation<scalar_t> p{dy.data_ptr<scalar_t>(), f.data_ptr<scalar_t>(),
                                    nhwc_view(dx, g).data_ptr<scalar_t>(), g.N, g.Ho, g.Wo,
                                    g.H, g.W, g.C, g.fw, &rows, &cols, &vcols, g.sW, 1};
      correlate_channels_last(p);
      return;
    }
    // C*M channel gradients in the accumulation type, then the M of each channel summed.
    using A = acc_t<scalar_t>;
    const auto acc_type = c10::CppTypeToScalarType<A>::value;
    const at::Tensor dya = dy.to(acc_type), fa = f.to(acc_type);
    at::Tensor dxe = at::empty({g.N, g.H, g.W, g.C * g.M}, dya.options());
    const Correlation<A> p{dya.data_ptr<A>(), fa.data_ptr<A>(), dxe.data_ptr<A>(), g.N, g.Ho,
                           g.Wo, g.H, g.W, g.C * g.M, g.fw, &rows, &cols, &vcols, g.sW, 1};
    correlate_channels_last(p);
    nhwc_view(dx, g).copy_(dxe.view({g.N, g.H, g.W, g.C, g.M}).sum(-1));
  });
  return dx;
}

at::Tensor depthwise_conv2d_native_backprop_filter_cpu(
    const at::Tensor& input, c10::SymIntArrayRef filter_sizes, const at::Tensor& out_backprop,
    at::IntArrayRef strides, c10::string_view padding, at::IntArrayRef explicit_paddings,
    c10::string_view data_format, at::IntArrayRef dilations) {
  const Geometry g = depthwise::check_backprop_filter(
      kBwdFilter, input, C10_AS_INTARRAYREF_SLOW(filter_sizes), out_backprop, strides, padding,
      explicit_paddings, data_format, dilations);
  at::Tensor df = at::empty(g.filter_shape(), input.options());
  if (df.numel() == 0) return df;
  if (out_backprop.numel() == 0 || input.numel() == 0) return df.zero_();
  // Both big tensors in the input's physical order (out_backprop copied only if it differs).
  const ChannelLayout l = choose_channel_layout(input, g.cdim(), !g.nchw);
  const at::Tensor x = to_physical(input, l), dy = to_physical(out_backprop, l);
  depthwise::dispatch_float_types(input.scalar_type(), [&](auto tag) {
    using scalar_t = decltype(tag);
    if (!l.channels_last) {
      filter_grad_channels_first(x.data_ptr<scalar_t>(), dy.data_ptr<scalar_t>(),
                                 df.data_ptr<scalar_t>(), g);
      return;
    }
    const at::Tensor xe = repeat_channels(x, g.M).contiguous();
    const AxisTaps rows = depthwise::forward_taps(g.Ho, g.H, g.fh, g.sH, g.dH, g.pt);
    const AxisTaps cols = depthwise::forward_taps(g.Wo, g.W, g.fw, g.sW, g.dW, g.pl);
    filter_grad_channels_last(xe.data_ptr<scalar_t>(), dy.data_ptr<scalar_t>(),
                              df.data_ptr<scalar_t>(), g, g.C * g.M, rows, cols);
  });
  return df;
}

}  // namespace

TORCH_LIBRARY_IMPL(tfgrads, CPU, m) {
  m.impl("depthwise_conv2d_native", &depthwise_conv2d_native_cpu);
  m.impl("depthwise_conv2d_native_backprop_input", &depthwise_conv2d_native_backprop_input_cpu);
  m.impl("depthwise_conv2d_native_backprop_filter",
         &depthwise_conv2d_native_backprop_filter_cpu);
}

}  // namespace torch_tfgrads
