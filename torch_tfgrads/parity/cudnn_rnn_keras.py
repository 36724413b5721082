"""Keras 3 LSTM / GRU(reset_after) / SimpleRNN on TF's CPU kernels: the TensorFlow oracle of the
CudnnRNN family (TF has no CPU kernel for the CudnnRNN ops themselves; Keras's cuDNN path calls
CudnnRNNV3 with a buffer built from these weights, docs/ops/cudnn_rnn.md)."""

import os

import numpy as np
import torch

from ._tf import import_tf

_LAYERS = {"lstm": "LSTM", "gru": "GRU", "rnn_tanh": "SimpleRNN", "rnn_relu": "SimpleRNN"}


def keras_rnn(mode, x, lengths, kernel, recurrent_kernel, bias, cotangents, h0=None, c0=None):
    """Runs the Keras layer on batch-major ``x`` [B, T, I] with a right-padded mask from
    ``lengths`` (None: no mask). Returns (outputs [B,T,U], h [B,U], c or None, grads) with grads
    of ``sum(out * dy * mask) + sum(h * dh) + sum(c * dc)`` w.r.t. (x, kernel, recurrent_kernel,
    bias, h0, c0); everything as float64 torch tensors."""
    tf = import_tf()
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    import keras

    U = recurrent_kernel.shape[0]
    kw = dict(return_sequences=True, return_state=True)
    if mode == "gru":
        kw["reset_after"] = True
    if mode == "rnn_relu":
        kw["activation"] = "relu"
    layer = getattr(keras.layers, _LAYERS[mode])(U, **kw)
    B, T, _ = x.shape
    layer.build((B, T, x.shape[2]))
    layer.set_weights(
        [
            np.asarray(t.detach().cpu().double().numpy(), np.float32)
            for t in (kernel, recurrent_kernel, bias)
        ]
    )
    tx = tf.constant(x.detach().cpu().float().numpy())
    mask = None
    if lengths is not None:
        mask = tf.constant(np.arange(T)[None, :] < lengths.cpu().numpy()[:, None])
    init = None
    if h0 is not None:
        init = [tf.constant(h0.detach().cpu().float().numpy())]
        if mode == "lstm":
            init.append(tf.constant(c0.detach().cpu().float().numpy()))
    dy, dh, dc = (
        tf.constant(t.detach().cpu().float().numpy()) if t is not None else None for t in cotangents
    )
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(tx)
        if init is not None:
            for t in init:
                tape.watch(t)
        res = layer(tx, mask=mask, initial_state=init)
        out, h = res[0], res[1]
        c = res[2] if mode == "lstm" else None
        valid = tf.ones_like(out) if mask is None else tf.cast(mask, out.dtype)[..., None]
        loss = tf.reduce_sum(out * dy * valid) + tf.reduce_sum(h * dh)
        if c is not None:
            loss += tf.reduce_sum(c * dc)
    wrt = [tx] + list(layer.trainable_variables) + (init or [])
    grads = tape.gradient(loss, wrt)

    def t64(v):
        return None if v is None else torch.from_numpy(np.array(v)).double()

    return (t64(out), t64(h), t64(c) if c is not None else None, [t64(g) for g in grads])
