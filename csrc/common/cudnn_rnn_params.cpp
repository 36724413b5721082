// CudnnRNNCanonicalToParamsV2 / CudnnRNNParamsToCanonicalV2: between TF's canonical weights
// and biases and the opaque buffer (layout in cudnn_rnn.h). Pure tensor slicing and
// concatenation, so one device-independent implementation, registered for CPU and CUDA by
// the per-device files; fakes and autograd are in torch_tfgrads/.
#include <ATen/Functions.h>
#include <ATen/Parallel.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>
#include <functional>
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

// Counts first: the shapes are built only once the list is as long as they are.
void check_tensors(const char* op, const char* name, at::TensorList ts, int64_t count,
                   const std::function<std::vector<std::vector<int64_t>>()>& shapes_of,
                   const Config& cfg, const at::Tensor& ref) {
  TORCH_CHECK(static_cast<int64_t>(ts.size()) == count, op, ": argument '", name, "': expected ",
              count, " tensors for this configuration (", config_text(cfg), "), got ", ts.size());
  const auto shapes = shapes_of();
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

// Copies pieces k = 0, 1, ... of bytes[k] bytes from src[k] to dst[k], as if one buffer, in
// one parallel region of 64 KiB chunks: a conversion moves dozens of tensors, and a clone or a
// cat's copy per tensor pays a dispatch and a parallel region each (CPU only).
struct Pieces {
  std::vector<const char*> src;
  std::vector<char*> dst;
  std::vector<int64_t> end;  // running sum of the sizes

  void add(const void* from, void* to, int64_t bytes) {
    src.push_back(static_cast<const char*>(from));
    dst.push_back(static_cast<char*>(to));
    end.push_back((end.empty() ? 0 : end.back()) + bytes);
  }
  void copy() const {
    if (end.empty()) return;
    constexpr int64_t kChunk = 64 << 10;
    const int64_t total = end.back();
    at::parallel_for(0, (total + kChunk - 1) / kChunk, 1, [&](int64_t c0, int64_t c1) {
      const int64_t lo = c0 * kChunk, hi = std::min(total, c1 * kChunk);
      // the first piece ending past lo, then on through the pieces until hi
      size_t k = std::upper_bound(end.begin(), end.end(), lo) - end.begin();
      for (int64_t pos = lo; pos < hi; ++k) {
        const int64_t begin = k ? end[k - 1] : 0, stop = std::min(hi, end[k]);
        if (stop > pos) std::memcpy(dst[k] + (pos - begin), src[k] + (pos - begin), stop - pos);
        pos = std::max(pos, stop);
      }
    });
  }
};

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
  check_tensors(
      op, "weights", weights, canonical_weight_count(cfg),
      [&] { return canonical_weight_shapes(cfg); }, cfg, ref);
  check_tensors(
      op, "biases", biases, canonical_bias_count(cfg), [&] { return canonical_bias_shapes(cfg); },
      cfg, ref);
  // Per pseudo-layer: gate input and recurrent matrices, input and recurrent biases, then the
  // projection (the matrices precede the projection in the canonical weight list).
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
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
  if (!ref.is_cpu()) return at::cat(pieces);
  at::Tensor out = at::empty({params_size(op, cfg)}, ref.options());
  Pieces copies;
  int64_t off = 0;
  for (at::Tensor& t : pieces) {
    t = t.resolve_neg().contiguous();  // itself unless strided (a 1-D slice) or a negated view
    copies.add(t.const_data_ptr(), static_cast<char*>(out.mutable_data_ptr()) + off * t.itemsize(),
               t.numel() * t.itemsize());
    off += t.numel();
  }
  copies.copy();
  return out;
}

