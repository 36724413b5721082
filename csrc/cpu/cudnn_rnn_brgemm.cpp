// The CudnnRNN family's float32 fast path on oneDNN's BRGEMM micro-kernel (cpu/cudnn_rnn_brgemm.h).
//
// Fused steps (float32, no projection):
// Per step and block of `ub` units: the recurrent GEMM of the block's gate columns (oneDNN's
// brgemm micro-kernel on weights packed once per call, so the block stays in cache; for LSTM
// and the plain RNNs also the input projection) followed at once by the block's cell. The
// threads take the batch rows, or each step's blocks (over_rows_or_blocks). This replaces a
// GEMM call per step (MKL packs R on every call), a bias copy and parallel regions per step.
#include "cpu/cudnn_rnn_brgemm.h"

#include <ATen/Functions.h>
#include <ATen/Parallel.h>
#include <ATen/native/CPUBlas.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "cpu/cudnn_rnn_cell.h"
#include "cpu/cudnn_rnn_weight_grads.h"
#include "cpu/isa.h"
#include "cpu/transpose.h"

#ifdef CPUBLAS_BRGEMM_F32F32F32
namespace torch_tfgrads {
namespace cudnn_rnn {
namespace {

bool brgemm_usable() {
  static const bool ok = [] {
    if (!brgemm_allowed()) return false;
    try {  // oneDNN's ukernels need a supported CPU; cpublas raises otherwise
      float a[16] = {0}, b[16] = {0}, c[16];
      at::native::cpublas::brgemm(1, 16, 1, 1, 16, 16, false, a, b, c);
      return true;
    } catch (...) {
      return false;
    }
  }();
  return ok;
}

// Whether each thread runs all steps for its own batch rows (see over_rows_or_blocks): one
// thread, or, with AVX-512, at least kMinRows rows per thread. On AVX2 hosts the threads always
// split each step's blocks: each thread then streams half the weights per step from the L3
// instead of all of them, which was faster at every benchmark shape there.
constexpr int64_t kMinRows = 8;
bool threads_own_rows(int64_t B) {
  const int64_t nt = at::in_parallel_region() ? 1 : at::get_num_threads();
  return nt == 1 || (avx512_enabled() && B >= kMinRows * nt);
}

// Units per block of the fused steps (0: the fused path does not apply). With AVX-512: when a
// thread owns its rows, wide blocks (ub 64) give the block GEMMs the most work per call (128
// gains nothing more); when the threads split the blocks, narrower ones keep them all busy (ub 8
// for the LSTM forward, whose 32-column GEMM then fits its R panel in L1); GRU's forward stays at
// 16 (48 gate columns; narrower is slower, wider no faster). On AVX2 (16 vector registers, half
// the L2 of the AVX-512 host) the forward's narrow blocks of 8 units were the fastest in either
// mode, GRU's too.
int64_t unit_block(const Config& cfg, bool forward, bool own_rows) {
  if (cfg.P > 0 || cfg.B == 0 || cfg.T == 0 || !brgemm_usable()) return 0;
  const bool gru = cfg.mode == Mode::kGru;
  if (!forward && !avx512_enabled()) {
    // The backward's block GEMM reads a [G*U, ub] panel of R per block: on AVX2 (Zen 3, 512 KiB
    // of L2) at most 256 KiB of it, so 32-unit blocks from U = 512 (16 were slower again).
    for (int64_t ub : {64, 32, 16})
      if (cfg.U % ub == 0 && cfg.GU() * ub * 4 <= (256 << 10)) return ub;
    return cfg.U % 8 == 0 ? 8 : 0;
  }
  const std::vector<int64_t> sizes = !forward            ? std::vector<int64_t>{64, 32, 16}
                                     : !avx512_enabled() ? std::vector<int64_t>{8}
                                     : gru               ? std::vector<int64_t>{16}
                                     : own_rows          ? std::vector<int64_t>{64, 32, 16}
                                                         : std::vector<int64_t>{8, 16};
  for (int64_t ub : sizes)
    if (cfg.U % ub == 0 && cfg.G * ub % 16 == 0) return ub;
  return cfg.U % 8 == 0 ? 8 : 0;
}

// The gate columns of block j as one [K, N = G*ub] operand: P[j][k][g][ul] = M[g*U + j*ub + ul][k]
// for M = R or W ([GU, K], contiguous): an [ub, K] slice of M transposed per (j, g). (ATen's
// permuted copy is single-threaded and slow here.)
at::Tensor pack_blocks(const at::Tensor& M, int64_t G, int64_t ub) {
  const at::Tensor m = M.contiguous();
  const int64_t U = m.size(0) / G, K = m.size(1), nblk = U / ub, N = G * ub;
  at::Tensor P = at::empty({nblk, K, N}, m.options());
  const float* src = m.data_ptr<float>();
  float* dst = P.data_ptr<float>();
  at::parallel_for(0, nblk * G, 4, [&](int64_t q0, int64_t q1) {
    for (int64_t q = q0; q < q1; ++q) {
      const int64_t j = q / G, g = q % G;
      transpose_block(ub, K, src + (g * U + j * ub) * K, K, dst + j * K * N + g * ub, N);
    }
  });
  return P;
}

// How the fused steps use the threads; calls steps(b0, b1, blocks_in_parallel) (false: the
// caller's thread does every block of its rows, in order). Batch rows are independent through
// every step, so with enough rows per thread each thread runs all the steps for its own rows:
// no barrier per step, and no state crossing cores (with the units split instead, half of
// every step's h, or dG in the backward, is written by the other core and read back by both).
// With few rows per thread the threads split each step's unit blocks, as every thread would
// otherwise stream all the weights once per step for a few rows.
template <typename F>
void over_rows_or_blocks(int64_t B, const F& steps) {
  const int64_t nt = at::in_parallel_region() ? 1 : at::get_num_threads();
  if (!threads_own_rows(B))
    steps(0, B, true);
  else if (nt == 1)
    steps(0, B, false);
  else
    at::parallel_for(0, B, (B + nt - 1) / nt,
                     [&](int64_t b0, int64_t b1) { steps(b0, b1, false); });
}

// C[M,N] (+)= A[M,K] B[K,N] (+ bias[N] on every row): A and C row-major with leading dimensions,
// B's element (k, n) at B[k * sbk + n * sbn], in 64x64 tiles over the threads, K in chunks that
// keep a tile's operands in L2. With AVX-512 oneDNN's brgemm runs near the core's peak here where
// MKL's path for AMD CPUs (AVX2 code) does not; on AVX2 hosts MKL is the faster and the batched
// GEMMs go through ATen (rnn_batched_gemms_on_brgemm). A transposed B (the input weights W^T of the
// projection) is copied panel by panel, kChunk x 64 at a time, into a row-major buffer: the tiles
// are walked column by column, so a thread copies each panel once for all its row tiles of that
// column, instead of a whole transposed copy of W per call. (Copying row-major panels too, to read
// them contiguously, measured no gain.)
void blocked_mm(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
                int64_t sbk, int64_t sbn, float* C, int64_t ldc, bool add_C, const float* bias) {
  constexpr int64_t kTile = 64, kChunk = 512;
  const int64_t tm = (M + kTile - 1) / kTile, tn = (N + kTile - 1) / kTile;
  const bool in_place = sbn == 1 && sbk >= N;  // brgemm reads rows ldb >= N apart
  at::parallel_for(0, tm * tn, 1, [&](int64_t t0, int64_t t1) {
    thread_local std::vector<float> panel;
    if (!in_place) panel.resize(kChunk * kTile);
    for (int64_t t = t0; t < t1;) {
      const int64_t col = t / tm, t_end = std::min(t1, (col + 1) * tm);  // this column's tiles
      const int64_t j = col * kTile, n = std::min(kTile, N - j);
      bool add = add_C;
      for (int64_t u = t; u < t_end; ++u) {
        const int64_t i = u % tm * kTile, m = std::min(kTile, M - i);
        float* c = C + i * ldc + j;
        for (int64_t r = 0; r < m; ++r) {
          float* row = c + r * ldc;
          if (bias && add_C) {
            for (int64_t q = 0; q < n; ++q) row[q] += bias[j + q];
          } else if (bias) {
            copy_row(row, bias + j, n);
          } else if (!add_C && K == 0) {
            std::fill(row, row + n, 0.f);
          }
        }
      }
      if (bias) add = true;
      for (int64_t k0 = 0; k0 < K; k0 += kChunk) {
        const int64_t kc = std::min(kChunk, K - k0);
        const float* b = B + k0 * sbk + j * sbn;
        int64_t ldb = sbk;
        if (!in_place) {
          if (sbk == 1) {  // B^T row-major: its rows j.. j+n are this panel's columns
            transpose_block(n, kc, b, sbn, panel.data(), n);
          } else {
            for (int64_t q = 0; q < n; ++q)
              for (int64_t k = 0; k < kc; ++k) panel[k * n + q] = b[k * sbk + q * sbn];
          }
          b = panel.data();
          ldb = n;
        }
        for (int64_t u = t; u < t_end; ++u) {
          const int64_t i = u % tm * kTile, m = std::min(kTile, M - i);
          at::native::cpublas::brgemm(m, n, kc, lda, ldb, ldc, add || k0 > 0, A + i * lda + k0, b,
                                      C + i * ldc + j);
        }
      }
      t = t_end;
    }
  });
}

bool row_major(const at::Tensor& t) {
  return t.dim() == 2 && (t.size(1) <= 1 || t.stride(1) == 1) && t.stride(0) >= t.size(1);
}

}  // namespace

// Without projected inputs (d.gx undefined), LSTM and the plain RNNs project each step's inputs
// in the block GEMM too: buf = x_s Wp_j + h Rp_j, and the two biases are added as one. Then
// the [T, B, G*U] projection is never written and read back (it leaves the caches between its
// GEMM and the steps). GRU keeps the
// projection: its candidate gate needs the input part apart from the recurrent part.
bool forward_direction(const Config& cfg, const DirectionForward& d) {
  const bool project = !d.gx.defined();
  const at::Tensor& like = project ? d.x : d.gx;
  if (!like.defined() || like.scalar_type() != at::kFloat) return false;
  if (project && (cfg.mode == Mode::kGru || d.x.size(2) == 0)) return false;
  const int64_t ub = unit_block(cfg, true, threads_own_rows(cfg.B));
  if (ub == 0) return false;
  const int64_t G = cfg.G, U = cfg.U, B = cfg.B, GU = cfg.GU(), AW = cfg.act_width();
  const int64_t nblk = U / ub, N = G * ub;
  const at::Tensor Rp = pack_blocks(d.R, G, ub);
  const float* rp = Rp.data_ptr<float>();
  // Projected path: gate g of unit u of row `row` at gx[row * GU + g * U + u], bias bR.
  // Fused path: x-projection in buf, bias bW + bR.
  const float* gx = project ? nullptr : d.gx.data_ptr<float>();
  const int64_t I = project ? d.x.size(2) : 0;
  const at::Tensor Wp = project ? pack_blocks(d.W, G, ub) : at::Tensor();
  const at::Tensor bias = project ? at::add(d.bW, d.bR) : d.bR.contiguous();
  const float* wp = project ? Wp.data_ptr<float>() : nullptr;
  const float* xs = project ? d.x.data_ptr<float>() : nullptr;
  const float* bs = bias.data_ptr<float>();
  const int* lens = d.lens.defined() ? d.lens.data_ptr<int>() : nullptr;
  const bool lstm = cfg.mode == Mode::kLstm;
  float *hs = d.h.data_ptr<float>(), *cs = lstm ? d.c.data_ptr<float>() : nullptr;
  float* acts = d.acts.defined() ? d.acts.data_ptr<float>() : nullptr;
  const float *h0 = d.h0.data_ptr<float>(), *c0 = lstm ? d.c0.data_ptr<float>() : nullptr;
  with_mode(cfg.mode, [&](auto mode) {
    over_rows_or_blocks(B, [&](int64_t b0, int64_t b1, bool blocks_in_parallel) {
      const int64_t rows = b1 - b0;
      for (int64_t s = 0; s < cfg.T; ++s) {
        const float* h_prev = s ? hs + (s - 1) * B * U : h0;
        const float* c_prev = lstm ? (s ? cs + (s - 1) * B * U : c0) : nullptr;
        auto blocks = [&](int64_t j0, int64_t j1) {
          float* buf = thread_buffer<float>(rows * N);
          for (int64_t j = j0; j < j1; ++j) {
            if (project)
              at::native::cpublas::brgemm(rows, N, I, I, N, N, false, xs + (s * B + b0) * I,
                                          wp + j * I * N, buf);
            at::native::cpublas::brgemm(rows, N, U, U, N, N, project, h_prev + b0 * U,
                                        rp + j * U * N, buf);
            const int64_t u0 = j * ub;
            for (int64_t b = b0; b < b1; ++b) {
              const int64_t row = s * B + b;
              // pre-activation of gate g = x[g * x_gate] + r[g * r_gate] (+ bR[g * U])
              FwdSeg<float> seg{project ? bs + u0 : gx + row * GU + u0,
                                U,
                                buf + (b - b0) * N,
                                ub,
                                project ? nullptr : bs + u0,
                                U,
                                lstm ? c_prev + b * U + u0 : nullptr,
                                h_prev + b * U + u0,
                                lstm ? cs + row * U + u0 : nullptr,
                                hs + row * U + u0,
                                acts ? acts + row * AW + u0 : nullptr};
              forward_cell<decltype(mode)::value>(seg, ub, !lens || s < lens[b], false);
            }
          }
        };
        if (blocks_in_parallel)
          at::parallel_for(0, nblk, 1, blocks);
        else
          blocks(0, nblk);
      }
    });
  });
  return true;
}

bool backward_direction(const Config& cfg, const DirectionBackward& d) {
  const int64_t ub = d.dgx.scalar_type() == at::kFloat
                         ? unit_block(cfg, false, threads_own_rows(cfg.B))
                         : 0;
  if (ub == 0) return false;
  const int64_t U = cfg.U, B = cfg.B, GU = cfg.GU(), AW = cfg.act_width();
  const int64_t nblk = U / ub;
  // R [GU, U] -> per block j the [K = GU, N = ub] operand of dh_prev = dG R.
  const at::Tensor Rb = d.R.view({GU, nblk, ub}).permute({1, 0, 2}).contiguous();
  const float* rb = Rb.data_ptr<float>();
  const int* lens = d.lens.defined() ? d.lens.data_ptr<int>() : nullptr;
  const bool lstm = cfg.mode == Mode::kLstm, gru = cfg.mode == Mode::kGru;
  const float *acts = d.acts.data_ptr<float>(), *hs = d.h.data_ptr<float>();
  const float *cs = lstm ? d.c.data_ptr<float>() : nullptr, *dy = d.dy.data_ptr<float>();
  const float *h0 = d.h0.data_ptr<float>(), *c0 = lstm ? d.c0.data_ptr<float>() : nullptr;
  float *dgx = d.dgx.data_ptr<float>(), *dgh = d.dgh.data_ptr<float>();
  at::Tensor carry_t = at::empty({B, U}, d.dgx.options());
  // dc through the steps, in two buffers that alternate: step s reads one, writes the other.
  at::Tensor dc_a = lstm ? d.dc_n.contiguous().clone() : at::Tensor();
  at::Tensor dc_b = lstm ? at::empty({B, U}, d.dgx.options()) : at::Tensor();
  float* carry = carry_t.data_ptr<float>();
  const float* dh_n = d.dh_n.data_ptr<float>();
  // dx = dG W step by step when a thread owns its rows (see over_rows_or_blocks).
  const bool want_dx = d.dx.defined() && d.dx_done != nullptr && d.dx.is_contiguous() &&
                       d.dx.size(2) > 0;
  const at::Tensor Wc = want_dx ? d.W.contiguous() : at::Tensor();
  float* dx = want_dx ? d.dx.data_ptr<float>() : nullptr;
  const int64_t I = dx ? d.dx.size(2) : 0;
  auto step_dx = [&](int64_t s, int64_t b0, int64_t b1) {
    for (int64_t n0 = 0; n0 < I; n0 += 64)
      at::native::cpublas::brgemm(b1 - b0, std::min<int64_t>(64, I - n0), GU, GU, I, I, false,
                                  dgx + (s * B + b0) * GU, Wc.data_ptr<float>() + n0,
                                  dx + (s * B + b0) * I + n0);
  };
  bool blocks_split = false;  // set by the one caller when the threads split the blocks
  with_mode(cfg.mode, [&](auto mode) {
    over_rows_or_blocks(B, [&](int64_t b0, int64_t b1, bool blocks_in_parallel) {
      if (blocks_in_parallel) blocks_split = true;
      const int64_t rows = b1 - b0;
      float* dc_in = lstm ? dc_a.data_ptr<float>() : nullptr;
      float* dc_out = lstm ? dc_b.data_ptr<float>() : nullptr;
      for (int64_t s = cfg.T - 1; s >= 0; --s) {
        const float* h_prev = s ? hs + (s - 1) * B * U : h0;
        const float* c_prev = lstm ? (s ? cs + (s - 1) * B * U : c0) : nullptr;
        auto blocks = [&](int64_t j0, int64_t j1) {
          float* dh = thread_buffer<float>(rows * ub);
          for (int64_t j = j0; j < j1; ++j) {
            const int64_t u0 = j * ub;
            // dh w.r.t. this step's h, for the block: dh_n at the last step, otherwise the next
            // step's gate gradients through R plus its direct part (carry: for LSTM only the
            // dh that steps past a row's length pass through).
            if (s == cfg.T - 1) {
              for (int64_t b = b0; b < b1; ++b) copy_row(dh + (b - b0) * ub, dh_n + b * U + u0, ub);
            } else {
              at::native::cpublas::brgemm(rows, ub, GU, GU, ub, ub, false,
                                          dgh + ((s + 1) * B + b0) * GU, rb + j * GU * ub, dh);
              if (!lstm || lens)
                for (int64_t b = b0; b < b1; ++b)
                  for (int64_t u = 0; u < ub; ++u) dh[(b - b0) * ub + u] += carry[b * U + u0 + u];
            }
            for (int64_t b = b0; b < b1; ++b) {
              const int64_t row = s * B + b;
              float* dhb = dh + (b - b0) * ub;
              for (int64_t u = 0; u < ub; ++u) dhb[u] += dy[row * U + u0 + u];
              BwdSeg<float> seg{acts + row * AW + u0,
                                U,
                                lstm ? cs + row * U + u0 : nullptr,
                                lstm ? c_prev + b * U + u0 : nullptr,
                                h_prev + b * U + u0,
                                dhb,
                                lstm ? dc_in + b * U + u0 : nullptr,
                                dgx + row * GU + u0,
                                gru ? dgh + row * GU + u0 : nullptr,
                                lstm ? dc_out + b * U + u0 : nullptr,
                                carry + b * U + u0};
              backward_cell<decltype(mode)::value>(seg, ub, !lens || s < lens[b]);
            }
          }
        };
        if (blocks_in_parallel) {
          at::parallel_for(0, nblk, 1, blocks);
        } else {
          blocks(0, nblk);
          // This step's dG rows are complete and still cached: dx of the rows = dG W now,
          // rather than a GEMM over all steps afterwards that reads dG back.
          if (dx) step_dx(s, b0, b1);
        }
        std::swap(dc_in, dc_out);
      }
    });
  });
  if (lstm && cfg.T % 2) std::swap(dc_a, dc_b);  // the last step wrote dc_b
  if (dx && !blocks_split) *d.dx_done = true;
  // Gradients w.r.t. the initial states: through step 0 (dh0 = carry + dG_0 R; ATen's addmm
  // takes MKL's generic path on this CPU).
  at::Tensor dh0 = d.dh0;
  const at::Tensor Rc = d.R.contiguous();
  if (row_major(dh0)) {
    dh0.copy_(carry_t);
    blocked_mm(B, U, GU, dgh, GU, Rc.data_ptr<float>(), U, 1, dh0.data_ptr<float>(), dh0.stride(0),
               true, nullptr);
  } else {
    at::addmm_out(dh0, carry_t, d.dgh[0], d.R);
  }
  if (lstm) d.dc0.copy_(dc_a);
  return true;
}

// The batched GEMMs of the driver for float32: out (+)= a @ b (+ bias). A transposed `a` (the
// weight gradients' dG^T) is not copied: out^T = b^T a^T is computed into a scratch buffer
// when transposing b and the result costs less than transposing a.
bool cpu_matmul(const at::Tensor& a, const at::Tensor& b, const at::Tensor& bias,
                const at::Tensor& out, bool accumulate) {
  if (out.scalar_type() != at::kFloat || !brgemm_usable() || !row_major(out)) return false;
  const int64_t M = a.size(0), K = a.size(1), N = b.size(1);
  if (M == 0 || N == 0) return true;
  if (!bias.defined() && !row_major(a) && row_major(a.t()) && M * K > K * N + M * N) {
    const at::Tensor bm = row_major(b) ? b : b.contiguous();  // [K, N]
    at::Tensor bt = at::empty({N, K}, out.options());
    transpose(K, N, bm.data_ptr<float>(), bm.stride(0), bt.data_ptr<float>(), K);
    const at::Tensor at_ = a.t();  // [K, M], row-major
    at::Tensor tmp = at::empty({N, M}, out.options());
    blocked_mm(N, M, K, bt.data_ptr<float>(), K, at_.data_ptr<float>(), at_.stride(0),
               at_.stride(1), tmp.data_ptr<float>(), M, false, nullptr);
    if (accumulate) {
      at::Tensor o = out;
      o.add_(tmp.t());
    } else {
      transpose(N, M, tmp.data_ptr<float>(), M, out.data_ptr<float>(), out.stride(0));
    }
    return true;
  }
  const at::Tensor A = row_major(a) ? a : a.contiguous();
  const at::Tensor bc = bias.defined() ? bias.contiguous() : at::Tensor();
  blocked_mm(M, N, K, A.data_ptr<float>(), A.stride(0), b.data_ptr<float>(), b.stride(0),
             b.stride(1), out.data_ptr<float>(), out.stride(0), accumulate,
             bc.defined() ? bc.data_ptr<float>() : nullptr);
  return true;
}

// The weight gradients as one product (cudnn_rnn_weight_grads.h) on BRGEMM's blocked GEMM.
bool cpu_weight_grads(const at::Tensor& x, const at::Tensor& h0, const at::Tensor& h,
                      const at::Tensor& dg, const at::Tensor& gW, const at::Tensor& gR,
                      const at::Tensor& gb) {
  if (dg.scalar_type() != at::kFloat || !brgemm_usable() || !row_major(gW) || !row_major(gR))
    return false;
  return weight_grads_as_one_product(
      x, h0, h, dg, gW, gR, gb,
      [](const float* l, int64_t ldl, int64_t M, int64_t K, const float* d, int64_t GU, float* t) {
        blocked_mm(M, GU, K, l, ldl, d, GU, 1, t, GU, false, nullptr);
      });
}

bool directions_in_turn(const Config& cfg, int64_t layer, const at::Tensor& like) {
  const int64_t above = rnn_directions_in_turn_above_bytes();
  if (above == 0 || like.scalar_type() != at::kFloat || unit_block(cfg, true, false) == 0)
    return false;
  return direction_weights_above(cfg, layer, sizeof(float), above);
}

}  // namespace cudnn_rnn
}  // namespace torch_tfgrads
#endif

namespace torch_tfgrads {
bool rnn_brgemm_available() {
#ifdef CPUBLAS_BRGEMM_F32F32F32
  return cudnn_rnn::brgemm_usable();
#else
  return false;
#endif
}

bool rnn_batched_gemms_on_brgemm() { return rnn_brgemm_available() && avx512_enabled(); }

int64_t rnn_directions_in_turn_above_bytes() { return kDirectionsInTurnAboveBytes; }

int64_t rnn_tiles_before_brgemm_up_to_bytes() {
  return rnn_brgemm_available() && !avx512_enabled() ? kDirectionsInTurnAboveBytes : 0;
}

}  // namespace torch_tfgrads
