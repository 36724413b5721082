"""torch_tfgrads.tf_checkpoint reads TensorFlow's tensor bundles exactly, without TensorFlow.

Checkpoints are written by TensorFlow (every dtype, scalars, empty and multi-MB tensors, a
checkpoint split over several shards with sliced tensors, a Keras model with its optimizer, a
SavedModel, a TF 1 name-based Saver) and every tensor is compared bit for bit with
`tf.train.load_checkpoint(...).get_tensor`, the key list with `tf.train.list_variables`. A
subprocess in which `import tensorflow` fails reads the same files. Corrupted and truncated files
must raise `CheckpointError` naming the file (and the key), never return a partial result.
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

from torch_tfgrads import tf_checkpoint
from torch_tfgrads.tf_checkpoint import CheckpointError
from torch_tfgrads.tf_checkpoint import crc32c as crc
from torch_tfgrads.tf_checkpoint.bundle import _ordered_int, encode_slice_key
from torch_tfgrads.tf_checkpoint.sstable import TableError, snappy_decompress

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VALUE = "/.ATTRIBUTES/VARIABLE_VALUE"


# ----------------------------------------------------------------- pieces, no TensorFlow needed


def test_crc32c_vectors():
    # RFC 3720 (iSCSI) B.4 test vectors, and the classic check value.
    assert crc.crc32c(b"123456789") == 0xE3069283
    assert crc.crc32c(bytes(32)) == 0x8A9136AA
    assert crc.crc32c(b"\xff" * 32) == 0x62A8AB43
    assert crc.crc32c(bytes(range(32))) == 0x46DD794E
    assert crc.crc32c(b"") == 0
    assert crc.unmask(crc.mask(0x12345678)) == 0x12345678
    assert crc.mask(0) == 0xA282EAD8


@pytest.mark.parametrize("n", [4095, 4096, 5000, 1 << 16, 300_007])
def test_crc32c_vectorised_matches_bytewise(n):
    data = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8).tobytes()
    expected = crc._raw_small(0xFFFFFFFF, data) ^ 0xFFFFFFFF
    assert crc.crc32c(data) == expected
    cut = n // 3
    assert crc.extend(crc.crc32c(data[:cut]), data[cut:]) == expected


def test_snappy_decoder():
    # literal "abcd", copy (1-byte offset) of length 8 from offset 4, literal "xy",
    # copy (2-byte offset) of length 3 from offset 2.
    stream = bytes([17, 3 << 2]) + b"abcd" + bytes([(4 << 2) | 1, 4]) + bytes([1 << 2]) + b"xy"
    stream += bytes([(2 << 2) | 2, 2, 0])
    assert snappy_decompress(stream) == b"abcdabcdabcdxyxyx"
    with pytest.raises(TableError):
        snappy_decompress(bytes([14, 3 << 2]) + b"abcd" + bytes([(4 << 2) | 1, 9]))
    with pytest.raises(TableError):
        snappy_decompress(bytes([5, 3 << 2]) + b"abcd")  # says 5 bytes, decodes to 4


def test_ordered_code_signed():
    # OrderedCode's signed increasing encoding (the bytes of slice keys), known values.
    assert _ordered_int(0) == b"\x80"
    assert _ordered_int(-1) == b"\x7f"
    assert _ordered_int(63) == b"\xbf"
    assert _ordered_int(64) == b"\xc0\x40"
    assert _ordered_int(-64) == b"\x40"
    assert _ordered_int(-65) == b"\x3f\xbf"
    values = [-(1 << 40), -5000, -65, -64, -1, 0, 1, 63, 64, 8191, 8192, 1 << 40, (1 << 63) - 1]
    codes = [_ordered_int(v) for v in values]
    assert codes == sorted(codes)  # order preserving
    assert encode_slice_key("a", ((0, -1),)) == b"\x00a\x00\x01\x01\x01\x80\x7f"


def test_import_is_lazy():
    code = (
        "import sys, torch_tfgrads; "
        "print('torch_tfgrads.tf_checkpoint' in sys.modules, 'google.protobuf' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    assert out[0] == "False"


def test_missing_checkpoint(tmp_path):
    with pytest.raises(CheckpointError, match="cannot read the index"):
        tf_checkpoint.read(tmp_path / "nothing")


# ------------------------------------------------------------- checkpoints written by TensorFlow


def _dtypes(tf):
    out = [
        "float16",
        "bfloat16",
        "float32",
        "float64",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "bool",
        "complex64",
        "complex128",
    ]
    return [getattr(tf, n) for n in out] + [
        getattr(tf.dtypes.experimental, n) for n in ("float8_e5m2", "float8_e4m3fn")
    ]  # the float8 types TF has CPU variables of


def _value(tf, dtype, shape, seed):
    rng = np.random.default_rng(seed)
    if dtype == tf.bool:
        return tf.constant(rng.integers(0, 2, shape).astype(bool))
    if dtype.is_integer:
        info = np.iinfo(dtype.as_numpy_dtype)
        return tf.constant(
            rng.integers(
                info.min,
                info.max,
                shape,
                endpoint=True,
                dtype=np.int64 if info.min < 0 else np.uint64,
            ).astype(dtype.as_numpy_dtype)
        )
    x = rng.standard_normal(shape) * 10
    if dtype.is_complex:
        x = x + 1j * rng.standard_normal(shape)
    return tf.constant(x.astype(dtype.as_numpy_dtype))  # ml_dtypes for bfloat16 and float8


@pytest.fixture(scope="module")
def ckpts(tf, tmp_path_factory):
    """Prefixes of checkpoints written by TensorFlow, by kind."""
    d = tmp_path_factory.mktemp("tf_ckpt")
    out = {}

    # Every dtype: a scalar, a matrix and an empty tensor of each; strings; a 4 MB tensor.
    tensors = {}
    for i, dt in enumerate(_dtypes(tf)):
        tensors[f"{dt.name}_scalar"] = tf.Variable(_value(tf, dt, (), i))
        tensors[f"{dt.name}_matrix"] = tf.Variable(_value(tf, dt, (3, 5), 100 + i))
        tensors[f"{dt.name}_empty"] = tf.Variable(_value(tf, dt, (0, 4), 200 + i))
    tensors["string_scalar"] = tf.Variable(b"hello")
    tensors["string_matrix"] = tf.Variable([[b"", b"\x00\xff" * 70], [b"x" * 300, b"y"]])
    tensors["large"] = tf.Variable(_value(tf, tf.float32, (1024, 1024), 7))
    out["dtypes"] = tf.train.Checkpoint(**tensors).write(str(d / "dtypes" / "ckpt"))

    # Several shards: TF's size policy spreads variables over shards and slices the big ones.
    parts = {f"v{i}": tf.Variable(_value(tf, tf.float32, (100, 70), 300 + i)) for i in range(4)}
    parts["w"] = tf.Variable(_value(tf, tf.float64, (3, 200, 9), 400))
    policy = tf.train.experimental.MaxShardSizePolicy(max_shard_size=40_000)
    out["sharded"] = tf.train.Checkpoint(**parts).write(
        str(d / "sharded" / "ckpt"),
        options=tf.train.CheckpointOptions(experimental_sharding_callback=policy),
    )

    # A Keras model with its optimizer state.
    keras = tf.keras
    model = keras.Sequential(
        [
            keras.Input((6,)),
            keras.layers.Dense(5, name="dense_a"),
            keras.layers.BatchNormalization(name="bn"),
            keras.layers.Dense(2, name="dense_b"),
        ]
    )
    opt = keras.optimizers.Adam(1e-3)
    model.compile(optimizer=opt, loss="mse")
    x = np.random.default_rng(0).standard_normal((8, 6)).astype(np.float32)
    model.fit(x, x[:, :2], epochs=1, verbose=0)
    out["keras"] = tf.train.Checkpoint(model=model, optimizer=opt).write(str(d / "keras" / "ckpt"))
    out["keras_model"] = model

    # A SavedModel: its variables/ is a tensor bundle.
    module = tf.Module()
    module.w = tf.Variable(_value(tf, tf.float32, (4, 3), 500))
    module.b = tf.Variable(_value(tf, tf.bfloat16, (3,), 501))
    module.f = tf.function(
        lambda x: tf.matmul(x, module.w), input_signature=[tf.TensorSpec([None, 4], tf.float32)]
    )
    tf.saved_model.save(module, str(d / "saved_model"))
    out["saved_model"] = str(d / "saved_model")

    # A TF 1 name-based checkpoint (no object graph).
    with tf.Graph().as_default():
        a = tf.compat.v1.get_variable("layer/kernel", initializer=_value(tf, tf.float32, (2, 3), 6))
        b = tf.compat.v1.get_variable("layer/bias", initializer=_value(tf, tf.float64, (3,), 7))
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            out["v1"] = tf.compat.v1.train.Saver([a, b]).save(sess, str(d / "v1" / "model"))
    return out


def _bytes_of(value):
    if isinstance(value, torch.Tensor):
        return (
            value.contiguous().view(-1).view(torch.uint8).numpy().tobytes()
            if value.numel()
            else b""
        )
    return value


def _assert_same_as_tf(tf, prefix):
    ours = tf_checkpoint.read(prefix)
    assert tf_checkpoint.list_variables(prefix) == tf.train.list_variables(prefix)
    reader = tf.train.load_checkpoint(prefix)
    assert sorted(ours) == sorted(reader.get_variable_to_shape_map())
    dtypes = reader.get_variable_to_dtype_map()
    for key, value in ours.items():
        ref = reader.get_tensor(key)
        if dtypes[key] == tf.string:
            assert isinstance(value, np.ndarray) and value.shape == np.shape(ref), key
            assert value.tolist() == np.asarray(ref, dtype=object).tolist(), key
            continue
        ref = np.asarray(ref)
        assert tuple(value.shape) == ref.shape, key
        assert str(value.dtype).removeprefix("torch.") == dtypes[key].name, key
        assert _bytes_of(value) == ref.tobytes(), key
    return ours


@pytest.mark.needs_tf
def test_every_dtype(tf, ckpts):
    ours = _assert_same_as_tf(tf, ckpts["dtypes"])
    names = {k.split("/")[0] for k in ours}
    assert {
        "bfloat16_matrix",
        "float8_e5m2_scalar",
        "uint64_empty",
        "complex128_matrix",
        "string_matrix",
        "large",
    } <= names
    assert ours["large" + VALUE].shape == (1024, 1024)
    h = tf_checkpoint.header(ckpts["dtypes"])
    assert (h.num_shards, h.endianness, h.producer) == (1, "little", 1)


@pytest.mark.needs_tf
def test_several_shards_and_slices(tf, ckpts):
    prefix = ckpts["sharded"]
    assert tf_checkpoint.header(prefix).num_shards > 1
    entries = tf_checkpoint.entries(prefix)
    assert len({e.shard_id for e in entries.values()}) > 1
    assert any(e.slices for e in entries.values())  # big tensors were split into slices
    _assert_same_as_tf(tf, prefix)


@pytest.mark.needs_tf
def test_keras_model_and_object_graph(tf, ckpts):
    prefix = ckpts["keras"]
    ours = _assert_same_as_tf(tf, prefix)
    from tensorflow.core.protobuf import trackable_object_graph_pb2

    ref = trackable_object_graph_pb2.TrackableObjectGraph()
    ref.ParseFromString(tf.train.load_checkpoint(prefix).get_tensor(tf_checkpoint.OBJECT_GRAPH_KEY))
    nodes = tf_checkpoint.read_object_graph(prefix)
    assert len(nodes) == len(ref.nodes)
    for node, r in zip(nodes, ref.nodes):
        assert node.children == tuple((c.local_name, c.node_id) for c in r.children)
        assert [(a.name, a.full_name, a.checkpoint_key) for a in node.attributes] == [
            (a.name, a.full_name, a.checkpoint_key) for a in r.attributes
        ]
        assert [
            (s.original_variable_node_id, s.slot_name, s.slot_variable_node_id)
            for s in node.slot_variables
        ] == [
            (s.original_variable_node_id, s.slot_name, s.slot_variable_node_id)
            for s in r.slot_variables
        ]
    # Keys map to the Keras variables' own names (layer names included) ...
    names = tf_checkpoint.variable_names(prefix)
    model = ckpts["keras_model"]
    by_name = {v.path: v for v in model.weights}
    assert set(by_name) <= set(names.values())
    for key, name in names.items():
        if name in by_name:
            assert _bytes_of(ours[key]) == by_name[name].numpy().tobytes(), name
    # ... and to object paths whose first element is the one the key was built from.
    paths = tf_checkpoint.variable_paths(prefix)
    for key, p in paths.items():
        assert key == p[0] + "/.ATTRIBUTES/" + key.rsplit("/", 1)[1]


@pytest.mark.needs_tf
def test_saved_model_variables(tf, ckpts):
    sm = ckpts["saved_model"]
    prefix = os.path.join(sm, "variables", "variables")
    _assert_same_as_tf(tf, prefix)
    assert tf_checkpoint.read(sm).keys() == tf_checkpoint.read(prefix).keys()  # the directory
    assert tf_checkpoint.variable_paths(sm) == {"w" + VALUE: ["w"], "b" + VALUE: ["b"]}


@pytest.mark.needs_tf
def test_name_based_checkpoint(tf, ckpts):
    ours = _assert_same_as_tf(tf, ckpts["v1"])
    assert set(ours) == {"layer/kernel", "layer/bias"}
    with pytest.raises(CheckpointError, match="name-based"):
        tf_checkpoint.read_object_graph(ckpts["v1"])


@pytest.mark.needs_tf
def test_reads_without_tensorflow(tf, ckpts):
    """A process in which `import tensorflow` fails reads what TF wrote, to the same bytes."""
    prefixes = [ckpts[k] for k in ("dtypes", "sharded", "keras", "v1")]
    code = f"""
