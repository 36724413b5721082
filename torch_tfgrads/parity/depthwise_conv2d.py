"""DepthwiseConv2dNative family in the parity command: the three ops against TF 2.21's Eigen
kernels where TF computes the case (NHWC, equal strides, no dilation), and against the float64
grouped-convolution reference for dilations, unequal strides and NCHW (TF refuses them or, for
the backprops with dilations, returns wrong numbers)."""

import torch

import torch_tfgrads as T

from . import Row
from .depthwise_conv2d_cases import random_cases, reference
from .depthwise_conv2d_tf import (
    tf_depthwise_conv2d_native,
    tf_depthwise_conv2d_native_backprop_filter,
    tf_depthwise_conv2d_native_backprop_input,
)

OPS = [
    "depthwise_conv2d_native",
    "depthwise_conv2d_native_backprop_input",
    "depthwise_conv2d_native_backprop_filter",
]
TOLERANCE = {torch.float32: 1e-5, torch.float64: 1e-12}


def rel_err(a, b):
    """Normwise (max-abs) relative error in float64; inf when the shapes differ."""
    if a.shape != b.shape:
        return float("inf")
    if b.numel() == 0:
        return 0.0
    a, b = a.double(), b.double()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def ours(case):
    a = case.attrs()
    return (
        T.depthwise_conv2d_native(case.x, case.f, *a),
        T.depthwise_conv2d_native_backprop_input(case.x.shape, case.f, case.dy, *a),
        T.depthwise_conv2d_native_backprop_filter(case.x, case.f.shape, case.dy, *a),
    )


def oracle(case, use_tf):
    if not use_tf:
        return reference(case)
    a = case.attrs()
    return (
        tf_depthwise_conv2d_native(case.x, case.f, *a),
        tf_depthwise_conv2d_native_backprop_input(case.x.shape, case.f, case.dy, *a),
        tf_depthwise_conv2d_native_backprop_filter(case.x, case.f.shape, case.dy, *a),
    )


def check_case(case, use_tf):
    """{op: normwise relative error} of our three results against TF or the reference."""
    return {op: rel_err(o, e) for op, o, e in zip(OPS, ours(case), oracle(case, use_tf))}


def run(tf, n_cases, seed, log):
    worst, counts = {}, {}
    groups = (
        ("TF", random_cases(2 * n_cases, seed=seed, tf_only=True), True),
        ("ref", random_cases(2 * n_cases, seed=seed + 1), False),
    )
    for label, cases, use_tf in groups:
        for case in cases:
            for op, err in check_case(case, use_tf).items():
                key = (op, str(case.x.dtype)[6:], label)
                worst[key] = max(worst.get(key, 0.0), err / TOLERANCE[case.x.dtype])
                counts[key] = counts.get(key, 0) + 1
    log(
        f"{2 * n_cases} TF cases (NHWC, equal strides, no dilation) and {2 * n_cases} reference "
        "cases (dilations, unequal strides, NCHW)"
    )
    rows = []
    for op, dt, label in sorted(worst):
        tol = TOLERANCE[getattr(torch, dt)]
        rows.append(
            Row(f"{op} [{dt}, {label}]", counts[(op, dt, label)], worst[(op, dt, label)] * tol, tol)
        )
    return rows
