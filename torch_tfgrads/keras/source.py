"""A converted Keras model as readable PyTorch source: ``python -m torch_tfgrads convert model.keras
--source model.py`` writes ``model.py`` and its weights, ``model.weights.pt``.

The source defines one ``torch.nn.Module`` class per model (nested models are classes of their
own, so that the ``state_dict`` keys are the converted module's: ``inner.dense.kernel``). Its
``__init__`` builds each layer with :func:`torch_tfgrads.keras.layer` from the part of the Keras
config that changes the module, found by building it without each key; ``forward`` is the
Keras graph as straight-line code, one layer call per statement, read from the converted
module's steps (the graph's data, not a second reading of the file). Every layer is checked to
build into the module ``load_model`` made (same class, same weights' names, shapes and dtypes)
before a line is written; the tests check that the source computes bit for bit what the
converted module computes.
"""

import copy
import keyword
import re
import textwrap
from pathlib import Path

import numpy as np
import torch

from .._version import __version__
from .archive import KerasLoadError
from .builder import DEFAULT_KERAS_VERSION, layer, variable_dtype
from .graph import KerasModel, Ref, _refs
from .layers import keras_tensors
from .source_format import Atom, Brackets, call, lines, literal, string
from .weights import layer_configs

_MODULE_INTERNALS = frozenset(vars(torch.nn.Module()))
# Config keys dropped without the builds that would prove them irrelevant: dtype is written
# from the weights; initializers, regularizers and constraints act in Keras's training only.
_NOISE = re.compile(r"dtype|.*_(initializer|regularizer|constraint)")
_BODY = "        "  # the indentation of a method's body


def _same(a, b, values):
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and (a.dtype, a.shape, a.requires_grad) == (b.dtype, b.shape, b.requires_grad)
            and (not values or torch.equal(a, b))
        )
    if isinstance(a, torch.nn.Module) or isinstance(b, torch.nn.Module):
        return _same_module(a, b, values)
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return type(a) is type(b) and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, (list, tuple)):
        return (
            type(a) is type(b)
            and len(a) == len(b)
            and all(_same(x, y, values) for x, y in zip(a, b))
        )
    if isinstance(a, dict):
        return (
            isinstance(b, dict) and list(a) == list(b) and all(_same(a[k], b[k], values) for k in a)
        )
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:  # an object whose == is not a truth value
        return a is b


def _same_module(a, b, values, attrs=True):
    """Same class, same parameters and buffers (names, dtypes, shapes; values if ``values``), and
    with ``attrs`` the same other attributes, submodules included: what makes two converted
    layers compute the same function of the same weights."""
    if not isinstance(a, torch.nn.Module) or type(a) is not type(b):
        return False
    for store in ("_parameters", "_buffers", "_modules"):
        da, db = a.__dict__[store], b.__dict__[store]
        if list(da) != list(db):
            return False
        for k in da:
            x, y = da[k], db[k]
            if store == "_modules" and not _same_module(x, y, values, attrs):
                return False
            if store != "_modules" and not _same(x, y, values):
                return False
    if not attrs:
        return True
    if a._non_persistent_buffers_set != b._non_persistent_buffers_set:
        return False
    ka = {k: v for k, v in vars(a).items() if k not in _MODULE_INTERNALS}
    kb = {k: v for k, v in vars(b).items() if k not in _MODULE_INTERNALS}
    return _same(ka, kb, values)


def _prune(d, rebuild, ref):
    """Drop from ``d`` (in place; nested dicts too) every key whose absence leaves the built
    module as ``ref``: initializers, regularizers, names, Keras's defaults, keys the
    conversion takes from the weights (units, filters, kernel_size)."""
    for key in list(d):
        before = list(d.items())
        del d[key]
        if not _same_module(rebuild(), ref, values=True):
            d.clear()
            d.update(before)  # (keeps Keras's order of the keys)
    for v in d.values():
        if isinstance(v, dict):
            _prune(v, rebuild, ref)


def _dtype_name(dtype):
    return str(dtype).removeprefix("torch.")


