// Host side of the FractionalPool family: TF's checks and messages, TF's pooling sequences
// (Philox stream, common/philox.h) and the per-axis cell plans. See fractional_pool.h.
#include "common/fractional_pool.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <mutex>
#include <sstream>
#include <string>

#include "common/checks.h"
#include "common/philox.h"

namespace torch_tfgrads {
namespace fracpool {
namespace {

// TF formats float attrs in messages with absl::StrCat, i.e. printf's "%g".
std::string format_float(float v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", static_cast<double>(v));
  return buf;
}

// TF's dtype names, as its messages print them.
const char* tf_dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "float";
    case at::kDouble: return "double";
    case at::kHalf: return "half";
    case at::kBFloat16: return "bfloat16";
    case at::kInt: return "int32";
    case at::kLong: return "int64";
    default: return c10::toString(t);
  }
}

// A short stand-in for TF's Tensor::DebugString (type and shape; TF adds a few values).
std::string debug_string(const at::Tensor& t) {
  return std::string("Tensor<type: ") + tf_dtype_name(t.scalar_type()) +
         " shape: " + tf_shape(t.sizes()) + ">";
}

// A sequence tensor's values on the host, flattened (TF flattens sequences of any rank).
std::vector<int64_t> host_values(const char* op, const char* name, const at::Tensor& seq) {
  TORCH_CHECK_TYPE(seq.scalar_type() == at::kLong, op, ": argument '", name,
                   "' must be an int64 tensor, got ", seq.scalar_type());
  const at::Tensor flat = seq.reshape({-1}).to(at::kCPU).contiguous();
  const int64_t* p = flat.data_ptr<int64_t>();
  return std::vector<int64_t>(p, p + flat.numel());
}

// Eigen's vector printing, which TF's "must not be negative, got ..." messages use: every value
// right-aligned to the widest, separated by one space.
std::string eigen_format(const std::vector<int64_t>& v) {
  size_t width = 0;
  for (int64_t x : v) width = std::max(width, std::to_string(x).size());
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) {
    std::string s = std::to_string(v[i]);
    if (i) out += ' ';
    out += std::string(width - s.size(), ' ') + s;
  }
  return out;
}

// Our own messages print at most 32 values.
std::string short_format(const std::vector<int64_t>& v, int64_t used) {
  std::ostringstream os;
  const int64_t shown = std::min<int64_t>(used, 32);
  for (int64_t i = 0; i < shown; ++i) os << (i ? " " : "") << v[i];
  if (shown < used) os << " ...";
  return os.str();
}

// TF's clamped cell end: overlapping cells include the next cell's first index.
inline int64_t cell_end(const std::vector<int64_t>& seq, int64_t i, bool overlapping,
                        int64_t size) {
  return std::min(overlapping ? seq[i + 1] : seq[i + 1] - 1, size - 1);
}

// The sequences of a gradient call must describe real cells: strictly increasing from >= 0 to
// at most the input length. (TF reads and writes out of bounds otherwise, or divides by 0.)
void check_cells(const char* op, const char* name, const std::vector<int64_t>& seq, int64_t cells,
                 int64_t size, const char* axis) {
  bool ok = seq[0] >= 0 && seq[cells] <= size;
  for (int64_t i = 0; ok && i < cells; ++i) ok = seq[i] < seq[i + 1];
  TORCH_CHECK(ok, op, ": argument '", name, "': the first ", cells + 1,
              " values must be strictly increasing, from >= 0 to at most the input's ", axis, " (",
              size, "), got ", short_format(seq, cells + 1));
}

