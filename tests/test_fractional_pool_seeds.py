"""fractional_pool_seeds against TF 2.21's own seed rules: `tf.random.set_seed(g)` followed by
`tf.nn.fractional_{max,avg}_pool(..., seed=s)` draws the sequences (and outputs) that our ops
draw with `**fractional_pool_seeds(s, g)`, bit for bit."""

import pytest
import torch

import torch_tfgrads as T
from torch_tfgrads.ops.tf_seeds import DEFAULT_GRAPH_SEED

pytestmark = pytest.mark.needs_tf

M = 2**31 - 1
# (global seed, op seed): small, large (beyond int32 and int64), negative, and the pairs that
# truncate to (0, 0), which TF turns into (0, 2**31 - 1).
PAIRS = [
    (1, 1),
    (42, 7),
    (2**31 + 5, 3),
    (123456789012, 2**40 + 17),
    (2**70 + 1, 2**63 + 9),
    (-5, -11),
    (0, M),
    (M, 2 * M),
    (None, 7),
    (None, 2**35 + 1),
    (None, -3),
]
KINDS = [("max", T.fractional_max_pool), ("avg", T.fractional_avg_pool)]


@pytest.fixture
def tf_seeded(tf):
    """TF with its global seed reset after the test (set_seed(None) clears it)."""
    yield tf
    tf.random.set_seed(None)


def _tf_pool(tf, kind, x, ratio, pseudo_random, overlapping, seed):
    fn = tf.nn.fractional_max_pool if kind == "max" else tf.nn.fractional_avg_pool
    out, rows, cols = fn(
        tf.constant(x.numpy()),
        ratio,
        pseudo_random=pseudo_random,
        overlapping=overlapping,
        seed=seed,
    )
    return [torch.from_numpy(t.numpy()) for t in (out, rows, cols)]


def _assert_same(ours, theirs):
    for a, b, name in zip(ours, theirs, ("output", "rows", "cols"), strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b), (name, a, b)


@pytest.mark.parametrize("overlapping", [False, True])
@pytest.mark.parametrize("pseudo_random", [False, True])
@pytest.mark.parametrize("kind,op", KINDS, ids=["max", "avg"])
@pytest.mark.parametrize("pair", PAIRS, ids=str)
def test_matches_tf_nn(tf_seeded, pair, kind, op, pseudo_random, overlapping):
    tf = tf_seeded
    g, s = pair
    x = torch.rand(2, 17, 13, 3, generator=torch.Generator().manual_seed(len(str(pair))))
    ratio = [1.0, 1.44, 1.73, 1.0]
    tf.random.set_seed(g)
    theirs = _tf_pool(tf, kind, x, ratio, pseudo_random, overlapping, s)
    kw = T.fractional_pool_seeds(s, g)
    assert kw["deterministic"] and 0 <= kw["seed"] <= M and 0 <= kw["seed2"] <= M
    ours = op(x, ratio, pseudo_random, overlapping, **kw)
    _assert_same(ours, theirs)


@pytest.mark.parametrize("kind,op", KINDS, ids=["max", "avg"])
def test_op_seed_from_the_global_seed(tf_seeded, kind, op):
    """seed=None with a global seed: TF's eager op counter (one draw per unseeded random op
    since set_seed, tf.random.uniform included), reproduced by op_index."""
    tf = tf_seeded
    x = torch.rand(1, 20, 20, 2)
    ratio = [1.0, 1.5, 1.5, 1.0]
    g = 2**33 + 77
    tf.random.set_seed(g)
    first = _tf_pool(tf, kind, x, ratio, False, False, None)
    tf.random.uniform([2])  # an unseeded random op: takes op seed number 1
    third = _tf_pool(tf, kind, x, ratio, False, False, None)
    _assert_same(op(x, ratio, **T.fractional_pool_seeds(None, g)), first)
    _assert_same(op(x, ratio, **T.fractional_pool_seeds(None, g, op_index=2)), third)
    assert not torch.equal(first[1], third[1]) or not torch.equal(first[2], third[2])


@pytest.mark.parametrize("g", [42, 0, 2**40 + 1])
def test_op_seed_inside_tf_function(tf_seeded, g):
    """seed=None in a tf.function: the graph's own counter (0 for its first unseeded random
    op), with in_tf_function=True; g=0 gives the pair (0, 0) that becomes (0, 2**31 - 1)."""
    tf = tf_seeded
    x = torch.rand(1, 20, 20, 2)
    ratio = [1.0, 1.5, 1.5, 1.0]
    tf.random.set_seed(g)

    @tf.function
    def pools(v):
        a = tf.nn.fractional_avg_pool(v, ratio, seed=None)
        tf.random.uniform([2])
        b = tf.nn.fractional_max_pool(v, ratio, seed=None)
        return a, b

    first, third = ([torch.from_numpy(t.numpy()) for t in r] for r in pools(tf.constant(x.numpy())))
    kw = [T.fractional_pool_seeds(None, g, op_index=k, in_tf_function=True) for k in (0, 2)]
    _assert_same(T.fractional_avg_pool(x, ratio, **kw[0]), first)
    _assert_same(T.fractional_max_pool(x, ratio, **kw[1]), third)


def test_modules_take_the_seeds(tf_seeded):
    tf = tf_seeded
    x = torch.rand(2, 11, 9, 4)
    tf.random.set_seed(2024)
    theirs = _tf_pool(tf, "max", x, [1.0, 1.6, 1.3, 1.0], True, True, 99)
    pool = T.nn.FractionalMaxPool2d(
        (1.6, 1.3), pseudo_random=True, overlapping=True, **T.fractional_pool_seeds(99, 2024)
    )
    out = pool(x)
    _assert_same((out, pool.row_pooling_sequence, pool.col_pooling_sequence), theirs)


def test_rules_without_tf():
    f = T.fractional_pool_seeds
    assert f(0) == f(0, 5) == {"deterministic": False, "seed": 0, "seed2": 0}
    assert f(None) == {"deterministic": True, "seed": 0, "seed2": 0}
    assert f(7) == {"deterministic": True, "seed": DEFAULT_GRAPH_SEED, "seed2": 7}
    assert f(2**31, 2**31) == {"deterministic": True, "seed": 1, "seed2": 1}
    assert f(M, 0) == {"deterministic": True, "seed": 0, "seed2": M}
    assert f(torch.tensor(3), torch.tensor(4)) == f(3, 4)
    # TF 2.21's context: random.Random(global_seed).randint(0, 2**31 - 1), one draw per op
    import random

    r = random.Random(9)
    draws = [r.randint(0, M) for _ in range(3)]
    assert [f(None, 9, op_index=i)["seed2"] for i in range(3)] == draws
    assert f(None, 9, op_index=4, in_tf_function=True)["seed2"] == 4
    assert f(None, 0, in_tf_function=True) == {"deterministic": True, "seed": 0, "seed2": M}


@pytest.mark.parametrize(
    "args,kwargs,match",
    [
        ((1.5,), {}, "argument 'seed'"),
        ((True,), {}, "argument 'seed'"),
        ((1, "3"), {}, "argument 'global_seed'"),
        ((None, 3), {"op_index": -1}, "argument 'op_index'"),
        ((None, 3), {"in_tf_function": 1}, "argument 'in_tf_function'"),
    ],
)
def test_bad_arguments(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        T.fractional_pool_seeds(*args, **kwargs)
