"""Helpers shared by the families' public functions and fake kernels."""

import functools
import inspect
import numbers
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


# ---- Python types of the public functions' arguments
def _is_int(v):
    return isinstance(v, (numbers.Integral, torch.SymInt)) and not isinstance(v, bool)


def _is_number(v):
    return isinstance(v, (numbers.Real, torch.SymInt, torch.SymFloat)) and not isinstance(v, bool)


def _is_bool(v):
    return isinstance(v, (bool, torch.SymBool)) or type(v).__name__ == "bool_"  # numpy's bool


def _is_tensor(v):
    return isinstance(v, torch.Tensor)


def _list_of(accepts):
    return lambda v: isinstance(v, (list, tuple, range)) and all(accepts(e) for e in v)


def _or_none(accepts):
    return lambda v: v is None or accepts(v)


def _either(a, b):
    return lambda v: a(v) or b(v)


# The annotations the public functions use (as strings: `from __future__ import annotations`),
# with what each accepts and how a message says it.
_ACCEPTS = {
    "torch.Tensor": (_is_tensor, "a tensor"),
    "torch.Tensor | None": (_or_none(_is_tensor), "a tensor or None"),
    "Sequence[torch.Tensor]": (_list_of(_is_tensor), "a list of tensors"),
    "torch.Tensor | Sequence[int]": (_either(_is_tensor, _list_of(_is_int)), "a list of ints"),
    "int | torch.Tensor": (_either(_is_int, _is_tensor), "an int"),
    "int": (_is_int, "an int"),
    "int | None": (_or_none(_is_int), "an int or None"),
    "float": (_is_number, "a number"),
    "bool": (_is_bool, "a bool"),
    "str": (lambda v: isinstance(v, str), "a string"),
    "Sequence[int]": (_list_of(_is_int), "a list of ints"),
    "Sequence[int] | None": (_or_none(_list_of(_is_int)), "a list of ints or None"),
    "Sequence[float]": (_list_of(_is_number), "a list of numbers"),
}


def _type_name(v):
    if isinstance(v, (list, tuple)):
        odd = [e for e in v if not isinstance(e, (numbers.Real, torch.SymInt, torch.Tensor))]
        inner = type(odd[0] if odd else (v[0] if v else None)).__name__
        return f"{type(v).__name__} of {inner}" if v else f"empty {type(v).__name__}"
    return type(v).__name__


def typed_arguments(fn):
    """A public function whose arguments are checked against its annotations before it converts
    them: a wrong Python type raises TypeError naming the op and the argument (docs/errors.md),
    where it would fail inside a conversion ("'int' object is not iterable") or in the
    dispatcher's schema check. Values are the ops' to check."""
    op = fn.__name__
    params = list(inspect.signature(fn).parameters.values())
    checks = [(i, p.name, *_ACCEPTS[p.annotation]) for i, p in enumerate(params)]

    @functools.wraps(fn)
    def checked(*args, **kwargs):
        for i, name, accepts, what in checks:
            if i < len(args):
                v = args[i]
            elif name in kwargs:
                v = kwargs[name]
            else:
                continue
            if not accepts(v):
                raise TypeError(f"{op}: argument '{name}' must be {what}, got {_type_name(v)}")
        return fn(*args, **kwargs)

    return checked
