"""Which arrays of a Keras file belong to which layer.

`.keras` / `.weights.h5` (Keras 3): the groups are not the layer names. Keras's saver
(`keras/src/saving/saving_lib.py`) walks ``model.layers`` in order and names each layer's group
after the snake_case of its class name, deduplicated with a counter in that order
(``layers/conv2d``, ``layers/conv2d_1``, ...); a nested model's layers sit under its own group
(``layers/functional/layers/dense``). A layer's variables are the datasets ``vars/0..n-1``, in
the order of ``layer.weights`` (trainable variables in creation order, then non-trainable ones).
Recent Keras 3 versions also record the layer's name as the ``name`` attribute of ``vars``; it is
not used: Keras maps weights by path, so a file from another instance of the same architecture
(other automatic names) loads, as in Keras.

Legacy `.h5`: ``model_weights/<layer name>`` with the attribute ``weight_names`` listing the
datasets in ``layer.weights`` order.
"""

import re

from .archive import KerasLoadError, read_dataset
from .layers import CELL_LAYERS, MODEL_CLASSES


def to_snake_case(name):
    """keras.src.utils.naming.to_snake_case."""
    name = re.sub(r"\W+", "", name)
    name = re.sub("(.)([A-Z][a-z]+)", r"\1_\2", name)
    return re.sub("([a-z])([A-Z])", r"\1_\2", name).lower()


def _unique(name, used):
    if name in used:
        used[name] += 1
        return f"{name}_{used[name]}"
    used[name] = 0
    return name


def layer_configs(model_config):
    """The layer configs of a model config, with the name at the top level of each entry."""
    layers = model_config.get("config", {}).get("layers", [])
    out = []
    for lc in layers:
        name = lc.get("name") or lc.get("config", {}).get("name")
        out.append((name, lc))
    return out


def keras3_groups(model_config, names_prefix=(), group_prefix=""):
    """[(layer path (tuple of names), h5 group path)] for every layer, nested models included."""
    used = {}
    out = []
    for name, lc in layer_configs(model_config):
        cls = lc["class_name"]
        path = f"{group_prefix}layers/{_unique(to_snake_case(cls), used)}"
        # a recurrent layer's variables belong to its cell (the saver walks layer.cell); a
        # Bidirectional's to the cells of its forward_layer then backward_layer
        if cls in CELL_LAYERS:
            out.append((names_prefix + (name,), path + "/cell"))
        elif cls == "Bidirectional":
            out.append(
                (
                    names_prefix + (name,),
                    [f"{path}/forward_layer/cell", f"{path}/backward_layer/cell"],
                )
            )
        elif cls == "TimeDistributed":  # the wrapped layer's variables, under "layer"
            out.append((names_prefix + (name,), path + "/layer"))
        else:
            out.append((names_prefix + (name,), path))
        if cls in MODEL_CLASSES:
            out += keras3_groups(lc, names_prefix + (name,), path + "/")
    return out


def keras3_arrays(h5, model_config, source):
    """{layer path: [arrays]} from a Keras 3 weights file."""
    arrays = {}
    for names, paths in keras3_groups(model_config):
        arrays[names] = []
        for path in paths if isinstance(paths, list) else [paths]:
            vars_path = f"{path}/vars"
            if vars_path not in h5:
                continue
            grp = h5[vars_path]
            keys = sorted(grp.keys(), key=lambda k: int(k) if k.isdigit() else -1)
            if keys != [str(i) for i in range(len(keys))]:
                raise KerasLoadError(
                    f"{source}: layer {names[-1]!r}: unexpected datasets {keys} in {vars_path!r}"
                )
            arrays[names] += [read_dataset(grp[k]) for k in keys]
    return arrays


def legacy_arrays(h5, model_config, source):
    """{layer path: [arrays]} from a legacy `.h5` (``model_weights`` or a weights-only file)."""
    root = h5.get("model_weights", h5)
    arrays = {}
    for name, lc in layer_configs(model_config):
        if lc["class_name"] in MODEL_CLASSES:
            raise KerasLoadError(
                f"{source}: layer {name!r} is a nested model; nested models are read from "
                "`.keras` files only (save with model.save('model.keras'))"
            )
        if name not in root:
            arrays[(name,)] = []
            continue
        grp = root[name]
        wnames = [
            w.decode() if isinstance(w, bytes) else str(w)
            for w in grp.attrs.get("weight_names", [])
        ]
        try:
            arrays[(name,)] = [read_dataset(grp[w]) for w in wnames]
        except KeyError as e:
            raise KerasLoadError(
                f"{source}: layer {name!r}: weight {e} listed in weight_names "
                "is missing from the file"
            ) from None
    return arrays


def read_arrays(kfile, model_config):
    if kfile.kind in ("keras", "weights"):
        return keras3_arrays(kfile.h5, model_config, kfile.path)
    return legacy_arrays(kfile.h5, model_config, kfile.path)
