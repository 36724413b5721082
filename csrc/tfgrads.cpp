// The one schema library of torch_tfgrads: every op's signature, defined once, in TensorFlow's
// argument order with TensorFlow's defaults (each op is documented in docs/ops/<family>.md).
// Kernels register per backend in csrc/cpu/*.cpp and csrc/cuda/*.cu; fake kernels and autograd
// formulas live in Python (torch_tfgrads/ops/<family>.py).
#include <Python.h>
#include <torch/library.h>

#include <c10/util/Exception.h>

#include <string>

#include "common/launch_geometry.h"
#include "cpu/isa.h"

// `from torch_tfgrads import _C` only has to load this .so so that the static TORCH_LIBRARY
// initialisers run; a limited-API module object is enough (no pybind11). Its one function
// reports the CPU kernels' ISA paths for torch_tfgrads.cpu_paths().
namespace {

PyObject* cpu_paths(PyObject*, PyObject*) {
  try {
    const bool avx512 = torch_tfgrads::avx512_enabled();
    const bool brgemm = torch_tfgrads::rnn_brgemm_available();
    const bool batched = torch_tfgrads::rnn_batched_gemms_on_brgemm();
    return Py_BuildValue(
        "{s:O,s:O,s:s,s:L,s:L,s:L,s:s,s:O,s:L}", "avx512_kernels", avx512 ? Py_True : Py_False,
        "rnn_brgemm", brgemm ? Py_True : Py_False, "rnn_batched_gemms", batched ? "brgemm" : "aten",
        "rnn_directions_in_turn_above_bytes",
        static_cast<long long>(torch_tfgrads::rnn_directions_in_turn_above_bytes()),
        "rnn_tiled_steps_min_rows_per_thread",
        static_cast<long long>(torch_tfgrads::kRnnTiledStepsMinRowsPerThread),
        "rnn_tiles_before_brgemm_up_to_bytes",
        static_cast<long long>(torch_tfgrads::rnn_tiles_before_brgemm_up_to_bytes()),
        "depthwise_aliasing", torch_tfgrads::depthwise_aliasing_name(), "streaming_stores",
        torch_tfgrads::streaming_stores_allowed() ? Py_True : Py_False, "kernel_l3_bytes",
        static_cast<long long>(torch_tfgrads::l3_cache_bytes()));
  } catch (const c10::Error& e) {  // a bad TFGRADS_CPU_CAPABILITY, _DEPTHWISE_ALIASING, _L3_BYTES
    PyErr_SetString(PyExc_ValueError, e.what_without_backtrace());
    return nullptr;
  }
}

// The CUDA kernels' launch plans (common/launch_geometry.h), for the tests: compiled into every
// build, as they are pure functions of the sizes.
PyObject* launch_plan(PyObject*, PyObject* args) {
  const char* kind = nullptr;
  long long a = 0, b = 0, c = 0, d = 0;
  if (!PyArg_ParseTuple(args, "sLLLL", &kind, &a, &b, &c, &d)) return nullptr;
  using namespace torch_tfgrads::launch;
  if (std::string(kind) == "bn") {  // (channels_last, C, outer, inner)
    const BnPlan p = bn_plan(a != 0, b, c, d);
    return Py_BuildValue("{s:L,s:L,s:L}", "parts", (long long)p.parts, "per_part",
                         (long long)p.per_part, "grid_x", (long long)p.grid_x);
  }
  if (std::string(kind) == "dw_filter_grad") {  // (P, taps, CM, acc_bytes)
    const DwFilterGradPlan p = dw_filter_grad_plan(a, b, c, d);
    return Py_BuildValue("{s:L,s:L,s:L,s:L,s:L}", "chunks", (long long)p.chunks, "per_chunk",
                         (long long)p.per_chunk, "grid_x", (long long)p.grid_x, "grid_y",
                         (long long)p.grid_y, "workspace_bytes", (long long)p.workspace_bytes);
  }
  PyErr_SetString(PyExc_ValueError, "_launch_plan: kind must be 'bn' or 'dw_filter_grad'");
  return nullptr;
}

// The L3 size Linux's sysfs reports for CPU 0, 0 where none (torch_tfgrads.cpu.l3_bytes()).
PyObject* l3_bytes(PyObject*, PyObject*) {
  return PyLong_FromLongLong(static_cast<long long>(torch_tfgrads::l3_reported_bytes()));
}

PyMethodDef methods[] = {
    {"_cpu_paths", cpu_paths, METH_NOARGS, "{'avx512_kernels': bool, 'rnn_brgemm': bool, ...}"},
    {"_launch_plan", launch_plan, METH_VARARGS, "(kind, 4 sizes) -> the CUDA launch plan"},
    {"_l3_bytes", l3_bytes, METH_NOARGS, "the L3 size sysfs reports for CPU 0, 0 where none"},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

extern "C" {
PyObject* PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, methods};
  return PyModule_Create(&module_def);
}
}