// TF's in-loop check of FractionalAvgPoolGrad (its last check), with its loop order: row r's check,
// then every column's, then row r+1's. Only which message comes first matters.
void check_not_negative_like_tf(const char* op, const std::vector<int64_t>& rows,
                                const std::vector<int64_t>& cols, int64_t out_rows,
                                int64_t out_cols, bool overlapping, int64_t H, int64_t W) {
  auto bad = [&](const std::vector<int64_t>& seq, int64_t i, int64_t size) {
    return seq[i] < 0 || cell_end(seq, i, overlapping, size) < 0;
  };
  int64_t first_bad_row = -1;
  for (int64_t r = 0; r < out_rows && first_bad_row < 0; ++r)
    if (bad(rows, r, H)) first_bad_row = r;
  bool bad_col = false;
  for (int64_t c = 0; c < out_cols && !bad_col; ++c) bad_col = bad(cols, c, W);
  TORCH_CHECK(first_bad_row != 0, op,
              ": argument 'row_pooling_sequence': Row sequence tensor "
              "values must not be negative, got ",
              eigen_format(rows));
  TORCH_CHECK(!bad_col, op,
              ": argument 'col_pooling_sequence': Column sequence tensor values "
              "must not be negative, got ",
              eigen_format(cols));
  TORCH_CHECK(first_bad_row < 0, op,
              ": argument 'row_pooling_sequence': Row sequence tensor "
              "values must not be negative, got ",
              eigen_format(rows));
}

std::vector<int64_t> generate(int64_t n_in, int64_t n_out, philox::GuardedPhilox& gen,
                              bool pseudo_random) {
  std::vector<int64_t> diff(n_out);
  const int64_t k = n_in / n_out;
  if (pseudo_random) {
    // All in double, exactly as TF's GeneratePoolingSequence.
    const double alpha = static_cast<double>(n_in) / n_out;
    const double u_max1 = (k + 2) / alpha - 1;
    const double u_max2 = (n_in + 1 - k) / alpha - (n_out - 1);
    const double max_u = std::min(u_max1, u_max2);
    philox::SingleSample sample(gen.reserve_samples32(2));
    const double u = philox::rand_double(sample) * max_u;
    std::vector<int64_t> a(n_out + 1);
    a[0] = 1;
    a[n_out] = n_in + 1;
    for (int64_t i = 1; i < n_out; ++i)
      a[i] = static_cast<int>(std::ceil(alpha * (static_cast<double>(i) + u)));
    for (int64_t i = 0; i < n_out; ++i) diff[i] = a[i + 1] - a[i];
  } else {
    const int64_t r = n_in % n_out;
    for (int64_t i = 0; i < n_out; ++i) diff[i] = i < r ? k + 1 : k;
    philox::SingleSample sample(gen.reserve_samples32(n_out));
    for (int64_t i = 0; i + 1 < n_out; ++i) {
      // TF's biased modulo shuffle, on uint32 words.
      const int64_t j = i + static_cast<int64_t>(sample() % static_cast<uint32_t>(n_out - i));
      std::swap(diff[i], diff[j]);
    }
  }
  std::vector<int64_t> cum(n_out + 1, 0);
  for (int64_t i = 0; i < n_out; ++i) cum[i + 1] = cum[i] + diff[i];
  return cum;
}

// Seeds (0, 0) mean "random" in TF; ours come from torch's default CPU generator so that
// torch.manual_seed makes them reproducible.
void resolve_seeds(int64_t& seed, int64_t& seed2) {
  if (seed != 0 || seed2 != 0) return;
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  auto* impl = at::check_generator<at::CPUGeneratorImpl>(gen);
  seed = static_cast<int64_t>(impl->random64());
  seed2 = static_cast<int64_t>(impl->random64());
}

at::Tensor to_tensor(const std::vector<int64_t>& v) {
  at::Tensor t = at::empty({static_cast<int64_t>(v.size())}, at::TensorOptions(at::kLong));
  std::copy(v.begin(), v.end(), t.data_ptr<int64_t>());
  return t;
}

}  // namespace

AxisPlan plan_axis(const int64_t* seq, int64_t cells, bool overlapping, int64_t size) {
  AxisPlan p;
  p.size = size;
  p.cells = cells;
  p.start.resize(cells);
  p.end.resize(cells);
  p.first.assign(size, 0);
  p.last.assign(size, -1);
  for (int64_t i = 0; i < cells; ++i) {
    p.start[i] = seq[i];
    p.end[i] = std::min(overlapping ? seq[i + 1] : seq[i + 1] - 1, size - 1);
    for (int64_t h = p.start[i]; h <= p.end[i]; ++h) {
      if (p.last[h] < 0) p.first[h] = i;
      p.last[h] = i;
    }
  }
  return p;
}

