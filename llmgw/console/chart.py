"""Server-drawn SVG charts for the console (no script, no library): a bar chart of a series over time,
with its axis and a title on every bar, so the numbers are readable without hovering too.

Values of None are drawn as gaps marked unknown, never as zero bars.
"""

from __future__ import annotations

import math
import time
from typing import Sequence

from llmgw.console.layout import esc

WIDTH, HEIGHT = 640, 160  # the viewBox: the chart scales to its card's width, the axis and bars with it
PAD_LEFT, PAD_RIGHT, PAD_BOTTOM, PAD_TOP = 56, 8, 22, 18
LABEL_FONT = 10
LABEL_W = 5 * LABEL_FONT * 0.62  # an "HH:MM" label's width, in viewBox units
LABEL_GAP = 12  # viewBox units kept free between two time labels


def _short(n: float) -> str:
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n:.3g}" if n != int(n) else str(int(n))


def label_every(count: int, plot_w: float = WIDTH - PAD_LEFT - PAD_RIGHT) -> int:
    """Every how many bars a time label fits without touching the next (labels of 5 characters)."""
    return max(1, math.ceil((LABEL_W + LABEL_GAP) / (plot_w / max(count, 1))))


def bars(title: str, points: Sequence[tuple[float, float | None]], *, testid: str, unit: str = "") -> str:
    """A bar per point (`(unix time, value)`, oldest first, so the newest at the right); the y axis from 0 to
    the largest value. Drawn in a viewBox that scales to the width it is given (`width="100%"`): no part of
    it is ever beyond its card. Time labels are spaced so they never overlap, the newest bar's always shown;
    a value above 0 is at least a visible sliver, never a flat 0."""
    known = [v for _, v in points if v is not None]
    top = max(known, default=0.0) or 1.0
    plot_w, plot_h = WIDTH - PAD_LEFT - PAD_RIGHT, HEIGHT - PAD_BOTTOM - PAD_TOP
    step = plot_w / max(len(points), 1)
    every = label_every(len(points), plot_w)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" width="100%" '
             f'preserveAspectRatio="xMidYMid meet" role="img" aria-label="{esc(title)}" data-testid="{esc(testid)}" '
             f'class="chart"><title>{esc(title)}</title>',
             f'<text x="{PAD_LEFT}" y="12" font-size="12">{esc(title)} (max {_short(top if known else 0)}'
             f'{esc(unit)})</text>',
             f'<line x1="{PAD_LEFT}" y1="{PAD_TOP + plot_h}" x2="{WIDTH - PAD_RIGHT}" y2="{PAD_TOP + plot_h}" '
             f'stroke="#888"/>',
             f'<text x="{PAD_LEFT - 4}" y="{PAD_TOP + 8}" font-size="{LABEL_FONT}" text-anchor="end">{_short(top)}'
             f'</text>',
             f'<text x="{PAD_LEFT - 4}" y="{PAD_TOP + plot_h}" font-size="{LABEL_FONT}" text-anchor="end">0</text>']
    newest = len(points) - 1
    for i, (at, value) in enumerate(points):
        x = PAD_LEFT + i * step
        label = time.strftime("%H:%M", time.gmtime(at))
        mark = ' data-newest="1"' if i == newest else ""
        if value is None:
            parts.append(f'<rect x="{x + 1:.1f}" y="{PAD_TOP}" width="{max(step - 2, 1):.1f}" height="{plot_h}" '
                         f'fill="#f3e9d2" data-at="{at:.0f}"{mark}><title>{label} UTC: unknown</title></rect>')
        else:
            h = plot_h * value / top
            if value > 0:
                h = max(h, 1.5)
            parts.append(f'<rect x="{x + 1:.1f}" y="{PAD_TOP + plot_h - h:.1f}" width="{max(step - 2, 1):.1f}" '
                         f'height="{h:.1f}" fill="#3a7bd5" data-value="{value:g}" data-at="{at:.0f}"{mark}>'
                         f'<title>{label} UTC: {value:g}{esc(unit)}</title></rect>')
        if (newest - i) % every == 0:  # counted from the newest: the current hour is always labelled
            half = LABEL_W / 2  # kept inside the viewBox: the newest label under a thin last bar too
            parts.append(f'<text x="{min(max(x + step / 2, half), WIDTH - half):.1f}" y="{HEIGHT - 6}" '
                         f'font-size="{LABEL_FONT}" '
                         f'text-anchor="middle" class="tick">{label}</text>')
    parts.append("</svg>")
    return "".join(parts)


def hourly(rows: Sequence[dict[str, float]], now: float, hours: int, field: str | Sequence[str]) -> list[
        tuple[float, float | None]]:
    """Per hour of the last `hours` (oldest first), the sum of `field` (or fields) over usage rows of
    `usage.query(by="hour")`; an hour with no row is 0 (the rollups are complete: nothing used)."""
    names = (field,) if isinstance(field, str) else tuple(field)
    last = int(now) - int(now) % 3600
    sums = {last - 3600 * i: 0.0 for i in range(hours)}
    for row in rows:
        start = int(row.get("period_start", -1))
        if start in sums:
            sums[start] += sum(float(row.get(n) or 0) for n in names)
    return [(float(start), value) for start, value in sorted(sums.items())]
