"""The Keras side: run a Keras model once and record every layer (needs TensorFlow).

How the intermediate tensors are obtained: each leaf layer's ``call`` is wrapped, for the
duration of one run, by an instance attribute that records what it receives and returns (the
class's ``call`` is untouched; Keras's ``Layer.__call__`` looks ``self.call`` up on the
instance). The model is then run exactly as ``model(x, training=...)`` runs it, so the recorded
tensors are the ones Keras computes, bit for bit, including autocasts and masks; a probe model
(``keras.Model(inputs, [layer.output ...])``) would instead fail on shared layers and nested
models. One persistent ``tf.GradientTape`` over that run gives, from TF's own gradient
functions: d loss / d every layer output, d loss / d every trainable variable, and per call
the vector-Jacobian product back to the call's inputs (``tape.gradient(outputs, inputs,
output_gradients=...)``), which is what an isolated backward of the layer must reproduce.

The wrapper passes the float inputs through ``tf.identity`` before the call, so that the
gradient reaching them is this call's alone (where one input also reaches the call through
another, as in a residual ``Add``, ``tape.gradient`` would otherwise give the total derivative),
and passes every float output through ``tf.identity`` too, so that each output position has its
own gradient (an output may be an input, as Dropout's in inference, or also feed another output,
as a Bidirectional RNN's last state feeds its sequence output). Identities change no value; the
torch side does the same with ``view_as``.

Example (needs TensorFlow)::

    import torch_tfgrads.diff as D
    rec = D.record(keras_model, x, "recording.npz")       # x: a numpy array (or a list)
"""

from __future__ import annotations

import os
from collections import defaultdict

import numpy as np

from .recording import SUFFIXES, CallRecord, Recording, WeightRecord

_FLOATS = ("float16", "bfloat16", "float32", "float64")


def _import_keras():
    """TensorFlow on its Eigen path (the reference kernels; see docs/parity.md), then Keras."""
    from ..parity._tf import TFUnavailable, import_tf

    try:
        tf = import_tf()
    except TFUnavailable as e:
        raise ImportError(
            f"record: needs TensorFlow ({e}); record where TensorFlow is installed and run "
            "compare on the saved recording elsewhere"
        ) from e
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    import keras

    if keras.backend.backend() != "tensorflow":
        raise RuntimeError(
            f"record: Keras runs on the {keras.backend.backend()!r} backend; set "
            "KERAS_BACKEND=tensorflow before Keras is first imported"
        )
    return tf, keras


def _is_graph_model(keras, op) -> bool:
    from keras.src.models.functional import Functional

    return isinstance(op, (Functional, keras.Sequential))


def leaf_layers(keras, model, prefix: str = ""):
    """[(path, operation)] of every leaf layer/operation of a Keras model; nested Functional and
    Sequential models are flattened into their layers, with paths joined by "/"."""
    if isinstance(model, keras.Sequential):
        ops = model.layers
    elif _is_graph_model(keras, model):
        ops = model.operations
    else:  # a subclassed model: its layers, recorded in the order they run
        ops = model.layers
    out, seen = [], set()
    for op in ops:
        if isinstance(op, keras.layers.InputLayer) or id(op) in seen:
            continue
        seen.add(id(op))
        path = prefix + op.name
        if _is_graph_model(keras, op):
            out += leaf_layers(keras, op, path + "/")
        else:
            out.append((path, op))
    return out


def _retype(obj):
    """A serialized Keras config with every float dtype (policy) replaced by float64."""
    if isinstance(obj, dict):
        out = {k: _retype(v) for k, v in obj.items()}
        if obj.get("class_name") in ("DTypePolicy", "FloatDTypePolicy"):
            name = obj.get("config", {}).get("name", "")
            if name in _FLOATS or str(name).startswith("mixed_"):
                out["config"] = {**obj["config"], "name": "float64"}
        if isinstance(obj.get("dtype"), str) and obj["dtype"] in _FLOATS:
            out["dtype"] = "float64"
        return out
    if isinstance(obj, list):
        return [_retype(v) for v in obj]
    return obj


def as_float64(keras, model):
    """A float64 copy of a Functional/Sequential Keras model, weights cast to float64."""
    config = _retype(keras.saving.serialize_keras_object(model))
    copy = keras.saving.deserialize_keras_object(config)
    copy.set_weights(
        [
            w.astype(np.float64) if np.issubdtype(w.dtype, np.floating) else w
            for w in model.get_weights()
        ]
    )
    return copy


