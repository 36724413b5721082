"""Where do the numbers differ? A layer-by-layer forward and gradient diff of a torch port
against its Keras model.

Where TensorFlow is installed, :func:`record` runs the Keras model once and writes every
layer's inputs, outputs, output gradients and weight gradients into one file; where it is not,
:func:`compare` runs the torch module on the same inputs and reports, per layer, how the
forward outputs, the gradients and the moving statistics differ, both *chained* (the full
torch run) and *isolated* (each layer alone, fed the reference's inputs and output gradient),
and names the first layer whose own computation diverges::

    import torch_tfgrads.keras, torch_tfgrads.diff as D

    D.record(keras_model, x, "recording.npz")                 # needs TensorFlow
    report = D.compare("recording.npz", torch_tfgrads.keras.load_model("model.keras"))
    print(report.table())
    report.first_divergence                                   # "conv2", or None
    report.to_html("diff.html"); report.to_json("diff.json")

Also ``python -m torch_tfgrads record|compare``; see docs/debugging.md. TensorFlow and h5py
are imported only when needed (TensorFlow by :func:`record`, h5py for ``.h5`` recordings).
"""

from .compare_torch import compare
from .mapping import LayerMap
from .metrics import Metric
from .record_keras import record
from .recording import FORMAT, VERSION, CallRecord, Recording, WeightRecord, load_recording
from .report import DiffReport, LayerDiff, RowDiff

__all__ = [
    "record",
    "compare",
    "load_recording",
    "Recording",
    "CallRecord",
    "WeightRecord",
    "DiffReport",
    "LayerDiff",
    "RowDiff",
    "Metric",
    "LayerMap",
    "FORMAT",
    "VERSION",
]
