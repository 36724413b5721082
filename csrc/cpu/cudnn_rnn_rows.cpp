// The fused steps of the CudnnRNN family without oneDNN's BRGEMM (cpu/cudnn_rnn_rows.h).
#include "cpu/cudnn_rnn_rows.h"

#include <ATen/Dispatch.h>
#include <ATen/Functions.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <vector>

#include "cpu/cudnn_rnn_cell.h"
#include "cpu/cudnn_rnn_weight_grads.h"
#include "cpu/isa.h"
#include "cpu/small_gemm.h"

namespace torch_tfgrads {
namespace cudnn_rnn {
namespace {

// The thread count the step loops can use here, or 0 when the rows are too few to share.
int64_t row_threads(int64_t B) {
  const int64_t nt = at::in_parallel_region() ? 1 : at::get_num_threads();
  if (nt == 1) return 1;
  return B >= nt * kRnnTiledStepsMinRowsPerThread ? nt : 0;
}

// Calls steps(b0, b1) once per thread with its rows.
template <typename F>
void over_rows(int64_t B, int64_t nt, const F& steps) {
  if (nt == 1)
    steps(0, B);
  else
    at::parallel_for(0, B, (B + nt - 1) / nt, steps);
}

bool applies(const Config& cfg, at::ScalarType dtype) {
  return cfg.P == 0 && cfg.B > 0 && cfg.T > 0 && cfg.U > 0 &&
         (dtype == at::kFloat || dtype == at::kDouble) && row_threads(cfg.B) > 0;
}

// Without projected inputs (d.gx undefined: LSTM and the plain RNNs), each step projects its
// own rows' inputs into the step's buffer before the recurrent product adds to it, so the
// [T, B, G*U] projection is never written out and read back, and runs on the tiles too.
template <typename T>
void forward_rows(const Config& cfg, const DirectionForward& d) {
  const int64_t U = cfg.U, B = cfg.B, GU = cfg.GU(), AW = cfg.act_width();
  const bool project = !d.gx.defined();
  const at::Tensor R = d.R.contiguous(), h0t = d.h0.contiguous();
  const at::Tensor bias = project ? at::add(d.bW, d.bR) : d.bR.contiguous();
  const at::Tensor gxt = project ? at::Tensor() : d.gx.contiguous();
  const at::Tensor xt = project ? d.x.contiguous() : at::Tensor();
  const at::Tensor Wt = project ? d.W.contiguous() : at::Tensor();
  const int64_t I = project ? xt.size(2) : 0;
  const bool lstm = cfg.mode == Mode::kLstm;
  const at::Tensor c0t = lstm ? d.c0.contiguous() : at::Tensor();
  // R^T [U, GU] and W^T [I, GU] as panels, once for all steps and threads.
  const small_gemm::Packed Rp = small_gemm::pack(R.data_ptr<T>(), 1, U, U, GU, R.options());
  const small_gemm::Packed Wp = project
                                    ? small_gemm::pack(Wt.data_ptr<T>(), 1, I, I, GU, Wt.options())
                                    : small_gemm::Packed{};
  const T *bs = bias.data_ptr<T>(), *gx = project ? nullptr : gxt.data_ptr<T>();
  const T* xs = project ? xt.data_ptr<T>() : nullptr;
  const T *h0 = h0t.data_ptr<T>(), *c0 = lstm ? c0t.data_ptr<T>() : nullptr;
  const int* lens = d.lens.defined() ? d.lens.data_ptr<int>() : nullptr;
  T *hs = d.h.data_ptr<T>(), *cs = lstm ? d.c.data_ptr<T>() : nullptr;
  T* acts = d.acts.defined() ? d.acts.data_ptr<T>() : nullptr;
  with_mode(cfg.mode, [&](auto mode) {
    over_rows(B, row_threads(B), [&](int64_t b0, int64_t b1) {
      const int64_t rows = b1 - b0;
      T* buf = thread_buffer<T>(rows * GU);
      for (int64_t s = 0; s < cfg.T; ++s) {
        const T* h_prev = s ? hs + (s - 1) * B * U : h0;
        const T* c_prev = lstm ? (s ? cs + (s - 1) * B * U : c0) : nullptr;
        if (project) small_gemm::gemm(rows, xs + (s * B + b0) * I, I, Wp, buf, GU);  // x W^T
        small_gemm::gemm(rows, h_prev + b0 * U, U, Rp, buf, GU, project);  // (+) h_prev R^T
        for (int64_t b = b0; b < b1; ++b) {
          const int64_t row = s * B + b;
          // pre-activation = x part + buf + bias (projected: bias + buf, bW + bR in one)
          FwdSeg<T> seg{project ? bs : gx + row * GU,
                        U,
                        buf + (b - b0) * GU,
                        U,
                        project ? nullptr : bs,
                        U,
                        lstm ? c_prev + b * U : nullptr,
                        h_prev + b * U,
                        lstm ? cs + row * U : nullptr,
                        hs + row * U,
                        acts ? acts + row * AW : nullptr};
          forward_cell<decltype(mode)::value>(seg, U, !lens || s < lens[b], false);
        }
      }
    });
  });
}

template <typename T>
void backward_rows(const Config& cfg, const DirectionBackward& d) {
  const int64_t U = cfg.U, B = cfg.B, GU = cfg.GU(), AW = cfg.act_width();
  const bool lstm = cfg.mode == Mode::kLstm, gru = cfg.mode == Mode::kGru;
  const at::Tensor R = d.R.contiguous(), h0t = d.h0.contiguous(), dyt = d.dy.contiguous();
  const at::Tensor c0t = lstm ? d.c0.contiguous() : at::Tensor();
  const small_gemm::Packed Rp = small_gemm::pack(R.data_ptr<T>(), U, 1, GU, U,
                                                 R.options());  // [GU, U]
  const T *acts = d.acts.data_ptr<T>(), *hs = d.h.data_ptr<T>();
  const T *cs = lstm ? d.c.data_ptr<T>() : nullptr, *dy = dyt.data_ptr<T>();
  const T *h0 = h0t.data_ptr<T>(), *c0 = lstm ? c0t.data_ptr<T>() : nullptr;
  const int* lens = d.lens.defined() ? d.lens.data_ptr<int>() : nullptr;
  T *dgx = d.dgx.data_ptr<T>(), *dgh = d.dgh.data_ptr<T>();
  at::Tensor carry_t = at::empty({B, U}, d.dgx.options());
  at::Tensor dc_a = lstm ? d.dc_n.contiguous().clone() : at::Tensor();
  at::Tensor dc_b = lstm ? at::empty({B, U}, d.dgx.options()) : at::Tensor();
  T* carry = carry_t.data_ptr<T>();
  const at::Tensor dh_nt = d.dh_n.contiguous();
  const T* dh_n = dh_nt.data_ptr<T>();
  // dx = dG W of each step's rows while they are in cache (d.dx in processing order).
  const bool want_dx = d.dx.defined() && d.dx_done != nullptr && d.dx.is_contiguous() &&
                       d.dx.size(2) > 0;
  T* dx = want_dx ? d.dx.data_ptr<T>() : nullptr;
  const int64_t I = dx ? d.dx.size(2) : 0;
  const at::Tensor Wc = want_dx ? d.W.contiguous() : at::Tensor();
  const small_gemm::Packed Wp = want_dx
                                    ? small_gemm::pack(Wc.data_ptr<T>(), I, 1, GU, I, Wc.options())
                                    : small_gemm::Packed{};  // [GU, I]
  with_mode(cfg.mode, [&](auto mode) {
    over_rows(B, row_threads(B), [&](int64_t b0, int64_t b1) {
      const int64_t rows = b1 - b0;
      T* dh = thread_buffer<T>(rows * U);
      T* dc_in = lstm ? dc_a.data_ptr<T>() : nullptr;
      T* dc_out = lstm ? dc_b.data_ptr<T>() : nullptr;
      for (int64_t s = cfg.T - 1; s >= 0; --s) {
        const T* h_prev = s ? hs + (s - 1) * B * U : h0;
        const T* c_prev = lstm ? (s ? cs + (s - 1) * B * U : c0) : nullptr;
        if (s == cfg.T - 1) {
          copy_row(dh, dh_n + b0 * U, rows * U);
        } else {
          small_gemm::gemm(rows, dgh + ((s + 1) * B + b0) * GU, GU, Rp, dh, U);  // dG R
          if (!lstm || lens)
            for (int64_t i = 0; i < rows * U; ++i) dh[i] += carry[b0 * U + i];
        }
        for (int64_t b = b0; b < b1; ++b) {
          const int64_t row = s * B + b;
          T* dhb = dh + (b - b0) * U;
          for (int64_t u = 0; u < U; ++u) dhb[u] += dy[row * U + u];
          BwdSeg<T> seg{acts + row * AW,
                        U,
                        lstm ? cs + row * U : nullptr,
                        lstm ? c_prev + b * U : nullptr,
                        h_prev + b * U,
                        dhb,
                        lstm ? dc_in + b * U : nullptr,
                        dgx + row * GU,
                        gru ? dgh + row * GU : nullptr,
                        lstm ? dc_out + b * U : nullptr,
                        carry + b * U};
          backward_cell<decltype(mode)::value>(seg, U, !lens || s < lens[b]);
        }
        if (dx)  // dx of the rows = dG_s W while dG_s is in cache
          small_gemm::gemm(rows, dgx + (s * B + b0) * GU, GU, Wp, dx + (s * B + b0) * I, I);
        std::swap(dc_in, dc_out);
      }
    });
  });
  if (lstm && cfg.T % 2) std::swap(dc_a, dc_b);  // the last step wrote dc_b
  if (dx) *d.dx_done = true;
  at::Tensor dh0 = d.dh0;  // through step 0: dh0 = carry + dG_0 R
  at::addmm_out(dh0, carry_t, d.dgh[0], d.R);
  if (lstm) d.dc0.copy_(dc_a);
}

}  // namespace

bool rows_forward_direction(const Config& cfg, const DirectionForward& d) {
  const bool project = !d.gx.defined();
  // GRU's candidate gate needs the input part apart: it gets the driver's projection.
  if (project && (!d.x.defined() || cfg.mode == Mode::kGru || d.x.size(2) == 0)) return false;
  const at::ScalarType dtype = (project ? d.x : d.gx).scalar_type();
  if (!applies(cfg, dtype)) return false;
  AT_DISPATCH_FLOATING_TYPES(dtype, "cudnn_rnn_v3", [&] { forward_rows<scalar_t>(cfg, d); });
  return true;
}

bool rows_backward_direction(const Config& cfg, const DirectionBackward& d) {
  if (!applies(cfg, d.dgx.scalar_type())) return false;
  AT_DISPATCH_FLOATING_TYPES(d.dgx.scalar_type(), "cudnn_rnn_backprop_v3",
                             [&] { backward_rows<scalar_t>(cfg, d); });
  return true;
}

bool rows_directions_in_turn(const Config& cfg, int64_t layer, const at::Tensor& like) {
  if (!applies(cfg, like.scalar_type()) || row_threads(cfg.B) < 2) return false;
  return direction_weights_above(cfg, layer, like.element_size(),
                                 rnn_directions_in_turn_above_bytes());
}

bool rows_before_brgemm(const Config& cfg, const at::Tensor& W, const at::Tensor& R) {
  const int64_t up_to = rnn_tiles_before_brgemm_up_to_bytes();
  if (up_to == 0 || !applies(cfg, R.scalar_type()) || row_threads(cfg.B) < 2) return false;
  return (R.numel() + (W.defined() ? W.numel() : 0)) * R.element_size() <= up_to;
}

// The weight gradients as one product (cudnn_rnn_weight_grads.h) on the tiles: the threads take
// blocks of kNc columns of dG, pack kKc of its rows at a time (the chunk stays in L2) and run
// blocks of kMc rows of the left operand over it. Narrow layers have fewer column blocks than
// threads: their rows are split into groups too (each group packs the chunk itself).
bool tiled_weight_grads(const at::Tensor& x, const at::Tensor& h0, const at::Tensor& h,
                        const at::Tensor& dg, const at::Tensor& gW, const at::Tensor& gR,
                        const at::Tensor& gb) {
  if (dg.scalar_type() != at::kFloat || gW.stride(1) != 1 || gR.stride(1) != 1) return false;
  const at::TensorOptions opts = dg.options();
  const int64_t nt = at::in_parallel_region() ? 1 : at::get_num_threads();
  return weight_grads_as_one_product(
      x, h0, h, dg, gW, gR, gb,
      [&](const float* l, int64_t ldl, int64_t M, int64_t K, const float* d, int64_t GU, float* t) {
        constexpr int64_t kKc = 256, kMc = 96, kNc = 256;
        const int64_t cols = (GU + kNc - 1) / kNc, blocks = (M + kMc - 1) / kMc;
        const int64_t groups = std::min(blocks, (nt + cols - 1) / cols);
        const int64_t group_rows = (blocks + groups - 1) / groups * kMc;
        at::parallel_for(0, cols * groups, 1, [&](int64_t q0, int64_t q1) {
          for (int64_t q = q0; q < q1; ++q) {
            const int64_t n0 = q / groups * kNc, nn = std::min(kNc, GU - n0);
            const int64_t r0 = q % groups * group_rows, r1 = std::min(M, r0 + group_rows);
            if (r0 >= r1) continue;
            // one buffer for every chunk of the task, rather than an allocation per chunk
            small_gemm::Packed chunk = small_gemm::pack_storage<float>(kKc, kNc, opts);
            for (int64_t k0 = 0; k0 < K; k0 += kKc) {
              const int64_t kc = std::min(kKc, K - k0);
              small_gemm::pack_into(chunk, d + k0 * GU + n0, GU, 1, kc, nn);
              for (int64_t m0 = r0; m0 < r1; m0 += kMc)
                small_gemm::gemm(std::min(kMc, r1 - m0), l + m0 * ldl + k0, ldl, chunk,
                                 t + m0 * GU + n0, GU, k0 > 0);
            }
          }
        });
      });
}

}  // namespace cudnn_rnn
}  // namespace torch_tfgrads