at::Tensor pack_plans(const AxisPlan& rows, const AxisPlan& cols, PackedPlan* o) {
  const int64_t r = rows.cells, c = cols.cells, H = rows.size, W = cols.size;
  o->row_start = 0;
  o->row_end = r;
  o->row_first = 2 * r;
  o->row_last = 2 * r + H;
  o->col_start = 2 * r + 2 * H;
  o->col_end = o->col_start + c;
  o->col_first = o->col_start + 2 * c;
  o->col_last = o->col_first + W;
  at::Tensor packed = at::empty({o->col_last + W}, at::TensorOptions(at::kLong));
  int64_t* p = packed.data_ptr<int64_t>();
  std::copy(rows.start.begin(), rows.start.end(), p + o->row_start);
  std::copy(rows.end.begin(), rows.end.end(), p + o->row_end);
  std::copy(rows.first.begin(), rows.first.end(), p + o->row_first);
  std::copy(rows.last.begin(), rows.last.end(), p + o->row_last);
  std::copy(cols.start.begin(), cols.start.end(), p + o->col_start);
  std::copy(cols.end.begin(), cols.end.end(), p + o->col_end);
  std::copy(cols.first.begin(), cols.first.end(), p + o->col_first);
  std::copy(cols.last.begin(), cols.last.end(), p + o->col_last);
  return packed;
}

void check_value_dtype(const char* op, const char* name, const at::Tensor& t) {
  const auto s = t.scalar_type();
  TORCH_CHECK_TYPE(s == at::kFloat || s == at::kDouble || s == at::kInt || s == at::kLong ||
                       s == at::kHalf || s == at::kBFloat16,
                   op, ": argument '", name,
                   "' must be float32, float64, int32, int64, float16 "
                   "or bfloat16, got ",
                   s);
}

PoolShape check_pool(const char* op, bool is_max, const at::Tensor& value,
                     c10::ArrayRef<double> pooling_ratio, bool deterministic, int64_t seed,
                     int64_t seed2) {
  const int64_t n = static_cast<int64_t>(pooling_ratio.size());
  TORCH_CHECK_VALUE(n >= 4, op, ": argument 'pooling_ratio': Length for attr 'pooling_ratio' of ",
                    n, " must be at least minimum 4");
  TORCH_CHECK_VALUE(n == 4, op,
                    ": argument 'pooling_ratio': pooling_ratio field must specify 4 "
                    "dimensions");
  float ratio[4];  // TF stores float attrs as float32
  for (int i = 0; i < 4; ++i) {
    ratio[i] = static_cast<float>(pooling_ratio[i]);
    TORCH_CHECK_VALUE(ratio[i] >= 1.0f, op,
                      ": argument 'pooling_ratio': pooling_ratio cannot "
                      "be smaller than 1, got: ",
                      format_float(ratio[i]));
  }
  TORCH_CHECK_NOT_IMPLEMENTED(ratio[0] == 1.0f && ratio[3] == 1.0f, op,
                              ": argument 'pooling_ratio': Fractional ", is_max ? "max" : "average",
                              " pooling is not yet supported on the batch nor channel dimension.");
  TORCH_CHECK_VALUE(deterministic || (seed == 0 && seed2 == 0), op,
                    ": argument 'seed': Both "
                    "seed and seed2 should be 0 if deterministic is false.");
  TORCH_CHECK(value.dim() == 4, op, ": argument 'value': tensor_in must be 4-dimensional");
  check_value_dtype(op, "value", value);
  int64_t out[4];
  for (int i = 0; i < 4; ++i) {
    const int64_t d = value.size(i);
    TORCH_CHECK(static_cast<float>(d) >= ratio[i], op,
                ": argument 'value': Pooling ratio is "
                "higher than input dimension size for dimension ",
                i, ". Input dim size: ", d, " pooling ratio: ", format_float(ratio[i]));
    out[i] = static_cast<int64_t>(std::floor(static_cast<float>(d) / ratio[i]));
  }
  return {value.size(0), value.size(1), value.size(2), value.size(3), out[1], out[2]};
}