def _layer_call(name, lc, child, keras_version):
    """``layer("Conv2D", padding="same", ..., shapes={...})`` building ``child``."""
    cls = lc["class_name"]
    cfg = {k: v for k, v in lc.get("config", {}).items() if not _NOISE.fullmatch(k)}
    tensors = keras_tensors(child)
    floats = {t.dtype for _, t in tensors if t.is_floating_point()}
    main = floats.pop() if len(floats) == 1 else torch.float32
    shapes = {
        n: tuple(t.shape) if t.dtype == main else (tuple(t.shape), _dtype_name(t.dtype))
        for n, t in tensors
    }
    # the variables' dtype, which Keras's own `dtype` (a policy) says less directly
    dtype = {} if main == torch.float32 else {"dtype": _dtype_name(main)}

    def build(c, version):
        try:
            return layer(cls, shapes, keras_version=version, **c, **dtype)
        except Exception:  # a config without a key the converter needs: the key stays
            return None

    try:
        major = int(str(keras_version).split(".")[0])
    except ValueError:
        major = DEFAULT_KERAS_VERSION
    why = "its source cannot be written"
    try:
        ref = layer(cls, shapes, keras_version=major, **cfg, **dtype)
    except Exception as e:
        raise KerasLoadError(f"layer {name!r} ({cls}): {e}; {why}") from e
    if not _same_module(ref, child, values=False, attrs=False):
        raise KerasLoadError(
            f"layer {name!r} ({cls}): its Keras config does not build the converted module "
            f"(converted by a custom converter, or changed after loading); {why}"
        )
    version = major
    if _same_module(build(cfg, DEFAULT_KERAS_VERSION), ref, values=True):
        version = DEFAULT_KERAS_VERSION
    kept = copy.deepcopy(cfg)
    _prune(kept, lambda: build(kept, version), ref)
    plain = [(k, literal(v)) for k, v in kept.items() if _is_keyword_arg(k)]
    odd = {k: v for k, v in kept.items() if not _is_keyword_arg(k)}
    kwargs = plain + [(k, literal(v)) for k, v in dtype.items()]
    if version != DEFAULT_KERAS_VERSION:
        kwargs.append(("keras_version", Atom(str(version))))
    if shapes:
        kwargs.append(("shapes", literal(shapes)))
    node = call("layer", [Atom(string(cls))], kwargs)
    if odd:  # keys that cannot be keyword arguments (never seen in Keras's own layers)
        node.items.append(("**", literal(odd)))
    return node


def _is_keyword_arg(key):
    return (
        key.isidentifier() and not keyword.iskeyword(key) and key not in ("shapes", "keras_version")
    )


def _attr(name):
    """How the class reaches a layer: ``self.conv1``, or getattr for a name that is no Python
    identifier (the submodule keeps Keras's name, so the state_dict keys stay the same)."""
    if name.isidentifier() and not keyword.iskeyword(name):
        return f"self.{name}"
    return call("getattr", [Atom("self"), Atom(string(name))])


def _camel(name):
    parts = [p for p in re.split(r"[^0-9A-Za-z]+", name) if p]
    out = ""
    for p in parts:
        sep = "_" if out[-1:].isdigit() and p[0].isdigit() else ""
        out += sep + p[0].upper() + p[1:]
    return out if out[:1].isalpha() else "Model" + out


class _Names:
    """Unique Python names: ``base``, ``base_1``, ..."""

    def __init__(self, taken=()):
        self.taken = set(taken)

    def new(self, base):
        name, i = base, 1
        while name in self.taken or keyword.iskeyword(name):
            name, i = f"{base}_{i}", i + 1
        self.taken.add(name)
        return name


def _returns_list(module):
    """Whether a layer returns a list (its outputs are then ``x[i]``), as the graph resolves a
    tensor reference: a multi-output model, a recurrent layer with return_state, a
    Bidirectional with merge_mode=None."""
    if isinstance(module, KerasModel):
        return not module.single_output
    if getattr(module, "return_state", False):
        return True
    # (by attributes: the recurrent modules are this package's nn.Keras* classes or others)
    return getattr(module, "keras_class", None) == "Bidirectional" and module.merge_mode is None


def _check_steps(m):
    # the generator writes the steps (layer, node, call) and mask= keywords; a graph with
    # another kind of step would be written wrong, so it is refused
    for step in m.steps:
        if len(step) != 3:
            raise KerasLoadError(f"{m.keras_class} model: a graph step {step!r} cannot be written")
    for key, v in m.step_kwargs.items():
        if v is not True:
            raise KerasLoadError(f"{m.keras_class} model: step {key} cannot be written")


def _chain(m):
    """The Sequential steps as [(layer, returns a list)], or None if the graph is no chain."""
    if m.keras_class != "Sequential" or m.step_kwargs:
        return None
    out, prev = [], m.input_refs[0]
    for name, node, c in m.steps:
        if (
            len(c) != 1
            or not isinstance(c[0], Ref)
            or (c[0].layer, c[0].node) != (prev.layer, prev.node)
        ):
            return None
        out.append((name, _returns_list(m._modules[name])))
        prev = Ref(name, node, 0)
    return out


def _sequential_forward(m, chain):
    out = ["    def forward(self, x):"]
    for name, as_list in chain:
        node = call(_attr(name), [Atom("x")])
        out += lines("x = ", node, "[0]" if as_list else "", _BODY)
    return out + [f"{_BODY}return x"]


def _var_base(name):
    # cut long names, which would appear twice in `x_name = self.name(`, beyond what a line holds
    return ("x_" + re.sub(r"\W", "_", name))[:32].rstrip("_")


