"""The harness of the Keras-conversion tests: run a Keras model and its converted module on the
same inputs, and compare outputs, gradients of a loss w.r.t. every weight, moving statistics,
and the weights after optimizer steps. Imported as `from keras_helpers import ...` (pytest puts
this directory on sys.path); the fixtures (`keras`, `floatx`) stay in the test modules.
"""

import contextlib
import os
import subprocess
import sys

import numpy as np
import torch

from helpers import rel_err

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@contextlib.contextmanager
def keras_floatx(keras, name):
    """Build models in ``name`` (e.g. "float64"); the global dtype policy is cached from floatx
    on first use, so both are set, and both restored after."""
    old, old_policy = keras.config.floatx(), keras.config.dtype_policy()
    keras.config.set_floatx(name)
    keras.config.set_dtype_policy(name)
    try:
        yield
    finally:
        keras.config.set_floatx(old)
        keras.config.set_dtype_policy(old_policy)


def vpath(v, model):
    """A Keras variable's path in the model ("block1/conv/kernel"): Keras 3's ``path`` (less the
    model's name, which a Sequential puts in front), or a tf-keras variable's name less ":0"."""
    path = getattr(v, "path", None) or v.name.split(":")[0]
    return path.removeprefix(model.name + "/")


def keras_run(tf, model, inputs, training, seeds):
    """Keras outputs, and the gradient of sum(out * seed) w.r.t. every trainable weight."""
    xs = [tf.constant(x) for x in inputs]
    with tf.GradientTape() as tape:
        outs = model(xs if len(xs) > 1 else xs[0], training=training)
        outs = outs if isinstance(outs, (list, tuple)) else [outs]
        loss = sum(tf.reduce_sum(o * s) for o, s in zip(outs, seeds))
    grads = tape.gradient(loss, model.trainable_weights)
    return (
        [o.numpy() for o in outs],
        {
            vpath(v, model): tf.convert_to_tensor(g).numpy()
            for v, g in zip(model.trainable_weights, grads)
        },
    )


def torch_run(module, inputs, training, seeds):
    module.train(training)
    module.zero_grad(set_to_none=True)
    outs = module(*[torch.from_numpy(x) for x in inputs])
    outs = outs if isinstance(outs, list) else [outs]
    loss = sum((o * torch.from_numpy(s)).sum() for o, s in zip(outs, seeds))
    loss.backward()
    return outs


def var(module, path):
    """The module's tensor for a Keras variable path; a recurrent layer's cell ("lstm/lstm_cell/
    kernel") has no submodule of its own: its variables are the layer's."""
    obj = module
    parts = path.split("/")
    for i, part in enumerate(parts):
        if i < len(parts) - 1 and not hasattr(obj, part):
            if part.endswith("_cell"):
                continue
            if part.startswith(("forward_", "backward_")):  # Bidirectional's copies
                part = part.split("_")[0] + "_layer"
            elif getattr(obj, "keras_class", None) == "TimeDistributed":
                part = "layer"  # Keras names the wrapped layer's variables by its own name
        obj = getattr(obj, part)
    return obj


def grad_err(t, k, scale):
    """Relative error, except for gradients that are zero up to rounding (a bias feeding a
    batch norm in training): there, the error relative to ``scale``, the largest gradient."""
    k = torch.from_numpy(k).double()
    kmax = k.abs().max().item()
    return ((t.detach().double() - k).abs().max() / (kmax if kmax > 1e-4 * scale else scale)).item()


def compare(tf, kmodel, module, inputs, tol_fwd, tol_grad, seed=1, modes=(False, True)):
    """Inference then one training call: outputs, gradients, moving statistics. Returns the
    errors by name (also printed: `pytest -s` shows them)."""
    rng = np.random.default_rng(seed)
    outs0 = kmodel(inputs if len(inputs) > 1 else inputs[0], training=False)
    outs0 = outs0 if isinstance(outs0, (list, tuple)) else [outs0]
    # in the outputs' dtype (the original used the input's: integer seeds for token inputs)
    seeds = [rng.normal(size=tuple(o.shape)).astype(np.asarray(o).dtype) for o in outs0]
    errs = {}
    for training in modes:
        k_out, k_grads = keras_run(tf, kmodel, inputs, training, seeds)
        t_out = torch_run(module, inputs, training, seeds)
        errs[f"forward training={training}"] = max(
            rel_err(t, torch.from_numpy(k)) for t, k in zip(t_out, k_out)
        )
        scale = max(np.abs(g).max() for g in k_grads.values())
        errs[f"grad training={training}"] = max(
            grad_err(var(module, p).grad, g, scale) for p, g in k_grads.items()
        )
        assert errs[f"forward training={training}"] <= tol_fwd, errs
        assert errs[f"grad training={training}"] <= tol_grad, errs
    stats = [v for v in kmodel.non_trainable_weights if "moving" in vpath(v, kmodel)]
    if stats and True in modes:
        errs["moving statistics"] = max(
            rel_err(var(module, vpath(v, kmodel)), torch.from_numpy(v.numpy())) for v in stats
        )
        assert errs["moving statistics"] <= tol_fwd, errs
    print(f"errors {kmodel.name} {inputs[0].dtype}:", {k: f"{v:.1e}" for k, v in errs.items()})
    return errs


def save(model, tmp_path, ext, name="m"):
    path = str(tmp_path / f"{name}.{ext}")
    model.save(path)
    return path