def _flat_tensors(tf, args, kwargs):
    """The tensor arguments of a call: positional ones first, then keyword ones by name."""
    flat = tf.nest.flatten(args) + [t for k in sorted(kwargs) for t in tf.nest.flatten(kwargs[k])]
    return [t for t in flat if tf.is_tensor(t) or isinstance(t, tf.Variable)]


def _is_float(t) -> bool:
    return t.dtype.name in _FLOATS


def _np(tf, t) -> np.ndarray:
    t = tf.convert_to_tensor(t)  # IndexedSlices (Embedding's gradient) -> dense
    if t.dtype.name == "bfloat16":
        t = tf.cast(t, "float32")
    return np.asarray(t.numpy())


def _relative_name(var, layer_name: str) -> str:
    parts = var.path.split("/")
    if layer_name in parts[:-1]:
        return "/".join(parts[parts.index(layer_name) + 1 :])
    return var.name


def _as_list(inputs, names, what):
    if isinstance(inputs, dict):
        missing = [n for n in names if n not in inputs]
        if missing:
            raise ValueError(f"record: argument '{what}' lacks the model inputs {missing}")
        return [np.asarray(inputs[n]) for n in names]
    if isinstance(inputs, (list, tuple)):
        return [np.asarray(x) for x in inputs]
    return [np.asarray(inputs)]


class _Call:
    """What the wrapper of one layer saw during the run."""

    def __init__(self, path, op, ins, outs, before, after):
        self.path, self.op, self.ins, self.outs = path, op, ins, outs
        self.before, self.after = before, after


def _wrap(tf, path, op, calls):
    from keras.src.backend import get_keras_mask, set_keras_mask

    original = op.call

    def fresh(t):
        if not (tf.is_tensor(t) and _is_float(t)):
            return t
        new = tf.identity(t)
        mask = get_keras_mask(t)
        if mask is not None:  # some layers read their input's mask inside call
            set_keras_mask(new, mask)
        return new

    def call(*args, **kwargs):
        # Fresh (tf.identity) float inputs: the gradient that reaches them is then this call's
        # alone, even where one input also feeds another (a residual Add, x * f(x)).
        args, kwargs = tf.nest.map_structure(fresh, (args, kwargs))
        ins = _flat_tensors(tf, args, kwargs)
        state = getattr(op, "non_trainable_weights", [])
        before = [np.array(v.numpy()) for v in state]
        out = original(*args, **kwargs)
        # every output position gets its own tensor, and so the gradient of what its consumers
        # do with it: an output may be an input (Dropout in inference), be returned twice or
        # also feed another output (an RNN's last state is its last output, concatenated)
        out = tf.nest.map_structure(fresh, out)
        after = [np.array(v.numpy()) for v in state]
        calls.append(_Call(path, op, ins, _flat_tensors(tf, out, {}), before, after))
        return out

    op.__dict__["call"] = call  # an instance attribute shadows the class's method


