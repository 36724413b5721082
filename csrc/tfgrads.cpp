// The one schema library of torch_tfgrads: every op's signature, defined once, in TensorFlow's
// argument order with TensorFlow's defaults (../shared/API.md is the contract). Kernels register
// per backend in csrc/cpu/*.cpp and csrc/cuda/*.cu; fake kernels and autograd formulas live in
// Python (torch_tfgrads/_meta.py, torch_tfgrads/_autograd.py).
#include <Python.h>
#include <torch/library.h>

// `from torch_tfgrads import _C` only has to load this .so so that the static TORCH_LIBRARY
// initialisers run; a limited-API module object with no methods is enough (no pybind11).
extern "C" {
PyObject* PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&module_def);
}
}

TORCH_LIBRARY(tfgrads, m) {
  // Fake kernels must all live in this module (torch enforces it, see extension_style.md P10).
  m.set_python_module("torch_tfgrads._meta");

  // ---- FusedBatchNorm family ------------------------------------------------------------
  // tf.raw_ops.FusedBatchNormV3. reserve_space_1/2 = batch mean / biased batch variance on
  // every device (TF's CPU convention); in inference they are copies of mean/variance (TF's
  // Eigen kernel leaves them uninitialised). reserve_space_3 is a zero scalar.
  m.def(
      "fused_batch_norm_v3(Tensor x, Tensor scale, Tensor offset, Tensor mean, Tensor variance, "
      "float epsilon=0.0001, float exponential_avg_factor=1.0, str data_format=\"NHWC\", "
      "bool is_training=True) -> (Tensor y, Tensor batch_mean, Tensor batch_variance, "
      "Tensor reserve_space_1, Tensor reserve_space_2, Tensor reserve_space_3)");
  // tf.raw_ops.FusedBatchNormGradV3. Trusts reserve_space_1/2 as (mean, biased variance) in
  // training and as the population statistics in inference; reserve_space_3 is ignored.
  // Unlike TF's Eigen kernel, inference accepts NCHW/NCDHW too (TF's oneDNN kernel does).
  m.def(
      "fused_batch_norm_grad_v3(Tensor y_backprop, Tensor x, Tensor scale, "
      "Tensor reserve_space_1, Tensor reserve_space_2, Tensor reserve_space_3, "
      "float epsilon=0.0001, str data_format=\"NHWC\", bool is_training=True) -> "
      "(Tensor x_backprop, Tensor scale_backprop, Tensor offset_backprop, "
      "Tensor reserve_space_4, Tensor reserve_space_5)");

  // ---- FractionalPool family -------------------------------------------------------------
  // tf.raw_ops.FractionalAvgPool / FractionalMaxPool on NHWC `value`. The sequences (int64,
  // out_rows+1 and out_cols+1 elements, on value's device) are TF's for any nonzero seed pair;
  // seeds (0, 0) are drawn from torch's default CPU generator (hence the seeded tag: the op
  // must not be replayed, e.g. recomputed by a partitioner, as that would draw new cells).
  m.def(
      "fractional_avg_pool(Tensor value, float[] pooling_ratio, bool pseudo_random=False, "
      "bool overlapping=False, bool deterministic=False, int seed=0, int seed2=0) -> "
      "(Tensor output, Tensor row_pooling_sequence, Tensor col_pooling_sequence)",
      {at::Tag::nondeterministic_seeded});
  m.def(
      "fractional_avg_pool_grad(SymInt[] orig_input_tensor_shape, Tensor out_backprop, "
      "Tensor row_pooling_sequence, Tensor col_pooling_sequence, bool overlapping=False) -> "
      "Tensor");
  m.def(
      "fractional_max_pool(Tensor value, float[] pooling_ratio, bool pseudo_random=False, "
      "bool overlapping=False, bool deterministic=False, int seed=0, int seed2=0) -> "
      "(Tensor output, Tensor row_pooling_sequence, Tensor col_pooling_sequence)",
      {at::Tag::nondeterministic_seeded});
  m.def(
      "fractional_max_pool_grad(Tensor orig_input, Tensor orig_output, Tensor out_backprop, "
      "Tensor row_pooling_sequence, Tensor col_pooling_sequence, bool overlapping=False) -> "
      "Tensor");
  // TF's GeneratePoolingSequence alone, for one axis on a fresh (seed, seed2) stream: the row
  // sequence of the pool ops (their column sequence continues the same stream). CPU int64.
  m.def(
      "fractional_pooling_sequence(int input_length, int output_length, "
      "bool pseudo_random=False, int seed=0, int seed2=0) -> Tensor",
      {at::Tag::nondeterministic_seeded});
  // Backward of the two gradient ops (both are linear in out_backprop), used by autograd for
  // double backward. Average: pool `grad` over the given cells (the adjoint of
  // fractional_avg_pool_grad). Max: read `grad` at each cell's argmax (the adjoint of
  // fractional_max_pool_grad).
  m.def(
      "_fractional_avg_pool_grad_backward(Tensor grad, Tensor row_pooling_sequence, "
      "Tensor col_pooling_sequence, bool overlapping=False) -> Tensor");
  m.def(
      "_fractional_max_pool_grad_backward(Tensor orig_input, Tensor orig_output, Tensor grad, "
      "Tensor row_pooling_sequence, Tensor col_pooling_sequence, bool overlapping=False) -> "
      "Tensor");

  // ---- DepthwiseConv2dNative family -------------------------------------------------------
  // tf.raw_ops.DepthwiseConv2dNative{,BackpropInput,BackpropFilter}. filter is always
  // [fh, fw, C, M]; output channel c*M+m reads input channel c. Unlike TF's CPU kernels: any
  // row/column strides, dilations honoured by all three ops (TF's backprops ignore them), NCHW
  // supported; sizes by TF's kernel rule (truncating division).
  m.def(
      "depthwise_conv2d_native(Tensor input, Tensor filter, int[] strides, str padding, "
      "int[] explicit_paddings=[], str data_format=\"NHWC\", int[] dilations=[1,1,1,1]) -> "
      "Tensor");
  m.def(
      "depthwise_conv2d_native_backprop_input(SymInt[] input_sizes, Tensor filter, "
      "Tensor out_backprop, int[] strides, str padding, int[] explicit_paddings=[], "
      "str data_format=\"NHWC\", int[] dilations=[1,1,1,1]) -> Tensor");
  m.def(
      "depthwise_conv2d_native_backprop_filter(Tensor input, SymInt[] filter_sizes, "
      "Tensor out_backprop, int[] strides, str padding, int[] explicit_paddings=[], "
      "str data_format=\"NHWC\", int[] dilations=[1,1,1,1]) -> Tensor");
}