TORCH_LIBRARY(tfgrads, m) {
  // Each family's fake kernels live in its Python module: set_python_module applies to the defs
  // that follow it, and torch checks that the fake was registered from exactly that module (so
  // a FakeTensor call without `import torch_tfgrads` imports the right one).

  // ---- FusedBatchNorm family ------------------------------------------------------------
  m.set_python_module("torch_tfgrads.ops.fused_batch_norm");
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
  // The local halves of synchronized batch norm (no TF op of their own: TF composes them from
  // reduce_sum and all-reduces; torch_tfgrads/distributed/sync_batch_norm.py all-reduces the
  // packed results). sync_stats: [sum x | sum x^2 | count] per channel (2C + 1 values of the
  // parameter dtype); sync_grad_sums: [sum dy | sum dy * (x - mean)] (2C); sync_backprop_input:
  // the input gradient from the all-reduced grad_sums and count.
  m.def("fused_batch_norm_sync_stats(Tensor x, str data_format=\"NHWC\") -> Tensor");
  m.def(
      "fused_batch_norm_sync_grad_sums(Tensor y_backprop, Tensor x, Tensor mean, "
      "str data_format=\"NHWC\") -> Tensor");
  m.def(
      "fused_batch_norm_sync_backprop_input(Tensor y_backprop, Tensor x, Tensor scale, "
      "Tensor mean, Tensor variance, Tensor grad_sums, Tensor count, float epsilon=0.001, "
      "str data_format=\"NHWC\") -> Tensor");

  // ---- FractionalPool family -------------------------------------------------------------
  m.set_python_module("torch_tfgrads.ops.fractional_pool");
  // tf.raw_ops.FractionalAvgPool / FractionalMaxPool on NHWC `value`. The sequences (int64,
  // out_rows+1 and out_cols+1 elements, on value's device) are TF's for any nonzero seed pair;
  // seeds (0, 0) are drawn from torch's default CPU generator (hence the seeded tag: the op
  // must not be replayed, e.g. recomputed by a partitioner, as that would draw new cells).
  m.def(
      "fractional_avg_pool(Tensor value, float[] pooling_ratio, bool pseudo_random=False, "
      "bool overlapping=False, bool deterministic=False, int seed=0, int seed2=0) -> "
      "(Tensor output, Tensor row_pooling_sequence, Tensor col_pooling_sequence)",
      {at::Tag::nondeterministic_seeded, at::Tag::cudagraph_unsafe});
  m.def(
      "fractional_avg_pool_grad(SymInt[] orig_input_tensor_shape, Tensor out_backprop, "
      "Tensor row_pooling_sequence, Tensor col_pooling_sequence, bool overlapping=False) -> "
      "Tensor");
  m.def(
      "fractional_max_pool(Tensor value, float[] pooling_ratio, bool pseudo_random=False, "
      "bool overlapping=False, bool deterministic=False, int seed=0, int seed2=0) -> "
      "(Tensor output, Tensor row_pooling_sequence, Tensor col_pooling_sequence)",
      {at::Tag::nondeterministic_seeded, at::Tag::cudagraph_unsafe});
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
  m.set_python_module("torch_tfgrads.ops.depthwise_conv2d");
  // tf.raw_ops.DepthwiseConv2dNative{,BackpropInput,BackpropFilter}. filter is always
  // [fh, fw, C, M]; output channel c*M+m reads input channel c. Unlike TF's CPU kernels: any
  // row/column strides, dilations honoured by all three ops (TF's backprops ignore them), NCHW
  // supported; sizes by TF's kernel rule (truncating division).
  m.def(
      "depthwise_conv2d_native(Tensor input, Tensor filter, int[] strides, str padding, "
      "int[]? explicit_paddings=None, str data_format=\"NHWC\", int[] dilations=[1,1,1,1]) -> "
      "Tensor");
  m.def(
      "depthwise_conv2d_native_backprop_input(SymInt[] input_sizes, Tensor filter, "
      "Tensor out_backprop, int[] strides, str padding, int[]? explicit_paddings=None, "
      "str data_format=\"NHWC\", int[] dilations=[1,1,1,1]) -> Tensor");
  m.def(
      "depthwise_conv2d_native_backprop_filter(Tensor input, SymInt[] filter_sizes, "
      "Tensor out_backprop, int[] strides, str padding, int[]? explicit_paddings=None, "
      "str data_format=\"NHWC\", int[] dilations=[1,1,1,1]) -> Tensor");

  // ---- CudnnRNN family ----------------------------------------------------------------------
  // The params conversions' fakes are in their own module (ops/cudnn_rnn_params.py), the
  // forward's and backward's in ops/cudnn_rnn.py.
  m.set_python_module("torch_tfgrads.ops.cudnn_rnn_params");
  // tf.raw_ops.CudnnRNNCanonicalToParamsV2 / CudnnRNNParamsToCanonicalV2 (the size attrs are
  // ints here, TF's are host int32 tensors). Opaque layout per pseudo-layer: gate input
  // matrices, gate recurrent matrices, input biases, recurrent biases, projection.
  // (CudnnRNNParamsSize needs no tensor: torch_tfgrads.cudnn_rnn_params_size.)
  m.def(
      "cudnn_rnn_canonical_to_params_v2(int num_layers, int num_units, int input_size, "
      "Tensor[] weights, Tensor[] biases, str rnn_mode=\"lstm\", "
      "str input_mode=\"linear_input\", str direction=\"unidirectional\", int num_proj=0) -> "
      "Tensor");
  m.def(
      "cudnn_rnn_params_to_canonical_v2(int num_layers, int num_units, int input_size, "
      "Tensor params, int num_params_weights, int num_params_biases, str rnn_mode=\"lstm\", "
      "str input_mode=\"linear_input\", str direction=\"unidirectional\", int num_proj=0) -> "
      "(Tensor[] weights, Tensor[] biases)");
  m.set_python_module("torch_tfgrads.ops.cudnn_rnn");
  // tf.raw_ops.CudnnRNNV3 on any device. reserve_space (training) holds our saved activations
  // and dropout masks, 1-D in input's dtype; in inference it is a zero scalar, as are
  // host_reserved (int8) and output_c for non-LSTM modes. Dropout masks come from torch's CPU
  // generator (seeded by seed/seed2 when either is nonzero): hence the seeded tag.
  m.def(
      "cudnn_rnn_v3(Tensor input, Tensor input_h, Tensor input_c, Tensor params, "
      "Tensor sequence_lengths, str rnn_mode=\"lstm\", str input_mode=\"linear_input\", "
      "str direction=\"unidirectional\", float dropout=0.0, int seed=0, int seed2=0, "
      "int num_proj=0, bool is_training=True, bool time_major=True) -> (Tensor output, "
      "Tensor output_h, Tensor output_c, Tensor reserve_space, Tensor host_reserved)",
      {at::Tag::nondeterministic_seeded, at::Tag::cudagraph_unsafe});
  // tf.raw_ops.CudnnRNNBackpropV3: gradients of <output_backprop, output> + <output_h_backprop,
  // output_h> + <output_c_backprop, output_c>; params_backprop in the opaque layout. Needs the
  // forward's training reserve_space (its size is checked); host_reserved is ignored, as in TF.
  m.def(
      "cudnn_rnn_backprop_v3(Tensor input, Tensor input_h, Tensor input_c, Tensor params, "
      "Tensor sequence_lengths, Tensor output, Tensor output_h, Tensor output_c, "
      "Tensor output_backprop, Tensor output_h_backprop, Tensor output_c_backprop, "
      "Tensor reserve_space, Tensor host_reserved, str rnn_mode=\"lstm\", "
      "str input_mode=\"linear_input\", str direction=\"unidirectional\", float dropout=0.0, "
      "int seed=0, int seed2=0, int num_proj=0, bool time_major=True) -> "
      "(Tensor input_backprop, Tensor input_h_backprop, Tensor input_c_backprop, "
      "Tensor params_backprop)");
}
