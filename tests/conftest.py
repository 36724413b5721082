"""Fixtures shared by the tests (helpers they import live in helpers.py).

TensorFlow is the oracle: it must be imported on its Eigen path (TF_ENABLE_ONEDNN_OPTS=0),
which has to be set before the first import, hence here. With TFGRADS_REQUIRE_TF=1 (CI), a
missing TensorFlow fails the tests that need it instead of skipping them; the same holds for
TFGRADS_REQUIRE_CUDA=1 and the CUDA tests.
"""

import os

os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import pytest  # noqa: E402
import torch  # noqa: E402

import torch_tfgrads  # noqa: E402,F401
from helpers import REQUIRE_CUDA, REQUIRE_TF, cuda_kernels_available  # noqa: E402
from torch_tfgrads.parity._tf import TFUnavailable, import_tf  # noqa: E402


@pytest.fixture(scope="session")
def tf():
    try:
        return import_tf()
    except TFUnavailable as e:
        if REQUIRE_TF:
            pytest.fail(f"TFGRADS_REQUIRE_TF=1 but {e}")
        pytest.skip(str(e))


@pytest.fixture(scope="session")
def keras(tf):
    """Keras 3 on TensorFlow."""
    os.environ["KERAS_BACKEND"] = "tensorflow"
    import keras as k

    assert k.backend.backend() == "tensorflow"
    return k


@pytest.fixture
def floatx(keras):
    """Sets Keras's float type for the models a test builds; restored after."""
    old, old_policy = keras.config.floatx(), keras.config.dtype_policy()

    def set_floatx(name):  # the global dtype policy is cached from floatx on first use
        keras.config.set_floatx(name)
        keras.config.set_dtype_policy(name)

    yield set_floatx
    keras.config.set_floatx(old)
    keras.config.set_dtype_policy(old_policy)


def pytest_runtest_setup(item):
    if REQUIRE_CUDA and item.get_closest_marker("needs_cuda") and not cuda_kernels_available():
        pytest.fail("TFGRADS_REQUIRE_CUDA=1 but no GPU is usable or the CUDA kernels are missing")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(12345)  # differs from the explicit generators the tests seed with 0