std::vector<int64_t> pooling_sequence(int64_t input_length, int64_t output_length,
                                      bool pseudo_random, int64_t seed, int64_t seed2) {
  TORCH_CHECK_VALUE(output_length >= 1 && output_length <= input_length,
                    "fractional_pooling_sequence: argument 'output_length' must be in [1, "
                    "input_length = ",
                    input_length, "], got ", output_length);
  resolve_seeds(seed, seed2);
  philox::GuardedPhilox gen(static_cast<uint64_t>(seed), static_cast<uint64_t>(seed2));
  return generate(input_length, output_length, gen, pseudo_random);
}

std::pair<at::Tensor, at::Tensor> pooling_sequences(const PoolShape& s, bool pseudo_random,
                                                    int64_t seed, int64_t seed2) {
  resolve_seeds(seed, seed2);
  philox::GuardedPhilox gen(static_cast<uint64_t>(seed), static_cast<uint64_t>(seed2));
  auto rows = generate(s.H, s.out_h, gen, pseudo_random);  // rows first, on the same stream
  auto cols = generate(s.W, s.out_w, gen, pseudo_random);
  return {to_tensor(rows), to_tensor(cols)};
}

GradPlan check_avg_grad(const char* op, c10::IntArrayRef orig, const at::Tensor& dy,
                        const at::Tensor& row_seq, const at::Tensor& col_seq, bool overlapping) {
  TORCH_CHECK_VALUE(orig.size() == 4, op,
                    ": argument 'orig_input_tensor_shape': original "
                    "input tensor shape must be1-dimensional and 4 elements");
  TORCH_CHECK(dy.dim() == 4, op,
              ": argument 'out_backprop': out_backprop must be "
              "4-dimensional");
  for (int i = 0; i < 4; ++i)
    TORCH_CHECK(dy.size(i) > 0, op,
                ": argument 'out_backprop': out_backprop must be positive "
                "for all dimension, got:",
                dy.size(i));
  check_value_dtype(op, "out_backprop", dy);
  const auto rows = host_values(op, "row_pooling_sequence", row_seq);
  const auto cols = host_values(op, "col_pooling_sequence", col_seq);
  const int64_t out_rows = dy.size(1), out_cols = dy.size(2);
  TORCH_CHECK(static_cast<int64_t>(rows.size()) > out_rows, op,
              ": argument "
              "'row_pooling_sequence': Given out_backprop shape ",
              tf_shape(dy.sizes()), ", row_seq_tensor must have at least ", out_rows + 1,
              " elements, but got ", rows.size());
  TORCH_CHECK(static_cast<int64_t>(cols.size()) > out_cols, op,
              ": argument "
              "'col_pooling_sequence': Given out_backprop shape ",
              tf_shape(dy.sizes()), ", col_seq_tensor must have at least ", out_cols + 1,
              " elements, but got ", cols.size());
  const char* dim_names[4] = {"Batch", "Rows", "Columns", "Depth"};
  for (int i = 0; i < 4; ++i)
    TORCH_CHECK_VALUE(orig[i] != 0, op, ": argument 'orig_input_tensor_shape': ", dim_names[i],
                      " dimension of input must not be 0");
  int64_t numel = 1;
  for (int i = 0; i < 4; ++i) {
    TORCH_CHECK_VALUE(orig[i] >= 0, op,
                      ": argument 'orig_input_tensor_shape': Expected a "
                      "non-negative size, got ",
                      orig[i]);
    int64_t product;
    const bool overflow = __builtin_mul_overflow(numel, orig[i], &product);
    TORCH_CHECK_VALUE(!overflow, op,
                      ": argument 'orig_input_tensor_shape': Encountered "
                      "overflow when multiplying ",
                      numel, " with ", orig[i], ", result: -1");
    numel = product;
  }
  // TF writes out of bounds past these (heap corruption in TF 2.21). Smaller is TF-valid: the
  // missing images/channels get zero gradient (the kernels see a zero-padded out_backprop).
  TORCH_CHECK(dy.size(0) <= orig[0] && dy.size(3) <= orig[3], op,
              ": argument 'out_backprop': "
              "out_backprop batch/depth must not exceed orig_input_tensor_shape's, got "
              "out_backprop ",
              tf_shape(dy.sizes()), " for input ", tf_shape(orig));
  check_not_negative_like_tf(op, rows, cols, out_rows, out_cols, overlapping, orig[1], orig[2]);
  check_cells(op, "row_pooling_sequence", rows, out_rows, orig[1], "rows");
  check_cells(op, "col_pooling_sequence", cols, out_cols, orig[2], "columns");
  return {orig[0],
          orig[1],
          orig[2],
          orig[3],
          plan_axis(rows.data(), out_rows, overlapping, orig[1]),
          plan_axis(cols.data(), out_cols, overlapping, orig[2])};
}

