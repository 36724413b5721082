// A host loop around the CUDA kernels' per-element bodies (common/fractional_pool_cells.h),
// registered as tfgrads_test::fractional_pool_cells for the CPU tests only: they compare it with
// the CPU kernels bit for bit, which checks the GPU's arithmetic on a machine without a GPU.
// kind "max"/"avg": tensors = [value], rows/cols = the pooling sequences; "avg_grad": tensors =
// [out_backprop], input_shape = the input's; "max_grad": tensors = [orig_input, orig_output,
// out_backprop].
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <string>
#include <vector>

#include "common/fractional_pool.h"
#include "common/fractional_pool_cells.h"

namespace torch_tfgrads {
namespace {

using fracpool::GradPlan;
using fracpool::PlanView;

constexpr const char* kOp = "tfgrads_test::fractional_pool_cells";
constexpr int64_t kGrain = 4096;

PlanView host_plan(const GradPlan& g) {
  return {g.rows.start.data(), g.rows.end.data(), g.rows.first.data(), g.rows.last.data(),
          g.cols.start.data(), g.cols.end.data(), g.cols.first.data(), g.cols.last.data()};
}

at::Tensor pool(const at::Tensor& value, const at::Tensor& rows, const at::Tensor& cols,
                bool overlapping, bool is_max) {
  const GradPlan g = fracpool::check_pool_with_sequences(kOp, value, rows, cols, overlapping);
  const at::Tensor x = fracpool::channels_contiguous(value);
  at::Tensor out = at::empty({g.N, g.rows.cells, g.cols.cells, g.C}, value.options());
  const PlanView plan = host_plan(g);
  fracpool::dispatch_value_types(x.scalar_type(), [&](auto tag) {
    using scalar_t = decltype(tag);
    const scalar_t* p = x.const_data_ptr<scalar_t>();
    scalar_t* o = out.mutable_data_ptr<scalar_t>();
    const int64_t sN = x.stride(0), sH = x.stride(1), sW = x.stride(2);
    at::parallel_for(0, out.numel(), kGrain, [&](int64_t begin, int64_t end) {
      for (int64_t k = begin; k < end; ++k)
        o[k] = is_max ? fracpool::pool_cell<scalar_t, true>(p, sN, sH, sW, plan, g.rows.cells,
                                                            g.cols.cells, g.C, k)
                      : fracpool::pool_cell<scalar_t, false>(p, sN, sH, sW, plan, g.rows.cells,
                                                             g.cols.cells, g.C, k);
    });
  });
  return out;
}

at::Tensor avg_grad(c10::IntArrayRef input_shape, const at::Tensor& out_backprop,
                    const at::Tensor& rows, const at::Tensor& cols, bool overlapping) {
  const GradPlan g = fracpool::check_avg_grad(kOp, input_shape, out_backprop, rows, cols,
                                              overlapping);
  const at::Tensor dy = fracpool::channels_contiguous(fracpool::pad_out_backprop(out_backprop, g));
  at::Tensor dx = at::empty({g.N, g.H, g.W, g.C}, out_backprop.options());
  const PlanView plan = host_plan(g);
  fracpool::dispatch_value_types(dy.scalar_type(), [&](auto tag) {
    using scalar_t = decltype(tag);
    const scalar_t* p = dy.const_data_ptr<scalar_t>();
    scalar_t* o = dx.mutable_data_ptr<scalar_t>();
    const int64_t sN = dy.stride(0), sH = dy.stride(1), sW = dy.stride(2);
    at::parallel_for(0, dx.numel(), kGrain, [&](int64_t begin, int64_t end) {
      for (int64_t k = begin; k < end; ++k)
        o[k] = fracpool::avg_grad_element(p, sN, sH, sW, plan, g.H, g.W, g.C, k);
    });
  });
  return dx;
}

at::Tensor max_grad(const at::Tensor& orig_input, const at::Tensor& orig_output,
                    const at::Tensor& out_backprop, const at::Tensor& rows, const at::Tensor& cols,
                    bool overlapping) {
  const GradPlan g = fracpool::check_max_grad(kOp, orig_input, orig_output, out_backprop, rows,
                                              cols, overlapping);
  const at::Tensor x = fracpool::channels_contiguous(orig_input);
  const at::Tensor y = orig_output.contiguous();
  const at::Tensor dy = out_backprop.contiguous();
  at::Tensor dx = at::empty(x.sizes(), x.options());
  const PlanView plan = host_plan(g);
  const int64_t OH = g.rows.cells, OW = g.cols.cells;
  std::vector<int64_t> argmax(static_cast<size_t>(y.numel()));
  fracpool::dispatch_value_types(x.scalar_type(), [&](auto tag) {
    using scalar_t = decltype(tag);
    using A = fracpool::sum_t<scalar_t>;
    const scalar_t* px = x.const_data_ptr<scalar_t>();
    const scalar_t* py = y.const_data_ptr<scalar_t>();
    bool mismatch = false;
    for (int64_t k = 0; k < y.numel(); ++k) {
      A best;
      argmax[k] = fracpool::argmax_cell(px, x.stride(0), x.stride(1), x.stride(2), plan, g.H, g.W,
                                        OH, OW, g.C, k, &best);
      mismatch |= !(best == static_cast<A>(py[k]));
    }
    TORCH_CHECK(!mismatch, kOp, ": argument 'orig_output': ", fracpool::kOutputMismatch);
    const scalar_t* pdy = dy.const_data_ptr<scalar_t>();
    scalar_t* o = dx.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, dx.numel(), kGrain, [&](int64_t begin, int64_t end) {
      for (int64_t k = begin; k < end; ++k)
        o[k] = fracpool::max_grad_element(pdy, argmax.data(), plan, g.H, g.W, OH, OW, g.C, k);
    });
  });
  return dx;
}

at::Tensor fractional_pool_cells(c10::string_view kind, at::TensorList tensors,
                                 const at::Tensor& rows, const at::Tensor& cols,
                                 c10::IntArrayRef input_shape, bool overlapping) {
  const std::string k(kind);
  const size_t want = k == "max_grad" ? 3 : 1;
  TORCH_CHECK(tensors.size() == want, kOp, ": kind '", k, "' takes ", want, " tensors");
  if (k == "max" || k == "avg") return pool(tensors[0], rows, cols, overlapping, k == "max");
  if (k == "avg_grad") return avg_grad(input_shape, tensors[0], rows, cols, overlapping);
  TORCH_CHECK(k == "max_grad", kOp, ": kind must be max, avg, avg_grad or max_grad");
  return max_grad(tensors[0], tensors[1], tensors[2], rows, cols, overlapping);
}

}  // namespace

TORCH_LIBRARY(tfgrads_test, m) {
  m.def(
      "fractional_pool_cells(str kind, Tensor[] tensors, Tensor rows, Tensor cols, "
      "int[] input_shape, bool overlapping) -> Tensor");
}

TORCH_LIBRARY_IMPL(tfgrads_test, CPU, m) {
  m.impl("fractional_pool_cells", &fractional_pool_cells);
}

}  // namespace torch_tfgrads
