"""Server-drawn SVG charts for the console (no script, no library): a bar chart of a series over time,
with its axis and a title on every bar, so the numbers are readable without hovering too.

Values of None are drawn as gaps marked unknown, never as zero bars.
"""

from __future__ import annotations

import time
from typing import Sequence

from llmgw.console.layout import esc

WIDTH, HEIGHT = 640, 160
PAD_LEFT, PAD_BOTTOM, PAD_TOP = 56, 22, 18


def _short(n: float) -> str:
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n:.3g}" if n != int(n) else str(int(n))


def bars(title: str, points: Sequence[tuple[float, float | None]], *, testid: str, unit: str = "") -> str:
    """A bar per point (`(unix time, value)`, oldest first); the y axis from 0 to the largest value."""
    known = [v for _, v in points if v is not None]
    top = max(known, default=0.0) or 1.0
    plot_w, plot_h = WIDTH - PAD_LEFT - 8, HEIGHT - PAD_BOTTOM - PAD_TOP
    step = plot_w / max(len(points), 1)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" '
             f'height="{HEIGHT}" role="img" aria-label="{esc(title)}" data-testid="{esc(testid)}" '
             f'class="chart"><title>{esc(title)}</title>',
             f'<text x="{PAD_LEFT}" y="12" font-size="12">{esc(title)} (max {_short(top if known else 0)}'
             f'{esc(unit)})</text>',
             f'<line x1="{PAD_LEFT}" y1="{PAD_TOP + plot_h}" x2="{WIDTH - 8}" y2="{PAD_TOP + plot_h}" stroke="#888"/>',
             f'<text x="{PAD_LEFT - 4}" y="{PAD_TOP + 8}" font-size="10" text-anchor="end">{_short(top)}</text>',
             f'<text x="{PAD_LEFT - 4}" y="{PAD_TOP + plot_h}" font-size="10" text-anchor="end">0</text>']
    for i, (at, value) in enumerate(points):
        x = PAD_LEFT + i * step
        label = time.strftime("%H:%M", time.gmtime(at))
        if value is None:
            parts.append(f'<rect x="{x + 1:.1f}" y="{PAD_TOP}" width="{max(step - 2, 1):.1f}" height="{plot_h}" '
                         f'fill="#f3e9d2"><title>{label} UTC: unknown</title></rect>')
        else:
            h = plot_h * value / top
            parts.append(f'<rect x="{x + 1:.1f}" y="{PAD_TOP + plot_h - h:.1f}" width="{max(step - 2, 1):.1f}" '
                         f'height="{h:.1f}" fill="#3a7bd5" data-value="{value:g}"><title>{label} UTC: '
                         f'{value:g}{esc(unit)}</title></rect>')
        if i % max(len(points) // 6, 1) == 0:
            parts.append(f'<text x="{x + step / 2:.1f}" y="{HEIGHT - 6}" font-size="10" text-anchor="middle">'
                         f'{label}</text>')
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