def _functional_forward(m):
    names = _Names({"self"})
    var = {}
    for r in m.input_refs:
        var[(r.layer, r.node)] = names.new(_var_base(r.layer))
    refs = [r for _, _, c in m.steps for r in _refs(c)] + list(m.output_refs)
    used = {(r.layer, r.node) for r in refs}
    as_list = {(r.layer, r.node) for r in refs if r.index}
    for name, node, _ in m.steps:
        var[(name, node)] = names.new(_var_base(name) + (f"_{node}" if node else ""))
        if _returns_list(m._modules[name]):
            as_list.add((name, node))

    def expr(t):
        if isinstance(t, Ref):
            key = (t.layer, t.node)
            if key in as_list:
                return Atom(f"{var[key]}[{t.index}]")
            return Atom(var[key])
        if isinstance(t, list) and t:
            return Brackets("[", [("", expr(x)) for x in t], "]", True)
        if isinstance(t, dict) and t:
            return Brackets("{", [(f"{string(k)}: ", expr(x)) for k, x in t.items()], "}", True)
        return literal(t)

    params = [("", Atom("self"))] + [("", Atom(var[(r.layer, r.node)])) for r in m.input_refs]
    out = lines("", Brackets("def forward(", params, "):", False), "", "    ")
    for name, node, c in m.steps:
        args, kwargs = c if m.step_kwargs.get((name, node)) else (c, {})
        child = m._modules[name]
        if (
            isinstance(child, KerasModel)
            and len(args) == 1
            and isinstance(args[0], list)
            and (not child.single_input or len(args[0]) == 1)
        ):  # a nested model called with one list takes its inputs positionally
            args = args[0]
        node_ = call(
            _attr(name), [expr(a) for a in args], [(k, expr(v)) for k, v in kwargs.items()]
        )
        # a call whose result nothing reads still runs (in training it updates batch norms)
        head = f"{var[(name, node)]} = " if (name, node) in used else ""
        out += lines(head, node_, "", _BODY)
    outs = [expr(r) for r in m.output_refs]
    if m.single_output:
        out += lines("return ", outs[0], "", _BODY)
    else:
        out += lines("return ", Brackets("[", [("", o) for o in outs], "]", True), "", _BODY)
    return out


def _class_lines(m, class_name, classes, class_names, version):
    """The class of one (nested) model, appended to ``classes`` after those of its nested
    models; returns whether it (or a nested class) calls ``layer``."""
    uses_layer = False
    init = []
    for name, lc in layer_configs(m.keras_config):
        if lc["class_name"] == "InputLayer":
            continue  # an identity the forward never calls
        child = m._modules[name]
        if isinstance(child, KerasModel):
            sub = class_names.new(_camel(name) or "Nested")
            uses_layer |= _class_lines(child, sub, classes, class_names, version)
            node = call(sub)
        else:
            node = _layer_call(name, lc, child, version)
            uses_layer = True
        if name.isidentifier() and not keyword.iskeyword(name):
            init += lines(f"self.{name} = ", node, "", _BODY)
        else:
            init += lines("", call("self.add_module", [Atom(string(name)), node]), "", _BODY)
    _check_steps(m)
    chain = _chain(m)
    forward = _sequential_forward(m, chain) if chain is not None else _functional_forward(m)
    doc = f'    """The Keras {m.keras_class} model {string(_model_name(m))}."""'
    classes.append(
        [f"class {class_name}(torch.nn.Module):", doc, "", "    def __init__(self):"]
        + [f"{_BODY}super().__init__()"]
        + init
        + [""]
        + forward
    )
    return uses_layer


def _model_name(m):
    return m.keras_config.get("config", {}).get("name") or m.keras_class


def _input_specs(m):
    """[(shape without the batch, torch dtype name)] of the model's inputs, None if unknown."""
    configs = dict(layer_configs(m.keras_config))
    if m.keras_class == "Sequential":
        first = next(iter(configs.values()), {})
        cfgs = [first.get("config", {})]
    else:
        cfgs = [configs.get(r.layer, {}).get("config", {}) for r in m.input_refs]
    specs = []
    for cfg in cfgs:
        shape = cfg.get("batch_shape") or cfg.get("batch_input_shape")
        if not shape or any(d is None for d in shape[1:]):
            return None
        specs.append((tuple(shape[1:]), variable_dtype(cfg.get("dtype"))))
    return specs


