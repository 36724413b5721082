"""Helpers shared by the families' public functions and fake kernels."""

import struct

import torch


def as_float32(v):
    """A Python float rounded to float32, as TF stores float attrs."""
    return struct.unpack("f", struct.pack("f", v))[0]


def tf_shape(shape):
    """A shape printed as TF prints it in messages: "[2,3,4]", no spaces."""
    return "[" + ",".join(str(s) for s in shape) + "]"


# c10::toString(ScalarType), which the C++ checks print for a dtype ("Float", not "torch.float32").
_SCALAR_TYPE_NAMES = {
    torch.uint8: "Byte",
    torch.int8: "Char",
    torch.int16: "Short",
    torch.int32: "Int",
    torch.int64: "Long",
    torch.float16: "Half",
    torch.float32: "Float",
    torch.float64: "Double",
    torch.complex64: "ComplexFloat",
    torch.complex128: "ComplexDouble",
    torch.bool: "Bool",
    torch.bfloat16: "BFloat16",
    torch.complex32: "ComplexHalf",
    torch.uint16: "UInt16",
    torch.uint32: "UInt32",
    torch.uint64: "UInt64",
    torch.float8_e4m3fn: "Float8_e4m3fn",
    torch.float8_e5m2: "Float8_e5m2",
}


def scalar_type_name(dtype):
    """A dtype as the C++ checks print it, so that fake and real messages are the same."""
    return _SCALAR_TYPE_NAMES.get(dtype, str(dtype).removeprefix("torch."))


def _check(cond, message, error, symbolic_check):
    # Dynamo cannot trace a message closure that formats a SymInt ("Can't convert
    # torch._check*() message closure"), so a symbolic condition is checked without its message:
    # the concrete check runs again, with the message, in the real kernel.
    if isinstance(cond, torch.SymBool):
        symbolic_check(cond)
    elif not cond:
        raise error(message())


def check_value(cond, message):
    """`torch._check_value(cond, message)` (ValueError) that also works on symbolic sizes."""
    _check(cond, message, ValueError, torch._check_value)


def check_shape(cond, message):
    """`torch._check(cond, message)` (RuntimeError: a shape that does not fit) that also works
    on symbolic sizes; the nn modules check their input with it."""
    _check(cond, message, RuntimeError, torch._check)


def check_same_device(ref, t, op, ref_name, name):
    """csrc/common/checks.h's check_same_device: the same condition and message."""
    torch._check(
        t.device == ref.device,
        lambda: (
            f"{op}: argument '{name}' is on {t.device} but '{ref_name}' is on {ref.device}; all "
            "tensors must be on one device"
        ),
    )