at::Tensor pad_out_backprop(const at::Tensor& dy, const GradPlan& g) {
  if (dy.size(0) == g.N && dy.size(3) == g.C) return dy;
  at::Tensor padded = at::zeros({g.N, dy.size(1), dy.size(2), g.C}, dy.options());
  padded.narrow(0, 0, dy.size(0)).narrow(3, 0, dy.size(3)).copy_(dy);
  return padded;
}

GradPlan check_max_grad(const char* op, const at::Tensor& x, const at::Tensor& y,
                        const at::Tensor& dy, const at::Tensor& row_seq, const at::Tensor& col_seq,
                        bool overlapping) {
  TORCH_CHECK(x.dim() == 4, op,
              ": argument 'orig_input': orig_input should be a tensor of "
              "rank 4, got ",
              debug_string(x));
  TORCH_CHECK(x.numel() > 0, op, ": argument 'orig_input': orig_input must not be empty, got ",
              debug_string(x));
  TORCH_CHECK(y.dim() == 4, op,
              ": argument 'orig_output': orig_output should be a tensor of "
              "rank 4, got ",
              debug_string(y));
  TORCH_CHECK(y.numel() > 0, op,
              ": argument 'orig_output': orig_output must not be empty, "
              "got ",
              debug_string(y));
  // TF's next check, "Pooling region has more elements than the input tensor" (row * col
  // sequence lengths <= input elements), is left out on purpose: it rejects valid gradients of
  // small inputs (a [1,2,2,1] input at ratio 1 has 3 * 3 boundaries for 4 elements), and the
  // exact length and value checks below are what keeps the kernel in bounds.
  TORCH_CHECK(row_seq.dim() == 1, op,
              ": argument 'row_pooling_sequence': row_pooling_sequence "
              "must be a vector, received shape ",
              tf_shape(row_seq.sizes()));
  TORCH_CHECK(col_seq.dim() == 1, op,
              ": argument 'col_pooling_sequence': col_pooling_sequence "
              "must be a vector, received shape ",
              tf_shape(col_seq.sizes()));
  check_value_dtype(op, "orig_input", x);
  TORCH_CHECK_TYPE(y.scalar_type() == x.scalar_type(), op,
                   ": argument 'orig_output' must have "
                   "the dtype of orig_input (",
                   x.scalar_type(), "), got ", y.scalar_type());
  TORCH_CHECK_TYPE(dy.scalar_type() == x.scalar_type(), op,
                   ": argument 'out_backprop' must "
                   "have the dtype of orig_input (",
                   x.scalar_type(), "), got ", dy.scalar_type());
  check_same_device(x, y, op, "orig_input", "orig_output");
  check_same_device(x, dy, op, "orig_input", "out_backprop");
  // The checks below are missing in TF 2.21, which then corrupts its heap or reads garbage.
  TORCH_CHECK(y.size(0) == x.size(0) && y.size(3) == x.size(3), op,
              ": argument 'orig_output': "
              "orig_output must have the batch and depth of orig_input, got ",
              tf_shape(y.sizes()), " for orig_input ", tf_shape(x.sizes()));
  TORCH_CHECK(dy.sizes() == y.sizes(), op,
              ": argument 'out_backprop': out_backprop must have "
              "the shape of orig_output ",
              tf_shape(y.sizes()), ", got ", tf_shape(dy.sizes()));
  const auto rows = host_values(op, "row_pooling_sequence", row_seq);
  const auto cols = host_values(op, "col_pooling_sequence", col_seq);
  TORCH_CHECK(static_cast<int64_t>(rows.size()) == y.size(1) + 1, op,
              ": argument "
              "'row_pooling_sequence' must have orig_output's rows + 1 = ",
              y.size(1) + 1, " elements, got ", rows.size());
  TORCH_CHECK(static_cast<int64_t>(cols.size()) == y.size(2) + 1, op,
              ": argument "
              "'col_pooling_sequence' must have orig_output's columns + 1 = ",
              y.size(2) + 1, " elements, got ", cols.size());
  check_cells(op, "row_pooling_sequence", rows, y.size(1), x.size(1), "rows");
  check_cells(op, "col_pooling_sequence", cols, y.size(2), x.size(2), "columns");
  return {x.size(0),
          x.size(1),
          x.size(2),
          x.size(3),
          plan_axis(rows.data(), y.size(1), overlapping, x.size(1)),
          plan_axis(cols.data(), y.size(2), overlapping, x.size(2))};
}

