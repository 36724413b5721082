"""Every nn module of torch_tfgrads under DistributedDataParallel (gloo, CPU), and the
MirroredStrategy buffer semantics of torch_tfgrads.distributed.buffers.

Each module sits in a small model (module, then a linear head). Cases compare what DDP computes
on W processes with a single-process run in this (the pytest) process: the gradients of the
first backward and the state after STEPS SGD steps. All cases of one world size run in ONE spawn
of W processes (an interpreter + torch + the extension each: seconds on a 2-core host); the
module-scoped fixtures below hold their results and each test checks one case.

Loss scaling: DDP averages the ranks' gradients, so each rank's loss is its local sum of
per-sample losses times W / N (N the global batch): the average over ranks is then the gradient
of the global mean loss, exact for uneven and empty local batches too (a plain local mean would
weight a sample on a rank with a small batch more).

FusedBatchNorm in training normalises with its local batch's statistics, so DDP differs from
the global batch by design: those cases compare with per-rank single-process references.
"""

from __future__ import annotations

import copy
import dataclasses
import functools

import pytest
import torch
from torch._dynamo.utils import counters
from torch.nn.parallel import DistributedDataParallel as DDP

import torch_tfgrads.nn as tnn
from distributed_helpers import WorkerError, hang_worker, raise_on_rank1_worker, run_workers
from helpers import rel_err
from torch_tfgrads.distributed.buffers import average_buffers_, replica_mean_state_dict

pytestmark = pytest.mark.multiprocess

STEPS, LR = 3, 0.1
TOL = {torch.float64: 1e-10, torch.float32: 1e-5}  # observed: ~1e-15 and ~2e-7
COMPILE_BACKEND = "aot_eager"  # the autograd graphs of our ops, without inductor's C++ builds


# ---- the models ----
class ChannelLinear(torch.nn.Linear):
    """A trainable layer in front of the parameter-free pools, so their backward matters."""


def _bn(train_stats):
    # momentum 0.5: the running statistics move visibly in a few steps.
    bn = tnn.FusedBatchNorm(3, momentum=0.5)
    with torch.no_grad():
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-1, 1)
        if not train_stats:  # frozen statistics for the inference-mode model
            bn.running_mean.uniform_(-1, 1)
            bn.running_var.uniform_(0.5, 2)
    return bn


def _pool(cls):
    # Nonzero seeds: every call, on every rank and here, draws TF's sequences for this pair.
    pool = cls([1.6, 1.4], overlapping=True, deterministic=True, seed=7, seed2=11)
    return torch.nn.Sequential(ChannelLinear(3, 3), pool)


def _rnn(cls, **kw):
    return cls(input_size=3, num_units=4, time_major=False, **kw)


# name: (body factory, per-sample input shape, body output features per sample)
MODULES = {
    "FusedBatchNorm-eval": (lambda: _bn(False), (4, 4, 3), 48),
    "DepthwiseConv2d": (
        lambda: tnn.DepthwiseConv2d(3, 3, padding="same", depth_multiplier=2),
        (5, 5, 3),
        150,
    ),
    "FractionalAvgPool2d": (lambda: _pool(tnn.FractionalAvgPool2d), (7, 6, 3), 48),
    "FractionalMaxPool2d": (lambda: _pool(tnn.FractionalMaxPool2d), (7, 6, 3), 48),
    "CudnnLSTM": (lambda: _rnn(tnn.CudnnLSTM, num_layers=1, direction="bidirectional"), (5, 3), 40),
    "CudnnGRU": (lambda: _rnn(tnn.CudnnGRU, num_layers=2), (5, 3), 20),
    "CudnnRNNTanh": (lambda: _rnn(tnn.CudnnRNNTanh, num_layers=1), (5, 3), 20),
    "CudnnRNNRelu": (lambda: _rnn(tnn.CudnnRNNRelu, num_layers=1), (5, 3), 20),
    "FusedBatchNorm-train": (lambda: _bn(True), (4, 4, 3), 48),
}


