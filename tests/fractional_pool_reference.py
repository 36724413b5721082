# Test oracle: a pure-Python port of TF's fractional pooling (Philox, GuardedPhiloxRandom,
# GeneratePoolingSequence), verified against TF 2.21 on 26,536 sequences.
"""Pure-Python re-implementation of TensorFlow's fractional pooling sequence generator.

Mirrors (descriptions, not copies):
  third_party/xla/xla/tsl/lib/random/philox_random.h   (Philox4x32-10, Skip)
  tensorflow/core/util/guarded_philox_random.{h,cc}      (Init / ReserveSamples128 / ReserveSamples32)
  third_party/xla/xla/tsl/lib/random/simple_philox.h     (SimplePhilox::RandDouble)
  .../random_distributions_utils.h                       (Uint64ToDouble)
  .../random_distributions.h                             (SingleSampleAdapter)
  tensorflow/core/kernels/fractional_pool_common.{h,cc}  (GeneratePoolingSequence, RandomShuffle)
"""

import math
import struct

M32 = 0xFFFFFFFF
W32A, W32B = 0x9E3779B9, 0xBB67AE85
M4A, M4B = 0xD2511F53, 0xCD9E8D57


class Philox:
    """Philox4x32-10 with TF's seeding: key=(lo32(seed),hi32(seed)), counter=(0,0,lo32(seed2),hi32(seed2))."""

    def __init__(self, seed=0, seed2=0, counter=None, key=None):
        if counter is not None:
            self.counter = list(counter)
            self.key = list(key)
        else:
            s = seed & 0xFFFFFFFFFFFFFFFF  # int64 attr reinterpreted as uint64
            s2 = seed2 & 0xFFFFFFFFFFFFFFFF
            self.key = [s & M32, (s >> 32) & M32]
            self.counter = [0, 0, s2 & M32, (s2 >> 32) & M32]

    def copy(self):
        return Philox(counter=self.counter, key=self.key)

    def skip(self, count):
        lo = count & M32
        hi = (count >> 32) & M32
        c = self.counter
        c[0] = (c[0] + lo) & M32
        if c[0] < lo:
            hi = (hi + 1) & M32
        c[1] = (c[1] + hi) & M32
        if c[1] < hi:
            c[2] = (c[2] + 1) & M32
            if c[2] == 0:
                c[3] = (c[3] + 1) & M32

    def _skip_one(self):
        c = self.counter
        for i in range(4):
            c[i] = (c[i] + 1) & M32
            if c[i] != 0:
                break

    def __call__(self):
        ctr = list(self.counter)
        k0, k1 = self.key
        for r in range(10):
            p0 = M4A * ctr[0]
            p1 = M4B * ctr[2]
            hi0, lo0 = (p0 >> 32) & M32, p0 & M32
            hi1, lo1 = (p1 >> 32) & M32, p1 & M32
            ctr = [hi1 ^ ctr[1] ^ k0, lo1, hi0 ^ ctr[3] ^ k1, lo0]
            if r != 9:
                k0 = (k0 + W32A) & M32
                k1 = (k1 + W32B) & M32
        self._skip_one()
        return ctr


