"""The diagnosis as text (the terminal report) and as ``index.html`` beside the plots."""

from __future__ import annotations

import html
from pathlib import Path

from recformer.doctor.checks import Diagnosis


def report_text(d: Diagnosis) -> str:
    """The verdict, each finding with its evidence and advice, then the checks passed and skipped."""
    lines = [f"recformer doctor: {d.run_dir} ({d.steps} steps; read {', '.join(d.sources)})", ""]
    if d.healthy and not d.passed:
        lines.append("no verdict: none of the checks found the metrics it needs")
    elif d.healthy:
        lines.append(f"clean bill of health: all {len(d.passed)} checks with data passed")
    else:
        lines.append(f"{len(d.findings)} finding(s):")
    for f in d.findings:
        where = f" [blocks {', '.join(map(str, f.blocks))}]" if f.blocks else ""
        lines.append(f"- {f.check}: {f.title}{where}")
        lines.extend(f"    {e}" for e in f.evidence)
        if f.advice:
            lines.append(f"    what to try: {f.advice}")
    lines.append("")
    lines.append("passed: " + ("; ".join(d.passed) if d.passed else "none"))
    if d.skipped:
        lines.append("skipped (no data in this run): " + "; ".join(d.skipped))
    return "\n".join(lines)


def write_html(d: Diagnosis, plots: list[tuple[str, str]], out: Path) -> Path:
    """``out/index.html``: the findings above the plots (``(file name, title)`` pairs in ``out``)."""
    e = html.escape
    verdict = (
        f"<p class='ok'>Clean bill of health: all {len(d.passed)} checks with data passed.</p>"
        if d.healthy
        else f"<p class='bad'>{len(d.findings)} finding(s).</p>"
    )
    items = []
    for f in d.findings:
        blocks = f" (blocks {', '.join(map(str, f.blocks))})" if f.blocks else ""
        ev = "".join(f"<li><code>{e(x)}</code></li>" for x in f.evidence)
        items.append(
            f"<li><b>{e(f.check)}</b>: {e(f.title)}{e(blocks)}<ul>{ev}</ul>"
            f"<i>What to try:</i> {e(f.advice)}</li>"
        )
    figs = "".join(
        f"<figure><img src='{e(name)}' alt='{e(t)}'><figcaption>{e(t)}</figcaption></figure>"
        for name, t in plots
    )
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>recformer doctor: {e(d.run_dir)}</title>
<style>body{{font-family:sans-serif;margin:2em}} .ok{{color:#070}} .bad{{color:#b00}}
figure{{display:inline-block;margin:.5em}} img{{max-width:640px}} code{{font-size:90%}}</style></head>
<body><h1>recformer doctor</h1><p>{e(d.run_dir)}: {d.steps} steps; read {e(", ".join(d.sources))}</p>
{verdict}<ul>{"".join(items)}</ul>
<p>Passed: {e("; ".join(d.passed) or "none")}</p>
<p>Skipped (no data): {e("; ".join(d.skipped) or "none")}</p>
<h2>Metrics</h2>{figs}
</body></html>
"""
    path = out / "index.html"
    path.write_text(page, encoding="utf-8")
    return path
