"""CudnnRNN against TensorFlow: Keras 3 LSTM / GRU / SimpleRNN on TF 2.21's CPU kernels, loaded
from the same weights through the opaque buffer Keras builds for CudnnRNNV3 (single layer, with
and without a mask, outputs and every gradient); and TF's own shape checks (CVE-2021-41221)."""

import pytest
import torch

import torch_tfgrads as T
from helpers import rel_err
from torch_tfgrads.nn.cudnn_rnn import keras_to_canonical
from torch_tfgrads.parity.cudnn_rnn_keras import keras_rnn

pytestmark = pytest.mark.needs_tf

B, T_, I, U = 3, 6, 4, 5


def _weights(mode, g):
    G = {"lstm": 4, "gru": 3}.get(mode, 1)
    kernel = torch.randn(I, G * U, generator=g, dtype=torch.float64) * 0.5
    rec = torch.randn(U, G * U, generator=g, dtype=torch.float64) * 0.5
    bias = (
        torch.randn((2, G * U) if mode == "gru" else (G * U,), generator=g, dtype=torch.float64)
        * 0.3
    )
    return kernel, rec, bias


@pytest.mark.parametrize("masked", [False, True], ids=["full", "masked"])
@pytest.mark.parametrize("mode", ["lstm", "gru", "rnn_tanh", "rnn_relu"])
def test_matches_keras(tf, mode, masked):
    g = torch.Generator().manual_seed(3)
    kernel, rec, bias = _weights(mode, g)
    x = torch.randn(B, T_, I, generator=g, dtype=torch.float64)
    h0 = torch.randn(B, U, generator=g, dtype=torch.float64) * 0.5
    c0 = torch.randn(B, U, generator=g, dtype=torch.float64) * 0.5
    lengths = torch.tensor([6, 2, 4], dtype=torch.int32) if masked else None
    dy = torch.randn(B, T_, U, generator=g, dtype=torch.float64)
    dh, dc = (
        torch.randn(B, U, generator=g, dtype=torch.float64),
        torch.randn(B, U, generator=g, dtype=torch.float64),
    )
    k_out, k_h, k_c, k_grads = keras_rnn(mode, x, lengths, kernel, rec, bias, (dy, dh, dc), h0, c0)

    # Ours in float32 from the same Keras-layout tensors, through the buffer Keras builds.
    leaves = [t.float().requires_grad_() for t in (x, kernel, rec, bias, h0, c0)]
    lx, lk, lr, lb, lh, lc = leaves
    w, b = keras_to_canonical(mode, lk, lr, lb)
    params = T.cudnn_rnn_canonical_to_params_v2(1, U, I, w, b, mode)
    out, h, c, _, _ = T.cudnn_rnn_v3(
        lx, lh[:, None], lc[:, None], params, lengths, mode, time_major=False
    )
    valid = (
        torch.ones(B, T_, 1)
        if lengths is None
        else (torch.arange(T_)[None, :] < lengths[:, None])[..., None].float()
    )
    loss = (out * dy.float() * valid).sum() + (h[:, 0] * dh.float()).sum()
    if mode == "lstm":
        loss = loss + (c[:, 0] * dc.float()).sum()
    grads = torch.autograd.grad(loss, leaves if mode == "lstm" else leaves[:5])

    # cuDNN zeroes the outputs past each length, Keras's CPU path repeats the last valid one
    # (TF leaves the outputs past a sequence's length undefined): compare valid steps, and check our zeros.
    assert rel_err(out * valid, k_out * valid.double()) <= 1e-5
    assert torch.all(out * (1 - valid) == 0)
    assert rel_err(h[:, 0], k_h) <= 1e-5
    if mode == "lstm":
        assert rel_err(c[:, 0], k_c) <= 1e-5
    names = ["input", "kernel", "recurrent_kernel", "bias", "h0", "c0"]
    for name, ours, theirs in zip(names, grads, k_grads):
        assert rel_err(ours, theirs) <= 1e-5, name


@pytest.mark.parametrize("mode", ["lstm", "gru", "rnn_tanh"])
def test_module_keras_weights_round_trip(tf, mode):
    cls = {"lstm": T.nn.CudnnLSTM, "gru": T.nn.CudnnGRU, "rnn_tanh": T.nn.CudnnRNNTanh}[mode]
    g = torch.Generator().manual_seed(5)
    kernel, rec, bias = _weights(mode, g)
    layer = cls(1, U, input_size=I, time_major=False, dtype=torch.float64)
    layer.set_keras_weights(kernel, rec, bias)
    k2, r2, b2 = layer.keras_weights()
    assert torch.equal(k2, kernel) and torch.equal(r2, rec)
    # LSTM/SimpleRNN export the two biases summed (Keras has one); the input bias was zero.
    assert torch.equal(b2, bias)
    x = torch.randn(B, T_, I, generator=g, dtype=torch.float64)
    zeros = (torch.zeros(B, U, dtype=torch.float64),) * 2
    k_out, *_ = keras_rnn(mode, x, None, kernel, rec, bias, (torch.zeros(B, T_, U), *zeros), *zeros)
    assert rel_err(layer(x)[0], k_out) <= 1e-5
    with pytest.raises(ValueError, match="Keras layers hold one unidirectional"):
        cls(2, U, input_size=I).keras_weights()


def test_tf_shape_function_rejects_the_cve_2021_41221_poc_and_so_do_we(tf):
    # TF's shape function (graph mode) raises; eager TF has no CPU kernel at all .
    @tf.function
    def poc():
        return tf.raw_ops.CudnnRNNV3(
            input=[0.1, 0.1],
            input_h=[0.5],
            input_c=[0.1, 0.1, 0.1],
            params=[0.5, 0.5],
            sequence_lengths=[-1, 0, 1],
        )

    with pytest.raises(ValueError, match="Shape must be rank 3 but is rank 1"):
        poc.get_concrete_function()
    with pytest.raises(Exception, match="Could not find device for node|NotFound|no kernel"):
        tf.raw_ops.CudnnRNNV3(
            input=tf.zeros([2, 1, 1]),
            input_h=tf.zeros([1, 1, 1]),
            input_c=tf.zeros([1, 1, 1]),
            params=tf.zeros([12]),
            sequence_lengths=[2],
        )
    with pytest.raises(RuntimeError, match="RNN input must be a 3-D vector"):
        T.cudnn_rnn_v3(
            torch.tensor([0.1, 0.1]),
            torch.tensor([0.5]),
            torch.tensor([0.1] * 3),
            torch.tensor([0.5, 0.5]),
            torch.tensor([-1, 0, 1], dtype=torch.int32),
        )


def test_tf_params_size_shape_function_agrees(tf):
    # TF's CudnnRNNParamsSize has no CPU kernel either; its formula is checked against torch in
    # test_cudnn_rnn.py. Here: TF's graph shape function accepts scalars and rejects rank 1.
    @tf.function
    def size(n):
        return tf.raw_ops.CudnnRNNParamsSize(
            num_layers=n, num_units=3, input_size=2, T=tf.float32, S=tf.int32
        )

    with pytest.raises(ValueError, match="Shape must be rank 0 but is rank 1"):
        size.get_concrete_function(tf.TensorSpec([1], tf.int32))
    with pytest.raises(ValueError, match="num_layers is not a scalar"):
        T.cudnn_rnn_params_size(torch.tensor([1]), 3, 2)
