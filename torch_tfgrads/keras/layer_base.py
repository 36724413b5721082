"""What every Keras layer converter shares: the conversion context, TF's SAME padding, weight
assignment by Keras variable name, and the base module classes."""

import math

import numpy as np
import torch

from .archive import KerasLoadError


class Context:
    """What a converter knows besides the layer config: its name, the arrays, the Keras version."""

    def __init__(self, name, class_name, arrays, keras_version):
        self.name, self.class_name, self.arrays = name, class_name, arrays
        self.keras_version = keras_version

    @property
    def keras_major(self):
        try:
            return int(str(self.keras_version).split(".")[0])
        except ValueError:
            return 3

    def fail(self, msg):
        return KerasLoadError(f"layer {self.name!r} ({self.class_name}): {msg}")

    def take(self, names):
        """The arrays, checked against the variable names the layer must have."""
        if len(self.arrays) != len(names):
            raise self.fail(
                f"expects {len(names)} weights ({', '.join(names) or 'none'}), the "
                f"file has {len(self.arrays)} for it; the file does not match its "
                "config (save the model again, or load weights saved from this model)"
            )
        return list(self.arrays)

    def refuse_options(self, cfg, **allowed):
        for key, ok in allowed.items():
            if key in cfg and cfg[key] is not None and not ok(cfg[key]):
                raise self.fail(f"{key}={cfg[key]!r} is not supported")


def _tuple(v, n):
    if isinstance(v, int):
        return (v,) * n
    return tuple(int(i) for i in v)


def _same_pads(sizes, kernel, strides, dilation):
    """TF SAME padding per spatial dim: total = max((ceil(in/s)-1)*s + (k-1)*d + 1 - in, 0),
    the odd pixel at the end."""
    pads = []
    for n, k, s, d in zip(sizes, kernel, strides, dilation):
        total = max((math.ceil(n / s) - 1) * s + (k - 1) * d + 1 - n, 0)
        pads.append((total // 2, total - total // 2))
    return pads


def _torch_pad(pads):
    """F.pad's argument for channels-first spatial dims, last dim first."""
    out = []
    for before, after in reversed(pads):
        out += [before, after]
    return out


def _param(array):
    return torch.nn.Parameter(torch.from_numpy(array.copy()))


def keras_tensors(module):
    """[(name, tensor)] of a converted layer in Keras's variable order; a wrapper layer (e.g.
    Bidirectional) lists its ``keras_sublayers``' variables under their attribute names."""
    subs = getattr(module, "keras_sublayers", ())
    if subs:
        return [(f"{sub}.{n}", t) for sub in subs for n, t in keras_tensors(getattr(module, sub))]
    return [(n, getattr(module, n)) for n in getattr(module, "keras_variables", ())]


# Layer classes the graph and weight readers treat specially. MASK_CONSUMERS: those whose
# Keras call takes the mask (Keras passes it; the converted module uses it).
MASK_CONSUMERS = (
    "LSTM",
    "GRU",
    "SimpleRNN",
    "Bidirectional",
    "TimeDistributed",
    "BatchNormalization",
    "GlobalAveragePooling1D",
)
CELL_LAYERS = ("LSTM", "GRU", "SimpleRNN")
MODEL_CLASSES = ("Functional", "Sequential", "Model")


def assign(module, arrays, layer):
    """Copy Keras arrays into the layer's variables, every shape checked first."""
    pairs = keras_tensors(module)
    names = [n for n, _ in pairs]
    if len(names) != len(arrays):
        raise KerasLoadError(
            f"layer {layer!r}: expects {len(names)} weights "
            f"({', '.join(names) or 'none'}), got {len(arrays)}"
        )
    targets = [t for _, t in pairs]
    for n, t, a in zip(names, targets, arrays):
        if tuple(t.shape) != tuple(a.shape):
            raise KerasLoadError(
                f"layer {layer!r}: weight {n!r} must have shape {list(t.shape)}"
                f", the file has {list(a.shape)}"
            )
    with torch.no_grad():
        for t, a in zip(targets, arrays):
            t.copy_(torch.from_numpy(np.array(a)))  # (ascontiguousarray makes 0-d 1-d)


class KerasLayer(torch.nn.Module):
    """Base: ``keras_variables`` names the attributes in Keras's variable order."""

    keras_variables: tuple = ()

    def __init__(self, keras_class):
        super().__init__()
        self.keras_class = keras_class

    def set_trainable(self, trainable):
        if not trainable:
            for p in self.parameters(recurse=False):
                p.requires_grad_(False)


class _Renamed:
    """Mixin for subclasses of this library's modules: expose parameters/buffers under Keras's
    variable names (what ``state_dict`` and ``named_parameters`` show) while the inherited code
    keeps reaching them under its own names."""

    def _rename(self, pairs):
        aliases = {}
        for old, new in pairs:
            if old == new:
                continue
            for store in ("_parameters", "_buffers"):
                d = self.__dict__[store]
                if old in d:
                    d[new] = d.pop(old)
                    aliases[old] = (store, new)
        self.__dict__["_keras_aliases"] = aliases

    def __getattr__(self, name):
        alias = self.__dict__.get("_keras_aliases", {}).get(name)
        if alias is not None:
            store = self.__dict__.get(alias[0])
            if store is not None and alias[1] in store:
                return store[alias[1]]
        return super().__getattr__(name)
