// TensorFlow's random stream for fractional pooling, bit for bit (docs/ops/fractional_pool.md):
// Philox4x32-10 with TF's seeding, GuardedPhiloxRandom's
// ReserveSamples32, SingleSampleAdapter and SimplePhilox::RandDouble. Host-only: the
// sequences are a few dozen numbers and are always generated on the CPU.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>

namespace torch_tfgrads {
namespace philox {

class Philox4x32 {
 public:
  // TF: key = (lo32(seed), hi32(seed)), counter = (0, 0, lo32(seed2), hi32(seed2)); the int64
  // attrs are reinterpreted as uint64.
  Philox4x32(uint64_t seed, uint64_t seed2)
      : counter_{0u, 0u, lo(seed2), hi(seed2)}, key_{lo(seed), hi(seed)} {}

  // One block of 4 words; advances the counter by one.
  std::array<uint32_t, 4> operator()() {
    std::array<uint32_t, 4> ctr = counter_;
    uint32_t k0 = key_[0], k1 = key_[1];
    for (int round = 0; round < 10; ++round) {
      const uint64_t p0 = uint64_t{kM0} * ctr[0];
      const uint64_t p1 = uint64_t{kM1} * ctr[2];
      ctr = {hi(p1) ^ ctr[1] ^ k0, lo(p1), hi(p0) ^ ctr[3] ^ k1, lo(p0)};
      if (round != 9) {  // the key is bumped between rounds only
        k0 += kW0;
        k1 += kW1;
      }
    }
    skip(1);
    return ctr;
  }

  // Advances the 128-bit little-endian counter by n blocks.
  void skip(uint64_t n) {
    const uint32_t n_lo = lo(n);
    uint32_t n_hi = hi(n);
    counter_[0] += n_lo;
    if (counter_[0] < n_lo) ++n_hi;
    counter_[1] += n_hi;
    if (counter_[1] < n_hi && ++counter_[2] == 0) ++counter_[3];
  }

 private:
  static constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  static constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  static uint32_t lo(uint64_t v) { return static_cast<uint32_t>(v); }
  static uint32_t hi(uint64_t v) { return static_cast<uint32_t>(v >> 32); }

  std::array<uint32_t, 4> counter_;
  std::array<uint32_t, 2> key_;
};

// GuardedPhiloxRandom: ReserveSamples32(n) hands out a copy of the stream and moves the shared
// stream past the ceil(n/4) blocks that the copy may use.
class GuardedPhilox {
 public:
  GuardedPhilox(uint64_t seed, uint64_t seed2) : gen_(seed, seed2) {}
  Philox4x32 reserve_samples32(int64_t n) {
    Philox4x32 local = gen_;
    gen_.skip(static_cast<uint64_t>((n + 3) / 4));
    return local;
  }

 private:
  Philox4x32 gen_;
};

// SingleSampleAdapter: the words of successive blocks, one at a time, in order.
class SingleSample {
 public:
  explicit SingleSample(Philox4x32 gen) : gen_(gen) {}
  uint32_t operator()() {
    if (used_ == 4) {
      block_ = gen_();
      used_ = 0;
    }
    return block_[used_++];
  }

 private:
  Philox4x32 gen_;
  std::array<uint32_t, 4> block_{};
  int used_ = 4;
};

// SimplePhilox::RandDouble: 52 random mantissa bits from two words, uniform in [0, 1).
inline double rand_double(SingleSample& sample) {
  const uint64_t x0 = sample();
  const uint64_t x1 = sample();
  const uint64_t bits = (uint64_t{1023} << 52) | ((x0 & 0xFFFFFu) << 32) | x1;
  double d;
  std::memcpy(&d, &bits, sizeof d);
  return d - 1.0;
}

}  // namespace philox
}  // namespace torch_tfgrads