std::tuple<std::vector<at::Tensor>, std::vector<at::Tensor>> params_to_canonical(
    int64_t num_layers, int64_t num_units, int64_t input_size, const at::Tensor& params,
    int64_t num_params_weights, int64_t num_params_biases, c10::string_view rnn_mode,
    c10::string_view input_mode, c10::string_view direction, int64_t num_proj) {
  const char* op = "cudnn_rnn_params_to_canonical_v2";
  const Config cfg = config_from_sizes(op, num_layers, num_units, input_size, rnn_mode, input_mode,
                                       direction, num_proj);
  const int64_t LD = cfg.L * cfg.D;
  // TF's checks and messages (typos included), which assume every layer has input matrices.
  TORCH_CHECK_VALUE(num_params_weights >= 1 && num_params_biases >= 1, op, ": argument '",
                    num_params_weights < 1 ? "num_params_weights" : "num_params_biases",
                    "': num_params_weights and num_params_biases must be >= 1");
  if (!cfg.skip_input) {
    TORCH_CHECK_VALUE(num_params_weights % LD == 0, op,
                      ": argument 'num_params_weights': Number of params (weights) is not a "
                      "multipleof num_layers * num_dirs.");
    TORCH_CHECK_VALUE(num_params_biases % LD == 0, op,
                      ": argument 'num_params_biases': Number of params (biases) is not a "
                      "multipleof num_layers * num_dirs.");
    const int64_t per_layer = num_params_weights / LD;
    if (cfg.P == 0) {
      TORCH_CHECK_VALUE(
          per_layer % 2 == 0, op,
          ": argument 'num_params_weights': Number of params (weights) per layer is not"
          "an even number with no projection.");
    } else {
      TORCH_CHECK_VALUE(
          per_layer % 2 == 1, op,
          ": argument 'num_params_weights': Number of params (weights) per layer is not"
          "an odl number with projection.");
    }
  }
  TORCH_CHECK_VALUE(num_params_weights == canonical_weight_count(cfg), op,
                    ": argument 'num_params_weights': C Number of params mismatch. Expected ",
                    num_params_weights, ", got ", canonical_weight_count(cfg));
  TORCH_CHECK_VALUE(num_params_biases == canonical_bias_count(cfg), op,
                    ": argument 'num_params_biases': A Number of params mismatch. Expected ",
                    num_params_biases, ", got ", canonical_bias_count(cfg));
  TORCH_CHECK(params.dim() == 1, op, ": argument 'params' must be 1-D, got shape ",
              tf_shape(params.sizes()));
  const int64_t expected = params_size(op, cfg);
  TORCH_CHECK(params.numel() == expected, op, ": argument 'params' has ", params.numel(),
              " elements but cudnn_rnn_params_size of this configuration (", config_text(cfg),
              ") is ", expected);
  const auto st = params.scalar_type();
  TORCH_CHECK_TYPE(st == at::kFloat || st == at::kDouble || st == at::kHalf || st == at::kBFloat16,
                   op,
                   ": argument 'params' must be a float16, bfloat16, float32 or float64 "
                   "tensor, got ",
                   c10::toString(st));
  const auto weight_shapes = canonical_weight_shapes(cfg);  // as many as params holds
  const auto bias_shapes = canonical_bias_shapes(cfg);
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  std::vector<at::Tensor> weights, biases;
  int64_t off = 0;
  // Every output is a copy (outputs never alias): on the CPU all copied in one parallel region.
  const bool cpu = params.is_cpu();
  const at::Tensor src = cpu ? params.resolve_neg().contiguous() : params;
  Pieces copies;
  auto take = [&](const std::vector<int64_t>& shape) {
    int64_t n = 1;
    for (auto s : shape) n *= s;
    at::Tensor t;
    if (cpu) {
      t = at::empty(shape, src.options());
      copies.add(static_cast<const char*>(src.const_data_ptr()) + off * src.itemsize(),
                 t.mutable_data_ptr(), n * src.itemsize());
    } else {
      t = src.narrow(0, off, n).reshape(shape).clone();
    }
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
  copies.copy();
  return {weights, biases};
}

}  // namespace cudnn_rnn
}  // namespace torch_tfgrads
