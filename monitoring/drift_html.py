"""The drift report as a small self-contained HTML page (``render_html(report)``): the verdict, the descriptor
table with inline SVG histograms (reference grey, current blue), the embedding drift, the rates, the window and
the timings. No scripts, no external resources (Evidently's own page carries a ~3.7 MB JavaScript bundle)."""

from __future__ import annotations

import html

from monitoring.drift import DriftReport, Histogram, said

_STYLE = (
    "body{font-family:system-ui,sans-serif;margin:2em;color:#222}table{border-collapse:collapse;margin:1em 0}"
    "td,th{border-bottom:1px solid #ddd;padding:4px 10px;text-align:left;vertical-align:middle}"
    ".drifted{color:#b00020;font-weight:600}.no_drift{color:#1b5e20;font-weight:600}.inconclusive{color:#8a6d00;"
    "font-weight:600}.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}.nw{white-space:nowrap}"
    "small{color:#666}"
)


def _num(value: float | None, digits: int = 3) -> str:
    if value is None:
        return "–"
    return f"{value:.{digits}g}" if abs(value) < 1e-3 and value != 0 else f"{value:.{digits}f}"


def _svg(h: Histogram, width: int = 220, height: int = 48) -> str:
    """Two overlaid bar histograms: reference grey, current blue."""
    n = len(h.reference)
    top = max([*h.reference, *h.current, 1e-9])
    bar = width / n
    rects = []
    for values, color in ((h.reference, "#9e9e9e"), (h.current, "#1e88e5")):
        for i, v in enumerate(values):
            bh = height * v / top
            rects.append(
                f'<rect x="{i * bar:.1f}" y="{height - bh:.1f}" width="{bar - 1:.1f}" height="{bh:.1f}" '
                f'fill="{color}" fill-opacity="0.55"/>'
            )
    label = f"{_num(h.edges[0], 3)} .. {_num(h.edges[-1], 3)}"
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
        f'aria-label="histogram {html.escape(label)}">{"".join(rects)}</svg><br><small>{html.escape(label)}</small>'
    )


def render_html(r: DriftReport) -> str:
    """A small self-contained page: verdict, descriptor table with inline SVG histograms, embedding drift,
    rates, window and timings. No scripts, no external resources."""
    e = html.escape
    rows = [
        ("reference prompts", f"{r.reference_n}"),
        ("current prompts", f"{r.current_n}" + (f" ({r.dropped_empty} empty dropped)" if r.dropped_empty else "")),
        ("rule", r.rule),
        ("drifted descriptor share", f"{_num(r.drifted_share, 2)} (threshold {r.drift_share_threshold:g})"),
        ("config hash", r.config_hash[:16]),
        (
            "seconds",
            f"total {r.seconds.total_s:.2f}: descriptors {r.seconds.descriptors_s:.2f}, embedding "
            f"{r.seconds.embedding_s:.2f}, embedding drift {r.seconds.embedding_drift_s:.2f}",
        ),
    ]
    if r.window is not None:
        versions = ", ".join(f"{v}: {n}" for v, n in r.window.versions.items()) or "–"
        rows.insert(0, ("window", f"{r.window.start.isoformat()} .. {r.window.end.isoformat()} ({versions})"))
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>Prompt drift: {e(r.status)}</title>"
        f"<style>{_STYLE}</style></head><body>",
        f"<h1>Prompt drift: <span class='{e(r.status)}'>{e(r.status.replace('_', ' '))}</span></h1>",
        f"<p>{e(r.reason)}</p>",
        "<table>" + "".join(f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in rows) + "</table>",
    ]
    if r.descriptors:
        head = "<tr><th>descriptor</th><th>test</th><th>score</th><th>threshold</th><th>reference mean</th>"
        head += (
            "<th>current mean</th><th>verdict</th><th>distribution <small>(grey reference, blue current)</small></th>"
        )
        body = []
        for d in r.descriptors:
            verdict = "drift" if d.drifted else ("no drift" if d.informative else "constant (not counted)")
            shown = "drifted" if d.drifted else "no_drift"
            name = d.name if d.kind == "numerical" else f"pattern {d.name} (match share)"
            body.append(
                f"<tr><td>{e(name)}</td><td class='nw'>{e(d.method)}</td><td class='num'>{_num(d.score)}</td>"
                f"<td class='num'>{d.threshold:g}</td><td class='num'>{_num(d.reference_mean)}</td>"
                f"<td class='num'>{_num(d.current_mean)}</td><td class='{shown}'>{e(verdict)}</td>"
                f"<td>{_svg(d.histogram) if d.histogram else ''}</td></tr>"
            )
        parts.append("<h2>Descriptors</h2><table>" + head + "</tr>" + "".join(body) + "</table>")
    if r.embedding is not None:
        m = r.embedding
        bound = "bootstrap (95th percentile of no-drift scores)" if m.threshold is None else f"{m.threshold:g}"
        parts.append(
            "<h2>Embeddings</h2><table>"
            f"<tr><th>method</th><td>{e(m.method)}</td></tr><tr><th>score</th><td>{_num(m.score)}</td></tr>"
            f"<tr><th>threshold</th><td>{e(bound)}</td></tr>"
            f"<tr><th>verdict</th><td class='{'drifted' if m.drifted else 'no_drift'}'>{said(m.drifted)}</td></tr>"
            f"<tr><th>{'distinct prompts' if m.distinct else 'prompts'} embedded</th><td>reference "
            f"{m.reference_rows}, current {m.current_rows} ({m.dimensions} dimensions)</td></tr></table>"
        )
    if r.current_rates is not None or r.reference_rates is not None:
        body = []
        for label, rates in (("current window", r.current_rates), ("reference (champion baseline)", r.reference_rates)):
            if rates is None:
                continue
            body.append(
                f"<tr><td>{e(label)}</td><td class='num'>{_num(rates.safety_hit_rate)} "
                f"({rates.safety_hits}/{rates.answered})</td><td class='num'>{_num(rates.refusal_rate)} "
                f"({rates.refusals}/{rates.completed})</td></tr>"
            )
        parts.append(
            "<h2>Rates</h2><table><tr><th></th><th>safety-hit rate</th><th>refusal rate</th></tr>"
            + "".join(body)
            + "</table>"
        )
    parts.append("</body></html>")
    return "\n".join(parts)
