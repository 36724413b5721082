// Physical memory layouts for ops that treat one dimension as "channels" (batch norm, and the
// NHWC/NCHW kernels of later families).
//
// A logical tensor (N, C somewhere, spatial dims) is computed on directly in one of two dense
// physical orders, whichever it already has, so that neither NHWC nor NCHW (nor a channels_last
// NCHW tensor) is ever transposed:
//   channels-last : memory [rows, C], C innermost            (NHWC, NDHWC, channels_last NCHW)
//   channels-first: memory [N, C, S], spatial S innermost    (NCHW, NCDHW, a permuted NHWC)
// Anything else (arbitrary strides) is copied once into the data format's natural order.
// Outputs are allocated in the same physical order. torch_tfgrads/_meta.py mirrors this choice
// exactly so that fake tensors have the real strides.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include <vector>

namespace torch_tfgrads {

struct ChannelLayout {
  std::vector<int64_t> perm;  // logical dim order of the physical layout (outermost first)
  bool channels_last = true;  // physical order is [.., C] (else [N, C, ..])
  int64_t C = 0;              // number of channels
  int64_t outer = 0;          // channels-last: rows = numel / C; channels-first: N
  int64_t inner = 1;          // channels-last: 1; channels-first: spatial size S
};

inline std::vector<int64_t> channels_last_perm(int64_t dim, int64_t cdim) {
  std::vector<int64_t> p;
  for (int64_t d = 0; d < dim; ++d)
    if (d != cdim) p.push_back(d);
  p.push_back(cdim);
  return p;
}

inline std::vector<int64_t> channels_first_perm(int64_t dim, int64_t cdim) {
  std::vector<int64_t> p{0, cdim};
  for (int64_t d = 1; d < dim; ++d)
    if (d != cdim) p.push_back(d);
  return p;
}

// Picks the layout for `x` whose channel dim is `cdim` (never 0). `natural_channels_last` says
// which order the data format names (NHWC-family: true), preferred when both apply (size-1 dims).
inline ChannelLayout choose_channel_layout(const at::Tensor& x, int64_t cdim,
                                           bool natural_channels_last) {
  const int64_t dim = x.dim();
  auto last = channels_last_perm(dim, cdim);
  auto first = channels_first_perm(dim, cdim);
  ChannelLayout l;
  const bool last_dense = x.permute(last).is_contiguous();
  const bool first_dense = x.permute(first).is_contiguous();
  if (natural_channels_last)
    l.channels_last = last_dense || !first_dense;
  else
    l.channels_last = last_dense && !first_dense;
  l.perm = l.channels_last ? last : first;
  l.C = x.size(cdim);
  if (l.channels_last) {
    l.outer = l.C == 0 ? 0 : x.numel() / l.C;
    l.inner = 1;
  } else {
    l.outer = x.size(0);
    l.inner = (l.C == 0 || l.outer == 0) ? 0 : x.numel() / (l.C * l.outer);
  }
  return l;
}

// `t` (same logical shape as the layout's tensor) as a dense tensor in the layout's physical
// order: no copy when it already is one.
inline at::Tensor to_physical(const at::Tensor& t, const ChannelLayout& l) {
  return t.permute(l.perm).contiguous();
}

// A new logical-shaped tensor whose memory is in the layout's physical order.
inline at::Tensor empty_in_layout(c10::IntArrayRef logical_sizes, const ChannelLayout& l,
                                  const at::TensorOptions& opts) {
  std::vector<int64_t> phys(l.perm.size()), inv(l.perm.size());
  for (size_t i = 0; i < l.perm.size(); ++i) {
    phys[i] = logical_sizes[l.perm[i]];
    inv[l.perm[i]] = static_cast<int64_t>(i);
  }
  return at::empty(phys, opts).permute(inv);
}

}  // namespace torch_tfgrads
