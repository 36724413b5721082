"""Every op refuses tensors on two devices with an error naming the argument, before any
kernel could hand a pointer of one device to the other's code (on a GPU: an illegal address that
kills the CUDA context). Without a GPU the second device is `meta`: the dispatcher then runs the
op's fake kernel, whose checks mirror the C++ kernels' (test_<family>_errors.py checks that the
two raise the same messages), so each argument's check is exercised here on any host; the CUDA
variants in test_cuda_* run the C++ checks themselves where a GPU is present.
"""

import importlib

import pytest
import torch

from test_registry import FAMILY_TESTS

# Arguments the op reads on the host, wherever the data lives (TF keeps them in host memory):
# the kernels copy their values to the host first, so any device is accepted.
HOST_ARGS = {
    ("cudnn_rnn_v3", "sequence_lengths"),
    ("cudnn_rnn_backprop_v3", "sequence_lengths"),
    ("cudnn_rnn_backprop_v3", "host_reserved"),
    *(
        (op, f"{axis}_pooling_sequence")
        for op in (
            "fractional_avg_pool_grad",
            "fractional_max_pool_grad",
            "_fractional_avg_pool_grad_backward",
            "_fractional_max_pool_grad_backward",
        )
        for axis in ("row", "col")
    ),
}
# Arguments a kernel never reads in the sample's configuration (TF ignores them there too), so
# they may be anywhere; where they are read, test_read_statistics_are_checked checks them.
NOT_READ = {
    ("fused_batch_norm_v3", "mean"): "training with exponential_avg_factor 1",
    ("fused_batch_norm_v3", "variance"): "training with exponential_avg_factor 1",
    ("fused_batch_norm_grad_v3", "reserve_space_3"): "ignored, as by TF's CPU kernel",
}


def _samples():
    seen = set()
    for module in FAMILY_TESTS:
        for op, args, kwargs in importlib.import_module(module).opcheck_samples():
            schema = getattr(torch.ops.tfgrads, op).default._schema
            names = [a.name for a in schema.arguments]
            tensors = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
            if len(tensors) < 2:
                continue
            for i in tensors[1:]:  # the first tensor is the reference device
                key = (op, names[i])
                if key in seen or key in HOST_ARGS:
                    continue
                seen.add(key)
                yield pytest.param(op, args, kwargs, i, names[i], id=f"{op}-{names[i]}")


@pytest.mark.parametrize("op,args,kwargs,index,name", list(_samples()))
def test_a_tensor_on_another_device_is_refused_by_name(op, args, kwargs, index, name):
    args = [a.detach() if isinstance(a, torch.Tensor) else a for a in args]
    args[index] = torch.empty_like(args[index], device="meta")
    if (op, name) in NOT_READ:
        getattr(torch.ops.tfgrads, op)(*args, **kwargs)  # accepted: never read
        return
    # "argument 'scale' is on meta but 'x' is on cpu" (or, for the reference argument itself,
    # "argument 'y_backprop' is on cpu but 'x' is on meta"): the faulty argument is named.
    with pytest.raises(RuntimeError, match=r"argument '\w+' is on \w+ but '\w+' is on") as e:
        getattr(torch.ops.tfgrads, op)(*args, **kwargs)
    assert f"'{name}' is on meta" in str(e.value), str(e.value)


@pytest.mark.parametrize("name", ["mean", "variance"])
def test_read_statistics_are_checked(name):
    x, s, o = torch.randn(2, 3, 3, 4), torch.ones(4), torch.zeros(4)
    stats = {"mean": torch.zeros(4), "variance": torch.ones(4)}
    stats[name] = stats[name].to("meta")
    with pytest.raises(RuntimeError, match=f"argument '{name}' is on meta but 'x' is on cpu"):
        torch.ops.tfgrads.fused_batch_norm_v3(
            x, s, o, stats["mean"], stats["variance"], is_training=False
        )
