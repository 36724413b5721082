"""The recording: what one Keras run computed, layer by layer, in one `.npz` or `.h5` file.

A recording is written by :func:`torch_tfgrads.diff.record` (where TensorFlow is installed) and
read by :func:`load_recording` with numpy alone (h5py for `.h5`), so that
:func:`torch_tfgrads.diff.compare` runs where TensorFlow is not.

File layout (format ``torch_tfgrads.diff.recording``, version 1; docs/debugging.md describes it
field by field):

* ``.npz``: an array ``__meta__`` (a 0-d unicode array holding a JSON document), and the
  tensors as arrays named ``a0``, ``a1``, ... which the JSON refers to by name. Loading needs no
  pickle (``np.load(path, allow_pickle=False)``).
* ``.h5``/``.hdf5``: the same JSON as a scalar string dataset ``__meta__`` (a dataset, not an
  attribute: HDF5 attributes are limited to 64 KiB) and the arrays as datasets ``arrays/a0``,
  ``arrays/a1``, ...

Example::

    >>> rec = Recording.empty(dtype="float32", training=True)
    >>> key = rec.add(np.ones((2, 3), np.float32))
    >>> rec.array(key).shape
    (2, 3)
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field

import numpy as np

FORMAT = "torch_tfgrads.diff.recording"
VERSION = 1
SUFFIXES = (".npz", ".h5", ".hdf5")


@dataclass
class WeightRecord:
    """One Keras variable of a layer, for one call of the layer.

    ``name``: the variable's path below the layer (``kernel``, ``moving_mean``,
    ``forward_lstm/lstm_cell/bias``), in the order of ``layer.weights``. ``value``: its value
    before the call. ``grad``: for trainable variables, d loss / d variable (all calls of the
    layer together). ``call_grad``: the part of it that flows through this call (recorded only
    for a layer called more than once; otherwise it is ``grad``). ``after``: for non-trainable
    variables (moving statistics), the value after the call. Values are array names.
    """

    name: str
    trainable: bool
    value: str
    grad: str | None = None
    call_grad: str | None = None
    after: str | None = None

    @property
    def this_call_grad(self) -> str | None:
        return self.call_grad if self.call_grad is not None else self.grad


@dataclass
class CallRecord:
    """One call of one Keras layer (or operation), in the order Keras executed them.

    ``id``: the layer's path (nested models joined with "/"), plus ``#k`` for the k-th call
    (k >= 1) of a layer called more than once. ``inputs``/``outputs``: every tensor argument
    and result, flattened (positional arguments first, then keyword arguments by name).
    ``output_grads``: d loss / d output (None for a non-float output). ``input_grads``: the
    gradient that flows back through this call to each input, given ``output_grads`` (None for
    a non-float input).
    """

    id: str
    layer: str
    class_name: str
    index: int
    inputs: list[str]
    outputs: list[str]
    output_grads: list[str | None]
    input_grads: list[str | None]
    weights: list[WeightRecord] = field(default_factory=list)

    @classmethod
    def from_dict(cls, d: dict) -> CallRecord:
        d = dict(d)
        d["weights"] = [WeightRecord(**w) for w in d.get("weights", [])]
        return cls(**d)


class Recording:
    """A recording in memory: ``meta`` (the JSON document) and ``arrays`` (name -> array).

    Attributes read from ``meta``: ``dtype`` (the model's float dtype), ``training``,
    ``calls`` (:class:`CallRecord` in execution order), ``inputs``, ``targets``, ``outputs``,
    ``output_grads`` (arrays), ``loss`` (a dict: ``kind`` "seed" or "custom", ``description``,
    ``value``), ``versions``.
    """

    def __init__(self, meta: dict, arrays: dict[str, np.ndarray]):
        self.meta, self.arrays = meta, arrays
        self._calls = [CallRecord.from_dict(c) for c in meta.get("calls", [])]

    @classmethod
    def empty(cls, *, dtype: str, training: bool) -> Recording:
        meta = {
            "format": FORMAT,
            "version": VERSION,
            "dtype": dtype,
            "training": training,
            "calls": [],
            "inputs": [],
            "targets": [],
            "outputs": [],
            "output_grads": [],
            "seeds": [],
            "loss": {},
            "versions": {},
            "model": {},
        }
        return cls(meta, {})

    def add(self, array) -> str:
        """Store an array; returns its name."""
        key = f"a{len(self.arrays)}"
        self.arrays[key] = np.asarray(array)
        return key

    def add_call(self, call: CallRecord) -> None:
        self._calls.append(call)
        self.meta["calls"].append(asdict(call))

    def array(self, key: str | None) -> np.ndarray | None:
        if key is None:
            return None
        try:
            return self.arrays[key]
        except KeyError:
            raise RuntimeError(
                f"Recording: the array {key!r} the recording refers to is missing (a truncated "
                "or edited file)"
            ) from None

    def _list(self, what: str) -> list[np.ndarray]:
        return [self.array(k) for k in self.meta.get(what, [])]

    @property
    def dtype(self) -> str:
        return self.meta["dtype"]

    @property
    def training(self) -> bool:
        return bool(self.meta["training"])

    @property
    def calls(self) -> list[CallRecord]:
        return self._calls

    @property
    def inputs(self) -> list[np.ndarray]:
        return self._list("inputs")

    @property
    def targets(self) -> list[np.ndarray]:
        return self._list("targets")

    @property
    def outputs(self) -> list[np.ndarray]:
        return self._list("outputs")

    @property
    def output_grads(self) -> list[np.ndarray]:
        return self._list("output_grads")

    @property
    def loss(self) -> dict:
        return self.meta.get("loss", {})

    @property
    def versions(self) -> dict:
        return self.meta.get("versions", {})

    def __repr__(self) -> str:
        return (
            f"Recording({self.meta.get('model', {}).get('name')!r}, {self.dtype}, "
            f"training={self.training}, {len(self.calls)} calls)"
        )

    def save(self, path) -> str:
        """Write the recording to ``path`` (``.npz``, or ``.h5``/``.hdf5`` with h5py)."""
        path = _check_path(os.fspath(path), "Recording.save")
        text = json.dumps(self.meta)
        if path.endswith(".npz"):
            np.savez_compressed(path, __meta__=np.array(text), **self.arrays)
        else:
            h5py = _h5py()
            with h5py.File(path, "w") as f:
                f["__meta__"] = text
                grp = f.create_group("arrays")
                for k, a in self.arrays.items():
                    grp.create_dataset(k, data=a)
        return path


def _check_path(path: str, fn: str) -> str:
    if not path.lower().endswith(SUFFIXES):
        raise ValueError(f"{fn}: argument 'path' must end with {', '.join(SUFFIXES)}, got {path!r}")
    return path


def _h5py():
    try:
        import h5py
    except ImportError as e:  # pragma: no cover - only without h5py
        raise ImportError(
            "torch_tfgrads.diff: .h5 recordings need h5py (pip install h5py); .npz ones do not"
        ) from e
    return h5py


def _check_meta(meta, path: str) -> dict:
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ValueError(
            f"load_recording: argument 'path': {path} is not a torch_tfgrads diff recording "
            "(write one with torch_tfgrads.diff.record or `python -m torch_tfgrads record`)"
        )
    if int(meta.get("version", 0)) > VERSION:
        raise ValueError(
            f"load_recording: argument 'path': {path} is a version {meta['version']} "
            f"recording; this torch_tfgrads reads versions up to {VERSION} (upgrade it)"
        )
    return meta


def load_recording(path) -> Recording:
    """Read a recording written by :meth:`Recording.save` (numpy only for ``.npz``).

    Raises ValueError for a file that is not a recording (or of a newer version),
    FileNotFoundError for a missing one.
    """
    path = _check_path(os.fspath(path), "load_recording")
    if not os.path.exists(path):
        raise FileNotFoundError(f"load_recording: {path}: no such file")
    if path.endswith(".npz"):
        try:
            with np.load(path, allow_pickle=False) as z:
                if "__meta__" not in z.files:
                    _check_meta(None, path)
                meta = json.loads(str(z["__meta__"]))
                arrays = {k: z[k] for k in z.files if k != "__meta__"}
        except (OSError, ValueError, EOFError) as e:
            if "torch_tfgrads diff recording" in str(e) or "recording; this" in str(e):
                raise
            raise ValueError(f"load_recording: argument 'path': cannot read {path}: {e}") from e
    else:
        h5py = _h5py()
        with h5py.File(path, "r") as f:
            if "__meta__" not in f:
                _check_meta(None, path)
            text = f["__meta__"][()]
            meta = json.loads(text.decode() if isinstance(text, bytes) else text)
            arrays = {k: np.asarray(ds[()]) for k, ds in f.get("arrays", {}).items()}
    return Recording(_check_meta(meta, path), arrays)