def record(
    keras_model,
    inputs,
    path=None,
    *,
    targets=None,
    loss=None,
    training: bool = True,
    float64: bool = False,
    seed: int = 0,
) -> Recording:
    """Run ``keras_model`` once under a GradientTape and record every layer.

    Args:
        keras_model: a Keras 3 model on the TensorFlow backend (Functional or Sequential;
            nested models are flattened, their layers named ``outer/inner``).
        inputs: a numpy array, a list of arrays (one per model input) or a dict by input name;
            cast to the model inputs' dtypes.
        path: where to write the recording (``.npz``, or ``.h5``/``.hdf5`` with h5py); None
            keeps it in memory only.
        targets: arrays passed to ``loss`` as ``y_true`` (recorded).
        loss: ``loss(y_true, y_pred) -> scalar`` in TF/Keras (e.g.
            ``keras.losses.SparseCategoricalCrossentropy()``); ``y_pred`` is the output tensor
            (a list for several outputs). Default: ``sum(output * seed)`` over the outputs, with
            seed tensors drawn from ``numpy.random.default_rng(seed)`` (recorded; the
            gradient at the outputs is then exactly the seed).
        training: run in training mode (batch statistics; moving statistics updated and
            recorded, then restored: the Keras model is left as it was).
        float64: record a float64 copy of the model (its weights cast exactly), for
            ``compare(..., float64=True)``.

    Returns the :class:`Recording` (also written to ``path`` if given).
    """
    if path is not None:
        path = os.fspath(path)
        if not path.lower().endswith(SUFFIXES):
            raise ValueError(
                f"record: argument 'path' must end with {', '.join(SUFFIXES)}, got {path!r}"
            )
    if not isinstance(training, bool):
        raise ValueError(f"record: argument 'training' must be True or False, got {training!r}")
    if loss is not None and not callable(loss):
        raise ValueError(f"record: argument 'loss' must be callable, got {type(loss).__name__}")
    tf, keras = _import_keras()
    if not isinstance(keras_model, keras.Model):
        raise ValueError(
            f"record: argument 'keras_model' must be a keras.Model, got "
            f"{type(keras_model).__name__}"
        )
    model = as_float64(keras, keras_model) if float64 else keras_model
    names = [t.name for t in model.inputs]
    xs = _as_list(inputs, names, "inputs")
    if len(xs) != len(model.inputs):
        raise ValueError(
            f"record: argument 'inputs': the model has {len(model.inputs)} inputs {names}, got "
            f"{len(xs)} arrays"
        )
    xs = [
        x.astype(np.float64 if float64 and np.issubdtype(x.dtype, np.floating) else t.dtype)
        for x, t in zip(xs, model.inputs)
    ]
    ys = [] if targets is None else _as_list(targets, [t.name for t in model.outputs], "targets")
    if float64:
        ys = [y.astype(np.float64) if np.issubdtype(y.dtype, np.floating) else y for y in ys]

    leaves = leaf_layers(keras, model)
    calls: list[_Call] = []
    initial = {
        id(v): (v, np.array(v.numpy()))
        for _, op in leaves
        for v in getattr(op, "non_trainable_weights", [])
    }
    for lpath, op in leaves:
        _wrap(tf, lpath, op, calls)
    try:
        with tf.GradientTape(persistent=True) as tape:
            tx = [tf.constant(x) for x in xs]
            for t in tx:
                if _is_float(t):
                    tape.watch(t)
            outs = model(tx if len(tx) > 1 else tx[0], training=training)
            # the loss sees its own copies of the outputs: the gradient recorded at an output
            # is then the loss's alone (not also what flows into it from a later output)
            outs = [tf.identity(o) for o in tf.nest.flatten(outs)]
            if loss is None:
                rng = np.random.default_rng(seed)
                seeds = [
                    rng.standard_normal(tuple(o.shape)).astype(o.dtype.name)
                    if _is_float(o)
                    else None
                    for o in outs
                ]
                loss_value = tf.add_n(
                    [tf.reduce_sum(o * s) for o, s in zip(outs, seeds) if s is not None]
                )
            else:
                seeds = []
                y_true = [tf.constant(y) for y in ys]
                loss_value = loss(
                    y_true[0] if len(y_true) == 1 else (y_true or None),
                    outs[0] if len(outs) == 1 else outs,
                )
                if tuple(loss_value.shape) != ():
                    raise RuntimeError(
                        f"record: the loss returned a tensor of shape {list(loss_value.shape)}; "
                        "it must return a scalar"
                    )
    finally:
        for _, op in leaves:
            op.__dict__.pop("call", None)
        for v, value in initial.values():  # leave the model as it was
            v.assign(value)
    return _build(
        tf, keras, model, tape, calls, tx, ys, outs, seeds, loss, loss_value, training, path
    )


