"""The Keras model graph (Functional or Sequential) as an nn.Module."""

import torch

from .archive import KerasLoadError
from .layers import CONVERTERS, MASK_CONSUMERS, MODEL_CLASSES, Context, assign
from .weights import layer_configs


class Ref:
    """A tensor of the graph: output ``index`` of call ``node`` of layer ``layer``."""

    __slots__ = ("layer", "node", "index")

    def __init__(self, layer, node, index):
        self.layer, self.node, self.index = layer, int(node), int(index)

    def __getstate__(self):
        return (self.layer, self.node, self.index)

    def __setstate__(self, state):
        self.layer, self.node, self.index = state

    def __repr__(self):
        return f"Ref({self.layer!r}, {self.node}, {self.index})"


def _template(obj):
    """A node's arguments with every Keras tensor replaced by a Ref."""
    if isinstance(obj, dict):
        if obj.get("class_name") == "__keras_tensor__":
            return Ref(*obj["config"]["keras_history"])
        return {k: _template(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_template(v) for v in obj]
    return obj


def _refs(obj):
    if isinstance(obj, Ref):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _refs(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _refs(v)


def _parse_node(node, layer):
    """(args, kwargs) of one call, from Keras 3 ({"args", "kwargs"}) or Keras 2 (a list)."""
    if isinstance(node, dict):
        args, kwargs = _template(node.get("args", [])), _template(node.get("kwargs", {}))
    else:  # Keras 2: [[name, node_index, tensor_index, kwargs], ...]
        refs = [Ref(e[0], e[1], e[2]) for e in node]
        args = [refs[0]] if len(refs) == 1 else [refs]
        kwargs = {}
        for e in node:
            if len(e) > 3 and e[3]:
                kwargs.update(_template(e[3]))
    kwargs = {k: v for k, v in kwargs.items() if k != "training" and v is not None}
    if "mask" in kwargs and not isinstance(kwargs["mask"], Ref):
        raise KerasLoadError(f"layer {layer!r} is called with a mask that is not a tensor")
    for k in kwargs:
        if k != "mask":
            raise KerasLoadError(
                f"layer {layer!r} is called with keyword argument {k!r}; not supported"
            )
    # Keras 3 records a mask as a tensor of the graph (e.g. a NotEqual node after an
    # Embedding(mask_zero=True)) passed as mask=...; it is kept as the call's keyword
    return [args, kwargs] if kwargs else args


def _io_refs(spec):
    if spec and isinstance(spec[0], str):
        return [Ref(*spec[:3])], True
    return [Ref(*s[:3]) for s in spec], False


def _resolve(tpl, values):
    if isinstance(tpl, Ref):
        out = values[(tpl.layer, tpl.node)]
        if isinstance(out, (list, tuple)):
            return out[tpl.index]
        if tpl.index != 0:
            raise IndexError(f"{tpl}: the layer has one output")
        return out
    if isinstance(tpl, list):
        return [_resolve(v, values) for v in tpl]
    if isinstance(tpl, dict):
        return {k: _resolve(v, values) for k, v in tpl.items()}
    return tpl


class KerasModel(torch.nn.Module):
    """A converted Keras model: one submodule per Keras layer, named like it.

    ``forward`` takes the model's inputs (channels last, as Keras) positionally or as one list,
    runs the layers in the order of the Keras graph, and returns one tensor or a list (several
    outputs). ``train()``/``eval()`` are Keras's ``training=True/False``.
    ``keras_config`` and ``keras_version`` keep what the file said.
    """

    def __init__(self, model_config, modules, keras_version=None):
        super().__init__()
        self.keras_class = model_config["class_name"]
        self.keras_config = model_config
        self.keras_version = keras_version
        for name, module in modules.items():
            if "." in name or name == "" or (hasattr(self, name) and name not in self._modules):
                raise KerasLoadError(f"layer {name!r}: this name cannot be a submodule name")
            self.add_module(name, module)
        layers = layer_configs(model_config)
        if self.keras_class == "Sequential":
            self._build_sequential(layers)
        else:
            self._build_functional(model_config, layers)

    def _build_sequential(self, layers):
        for n, lc in layers:
            if lc["class_name"] == "Embedding" and lc.get("config", {}).get("mask_zero"):
                raise KerasLoadError(
                    f"layer {n!r} (Embedding): mask_zero=True in a Sequential model is not "
                    "supported (its config does not record the masks); build the model as a "
                    "Functional one"
                )
        names = [n for n, lc in layers]
        first = 1 if layers and layers[0][1]["class_name"] == "InputLayer" else 0
        self.input_refs = [Ref(names[0], 0, 0)] if first else [Ref("__input__", 0, 0)]
        self.single_input = self.single_output = True
        self.step_kwargs = {}
        prev = self.input_refs[0]
        self.steps = []
        for name in names[first:]:
            self.steps.append((name, 0, [prev]))
            prev = Ref(name, 0, 0)
        self.output_refs = [prev]

    def _build_functional(self, model_config, layers):
        cfg = model_config["config"]
        self.step_kwargs = {}
        self.input_refs, self.single_input = _io_refs(cfg["input_layers"])
        self.output_refs, self.single_output = _io_refs(cfg["output_layers"])
        # Keras 3 numbers a nested Functional model's calls from 1 in output_layers (its node 0
        # links its own inputs and outputs) but from 0 in the inbound nodes, as the steps do
        # (Keras 2 counts from 1 in both; weights.legacy_arrays refuses its nested models)
        nested = {n for n, lc in layers if lc["class_name"] in ("Functional", "Model")}
        self.output_refs = [
            Ref(r.layer, r.node - 1, r.index) if r.layer in nested else r for r in self.output_refs
        ]
        pending = []
        for name, lc in layers:
            if lc["class_name"] == "InputLayer":
                continue
            for k, node in enumerate(lc.get("inbound_nodes", [])):
                call = _parse_node(node, name)
                if (
                    isinstance(node, dict)
                    and call is not None
                    and len(call) == 2
                    and isinstance(call[1], dict)
                    and "mask" in call[1]
                ):
                    self.step_kwargs[(name, k)] = True
                pending.append((name, k, call))
        available = {(r.layer, r.node) for r in self.input_refs}
        self.steps = []
        while pending:
            ready = [s for s in pending if all((r.layer, r.node) in available for r in _refs(s[2]))]
            if not ready:
                missing = sorted(
                    {
                        r.layer
                        for s in pending
                        for r in _refs(s[2])
                        if (r.layer, r.node) not in available
                    }
                )
                raise KerasLoadError(
                    f"the graph cannot be ordered: layers "
                    f"{[s[0] for s in pending]} wait for {missing}"
                )
            for s in ready:
                self.steps.append(s)
                available.add((s[0], s[1]))
            pending = [s for s in pending if (s[0], s[1]) not in available]
        for r in self.output_refs:
            if (r.layer, r.node) not in available:
                raise KerasLoadError(f"output {r} is not computed by the graph")
        classes = {n: lc["class_name"] for n, lc in layers}
        for name, node, _call in self.steps:
            if self.step_kwargs.get((name, node)) and classes[name] not in MASK_CONSUMERS:
                raise KerasLoadError(
                    f"layer {name!r} ({classes[name]}) is called with a Keras mask (from an "
                    f"Embedding with mask_zero=True); masks are supported into "
                    f"{', '.join(MASK_CONSUMERS)} only"
                )

    def forward(self, *inputs):
        if len(inputs) == 1 and isinstance(inputs[0], (list, tuple)) and not self.single_input:
            inputs = tuple(inputs[0])
        if len(inputs) == 1 and isinstance(inputs[0], (list, tuple)) and len(inputs[0]) == 1:
            inputs = tuple(inputs[0])
        if len(inputs) != len(self.input_refs):
            raise ValueError(
                f"{self.keras_class} model: expects {len(self.input_refs)} inputs "
                f"({[r.layer for r in self.input_refs]}), got {len(inputs)}"
            )
        values = {(r.layer, r.node): x for r, x in zip(self.input_refs, inputs)}
        for name, node, call in self.steps:
            if self.step_kwargs.get((name, node)):
                args, kwargs = _resolve(call, values)
                values[(name, node)] = getattr(self, name)(*args, **kwargs)
            else:
                values[(name, node)] = getattr(self, name)(*_resolve(call, values))
        outs = [_resolve(r, values) for r in self.output_refs]
        return outs[0] if self.single_output else outs


def custom_converter(layer_config, custom):
    """The user's converter for a layer: by the class name the file records (a legacy `.h5`
    records a registered class as "package>Class", a `.keras` file as "Class"), by its
    ``registered_name``, or by the name after the ">"."""
    cls = layer_config["class_name"]
    for key in (cls, layer_config.get("registered_name"), cls.split(">")[-1]):
        if isinstance(key, str) and key in custom:
            return custom[key]
    return None


def check_supported(model_config, custom, path=()):
    """Every layer class the file uses must have a converter: say which do not, before building."""
    bad = []
    for name, lc in layer_configs(model_config):
        cls = lc["class_name"]
        if cls in MODEL_CLASSES:
            bad += check_supported(lc, custom, path + (name,))
        elif cls not in CONVERTERS and custom_converter(lc, custom) is None:
            bad.append((path + (name,), cls))
    return bad


def build_model(model_config, arrays, keras_version, custom, path=()):
    modules = {}
    for name, lc in layer_configs(model_config):
        cls = lc["class_name"]
        lpath = path + (name,)
        cfg = lc.get("config", {})
        if cls in MODEL_CLASSES:
            if arrays.get(lpath):
                raise KerasLoadError(f"nested model {name!r} has its own variables; not supported")
            modules[name] = build_model(lc, arrays, keras_version, custom, lpath)
            continue
        ctx = Context(name, cls, arrays.get(lpath, []), keras_version)
        user = custom_converter(lc, custom)
        if user is not None:
            module = user(cfg, list(ctx.arrays))
            if not isinstance(module, torch.nn.Module):
                raise KerasLoadError(
                    f"layer {name!r}: the converter given for {cls} returned "
                    f"{type(module).__name__}, not an nn.Module"
                )
        else:
            module = CONVERTERS[cls](cfg, ctx)
            assign(module, ctx.arrays, name)  # checks the shapes against each other
            if not cfg.get("trainable", True):
                module.set_trainable(False)
        modules[name] = module
    return KerasModel(model_config, modules, keras_version)
