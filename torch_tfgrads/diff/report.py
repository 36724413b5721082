"""The diff report: per layer, in the reference's execution order, how the torch run differs.

Every tensor of a layer is a row: ``output[i]``; ``weight/<var>`` (a trainable variable's value);
``state_in/<var>`` and ``state_out/<var>`` (a non-trainable variable, such as a moving
statistic, before and after the call); ``output_grad[i]``, ``input_grad[i]`` and
``weight_grad/<var>``. Each row has a *chained* metric (what the full torch run produced) and an
*isolated* one (the layer run alone on the reference's inputs, state and output gradient);
``output_grad`` is chained only (isolated, it is the reference's by construction), as is
``state_in`` after a layer's first call (it is what the earlier calls left); ``weight`` and a
first call's ``state_in`` rows are the same in both.

A layer's status: ``diverges`` (an isolated row is over tolerance: the layer itself computes
something else), ``error`` (it raised), ``inherited`` (only chained rows are over: it is fed
different numbers), ``ok``, ``unmapped`` (no torch module for it).

Example::

    >>> r = DiffReport([], dtype="float32", training=True, rtol=1e-5, atol=0.0)
    >>> r.first_divergence is None
    True
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field

from .metrics import Metric

REPORT_FORMAT = "torch_tfgrads.diff.report"
REPORT_VERSION = 1
FORWARD_KINDS = ("output", "weight", "state")
GRAD_KINDS = ("output_grad", "input_grad", "weight_grad")
DIVERGING = ("diverges", "error")
_PRIORITY = [
    "weight/",
    "state_in/",
    "output[",
    "state_out/",
    "output_grad[",
    "input_grad[",
    "weight_grad/",
]


def _rank(row) -> int:
    """Which over-tolerance row explains a divergence best: wrong weights or state first, then
    a wrong forward, then the backward."""
    return next((i for i, p in enumerate(_PRIORITY) if row.key.startswith(p)), len(_PRIORITY))


@dataclass
class RowDiff:
    """One tensor of one layer call: ``kind`` is one of output, weight, state, output_grad,
    input_grad, weight_grad (the key says which tensor)."""

    key: str
    kind: str
    shape: list[int]
    chained: Metric | None = None
    isolated: Metric | None = None

    def to_dict(self) -> dict:
        return {
            "key": self.key,
            "kind": self.kind,
            "shape": self.shape,
            "chained": self.chained.to_dict() if self.chained else None,
            "isolated": self.isolated.to_dict() if self.isolated else None,
        }


@dataclass
class LayerDiff:
    """One call of one Keras layer: ``name`` is the call's id (the layer path, ``#k`` for
    later calls), ``module`` the torch submodule's name (None if unmapped)."""

    name: str
    layer: str
    class_name: str
    module: str | None
    status: str = "ok"
    rows: list[RowDiff] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def worst(self, kinds, mode: str) -> float | None:
        """The largest relative error of the rows of these kinds in ``mode`` ("chained" or
        "isolated"); None if there is no such row."""
        vals = [
            getattr(r, mode).max_rel
            for r in self.rows
            if r.kind in kinds and getattr(r, mode) is not None
        ]
        return max(vals) if vals else None

    def over_rows(self, mode: str) -> list[RowDiff]:
        return [r for r in self.rows if getattr(r, mode) is not None and getattr(r, mode).over]

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "layer": self.layer,
            "class_name": self.class_name,
            "module": self.module,
            "status": self.status,
            "notes": self.notes,
            "summary": {
                f"{what}_{mode}": _num(self.worst(kinds, mode))
                for what, kinds in (("forward", FORWARD_KINDS), ("gradient", GRAD_KINDS))
                for mode in ("chained", "isolated")
            },
            "rows": [r.to_dict() for r in self.rows],
        }


def _num(v):
    return None if v is None or not math.isfinite(v) else v


def _fmt(v) -> str:
    if v is None:
        return "-"
    if not math.isfinite(v):
        return "inf"
    return "0" if v == 0 else f"{v:.1e}"


