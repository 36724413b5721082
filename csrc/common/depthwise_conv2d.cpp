// Host side of the DepthwiseConv2dNative family: TF's checks and messages, output sizes and
// paddings, and the per-axis tap lists the CPU kernels index with. See depthwise_conv2d.h.
#include "common/depthwise_conv2d.h"

#include <c10/util/Exception.h>

#include <limits>
#include <string>

#include "common/checks.h"

namespace torch_tfgrads {
namespace depthwise {
namespace {

enum class Padding { kSame, kValid, kExplicit };

// The attrs, validated, in spatial terms.
struct Attrs {
  int64_t sH, sW, dH, dW;
  Padding padding;
  int64_t pt = 0, pb = 0, pl = 0, pr = 0;  // EXPLICIT only
  bool nchw;
};

// TF's attr checks (kernel construction: they come first), then ours for dilations, which TF's
// Eigen kernels reject wholesale and we support.
Attrs check_attrs(const char* op, c10::IntArrayRef strides, c10::string_view padding,
                  c10::IntArrayRef explicit_paddings, c10::string_view data_format,
                  c10::IntArrayRef dilations) {
  Attrs a{};
  TORCH_CHECK_VALUE(data_format == "NHWC" || data_format == "NCHW", op,
                    ": argument 'data_format': Value for attr 'data_format' of \"",
                    std::string(data_format),
                    "\" is not in the list of allowed values: \"NHWC\", "
                    "\"NCHW\"");
  a.nchw = data_format == "NCHW";
  if (padding == "SAME") {
    a.padding = Padding::kSame;
  } else if (padding == "VALID") {
    a.padding = Padding::kValid;
  } else {
    TORCH_CHECK_VALUE(padding == "EXPLICIT", op,
                      ": argument 'padding': Value for attr "
                      "'padding' of \"",
                      std::string(padding),
                      "\" is not in the list of allowed "
                      "values: \"SAME\", \"VALID\", \"EXPLICIT\"");
    a.padding = Padding::kExplicit;
  }
  const int n = 0, c = a.nchw ? 1 : 3, h = a.nchw ? 2 : 1, w = a.nchw ? 3 : 2;
  TORCH_CHECK_VALUE(strides.size() == 4, op,
                    ": argument 'strides': Sliding window strides "
                    "field must specify 4 dimensions");
  TORCH_CHECK_VALUE(strides[n] == 1 && strides[c] == 1, op,
                    ": argument 'strides': Current "
                    "implementation does not yet support strides in the batch and depth "
                    "dimensions.");
  // TF's CheckValidPadding.
  if (a.padding == Padding::kExplicit) {
    TORCH_CHECK_VALUE(explicit_paddings.size() == 8, op,
                      ": argument 'explicit_paddings': "
                      "explicit_paddings attribute must contain 8 values, but got: ",
                      explicit_paddings.size());
    for (int64_t v : explicit_paddings)
      TORCH_CHECK_VALUE(v >= 0, op,
                        ": argument 'explicit_paddings': All elements of "
                        "explicit_paddings must be nonnegative");
    TORCH_CHECK_VALUE(explicit_paddings[2 * n] == 0 && explicit_paddings[2 * n + 1] == 0 &&
                          explicit_paddings[2 * c] == 0 && explicit_paddings[2 * c + 1] == 0,
                      op,
                      ": argument 'explicit_paddings': Nonzero explicit padding in the batch "
                      "or depth dimensions is not supported");
    a.pt = explicit_paddings[2 * h];
    a.pb = explicit_paddings[2 * h + 1];
    a.pl = explicit_paddings[2 * w];
    a.pr = explicit_paddings[2 * w + 1];
  } else {
    TORCH_CHECK_VALUE(explicit_paddings.empty(), op,
                      ": argument 'explicit_paddings': "
                      "explicit_paddings attribute must be empty if the padding attribute is not "
                      "EXPLICIT");
  }
  // TF's shape-function messages for dilations (its Eigen kernels refuse any dilation).
  TORCH_CHECK_VALUE(dilations.size() == 4, op,
                    ": argument 'dilations': DepthwiseConv2D "
                    "requires the dilations attribute to contain 4 values, but got: ",
                    dilations.size());
  TORCH_CHECK_VALUE(dilations[n] == 1 && dilations[c] == 1, op,
                    ": argument 'dilations': "
                    "Current implementation does not yet support dilations in the batch and "
                    "depth dimensions.");
  for (int64_t d : {dilations[h], dilations[w]})
    TORCH_CHECK_VALUE(d >= 1, op, ": argument 'dilations': Dilation rate must be >= 1, but got ",
                      d);
  for (int64_t s : {strides[h], strides[w]})
    TORCH_CHECK_VALUE(s > 0, op, ": argument 'strides': Stride must be > 0, but got ", s);
  a.sH = strides[h];
  a.sW = strides[w];
  a.dH = dilations[h];
  a.dW = dilations[w];
  return a;
}

// TF's kernel rule (GetWindowedOutputSizeVerbose with dilation): C++ truncating division,
// so an input a little smaller than the window gives an empty output, not an error. 128-bit
// arithmetic (here and in the tap lists): attrs and sizes are user data.
int64_t window(const char* op, const char* arg, int64_t in, int64_t k, int64_t s, int64_t d,
               const Attrs& a, int64_t pad_before, int64_t pad_after, int64_t* pad) {
  const __int128 K = static_cast<__int128>(k - 1) * d + 1;
  __int128 out = 0;
  *pad = 0;
  switch (a.padding) {
    case Padding::kValid: out = (in - K + s) / s; break;
    case Padding::kSame: {
      out = (static_cast<__int128>(in) + s - 1) / s;
      __int128 total = (out - 1) * s + K - in;
      if (total < 0) total = 0;
      TORCH_CHECK(total / 2 <= std::numeric_limits<int64_t>::max(), op, ": argument '", arg,
                  "': padding too large");
      *pad = static_cast<int64_t>(total / 2);
      break;
    }
    case Padding::kExplicit:
      out = (static_cast<__int128>(in) + pad_before + pad_after - K + s) / s;
      *pad = pad_before;
      break;
  }
  TORCH_CHECK(out >= 0, op, ": argument '", arg,
              "': Computed output size would be negative: ", static_cast<int64_t>(out),
              " [input_size: ", in, ", effective_filter_size: ", static_cast<int64_t>(K),
              ", stride: ", s, "]");
  TORCH_CHECK(out <= std::numeric_limits<int32_t>::max(), op, ": argument '", arg,
              "': Computed output size too large: ", static_cast<int64_t>(out));
  return static_cast<int64_t>(out);
}

void set_window(const char* op, const char* arg, const Attrs& a, Geometry* g) {
  int64_t pt = 0, pl = 0;
  g->Ho = window(op, arg, g->H, g->fh, a.sH, a.dH, a, a.pt, a.pb, &pt);
  g->Wo = window(op, arg, g->W, g->fw, a.sW, a.dW, a, a.pl, a.pr, &pl);
  g->pt = pt;
  g->pl = pl;
  g->sH = a.sH;
  g->sW = a.sW;
  g->dH = a.dH;
  g->dW = a.dW;
  g->nchw = a.nchw;
}

// TF's MultiplyWithoutOverflow: negative means overflow (-1 when the uint64 product wrapped).
int64_t multiply_without_overflow(int64_t x, int64_t y) {
  const uint64_t ux = static_cast<uint64_t>(x), uy = static_cast<uint64_t>(y);
  const uint64_t uxy = ux * uy;
  if ((ux | uy) >> 32 != 0 && ux != 0 && uxy / ux != uy) return -1;
  return static_cast<int64_t>(uxy);
}

// TensorShapeUtils::MakeShape on a sizes vector, with TF's messages.
void check_sizes(const char* op, const char* name, c10::IntArrayRef sizes) {
  int64_t elems = 1;
  for (size_t i = 0; i < sizes.size(); ++i) {
    TORCH_CHECK_VALUE(sizes[i] >= 0, op, ": argument '", name, "': Dimension ", i, " of ", name,
                      " must be >= 0");
    const int64_t next = multiply_without_overflow(elems, sizes[i]);
    TORCH_CHECK_VALUE(next >= 0, op, ": argument '", name,
                      "': Encountered overflow when "
                      "multiplying ",
                      elems, " with ", sizes[i], ", result: ", next);
    elems = next;
  }
}

void check_float(const char* op, const char* name, const at::Tensor& t) {
  const auto st = t.scalar_type();
  TORCH_CHECK_TYPE(st == at::kFloat || st == at::kDouble || st == at::kHalf || st == at::kBFloat16,
                   op, ": argument '", name,
                   "' must be a float16, bfloat16, float32 or float64 "
                   "tensor, got ",
                   st);
}

void check_same_dtype(const char* op, const at::Tensor& ref, const char* ref_name,
                      const at::Tensor& t, const char* name) {
  TORCH_CHECK_TYPE(t.scalar_type() == ref.scalar_type(), op, ": argument '", name,
                   "' must have the dtype of ", ref_name, " (", ref.scalar_type(), "), got ",
                   t.scalar_type());
}

// Logical (data_format) sizes as (N, H, W, C).
void nhwc_of(c10::IntArrayRef s, bool nchw, int64_t* N, int64_t* H, int64_t* W, int64_t* C) {
  *N = s[0];
  *H = s[nchw ? 2 : 1];
  *W = s[nchw ? 3 : 2];
  *C = s[nchw ? 1 : 3];
}

// The checks both backprop ops share once the "real" input and filter shapes are known
// (TF's EXTRACT_AND_VERIFY_DIMENSIONS, in its order).
Geometry check_backprop(const char* op, const char* label, const char* input_arg,
                        const char* filter_arg, c10::IntArrayRef input_shape,
                        c10::IntArrayRef filter_shape, const at::Tensor& out_backprop,
                        const Attrs& a) {
  // One of input/filter is a sizes list, whose wrong length is a bad value (ValueError); the
  // other a tensor, whose wrong rank is a shape that does not fit (RuntimeError).
  const bool input_is_sizes = c10::string_view(input_arg) == "input_sizes";
  const bool filter_is_sizes = !input_is_sizes;
  if (input_is_sizes) {
    TORCH_CHECK_VALUE(input_shape.size() == 4, op, ": argument '", input_arg, "': ", label,
                      ": input must be 4-dimensional");
  } else {
    TORCH_CHECK(input_shape.size() == 4, op, ": argument '", input_arg, "': ", label,
                ": input must be 4-dimensional");
  }
  if (filter_is_sizes) {
    TORCH_CHECK_VALUE(filter_shape.size() == 4, op, ": argument '", filter_arg, "': ", label,
                      ": filter must be 4-dimensional");
  } else {
    TORCH_CHECK(filter_shape.size() == 4, op, ": argument '", filter_arg, "': ", label,
                ": filter must be 4-dimensional");
  }
  TORCH_CHECK(out_backprop.dim() == 4, op, ": argument 'out_backprop': ", label,
              ": out_backprop must be 4-dimensional");
  Geometry g;
  nhwc_of(input_shape, a.nchw, &g.N, &g.H, &g.W, &g.C);
  TORCH_CHECK(g.N == out_backprop.size(0), op, ": argument 'out_backprop': ", label,
              ": input and out_backprop must have the same batch size");
  TORCH_CHECK(g.C == filter_shape[2], op, ": argument '", filter_arg, "': ", label,
              ": input and filter must have the same in_depth");
  g.fh = filter_shape[0];
  g.fw = filter_shape[1];
  g.M = filter_shape[3];
  int64_t dyN, dyH, dyW, dyC;
  nhwc_of(out_backprop.sizes(), a.nchw, &dyN, &dyH, &dyW, &dyC);
  TORCH_CHECK(g.M * g.C == dyC, op, ": argument 'out_backprop': ", label,
              ": depth_multiplier * in_depth not equal to out_depth");
  set_window(op, input_arg, a, &g);
  TORCH_CHECK(g.Ho == dyH, op, ": argument 'out_backprop': ", label,
              ": Number of rows of "
              "out_backprop doesn't match computed: actual = ",
              dyH, ", computed = ", g.Ho);
  TORCH_CHECK(g.Wo == dyW, op, ": argument 'out_backprop': ", label,
              ": Number of cols of "
              "out_backprop doesn't match computed: actual = ",
              dyW, ", computed = ", g.Wo);
  return g;
}

}  // namespace

std::vector<int64_t> Geometry::input_shape() const {
  return nchw ? std::vector<int64_t>{N, C, H, W} : std::vector<int64_t>{N, H, W, C};
}

std::vector<int64_t> Geometry::output_shape() const {
  return nchw ? std::vector<int64_t>{N, C * M, Ho, Wo} : std::vector<int64_t>{N, Ho, Wo, C * M};
}

Geometry check_forward(const char* op, const at::Tensor& input, const at::Tensor& filter,
                       c10::IntArrayRef strides, c10::string_view padding,
                       c10::IntArrayRef explicit_paddings, c10::string_view data_format,
                       c10::IntArrayRef dilations) {
  const Attrs a = check_attrs(op, strides, padding, explicit_paddings, data_format, dilations);
  TORCH_CHECK(input.dim() == 4, op, ": argument 'input': input must be 4-dimensional",
              tf_shape(input.sizes()));
  TORCH_CHECK(filter.dim() == 4, op,
              ": argument 'filter': filter must be 4-dimensional: ", tf_shape(filter.sizes()));
  Geometry g;
  nhwc_of(input.sizes(), a.nchw, &g.N, &g.H, &g.W, &g.C);
  TORCH_CHECK(g.C == filter.size(2), op,
              ": argument 'filter': input and filter must have the "
              "same depth: ",
              g.C, " vs ", filter.size(2));
  check_float(op, "input", input);
  check_same_dtype(op, input, "input", filter, "filter");
  check_same_device(input, filter, op, "input", "filter");
  g.fh = filter.size(0);
  g.fw = filter.size(1);
  g.M = filter.size(3);
  set_window(op, "input", a, &g);
  return g;
}

Geometry check_backprop_input(const char* op, c10::IntArrayRef input_sizes,
                              const at::Tensor& filter, const at::Tensor& out_backprop,
                              c10::IntArrayRef strides, c10::string_view padding,
                              c10::IntArrayRef explicit_paddings, c10::string_view data_format,
                              c10::IntArrayRef dilations) {
  const Attrs a = check_attrs(op, strides, padding, explicit_paddings, data_format, dilations);
  check_sizes(op, "input_sizes", input_sizes);
  Geometry g = check_backprop(op, "DepthwiseConv2DBackpropInput", "input_sizes", "filter",
                              input_sizes, filter.sizes(), out_backprop, a);
  check_float(op, "filter", filter);
  check_same_dtype(op, filter, "filter", out_backprop, "out_backprop");
  check_same_device(filter, out_backprop, op, "filter", "out_backprop");
  return g;
}

Geometry check_backprop_filter(const char* op, const at::Tensor& input,
                               c10::IntArrayRef filter_sizes, const at::Tensor& out_backprop,
                               c10::IntArrayRef strides, c10::string_view padding,
                               c10::IntArrayRef explicit_paddings, c10::string_view data_format,
                               c10::IntArrayRef dilations) {
  const Attrs a = check_attrs(op, strides, padding, explicit_paddings, data_format, dilations);
  check_sizes(op, "filter_sizes", filter_sizes);
  Geometry g = check_backprop(op, "DepthwiseConv2DBackpropFilter", "input", "filter_sizes",
                              input.sizes(), filter_sizes, out_backprop, a);
  check_float(op, "input", input);
  check_same_dtype(op, input, "input", out_backprop, "out_backprop");
  check_same_device(input, out_backprop, op, "input", "out_backprop");
  return g;
}

namespace {
// A source index kept: in bounds, or (unclipped taps) near enough to stay far from overflow.
bool keep_source(__int128 src, int64_t in, bool in_bounds) {
  constexpr __int128 kFar = __int128{1} << 40;
  return in_bounds ? src >= 0 && src < in : src > -kFar && src < in + kFar;
}
}  // namespace

AxisTaps forward_taps(int64_t out, int64_t in, int64_t k, int64_t s, int64_t d, int64_t p,
                      bool in_bounds) {
  AxisTaps t;
  t.offset.reserve(out + 1);
  t.offset.push_back(0);
  for (int64_t o = 0; o < out; ++o) {
    for (int64_t kk = 0; kk < k; ++kk) {
      const __int128 src = static_cast<__int128>(o) * s + static_cast<__int128>(kk) * d - p;
      if (keep_source(src, in, in_bounds)) {
        t.k.push_back(kk);
        t.src.push_back(static_cast<int64_t>(src));
      }
    }
    t.offset.push_back(static_cast<int64_t>(t.k.size()));
  }
  return t;
}

AxisTaps backward_taps(int64_t in, int64_t out, int64_t k, int64_t s, int64_t d, int64_t p,
                       bool in_bounds) {
  AxisTaps t;
  t.offset.reserve(in + 1);
  t.offset.push_back(0);
  for (int64_t x = 0; x < in; ++x) {
    for (int64_t kk = 0; kk < k; ++kk) {
      const __int128 num = static_cast<__int128>(x) + p - static_cast<__int128>(kk) * d;
      if (num % s == 0 && keep_source(num / s, out, in_bounds)) {
        t.k.push_back(kk);
        t.src.push_back(static_cast<int64_t>(num / s));
      }
    }
    t.offset.push_back(static_cast<int64_t>(t.k.size()));
  }
  return t;
}

}  // namespace depthwise
}  // namespace torch_tfgrads
