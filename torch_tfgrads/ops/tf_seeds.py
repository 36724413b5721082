"""TF 2's seed rules for the fractional pools: the raw op's attributes that ``tf.nn`` passes.

``tf.nn.fractional_max_pool(value, pooling_ratio, seed=s)`` (and ``fractional_avg_pool``) does
not hand ``s`` to the kernel: it derives the kernel's ``(deterministic, seed, seed2)`` from ``s``
and the global seed of ``tf.random.set_seed`` (``tf.random.get_seed``, TF 2.21's
``framework/random_seed.py``). :func:`fractional_pool_seeds` repeats that derivation, so that
``torch_tfgrads.fractional_max_pool(x, ratio, **fractional_pool_seeds(s, g))`` draws the
sequences TF draws. See docs/ops/fractional_pool.md.
"""

from __future__ import annotations

import operator
import random

# framework/random_seed.py's constants.
DEFAULT_GRAPH_SEED = 87654321
_MAXINT32 = 2**31 - 1


def _int_or_none(value, name):
    if value is None:
        return None
    if isinstance(value, bool):  # an int subclass, but surely a mistake here
        raise ValueError(f"fractional_pool_seeds: argument '{name}' must be an int, got {value!r}")
    try:
        return operator.index(value)  # int, numpy integers, 0-d integer tensors
    except TypeError:
        raise ValueError(
            f"fractional_pool_seeds: argument '{name}' must be an int or None, got {value!r}"
        ) from None


def _truncate(seed):
    # random_seed._truncate_seed: Python's %, so negative seeds land in [0, 2**31 - 2] too.
    return seed % _MAXINT32


def _eager_op_seed(global_seed, op_index):
    """context.internal_operation_seed(): ``tf.random.set_seed(g)`` makes a fresh
    ``random.Random(g)``, and each op without an op seed draws ``randint(0, 2**31 - 1)`` from it."""
    rng = random.Random(global_seed)
    for _ in range(op_index):
        rng.randint(0, _MAXINT32)
    return rng.randint(0, _MAXINT32)


def fractional_pool_seeds(
    seed: int | None,
    global_seed: int | None = None,
    *,
    op_index: int = 0,
    in_tf_function: bool = False,
) -> dict[str, bool | int]:
    """The ``deterministic``, ``seed`` and ``seed2`` that TF 2's ``tf.nn.fractional_*_pool`` uses.

    Pass the result to :func:`torch_tfgrads.fractional_max_pool`,
    :func:`torch_tfgrads.fractional_avg_pool` or the ``nn.Fractional*Pool2d`` modules to draw
    TF's pooling sequences, bit for bit.

    Args:
        seed: the ``seed=`` given to ``tf.nn.fractional_max_pool`` / ``fractional_avg_pool``
            (any int; TF reduces it modulo ``2**31 - 1``). ``0`` (TF's default) means a
            non-deterministic op; ``None`` takes an op seed from the global seed (see
            ``op_index``).
        global_seed: the value of ``tf.random.set_seed`` in effect, or None when it was never
            called (or was reset with ``tf.random.set_seed(None)``).
        op_index: only for ``seed=None`` with a global seed: how many random ops without an op
            seed ran eagerly since ``tf.random.set_seed`` (this call is op number
            ``op_index``, from 0). TF counts *every* such op (``tf.random.uniform()``,
            ``tf.nn.dropout``, ...), so this is only reproducible where that count is known.
        in_tf_function: the TF call was traced in a ``tf.function``: there an op without an
            op seed gets the graph's own counter, ``op_index`` = how many unseeded random ops
            the function traced before it.

    Returns:
        ``{"deterministic": bool, "seed": int, "seed2": int}``, TF's rules:

        * ``seed == 0``: ``deterministic=False``, seeds 0 (TF: fresh random sequences per call;
          here: drawn from torch's generator);
        * global seed ``g`` set: ``(g % (2**31-1), seed % (2**31-1))``, where a pair ``(0, 0)``
          becomes ``(0, 2**31-1)`` (``(0, 0)`` means "random" to the kernel);
        * no global seed: ``(87654321, seed % (2**31-1))`` (TF's ``DEFAULT_GRAPH_SEED``);
        * ``seed=None`` with a global seed: the op seed is TF's eager draw number
          ``op_index`` from ``random.Random(g)``, or ``op_index`` itself in a ``tf.function``;
        * ``seed=None`` and no global seed: ``deterministic=True`` with seeds 0 (TF: random
          sequences fixed per cached kernel; here per call, or per module).

    Example::

        import torch, torch_tfgrads
        # TF: tf.random.set_seed(42); tf.nn.fractional_max_pool(x, [1, 1.5, 1.5, 1], seed=7)
        kw = torch_tfgrads.fractional_pool_seeds(7, global_seed=42)
        # kw == {"deterministic": True, "seed": 42, "seed2": 7}
        out, rows, cols = torch_tfgrads.fractional_max_pool(torch.rand(1, 10, 10, 1),
                                                            [1, 1.5, 1.5, 1], **kw)
    """
    seed = _int_or_none(seed, "seed")
    global_seed = _int_or_none(global_seed, "global_seed")
    op_index = _int_or_none(op_index, "op_index")
    if not isinstance(in_tf_function, bool):
        raise ValueError(
            "fractional_pool_seeds: argument 'in_tf_function' must be a bool, got "
            f"{in_tf_function!r}"
        )
    if op_index is None or op_index < 0:
        raise ValueError(
            f"fractional_pool_seeds: argument 'op_index' must be a non-negative int, got {op_index!r}"
        )
    if seed == 0:  # nn_ops.fractional_*_pool_v2: seed 0 bypasses get_seed
        return {"deterministic": False, "seed": 0, "seed2": 0}
    if global_seed is None:
        if seed is None:  # get_seed -> (None, None): the op's attribute defaults, 0 and 0
            return {"deterministic": True, "seed": 0, "seed2": 0}
        seeds = (DEFAULT_GRAPH_SEED, _truncate(seed))
    else:
        if seed is not None:
            op_seed = seed
        elif in_tf_function:  # random_seed.get_seed: _graph_to_seed_dict, counting from 0
            op_seed = op_index
        else:
            op_seed = _eager_op_seed(global_seed, op_index)
        seeds = (_truncate(global_seed), _truncate(op_seed))
    if seeds == (0, 0):  # get_seed avoids the kernels' "nondeterministic" pair
        seeds = (0, _MAXINT32)
    return {"deterministic": True, "seed": seeds[0], "seed2": seeds[1]}


__all__ = ["fractional_pool_seeds", "DEFAULT_GRAPH_SEED"]
