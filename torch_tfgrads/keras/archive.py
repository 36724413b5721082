"""Reading Keras files without TensorFlow or Keras: a `.keras` zip, a legacy `.h5`, a `.weights.h5`.

Only the standard library and h5py (imported lazily, so that ``import torch_tfgrads`` never needs
it) are used. What comes out is plain data: the model config (a dict), the Keras version that
wrote the file, and a callable that gives the arrays of one layer.
"""

import contextlib
import io
import json
import os
import zipfile
from dataclasses import dataclass, field

import numpy as np


class KerasLoadError(ValueError):
    """A Keras file cannot be converted; the message names the layer or the file and what to do."""


def _h5py():
    try:
        import h5py
    except ImportError as e:  # pragma: no cover - exercised only without h5py
        raise ImportError(
            "torch_tfgrads.keras reads Keras files with h5py, which is not installed: "
            "pip install 'torch_tfgrads[keras]' (or pip install h5py)"
        ) from e
    return h5py


@dataclass
class KerasFile:
    """The contents of a Keras file, as plain Python data.

    ``kind`` is "keras" (a Keras 3 zip), "h5" (legacy whole-model HDF5) or "weights" (a
    ``.weights.h5`` holding only Keras 3 weights). ``config`` is the model's serialized config
    (``{"class_name": ..., "config": {...}}``), None for "weights". ``h5`` is the open
    ``h5py.File`` holding the weights.
    """

    path: str
    kind: str
    config: dict | None
    keras_version: str | None
    h5: object
    _buffer: object = field(default=None, repr=False)

    def close(self):
        # Closing a broken file must not hide the first error.
        with contextlib.suppress(Exception):
            self.h5.close()


def _open_h5(source, path):
    h5py = _h5py()
    try:
        return h5py.File(source, "r")
    except OSError as e:
        raise KerasLoadError(
            f"{path}: not a readable HDF5 file ({e}); the file is truncated or "
            "is not a Keras weights file"
        ) from e


def read_file(path) -> KerasFile:
    """Open a `.keras`, `.h5`/`.hdf5` or `.weights.h5` file (the kind is told by the content)."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such file")
    if zipfile.is_zipfile(path):
        return _read_keras_zip(path)
    with open(path, "rb") as f:
        magic = f.read(8)
    if magic != b"\x89HDF\r\n\x1a\n":
        if path.endswith(".keras"):
            raise KerasLoadError(
                f"{path}: not a valid zip archive (truncated or corrupted "
                "`.keras` file); save the model again with model.save()"
            )
        raise KerasLoadError(f"{path}: neither a `.keras` zip nor an HDF5 file")
    h5 = _open_h5(path, path)
    if "model_config" in h5.attrs:
        config = _json_attr(h5.attrs["model_config"], path, "model_config")
        version = _str_attr(h5.attrs.get("keras_version"))
        if "model_weights" not in h5:
            h5.close()
            raise KerasLoadError(
                f"{path}: the legacy `.h5` file has no 'model_weights' group "
                "(saved without weights?)"
            )
        return KerasFile(path, "h5", config, version, h5)
    if "layers" in h5 or "vars" in h5:
        return KerasFile(path, "weights", None, None, h5)
    if "model_weights" in h5 or "layer_names" in h5.attrs:
        return KerasFile(path, "legacy_weights", None, _str_attr(h5.attrs.get("keras_version")), h5)
    h5.close()
    raise KerasLoadError(f"{path}: an HDF5 file without a Keras model config or Keras weights")


def _str_attr(v):
    if v is None:
        return None
    return v.decode() if isinstance(v, bytes) else str(v)


def _json_attr(v, path, what):
    try:
        return json.loads(_str_attr(v))
    except ValueError as e:
        raise KerasLoadError(f"{path}: the {what} is not valid JSON ({e})") from e


def _read_keras_zip(path):
    try:
        with zipfile.ZipFile(path) as z:
            names = set(z.namelist())
            missing = [n for n in ("config.json", "model.weights.h5") if n not in names]
            if missing:
                raise KerasLoadError(
                    f"{path}: the `.keras` archive lacks {missing}; save the "
                    "model again with model.save('model.keras')"
                )
            config = json.loads(z.read("config.json"))
            meta = json.loads(z.read("metadata.json")) if "metadata.json" in names else {}
            data = z.read("model.weights.h5")
    except (zipfile.BadZipFile, EOFError, OSError, ValueError) as e:
        if isinstance(e, KerasLoadError):
            raise
        raise KerasLoadError(
            f"{path}: cannot read the `.keras` archive ({type(e).__name__}: "
            f"{e}); the file is truncated or corrupted"
        ) from e
    buf = io.BytesIO(data)
    h5 = _open_h5(buf, f"{path}:model.weights.h5")
    return KerasFile(path, "keras", config, meta.get("keras_version"), h5, buf)


def read_dataset(ds):
    """An h5py dataset as a numpy array (float arrays keep their dtype)."""
    return np.asarray(ds[()])
