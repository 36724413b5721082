"""The CUDA kernels' launch plans (csrc/common/launch_geometry.h) at sizes no test GPU reaches:
grid dimensions within CUDA's limits, at least one block, every element covered, workspaces
bounded. The kernels take their geometry from these pure functions, compiled into every build."""

import pytest

from torch_tfgrads import _C

MAX_X, MAX_YZ = 2**31 - 1, 65535
MiB = 1 << 20


@pytest.mark.parametrize("channels_last", [True, False])
@pytest.mark.parametrize(
    "C,outer,inner",
    [(1, 1, 1), (3, 7, 5), (65, 2**20, 1), (300, 16, 17 * 19), (2**20, 10**6, 1), (7, 1, 2**33)],
)
def test_batch_norm_partials(channels_last, C, outer, inner):
    p = _C._launch_plan("bn", int(channels_last), C, outer, inner)
    total = outer if channels_last else outer * inner
    assert 1 <= p["parts"] <= 1024  # the finalize merges at most 1024 partials per channel
    assert p["parts"] * p["per_part"] >= total  # every row/element in some partial
    assert (p["parts"] - 1) * p["per_part"] < total  # no empty partial
    assert 1 <= p["grid_x"] <= MAX_X and p["parts"] <= MAX_YZ


@pytest.mark.parametrize(
    "P,taps,CM",
    [
        (1, 1, 1),
        (64 * 56 * 56, 9, 64),
        (10**8, 49, 2048),  # 7x7 on 2048 channels: 411 MB of partials before the bound
        (10**9, 9, 4096 * 4),
        (5, 300 * 300, 1),  # more taps than grid.y allows: the kernel strides over them
        (10**7, 64 * 64, 8192),  # one chunk alone exceeds the bound: one chunk it is
    ],
)
@pytest.mark.parametrize("acc_bytes", [4, 8])
def test_depthwise_filter_gradient_chunks(P, taps, CM, acc_bytes):
    p = _C._launch_plan("dw_filter_grad", P, taps, CM, acc_bytes)
    assert 1 <= p["chunks"] <= 1024 and p["chunks"] <= MAX_YZ
    assert p["chunks"] * p["per_chunk"] >= P and (p["chunks"] - 1) * p["per_chunk"] < P
    assert 1 <= p["grid_y"] <= MAX_YZ and p["grid_y"] == min(taps, MAX_YZ)
    assert 1 <= p["grid_x"] <= MAX_X and p["grid_x"] * 32 >= CM
    assert p["workspace_bytes"] == p["chunks"] * taps * CM * acc_bytes
    assert p["workspace_bytes"] <= max(64 * MiB, taps * CM * acc_bytes)


def test_unknown_plan_is_a_value_error():
    with pytest.raises(ValueError, match="kind must be"):
        _C._launch_plan("conv", 1, 1, 1, 1)