class DiffReport:
    """What :func:`torch_tfgrads.diff.compare` found.

    ``layers``: :class:`LayerDiff` per layer call in the reference's execution order.
    ``first_divergence``: the name of the first layer whose own computation diverges (or that
    raised), or None. ``model_rows``: the model's outputs and loss (chained). ``reference``:
    what the recording says about itself (versions, loss).
    """

    def __init__(
        self,
        layers,
        *,
        dtype,
        training,
        rtol,
        atol,
        float64=False,
        model_rows=(),
        reference=None,
        notes=(),
    ):
        self.layers: list[LayerDiff] = list(layers)
        self.dtype, self.training, self.rtol, self.atol = dtype, training, rtol, atol
        self.float64 = float64
        self.model_rows: list[RowDiff] = list(model_rows)
        self.reference = dict(reference or {})
        self.notes = list(notes)

    @property
    def first_divergence(self) -> str | None:
        first = next((lay for lay in self.layers if lay.status in DIVERGING), None)
        return first.name if first else None

    @property
    def diverging(self) -> list[str]:
        """Every layer whose own computation diverges, in order (there may be several faults)."""
        return [lay.name for lay in self.layers if lay.status in DIVERGING]

    def layer(self, name: str) -> LayerDiff:
        """The LayerDiff of a call id (``"conv"``, ``"shared#1"``)."""
        for lay in self.layers:
            if lay.name == name:
                return lay
        raise KeyError(f"DiffReport.layer: no layer {name!r} in the report")

    def summary(self) -> str:
        """One line: the first divergence and why, or that there is none."""
        name = self.first_divergence
        if name is None:
            worst = max(
                (
                    v
                    for lay in self.layers
                    for v in [lay.worst(FORWARD_KINDS + GRAD_KINDS, "chained")]
                    if v is not None
                ),
                default=0.0,
            )
            text = (
                f"No divergence: every layer is within rtol {self.rtol:g} when run alone "
                f"(largest chained error {_fmt(worst)})."
            )
            inherited = sum(1 for lay in self.layers if lay.status == "inherited")
            if inherited:  # no layer is wrong, yet errors grow: the network amplifies rounding
                text += (
                    f" {inherited} layer(s) are over tolerance in the full run only: rounding "
                    "amplified along the network (compare in float64 to confirm)."
                )
            return text
        lay = self.layer(name)
        if lay.status == "error":
            why = lay.notes[0] if lay.notes else "it raised"
            if self.notes:  # the chained run raised too: nothing after it was compared chained
                why += " (the chained run stopped there)"
        else:
            # the root cause first: wrong weights, then a wrong forward, then the backward
            over = lay.over_rows("isolated")
            rank = min(_rank(r) for r in over)
            r = max((r for r in over if _rank(r) == rank), key=lambda r: r.isolated.max_rel)
            m = r.isolated
            why = (
                f"isolated {r.key}: {m.note}"
                if m.note
                else (
                    f"isolated {r.key}: max rel {_fmt(m.max_rel)}, max abs {_fmt(m.max_abs)}, "
                    f"{_fmt(m.max_ulp)} ulp, {m.frac_over:.0%} of elements over"
                )
            )
        inherited = sum(1 for lay in self.layers if lay.status == "inherited")
        if not inherited:
            return (
                f"First divergence: {name} ({lay.class_name}): {why}. No other layer is affected."
            )
        return (
            f"First divergence: {name} ({lay.class_name}): {why}. {inherited} other layer(s) "
            "only inherit errors (in the forward the layers after it, in the backward those "
            "before it too)."
        )

    # ------------------------------------------------------------------ output
    def _table_rows(self):
        for i, lay in enumerate(self.layers):
            over = lay.over_rows("isolated") or lay.over_rows("chained")
            candidates = over or [r for r in lay.rows if (r.isolated or r.chained) is not None]
            worst = max(
                candidates,
                key=lambda r: (
                    (
                        r.isolated
                        if r.isolated is not None and (r.isolated.over or not over)
                        else r.chained
                    ).max_rel
                ),
                default=None,
            )
            if lay.status in ("error", "unmapped") or worst is None:
                detail = "; ".join(lay.notes)
                detail = detail if len(detail) <= 90 else detail[:89] + "…"
            else:
                m = (
                    worst.isolated
                    if worst.isolated is not None and (worst.isolated.over or not over)
                    else worst.chained
                )
                detail = (
                    f"{worst.key}: {_fmt(m.max_rel)}, {_fmt(m.max_ulp)} ulp, {m.frac_over:.0%} over"
                )
            yield [
                str(i),
                lay.name,
                lay.class_name,
                lay.status.upper() if lay.status in DIVERGING else lay.status,
                _fmt(lay.worst(FORWARD_KINDS, "chained")),
                _fmt(lay.worst(FORWARD_KINDS, "isolated")),
                _fmt(lay.worst(GRAD_KINDS, "chained")),
                _fmt(lay.worst(GRAD_KINDS, "isolated")),
                detail,
            ]

    HEADER = [
        "#",
        "layer",
        "class",
        "status",
        "fwd chained",
        "fwd isolated",
        "grad chained",
        "grad isolated",
        "worst tensor",
    ]

    def title(self) -> str:
        mode = "training" if self.training else "inference"
        f64 = ", float64 rerun" if self.float64 else ""
        return (
            f"Layer-by-layer diff ({self.dtype}, {mode}{f64}; rtol {self.rtol:g}, atol "
            f"{self.atol:g}; relative errors are max |torch - ref| / max |ref|)"
        )

    def table(self, *, rows: bool = False, rich: bool | None = None) -> str:
        """The report as text: one line per layer, then the summary; ``rows=True`` adds every
        tensor of the diverging layers. Uses rich (colours) when installed and ``rich`` is not
        False; returns the text either way."""
        body = list(self._table_rows())
        detail = self._detail_lines() if rows else []
        if rich is not False:
            try:
                return self._rich_table(body, detail)
            except ImportError:
                if rich:
                    raise
        widths = [max(len(r[i]) for r in [self.HEADER] + body) for i in range(len(self.HEADER))]
        lines = [self.title(), "  ".join(h.ljust(w) for h, w in zip(self.HEADER, widths)).rstrip()]
        lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in body]
        lines += [""] + detail + [self.summary()]
        return "\n".join(lines)

    def _rich_table(self, body, detail) -> str:
        from rich.console import Console
        from rich.table import Table

        colours = {
            "DIVERGES": "bold red",
            "ERROR": "bold red",
            "inherited": "yellow",
            "ok": "green",
            "unmapped": "dim",
        }
        t = Table(title=self.title(), title_justify="left")
        for h in self.HEADER:
            t.add_column(h, justify="right" if h in ("#",) or "ed" in h else "left")
        for r in body:
            t.add_row(*r, style=colours.get(r[3]))
        console = Console(width=160, record=True, force_terminal=False)
        with console.capture() as cap:
            console.print(t)
            for line in [*detail, self.summary()]:
                console.print(line, markup=False, highlight=False, soft_wrap=True)
        return cap.get()

    def _detail_lines(self) -> list[str]:
        lines = []
        width = max((len(r.key) for lay in self.layers for r in lay.rows), default=10) + 2
        for lay in self.layers:
            if lay.status not in DIVERGING:
                continue
            lines.append(f"{lay.name} ({lay.class_name}, torch module {lay.module!r}):")
            for note in lay.notes:
                lines.append(f"    note: {note}")
            for r in lay.rows:
                parts = []
                for mode in ("chained", "isolated"):
                    m = getattr(r, mode)
                    if m is not None:
                        parts.append(
                            f"{mode} rel {_fmt(m.max_rel)} abs {_fmt(m.max_abs)} "
                            f"ulp {_fmt(m.max_ulp)} over {m.frac_over:.0%}"
                            + (f" ({m.note})" if m.note else "")
                        )
                lines.append(f"    {r.key:<{width}} {r.shape!s:<16} " + " | ".join(parts))
        return lines

    def __str__(self) -> str:
        return self.table(rich=False)

    def to_dict(self) -> dict:
        """Everything, as JSON-ready data (non-finite numbers are None, with a note)."""
        return {
            "format": REPORT_FORMAT,
            "version": REPORT_VERSION,
            "dtype": self.dtype,
            "training": self.training,
            "float64": self.float64,
            "rtol": self.rtol,
            "atol": self.atol,
            "first_divergence": self.first_divergence,
            "diverging": self.diverging,
            "summary": self.summary(),
            "notes": self.notes,
            "reference": self.reference,
            "model": [r.to_dict() for r in self.model_rows],
            "layers": [lay.to_dict() for lay in self.layers],
        }

    def to_json(self, path=None) -> str:
        """The report as JSON (``to_dict``), written to ``path`` if given; returns the text."""
        text = json.dumps(self.to_dict(), indent=1, allow_nan=False)
        if path is not None:
            with open(os.fspath(path), "w", encoding="utf-8") as f:
                f.write(text + "\n")
        return text

    def svg(self) -> str:
        """The chart of per-layer errors along the network (see :mod:`.html`)."""
        from .html import chart_svg

        return chart_svg(self)

    def to_html(self, path=None) -> str:
        """A standalone HTML page (inline SVG chart and tables, no scripts), written to
        ``path`` if given; returns the text."""
        from .html import report_html

        text = report_html(self)
        if path is not None:
            with open(os.fspath(path), "w", encoding="utf-8") as f:
                f.write(text)
        return text
