"""The report as a picture: an SVG chart of per-layer errors along the depth of the network,
and a standalone HTML page around it (inline CSS and SVG; no script, no external resource).

The chart's x axis is the layers in execution order, its y axis the relative error on a log
scale. Four curves: forward chained (solid blue), forward isolated (dashed blue), gradient
chained (solid red), gradient isolated (dashed red); the tolerance is a grey dashed line and the
first divergence a red vertical line. A layer's status is the coloured square under its name.
Exact agreement (error 0) is drawn on the bottom edge (labelled 0), a failed comparison (inf) on the top.

Example::

    >>> from .report import DiffReport
    >>> chart_svg(DiffReport([], dtype="float32", training=True, rtol=1e-5, atol=0.0))[:4]
    '<svg'
"""

from __future__ import annotations

import math
from html import escape

from .report import DIVERGING, FORWARD_KINDS, GRAD_KINDS, DiffReport, _fmt

CURVES = (  # label, kinds, mode, colour, dash
    ("forward, chained", FORWARD_KINDS, "chained", "#1f6fb4", ""),
    ("forward, isolated", FORWARD_KINDS, "isolated", "#1f6fb4", "6 4"),
    ("gradient, chained", GRAD_KINDS, "chained", "#c8372d", ""),
    ("gradient, isolated", GRAD_KINDS, "isolated", "#c8372d", "6 4"),
)
STATUS_COLOURS = {
    "ok": "#4caf50",
    "inherited": "#f2b632",
    "diverges": "#d32f2f",
    "error": "#7b1fa2",
    "unmapped": "#b0b0b0",
}


def _range(values, rtol):
    finite = [v for v in values if v is not None and math.isfinite(v) and v > 0]
    lo = min(finite + [rtol])
    hi = max(finite + [rtol])
    ymin = max(math.floor(math.log10(lo)) - 1, -18)
    ymax = max(math.ceil(math.log10(hi)), ymin + 2, 0)
    return ymin, ymax


