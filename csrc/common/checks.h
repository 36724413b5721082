// Small helpers shared by every family's argument checks (CPU and CUDA).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <sstream>
#include <string>

namespace torch_tfgrads {

// TensorFlow prints shapes as "[2,3,4]" (no spaces); we quote TF's messages, so we print the same.
inline std::string tf_shape(c10::IntArrayRef sizes) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < sizes.size(); ++i) os << (i ? "," : "") << sizes[i];
  os << ']';
  return os.str();
}

inline void check_same_device(const at::Tensor& ref, const at::Tensor& t, const char* op,
                              const char* ref_name, const char* name) {
  TORCH_CHECK(t.device() == ref.device(), op, ": argument '", name, "' is on ", t.device(),
              " but '", ref_name, "' is on ", ref.device(), "; all tensors must be on one device");
}

inline void check_dtype(const at::Tensor& t, at::ScalarType expected, const char* op,
                        const char* name, const char* why) {
  TORCH_CHECK_TYPE(t.scalar_type() == expected, op, ": argument '", name, "' must be a ",
                   c10::toString(expected), " tensor (", why, "), got ",
                   c10::toString(t.scalar_type()));
}

}  // namespace torch_tfgrads
