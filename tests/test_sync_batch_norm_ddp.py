"""SyncFusedBatchNorm under DistributedDataParallel on 2 and 4 gloo processes against one process
on the concatenated batch: outputs, input gradients, the gradients of every parameter after
DDP's average, parameters and moving statistics after several SGD steps. Uneven batches, an
empty rank, NCHW, float32, tf-keras's moving-average rule, a Keras-loaded model converted with
convert_sync_batchnorm, exactly one all-reduce per direction, and torch.compile (the bare module
with fullgraph=True, and the DDP model).

Loss scaling: each rank's loss is its local sum times W / N (N the global batch), so DDP's
average of the parameter gradients is the gradient of the global mean loss (docs/distributed.md,
"Gradient scale"). The input gradient a rank receives is then W times the single process's
(it is the gradient of the sum of the ranks' losses, as in TF), hence dx / W below.
"""

from __future__ import annotations

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils._python_dispatch import TorchDispatchMode

import torch_tfgrads.nn as tnn
from distributed_helpers import run_workers
from helpers import CUDA_DEVICES, rel_err

pytestmark = pytest.mark.multiprocess

STEPS, LR, N = 3, 0.1, 12
TOL = {torch.float64: 1e-10, torch.float32: 2e-5}


def _splits(kind, world):
    if kind == "equal":
        return [N // world] * world
    if kind == "uneven":
        return [1, N - 1] if world == 2 else [1, 2, 4, N - 7]
    return [0, N] if world == 2 else [3, 0, 5, N - 8]  # "empty": rank 1 has no data


# name: (splits kind, data_format, dtype, keras_version, converted Keras-style model)
CASES = {
    "equal": ("equal", "NHWC", torch.float64, 3),
    "uneven": ("uneven", "NHWC", torch.float64, 3),
    "empty": ("empty", "NHWC", torch.float64, 3),
    "nchw": ("uneven", "NCHW", torch.float64, 3),
    "float32": ("equal", "NHWC", torch.float32, 3),
    "tf-keras empty": ("empty", "NHWC", torch.float64, 2),
}


class Model(torch.nn.Module):
    """A linear layer on the channels (a trainable input to the batch norm, so that its input
    gradient reaches a parameter), the batch norm, a linear head."""

    def __init__(self, fmt, dtype, sync, keras_version=3):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.fmt = fmt
        self.pre = torch.nn.Linear(3, 3, dtype=dtype)
        bn = tnn.FusedBatchNorm(3, momentum=0.5, data_format=fmt, dtype=dtype)
        bn.moving_variance_rule = "biased"
        self.bn = tnn.convert_sync_batchnorm(bn, keras_version=keras_version) if sync else bn
        self.head = torch.nn.Linear(3, 2, dtype=dtype)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.rand(p.shape, generator=g, dtype=torch.float64) * 2 - 1)
            self.bn.weight.add_(1.5)
            self.bn.running_var.fill_(1.5)

    def forward(self, x):  # x: [n, 4, 4, 3]
        h = self.pre(x) + 2.0  # an offset: E[x^2] - E[x]^2 must cancel a little
        if self.fmt == "NCHW":
            return self.head(self.bn(h.permute(0, 3, 1, 2)).permute(0, 2, 3, 1))
        return self.head(self.bn(h))


def _data(dtype):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(N, 4, 4, 3, generator=g, dtype=torch.float64).to(dtype)
    t = torch.randn(N, 4, 4, 2, generator=g, dtype=torch.float64).to(dtype)
    return x, t


def _train(model, x, t, scale, step_fn=None):
    """STEPS SGD steps; per step: output, input gradient, parameter gradients, then the state."""
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    run = model if step_fn is None else step_fn
    out = []
    for _ in range(STEPS):
        xs = x.clone().requires_grad_()
        opt.zero_grad()
        y = run(xs)
        ((y * t).sum() * scale).backward()
        grads = {k: p.grad.clone() for k, p in model.named_parameters()}
        opt.step()
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        out.append({"y": y.detach(), "dx": xs.grad, "grads": grads, "state": state})
    return out


