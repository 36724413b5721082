"""Keras `.keras` / `.h5` models as PyTorch modules, without TensorFlow or Keras installed.

    model = torch_tfgrads.keras.load_model("model.keras")   # or a legacy "model.h5"
    y = model(x)                                             # channels last, like Keras
    torch_tfgrads.keras.load_weights(model, "other.weights.h5")
    torch_tfgrads.keras.load_weights(model, "ckpt/ckpt-1")   # a TF checkpoint, without TF

Needs h5py (``pip install 'torch_tfgrads[keras]'``). See docs/keras.md for the supported layers,
their tolerances and what differs from Keras.
"""

from .archive import KerasLoadError, read_file
from .builder import layer
from .graph import KerasModel, build_model, check_supported
from .layers import CONVERTERS, MODEL_CLASSES, assign, keras_tensors
from .losses import binary_crossentropy, categorical_crossentropy, sparse_categorical_crossentropy
from .optim import KerasAdam, KerasAdamW, KerasRMSprop, KerasSGD
from .source import model_source, write_source
from .weights import read_arrays

#: The Keras layer classes load_model converts (plus nested Functional/Sequential models).
SUPPORTED_LAYERS = tuple(sorted(CONVERTERS))


def _model_config(kfile):
    config = kfile.config
    if not isinstance(config, dict) or config.get("class_name") not in MODEL_CLASSES:
        cls = config.get("class_name") if isinstance(config, dict) else type(config).__name__
        raise KerasLoadError(
            f"{kfile.path}: the model is a {cls!r}; only Functional and "
            "Sequential models can be converted (a subclassed model has no "
            "graph in its config)"
        )
    return config


def load_model(path, custom_converters=None):
    """Read a Keras model file and return it as a :class:`KerasModel` (an ``nn.Module``).

    Args:
        path: a Keras 3 ``.keras`` archive or a legacy ``.h5`` whole-model file (Keras 2 /
            tf-keras, or Keras 3's ``model.save("x.h5")``).
        custom_converters: optional ``{class_name: fn(config, arrays) -> nn.Module}`` for layer
            classes this package does not convert (custom layers, ``Lambda``): ``config`` is
            the layer's Keras config dict, ``arrays`` its weights as numpy arrays in Keras's
            order. A converter given here also replaces the built-in one for that class.

    Every layer class is checked before anything is built: an unsupported one raises
    :class:`KerasLoadError` naming it, and no partial model is ever returned.
    """
    custom = dict(custom_converters or {})
    kfile = read_file(path)
    try:
        if kfile.kind not in ("keras", "h5"):
            raise KerasLoadError(
                f"{kfile.path}: a weights-only file; build the model with "
                "load_model() from its `.keras`/`.h5` file, then call "
                "load_weights(model, path)"
            )
        config = _model_config(kfile)
        bad = check_supported(config, custom)
        if bad:
            listed = ", ".join(f"{'/'.join(p)!r} ({cls})" for p, cls in bad)
            raise KerasLoadError(
                f"{kfile.path}: unsupported layers: {listed}. Supported: "
                f"{', '.join(SUPPORTED_LAYERS)} and nested Functional/Sequential models. Map "
                "other classes (custom layers, Lambda) with load_model(path, custom_converters="
                "{'ClassName': fn(config, arrays) -> nn.Module})"
            )
        arrays = read_arrays(kfile, config)
        return build_model(config, arrays, kfile.keras_version, custom)
    finally:
        kfile.close()


def _named_layers(model, path=()):
    for name, child in model.named_children():
        if isinstance(child, KerasModel):
            yield from _named_layers(child, path + (name,))
        else:
            yield path + (name,), child


def load_weights(model, path, root=None):
    """Copy the weights of a Keras file or a TF checkpoint into ``model``.

    ``model`` is a :class:`KerasModel` from :func:`load_model`; ``path`` holds the weights of
    the same architecture: a Keras file (``.weights.h5``, ``.keras`` or ``.h5``), or a TF
    checkpoint prefix (``ckpt-1``, its ``.index`` file, or a SavedModel directory) written by
    ``tf.train.Checkpoint(model=keras_model)`` or tf-keras's ``save_weights(..., save_format="tf")``.
    A checkpoint's variables are found through its object graph (see docs/tf_checkpoint.md);
    ``root`` names the model's object in it (e.g. ``"model"``) when that is ambiguous. Every
    weight is matched and its shape checked before any value is copied; a checkpoint is read
    without TensorFlow.
    """
    if not isinstance(model, KerasModel):
        raise TypeError("load_weights: the model must come from torch_tfgrads.keras.load_model")
    from .checkpoint import checkpoint_arrays, is_checkpoint

    if is_checkpoint(path):
        arrays = checkpoint_arrays(model, path, root)
    else:
        if root is not None:
            raise TypeError(f"load_weights: root= applies to TF checkpoints; {path} is not one")
        kfile = read_file(path)
        try:
            arrays = read_arrays(kfile, model.keras_config)
        finally:
            kfile.close()
    for lpath, module in _named_layers(model):  # check every layer before copying anything
        got = arrays.get(lpath, [])
        pairs = keras_tensors(module)
        if len(got) != len(pairs):
            raise KerasLoadError(
                f"layer {'/'.join(lpath)!r}: expects {len(pairs)} weights "
                f"({', '.join(n for n, _ in pairs) or 'none'}), {path} has "
                f"{len(got)}"
            )
        for (n, t), a in zip(pairs, got):
            if tuple(t.shape) != tuple(a.shape):
                raise KerasLoadError(
                    f"layer {'/'.join(lpath)!r}: weight {n!r} has shape "
                    f"{list(t.shape)} in the model, {list(a.shape)} in {path}"
                )
    for lpath, module in _named_layers(model):
        assign(module, arrays.get(lpath, []), "/".join(lpath))
    return model


__all__ = [
    "load_model",
    "load_weights",
    "KerasModel",
    "KerasLoadError",
    "SUPPORTED_LAYERS",
    "layer",
    "model_source",
    "write_source",
    # training like Keras (docs/training.md)
    "KerasAdam",
    "KerasAdamW",
    "KerasRMSprop",
    "KerasSGD",
    "binary_crossentropy",
    "categorical_crossentropy",
    "sparse_categorical_crossentropy",
]
