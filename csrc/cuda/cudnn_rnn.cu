// CUDA kernels of the CudnnRNN family: the fused per-step cell and its gradient, one thread per
// (batch row, unit), one launch per step on the current stream. The driver
// (common/cudnn_rnn_driver.cpp) does the GEMMs with cuBLAS through ATen and is shared with
// the CPU, so both devices run the same algorithm and reserve-space layout. (We do not call
// cuDNN: its RNN API cannot reproduce TF's variable-length, projection and params semantics
// on every version (cuDNN 9 runs only the variable-length path), and its reserve space is not
// portable to the CPU.)
#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>

#include "common/cudnn_rnn.h"

namespace torch_tfgrads {
namespace cudnn_rnn {
namespace {

constexpr int kThreads = 256;

int blocks_for(int64_t n) {
  return static_cast<int>(
      std::max<int64_t>(1, std::min<int64_t>((n + kThreads - 1) / kThreads, 1 << 20)));
}

template <typename T>
__device__ __forceinline__ T sigmoid(T x) {
  return T(1) / (T(1) + exp(-x));
}

// Pointers of one step; see CellForward / CellBackward in cudnn_rnn.h.
template <typename T>
struct FwdArgs {
  const T *gx, *gh, *h_prev, *c_prev;
  const int* lens;
  T *acts, *c_out, *h_out;
  int64_t B, U, Hh, GU, AW, step;  // GU: gate width G*U; AW: saved activations per row
  bool projected;
};

template <typename T>
__global__ void cell_forward_kernel(Mode mode, FwdArgs<T> a) {
  const int64_t n = a.B * a.U, GU = a.GU, AW = a.AW;
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < n;
       k += int64_t(gridDim.x) * blockDim.x) {
    const int64_t b = k / a.U, u = k % a.U;
    if (a.lens && a.step >= a.lens[b]) {  // past this row's length: the state is carried
      if (mode == Mode::kLstm) a.c_out[k] = a.c_prev[k];
      if (!a.projected) a.h_out[k] = a.h_prev[b * a.Hh + u];
      if (a.acts)  // the reserve space is never left uninitialised
        for (int64_t g = 0; g < AW; g += a.U) a.acts[b * AW + u + g] = T(0);
      continue;
    }
    const T* x = a.gx + b * GU + u;
    const T* r = a.gh + b * GU + u;
    T* ac = a.acts ? a.acts + b * AW + u : nullptr;
    if (mode == Mode::kLstm) {
      const T i = sigmoid(x[0] + r[0]), f = sigmoid(x[a.U] + r[a.U]);
      const T g = tanh(x[2 * a.U] + r[2 * a.U]), o = sigmoid(x[3 * a.U] + r[3 * a.U]);
      const T c = f * a.c_prev[k] + i * g;
      a.c_out[k] = c;
      a.h_out[k] = o * tanh(c);
      if (ac) {
        ac[0] = i;
        ac[a.U] = f;
        ac[2 * a.U] = g;
        ac[3 * a.U] = o;
      }
    } else if (mode == Mode::kGru) {
      const T rg = sigmoid(x[0] + r[0]), z = sigmoid(x[a.U] + r[a.U]);
      const T ghn = r[2 * a.U];
      const T nn = tanh(x[2 * a.U] + rg * ghn);
      a.h_out[k] = nn + z * (a.h_prev[b * a.Hh + u] - nn);
      if (ac) {
        ac[0] = rg;
        ac[a.U] = z;
        ac[2 * a.U] = nn;
        ac[3 * a.U] = ghn;
      }
    } else {
      const T pre = x[0] + r[0];
      const T h = mode == Mode::kRnnTanh ? tanh(pre) : (pre > T(0) ? pre : T(0));
      a.h_out[k] = h;
      if (ac) ac[0] = h;
    }
  }
}

template <typename T>
struct BwdArgs {
  const T *acts, *c_cur, *c_prev, *h_prev, *dh, *dc;
  const int* lens;
  T *dgx, *dgh, *dc_prev, *carry;
  int64_t B, U, Hh, GU, AW, step;
};

template <typename T>
__global__ void cell_backward_kernel(Mode mode, BwdArgs<T> a) {
  const int64_t n = a.B * a.U, GU = a.GU, AW = a.AW;
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < n;
       k += int64_t(gridDim.x) * blockDim.x) {
    const int64_t b = k / a.U, u = k % a.U;
    T* gx = a.dgx + b * GU + u;
    const T g_h = a.dh[k];  // [B, U]: Hh == U, or the projected-space gradient mapped to U
    if (a.lens && a.step >= a.lens[b]) {
      for (int64_t g = 0; g < GU; g += a.U) gx[g] = T(0);
      if (mode == Mode::kGru)
        for (int64_t g = 0; g < GU; g += a.U) a.dgh[b * GU + u + g] = T(0);
      if (mode == Mode::kLstm) a.dc_prev[k] = a.dc[k];
      if (a.carry) a.carry[b * a.Hh + u] = g_h;
      continue;
    }
    const T* ac = a.acts + b * AW + u;
    if (mode == Mode::kLstm) {
      const T i = ac[0], f = ac[a.U], g = ac[2 * a.U], o = ac[3 * a.U];
      const T tc = tanh(a.c_cur[k]);
      const T dct = a.dc[k] + g_h * o * (T(1) - tc * tc);
      gx[0] = dct * i * (T(1) - i) * g;
      gx[a.U] = dct * f * (T(1) - f) * a.c_prev[k];
      gx[2 * a.U] = dct * i * (T(1) - g * g);
      gx[3 * a.U] = g_h * tc * o * (T(1) - o);
      a.dc_prev[k] = dct * f;
      if (a.carry) a.carry[b * a.Hh + u] = T(0);
    } else if (mode == Mode::kGru) {
      const T rg = ac[0], z = ac[a.U], nn = ac[2 * a.U], ghn = ac[3 * a.U];
      const T h = a.h_prev[b * a.Hh + u];
      const T dn = g_h * (T(1) - z) * (T(1) - nn * nn);
      const T dz = g_h * (h - nn) * z * (T(1) - z);
      const T dr = dn * ghn * rg * (T(1) - rg);
      T* gr = a.dgh + b * GU + u;
      gx[0] = dr;
      gx[a.U] = dz;
      gx[2 * a.U] = dn;
      gr[0] = dr;
      gr[a.U] = dz;
      gr[2 * a.U] = dn * rg;
      a.carry[b * a.Hh + u] = g_h * z;
    } else {
      const T h = ac[0];
      gx[0] = mode == Mode::kRnnTanh ? g_h * (T(1) - h * h) : (h > T(0) ? g_h : T(0));
      a.carry[b * a.Hh + u] = T(0);
    }
  }
}

template <typename T>
const T* cptr(const at::Tensor& t) {
  return t.defined() ? t.data_ptr<T>() : nullptr;
}
template <typename T>
T* mptr(const at::Tensor& t) {
  return t.defined() ? t.data_ptr<T>() : nullptr;
}

void cell_forward(const Config& cfg, const CellForward& a) {
  const int64_t n = cfg.B * cfg.U;
  if (n == 0) return;
  const c10::cuda::CUDAGuard guard(a.gx.device());
  AT_DISPATCH_FLOATING_TYPES(a.gx.scalar_type(), "cudnn_rnn_cell_forward_cuda", [&] {
    FwdArgs<scalar_t> args{cptr<scalar_t>(a.gx),
                           cptr<scalar_t>(a.gh),
                           cptr<scalar_t>(a.h_prev),
                           cptr<scalar_t>(a.c_prev),
                           a.lens.defined() ? a.lens.data_ptr<int>() : nullptr,
                           mptr<scalar_t>(a.acts),
                           mptr<scalar_t>(a.c_out),
                           mptr<scalar_t>(a.h_out),
                           cfg.B,
                           cfg.U,
                           cfg.Hh,
                           cfg.GU(),
                           cfg.act_width(),
                           a.step,
                           a.projected};
    cell_forward_kernel<scalar_t>
        <<<blocks_for(n), kThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(cfg.mode, args);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

void cell_backward(const Config& cfg, const CellBackward& a) {
  const int64_t n = cfg.B * cfg.U;
  if (n == 0) return;
  const c10::cuda::CUDAGuard guard(a.dgx.device());
  AT_DISPATCH_FLOATING_TYPES(a.dgx.scalar_type(), "cudnn_rnn_cell_backward_cuda", [&] {
    BwdArgs<scalar_t> args{cptr<scalar_t>(a.acts),
                           cptr<scalar_t>(a.c_cur),
                           cptr<scalar_t>(a.c_prev),
                           cptr<scalar_t>(a.h_prev),
                           cptr<scalar_t>(a.dh),
                           cptr<scalar_t>(a.dc),
                           a.lens.defined() ? a.lens.data_ptr<int>() : nullptr,
                           mptr<scalar_t>(a.dgx),
                           mptr<scalar_t>(a.dgh),
                           mptr<scalar_t>(a.dc_prev),
                           mptr<scalar_t>(a.dh_carry),
                           cfg.B,
                           cfg.U,
                           cfg.Hh,
                           cfg.GU(),
                           cfg.act_width(),
                           a.step};
    cell_backward_kernel<scalar_t>
        <<<blocks_for(n), kThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(cfg.mode, args);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

constexpr CellKernels kCudaCells{&cell_forward, &cell_backward};

}  // namespace

TORCH_LIBRARY_IMPL(tfgrads, CUDA, m) {
  m.impl("cudnn_rnn_v3", &forward_op<kCudaCells>);
  m.impl("cudnn_rnn_backprop_v3", &backward_op<kCudaCells>);
  m.impl("cudnn_rnn_canonical_to_params_v2", &canonical_to_params);
  m.impl("cudnn_rnn_params_to_canonical_v2", &params_to_canonical);
}

}  // namespace cudnn_rnn
}  // namespace torch_tfgrads