def _build(tf, keras, model, tape, calls, tx, ys, outs, seeds, loss, loss_value, training, path):
    import torch_tfgrads

    zero = tf.UnconnectedGradients.ZERO
    float_outs = [t for c in calls for t in c.outs if _is_float(t)]
    weights = [
        v
        for c in {id(c.op): c for c in calls}.values()
        for v in getattr(c.op, "trainable_weights", [])
    ]
    weights = list({id(v): v for v in weights}.values())
    model_float_outs = [o for o in outs if _is_float(o)]
    grads = tape.gradient(
        loss_value, float_outs + model_float_outs + weights, unconnected_gradients=zero
    )
    n_out = len(float_outs)
    out_grad = {id(t): g for t, g in zip(float_outs, grads[:n_out])}
    top_grads = grads[n_out : n_out + len(model_float_outs)]
    w_grad = {id(v): g for v, g in zip(weights, grads[n_out + len(model_float_outs) :])}

    dtype = next((o.dtype.name for o in outs if _is_float(o)), keras.config.floatx())
    rec = Recording.empty(dtype=dtype, training=training)
    rec.meta["model"] = {"name": model.name, "class_name": type(model).__name__}
    rec.meta["versions"] = {
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "numpy": np.__version__,
        "torch_tfgrads": torch_tfgrads.__version__,
    }
    rec.meta["inputs"] = [rec.add(_np(tf, t)) for t in tx]
    rec.meta["targets"] = [rec.add(y) for y in ys]
    rec.meta["outputs"] = [rec.add(_np(tf, o)) for o in outs]
    top = iter(top_grads)
    rec.meta["output_grads"] = [rec.add(_np(tf, next(top))) if _is_float(o) else None for o in outs]
    rec.meta["seeds"] = [rec.add(s) if s is not None else None for s in seeds]
    rec.meta["loss"] = {
        "kind": "seed" if loss is None else "custom",
        "description": "sum(output * seed)" if loss is None else _describe(loss),
        "value": rec.add(_np(tf, loss_value)),
    }

    n_calls = defaultdict(int)
    for c in calls:
        n_calls[c.path] += 1
    seen = defaultdict(int)
    shared_keys: dict[int, str] = {}  # one array per weight value / total gradient

    def key_of(obj_id, make):
        if obj_id not in shared_keys:
            shared_keys[obj_id] = make()
        return shared_keys[obj_id]

    for c in calls:
        k = seen[c.path]
        seen[c.path] += 1
        dys = [out_grad.get(id(t)) if _is_float(t) else None for t in c.outs]
        float_pairs = [(t, g) for t, g in zip(c.outs, dys) if g is not None]
        f_ins = [t for t in c.ins if _is_float(t)]
        layer_w = list(getattr(c.op, "trainable_weights", []))
        vjp_in, vjp_w = [], []
        if float_pairs and (f_ins or (layer_w and n_calls[c.path] > 1)):
            sources = f_ins + (layer_w if n_calls[c.path] > 1 else [])
            vjp = tape.gradient(
                [t for t, _ in float_pairs],
                sources,
                output_gradients=[g for _, g in float_pairs],
                unconnected_gradients=zero,
            )
            vjp_in, vjp_w = vjp[: len(f_ins)], vjp[len(f_ins) :]
        it_in = iter(vjp_in)
        input_grads = [
            (rec.add(_np(tf, next(it_in))) if vjp_in else None) if _is_float(t) else None
            for t in c.ins
        ]
        call_w = {id(v): g for v, g in zip(layer_w, vjp_w)}
        state = list(getattr(c.op, "non_trainable_weights", []))
        before = {id(v): b for v, b in zip(state, c.before)}
        after = {id(v): a for v, a in zip(state, c.after)}
        wrecs = []
        for v in getattr(c.op, "weights", []):
            if id(v) in before:
                value, aft = rec.add(before[id(v)]), rec.add(after[id(v)])
            else:
                value = key_of(("v", id(v)), lambda v=v: rec.add(_np(tf, v)))
                aft = None
            grad = None
            if id(v) in w_grad:
                grad = key_of(("g", id(v)), lambda v=v: rec.add(_np(tf, w_grad[id(v)])))
            cg = rec.add(_np(tf, call_w[id(v)])) if id(v) in call_w else None
            wrecs.append(
                WeightRecord(_relative_name(v, c.op.name), bool(v.trainable), value, grad, cg, aft)
            )
        names = [w.name for w in wrecs]
        for i, w in enumerate(wrecs):  # never two weights of one name
            if names.count(w.name) > 1:
                w.name = f"{w.name}#{names[:i].count(w.name)}"
        rec.add_call(
            CallRecord(
                id=c.path if k == 0 else f"{c.path}#{k}",
                layer=c.path,
                class_name=type(c.op).__name__,
                index=k,
                inputs=[rec.add(_np(tf, t)) for t in c.ins],
                outputs=[rec.add(_np(tf, t)) for t in c.outs],
                output_grads=[rec.add(_np(tf, g)) if g is not None else None for g in dys],
                input_grads=input_grads,
                weights=wrecs,
            )
        )
    del tape
    if path is not None:
        rec.save(path)
    return rec


def _describe(loss) -> str:
    name = getattr(loss, "name", None) or getattr(loss, "__name__", None)
    return f"{type(loss).__name__}({name})" if name else type(loss).__name__
