"""One converted Keras layer from its config alone: what the PyTorch source that
``python -m torch_tfgrads convert --source`` writes (keras/source.py) calls in ``__init__``."""

import numpy as np
import torch

from .archive import KerasLoadError
from .layers import CONVERTERS, MODEL_CLASSES, Context, assign, keras_tensors

#: The Keras major version a layer is built for unless told (it only changes layers written by
#: Keras 2: its hard_sigmoid, its batch-norm variance rule, DepthwiseConv2D's kernel name).
DEFAULT_KERAS_VERSION = 3


def variable_dtype(dtype) -> str:
    """The dtype of a layer's variables from Keras's ``dtype`` config: a dtype name, a policy
    name (``"mixed_float16"`` keeps float32 variables) or a serialized DTypePolicy."""
    if isinstance(dtype, dict):  # {"class_name": "DTypePolicy", "config": {"name": ...}}
        dtype = dtype.get("config", {}).get("name")
    if dtype is None:
        return "float32"
    if isinstance(dtype, torch.dtype):
        return str(dtype).removeprefix("torch.")
    name = str(dtype)
    return "float32" if name.startswith("mixed_") else name


def _zeros(spec, dtype, class_name):
    # a spec is a shape, or (shape, dtype) for a variable of another dtype than the layer's
    # (Normalization's int64 `count`)
    if isinstance(spec, (list, tuple)) and len(spec) == 2 and isinstance(spec[1], str):
        spec, dtype = spec
    shape = (spec,) if isinstance(spec, int) else tuple(spec)
    if not all(isinstance(d, int) and d >= 0 for d in shape):
        raise TypeError(f"layer({class_name!r}): {spec!r} is not a weight shape")
    return np.zeros(shape, dtype=np.dtype(dtype))


def layer(
    class_name: str,
    /,
    shapes: dict | list | tuple = (),
    *,
    keras_version: int | str = DEFAULT_KERAS_VERSION,
    **config,
) -> torch.nn.Module:
    """The module :func:`load_model` makes for a Keras layer, with zero weights.

    Args:
        class_name: the Keras layer class (``"Conv2D"``, ``"BatchNormalization"``, ...; see
            ``SUPPORTED_LAYERS``; nested models are classes of the generated source instead).
        shapes: the weights' shapes, ``{keras variable name: shape}`` in Keras's order (checked
            against the names the layer has, e.g. ``{"kernel": (3, 3, 8, 16), "bias": (16,)}``),
            or a list of shapes. A shape may be ``(shape, "int64")`` for a variable whose dtype
            is not the layer's.
        keras_version: the Keras that wrote the file, where it changes the layer (2 or 3).
        **config: the layer's Keras config (``padding="same"``, ``activation="relu"``,
            ``dtype="float64"``, ``trainable=False``, ...): what Keras's ``get_config()`` gives;
            keys the conversion does not use are ignored, as in :func:`load_model`.

    The weights are zeros: load a ``state_dict`` (Keras's variable names) into the module, or
    into the model holding it. Raises :class:`KerasLoadError` for what ``load_model`` refuses.
    """
    if class_name in MODEL_CLASSES:
        raise TypeError(
            f"layer({class_name!r}): a nested model is a class of its own in the generated "
            "source, not a layer"
        )
    converter = CONVERTERS.get(class_name)
    if converter is None:
        raise KerasLoadError(
            f"layer({class_name!r}): not a supported layer class; supported: "
            f"{', '.join(sorted(CONVERTERS))}"
        )
    dtype = variable_dtype(config.get("dtype"))
    names = list(shapes) if isinstance(shapes, dict) else None
    specs = list(shapes.values()) if isinstance(shapes, dict) else list(shapes)
    arrays = [_zeros(s, dtype, class_name) for s in specs]
    name = config.get("name") or class_name
    module = converter(config, Context(name, class_name, arrays, keras_version))
    assign(module, arrays, name)  # the count and every shape, as load_model checks them
    got = [n for n, _ in keras_tensors(module)]
    if names is not None and names != got:
        raise KerasLoadError(
            f"layer {name!r} ({class_name}): the shapes name the weights {names}; the layer "
            f"has {got}"
        )
    if not config.get("trainable", True):
        module.set_trainable(False)
    return module
