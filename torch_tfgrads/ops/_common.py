"""Helpers shared by the families' public functions and fake kernels."""
import struct

import torch


def as_float32(v):
    """A Python float rounded to float32, as TF stores float attrs."""
    return struct.unpack("f", struct.pack("f", v))[0]


def tf_shape(shape):
    """A shape printed as TF prints it in messages: "[2,3,4]", no spaces."""
    return "[" + ",".join(str(s) for s in shape) + "]"


def check_value(cond, message):
    """`torch._check_value(cond, message)` that also works on symbolic sizes under Dynamo.

    Dynamo cannot trace a message closure that formats a SymInt ("Can't convert torch._check*()
    message closure"), so a symbolic condition is checked without its message: the concrete
    check runs again, with the message, in the real kernel."""
    if isinstance(cond, torch.SymBool):
        torch._check_value(cond)
    elif not cond:
        raise ValueError(message())


def check_type(cond, message):
    """The dtype counterpart of `check_value`: raises TypeError."""
    if not cond:
        raise TypeError(message())


def attrs_list(values):
    """A list attribute passed on to an op: plain ints, SymInts kept symbolic."""
    return [v if isinstance(v, torch.SymInt) else int(v) for v in values]