GradPlan check_pool_with_sequences(const char* op, const at::Tensor& value,
                                   const at::Tensor& row_seq, const at::Tensor& col_seq,
                                   bool overlapping) {
  TORCH_CHECK(value.dim() == 4, op, ": argument 'grad' must be 4-dimensional (NHWC), got ",
              tf_shape(value.sizes()));
  check_value_dtype(op, "grad", value);
  TORCH_CHECK(row_seq.dim() == 1 && row_seq.numel() >= 2, op,
              ": argument "
              "'row_pooling_sequence' must be a vector of at least 2 elements, got shape ",
              tf_shape(row_seq.sizes()));
  TORCH_CHECK(col_seq.dim() == 1 && col_seq.numel() >= 2, op,
              ": argument "
              "'col_pooling_sequence' must be a vector of at least 2 elements, got shape ",
              tf_shape(col_seq.sizes()));
  const auto rows = host_values(op, "row_pooling_sequence", row_seq);
  const auto cols = host_values(op, "col_pooling_sequence", col_seq);
  const int64_t out_rows = row_seq.numel() - 1, out_cols = col_seq.numel() - 1;
  TORCH_CHECK(value.size(1) > 0 && value.size(2) > 0, op,
              ": argument 'grad' must have rows "
              "and columns, got ",
              tf_shape(value.sizes()));
  check_cells(op, "row_pooling_sequence", rows, out_rows, value.size(1), "rows");
  check_cells(op, "col_pooling_sequence", cols, out_cols, value.size(2), "columns");
  return {value.size(0),
          value.size(1),
          value.size(2),
          value.size(3),
          plan_axis(rows.data(), out_rows, overlapping, value.size(1)),
          plan_axis(cols.data(), out_cols, overlapping, value.size(2))};
}

}  // namespace fracpool
}  // namespace torch_tfgrads

// The sequence generator alone takes no tensor: one kernel for every backend.
namespace torch_tfgrads {
namespace {
at::Tensor fractional_pooling_sequence(int64_t input_length, int64_t output_length,
                                       bool pseudo_random, int64_t seed, int64_t seed2) {
  return fracpool::to_tensor(
      fracpool::pooling_sequence(input_length, output_length, pseudo_random, seed, seed2));
}
}  // namespace

TORCH_LIBRARY_IMPL(tfgrads, CompositeExplicitAutograd, m) {
  m.impl("fractional_pooling_sequence", &fractional_pooling_sequence);
}
}  // namespace torch_tfgrads
