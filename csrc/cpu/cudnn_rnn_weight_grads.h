// The float32 weight and bias gradients of an RNN layer as one product (CellKernels::
// weight_grads), shared by the BRGEMM and the tiled paths: [gW | gR | gb]^T = [x | h_prev | 1]^T
// dG over the T*B rows of dG. The transposed form reads dG once for all three (the ones row sums
// its columns), where the driver's fallback runs two GEMMs, a concatenation of h_prev and a
// column sum, each a pass over dG.
#pragma once

#include <ATen/Functions.h>
#include <ATen/core/Tensor.h>

#include <algorithm>

#include "cpu/transpose.h"

namespace torch_tfgrads {
namespace cudnn_rnn {

// Builds the left operand, calls product(l, ldl, M, K, dg, GU, t) for t[M, GU] = l[M, K]
// dg[K, GU] (all row-major, float32; l's rows ldl apart) and scatters t into gW, gR (row-major
// rows) and gb. False when there are no rows (the driver then fills the gradients).
template <typename Product>
bool weight_grads_as_one_product(const at::Tensor& x, const at::Tensor& h0, const at::Tensor& h,
                                 const at::Tensor& dg, const at::Tensor& gW, const at::Tensor& gR,
                                 const at::Tensor& gb, const Product& product) {
  const int64_t T = h.size(0), B = h.size(1), Hh = h.size(2), I = x.size(2), GU = dg.size(2);
  const int64_t K = T * B, M = I + Hh + 1;
  if (K == 0) return false;
  const at::Tensor xc = x.contiguous(), h0c = h0.contiguous(), hc = h.contiguous();
  const at::Tensor dgc = dg.contiguous();
  // Rows a multiple of 2 KiB apart would share L1 sets in the GEMM's row tiles: one more cache
  // line between them.
  const int64_t ldl = K % 512 ? K : K + 16;
  at::Tensor lhs = at::empty({M, ldl}, dg.options());  // rows: x^T, h_prev^T, ones
  float* l = lhs.data_ptr<float>();
  transpose(K, I, xc.data_ptr<float>(), I, l, ldl);
  transpose(B, Hh, h0c.data_ptr<float>(), Hh, l + I * ldl, ldl);
  transpose(K - B, Hh, hc.data_ptr<float>(), Hh, l + I * ldl + B, ldl);
  for (int64_t m = I + Hh; m < M; ++m) std::fill(l + m * ldl, l + m * ldl + K, 1.f);
  at::Tensor tmp = at::empty({M, GU}, dg.options());
  float* t = tmp.data_ptr<float>();
  product(static_cast<const float*>(l), ldl, M, K, static_cast<const float*>(dgc.data_ptr<float>()),
          GU, t);
  transpose(I, GU, t, GU, gW.data_ptr<float>(), gW.stride(0));
  transpose(Hh, GU, t + I * GU, GU, gR.data_ptr<float>(), gR.stride(0));
  at::Tensor gbv = gb;
  gbv.copy_(tmp[M - 1]);
  return true;
}

}  // namespace cudnn_rnn
}  // namespace torch_tfgrads
