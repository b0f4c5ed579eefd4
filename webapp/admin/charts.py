"""Tiny server-side SVG line charts (no JavaScript needed, no CDN). Output is built from numbers
and escaped labels only, so it is safe to embed with ``|safe``. Colours and fonts come from
classes styled in static/css/admin.css (the CSP allows no inline styles); the SVG scales to its
container through its viewBox.

Time-axis labels are rendered in UTC and carry ``data-time`` (ISO) and ``data-time-format``
(``time`` or ``date``), so static/js/admin.js can show them in the browser's time zone."""
from __future__ import annotations

from datetime import datetime
from typing import Any

from markupsafe import Markup, escape

ARM_CLASSES = {"control": "series-control", "variant": "series-variant"}


def _parse(ts: str) -> datetime | None:
    try:
        return datetime.fromisoformat(ts.replace("Z", "+00:00"))
    except (TypeError, ValueError):
        return None


def _value_label(v: float | None, percent: bool, digits: int = 2) -> str:
    if v is None:
        return "no data"
    return f"{v * 100:.0f}%" if percent else (f"{v:.{digits}f}".rstrip("0").rstrip(".") if isinstance(v, float)
                                              else str(v))


def _tick_label(ts: str, unit: str | None, with_date: bool) -> tuple[str, str]:
    """(UTC fallback text, data-time-format) of a time-axis tick."""
    dt = _parse(ts)
    if dt is None:
        return ts, ""
    if unit == "day":
        return f"{dt.day} {dt:%b}", "date"
    if with_date:
        return f"{dt.day} {dt:%b} {dt:%H:%M}", "datetime"
    return f"{dt:%H:%M}", "time"