def sgd_steps(tf, keras, kmodel, module, batches, lr):
    """``len(batches)`` SGD steps on both sides, in training mode, on the cross entropy of the
    (softmax) output for integer labels: Keras's ``SGD`` without momentum is
    ``torch.optim.SGD``. Returns the largest relative error over every Keras variable (weights
    and moving statistics) afterwards, and how far the steps moved the weights (the largest
    relative change of a trainable weight: a test checks that they moved at all). ``lr`` must
    be a float32 number (a power of two): Keras keeps the learning rate in a float32 variable
    whatever the model's dtype."""
    assert float(np.float32(lr)) == lr, "a learning rate that float32 represents exactly"
    before = [v.numpy().copy() for v in kmodel.trainable_weights]
    opt_k = keras.optimizers.SGD(learning_rate=lr)
    opt_t = torch.optim.SGD([p for p in module.parameters() if p.requires_grad], lr=lr)
    module.train()
    for x, labels in batches:
        with tf.GradientTape() as tape:
            p = kmodel(x, training=True)
            loss = -tf.reduce_mean(tf.math.log(tf.gather(p, labels, batch_dims=1)))
        grads = tape.gradient(loss, kmodel.trainable_weights)
        opt_k.apply_gradients(zip(grads, kmodel.trainable_weights))
        opt_t.zero_grad()
        q = module(torch.from_numpy(x))
        n = len(labels)
        (-torch.log(q[torch.arange(n), torch.from_numpy(labels)]).mean()).backward()
        opt_t.step()
    paths = [(vpath(v, kmodel), v) for v in kmodel.weights]
    err = max(
        rel_err(var(module, p), torch.from_numpy(v.numpy()))
        for p, v in paths
        if "seed_generator" not in p and p.split("/")[-1] != "count"
    )
    moved = max(
        rel_err(torch.from_numpy(v.numpy()), torch.from_numpy(b))
        for v, b in zip(kmodel.trainable_weights, before)
    )
    return err, moved


def run_tf_free(script, *args):
    """Run ``script`` (which should start with helpers.BLOCK_TF) in a child Python in which
    TensorFlow, Keras and tf-keras cannot be imported; returns the CompletedProcess."""
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run(
        [sys.executable, "-c", script, *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
    )


def randomize_deep(kmodel, seed=0):
    """Random weights and batch-norm statistics for deep models, kernels scaled by
    1/sqrt(fan-in) (a depthwise kernel's fan-in is its window), so that activations keep their
    size through 50 layers and the softmax does not saturate (with ``randomize``'s fixed scale
    they grow by ~10 per layer). An unadapted Normalization gets random statistics too, made
    effective in Keras (it caches them when adapted or loaded, not on assign)."""
    rng = np.random.default_rng(seed)
    for v in kmodel.weights:
        path = vpath(v, kmodel)
        shape, name = tuple(v.shape), path.split("/")[-1]
        if name in ("moving_variance", "gamma", "variance"):
            val = rng.uniform(0.5, 1.5, shape)
        elif name in ("moving_mean", "mean"):
            val = rng.normal(0.0, 0.2, shape)
        elif name == "count" or "seed_generator" in path:
            continue
        elif len(shape) >= 2:
            fan_in = np.prod(shape[: -2 if name == "depthwise_kernel" else -1])
            val = rng.normal(0.0, 1.5 / np.sqrt(fan_in), shape)
        else:
            val = rng.normal(0.0, 0.2, shape)
        v.assign(val.astype(getattr(v.dtype, "as_numpy_dtype", v.dtype)))
    for layer in _all_layers(kmodel):
        if layer.__class__.__name__ == "Normalization":
            layer.finalize_state()


def _all_layers(model):
    for layer in model.layers:
        if layer.__class__.__name__ in ("Functional", "Sequential", "Model"):
            yield from _all_layers(layer)
        else:
            yield layer


def calibrate_batch_norms(kmodel, x, seed=0):
    """Moving statistics made of the statistics of each batch norm's input in inference mode on
    ``x`` (the variance averaged with its mean over the channels), randomly off by up to 30 %
    (variance) and 0.2 standard deviations (mean), set layer by layer in one pass. Random
    statistics unrelated to the activations make a deep network's inference output blow up or
    collapse to a constant (the softmax saturates); statistics from one training call do too,
    as inference then feeds each layer other activations than training did."""
    rng = np.random.default_rng(seed)
    bns = [la for la in _all_layers(kmodel) if la.__class__.__name__ == "BatchNormalization"]

    def calibrating(bn):
        call = bn.call

        def wrapped(inputs, training=None, mask=None):
            v = np.asarray(inputs)
            axes = tuple(range(v.ndim - 1))
            mean, var = v.mean(axes), v.var(axes)
            # a channel that hardly varies over a small batch (1 x 1 maps of 2 samples) would
            # get a gain of up to 1/sqrt(epsilon) and amplify rounding 30-fold per layer
            var = (var + var.mean()) / 2
            new_var = var * rng.uniform(0.7, 1.3, var.shape)
            new_mean = mean + 0.2 * np.sqrt(var) * rng.normal(size=var.shape)
            bn.moving_variance.assign(new_var.astype(v.dtype))
            bn.moving_mean.assign(new_mean.astype(v.dtype))
            return call(inputs, training=False)

        return wrapped

    try:
        for bn in bns:  # an instance attribute: Keras's __call__ calls self.call
            object.__setattr__(bn, "call", calibrating(bn))
        kmodel(x, training=False)
    finally:
        for bn in bns:
            if "call" in bn.__dict__:
                object.__delattr__(bn, "call")
    assert all(bn.call.__func__ is type(bn).call for bn in bns)
