"""Input checks of the nn modules: a module names its own arguments in its errors (the user
never passed the op's), before the op sees the input."""

import torch


def check_input(cond, message):
    """Raises RuntimeError(message()) (a shape that does not fit the module) when cond is False.

    Under torch.compile with dynamic shapes `cond` may be symbolic: Dynamo cannot trace a message
    closure that formats a SymInt, so the symbolic check goes in without its message (the op's
    own check still names the op argument)."""
    if isinstance(cond, torch.SymBool):
        torch._check(cond)
    elif not cond:
        raise RuntimeError(message())
