"""Every public function of torch_tfgrads compiles with torch.compile(fullgraph=True,
dynamic=True) and gives eager's results, including the pure-Python helpers (e.g.
cudnn_rnn_params_size on a symbolic input size)."""

import pytest
import torch

import torch_tfgrads as T
from helpers import DEVICES


def _bn():
    x = torch.randn(4, 3, 5, 6)
    s, o = torch.rand(6) + 0.5, torch.randn(6)
    y = T.fused_batch_norm_v3(x, s, o)
    return {
        "fused_batch_norm_v3": (
            lambda x, s, o: T.fused_batch_norm_v3(x, s, o, epsilon=1e-3),
            (x, s, o),
        ),
        "fused_batch_norm_grad_v3": (
            lambda dy, x, s, r1, r2: T.fused_batch_norm_grad_v3(dy, x, s, r1, r2),
            (torch.randn_like(x), x, s, y[3], y[4]),
        ),
        "fused_batch_norm_sync_stats": (lambda x: T.fused_batch_norm_sync_stats(x), (x,)),
        "fused_batch_norm_sync_grad_sums": (
            lambda dy, x, m: T.fused_batch_norm_sync_grad_sums(dy, x, m),
            (torch.randn_like(x), x, y[3]),
        ),
        "fused_batch_norm_sync_backprop_input": (
            lambda dy, x, s, m, v, g, n: T.fused_batch_norm_sync_backprop_input(
                dy, x, s, m, v, g, n
            ),
            (torch.randn_like(x), x, s, y[3], y[4], torch.randn(12), torch.tensor([60.0])),
        ),
    }


def _fp():
    x = torch.randn(2, 9, 10, 3)
    out, rows, cols = T.fractional_max_pool(x, [1, 1.5, 1.5, 1], True, False, True, 1, 2)
    dy = torch.randn(out.shape)
    return {
        "fractional_avg_pool": (
            lambda x: T.fractional_avg_pool(x, [1.0, 1.5, 1.5, 1.0], True, False, True, 1, 2),
            (x,),
        ),
        "fractional_max_pool": (
            lambda x: T.fractional_max_pool(x, [1.0, 1.5, 1.5, 1.0], True, False, True, 1, 2),
            (x,),
        ),
        "fractional_avg_pool_grad": (
            lambda dy, r, c: T.fractional_avg_pool_grad([2, 9, 10, 3], dy, r, c),
            (dy, rows, cols),
        ),
        "fractional_max_pool_grad": (
            lambda x, y, dy, r, c: T.fractional_max_pool_grad(x, y, dy, r, c),
            (x, out, dy, rows, cols),
        ),
        "fractional_pooling_sequence": (
            lambda: T.fractional_pooling_sequence(17, 9, True, 5, 6),
            (),
        ),
        # The seed rule is plain Python: traced into the graph as the op's constant attributes.
        "fractional_pool_seeds": (
            lambda x: T.fractional_max_pool(
                x, [1.0, 1.5, 1.5, 1.0], True, False, **T.fractional_pool_seeds(2**40 + 3, 2**33)
            ),
            (x,),
        ),
    }


def _dw():
    x, f = torch.randn(2, 7, 8, 3), torch.randn(3, 3, 3, 2)
    dy = T.depthwise_conv2d_native(x, f, [1, 1, 1, 1], "SAME")
    st = [1, 1, 1, 1]
    return {
        "depthwise_conv2d_native": (
            lambda x, f: T.depthwise_conv2d_native(x, f, st, "SAME"),
            (x, f),
        ),
        "depthwise_conv2d_native_backprop_input": (
            lambda x, f, dy: T.depthwise_conv2d_native_backprop_input(x.shape, f, dy, st, "SAME"),
            (x, f, dy),
        ),
        "depthwise_conv2d_native_backprop_filter": (
            lambda x, f, dy: T.depthwise_conv2d_native_backprop_filter(x, f.shape, dy, st, "SAME"),
            (x, f, dy),
        ),
    }


