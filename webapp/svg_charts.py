"""Tiny server-side SVG line charts (no JavaScript, no CDN). Output is built from numbers and
escaped labels only, so it is safe to embed with ``|safe``."""
from __future__ import annotations

from markupsafe import Markup, escape

COLORS = {"control": "#6b7280", "variant": "#4f46e5"}


def line_chart(dates: list[str], series: dict[str, list[float | None]], title: str, percent: bool = False,
               width: int = 520, height: int = 180) -> Markup:
    pad_l, pad_r, pad_t, pad_b = 44, 12, 24, 28
    values = [v for vs in series.values() for v in vs if v is not None]
    if not dates or not values:
        return Markup(f'<svg class="chart" role="img" width="{width}" height="{height}" aria-label="{escape(title)}">'
                      f'<text x="10" y="20" class="chart-title">{escape(title)}</text>'
                      f'<text x="10" y="{height // 2}" class="chart-empty">No data yet</text></svg>')
    lo, hi = (0.0, 1.0) if percent else (min(0.0, min(values)), max(values) or 1.0)
    span = (hi - lo) or 1.0
    n = len(dates)

    def x(i: int) -> float:
        return pad_l + (width - pad_l - pad_r) * (i / (n - 1) if n > 1 else 0.5)

    def y(v: float) -> float:
        return pad_t + (height - pad_t - pad_b) * (1 - (v - lo) / span)

    parts = [f'<svg class="chart" role="img" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
             f'aria-label="{escape(title)}"><text x="{pad_l}" y="16" class="chart-title">{escape(title)}</text>']
    for frac in (0.0, 0.5, 1.0):
        v = lo + span * frac
        label = f"{v * 100:.0f}%" if percent else (f"{v:.1f}" if span < 10 else f"{v:.0f}")
        parts.append(f'<line x1="{pad_l}" x2="{width - pad_r}" y1="{y(v):.1f}" y2="{y(v):.1f}" class="chart-grid"/>'
                     f'<text x="{pad_l - 6}" y="{y(v) + 4:.1f}" text-anchor="end" class="chart-axis">{label}</text>')
    for i in sorted({0, n - 1}):
        parts.append(f'<text x="{x(i):.1f}" y="{height - 8}" text-anchor="middle" class="chart-axis">'
                     f'{escape(dates[i][5:])}</text>')
    for arm, vs in series.items():
        color = COLORS.get(arm, "#111827")
        points = [(x(i), y(v)) for i, v in enumerate(vs) if v is not None]
        if len(points) > 1:
            path = " ".join(f"{px:.1f},{py:.1f}" for px, py in points)
            parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{path}"/>')
        for px, py in points:
            parts.append(f'<circle cx="{px:.1f}" cy="{py:.1f}" r="3" fill="{color}"/>')
    legend_x = width - pad_r - 150
    for j, arm in enumerate(series):
        parts.append(f'<rect x="{legend_x + j * 75}" y="7" width="10" height="10" fill="{COLORS.get(arm, "#111827")}"/>'
                     f'<text x="{legend_x + j * 75 + 14}" y="16" class="chart-axis">{escape(arm)}</text>')
    parts.append("</svg>")
    return Markup("".join(parts))
