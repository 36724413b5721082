// The CudnnRNN forward and backward passes, device-independent (see cudnn_rnn.h): per layer
// and direction one GEMM projects the inputs of every step, then each step does one GEMM for
// the recurrent part and one fused cell kernel; the backward mirrors it and finishes each
// layer with batched GEMMs for the weight gradients over all steps. A device may run a
// direction's whole step loop itself (forward_direction / backward_direction, the input
// projection included) and the weight gradients as one product (weight_grads).
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <ATen/Parallel.h>
#include <ATen/TensorOperators.h>
#include <ATen/ThreadLocalState.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <c10/util/Exception.h>

#include <vector>

#include "checks.h"
#include "cudnn_rnn.h"

namespace torch_tfgrads {
namespace cudnn_rnn {
namespace {

using at::Tensor;

// Large temporaries that never leave a call (projected inputs, gate gradients). On the CPU
// they come from a small per-thread pool kept between calls, as oneDNN keeps its RNN
// scratchpad: fresh multi-megabyte buffers cost a page fault per 4 KiB on every call, which was
// a quarter of a small LSTM's time. A buffer is reused once nothing refers to its storage;
// the pool holds at most kScratchBytes per thread (larger needs are allocated as usual).
Tensor scratch_empty(c10::IntArrayRef shape, const at::TensorOptions& opts) {
  int64_t n = 1;
  for (auto v : shape) n *= v;
  if (!opts.device().is_cpu()) return at::empty(shape, opts);
  constexpr size_t kScratchBytes = size_t(256) << 20;
  thread_local std::vector<Tensor> pool;
  for (const Tensor& t : pool)
    if (t.scalar_type() == opts.dtype() && t.numel() >= n && t.storage().use_count() == 1)
      return t.narrow(0, 0, n).view(shape);
  Tensor fresh = at::empty({n}, opts);
  size_t held = 0;
  for (const Tensor& t : pool) held += t.nbytes();
  if (held + fresh.nbytes() <= kScratchBytes) pool.push_back(fresh);
  return fresh.view(shape);
}

at::ScalarType compute_dtype(at::ScalarType t) {
  return t == at::kHalf || t == at::kBFloat16 ? at::kFloat : t;
}

// Sequence bookkeeping shared by the two passes. With variable lengths, `perm` maps
// processing order to time order for the reverse direction (step s of row b is time
// len_b-1-s, steps past the length stay in place; the map is its own inverse), and
// `active`/`valid` ([T,B,1], compute dtype) mark s < len_b, which is the same predicate for
// processing and time order.
struct Steps {
  const Config& cfg;
  Tensor lens;    // [B] int32 on the device, undefined when every length is T
  Tensor perm;    // [T*B] int64
  Tensor active;  // [T,B,1] 0/1
  Tensor inactive;
  Tensor active_rows;  // the same as bool, for where()

  Steps(const Config& c, const at::TensorOptions& opts) : cfg(c) {
    if (cfg.B == 0) return;
    const Tensor& host = cfg.host_lengths;
    const int64_t* len = host.data_ptr<int64_t>();
    bool full = true;
    for (int64_t b = 0; b < cfg.B; ++b) full = full && len[b] == cfg.T;
    if (full) return;
    Tensor p = at::empty({cfg.T * cfg.B}, at::kLong);
    int64_t* pp = p.data_ptr<int64_t>();
    for (int64_t s = 0; s < cfg.T; ++s)
      for (int64_t b = 0; b < cfg.B; ++b)
        pp[s * cfg.B + b] = (s < len[b] ? len[b] - 1 - s : s) * cfg.B + b;
    perm = p.to(opts.device());
    lens = host.to(at::kInt).to(opts.device());
    active =
        at::arange(cfg.T, host.options()).view({cfg.T, 1, 1}).lt(host.view({1, cfg.B, 1})).to(opts);
    inactive = 1 - active;
    active_rows = active.to(at::kBool);
  }

  bool variable() const { return lens.defined(); }