class Model(torch.nn.Module):
    def __init__(self, module, unused_branch=False):
        super().__init__()
        body, _, features = MODULES[module]
        self.body, self.head = body(), torch.nn.Linear(features, 2)
        # Parameters no forward reaches: DDP needs find_unused_parameters=True for them.
        self.unused = torch.nn.Linear(features, 2) if unused_branch else None

    def forward(self, x):
        y = self.body(x)
        if isinstance(y, tuple):  # the RNNs: (outputs [B, T, U], states)
            y = y[0]
        return self.head(y.flatten(1))  # (reshape(0, -1) is ambiguous)


# ---- the cases ----
@dataclasses.dataclass(frozen=True)
class Case:
    module: str
    splits: tuple[int, ...]  # per-rank batch sizes; W = len(splits)
    dtype: torch.dtype = torch.float64
    unused_branch: bool = False  # with find_unused_parameters=True
    compiled: bool = False
    forward_sync_buffers: bool = True  # False: each rank keeps its own buffers
    seed: int = 0

    @property
    def world(self):
        return len(self.splits)

    @property
    def per_rank(self):  # FusedBatchNorm in training: references per rank, not global
        return self.module == "FusedBatchNorm-train"


def _cases():
    cases = {}
    for m in (k for k in MODULES if k != "FusedBatchNorm-train"):
        variants = {
            "even": Case(m, (3, 3)),
            "uneven": Case(m, (1, 4)),
            "unused-branch": Case(m, (2, 3), unused_branch=True),
            "compiled": Case(m, (3, 2), compiled=True),
            "world4": Case(m, (2, 1, 3, 2)),
            "empty-rank1": Case(m, (4, 0)),
        }
        for v, c in variants.items():
            cases[f"{m}/{v}"] = dataclasses.replace(c, seed=len(cases))
    cases["DepthwiseConv2d/float32"] = Case("DepthwiseConv2d", (3, 2), torch.float32, seed=900)
    cases["CudnnLSTM/float32"] = Case("CudnnLSTM", (3, 2), torch.float32, seed=901)
    bn = "FusedBatchNorm-train"
    for name, splits in {
        "world2": (2, 4),
        "world4": (2, 3, 1, 2),
        "empty-rank1": (4, 0),
        "empty-rank0": (0, 4),
    }.items():
        cases[f"{bn}/broadcast/{name}"] = Case(bn, splits, seed=1000 + len(cases))
    cases[f"{bn}/broadcast/compiled"] = Case(bn, (2, 4), compiled=True, seed=1000 + len(cases))
    for name, splits in {"world2": (2, 4), "world4": (2, 3, 1, 2)}.items():
        cases[f"{bn}/local/{name}"] = Case(
            bn, splits, forward_sync_buffers=False, seed=1000 + len(cases)
        )
    return cases


CASES = _cases()
BY_WORLD = {w: sorted(n for n, c in CASES.items() if c.world == w) for w in (2, 4)}


def build(case):
    torch.manual_seed(case.seed)  # identical initial weights in every process
    model = Model(case.module, case.unused_branch).to(case.dtype)
    return model.train(case.module != "FusedBatchNorm-eval")


def global_batch(case, step):
    g = torch.Generator().manual_seed(case.seed * 100 + step)
    n = sum(case.splits)
    x = torch.randn((n, *MODULES[case.module][1]), generator=g, dtype=torch.float64)
    t = torch.randn((n, 2), generator=g, dtype=torch.float64)
    return x.to(case.dtype), t.to(case.dtype)


def local_batch(case, step, rank):
    x, t = global_batch(case, step)
    lo = sum(case.splits[:rank])
    return x[lo : lo + case.splits[rank]], t[lo : lo + case.splits[rank]]


def scaled_loss(out, t, case):
    # Local sum * W / N: DDP's average over ranks is the gradient of the global mean loss.
    return 0.5 * ((out - t) ** 2).sum() * case.world / sum(case.splits)


def _clone(d):
    return {k: (None if v is None else v.detach().clone()) for k, v in d.items()}


def _grads(model):
    return _clone({n: p.grad for n, p in model.named_parameters()})


# ---- what each rank runs ----
def worker(rank, world, names):
    return {name: _run_case(CASES[name], rank) for name in names}