def _rnn():
    x = torch.randn(5, 2, 4)
    n = T.cudnn_rnn_params_size(1, 3, 4)
    p, h = torch.randn(n) * 0.3, torch.zeros(1, 2, 3)
    out = T.cudnn_rnn_v3(x, h, h, p)
    w, b = T.cudnn_rnn_params_to_canonical_v2(1, 3, 4, p, 8, 8)
    dys = [torch.randn_like(t) for t in out[:3]]
    return {
        "cudnn_rnn_params_size": (
            lambda x: x.new_zeros(
                T.cudnn_rnn_params_size(2, 3, x.shape[-1], "gru", direction="bidirectional")
            ),
            (x,),
        ),
        "cudnn_rnn_v3": (lambda x, h, p: T.cudnn_rnn_v3(x, h, h, p)[:3], (x, h, p)),
        "cudnn_rnn_backprop_v3": (
            lambda x, h, p, *g: T.cudnn_rnn_backprop_v3(x, h, h, p, None, *out[:3], *g, *out[3:]),
            (x, h, p, *dys),
        ),
        "cudnn_rnn_canonical_to_params_v2": (
            lambda *t: T.cudnn_rnn_canonical_to_params_v2(1, 3, 4, list(t[:8]), list(t[8:])),
            (*w, *b),
        ),
        "cudnn_rnn_params_to_canonical_v2": (
            lambda p: T.cudnn_rnn_params_to_canonical_v2(1, 3, 4, p, 8, 8),
            (p,),
        ),
    }


CASES = {**_bn(), **_fp(), **_dw(), **_rnn()}


def test_every_public_function_has_a_case():
    public = [n for n in T.__all__ if n not in ("nn", "cpu", "__version__")]
    assert sorted(CASES) == sorted(public)


def _flat(v):
    if isinstance(v, torch.Tensor):
        return [v]
    if isinstance(v, (list, tuple)):
        return [t for e in v for t in _flat(e)]
    return [v]


@pytest.mark.parametrize("name", sorted(CASES))
def test_compiles_fullgraph_dynamic(name):
    torch._dynamo.reset()
    fn, args = CASES[name]
    eager = fn(*args)
    compiled = torch.compile(fn, fullgraph=True, dynamic=True)(*args)
    for a, b in zip(_flat(compiled), _flat(eager), strict=True):
        if isinstance(b, torch.Tensor):
            torch.testing.assert_close(a, b)
        else:
            assert a == b


def _reduce_overhead_models(device):
    """Models with a cudagraph-safe op before and after each host-randomness op."""
    params = torch.randn(int(T.cudnn_rnn_params_size(2, 6, 4, "lstm")), device=device) * 0.3
    h = torch.zeros(2, 3, 6, device=device)

    def pool(x, seed):  # seed 0: TF draws new sequences on every call
        out, rows, cols = T.fractional_max_pool(
            x * 2, [1, 1.5, 1.5, 1], True, True, seed > 0, seed, seed
        )
        return out.relu() + 1, rows, cols

    def lstm(x, seed):  # dropout between the two layers; seed 0: a new mask on every call
        y, hy, cy, _, _ = T.cudnn_rnn_v3(
            x + 1, h, h, params, dropout=0.5, seed=seed, seed2=seed, is_training=True
        )
        return y * 2, hy, cy

    return {
        "fractional_max_pool": (pool, torch.randn(2, 64, 64, 3, device=device)),
        "cudnn_rnn_v3": (lstm, torch.randn(5, 3, 4, device=device)),
    }


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("model", ["fractional_max_pool", "cudnn_rnn_v3"])
def test_reduce_overhead_runs_host_randomness_outside_cuda_graphs(model, device):
    """torch.compile(mode="reduce-overhead") records CUDA graphs; the cudagraph_unsafe ops run
    outside them (Inductor partitions the graph around them). Fixed seeds: every call equals
    eager. Zero seeds: every call draws anew, where a recorded graph would replay one draw. (On
    the CPU there are no CUDA graphs: the same checks of the compiled model.)"""
    torch._dynamo.reset()
    fn, x = _reduce_overhead_models(device)[model]
    compiled = torch.compile(fn, mode="reduce-overhead", fullgraph=True)
    for _ in range(4):  # the first calls warm up and record, the later ones replay
        for got, want in zip(compiled(x, 7), fn(x, 7)):
            assert torch.equal(got, want)
    draws = {tuple(t.flatten().tolist()) for t in (compiled(x, 0)[0] for _ in range(4))}
    assert len(draws) == 4  # all different