import hashlib, json, sys
sys.modules["tensorflow"] = None  # any import of tensorflow now raises ImportError
from torch_tfgrads import tf_checkpoint
out = {{}}
for prefix in {prefixes!r}:
    for key, value in tf_checkpoint.read(prefix).items():
        if isinstance(value, __import__("torch").Tensor):
            data = value.contiguous().view(-1).view(__import__("torch").uint8).numpy().tobytes() \\
                if value.numel() else b""
        else:
            data = b"|".join(value.reshape(-1).tolist())
        out[prefix + ":" + key] = hashlib.sha256(data).hexdigest()
    tf_checkpoint.read_object_graph({ckpts["keras"]!r})
assert not any(m == "tensorflow" or m.startswith("tensorflow.") for m in sys.modules
               if sys.modules[m] is not None)
print(json.dumps(out))
"""
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    digests = json.loads(res.stdout.strip().splitlines()[-1])
    expected = {}
    for prefix in prefixes:
        reader = tf.train.load_checkpoint(prefix)
        for key, dtype in reader.get_variable_to_dtype_map().items():
            ref = reader.get_tensor(key)
            data = (
                b"|".join(np.asarray(ref, dtype=object).reshape(-1).tolist())
                if dtype == tf.string
                else np.asarray(ref).tobytes()
            )
            expected[prefix + ":" + key] = hashlib.sha256(data).hexdigest()
    assert digests == expected


# ------------------------------------------------------------------------------ corrupted files


@pytest.fixture
def copy(ckpts, tmp_path):
    """A fresh copy of the dtype checkpoint to damage; returns its prefix."""
    src = ckpts["dtypes"]
    for f in os.listdir(os.path.dirname(src)):
        if f.startswith(os.path.basename(src) + "."):
            shutil.copy(os.path.join(os.path.dirname(src), f), tmp_path / f)
    return str(tmp_path / os.path.basename(src))


def _patch(path, offset, fn):
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([fn(b[0])]))


@pytest.mark.needs_tf
def test_flipped_byte_in_data_names_the_key(copy):
    entry = tf_checkpoint.entries(copy)["float64_matrix" + VALUE]
    _patch(f"{copy}.data-00000-of-00001", entry.offset + 5, lambda b: b ^ 0x10)
    with pytest.raises(
        CheckpointError,
        match=r"data-00000-of-00001: key 'float64_matrix.*"
        r"checksum mismatch",
    ):
        tf_checkpoint.read(copy)
    tf_checkpoint.read(copy, keys=["float32_matrix" + VALUE])  # the others are still fine


@pytest.mark.needs_tf
def test_flipped_byte_in_string_tensor(copy):
    entry = tf_checkpoint.entries(copy)["string_matrix" + VALUE]
    _patch(f"{copy}.data-00000-of-00001", entry.offset + entry.size - 1, lambda b: b ^ 1)
    with pytest.raises(CheckpointError, match="string_matrix.*checksum mismatch"):
        tf_checkpoint.read(copy)


@pytest.mark.needs_tf
def test_truncated_data_file(copy):
    path = f"{copy}.data-00000-of-00001"
    os.truncate(path, os.path.getsize(path) - 100)
    with pytest.raises(CheckpointError, match=r"data-00000-of-00001: key .*past the end"):
        tf_checkpoint.read(copy)


@pytest.mark.needs_tf
def test_missing_data_file(copy):
    os.remove(f"{copy}.data-00000-of-00001")
    with pytest.raises(CheckpointError, match="cannot read the data shard"):
        tf_checkpoint.read(copy)


@pytest.mark.needs_tf
@pytest.mark.parametrize("cut", [1, 40, 200])
def test_truncated_index(copy, cut):
    path = f"{copy}.index"
    os.truncate(path, os.path.getsize(path) - cut)
    with pytest.raises(CheckpointError, match=r"\.index"):
        tf_checkpoint.read(copy)


@pytest.mark.needs_tf
def test_bad_magic(copy):
    path = f"{copy}.index"
    _patch(path, os.path.getsize(path) - 1, lambda b: b ^ 0xFF)
    with pytest.raises(CheckpointError, match="bad magic"):
        tf_checkpoint.list_variables(copy)


@pytest.mark.needs_tf
def test_flipped_byte_in_index_block(copy):
    _patch(f"{copy}.index", 10, lambda b: b ^ 0x01)
    with pytest.raises(CheckpointError, match=r"\.index: checksum mismatch in data block"):
        tf_checkpoint.read(copy)


# ---------------------------------------------------------------------------------- load_weights


@pytest.mark.needs_tf
def test_load_weights(tf, tmp_path):
    kernel = _value(tf, tf.float32, (4, 3), 1)
    bias = _value(tf, tf.float32, (3,), 2)
    ckpt = tf.train.Checkpoint(dense=tf.Module())
    ckpt.dense.kernel = tf.Variable(tf.transpose(kernel))  # stored in torch's (out, in) layout
    ckpt.dense.bias = tf.Variable(bias)
    prefix = ckpt.write(str(tmp_path / "ckpt"))
    lin = torch.nn.Linear(4, 3)
    loaded = tf_checkpoint.load_weights(
        lin, prefix, {"weight": "dense/kernel" + VALUE, "bias": "dense/bias"}
    )
    assert loaded == ["weight", "bias"]
    assert lin.weight.detach().numpy().tobytes() == tf.transpose(kernel).numpy().tobytes()
    assert lin.bias.detach().numpy().tobytes() == bias.numpy().tobytes()

    # Without a map, "dense.kernel" reads as "dense/kernel".
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.dense = torch.nn.Module()
            self.dense.kernel = torch.nn.Parameter(torch.zeros(3, 4))
            self.dense.bias = torch.nn.Parameter(torch.zeros(3))

    m = M()
    assert sorted(tf_checkpoint.load_weights(m, prefix)) == ["dense.bias", "dense.kernel"]
    assert torch.equal(m.dense.bias, lin.bias)

    # A shape mismatch raises before anything is copied.
    lin2 = torch.nn.Linear(3, 4)
    before = lin2.bias.detach().clone()
    with pytest.raises(ValueError, match="load_weights: 'dense/bias.*float32.3., 'bias'"):
        tf_checkpoint.load_weights(lin2, prefix, {"bias": "dense/bias", "weight": "dense/kernel"})
    assert torch.equal(lin2.bias, before)
    with pytest.raises(KeyError, match="nope"):
        tf_checkpoint.load_weights(lin, prefix, {"weight": "nope"})


# ------------------------------------------------------------------------ protos match TF's own


@pytest.mark.needs_tf
def test_protos_match_tensorflow(tf):
    from tensorflow.core.protobuf import tensor_bundle_pb2, trackable_object_graph_pb2

    from torch_tfgrads.tf_checkpoint import protos

    def fields(desc, prefix=""):
        out = {}
        for f in desc.fields:
            t = f.type
            if t == f.TYPE_ENUM:
                t = f.TYPE_INT32  # declared as int32 here: the same varint on the wire
            out[prefix + f.name] = (
                f.number,
                t,
                f.label if hasattr(f, "label") else None,
                f.containing_oneof is not None,
            )
            if f.message_type is not None and f.message_type.name != desc.name:
                out.update(fields(f.message_type, prefix + f.name + "."))
        return out

    for ours, theirs in [
        (protos.BundleHeaderProto, tensor_bundle_pb2.BundleHeaderProto),
        (protos.BundleEntryProto, tensor_bundle_pb2.BundleEntryProto),
        (protos.TrackableObjectGraph, trackable_object_graph_pb2.TrackableObjectGraph),
    ]:
        assert fields(ours.DESCRIPTOR) == fields(theirs.DESCRIPTOR), ours.DESCRIPTOR.name


# ------------------------------------------------- an index rewritten with snappy-compressed blocks


def _varint(n):
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def _snappy_literals(raw):
    """A valid snappy stream made of literals only (what a compressor emits for random data)."""
    out = bytearray(_varint(len(raw)))
    for i in range(0, len(raw), 65536):
        chunk = raw[i : i + 65536]
        n = len(chunk) - 1
        out += (
            bytes([n << 2])
            if n < 60
            else bytes([60 << 2, n])
            if n < 256
            else bytes([61 << 2]) + n.to_bytes(2, "little")
        )
        out += chunk
    return bytes(out)


def _write_table(items, snappy):
    """A LevelDB-format table of `items` (one data block, a restart at every entry)."""
    import struct

    def block(entries):
        body, restarts = bytearray(), []
        for k, v in entries:
            restarts.append(len(body))
            body += _varint(0) + _varint(len(k)) + _varint(len(v)) + k + v
        restarts = restarts or [0]
        return bytes(body) + struct.pack(f"<{len(restarts) + 1}I", *restarts, len(restarts))

    out = bytearray()

    def put(raw):
        data, ctype = (_snappy_literals(raw), 1) if snappy else (raw, 0)
        handle = _varint(len(out)) + _varint(len(data))
        out.extend(data + bytes([ctype]))
        out.extend(struct.pack("<I", crc.mask(crc.extend(crc.crc32c(data), bytes([ctype])))))
        return handle

    data_handle = put(block(items))
    meta_handle = put(block([]))
    index_handle = put(block([(items[-1][0], data_handle)]))
    footer = (meta_handle + index_handle).ljust(40, b"\0")
    return bytes(out) + footer + struct.pack("<Q", 0xDB4775248B80FB57)


@pytest.mark.needs_tf
@pytest.mark.parametrize("snappy", [False, True])
def test_rewritten_index(ckpts, copy, snappy):
    from torch_tfgrads.tf_checkpoint.sstable import read_table

    with open(f"{copy}.index", "rb") as f:
        items = read_table(f.read())
    with open(f"{copy}.index", "wb") as f:
        f.write(_write_table(items, snappy))
    ours, ref = tf_checkpoint.read(copy), tf_checkpoint.read(ckpts["dtypes"])
    assert list(ours) == list(ref)
    assert all(
        _bytes_of(ours[k]) == _bytes_of(ref[k]) for k in ref if isinstance(ref[k], torch.Tensor)
    )