def _run_case(case, rank):
    try:
        model = build(case)
        ddp = DDP(
            model,
            forward_sync_buffers=case.forward_sync_buffers,
            find_unused_parameters=case.unused_branch,
        )
        net = ddp
        if case.compiled:
            # Every case compiles Model.forward again: without a reset, the 9th would hit
            # dynamo's recompile limit and run eagerly, silently.
            torch._dynamo.reset()
            counters.clear()
            net = torch.compile(ddp, backend=COMPILE_BACKEND)
        opt = torch.optim.SGD(ddp.parameters(), lr=LR)

        def step(s):
            x, t = local_batch(case, s, rank)
            opt.zero_grad(set_to_none=True)
            scaled_loss(net(x), t, case).backward()
            grads = _grads(model)
            opt.step()
            return grads

        out = {"grads": step(0)}
        for s in range(1, STEPS):
            step(s)
        out["state"] = _clone(model.state_dict())
        if case.compiled:
            out["aot_graphs"] = dict(counters["aot_autograd"])
        if not case.forward_sync_buffers:
            if case.world == 4:  # means over subgroups; their outsiders are refused
                pair = torch.distributed.new_group([0, 1])
                try:
                    out["pair_mean"] = _clone(replica_mean_state_dict(model, pair))
                except ValueError as e:
                    out["pair_mean"] = str(e)
                # Over 3 ranks sum / 3 may round: averaging twice must not move the values.
                triple, twice = torch.distributed.new_group([0, 1, 2]), copy.deepcopy(model)
                if rank < 3:
                    once = _clone(average_buffers_(twice, triple).state_dict())
                    out["triple"] = once, _clone(average_buffers_(twice, triple).state_dict())
                    # Equal copies stay put: (0.1 + 0.1 + 0.1) / 3 would be 0.1 + 2**-56.
                    twice.body.running_mean.fill_(0.1)
                    out["equal_kept"] = average_buffers_(twice, triple).body.running_mean.clone()
            out["replica_mean"] = _clone(replica_mean_state_dict(model))
            out["averaged"] = _clone(average_buffers_(ddp).module.state_dict())
            step(STEPS)  # the mean after one more step does not depend on the averaging
            out["replica_mean_next"] = _clone(replica_mean_state_dict(model))
        return out
    except Exception as e:
        raise RuntimeError(f"case {case} failed on rank {rank}") from e


def _spawn(world):
    ranks = run_workers(worker, world, (BY_WORLD[world],), timeout=240)
    return {name: [r[name] for r in ranks] for name in BY_WORLD[world]}


@pytest.fixture(scope="module")
def results2():
    return _spawn(2)


@pytest.fixture(scope="module")
def results4():
    return _spawn(4)


def results_of(request, name):
    return request.getfixturevalue(f"results{CASES[name].world}")[name]


# ---- single-process references ----
@functools.cache
def global_reference(name):
    """Grads of the first step and the state after STEPS steps, on the global batch."""
    case = CASES[name]
    model = build(case)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for s in range(STEPS):
        x, t = global_batch(case, s)
        opt.zero_grad(set_to_none=True)
        (0.5 * ((model(x) - t) ** 2).sum() / x.shape[0]).backward()
        if s == 0:
            grads = _grads(model)
        opt.step()
    return grads, _clone(model.state_dict())


@functools.cache
def per_rank_reference(name, steps=STEPS):
    """FusedBatchNorm in training, simulated: per step, every rank's copy of the (shared)
    parameters with that rank's statistics runs its local batch, and the gradients are averaged.
    With forward_sync_buffers each rank starts every forward from rank 0's statistics (what DDP
    broadcasts before each forward); without, from its own. Returns the first step's averaged
    grads and, per rank, the state after `steps` steps."""
    case = CASES[name]
    model = build(case)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    stats = [_clone(dict(model.named_buffers())) for _ in range(case.world)]
    for s in range(steps):
        opt.zero_grad(set_to_none=True)
        replicas = []
        for rank in range(case.world):
            replica = copy.deepcopy(model)
            replica.load_state_dict(stats[0 if case.forward_sync_buffers else rank], strict=False)
            x, t = local_batch(case, s, rank)
            scaled_loss(replica(x), t, case).backward()
            replicas.append(replica)
        for p, *qs in zip(model.parameters(), *(r.parameters() for r in replicas)):
            p.grad = sum(q.grad for q in qs) / case.world
        stats = [_clone(dict(r.named_buffers())) for r in replicas]
        if s == 0:
            grads = _grads(model)
        opt.step()
    return grads, [{**_clone(model.state_dict()), **st} for st in stats]


