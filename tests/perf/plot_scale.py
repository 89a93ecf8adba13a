"""Draw docs/images/scale.svg from tests/perf/results/scale.json (written by test_scale.py):
one panel per cost, partition count on the x axis, both systems' medians, log scales.

    python -m tests.perf.plot_scale [figures.json] [out.svg]

Plain SVG from the standard library: the README shows it as it is."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from tests.perf.test_scale import FIGURES_FILE

OUT = Path(__file__).resolve().parents[2] / "docs" / "images" / "scale.svg"
PANELS = (  # (row key, title)
    ("create", "create until all have leaders (s)"),
    ("restart", "kill -9 to first write (s)"),
    ("delete", "delete until gone (s)"),
    ("metadata_first_ms", "Metadata, every topic, first answer (ms)"),
    ("metadata_ms", "Metadata, the same again (ms)"),
    ("rss", "resident memory per partition (KiB)"),
    ("produce", "produce spread (msg/s, higher is better)"),
    ("consume", "consume spread (msg/s, higher is better)"),
    ("fetch_ms", "sessionless Fetch, none new (ms)"),
    ("dtp_first_ms", "DescribeTopicPartitions, first walk (ms)"),
    ("java_produce", "Java producer, spread (msg/s, higher is better)"),
    ("java_consume", "Java consumer, fetch sessions (msg/s, higher is better)"),
)
COLORS = {"dcmirror": "#1f77b4", "kafka": "#d62728"}
W, H, COLS = 310, 210, 3
PAD_L, PAD_R, PAD_T, PAD_B = 48, 24, 28, 34


def _ticks(lo: float, hi: float) -> list[float]:
    return [10.0 ** e for e in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)]


def _label(v: float) -> str:
    return f"{v:,.0f}" if v >= 1 else f"{v:g}"


def panel(x0: float, y0: float, title: str, series: dict[str, list[tuple[float, float]]]) -> list[str]:
    points = [pt for pts in series.values() for pt in pts]
    xs = _ticks(min(p[0] for p in points), max(p[0] for p in points))
    ys = _ticks(min(p[1] for p in points), max(p[1] for p in points))
    if len(ys) < 2:
        ys = [ys[0], ys[0] * 10]

    def sx(v: float) -> float:
        return x0 + PAD_L + (math.log10(v) - math.log10(xs[0])) / (math.log10(xs[-1]) - math.log10(xs[0]) or 1) \
            * (W - PAD_L - PAD_R)

    def sy(v: float) -> float:
        return y0 + H - PAD_B - (math.log10(v) - math.log10(ys[0])) / (math.log10(ys[-1]) - math.log10(ys[0])) \
            * (H - PAD_T - PAD_B)

    out = [f'<text x="{x0 + W / 2}" y="{y0 + 16}" text-anchor="middle" font-size="12">{title}</text>',
           f'<rect x="{x0 + PAD_L}" y="{y0 + PAD_T}" width="{W - PAD_L - PAD_R}" height="{H - PAD_T - PAD_B}" '
           'fill="none" stroke="#999"/>']
    for t in xs:
        out.append(f'<text x="{sx(t):.1f}" y="{y0 + H - PAD_B + 14}" text-anchor="middle" font-size="10">'
                   f'{_label(t)}</text>')
    for t in ys:
        out.append(f'<line x1="{x0 + PAD_L}" x2="{x0 + W - PAD_R}" y1="{sy(t):.1f}" y2="{sy(t):.1f}" stroke="#eee"/>')
        out.append(f'<text x="{x0 + PAD_L - 4}" y="{sy(t) + 3:.1f}" text-anchor="end" font-size="10">{_label(t)}</text>')
    for name, pts in series.items():
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in sorted(pts))
        out.append(f'<polyline points="{path}" fill="none" stroke="{COLORS[name]}" stroke-width="2"/>')
        out += [f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{COLORS[name]}"/>' for x, y in pts]
    out.append(f'<text x="{x0 + W / 2}" y="{y0 + H - 6}" text-anchor="middle" font-size="10">partitions</text>')
    return out


def render(figures: dict) -> str:
    medians = figures["medians"]
    rows = math.ceil(len(PANELS) / COLS)
    width, height = COLS * W, rows * H + 30
    body: list[str] = []
    for i, (key, title) in enumerate(PANELS):
        series = {name: [(float(n), v[key]) for n, v in per.items() if v.get(key)]
                  for name, per in medians.items() if name in COLORS}
        series = {k: v for k, v in series.items() if v}
        if series:
            body += panel((i % COLS) * W, (i // COLS) * H, title, series)
    legend_y = rows * H + 18
    body.append(f'<text x="10" y="{legend_y}" font-size="11" fill="{COLORS["dcmirror"]}">— dcmirror</text>')
    body.append(f'<text x="100" y="{legend_y}" font-size="11" fill="{COLORS["kafka"]}">'
                f'— Apache Kafka {figures["kafka_version"]}</text>')
    body.append(f'<text x="300" y="{legend_y}" font-size="11">one broker, topics of 100 partitions, RF 1; '
                'tests/perf/test_scale.py</text>')
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif">'
            f'<rect width="100%" height="100%" fill="white"/>' + "".join(body) + "</svg>\n")


def main(argv: list[str]) -> None:
    src = Path(argv[0]) if argv else FIGURES_FILE
    out = Path(argv[1]) if len(argv) > 1 else OUT
    out.write_text(render(json.loads(src.read_text())))
    print(out)


if __name__ == "__main__":
    main(sys.argv[1:])
