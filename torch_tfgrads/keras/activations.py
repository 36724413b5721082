"""Keras 3 activation functions (TF backend) in torch, with TF's gradients.

Each entry computes what `keras.activations.<name>` computes on the TensorFlow backend, in the
same order of operations where the rounding depends on it; the gradient rules match TF's at the
kinks (relu6 and hard_sigmoid use `F.hardtanh`, whose gradient is 0 at both boundaries, as TF's
Relu6Grad; `clamp` would pass the gradient there).
"""

import torch
import torch.nn.functional as F


def _relu6(x):
    return F.hardtanh(x, 0.0, 6.0)


def hard_sigmoid(x):
    # keras 3: relu6(x + 3) / 6 (Keras 2 used the slope 0.2 instead: a different function)
    return _relu6(x + 3.0) / 6.0


def hard_sigmoid_keras2(x):
    # tf-keras (Keras 2): clip(0.2 * x + 0.5, 0, 1), tf.clip_by_value's gradient (as clamp's)
    return torch.clamp(x * 0.2 + 0.5, 0.0, 1.0)


def gelu(x):
    # tf.nn.gelu(approximate=False): erfc keeps the precision for large negative x that
    # 1 + erf(...) (torch's F.gelu) loses
    return 0.5 * x * torch.special.erfc(-x * 0.7071067811865476)


def gelu_tanh(x):
    # tf.nn.gelu(approximate=True), TF's order of operations
    return 0.5 * x * (1.0 + torch.tanh(0.7978845608028654 * (x + 0.044715 * torch.pow(x, 3))))


ACTIVATIONS = {
    "linear": lambda x: x,
    "relu": F.relu,
    "relu6": _relu6,
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "softmax": lambda x: torch.softmax(x, dim=-1),
    "log_softmax": lambda x: torch.log_softmax(x, dim=-1),
    "swish": F.silu,
    "silu": F.silu,
    "gelu": gelu,  # keras.activations.gelu: approximate=False by default
    "elu": F.elu,
    "selu": F.selu,
    "softplus": F.softplus,
    "softsign": F.softsign,
    "exponential": torch.exp,
    "leaky_relu": lambda x: F.leaky_relu(x, 0.2),
    "hard_sigmoid": hard_sigmoid,
    "hard_sigmoid_keras2": hard_sigmoid_keras2,
    "hard_silu": lambda x: x * hard_sigmoid(x),
    "hard_swish": lambda x: x * hard_sigmoid(x),
    "mish": lambda x: x * torch.tanh(F.softplus(x)),
}


def activation_name(spec):
    """The activation's name from a Keras config entry (a string or a serialized function)."""
    if spec is None:
        return "linear"
    if isinstance(spec, str):
        return spec
    if isinstance(spec, dict):
        cfg = spec.get("config")
        if isinstance(cfg, str):
            return cfg
        if isinstance(spec.get("registered_name"), str):
            return spec["registered_name"]
        if isinstance(spec.get("class_name"), str) and spec["class_name"] != "function":
            return spec["class_name"]
    return repr(spec)


def check_activation(spec, layer, keras_major=3):
    """The activation's name, refused by name if unsupported (modules store names, so pickle).
    Files written by Keras 2 get its hard_sigmoid, which is another function."""
    from .archive import KerasLoadError

    name = activation_name(spec)
    if name == "hard_sigmoid" and keras_major < 3:
        return "hard_sigmoid_keras2"
    if name in ACTIVATIONS:
        return name
    else:
        raise KerasLoadError(
            f"layer {layer!r}: activation {name!r} is not supported; supported: "
            f"{', '.join(sorted(ACTIVATIONS))}"
        ) from None


__all__ = ["ACTIVATIONS", "check_activation", "hard_sigmoid"]