def assert_close(actual, expected, tol, what):
    assert actual.keys() == expected.keys(), what
    for k, e in expected.items():
        a = actual[k]
        if e is None or a is None:
            assert a is None and e is None, f"{what}: {k}: {a} vs {e}"
            continue
        nan = e.isnan()
        assert torch.equal(a.isnan(), nan), f"{what}: {k}: NaN at other places"
        err = rel_err(a[~nan], e[~nan])
        assert err <= tol, f"{what}: {k}: rel err {err:.3g} > {tol:g}"


def assert_same_on_all_ranks(per_rank, what):
    for r, d in enumerate(per_rank[1:], 1):
        for k, v in d.items():
            v0 = per_rank[0][k]
            same = v is None and v0 is None
            same = same or (v is not None and v0 is not None and torch.equal(v, v0))
            assert same, f"{what}: {k} differs between rank 0 and rank {r}"


def assert_compiled(ranks):
    # The model ran through AOTAutograd graphs (not an eager fallback). The fractional pools
    # compile twice: their sequence buffers go from None to tensors after the first call.
    for r in ranks:
        assert r["aot_graphs"]["ok"] >= 1 and r["aot_graphs"]["ok"] == r["aot_graphs"]["total"]


# ---- the tests ----
GLOBAL = [n for n, c in CASES.items() if not c.per_rank]
BN = "FusedBatchNorm-train"


@pytest.mark.parametrize("name", GLOBAL)
def test_ddp_matches_single_process_on_global_batch(request, name):
    case = CASES[name]
    ranks = results_of(request, name)
    grads, state = global_reference(name)
    tol = TOL[case.dtype]
    for r, res in enumerate(ranks):
        assert_close(res["grads"], grads, tol, f"rank {r} grads")
        assert_close(res["state"], state, tol, f"rank {r} state after {STEPS} steps")
    # DDP's all-reduce hands every rank the same bits.
    assert_same_on_all_ranks([r["state"] for r in ranks], "state")
    if case.compiled:
        assert_compiled(ranks)
    if case.unused_branch:  # DDP leaves the grads of globally unused parameters at None
        assert all(r["grads"]["unused.weight"] is None for r in ranks)


@pytest.mark.parametrize("name", [n for n in CASES if n.startswith(f"{BN}/broadcast/")])
def test_batch_norm_broadcast_buffers_rank0_wins(request, name):
    """forward_sync_buffers=True (DDP's default; the deprecated broadcast_buffers=True): before
    every forward DDP copies rank 0's buffers to all ranks, and each rank's forward then updates
    them with its local batch. After k steps rank 0 holds the moving statistics of its own
    batches alone; rank r != 0 holds rank 0's statistics after k - 1 steps updated once with
    rank r's k-th batch. Parameters match the average of the per-rank gradients (training-mode
    BN ignores the moving statistics)."""
    case = CASES[name]
    ranks = results_of(request, name)
    grads, states = per_rank_reference(name)
    for r, res in enumerate(ranks):
        assert_close(res["grads"], grads, 1e-10, f"rank {r} grads")
        assert_close(res["state"], states[r], 1e-10, f"rank {r} state")
    # The last forward's buffers: rank 0's own EMA of its batches, a different value elsewhere.
    mean0 = ranks[0]["state"]["body.running_mean"]
    if case.splits[0] == 0:  # as in TF, an empty batch gives NaN statistics, broadcast to all
        assert all(r["state"]["body.running_mean"].isnan().all() for r in ranks)
    else:
        assert not mean0.isnan().any()
        for r, n in enumerate(case.splits[1:], 1):
            other = ranks[r]["state"]["body.running_mean"]
            assert other.isnan().all() if n == 0 else not torch.equal(other, mean0)
    if case.compiled:
        assert_compiled(ranks)