  // [T,B,X] in processing order of direction d <-> time order (an involution).
  Tensor reorder(const Tensor& t, int64_t d) const {
    if (d == 0) return t;
    if (!perm.defined()) return t.flip(0);
    return t.reshape({cfg.T * cfg.B, -1}).index_select(0, perm).view(t.sizes());
  }

  Tensor mask_valid(const Tensor& t) const { return variable() ? t * active : t; }
};

// Carves the reserve space (or, in inference, scratch buffers) in the order of
// reserve_elements(): [pseudo-layers: acts, c, h] [layers below the top: y, dropout mask].
struct Reserve {
  const Config& cfg;
  Tensor flat;  // compute dtype, undefined in inference
  at::TensorOptions opts;
  int64_t off = 0;

  Tensor take(std::vector<int64_t> shape) {
    if (!flat.defined()) return at::empty(shape, opts);
    int64_t n = 1;
    for (auto s : shape) n *= s;
    Tensor t = flat.narrow(0, off, n).view(shape);
    off += n;
    return t;
  }
  struct Pseudo {
    Tensor acts, c, h;
  };
  Pseudo pseudo(bool keep_acts) {
    Pseudo p;
    if (keep_acts) p.acts = take({cfg.T, cfg.B, cfg.act_width()});
    if (cfg.lstm()) p.c = take({cfg.T, cfg.B, cfg.U});
    p.h = take({cfg.T, cfg.B, cfg.Hh});
    return p;
  }
};

// Dropout between layers: inverted dropout (scale 1/(1-p)) drawn on the CPU, so the mask is
// the same on every device; a nonzero (seed, seed2) fixes it, (0, 0) draws from torch's
// default generator. cuDNN's own dropout stream cannot be reproduced.
Tensor dropout_mask(const Config& cfg, double dropout, at::Generator& gen,
                    const at::TensorOptions& opts) {
  Tensor keep = at::empty({cfg.T, cfg.B, cfg.D * cfg.Hh}, at::kDouble);
  keep.bernoulli_(1.0 - dropout, gen);
  return keep.div_(1.0 - dropout).to(opts);
}

at::Generator dropout_generator(int64_t seed, int64_t seed2) {
  if (seed == 0 && seed2 == 0) return at::detail::getDefaultCPUGenerator();
  const uint64_t s = (static_cast<uint64_t>(seed) << 32) | static_cast<uint32_t>(seed2);
  return at::make_generator<at::CPUGeneratorImpl>(s);
}

// The input of every step, projected: W x + bW (skip_input: x + bW), [T, B, GU].
Tensor project_inputs(const Config& cfg, const LayerParams& lp, const Tensor& x, int64_t layer,
                      const CellKernels& cells) {
  const int64_t TB = cfg.T * cfg.B;
  if (!cfg.has_input_weights(layer))
    return (x.view({TB, 1, cfg.U}) + lp.bW.view({1, cfg.G, cfg.U})).view({cfg.T, cfg.B, cfg.GU()});
  Tensor gx = scratch_empty({TB, cfg.GU()}, x.options());
  matmul_into(cells, gx, x.view({TB, cfg.in_width(layer)}), lp.W.t(), false, lp.bW);
  return gx.view({cfg.T, cfg.B, cfg.GU()});
}

// Calls fn(d) for every direction of a layer. The two directions of a bidirectional layer are
// independent until their input gradients are summed, so on a two-thread CPU each runs whole
// on its own thread (nested ATen parallel regions run inline): no barrier between the threads
// per step, and each core keeps one direction's weights and states in its own L2. With more
// threads, or where the device's kernels ask for it (directions_in_turn), the directions run
// one after the other, each split over all threads per step.
template <typename F>
void for_each_direction(const Config& cfg, int64_t layer, const Tensor& like,
                        const CellKernels& cells, const F& fn) {
  if (cfg.D == 2 && like.is_cpu() && at::get_num_threads() == 2 && !at::in_parallel_region() &&
      !(cells.directions_in_turn && cells.directions_in_turn(cfg, layer, like))) {
    const at::ThreadLocalState tls;  // the caller's dispatch state (below autograd) and modes
    at::parallel_for(0, 2, 1, [&](int64_t d0, int64_t d1) {
      const at::ThreadLocalStateGuard guard(tls);
      for (int64_t d = d0; d < d1; ++d) fn(d);
    });
    return;
  }
  for (int64_t d = 0; d < cfg.D; ++d) fn(d);
}

Tensor state_view(const Tensor& t, int64_t LD, int64_t B, int64_t width, at::ScalarType A) {
  // TF hands the [B, L*D, H] batch-major state buffer to cuDNN as [L*D, B, H]: a reshape, not
  // a transpose (TF's batch-major quirk for L*D > 1, docs/ops/cudnn_rnn.md). For time-major
  // tensors this is the identity.
  return t.to(A).contiguous().view({LD, B, width});
}

}  // namespace

void matmul_into(const CellKernels& k, const Tensor& out, const Tensor& a, const Tensor& b,
                 bool accumulate, const Tensor& bias) {
  if (k.matmul && k.matmul(a, b, bias, out, accumulate)) return;
  Tensor o = out;
  if (accumulate) {
    if (bias.defined()) o.add_(bias);
    o.addmm_(a, b);
  } else if (bias.defined()) {
    at::addmm_out(o, bias, a, b);
  } else {
    at::mm_out(o, a, b);
  }
}

ForwardResult forward(const Tensor& input, const Tensor& input_h, const Tensor& input_c,
                      const Tensor& params, const Tensor& sequence_lengths,
                      c10::string_view rnn_mode, c10::string_view input_mode,
                      c10::string_view direction, double dropout, int64_t seed, int64_t seed2,
                      int64_t num_proj, bool is_training, bool time_major,
                      const CellKernels& cells) {
  const char* op = "cudnn_rnn_v3";
  // Our internal ATen calls (out= variants included) are not part of any autograd graph.
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  const Config cfg = check_forward(op, input, input_h, input_c, params, sequence_lengths, rnn_mode,
                                   input_mode, direction, dropout, num_proj, time_major);
  const at::ScalarType A = compute_dtype(input.scalar_type());
  const auto opts = input.options().dtype(A);
  const int64_t T = cfg.T, B = cfg.B, LD = cfg.L * cfg.D, Hh = cfg.Hh, U = cfg.U;

  Tensor x = (time_major ? input : input.transpose(0, 1)).to(A).contiguous();
  const Tensor h0 = state_view(input_h, LD, B, Hh, A);
  const Tensor c0 = cfg.lstm() ? state_view(input_c, LD, B, U, A) : Tensor();
  const Tensor w = params.to(A).contiguous();
  const auto lps = layer_params(cfg, w);
  const Steps steps(cfg, opts);
  const bool use_dropout = is_training && dropout > 0 && cfg.L > 1;
  Reserve reserve{
      cfg, is_training ? at::empty({reserve_elements(cfg, use_dropout)}, opts) : Tensor(), opts};
  at::Generator gen;
  if (use_dropout) gen = dropout_generator(seed, seed2);

  Tensor out_h = at::empty({LD, B, Hh}, opts);
  Tensor out_c = cfg.lstm() ? at::empty({LD, B, U}, opts) : Tensor();
  Tensor y;
  for (int64_t layer = 0; layer < cfg.L; ++layer) {
    std::vector<Reserve::Pseudo> saved;
    for (int64_t d = 0; d < cfg.D; ++d) saved.push_back(reserve.pseudo(is_training));
    y = layer + 1 < cfg.L ? reserve.take({T, B, cfg.D * Hh}) : at::empty({T, B, cfg.D * Hh}, opts);
    for_each_direction(cfg, layer, x, cells, [&](int64_t d) {
      const int64_t p = layer * cfg.D + d;
      const LayerParams& lp = lps[p];
      const Reserve::Pseudo& sv = saved[d];
      // Reorder the (narrower) input rather than its projection.
      const Tensor x_d = d ? steps.reorder(x, d).contiguous() : x;
      DirectionForward fused{Tensor(),   Tensor(), Tensor(), Tensor(),
                             lp.R,       lp.bR,    h0[p],    cfg.lstm() ? c0[p] : Tensor(),
                             steps.lens, sv.acts,  sv.c,     sv.h};
      if (cfg.has_input_weights(layer)) {  // a kernel may project each step's inputs itself
        fused.x = x_d;
        fused.W = lp.W;
        fused.bW = lp.bW;
      }
      bool done = cells.forward_direction && cells.forward_direction(cfg, fused);
      const Tensor gx = done ? Tensor() : project_inputs(cfg, lp, x_d, layer, cells);
      if (!done && cells.forward_direction) {
        fused.gx = gx;
        done = cells.forward_direction(cfg, fused);
      }
      Tensor gh = done ? Tensor() : at::empty({B, cfg.GU()}, opts);
      Tensor m = !done && cfg.P > 0 ? at::empty({B, U}, opts) : Tensor();
      for (int64_t s = 0; s < T && !done; ++s) {
        const Tensor h_prev = s ? sv.h[s - 1] : h0[p];
        at::addmm_out(gh, lp.bR, h_prev, lp.R.t());
        CellForward a;
        a.gx = gx[s];
        a.gh = gh;
        a.h_prev = h_prev;
        if (cfg.lstm()) {
          a.c_prev = s ? sv.c[s - 1] : c0[p];
          a.c_out = sv.c[s];
        }
        a.lens = steps.lens;
        a.step = s;
        if (sv.acts.defined()) a.acts = sv.acts[s];
        a.projected = cfg.P > 0;
        a.h_out = a.projected ? m : sv.h[s];
        cells.forward(cfg, a);
        if (a.projected) {
          Tensor h_s = sv.h[s];
          if (steps.variable())
            h_s.copy_(at::where(steps.active_rows[s], at::mm(m, lp.Wp.t()), h_prev));
          else
            at::mm_out(h_s, m, lp.Wp.t());
        }
      }
      if (T > 0) {
        y.narrow(2, d * Hh, Hh).copy_(steps.reorder(steps.mask_valid(sv.h), d));
        out_h[p].copy_(sv.h[T - 1]);
        if (cfg.lstm()) out_c[p].copy_(sv.c[T - 1]);
      } else {
        out_h[p].copy_(h0[p]);
        if (cfg.lstm()) out_c[p].copy_(c0[p]);
      }
    });
    if (layer + 1 < cfg.L) {
      x = y;
      if (use_dropout) {
        Tensor mask = reserve.take({T, B, cfg.D * Hh});
        mask.copy_(dropout_mask(cfg, dropout, gen, opts));
        x = y * mask;
      }
    }
  }

  const auto dtype = input.scalar_type();
  Tensor output = (time_major ? y : y.transpose(0, 1)).to(dtype).contiguous();
  Tensor output_h = out_h.to(dtype).view(input_h.sizes());
  Tensor output_c = cfg.lstm() ? out_c.to(dtype).view(input_c.sizes())
                               : at::zeros({}, input.options());
  Tensor reserve_space = is_training ? (A == dtype ? reserve.flat : reserve.flat.view(dtype))
                                     : at::zeros({}, input.options());
  Tensor host_reserved = at::zeros({}, input.options().dtype(at::kChar));
  return {output, output_h, output_c, reserve_space, host_reserved};
}

namespace {

void check_shape(const char* op, const char* name, const Tensor& t, c10::IntArrayRef expected,
                 const Tensor& input) {
  TORCH_CHECK(t.sizes() == expected, op, ": argument '", name, "': Invalid ", name,
              " shape: ", tf_shape(t.sizes()), " ", tf_shape(expected));
  TORCH_CHECK_TYPE(t.scalar_type() == input.scalar_type(), op, ": argument '", name,
                   "' must have the dtype of input (", c10::toString(input.scalar_type()),
                   "), got ", c10::toString(t.scalar_type()));
  check_same_device(input, t, op, "input", name);
}

}  // namespace

BackwardResult backward(const Tensor& input, const Tensor& input_h, const Tensor& input_c,
                        const Tensor& params, const Tensor& sequence_lengths, const Tensor& output,
                        const Tensor& output_h, const Tensor& output_c,
                        const Tensor& output_backprop, const Tensor& output_h_backprop,
                        const Tensor& output_c_backprop, const Tensor& reserve_space,
                        const Tensor& host_reserved, c10::string_view rnn_mode,
                        c10::string_view input_mode, c10::string_view direction, double dropout,
                        int64_t seed, int64_t seed2, int64_t num_proj, bool time_major,
                        const CellKernels& cells) {
  (void)host_reserved;  // TF's BackpropV3 ignores it too.
  (void)seed;
  (void)seed2;  // the dropout mask is read back from reserve_space
  const char* op = "cudnn_rnn_backprop_v3";
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  const Config cfg = check_forward(op, input, input_h, input_c, params, sequence_lengths, rnn_mode,
                                   input_mode, direction, dropout, num_proj, time_major);
  const int64_t T = cfg.T, B = cfg.B, LD = cfg.L * cfg.D, Hh = cfg.Hh, U = cfg.U;
  // TF's backprop checks (CudnnRNNBackprop's), in its order.
  const std::vector<int64_t> out_shape = time_major ? std::vector<int64_t>{T, B, cfg.D * Hh}
                                                    : std::vector<int64_t>{B, T, cfg.D * Hh};
  check_shape(op, "output", output, out_shape, input);
  check_shape(op, "output_h", output_h, input_h.sizes(), input);
  if (cfg.lstm()) check_shape(op, "output_c", output_c, input_c.sizes(), input);
  check_shape(op, "output_backprop", output_backprop, out_shape, input);
  check_shape(op, "output_h_backprop", output_h_backprop, input_h.sizes(), input);
  if (cfg.lstm()) check_shape(op, "output_c_backprop", output_c_backprop, input_c.sizes(), input);

  const at::ScalarType dtype = input.scalar_type();
  const at::ScalarType A = compute_dtype(dtype);
  const auto opts = input.options().dtype(A);
  const bool use_dropout = dropout > 0 && cfg.L > 1;
  const int64_t reserve_numel = reserve_elements(cfg, use_dropout) *
                                static_cast<int64_t>(c10::elementSize(A) / c10::elementSize(dtype));
  TORCH_CHECK(reserve_space.dim() == 1 && reserve_space.numel() == reserve_numel, op,
              ": argument 'reserve_space' must be the reserve_space of a training-mode "
              "cudnn_rnn_v3 call with the same arguments (",
              reserve_numel, " elements), got shape ", tf_shape(reserve_space.sizes()),
              "; to use cudnn_rnn_v3 in gradients, is_training must be set to True");
  check_same_device(input, reserve_space, op, "input", "reserve_space");
  TORCH_CHECK_TYPE(reserve_space.scalar_type() == dtype, op,
                   ": argument 'reserve_space' must "
                   "have the dtype of input (",
                   c10::toString(dtype), "), got ", c10::toString(reserve_space.scalar_type()));

  const Tensor x = (time_major ? input : input.transpose(0, 1)).to(A).contiguous();
  const Tensor h0 = state_view(input_h, LD, B, Hh, A);
  const Tensor c0 = cfg.lstm() ? state_view(input_c, LD, B, U, A) : Tensor();
  const Tensor w = params.to(A).contiguous();
  const auto lps = layer_params(cfg, w);
  // Every region of the gradient is written once below when there are steps; zeros otherwise.
  Tensor dw = T > 0 && B > 0 ? at::empty_like(w) : at::zeros_like(w);
  const auto dlps = layer_params(cfg, dw);
  const Steps steps(cfg, opts);
  const Tensor flat = reserve_space.contiguous();
  Reserve reserve{cfg, A == dtype ? flat : flat.view(A), opts};

  // Carve the reserve space exactly as the forward did.
  std::vector<Reserve::Pseudo> saved;
  std::vector<Tensor> layer_out, layer_mask;
  for (int64_t layer = 0; layer < cfg.L; ++layer) {
    for (int64_t d = 0; d < cfg.D; ++d) saved.push_back(reserve.pseudo(true));
    if (layer + 1 < cfg.L) {
      layer_out.push_back(reserve.take({T, B, cfg.D * Hh}));
      if (use_dropout) layer_mask.push_back(reserve.take({T, B, cfg.D * Hh}));
    }
  }

  Tensor d_out = (time_major ? output_backprop : output_backprop.transpose(0, 1)).to(A);
  const Tensor dh_n = state_view(output_h_backprop, LD, B, Hh, A);
  const Tensor dc_n = cfg.lstm() ? state_view(output_c_backprop, LD, B, U, A) : Tensor();
  Tensor dh0 = at::empty({LD, B, Hh}, opts);
  Tensor dc0 = cfg.lstm() ? at::empty({LD, B, U}, opts) : Tensor();
  Tensor dx;
  for (int64_t layer = cfg.L - 1; layer >= 0; --layer) {
    const int64_t in_w = cfg.in_width(layer);
    Tensor x_l = layer == 0 ? x
                            : (use_dropout ? layer_out[layer - 1] * layer_mask[layer - 1]
                                           : layer_out[layer - 1]);
    // The first direction writes d_in, the second adds to it (skip_input adds from zero).
    const bool skip = !cfg.has_input_weights(layer);
    Tensor d_in = skip ? at::zeros({T, B, in_w}, opts) : at::empty({T, B, in_w}, opts);
    d_out = steps.mask_valid(d_out);  // output_backprop past each length is ignored
    // What a direction adds to d_in, in time order, when it cannot write d_in itself; added
    // once both directions are done, as they may run concurrently.
    Tensor d_in_part[2];
    for_each_direction(cfg, layer, x, cells, [&](int64_t d) {
      const int64_t p = layer * cfg.D + d;
      const LayerParams& lp = lps[p];
      const LayerParams& g = dlps[p];
      const Reserve::Pseudo& sv = saved[p];
      const Tensor dy = steps.reorder(d_out.narrow(2, d * Hh, Hh), d).contiguous();
      Tensor dgx = scratch_empty({T, B, cfg.GU()}, opts);
      Tensor dgh = cfg.mode == Mode::kGru ? scratch_empty({T, B, cfg.GU()}, opts) : dgx;
      Tensor dhp = cfg.P > 0 ? at::empty({T, B, Hh}, opts) : Tensor();
      DirectionBackward fused{sv.acts,
                              sv.c,
                              sv.h,
                              h0[p],
                              cfg.lstm() ? c0[p] : Tensor(),
                              lp.R,
                              steps.lens,
                              dy,
                              dh_n[p],
                              cfg.lstm() ? dc_n[p] : Tensor(),
                              dgx,
                              dgh,
                              dh0[p],
                              cfg.lstm() ? dc0[p] : Tensor()};
      // The layer input's gradient, in processing order: d_in itself for the forward direction.
      const Tensor d_in_p = !cfg.has_input_weights(layer) ? Tensor()
                            : d == 0                      ? d_in
                                                          : scratch_empty({T, B, in_w}, opts);
      bool d_in_done = false;
      if (d_in_p.defined()) {
        fused.W = lp.W;
        fused.dx = d_in_p;
        fused.dx_done = &d_in_done;
      }
      const bool done = cells.backward_direction && cells.backward_direction(cfg, fused);
      // The step loop of the unfused path (other devices and dtypes, projection).
      Tensor dh, dh_total, carry, dc, dc_prev, dm;
      if (!done) {
        dh = dh_n[p].clone();
        dh_total = at::empty({B, Hh}, opts);
        carry = at::empty({B, Hh}, opts);
        dc = cfg.lstm() ? dc_n[p].clone() : Tensor();
        dc_prev = cfg.lstm() ? at::empty({B, U}, opts) : Tensor();
        dm = cfg.P > 0 ? at::empty({B, U}, opts) : Tensor();
      }
      for (int64_t s = T - 1; s >= 0 && !done; --s) {
        at::add_out(dh_total, dh, dy[s]);
        CellBackward b;
        b.acts = sv.acts[s];
        b.h_prev = s ? sv.h[s - 1] : h0[p];
        if (cfg.lstm()) {
          b.c_cur = sv.c[s];
          b.c_prev = s ? sv.c[s - 1] : c0[p];
          b.dc = dc;
          b.dc_prev = dc_prev;
        }
        b.lens = steps.lens;
        b.step = s;
        b.dgx = dgx[s];
        b.dgh = dgh[s];
        if (cfg.P > 0) {
          // Only active rows went through the projection; the others carried h unchanged.
          Tensor dhp_s = dhp[s];
          if (steps.variable()) {
            at::mul_out(dhp_s, dh_total, steps.active[s]);
            at::mul_out(carry, dh_total, steps.inactive[s]);
          } else {
            dhp_s.copy_(dh_total);
          }
          at::mm_out(dm, dhp_s, lp.Wp);
          b.dh = dm;
        } else {
          b.dh = dh_total;
          b.dh_carry = carry;
        }
        cells.backward(cfg, b);
        if (cfg.P > 0 && !steps.variable())
          at::mm_out(dh, dgh[s], lp.R);
        else
          at::addmm_out(dh, carry, dgh[s], lp.R);
        if (cfg.lstm()) std::swap(dc, dc_prev);
      }
      if (!done) {
        dh0[p].copy_(dh);
        if (cfg.lstm()) dc0[p].copy_(dc);
      }
      if (T == 0 || B == 0) return;
      // Weight gradients over all steps at once.
      const int64_t TB = T * B;
      // In processing order: the reverse direction reorders the (narrower) layer input and
      // its gradient, not dG.
      const Tensor dgx_p = dgx.view({TB, cfg.GU()});
      const Tensor x_p = !cfg.has_input_weights(layer) ? Tensor()
                         : d                           ? steps.reorder(x_l, d).contiguous()
                                                       : x_l;
      // Both weights see the same gate gradients (all but GRU): a kernel may do the weight and
      // bias gradients in one.
      const bool weights_done = x_p.defined() && dgh.is_same(dgx) && cells.weight_grads &&
                                cells.weight_grads(x_p, h0[p], sv.h, dgx, g.W, g.R, g.bW);
      if (x_p.defined()) {
        if (!weights_done) matmul_into(cells, g.W, dgx_p.t(), x_p.reshape({TB, in_w}), false);
        if (!d_in_done) matmul_into(cells, d_in_p.view({TB, in_w}), dgx_p, lp.W, false);
        if (d != 0) d_in_part[d] = steps.reorder(d_in_p, d);
      } else {
        d_in_part[d] = steps.reorder(dgx.view({T, B, cfg.G, U}).sum(2), d);
      }
      if (!weights_done) {
        g.bW.copy_(dgx.view({TB, cfg.GU()}).sum(0));
        // dR = sum_s dgh_s^T h_{s-1}: the hidden states shifted by one step, h0 first.
        const Tensor h_prev_all = T > 1 ? at::cat({h0[p].unsqueeze(0), sv.h.narrow(0, 0, T - 1)})
                                        : h0[p].unsqueeze(0);
        matmul_into(cells, g.R, dgh.reshape({TB, cfg.GU()}).t(), h_prev_all.reshape({TB, Hh}),
                    false);
      }
      if (dgh.is_same(dgx))  // LSTM: both biases feed the same gate pre-activations
        g.bR.copy_(g.bW);
      else
        g.bR.copy_(dgh.view({TB, cfg.GU()}).sum(0));
      if (cfg.P > 0) {
        const Tensor m_all = sv.acts.narrow(2, 3 * U, U) * sv.c.tanh();
        matmul_into(cells, g.Wp, dhp.view({TB, Hh}).t(), m_all.reshape({TB, U}), false);
      }
    });
    for (const Tensor& part : d_in_part)
      if (part.defined()) d_in.add_(part);
    if (layer > 0)
      d_out = use_dropout ? d_in * layer_mask[layer - 1] : d_in;
    else
      dx = d_in;
  }

  Tensor input_backprop = (time_major ? dx : dx.transpose(0, 1)).to(dtype).contiguous();
  Tensor input_h_backprop = dh0.to(dtype).view(input_h.sizes());
  Tensor input_c_backprop = cfg.lstm() ? dc0.to(dtype).view(input_c.sizes())
                                       : at::zeros({}, input.options());
  return {input_backprop, input_h_backprop, input_c_backprop, dw.to(dtype)};
}

}  // namespace cudnn_rnn
}  // namespace torch_tfgrads
