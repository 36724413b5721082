// Argument checks, pooling sequences and cell geometry shared by the CPU and CUDA kernels of
// the FractionalPool family (docs/ops/fractional_pool.md). Everything here runs
// on the host: TF's checks in TF's order with TF's messages (prefixed by op and argument), plus
// the checks TF lacks (the inputs that corrupt TF 2.21's heap), then a per-axis plan of the
// pooling cells that every kernel indexes with.
#pragma once

#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <vector>

namespace torch_tfgrads {
namespace fracpool {

// One axis (rows or columns): the pooling cells as TF clamps them, and for each input index
// the range of cells that cover it (cells are sorted, so the covering cells are consecutive:
// one, or two where overlapping cells share a boundary). Kernels gather through `first/last`,
// which keeps the gradients race-free and in TF's accumulation order.
struct AxisPlan {
  int64_t size = 0;            // input length of the axis
  int64_t cells = 0;           // output length of the axis
  std::vector<int64_t> start;  // [cells] first input index of each cell
  std::vector<int64_t> end;    // [cells] last input index (inclusive, clamped to size - 1)
  std::vector<int64_t> first;  // [size] first covering cell (first > last: none)
  std::vector<int64_t> last;   // [size] last covering cell
  int64_t count(int64_t cell) const { return end[cell] - start[cell] + 1; }
  // Whether every input index is in some cell (sequences may start after 0 or end early).
  bool covers_all() const {
    for (int64_t i = 0; i < size; ++i)
      if (last[i] < first[i]) return false;
    return true;
  }
  // Whether some input index is in two cells (overlapping cells share their boundaries).
  bool shares() const {
    for (int64_t i = 0; i < size; ++i)
      if (first[i] < last[i]) return true;
    return false;
  }
  // Overlapping cells in bands of consecutive cells [i0, i1), a parallel task each: a band owns
  // the input indices whose first covering cell is in it, [band_start(i0), band_start(i1)).
  // It ends with the boundary it shares with cell i1 and starts after the one it shares with
  // cell i0 - 1 (at the axis' start and end for the first and last bands).
  int64_t band_start(int64_t i) const { return i == 0 ? 0 : i >= cells ? size : start[i] + 1; }
};

// Cells of a sequence that is already known to be valid (strictly increasing, in [0, size]).
AxisPlan plan_axis(const int64_t* seq, int64_t cells, bool overlapping, int64_t size);

// Rows then columns, each as [start | end | first | last], in one int64 CPU tensor (one copy
// to the device). `PackedPlan` gives the offsets of each array in it.
struct PackedPlan {
  int64_t row_start, row_end, row_first, row_last, col_start, col_end, col_first, col_last;
};
at::Tensor pack_plans(const AxisPlan& rows, const AxisPlan& cols, PackedPlan* offsets);

// ---- forward ------------------------------------------------------------------------------
struct PoolShape {
  int64_t N, H, W, C, out_h, out_w;
};

// FractionalAvgPool / FractionalMaxPool kernel-construction and Compute checks, in TF's order.
PoolShape check_pool(const char* op, bool is_max, const at::Tensor& value,
                     c10::ArrayRef<double> pooling_ratio, bool deterministic, int64_t seed,
                     int64_t seed2);

// TF's GeneratePoolingSequence for one axis on a fresh stream (seed, seed2); with both zero the
// seeds are drawn from torch's default CPU generator. Returns the out+1 cumulative boundaries.
std::vector<int64_t> pooling_sequence(int64_t input_length, int64_t output_length,
                                      bool pseudo_random, int64_t seed, int64_t seed2);

// Row then column sequences of one forward call, on one stream as TF draws them (CPU int64).
std::pair<at::Tensor, at::Tensor> pooling_sequences(const PoolShape& shape, bool pseudo_random,
                                                    int64_t seed, int64_t seed2);

// ---- gradients ----------------------------------------------------------------------------
struct GradPlan {
  int64_t N, H, W, C;   // input (= gradient) shape
  AxisPlan rows, cols;  // cells over the input, one per out_backprop row / column
};

// FractionalAvgPoolGrad's checks in TF's order, plus: out_backprop batch/depth must
// not exceed the input's, and the used sequence entries must be strictly increasing and at most the
// input's rows/columns. Sequences may live on any device (they are read on the host).
GradPlan check_avg_grad(const char* op, c10::IntArrayRef orig_input_tensor_shape,
                        const at::Tensor& out_backprop, const at::Tensor& row_pooling_sequence,
                        const at::Tensor& col_pooling_sequence, bool overlapping);

// out_backprop as [N, out_rows, out_cols, C]: zero-padded when its batch/depth are smaller than
// the input's (TF accepts that and leaves those gradients zero).
at::Tensor pad_out_backprop(const at::Tensor& out_backprop, const GradPlan& plan);

// FractionalMaxPoolGrad's checks in TF's order, plus the ones whose absence lets TF
// 2.21 corrupt its heap: orig_output's batch/depth, out_backprop's shape, sequence lengths and
// values. The check that the recomputed maxima equal orig_output is the kernel's.
GradPlan check_max_grad(const char* op, const at::Tensor& orig_input, const at::Tensor& orig_output,
                        const at::Tensor& out_backprop, const at::Tensor& row_pooling_sequence,
                        const at::Tensor& col_pooling_sequence, bool overlapping);

// Pooling `value` over given cells (the backward of fractional_avg_pool_grad): value 4-D, the
// sequences int64 vectors of at least 2 valid entries. Rows/cols plans over value's H and W.
GradPlan check_pool_with_sequences(const char* op, const at::Tensor& value,
                                   const at::Tensor& row_pooling_sequence,
                                   const at::Tensor& col_pooling_sequence, bool overlapping);

// The dtypes of TF's kernels (float, double, int32, int64) plus float16 and bfloat16.
void check_value_dtype(const char* op, const char* name, const at::Tensor& t);

// Calls fn(scalar_t{}) for the family's dtypes: TF's (float32, float64, int32, int64) plus
// float16 and bfloat16. One place for the dispatch of every CPU and CUDA entry point.
template <typename Fn>
void dispatch_value_types(at::ScalarType t, Fn&& fn) {
  if (at::isIntegralType(t, /*includeBool=*/false)) {
    AT_DISPATCH_INDEX_TYPES(t, "fractional_pool", [&] { fn(index_t{}); });
  } else {
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, t, "fractional_pool",
                                    [&] { fn(scalar_t{}); });
  }
}

// NHWC with contiguous channels is read in place with its other strides; else one copy.
inline at::Tensor channels_contiguous(const at::Tensor& t) {
  return (t.size(3) <= 1 || t.stride(3) == 1) ? t : t.contiguous();
}

// TF's message when a recomputed maximum differs from orig_output (FractionalMaxPoolGrad's last
// check, made inside its kernel).
constexpr const char* kOutputMismatch = "tensor_out_dup is not the same as tensor_out";

}  // namespace fracpool
}  // namespace torch_tfgrads