def _header(model, class_name, weights_file, origin):
    what = f"The Keras model {string(_model_name(model))}"
    if origin:
        what += f" ({origin}, written by Keras {model.keras_version or 'of unknown version'})"
    paragraphs = [
        f"{what} as PyTorch source, generated by torch_tfgrads {__version__}. The code is yours "
        "to edit: each layer is the module torch_tfgrads.keras.load_model makes for it, built "
        "by torch_tfgrads.keras.layer() from the part of its Keras config that matters, and "
        "forward() is the Keras graph, one layer call per line. Tensors are channels last, as "
        "in Keras; model.train() and model.eval() are Keras's training=True and False.",
    ]
    example = ", ".join(list(model.state_dict())[:2] + ["..."])
    if weights_file:
        paragraphs.append(
            f"The weights are in {weights_file} next to this file: the state_dict, in Keras's "
            f"names ({example}). load() returns the model with them, in eval mode; running this "
            "file runs it on a batch of zeros."
        )
    else:
        paragraphs.append(
            f"load(path) returns the model with the weights of a state_dict saved by torch.save "
            f"(e.g. of {class_name}() or of the converted module), in eval mode."
        )
    out = []
    for p in paragraphs:
        out += textwrap.wrap(p, 98, initial_indent="# ", subsequent_indent="# ")
        out.append("#")
    return out[:-1]


def model_source(
    model: KerasModel,
    *,
    class_name: str | None = None,
    weights_file: str | None = None,
    origin: str | None = None,
) -> str:
    """The Python source of ``model`` (a :class:`KerasModel` from :func:`load_model`).

    ``class_name`` names the model's class (default: from the Keras model's name);
    ``weights_file`` is the file name, next to the source, whose state_dict ``load()`` reads
    by default (:func:`write_source` writes it); ``origin`` names the Keras file in the header.
    Raises :class:`KerasLoadError` for a layer that its Keras config does not build (a custom
    converter's).
    """
    if not isinstance(model, KerasModel):
        raise TypeError("model_source: the model must come from torch_tfgrads.keras.load_model")
    if class_name is not None and not (
        class_name.isidentifier() and not keyword.iskeyword(class_name)
    ):
        raise ValueError(f"model_source: class_name={class_name!r} is not a Python name")
    class_names = _Names({"layer", "load", "torch", "pathlib", "WEIGHTS"})
    top = class_names.new(class_name or _camel(_model_name(model)) or "KerasModel")
    classes = []
    uses_layer = _class_lines(model, top, classes, class_names, model.keras_version)
    out = _header(model, top, weights_file, origin) + [""]
    out += (["import pathlib", ""] if weights_file else []) + ["import torch", ""]
    if uses_layer:
        out += [
            "try:  # the layers are torch_tfgrads modules",
            "    from torch_tfgrads.keras import layer",
            "except ModuleNotFoundError as e:",
            '    raise ModuleNotFoundError("this model needs torch_tfgrads: pip install '
            'torch_tfgrads") from e',
            "",
        ]
    if weights_file:
        out += lines(
            "WEIGHTS = ", call("pathlib.Path(__file__).with_name", [literal(weights_file)])
        )
    for c in classes:
        out += ["", ""] + c
    default = "=WEIGHTS" if weights_file else ""
    out += [
        "",
        "",
        f"def load(weights{default}) -> {top}:",
        '    """The model with the weights of `weights` (a state_dict saved by torch.save), in eval',
        '    mode (Keras\'s training=False; model.train() is training=True)."""',
        f"    model = {top}()",
        '    model.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))',
        "    return model.eval()",
    ]
    if weights_file:
        out += ["", ""] + _main(model, top)
    return "\n".join(out) + "\n"


def _main(model, top):
    out = ['if __name__ == "__main__":', "    model = load()"]
    specs = _input_specs(model)
    if specs is None:
        return out + ["    print(model)"]
    inputs = []
    for shape, dtype in specs:
        args = [Atom("1")] + [Atom(str(int(d))) for d in shape]
        kw = (
            []
            if dtype == "float32" or not hasattr(torch, dtype)
            else [("dtype", Atom(f"torch.{dtype}"))]
        )
        inputs.append(call("torch.zeros", args, kw))
    out.append("    with torch.no_grad():  # a batch of one, of the Keras model's input shapes")
    out += lines("y = ", call("model", inputs), "", _BODY)
    if model.single_output:
        out.append(f'    print("{top}: output shape", tuple(y.shape))')
    else:
        out.append(f'    print("{top}: output shapes", [tuple(o.shape) for o in y])')
    return out


def write_source(
    model: KerasModel, path, *, class_name: str | None = None, origin: str | None = None
) -> tuple[Path, Path]:
    """Write the source of ``model`` to ``path`` (``model.py``) and its weights next to it
    (``model.weights.pt``: ``torch.save`` of the ``state_dict``, which
    ``torch.load(..., weights_only=True)`` reads). Returns both paths."""
    path = Path(path)
    weights = path.with_name(path.name.removesuffix(".py") + ".weights.pt")
    text = model_source(model, class_name=class_name, weights_file=weights.name, origin=origin)
    path.write_text(text, encoding="utf-8")
    torch.save(model.state_dict(), weights)
    return path, weights