def chart_svg(report: DiffReport) -> str:
    """The SVG chart of ``report`` (a standalone ``<svg>`` element)."""
    layers = report.layers
    n = max(len(layers), 1)
    step = max(26.0, min(56.0, 760.0 / n))
    left, right, bottom, plot_h = 70, 24, 130, 250
    width = int(left + right + step * n)
    width = max(width, 640)
    step = (width - left - right) / n
    series = [[lay.worst(kinds, mode) for lay in layers] for _, kinds, mode, _, _ in CURVES]
    ymin, ymax = _range([v for s in series for v in s], report.rtol)
    # the legend, wrapped to the chart's width: (x, y, sample line attributes, label)
    legend = [(colour, dash, "2", label) for label, _, _, colour, dash in CURVES]
    legend.append(("#888", "2 3", "1", f"rtol {report.rtol:g}"))
    placed, lx, ly = [], left, 36
    for item in legend:
        w = 40 + 6.3 * len(item[3])
        if lx + w > width - right and lx > left:
            lx, ly = left, ly + 16
        placed.append((lx, ly, item))
        lx += w
    top = ly + 28
    height = top + plot_h + bottom
    zero = ymin - 1  # exact agreement gets its own row under the lowest decade

    def y_of(v):
        if v is None:
            return None
        if v == 0:
            lv = zero
        elif not math.isfinite(v):
            lv = ymax
        else:
            lv = min(max(math.log10(v), ymin), ymax)
        return top + plot_h * (ymax - lv) / (ymax - zero)

    def x_of(i):
        return left + step * (i + 0.5)

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="Helvetica, Arial, sans-serif" '
        'font-size="11">',
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="white"/>',
        f'<text x="{left}" y="18" font-size="14" font-weight="bold">'
        f"{escape(_chart_title(report))}</text>",
    ]
    for lx, ly, (colour, dash, sw, label) in placed:
        out.append(
            f'<line x1="{lx}" y1="{ly}" x2="{lx + 26}" y2="{ly}" stroke="{colour}" '
            f'stroke-width="{sw}" stroke-dasharray="{dash}"/>'
        )
        out.append(f'<text x="{lx + 31}" y="{ly + 4}">{escape(label)}</text>')
    # axes and decade grid
    for d in range(ymin, ymax + 1):
        y = y_of(10.0**d)
        out.append(
            f'<line x1="{left}" y1="{y:.1f}" x2="{width - right}" y2="{y:.1f}" stroke="#e6e6e6"/>'
        )
        out.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">1e{d}</text>')
    out.append(f'<text x="{left - 6}" y="{y_of(0) + 4:.1f}" text-anchor="end">0</text>')
    out.append(
        f'<rect x="{left}" y="{top}" width="{width - left - right}" height="{plot_h}" '
        'fill="none" stroke="#999"/>'
    )
    out.append(
        f'<text transform="translate(16 {top + plot_h / 2}) rotate(-90)" '
        'text-anchor="middle">max |torch - ref| / max |ref|</text>'
    )
    ty = y_of(report.rtol)
    out.append(
        f'<line x1="{left}" y1="{ty:.1f}" x2="{width - right}" y2="{ty:.1f}" '
        'stroke="#888" stroke-dasharray="2 3"/>'
    )
    # first divergence
    first = report.first_divergence
    if first is not None:
        i = next(k for k, lay in enumerate(layers) if lay.name == first)
        x = x_of(i)
        out.append(
            f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{top + plot_h}" '
            'stroke="#d32f2f" stroke-width="2" opacity="0.6"/>'
        )
        anchor = "start" if i < n / 2 else "end"
        dx = 5 if anchor == "start" else -5
        out.append(
            f'<text x="{x + dx:.1f}" y="{top + 14}" fill="#d32f2f" font-weight="bold" '
            f'text-anchor="{anchor}">first divergence: {escape(first)}</text>'
        )
    # curves
    for (label, _, _, colour, dash), values in zip(CURVES, series):
        segment = []
        for i, v in enumerate(values + [None]):
            y = y_of(v) if i < len(values) else None
            if y is None:
                if len(segment) > 1:
                    pts = " ".join(f"{px:.1f},{py:.1f}" for px, py in segment)
                    out.append(
                        f'<polyline points="{pts}" fill="none" stroke="{colour}" '
                        f'stroke-width="1.8" stroke-dasharray="{dash}"/>'
                    )
                segment = []
                continue
            segment.append((x_of(i), y))
        for i, v in enumerate(values):
            y = y_of(v)
            if y is None:
                continue
            fill = colour if not dash else "white"
            tip = f"{layers[i].name}: {label} {_fmt(v)}"
            out.append(
                f'<circle cx="{x_of(i):.1f}" cy="{y:.1f}" r="3" fill="{fill}" '
                f'stroke="{colour}" stroke-width="1.4"><title>{escape(tip)}</title>'
                "</circle>"
            )
    # layer names and status squares
    for i, lay in enumerate(layers):
        x = x_of(i)
        colour = STATUS_COLOURS.get(lay.status, "#b0b0b0")
        out.append(
            f'<rect x="{x - 4:.1f}" y="{top + plot_h + 5}" width="8" height="8" '
            f'fill="{colour}"><title>{escape(lay.name)}: {lay.status}</title></rect>'
        )
        ly = top + plot_h + 20
        weight = ' font-weight="bold"' if lay.status in DIVERGING else ""
        out.append(
            f'<text x="{x:.1f}" y="{ly}" text-anchor="end"{weight} '
            f'transform="rotate(-50 {x:.1f} {ly})">{escape(_short(lay.name))}</text>'
        )
    sx = left
    sy = height - 10
    for status, colour in STATUS_COLOURS.items():
        out.append(f'<rect x="{sx}" y="{sy - 8}" width="8" height="8" fill="{colour}"/>')
        out.append(f'<text x="{sx + 11}" y="{sy}">{status}</text>')
        sx += 30 + 6.3 * len(status)
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _short(name: str, n: int = 22) -> str:
    return name if len(name) <= n else "…" + name[-(n - 1) :]