@pytest.mark.parametrize("name", [n for n in CASES if n.startswith(f"{BN}/local/")])
def test_batch_norm_replica_mean_buffers(request, name):
    """forward_sync_buffers=False (each rank keeps its own statistics, synced only at DDP's
    construction) + replica_mean_state_dict / average_buffers_: TF MirroredStrategy's
    ON_READ/MEAN moving statistics."""
    ranks = results_of(request, name)
    grads, states = per_rank_reference(name)
    for r, res in enumerate(ranks):  # each rank: its own moving statistics
        assert_close(res["grads"], grads, 1e-10, f"rank {r} grads")
        assert_close(res["state"], states[r], 1e-10, f"rank {r} state")

    def mean(states):
        return {k: sum(s[k] for s in states) / len(states) for k in states[0]}

    expected = mean(states)
    for r, res in enumerate(ranks):
        assert_close(res["replica_mean"], expected, 1e-12, f"rank {r} replica_mean_state_dict")
        assert_close(res["averaged"], expected, 1e-12, f"rank {r} after average_buffers_")
    assert_same_on_all_ranks([r["replica_mean"] for r in ranks], "replica_mean_state_dict")
    assert_same_on_all_ranks([r["averaged"] for r in ranks], "average_buffers_")
    if len(ranks) == 4:  # process_group=new_group([0, 1])
        for r in (0, 1):
            assert_close(ranks[r]["pair_mean"], mean(states[:2]), 1e-12, f"rank {r} pair mean")
        for r in (2, 3):
            assert "not a member of argument 'process_group'" in ranks[r]["pair_mean"]
        for r in (0, 1, 2):  # process_group=new_group([0, 1, 2]), averaged twice
            once, twice = ranks[r]["triple"]
            assert_close(once, mean(states[:3]), 1e-12, f"rank {r} triple mean")
            assert_same_on_all_ranks([once, twice, ranks[0]["triple"][0]], "averaged twice")
            assert torch.equal(ranks[r]["equal_kept"], torch.full((3,), 0.1, dtype=torch.float64))
    # The rank copies did differ: the averaging had something to do.
    assert not torch.equal(ranks[0]["state"]["body.running_var"], expected["body.running_var"])
    # Linearity: averaging after STEPS steps leaves the mean after one more step unchanged.
    later = mean(per_rank_reference(name, STEPS + 1)[1])
    for r, res in enumerate(ranks):
        stats = {k: v for k, v in res["replica_mean_next"].items() if "running" in k}
        assert_close(stats, {k: later[k] for k in stats}, 1e-12, f"rank {r} next step's mean")


@pytest.mark.parametrize("module", list(MODULES))
def test_empty_batch_single_process(module):
    """Forward and backward on a batch of 0 (what a DDP rank with no data runs). The fractional
    pool modules accept it although their ops, like TF's, refuse it ("Pooling ratio is higher
    than input dimension size for dimension 0"). FusedBatchNorm in training gives NaN batch
    statistics, as TF."""
    model = build(Case(module, (0,)))
    x, _ = global_batch(Case(module, (0,)), 0)
    x.requires_grad_()
    y = model(x)
    assert y.shape == (0, 2)
    y.sum().backward()
    assert x.grad.shape == x.shape
    assert all(p.grad is not None and not p.grad.any() for p in model.parameters())
    if module == BN:
        assert model.body.running_mean.isnan().all() and model.body.running_var.isnan().all()


def test_buffers_api_without_process_group():
    model = build(Case(BN, (1,)))
    before = _clone(model.state_dict())
    assert average_buffers_(model) is model
    assert_close(_clone(model.state_dict()), before, 0.0, "average_buffers_ without a group")
    assert_close(_clone(replica_mean_state_dict(model)), before, 0.0, "replica_mean_state_dict")
    with pytest.raises(TypeError, match="argument 'module' must be a torch.nn.Module"):
        average_buffers_({"running_mean": torch.zeros(3)})
    with pytest.raises(TypeError, match="argument 'process_group' must be"):
        replica_mean_state_dict(model, process_group="gloo")


def test_harness_reports_a_rank_error_and_kills_the_others():
    # Rank 0 waits in a barrier for rank 1, which raises: the harness must not wait for rank 0.
    with pytest.raises(WorkerError, match=r"rank 1 raised:(.|\n)*ValueError: rank 1 fails"):
        run_workers(raise_on_rank1_worker, 2, timeout=60)


def test_harness_times_out():
    with pytest.raises(WorkerError, match="timed out after 2 s"):
        run_workers(hang_worker, 2, timeout=2)
