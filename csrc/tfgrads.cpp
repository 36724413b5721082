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
}