def _strip(d):  # DDP prefixes "module."
    return {k.removeprefix("module."): v for k, v in d.items()}


class CountAllReduces(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        # eager: c10d's in-place all-reduce; compiled: the functional one
        if func in (
            torch.ops.c10d.allreduce_.default,
            torch.ops._c10d_functional.all_reduce.default,
        ):
            self.n += 1
        return func(*args, **(kwargs or {}))


def ddp_worker(rank, world):
    torch.manual_seed(0)
    results = {}
    for name, (kind, fmt, dtype, kv) in CASES.items():
        x, t = _data(dtype)
        sizes = _splits(kind, world)
        xr, tr = x.split(sizes)[rank], t.split(sizes)[rank]
        model = Model(fmt, dtype, sync=True, keras_version=kv)
        # tf-keras: each rank keeps its own statistics (DDP would copy rank 0's each forward)
        steps = _train(DDP(model, forward_sync_buffers=kv == 3), xr, tr, world / N)
        for s in steps:
            s["grads"], s["state"] = _strip(s["grads"]), _strip(s["state"])
        results[name] = steps
    # One all-reduce per direction: the functional collectives seen by a dispatch mode.
    bn = tnn.SyncFusedBatchNorm(3, dtype=torch.float64)
    x = torch.randn(4, 3, 3, 3, dtype=torch.float64, requires_grad=True)
    with CountAllReduces() as fwd:
        y = bn(x)
    with CountAllReduces() as bwd:
        y.sum().backward()
    results["all-reduces"] = (fwd.n, bwd.n)
    # torch.compile: the module alone with fullgraph=True (the collectives inside the graph),
    # and the DDP model (DDP's own bucketed all-reduces split its graph, as for any DDP model).
    x, t = _data(torch.float64)
    xr, tr = x.split(_splits("uneven", world))[rank], t.split(_splits("uneven", world))[rank]
    model = Model("NHWC", torch.float64, sync=True)
    compiled_bn = torch.compile(model.bn, fullgraph=True, backend="aot_eager")

    def step(xs):
        h = model.pre(xs) + 2.0
        return model.head(compiled_bn(h))

    results["compiled module"] = _train(model, xr, tr, world / N, step_fn=step)
    model = Model("NHWC", torch.float64, sync=True)
    ddp = DDP(model)
    compiled = torch.compile(ddp, backend="aot_eager")
    steps = _train(ddp, xr, tr, world / N, step_fn=compiled)
    for s in steps:
        s["grads"], s["state"] = _strip(s["grads"]), _strip(s["state"])
    results["compiled DDP"] = steps
    return results


@pytest.fixture(scope="module", params=[2, 4], ids=lambda w: f"{w} processes")
def runs(request):
    world = request.param
    return world, run_workers(ddp_worker, world, timeout=240)


def _reference(name):
    """One process, the whole batch (outside a process group the batch norm is FusedBatchNorm)."""
    _kind, fmt, dtype, _kv = CASES.get(name, ("uneven", "NHWC", torch.float64, 3))
    x, t = _data(dtype)
    return _train(Model(fmt, dtype, sync=False), x, t, 1.0 / N)


def _check(name, world, ranks, ref, tol):
    errs = {}
    for s in range(STEPS):
        y = torch.cat([r[s]["y"] for r in ranks])
        dx = torch.cat([r[s]["dx"] for r in ranks]) / world
        errs[f"y{s}"] = rel_err(y, ref[s]["y"])
        errs[f"dx{s}"] = rel_err(dx, ref[s]["dx"])
        scale = max(g.abs().max().item() for g in ref[s]["grads"].values())
        for r, rk in enumerate(ranks):
            for k, g in ref[s]["grads"].items():
                # relative to the step's largest gradient: the bias in front of the batch norm
                # has a gradient of exactly 0 in theory (rounding noise in practice)
                err = (rk[s]["grads"][k] - g).abs().max().item() / scale
                errs[f"grad {k} rank{r} step{s}"] = err
            for k, v in ref[s]["state"].items():
                errs[f"{k} rank{r} step{s}"] = rel_err(rk[s]["state"][k], v)
    bad = {k: v for k, v in errs.items() if v > tol}
    assert not bad, f"{name}: above {tol:g}: {bad}"


@pytest.mark.parametrize("name", [n for n in CASES if n != "tf-keras empty"])
def test_ddp_equals_one_process_on_the_global_batch(runs, name):
    world, results = runs
    ranks = [r[name] for r in results]
    _check(name, world, ranks, _reference(name), TOL[CASES[name][2]])


def test_tf_keras_rule_leaves_an_empty_rank_unchanged(runs):
    """tf-keras skips the moving-average update where the local batch is empty; the other ranks
    update with the global statistics, Keras-2 rounding order."""
    world, results = runs
    ranks = [r["tf-keras empty"] for r in results]
    keras3 = [r["empty"] for r in results]
    empty = _splits("empty", world).index(0)
    init = Model("NHWC", torch.float64, sync=False).bn
    for s in range(STEPS):
        st = ranks[empty][s]["state"]
        assert torch.equal(st["bn.running_mean"], init.running_mean)
        assert torch.equal(st["bn.running_var"], init.running_var)
    other = (empty + 1) % world
    for k in ("bn.running_mean", "bn.running_var"):
        a, b = ranks[other][0]["state"][k], keras3[other][0]["state"][k]
        assert rel_err(a, b) <= 1e-15 and not torch.equal(a, init.running_mean)
    assert torch.equal(ranks[other][0]["y"], keras3[other][0]["y"])


def test_one_all_reduce_per_direction(runs):
    _, results = runs
    assert all(r["all-reduces"] == (1, 1) for r in results), [r["all-reduces"] for r in results]


def test_compiled_module_fullgraph_and_compiled_ddp(runs):
    world, results = runs
    ref = _reference("compiled DDP")
    _check("compiled DDP", world, [r["compiled DDP"] for r in results], ref, 1e-10)
    # the compiled module without DDP: outputs and input gradients are the global ones; the
    # parameter gradients are each rank's own (their average is checked through DDP above)
    ranks = [r["compiled module"] for r in results]
    y = torch.cat([r[0]["y"] for r in ranks])
    dx = torch.cat([r[0]["dx"] for r in ranks]) / world
    assert rel_err(y, ref[0]["y"]) <= 1e-10 and rel_err(dx, ref[0]["dx"]) <= 1e-10
    mean_grads = {k: sum(r[0]["grads"][k] for r in ranks) / world for k in ref[0]["grads"]}
    scale = max(g.abs().max().item() for g in ref[0]["grads"].values())
    for k, g in ref[0]["grads"].items():
        assert (mean_grads[k] - g).abs().max().item() / scale <= 1e-10, k


def cuda_worker(rank, world):
    """The "uneven" case with the model and data on the GPU (gloo all-reduces CUDA tensors, so
    one GPU serves every process; NCCL would need one GPU per process)."""
    x, t = _data(torch.float64)
    sizes = _splits("uneven", world)
    xr, tr = x.split(sizes)[rank].cuda(), t.split(sizes)[rank].cuda()
    model = Model("NHWC", torch.float64, sync=True).cuda()
    steps = _train(DDP(model), xr, tr, world / N)
    return [
        {
            "y": s["y"].cpu(),
            "dx": s["dx"].cpu(),
            "grads": {k: v.cpu() for k, v in _strip(s["grads"]).items()},
            "state": {k: v.cpu() for k, v in _strip(s["state"]).items()},
        }
        for s in steps
    ]


@pytest.mark.parametrize("device", CUDA_DEVICES)
def test_ddp_on_the_gpu_equals_one_process(device):
    ranks = run_workers(cuda_worker, 2, timeout=240)
    _check("cuda uneven", 2, ranks, _reference("uneven"), 1e-10)