def _chart_title(report: DiffReport) -> str:
    mode = "training" if report.training else "inference"
    return f"Relative error per layer ({report.dtype}, {mode})"


_CSS = """
body { font-family: Helvetica, Arial, sans-serif; margin: 24px; color: #222; }
table { border-collapse: collapse; font-size: 13px; margin: 8px 0 24px; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.diverges td, tr.error td { background: #fde2e1; font-weight: bold; }
tr.inherited td { background: #fff6dc; }
tr.unmapped td { color: #888; }
td.over { color: #b71c1c; font-weight: bold; }
.summary { font-size: 16px; margin: 12px 0; }
"""


def _metric_cells(m) -> str:
    if m is None:
        return '<td class="num">-</td>' * 4
    cls = "num over" if m.over else "num"
    note = f' title="{escape(m.note)}"' if m.note else ""
    return (
        f'<td class="{cls}"{note}>{_fmt(m.max_rel)}</td><td class="num">{_fmt(m.max_abs)}'
        f'</td><td class="num">{_fmt(m.max_ulp)}</td><td class="num">{m.frac_over:.1%}</td>'
    )


def _rows_table(rows) -> str:
    head = (
        "<tr><th>tensor</th><th>shape</th>"
        + "".join(
            f"<th>{mode} {what}</th>"
            for mode in ("chained", "isolated")
            for what in ("max rel", "max abs", "max ulp", "over")
        )
        + "</tr>"
    )
    body = "".join(
        f"<tr><td>{escape(r.key)}</td><td>{r.shape}</td>{_metric_cells(r.chained)}"
        f"{_metric_cells(r.isolated)}</tr>"
        for r in rows
    )
    return f"<table>{head}{body}</table>"


def report_html(report: DiffReport) -> str:
    """A standalone HTML page: summary, chart, a table of every layer, then every tensor of
    the diverging layers and the model's outputs."""
    header = "".join(f"<th>{escape(h)}</th>" for h in report.HEADER)
    body = []
    for lay, cells in zip(report.layers, report._table_rows()):
        tds = "".join(
            f'<td class="num">{escape(c)}</td>' if 4 <= k <= 7 else f"<td>{escape(c)}</td>"
            for k, c in enumerate(cells)
        )
        body.append(f'<tr class="{lay.status}">{tds}</tr>')
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{escape(report.title())}</title><style>{_CSS}</style></head><body>",
        f"<h1>Where do the numbers differ?</h1><p>{escape(report.title())}</p>",
        f'<p class="summary">{escape(report.summary())}</p>',
        report.svg(),
        "<h2>Layers</h2>",
        "<p>Chained: the whole torch module run on the model inputs. Isolated: each layer run "
        "alone on the reference's inputs for it, and backpropagating the reference's gradient "
        "of its output. A layer whose isolated error is over tolerance computes something "
        "else; one whose chained error alone is over only inherits its inputs' errors.</p>",
        f"<table><tr>{header}</tr>{''.join(body)}</table>",
    ]
    for lay in report.layers:
        if lay.status in DIVERGING:
            parts.append(f"<h2>{escape(lay.name)} ({escape(lay.class_name)}): {lay.status}</h2>")
            parts += [f"<p>{escape(n)}</p>" for n in lay.notes]
            parts.append(_rows_table(lay.rows))
    if report.model_rows:
        parts += ["<h2>Model outputs and loss</h2>", _rows_table(report.model_rows)]
    if report.reference:
        ref = ", ".join(
            f"{escape(str(k))} {escape(str(v))}"
            for k, v in report.reference.get("versions", {}).items()
        )
        parts.append(
            f"<p>Reference recorded with {ref}; loss "
            f"{escape(str(report.reference.get('loss', '')))}.</p>"
        )
    parts += [f"<p>{escape(n)}</p>" for n in report.notes]
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
