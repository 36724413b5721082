// CudnnRNN configuration, checks and the opaque params layout (see cudnn_rnn.h).
#include "cudnn_rnn.h"

#include <ATen/Functions.h>
#include <c10/util/Exception.h>

#include "checks.h"

namespace torch_tfgrads {
namespace cudnn_rnn {

Mode parse_mode(const char* op, c10::string_view rnn_mode) {
  if (rnn_mode == "lstm") return Mode::kLstm;
  if (rnn_mode == "gru") return Mode::kGru;
  if (rnn_mode == "rnn_tanh") return Mode::kRnnTanh;
  if (rnn_mode == "rnn_relu") return Mode::kRnnRelu;
  TORCH_CHECK_VALUE(false, op,
                    ": argument 'rnn_mode' must be one of rnn_relu, rnn_tanh, lstm, "
                    "gru, got '",
                    rnn_mode, "'");
}

int64_t gates_of(Mode mode) {
  switch (mode) {
    case Mode::kLstm: return 4;
    case Mode::kGru: return 3;
    default: return 1;
  }
}

int64_t parse_dirs(const char* op, c10::string_view direction) {
  if (direction == "unidirectional") return 1;
  if (direction == "bidirectional") return 2;
  TORCH_CHECK_VALUE(false, op,
                    ": argument 'direction' must be unidirectional or bidirectional, "
                    "got '",
                    direction, "'");
}

// The sizes are arguments of the params ops (a bad one is a ValueError naming it) but come
// from the tensors' shapes in the forward and backprop (RuntimeError naming the tensor).
static bool skip_input_of(const char* op, c10::string_view input_mode, int64_t input_size,
                          int64_t num_units, bool from_shapes) {
  if (input_mode == "linear_input") return false;
  const bool auto_select = input_mode == "auto_select";
  TORCH_CHECK_VALUE(auto_select || input_mode == "skip_input", op,
                    ": argument 'input_mode' must be linear_input, skip_input or auto_select, "
                    "got '",
                    input_mode, "'");
  // TF's ToRNNInputMode: auto_select is skip_input exactly when the sizes allow it.
  if (auto_select) return input_size == num_units;
  if (from_shapes) {
    TORCH_CHECK(input_size == num_units, op,
                ": argument 'input': input_mode skip_input adds "
                "the input to every gate, so input_size (",
                input_size,
                ") must equal "
                "num_units (",
                num_units, ")");
  } else {
    TORCH_CHECK_VALUE(input_size == num_units, op,
                      ": argument 'input_mode': input_mode "
                      "skip_input adds the input to every gate, so input_size (",
                      input_size, ") must equal num_units (", num_units, ")");
  }
  return true;
}

bool parse_skip_input(const char* op, c10::string_view input_mode, int64_t input_size,
                      int64_t num_units) {
  return skip_input_of(op, input_mode, input_size, num_units, /*from_shapes=*/false);
}

static void check_sizes(const char* op, const Config& cfg, bool from_shapes) {
  if (from_shapes) {
    TORCH_CHECK(cfg.L >= 1, op, ": argument 'input_h': num_layers must be >= 1, got ", cfg.L);
    TORCH_CHECK(cfg.U >= 1, op, ": argument '", cfg.lstm() ? "input_c" : "input_h",
                "': num_units must be >= 1, got ", cfg.U);
    TORCH_CHECK(cfg.I >= 1, op, ": argument 'input': input_size must be >= 1, got ", cfg.I);
  } else {
    TORCH_CHECK_VALUE(cfg.L >= 1, op, ": argument 'num_layers' must be >= 1, got ", cfg.L);
    TORCH_CHECK_VALUE(cfg.U >= 1, op, ": argument 'num_units' must be >= 1, got ", cfg.U);
    TORCH_CHECK_VALUE(cfg.I >= 1, op, ": argument 'input_size' must be >= 1, got ", cfg.I);
  }
  TORCH_CHECK_VALUE(cfg.P >= 0, op, ": argument 'num_proj' must be >= 0, got ", cfg.P);
  TORCH_CHECK_VALUE(cfg.P == 0 || cfg.lstm(), op, ": argument 'num_proj' (", cfg.P,
                    ") is only supported with rnn_mode lstm");
  TORCH_CHECK_VALUE(cfg.P <= cfg.U, op, ": argument 'num_proj' (", cfg.P,
                    ") must not exceed num_units (", cfg.U, ")");
}

Config config_from_sizes(const char* op, int64_t num_layers, int64_t num_units, int64_t input_size,
                         c10::string_view rnn_mode, c10::string_view input_mode,
                         c10::string_view direction, int64_t num_proj) {
  Config cfg;
  cfg.mode = parse_mode(op, rnn_mode);
  cfg.G = gates_of(cfg.mode);
  cfg.D = parse_dirs(op, direction);
  cfg.L = num_layers;
  cfg.U = num_units;
  cfg.I = input_size;
  cfg.P = num_proj;
  check_sizes(op, cfg, /*from_shapes=*/false);
  cfg.Hh = cfg.P > 0 ? cfg.P : cfg.U;
  cfg.skip_input = skip_input_of(op, input_mode, cfg.I, cfg.U, /*from_shapes=*/false);
  return cfg;
}

int64_t params_size(const char* op, const Config& cfg) {
  // Closed form (the layers above the first all have the same widths), so that a huge
  // num_layers costs nothing before the checks that compare it with real tensors; a size
  // beyond int64 is an error, never a wrapped count.
  bool overflow = false;
  auto mul = [&](int64_t a, int64_t b) {
    int64_t r = 0;
    overflow |= __builtin_mul_overflow(a, b, &r);
    return r;
  };
  auto add = [&](int64_t a, int64_t b) {
    int64_t r = 0;
    overflow |= __builtin_add_overflow(a, b, &r);
    return r;
  };
  const int64_t GU = mul(cfg.G, cfg.U);
  auto in_w = [&](int64_t layer) {
    return cfg.has_input_weights(layer) ? mul(GU, cfg.in_width(layer)) : 0;
  };
  const int64_t per_layer = add(add(mul(GU, cfg.Hh), mul(2, GU)), mul(cfg.P, cfg.U));
  const int64_t above = cfg.L > 1 ? mul(cfg.L - 1, in_w(1)) : 0;
  const int64_t n = mul(cfg.D, add(add(in_w(0), above), mul(cfg.L, per_layer)));
  TORCH_CHECK_VALUE(!overflow, op, ": argument 'num_layers': the params of ", cfg.L, " layers of ",
                    cfg.U, " units over ", cfg.I, " inputs exceed int64 elements");
  return n;
}

int64_t canonical_weight_count(const Config& cfg) {
  const int64_t per_layer = cfg.G + (cfg.P > 0 ? 1 : 0);
  return cfg.D * (cfg.L * (per_layer + cfg.G) - (cfg.skip_input ? cfg.G : 0));
}

int64_t canonical_bias_count(const Config& cfg) { return cfg.L * cfg.D * 2 * cfg.G; }

std::vector<LayerParams> layer_params(const Config& cfg, const at::Tensor& flat) {
  std::vector<LayerParams> out;
  int64_t off = 0;
  auto take = [&](std::vector<int64_t> shape) {
    int64_t n = 1;
    for (auto s : shape) n *= s;
    at::Tensor t = flat.narrow(0, off, n).view(shape);
    off += n;
    return t;
  };
  for (int64_t layer = 0; layer < cfg.L; ++layer) {
    for (int64_t d = 0; d < cfg.D; ++d) {
      LayerParams lp;
      if (cfg.has_input_weights(layer)) lp.W = take({cfg.GU(), cfg.in_width(layer)});
      lp.R = take({cfg.GU(), cfg.Hh});
      lp.bW = take({cfg.GU()});
      lp.bR = take({cfg.GU()});
      if (cfg.P > 0) lp.Wp = take({cfg.P, cfg.U});
      out.push_back(std::move(lp));
    }
  }
  return out;
}

std::vector<std::vector<int64_t>> canonical_weight_shapes(const Config& cfg) {
  std::vector<std::vector<int64_t>> shapes;
  for (int64_t layer = 0; layer < cfg.L; ++layer) {
    for (int64_t d = 0; d < cfg.D; ++d) {
      if (cfg.has_input_weights(layer))
        for (int64_t g = 0; g < cfg.G; ++g) shapes.push_back({cfg.U, cfg.in_width(layer)});
      for (int64_t g = 0; g < cfg.G; ++g) shapes.push_back({cfg.U, cfg.Hh});
      if (cfg.P > 0) shapes.push_back({cfg.P, cfg.U});
    }
  }
  return shapes;
}

std::vector<std::vector<int64_t>> canonical_bias_shapes(const Config& cfg) {
  return std::vector<std::vector<int64_t>>(cfg.L * cfg.D * 2 * cfg.G, {cfg.U});
}

int64_t reserve_elements(const Config& cfg, bool with_dropout) {
  const int64_t TB = cfg.T * cfg.B;
  const int64_t per_pseudo = TB * (cfg.act_width() + (cfg.lstm() ? cfg.U : 0) + cfg.Hh);
  const int64_t per_layer_below_top = TB * cfg.D * cfg.Hh * (with_dropout ? 2 : 1);
  return cfg.L * cfg.D * per_pseudo + (cfg.L - 1) * per_layer_below_top;
}

static void check_float(const char* op, const at::Tensor& t, const char* name) {
  const auto st = t.scalar_type();
  TORCH_CHECK_TYPE(st == at::kFloat || st == at::kDouble || st == at::kHalf || st == at::kBFloat16,
                   op, ": argument '", name,
                   "' must be a float16, bfloat16, float32 or float64 "
                   "tensor, got ",
                   c10::toString(st));
}

static void check_like(const char* op, const at::Tensor& input, const at::Tensor& t,
                       const char* name) {
  TORCH_CHECK_TYPE(t.scalar_type() == input.scalar_type(), op, ": argument '", name,
                   "' must have the dtype of input (", c10::toString(input.scalar_type()),
                   "), got ", c10::toString(t.scalar_type()));
  check_same_device(input, t, op, "input", name);
}

// Validates sequence_lengths and returns them on the host (the only device-to-host copy).
static at::Tensor check_lengths(const char* op, const Config& cfg, const at::Tensor& lengths) {
  TORCH_CHECK_TYPE(lengths.scalar_type() == at::kInt || lengths.scalar_type() == at::kLong, op,
                   ": argument 'sequence_lengths' must be an int32 tensor, got ",
                   c10::toString(lengths.scalar_type()));
  TORCH_CHECK(lengths.dim() == 1 && lengths.size(0) == cfg.B, op,
              ": argument 'sequence_lengths' must have shape [batch_size] = [", cfg.B, "], got ",
              tf_shape(lengths.sizes()));
  const at::Tensor host = lengths.to(at::kCPU, at::kLong).contiguous();
  // cuDNN rejects lengths outside [1, max_time] (TF forwards them to cuDNN unchecked).
  const int64_t* v = host.data_ptr<int64_t>();
  for (int64_t b = 0; b < cfg.B; ++b) {
    TORCH_CHECK(v[b] >= 1 && v[b] <= cfg.T, op,
                ": argument 'sequence_lengths': "
                "sequence_lengths[",
                b, "] = ", v[b], " is not in [1, max_time] = [1, ", cfg.T, "]");
  }
  return host;
}

Config check_forward(const char* op, const at::Tensor& input, const at::Tensor& input_h,
                     const at::Tensor& input_c, const at::Tensor& params,
                     const at::Tensor& sequence_lengths, c10::string_view rnn_mode,
                     c10::string_view input_mode, c10::string_view direction, double dropout,
                     int64_t num_proj, bool time_major) {
  Config cfg;
  cfg.mode = parse_mode(op, rnn_mode);
  cfg.G = gates_of(cfg.mode);
  cfg.D = parse_dirs(op, direction);
  cfg.time_major = time_major;
  // TF's ExtractForwardInput, in its order and with its messages.
  TORCH_CHECK(input.dim() == 3, op, ": argument 'input': RNN input must be a 3-D vector.");
  TORCH_CHECK(input_h.dim() == 3, op, ": argument 'input_h': RNN input_h must be a 3-D vector.");
  cfg.T = input.size(time_major ? 0 : 1);
  cfg.B = input.size(time_major ? 1 : 0);
  cfg.I = input.size(2);
  cfg.L = input_h.size(time_major ? 0 : 1) / cfg.D;
  cfg.Hh = input_h.size(2);
  const int64_t LD = cfg.L * cfg.D;
  const std::vector<int64_t> hidden = time_major ? std::vector<int64_t>{LD, cfg.B, cfg.Hh}
                                                 : std::vector<int64_t>{cfg.B, LD, cfg.Hh};
  TORCH_CHECK(input_h.sizes() == c10::IntArrayRef(hidden), op,
              ": argument 'input_h': Invalid input_h shape: ", tf_shape(input_h.sizes()), " ",
              tf_shape(hidden));
  cfg.P = num_proj;
  cfg.U = cfg.Hh;
  if (cfg.lstm()) {
    // TF's shape function checks this rank; its eager kernel does not (it would read dim 2
    // of a lower-rank tensor).
    TORCH_CHECK(input_c.dim() == 3, op,
                ": argument 'input_c': RNN input_c must be a 3-D "
                "vector.");
    if (num_proj == 0) {
      TORCH_CHECK(input_h.sizes() == input_c.sizes(), op,
                  ": argument 'input_c': input_h and "
                  "input_c must have the same shape w/o projection: ",
                  tf_shape(input_h.sizes()), " ", tf_shape(input_c.sizes()));
    } else {
      TORCH_CHECK(input_h.size(2) <= input_c.size(2) && num_proj == input_h.size(2) &&
                      input_h.size(0) == input_c.size(0) && input_h.size(1) == input_c.size(1),
                  op, ": argument 'input_c': Invalid input_h and input_c w/ projection size: ",
                  num_proj, " ", tf_shape(input_h.sizes()), " ", tf_shape(input_c.sizes()));
    }
    cfg.U = input_c.size(2);
  }
  check_sizes(op, cfg, /*from_shapes=*/true);
  cfg.skip_input = skip_input_of(op, input_mode, cfg.I, cfg.U, /*from_shapes=*/true);
  TORCH_CHECK_VALUE(dropout >= 0.0 && dropout < 1.0, op,
                    ": argument 'dropout' must be in [0, 1), got ", dropout);

  check_float(op, input, "input");
  check_like(op, input, input_h, "input_h");
  if (cfg.lstm()) check_like(op, input, input_c, "input_c");
  check_like(op, input, params, "params");
  // TF never compares params with the configuration: a short buffer is an out-of-bounds read
  // on the GPU.
  TORCH_CHECK(params.dim() == 1, op, ": argument 'params' must be 1-D, got shape ",
              tf_shape(params.sizes()));
  const int64_t expected = params_size(op, cfg);
  TORCH_CHECK(params.numel() == expected, op, ": argument 'params' has ", params.numel(),
              " elements but cudnn_rnn_params_size of this configuration is ", expected);
  cfg.host_lengths = check_lengths(op, cfg, sequence_lengths);
  return cfg;
}

}  // namespace cudnn_rnn
}  // namespace torch_tfgrads
