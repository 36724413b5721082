"""Python expressions as generated source, wrapped at 100 columns the way ``ruff format`` (and
black) wraps them, so that a generated file is already formatted: a statement that fits stays
on one line; otherwise its last bracket pair opens, with the arguments of a call (or the
parameters of a def) on one indented line if they fit there and one per line with a trailing
comma if not; a list or dict literal that does not fit always gets one item per line; the
right-hand side of an assignment whose brackets cannot open within the line is parenthesized."""

import math

LINE_LENGTH = 100
INDENT = "    "


class Atom:
    """Code that is never split: a name, a number, a string, a short tuple."""

    def __init__(self, text: str):
        self.text = text

    def flat(self) -> str:
        return self.text


class Brackets:
    """``opener item, item closer``: a call (opener ``"f("``), a def's parameters, or a list,
    tuple or dict literal (``literal=True``). Items are ``(prefix, node)``: ``("padding=", ...)``
    for a keyword argument, ``('"kernel": ', ...)`` for a dict entry."""

    def __init__(self, opener: str, items: list, closer: str, literal: bool):
        self.opener, self.items, self.closer, self.literal = opener, items, closer, literal
        self.func = None  # a call's function when that is a call itself

    def flat(self) -> str:
        return self.opener + ", ".join(p + n.flat() for p, n in self.items) + self.closer


def call(func, args=(), kwargs=()) -> Brackets:
    """``func(*args, **kwargs)`` of nodes; kwargs as (name, node) pairs; ``func`` is a name or
    itself a call (``getattr(self, "conv-1")``)."""
    items = [("", a) for a in args] + [(f"{k}=", v) for k, v in kwargs]
    node = Brackets(f"{func if isinstance(func, str) else func.flat()}(", items, ")", False)
    node.func = func if isinstance(func, Brackets) else None
    return node


def string(s: str) -> str:
    """A string literal quoted as the formatter quotes it (double quotes unless it holds one)."""
    r = repr(s)
    if r.startswith("'") and '"' not in s:  # then s holds no quote of either kind
        r = f'"{r[1:-1]}"'
    return r


def literal(v):
    """A node for a Keras config value (JSON data: dict, list, str, number, bool, None) or a
    tuple (a weight shape)."""
    if isinstance(v, bool) or v is None:
        return Atom(repr(v))
    if isinstance(v, int):
        return Atom(str(v))
    if isinstance(v, float):
        return Atom(repr(v) if math.isfinite(v) else f'float("{v}")')
    if isinstance(v, str):
        return Atom(string(v))
    if isinstance(v, tuple) and len(v) == 1:  # the one-tuple's comma is not a trailing comma
        return Atom(f"({literal(v[0]).flat()},)")
    if isinstance(v, (list, tuple)):
        if not v:
            return Atom("[]" if isinstance(v, list) else "()")
        ends = "[]" if isinstance(v, list) else "()"
        return Brackets(ends[0], [("", literal(x)) for x in v], ends[1], True)
    if isinstance(v, dict):
        if not v:
            return Atom("{}")
        items = [(f"{string(str(k))}: ", literal(x)) for k, x in v.items()]
        return Brackets("{", items, "}", True)
    raise TypeError(f"cannot write {type(v).__name__} {v!r} as a Python literal")


def lines(head: str, node, tail: str = "", indent: str = "") -> list[str]:
    """The statement ``head + node + tail`` at ``indent``, wrapped as ruff format wraps it."""
    flat = f"{indent}{head}{node.flat()}{tail}"
    if len(flat) <= LINE_LENGTH or not isinstance(node, Brackets):
        return [flat]
    if node.literal or (node.items and len(f"{indent}{head}{node.opener}") <= LINE_LENGTH):
        return _split(head, node, tail, indent)
    # the node's brackets cannot open within the line
    statement = head.endswith(" = ") or head == "return "
    parens_fit = statement and len(f"{indent}{head}(") <= LINE_LENGTH
    func = node.func
    if func is not None and (len(f"{indent}{head}{func.opener}") <= LINE_LENGTH or not parens_fit):
        # `x = getattr(self, "a")(...)`: the formatter opens the first call
        out = _split(head, func, "", indent)[:-1]
        rest = f"{indent}){node.flat()[len(func.flat()) :]}{tail}"  # `)(args)`
        if len(rest) <= LINE_LENGTH or not node.items:
            return [*out, rest]
        return [*out, f"{indent})(", *_body(node, indent + INDENT), f"{indent}){tail}"]
    if parens_fit:  # it parenthesizes the right-hand side instead
        return [f"{indent}{head}(", *lines("", node, "", indent + INDENT), f"{indent}){tail}"]
    return _split(head, node, tail, indent) if node.items else [flat]


def _split(head, node, tail, indent):
    body = _body(node, indent + INDENT)
    return [f"{indent}{head}{node.opener}", *body, f"{indent}{node.closer}{tail}"]


def _body(node, inner):
    """The lines between a split node's brackets."""
    if len(node.items) == 1:  # no comma to split at: the item splits at its own brackets
        prefix, item = node.items[0]
        body = lines(prefix, item, "", inner)
    else:
        one_line = inner + ", ".join(p + n.flat() for p, n in node.items)
        if not node.literal and len(one_line) <= LINE_LENGTH:
            body = [one_line]
        else:
            body = [s for p, n in node.items for s in lines(p, n, ",", inner)]
    return body
