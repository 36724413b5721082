// CudnnRNNCanonicalToParamsV2 / CudnnRNNParamsToCanonicalV2: between TF's canonical weights
// and biases and the opaque buffer (layout in cudnn_rnn.h). Pure tensor slicing and
// concatenation, so one device-independent implementation, registered for CPU and CUDA by
// the per-device files; fakes and autograd are in torch_tfgrads/.
#include <ATen/Functions.h>
#include <c10/util/Exception.h>

#include <sstream>

#include "checks.h"
#include "cudnn_rnn.h"

namespace torch_tfgrads {
namespace cudnn_rnn {
namespace {

std::string config_text(const Config& cfg) {
  std::ostringstream os;
  os << "num_layers=" << cfg.L << ", num_units=" << cfg.U << ", input_size=" << cfg.I
     << ", directions=" << cfg.D << ", num_proj=" << cfg.P;
  return os.str();
}

void check_tensors(const char* op, const char* name, at::TensorList ts,
                   const std::vector<std::vector<int64_t>>& shapes, const Config& cfg,
                   const at::Tensor& ref) {
  TORCH_CHECK(ts.size() == shapes.size(), op, ": argument '", name, "': expected ", shapes.size(),
              " tensors for this configuration (", config_text(cfg), "), got ", ts.size());
  for (size_t k = 0; k < ts.size(); ++k) {
    TORCH_CHECK(ts[k].sizes() == c10::IntArrayRef(shapes[k]), op, ": argument '", name, "': ", name,
                "[", k, "] must have shape ", tf_shape(shapes[k]), ", got ",
                tf_shape(ts[k].sizes()));
    TORCH_CHECK_TYPE(ts[k].scalar_type() == ref.scalar_type(), op, ": argument '", name,
                     "': ", name, "[", k, "] must have dtype ", c10::toString(ref.scalar_type()),
                     ", got ", c10::toString(ts[k].scalar_type()));
    check_same_device(ref, ts[k], op, "weights[0]", name);
  }
}

}  // namespace

at::Tensor canonical_to_params(int64_t num_layers, int64_t num_units, int64_t input_size,
                               at::TensorList weights, at::TensorList biases,
                               c10::string_view rnn_mode, c10::string_view input_mode,
                               c10::string_view direction, int64_t num_proj) {
  const char* op = "cudnn_rnn_canonical_to_params_v2";
  const Config cfg = config_from_sizes(op, num_layers, num_units, input_size, rnn_mode, input_mode,
                                       direction, num_proj);
  TORCH_CHECK(!weights.empty(), op, ": argument 'weights' must not be empty");
  const at::Tensor& ref = weights[0];
  const auto st = ref.scalar_type();
  TORCH_CHECK_TYPE(st == at::kFloat || st == at::kDouble || st == at::kHalf || st == at::kBFloat16,
                   op,
                   ": argument 'weights' must hold float16, bfloat16, float32 or float64 "
                   "tensors, got ",
                   c10::toString(st));
  check_tensors(op, "weights", weights, canonical_weight_shapes(cfg), cfg, ref);
  check_tensors(op, "biases", biases, canonical_bias_shapes(cfg), cfg, ref);
  // Per pseudo-layer: gate input and recurrent matrices, input and recurrent biases, then the
  // projection (the matrices precede the projection in the canonical weight list).
  std::vector<at::Tensor> pieces;
  size_t wi = 0, bi = 0;
  for (int64_t layer = 0; layer < cfg.L; ++layer) {
    for (int64_t d = 0; d < cfg.D; ++d) {
      const int64_t mats = (cfg.has_input_weights(layer) ? 2 : 1) * cfg.G;
      for (int64_t k = 0; k < mats; ++k) pieces.push_back(weights[wi++].reshape(-1));
      for (int64_t k = 0; k < 2 * cfg.G; ++k) pieces.push_back(biases[bi++].reshape(-1));
      if (cfg.P > 0) pieces.push_back(weights[wi++].reshape(-1));
    }
  }
  return at::cat(pieces);
}

std::tuple<std::vector<at::Tensor>, std::vector<at::Tensor>> params_to_canonical(
    int64_t num_layers, int64_t num_units, int64_t input_size, const at::Tensor& params,
    int64_t num_params_weights, int64_t num_params_biases, c10::string_view rnn_mode,
    c10::string_view input_mode, c10::string_view direction, int64_t num_proj) {
  const char* op = "cudnn_rnn_params_to_canonical_v2";
  const Config cfg = config_from_sizes(op, num_layers, num_units, input_size, rnn_mode, input_mode,
                                       direction, num_proj);
  const auto weight_shapes = canonical_weight_shapes(cfg);
  const auto bias_shapes = canonical_bias_shapes(cfg);
  const int64_t LD = cfg.L * cfg.D;
  // TF's checks and messages (typos included), which assume every layer has input matrices.
  TORCH_CHECK_VALUE(num_params_weights >= 1 && num_params_biases >= 1, op,
                    ": num_params_weights and num_params_biases must be >= 1");
  if (!cfg.skip_input) {
    TORCH_CHECK_VALUE(num_params_weights % LD == 0, op,
                      ": Number of params (weights) is not a "
                      "multipleof num_layers * num_dirs.");
    TORCH_CHECK_VALUE(num_params_biases % LD == 0, op,
                      ": Number of params (biases) is not a "
                      "multipleof num_layers * num_dirs.");
    const int64_t per_layer = num_params_weights / LD;
    if (cfg.P == 0) {
      TORCH_CHECK_VALUE(per_layer % 2 == 0, op,
                        ": Number of params (weights) per layer is not"
                        "an even number with no projection.");
    } else {
      TORCH_CHECK_VALUE(per_layer % 2 == 1, op,
                        ": Number of params (weights) per layer is not"
                        "an odl number with projection.");
    }
  }
  TORCH_CHECK_VALUE(num_params_weights == static_cast<int64_t>(weight_shapes.size()), op,
                    ": C Number of params mismatch. Expected ", num_params_weights, ", got ",
                    weight_shapes.size());
  TORCH_CHECK_VALUE(num_params_biases == static_cast<int64_t>(bias_shapes.size()), op,
                    ": A Number of params mismatch. Expected ", num_params_biases, ", got ",
                    bias_shapes.size());
  TORCH_CHECK(params.dim() == 1, op, ": argument 'params' must be 1-D, got shape ",
              tf_shape(params.sizes()));
  const int64_t expected = params_size(cfg);
  TORCH_CHECK(params.numel() == expected, op, ": argument 'params' has ", params.numel(),
              " elements but cudnn_rnn_params_size of this configuration (", config_text(cfg),
              ") is ", expected);
  const auto st = params.scalar_type();
  TORCH_CHECK_TYPE(st == at::kFloat || st == at::kDouble || st == at::kHalf || st == at::kBFloat16,
                   op,
                   ": argument 'params' must be a float16, bfloat16, float32 or float64 "
                   "tensor, got ",
                   c10::toString(st));
  std::vector<at::Tensor> weights, biases;
  int64_t off = 0;
  auto take = [&](const std::vector<int64_t>& shape) {
    int64_t n = 1;
    for (auto s : shape) n *= s;
    at::Tensor t = params.narrow(0, off, n).reshape(shape).clone();  // outputs never alias
    off += n;
    return t;
  };
  size_t wi = 0, bi = 0;
  for (int64_t layer = 0; layer < cfg.L; ++layer) {
    for (int64_t d = 0; d < cfg.D; ++d) {
      const int64_t mats = (cfg.has_input_weights(layer) ? 2 : 1) * cfg.G;
      for (int64_t k = 0; k < mats; ++k) weights.push_back(take(weight_shapes[wi++]));
      for (int64_t k = 0; k < 2 * cfg.G; ++k) biases.push_back(take(bias_shapes[bi++]));
      if (cfg.P > 0) weights.push_back(take(weight_shapes[wi++]));
    }
  }
  return {weights, biases};
}

}  // namespace cudnn_rnn
}  // namespace torch_tfgrads
