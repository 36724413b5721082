// Destination rows of the channels-last correlation staged in L1/L2 and streamed out with
// non-temporal stores while the next row is computed (large outputs only; AVX2 builds), and
// source rows copied into an L2-resident ring (SourceRing, strided layers from memory).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common/depthwise_conv2d.h"
#include "cpu/isa.h"

#if defined(CPU_CAPABILITY_AVX2)
#include <immintrin.h>
#endif

namespace torch_tfgrads {
namespace depthwise_cpu {

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

// Whether a SourceRing (below) serves a layer: a source of src_bytes beyond the L3 (read from
// memory on every call) with at least 1.5 source rows per destination row (row step 2 or
// more; src_rows and dst_rows per image), each destination row's taps consecutive rows that
// the ring holds at once, and rows of at most kSourceRingRowBytes, so that it stays in L2.
// Sources that fit in the L3, and stride 1, were slower through the ring (perf notes, session
// 35).
constexpr int64_t kSourceRingRowBytes = 64 << 10;
inline bool source_ring_applies(int64_t src_bytes, int64_t row_bytes, int64_t src_rows,
                                const depthwise::AxisTaps& rows, int64_t dst_rows, int64_t slots) {
  if (src_bytes <= l3_cache_bytes() || row_bytes > kSourceRingRowBytes ||
      2 * src_rows < 3 * dst_rows || dst_rows < 2)
    return false;
  for (int64_t r = 0; r < dst_rows; ++r) {
    if (rows.count(r) > slots) return false;
    for (int64_t a = rows.offset[r] + 1; a < rows.offset[r + 1]; ++a)
      if (std::abs(rows.src[a] - rows.src[a - 1]) != 1) return false;
  }
  return true;
}

// Source rows copied into a ring of kSlots row buffers, which stay in L2, for layers whose
// source comes from memory with two or more new rows per destination row (stride 2): a
// whole-row copy reads memory in order, where the tiles' loads, a channel vector of each pixel
// at a time, left the reads latency-bound (perf notes, session 35). Rows of one image are
// mapped by row index modulo kSlots, so a destination row's taps (consecutive rows, at most
// kSlots) never share a slot, and rows it shares with the previous one are not copied again.
template <typename scalar_t>
class SourceRing {
 public:
  static constexpr int64_t kSlots = 8;
  SourceRing(bool on, int64_t row_elems) : elems_(row_elems) {
    if (on) buf_.resize(kSlots * row_elems);
    std::fill(std::begin(row_), std::end(row_), -1);
  }
  bool on() const { return !buf_.empty(); }
  // The ring's base, standing in for image `img`'s (simg): its rows rs[0, n) are in slots
  // local[0, n), which the callers use as row indices.
  const scalar_t* map(const scalar_t* simg, int64_t img, const int64_t* rs, int64_t n,
                      int64_t* local) {
    if (img != img_) {
      std::fill(std::begin(row_), std::end(row_), -1);
      img_ = img;
    }
    for (int64_t a = 0; a < n; ++a) {
      const int64_t q = rs[a] % kSlots;
      if (row_[q] != rs[a]) {
        std::memcpy(buf_.data() + q * elems_, simg + rs[a] * elems_, elems_ * sizeof(scalar_t));
        row_[q] = rs[a];
      }
      local[a] = q;
    }
    return buf_.data();
  }

 private:
  int64_t elems_, img_ = -1;
  int64_t row_[kSlots];
  std::vector<scalar_t> buf_;
};

}  // namespace depthwise_cpu
}  // namespace torch_tfgrads