def ticks(n: int, most: int = 5) -> list[int]:
    """Indices of at most ``most`` ticks over ``n`` evenly spaced points: every k-th point from
    the first, so the labelled times are regular intervals (labels never crowd together)."""
    if n <= 0:
        return []
    if n <= most:
        return list(range(n))
    step = -(-(n - 1) // (most - 1))
    return list(range(0, n, step))


def line_chart(starts: list[str], series: dict[str, list[float | None]], title: str, percent: bool = False,
               unit: str | None = "day", y_range: tuple[float, float] | None = None, width: int = 520,
               height: int = 190) -> Markup:
    """A line per arm over time buckets ``starts`` (ISO times, evenly spaced). The y axis runs
    over ``y_range``, else 0-100% for ``percent``, else from 0 to the largest value (counts:
    rounded up to an even number, so the middle grid line is a whole number)."""
    label = escape(title)
    values = [v for vs in series.values() for v in vs if v is not None]
    if not starts or not values:
        return Markup(f'<svg class="chart" role="img" viewBox="0 0 {width} {height}" aria-label="{label}: no data yet">'
                      f'<text x="{width // 2}" y="{height // 2}" text-anchor="middle" class="chart-empty">'
                      f'No data yet</text></svg>')
    pad_l, pad_r, pad_t, pad_b = 54, 16, 14, 30
    if y_range is not None:
        lo, hi = min(y_range[0], min(values)), max(y_range[1], max(values))
    elif percent:
        lo, hi = 0.0, 1.0
    else:
        lo, hi = min(0.0, min(values)), max(values) or 1.0
        if all(isinstance(v, int) for v in values):
            hi += hi % 2
    span = (hi - lo) or 1.0
    n = len(starts)

    def x(i: int) -> float:
        return pad_l + (width - pad_l - pad_r) * (i / (n - 1) if n > 1 else 0.5)

    def y(v: float) -> float:
        return pad_t + (height - pad_t - pad_b) * (1 - (v - lo) / span)

    # a text alternative: the last value of each arm
    last = {arm: next((v for v in reversed(vs) if v is not None), None) for arm, vs in series.items()}
    summary = "; ".join(f"{arm} {_value_label(v, percent)}" for arm, v in last.items())
    parts = [f'<svg class="chart" role="img" viewBox="0 0 {width} {height}" '
             f'aria-label="{label}, {n} points; latest: {escape(summary)}">']
    for frac in (0.0, 0.5, 1.0):
        v = lo + span * frac
        text = f"{v * 100:.0f}%" if percent else (f"{v:.1f}" if span < 10 else f"{v:.0f}")
        parts.append(f'<line x1="{pad_l}" x2="{width - pad_r}" y1="{y(v):.1f}" y2="{y(v):.1f}" class="chart-grid"/>'
                     f'<text x="{pad_l - 6}" y="{y(v) + 4:.1f}" text-anchor="end" class="chart-axis">{text}</text>')
    first_day = _parse(starts[0])
    multi_day = first_day is not None and any((d := _parse(s)) is not None and d.date() != first_day.date()
                                              for s in starts)
    tick_idx = ticks(n)
    for i in tick_idx:
        text, fmt = _tick_label(starts[i], unit, with_date=multi_day)
        anchor = "start" if i == 0 and n > 1 else "end" if i == n - 1 and n > 1 else "middle"
        attrs = f' data-time="{escape(starts[i])}" data-time-format="{fmt}"' if fmt else ""
        parts.append(f'<text x="{x(i):.1f}" y="{height - 9}" text-anchor="{anchor}" class="chart-axis"{attrs}>'
                     f'{escape(text)}</text>')
    dots = n <= 48
    for arm, vs in series.items():
        cls = ARM_CLASSES.get(arm, "series-other")
        points = [(x(i), y(v), i, v) for i, v in enumerate(vs) if v is not None]
        if len(points) > 1:
            path = " ".join(f"{px:.1f},{py:.1f}" for px, py, _, _ in points)
            parts.append(f'<polyline class="chart-line {cls}" points="{path}"/>')
        if dots or len(points) == 1:
            for px, py, i, v in points:
                parts.append(f'<circle class="chart-dot {cls}" cx="{px:.1f}" cy="{py:.1f}" r="3">'
                             f'<title>{escape(arm)}, {escape(starts[i])}: {_value_label(v, percent)}</title></circle>')
    parts.append("</svg>")
    return Markup("".join(parts))


def _num_label(v: float, percent: bool = False) -> str:
    """A short number for an axis or a tooltip (3 significant digits; percent for rates)."""
    if percent:
        return f"{v * 100:.0f}%"
    if v == 0:
        return "0"
    if abs(v) >= 1000 or abs(v) < 0.01:
        return f"{v:.1e}".replace("e+0", "e").replace("e-0", "e-")
    return f"{v:.3g}"


def step_ticks(lo: int, hi: int, most: int = 5) -> list[int]:
    """Whole-number ticks from ``lo`` to ``hi`` (both included), at most ``most``, evenly stepped."""
    if hi <= lo:
        return [lo]
    step = max(1, -(-(hi - lo) // (most - 1)))
    out = list(range(lo, hi, step))
    if hi - out[-1] < step / 2 and len(out) > 1:
        out.pop()
    return out + [hi]


def step_chart(title: str, lines: list[dict], percent: bool = False, width: int = 520, height: int = 190) -> Markup:
    """Training curves over optimisation steps: one polyline per entry of ``lines``
    (``{"label", "cls", "points": [{"step", "value"}, ...]}``), x from the first to the last step
    of any line, y over the values (0-100% at least for ``percent``). static/js/admin.js draws the
    same chart in the browser (``stepChart``) while a run trains: keep the two alike."""
    label = escape(title)
    values = [p["value"] for line in lines for p in line["points"]]
    own = len(lines[0]["points"]) if lines else 0
    if not values:
        return Markup(f'<svg class="chart" role="img" viewBox="0 0 {width} {height}" data-points="0" '
                      f'aria-label="{label}: no data yet"><text x="{width // 2}" y="{height // 2}" '
                      f'text-anchor="middle" class="chart-empty">No data yet</text></svg>')
    pad_l, pad_r, pad_t, pad_b = 66, 16, 14, 30  # room for "-9.7e-3" at the phone's larger font
    steps = [p["step"] for line in lines for p in line["points"]]
    s_lo, s_hi = min(steps), max(steps)
    lo, hi = min(values), max(values)
    if percent:
        lo, hi = min(lo, 0.0), max(hi, 1.0)
    elif hi - lo < 1e-12:
        lo, hi = lo - (abs(lo) * 0.1 or 1.0), hi + (abs(hi) * 0.1 or 1.0)
    else:
        margin = (hi - lo) * 0.05
        lo, hi = lo - margin, hi + margin
    span = hi - lo

    def x(step: float) -> float:
        return pad_l + (width - pad_l - pad_r) * ((step - s_lo) / (s_hi - s_lo) if s_hi > s_lo else 0.5)

    def y(v: float) -> float:
        return pad_t + (height - pad_t - pad_b) * (1 - (v - lo) / span)

    summary = "; ".join(f"{line['label']} {_num_label(line['points'][-1]['value'], percent)} at step "
                        f"{line['points'][-1]['step']}" for line in lines if line["points"])
    parts = [f'<svg class="chart" role="img" viewBox="0 0 {width} {height}" data-points="{own}" '
             f'aria-label="{label} over {s_hi} steps; latest: {escape(summary)}">']
    for frac in (0.0, 0.5, 1.0):
        v = lo + span * frac
        parts.append(f'<line x1="{pad_l}" x2="{width - pad_r}" y1="{y(v):.1f}" y2="{y(v):.1f}" class="chart-grid"/>'
                     f'<text x="{pad_l - 6}" y="{y(v) + 4:.1f}" text-anchor="end" class="chart-axis">'
                     f'{_num_label(v, percent)}</text>')
    ticks_ = step_ticks(s_lo, s_hi)
    for i, step in enumerate(ticks_):
        anchor = ("start" if i == 0 and len(ticks_) > 1
                  else "end" if i == len(ticks_) - 1 and len(ticks_) > 1 else "middle")
        parts.append(f'<text x="{x(step):.1f}" y="{height - 9}" text-anchor="{anchor}" class="chart-axis">'
                     f'{"step " if i == 0 else ""}{step}</text>')
    for line in lines:
        cls = escape(line["cls"])
        pts = line["points"]
        if len(pts) > 1:
            path = " ".join(f"{x(p['step']):.1f},{y(p['value']):.1f}" for p in pts)
            parts.append(f'<polyline class="chart-line {cls}" points="{path}"/>')
        if len(pts) <= 40:
            for p in pts:
                parts.append(f'<circle class="chart-dot {cls}" cx="{x(p["step"]):.1f}" cy="{y(p["value"]):.1f}" '
                             f'r="2.5"><title>{escape(line["label"])}, step {p["step"]}: '
                             f'{_num_label(p["value"], percent)}</title></circle>')
    parts.append("</svg>")
    return Markup("".join(parts))


def _lines(chart: dict[str, Any], data: dict[str, Any], group: str, name: str) -> list[dict[str, Any]]:
    stage = data["series"].get(chart["stage"], {})
    lines = []
    for i, (metric, label) in enumerate(zip(chart["metrics"], chart["labels"])):
        points = stage.get(metric, [])
        if group == "b" and not points:
            continue  # the compared run has no such metric (another algorithm)
        lines.append({"label": f"{name} {label}".strip(), "cls": f"series-{group}{i}", "points": points})
    return lines


def curve_figures(data: dict[str, Any], other: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """One figure per chart of ``data`` (a run_curves answer), with ``other``'s series of the
    same metrics overlaid: ``{id, stage, title, svg, legend: [(label, cls)]}``."""
    figures = []
    for chart in data["charts"]:
        lines = _lines(chart, data, "a", f"run #{data['run_id']}")
        if other is not None:
            lines += _lines(chart, other, "b", f"run #{other['run_id']}")
        figures.append({"id": chart["id"], "stage": chart["stage"], "title": chart["title"],
                        "svg": step_chart(chart["title"], lines, percent=chart["percent"]),
                        "legend": [(line["label"], line["cls"]) for line in lines]})
    return figures