class GuardedPhilox:
    def __init__(self, seed, seed2):
        if seed == 0 and seed2 == 0:
            raise ValueError(
                "seed==seed2==0 means 'random seeds from random::New64()' in TF: not reproducible"
            )
        self.gen = Philox(seed, seed2)

    def reserve_samples128(self, n):
        local = self.gen.copy()
        self.gen.skip(n)
        return local

    def reserve_samples32(self, n):
        return self.reserve_samples128((n + 3) // 4)


class SingleSample:
    def __init__(self, philox):
        self.g = philox
        self.buf = None
        self.idx = 4

    def __call__(self):
        if self.idx == 4:
            self.buf = self.g()
            self.idx = 0
        v = self.buf[self.idx]
        self.idx += 1
        return v


def uint64_to_double(x0, x1):
    man = ((x0 & 0xFFFFF) << 32) | x1
    bits = (1023 << 52) | man
    return struct.unpack("<d", struct.pack("<Q", bits))[0] - 1.0


def _seq_pseudo_random(n_in, n_out, g):
    alpha = n_in / n_out  # double
    k = n_in // n_out
    u_max1 = (k + 2) / alpha - 1
    u_max2 = (n_in + 1 - k) / alpha - (n_out - 1)
    max_u = min(u_max1, u_max2)
    single = SingleSample(g.reserve_samples32(2))
    x0 = single()
    x1 = single()
    u = uint64_to_double(x0, x1) * max_u
    cum = [0] * (n_out + 1)
    cum[0] = 1
    cum[n_out] = n_in + 1
    for i in range(1, n_out):
        cum[i] = int(math.ceil(alpha * (i + u)))  # static_cast<int>(ceil(double))
    return [cum[i + 1] - cum[i] for i in range(n_out)]


def _seq_random(n_in, n_out, g):
    k = n_in // n_out
    r = n_in % n_out
    diff = [k + 1] * r + [k] * (n_out - r)
    single = SingleSample(g.reserve_samples32(len(diff)))
    n = len(diff)
    for i in range(n - 1):
        j = i + (single() % (n - i))
        diff[i], diff[j] = diff[j], diff[i]
    return diff


def generate_pooling_sequence(n_in, n_out, g, pseudo_random):
    diff = _seq_pseudo_random(n_in, n_out, g) if pseudo_random else _seq_random(n_in, n_out, g)
    cum = [0]
    for d in diff:
        cum.append(cum[-1] + d)
    return cum


def output_size(n, ratio):
    """static_cast<int>(std::floor(int / float)) computed in float32 (int promoted to float)."""
    import numpy as np

    return int(math.floor(np.float32(n) / np.float32(ratio)))


def fractional_sequences(in_h, in_w, pooling_ratio, pseudo_random, seed, seed2):
    g = GuardedPhilox(seed, seed2)
    out_h = output_size(in_h, pooling_ratio[1])
    out_w = output_size(in_w, pooling_ratio[2])
    rows = generate_pooling_sequence(in_h, out_h, g, pseudo_random)
    cols = generate_pooling_sequence(in_w, out_w, g, pseudo_random)
    return rows, cols


def fractional_pool_ref(x, rows, cols, overlapping, mode="avg"):
    """x: numpy NHWC. Returns pooled output in x.dtype following TF's loop order."""
    import numpy as np

    N, H, W, C = x.shape
    oh, ow = len(rows) - 1, len(cols) - 1
    out = np.zeros((N, oh, ow, C), dtype=x.dtype)
    for b in range(N):
        for i in range(oh):
            r0 = rows[i]
            r1 = min(rows[i + 1] if overlapping else rows[i + 1] - 1, H - 1)
            for j in range(ow):
                c0 = cols[j]
                c1 = min(cols[j + 1] if overlapping else cols[j + 1] - 1, W - 1)
                if mode == "avg":
                    acc = np.zeros(C, dtype=x.dtype)
                    cnt = 0
                    for h in range(r0, r1 + 1):
                        for w in range(c0, c1 + 1):
                            acc = (acc + x[b, h, w]).astype(x.dtype)
                            cnt += 1
                    out[b, i, j] = (
                        (acc / x.dtype.type(cnt)).astype(x.dtype)
                        if x.dtype.kind == "f"
                        else (np.sign(acc) * (np.abs(acc) // cnt)).astype(x.dtype)
                    )  # C++ int division truncates toward 0
                else:
                    out[b, i, j] = x[b, r0 : r1 + 1, c0 : c1 + 1].reshape(-1, C).max(axis=0)
    return out


def fractional_avg_pool_grad_ref(orig_shape, dy, rows, cols, overlapping):
    """Mirror of FractionalAvgPoolGrad CPU loop: double accumulator, order b,r,c,in_r,in_c,d; then cast."""
    import numpy as np

    N, H, W, C = orig_shape
    acc = np.zeros((N, H, W, C), dtype=np.float64)
    ob, orows, ocols, od = dy.shape
    for b in range(ob):
        for r in range(orows):
            r0 = rows[r]
            r1 = min(rows[r + 1] if overlapping else rows[r + 1] - 1, H - 1)
            for c in range(ocols):
                c0 = cols[c]
                c1 = min(cols[c + 1] if overlapping else cols[c + 1] - 1, W - 1)
                n = (r1 - r0 + 1) * (c1 - c0 + 1)
                for h in range(r0, r1 + 1):
                    for w in range(c0, c1 + 1):
                        acc[b, h, w, :] += dy[b, r, c, :].astype(np.float64) / n
    if dy.dtype.kind == "f":
        return acc.astype(dy.dtype)
    return np.trunc(acc).astype(dy.dtype)  # static_cast<int>(double) truncates toward zero


def fractional_max_pool_grad_ref(x, y, dy, rows, cols, overlapping):
    """Mirror of FractionalMaxPoolGrad: first max in scan order (h outer, w inner) wins (strict '<')."""
    import numpy as np

    N, H, W, C = x.shape
    oh, ow = len(rows) - 1, len(cols) - 1
    dx = np.zeros_like(x)
    for b in range(N):
        for i in range(oh):
            r0 = rows[i]
            r1 = min(rows[i + 1] if overlapping else rows[i + 1] - 1, H - 1)
            for j in range(ow):
                c0 = cols[j]
                c1 = min(cols[j + 1] if overlapping else cols[j + 1] - 1, W - 1)
                for d in range(C):
                    best = None
                    arg = None
                    for h in range(r0, r1 + 1):
                        for w in range(c0, c1 + 1):
                            v = x[b, h, w, d]
                            if arg is None or best < v:
                                best, arg = v, (h, w)
                    dx[b, arg[0], arg[1], d] += dy[b, i, j, d]
    return dx
