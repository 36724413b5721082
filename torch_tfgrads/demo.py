"""`python -m torch_tfgrads demo` (what `make demo` runs): the ops, a training step and
torch.compile on this machine, then the TF parity table when TensorFlow is installed.

Needs only torch and this package; TensorFlow adds the parity table.
"""

import sys
import time

import torch

import torch_tfgrads as T


def _say(out, msg=""):
    print(msg, file=out, flush=True)


def _ops(out):
    _say(out, "1. A functional call: FusedBatchNormV3 in training (NHWC)")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 5, 5, 3, generator=g, dtype=torch.float64, requires_grad=True)
    scale = torch.rand(3, generator=g, dtype=torch.float64) + 0.5
    offset = torch.randn(3, generator=g, dtype=torch.float64)
    y, batch_mean, batch_var, rs1, rs2, rs3 = T.fused_batch_norm_v3(x, scale, offset, epsilon=1e-3)
    _say(out, f"   y {tuple(y.shape)}, batch_mean {batch_mean.tolist()}")
    _say(out, "   batch_variance is Bessel-corrected, reserve_space_2 is the biased variance:")
    _say(out, f"   {batch_var[0].item():.6f} vs {rs2[0].item():.6f} (ratio n/(n-1) = 200/199)")

    _say(out, "2. The gradient op against autograd")
    dy = torch.randn(y.shape, generator=g, dtype=torch.float64)
    (dx_autograd,) = torch.autograd.grad(y, x, dy)
    dx, dscale, doffset, _, _ = T.fused_batch_norm_grad_v3(
        dy, x.detach(), scale, rs1, rs2, rs3, epsilon=1e-3
    )
    err = (dx - dx_autograd).abs().max().item()
    _say(out, f"   fused_batch_norm_grad_v3 vs torch.autograd.grad: max |diff| = {err:.1e}")
    return err < 1e-12


def _model():
    return torch.nn.Sequential(
        T.nn.DepthwiseConv2d(3, 3, padding="same", depth_multiplier=2),
        T.nn.FusedBatchNorm(6),
        torch.nn.ReLU(),
        T.nn.FractionalMaxPool2d(1.5, pseudo_random=True, deterministic=True, seed=1, seed2=2),
        torch.nn.Flatten(),
        torch.nn.LazyLinear(4),
    )


def _train(out):
    _say(
        out,
        "3. A small nn model (DepthwiseConv2d -> FusedBatchNorm -> FractionalMaxPool2d), "
        "one SGD step",
    )
    torch.manual_seed(0)
    model = _model()
    x = torch.randn(16, 12, 12, 3)
    target = torch.randint(0, 4, (16,))
    model(x)  # materialise the lazy layer
    compiled = _model()
    compiled.load_state_dict(model.state_dict())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    t0 = time.perf_counter()
    loss = torch.nn.functional.cross_entropy(model(x), target)
    loss.backward()
    opt.step()
    _say(out, f"   eager loss {loss.item():.6f} ({(time.perf_counter() - t0) * 1e3:.0f} ms)")

    _say(out, "4. The same model under torch.compile(fullgraph=True, dynamic=True)")
    step = torch.compile(compiled, fullgraph=True, dynamic=True)
    t0 = time.perf_counter()
    loss_c = torch.nn.functional.cross_entropy(step(x), target)
    loss_c.backward()
    _say(
        out,
        f"   compiled loss {loss_c.item():.6f} (first call compiles: "
        f"{time.perf_counter() - t0:.1f} s); |eager - compiled| = "
        f"{abs(loss.item() - loss_c.item()):.1e}",
    )
    return abs(loss.item() - loss_c.item()) < 1e-5


def run_demo(out=sys.stdout, parity_cases=8):
    from torch_tfgrads import _loader

    _say(
        out,
        f"torch_tfgrads {T.__version__} on torch {torch.__version__}; CPU capability "
        f"{torch.backends.cpu.get_cpu_capability()}; CUDA kernels compiled: "
        f"{_loader.WITH_CUDA}",
    )
    ok = _ops(out)
    ok &= _train(out)
    _say(out)
    try:
        from .parity._tf import TFUnavailable, import_tf

        import_tf(eigen=True)
    except TFUnavailable:
        _say(
            out,
            "5. Parity with TensorFlow: skipped, TensorFlow is not installed "
            "(pip install tensorflow-cpu==2.21.0, or `make test`, adds it)",
        )
        return 0 if ok else 1
    from .parity import run_parity

    _say(
        out,
        f"5. Parity with TensorFlow ({parity_cases} random cases per family; "
        "`python -m torch_tfgrads parity` runs more)",
    )
    code = run_parity(n_cases=parity_cases, out=out)
    return code if ok else 1
