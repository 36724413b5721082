// CUDA kernels of the CudnnRNN family: the fused per-step cell and its gradient, one thread per
// (batch row, unit), one launch per step on the current stream; the bodies are host-device code
// (common/cudnn_rnn_cells.h) that the CPU tests also run. The driver
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
#include "common/cudnn_rnn_cells.h"

namespace torch_tfgrads {
namespace cudnn_rnn {
namespace {

constexpr int kThreads = 256;

int blocks_for(int64_t n) {
  return static_cast<int>(
      std::max<int64_t>(1, std::min<int64_t>((n + kThreads - 1) / kThreads, 1 << 20)));
}

// Thin grid-stride loops around the per-element bodies (common/cudnn_rnn_cells.h).
template <typename T>
__global__ void cell_forward_kernel(Mode mode, cells::FwdArgs<T> a) {
  const int64_t n = a.B * a.U;
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < n;
       k += int64_t(gridDim.x) * blockDim.x)
    cells::cell_forward_element(mode, a, k);
}

template <typename T>
__global__ void cell_backward_kernel(Mode mode, cells::BwdArgs<T> a) {
  const int64_t n = a.B * a.U;
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < n;
       k += int64_t(gridDim.x) * blockDim.x)
    cells::cell_backward_element(mode, a, k);
}

void cell_forward(const Config& cfg, const CellForward& a) {
  const int64_t n = cfg.B * cfg.U;
  if (n == 0) return;
  const c10::cuda::CUDAGuard guard(a.gx.device());
  AT_DISPATCH_FLOATING_TYPES(a.gx.scalar_type(), "cudnn_rnn_cell_forward_cuda", [&] {
    cell_forward_kernel<scalar_t>
        <<<blocks_for(n), kThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(
            cfg.mode, cells::step_args<scalar_t>(cfg, a));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

void cell_backward(const Config& cfg, const CellBackward& a) {
  const int64_t n = cfg.B * cfg.U;
  if (n == 0) return;
  const c10::cuda::CUDAGuard guard(a.dgx.device());
  AT_DISPATCH_FLOATING_TYPES(a.dgx.scalar_type(), "cudnn_rnn_cell_backward_cuda", [&] {
    cell_backward_kernel<scalar_t>
        <<<blocks_for(n), kThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(
            cfg.mode, cells::step_args<scalar_t>(cfg, a));
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
