"""A grid's report from its points' ``point.json`` files: ``results.csv`` (a row per point),
``results.md`` (a row per setting: mean and spread over seeds, the command of each point) and the
PNG plots the grid file asks for (``plots:``: ``x`` an axis, ``y`` a figure of
``recformer.lab.summary``, ``series`` an axis, optional ``logx`` / ``logy``), seeds averaged, the
spread drawn as the min-max bar; or a trace over training (``trace:`` a per-block metric of
``recformer.metric_names`` by its short name, reduced across blocks at each step, a line per point)."""

from __future__ import annotations

import csv
import json
import math
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from recformer.doctor.runs import load_run
from recformer.lab.grids import TRACE_NAMES
from recformer.lab.runner import POINT_FILE
from recformer.lab.summary import trace
from recformer.metric_names import ATTN_ENTROPY, ATTN_LOGIT_MAX

TRACES = {
    "attn_logit_max": (ATTN_LOGIT_MAX, "max", "largest attention logit (any block)"),
    "attn_entropy": (ATTN_ENTROPY, "min", "lowest attention entropy / log(keys) (any block)"),
}
"""The metrics a ``trace:`` plot can draw over training: name, reduction across blocks, axis label."""
assert set(TRACES) == set(TRACE_NAMES)

FIGURES = (
    "val_auc",
    "best_val_auc",
    "val_logloss",
    "nonfinite_steps",
    "loss_spikes",
    "grad_ratio",
    "cos_deep",
    "attn_logit_max",
    "attn_entropy_min",
    "params",
)
"""The per-point figures a report shows (``recformer.lab.summary``)."""


def load_points(out: Path, names: list[str] | None = None) -> list[dict[str, Any]]:
    """The finished points under ``out``; with ``names`` (the grid's points as it is defined now,
    from ``grid.json``), only those: a point of an earlier definition of the grid (another setting
    changes its name) keeps its folder but leaves the report, with a line saying so."""
    points = [json.loads(p.read_text()) for p in sorted((out / "points").glob(f"*/version_0/{POINT_FILE}"))]
    if names is not None:
        wanted = set(names)
        stale = [p["point"] for p in points if p["point"] not in wanted]
        points = [p for p in points if p["point"] in wanted]
        if stale:
            print(
                f"recformer lab: {out}: left out {len(stale)} finished point(s) of an earlier definition "
                f"of this grid (their folders stay under {out / 'points'})"
            )
    if not points:
        raise FileNotFoundError(
            f"no finished lab points under {out / 'points'} (run `recformer lab run` first)"
        )
    return points


def _key(point: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(point["labels"].items()))


def _fmt(values: list[float]) -> str:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return "-"
    mean = statistics.mean(finite)
    if len(finite) == 1:
        return f"{mean:.4g}"
    return f"{mean:.4g} ({min(finite):.4g}-{max(finite):.4g})"


def write_csv(points: list[dict[str, Any]], path: Path) -> None:
    axes = sorted({k for p in points for k in p["labels"]})
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow([*axes, "seed", "status", *FIGURES, "findings", "seconds", "command"])
        for p in points:
            figures = [p.get(f, "") for f in FIGURES]
            labels = [p["labels"].get(a, "") for a in axes]
            w.writerow(
                [
                    *labels,
                    p["seed"],
                    p["status"],
                    *figures,
                    " ".join(p.get("findings", [])),
                    p["seconds"],
                    p["command"],
                ]
            )


def write_markdown(points: list[dict[str, Any]], path: Path, title: str) -> str:
    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for p in points:
        groups[_key(p)].append(p)
    axes = sorted({k for p in points for k in p["labels"]})
    head = [a.rsplit(".", 1)[-1] for a in axes] + ["seeds", "status", *FIGURES, "doctor"]
    lines = [f"# {title}", "", "| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for key, ps in sorted(groups.items()):
        labels = dict(key)
        status = ", ".join(sorted({p["status"] for p in ps}))
        findings = ", ".join(sorted({f for p in ps for f in p.get("findings", [])})) or "clean"
        cells = [labels.get(a, "") for a in axes] + [str(len(ps)), status]
        cells += [_fmt([p.get(f, math.nan) for p in ps]) for f in FIGURES] + [findings]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Mean over seeds, (min-max) where there are several. Rerun a point alone:", ""]
    lines += [f"- `{p['point']}`: `{p['command']}`" for p in points]
    text = "\n".join(lines) + "\n"
    path.write_text(text)
    return text


def best_rows(points: list[dict[str, Any]], spec: dict[str, Any]) -> list[str]:
    """Markdown lines: per group (``spec['per']`` labels), the value of setting ``spec['over']``
    whose seed-mean ``spec['y']`` is best (``mode`` min or max), and, per group without the
    ``drift`` label, how many grid steps that best value moves from the smallest to the largest
    ``drift`` value (the LR drift across widths that muP should remove)."""
    over, y, per, mode = spec["over"], spec["y"], spec["per"], spec.get("mode", "min")
    grid_values = sorted({float(p["settings"][over]) for p in points})
    means: dict[tuple, dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
    for p in points:
        v = p.get(y, math.nan)
        if p["status"] == "ok" and v is not None and math.isfinite(v):
            means[tuple(p["labels"].get(k, "") for k in per)][float(p["settings"][over])].append(v)
    best = {}
    for group, by_value in means.items():
        pick = min if mode == "min" else max
        best[group] = pick(by_value, key=lambda x: statistics.mean(by_value[x]))
    lines = ["", f"Best {over} by mean {y} ({mode}):", ""]
    lines += [f"- {', '.join(group)}: {value:g}" for group, value in sorted(best.items())]
    drift = spec.get("drift")
    if drift in per:
        i = per.index(drift)
        rest = sorted({g[:i] + g[i + 1 :] for g in best})
        for other in rest:
            mine = {float(g[i]): v for g, v in best.items() if g[:i] + g[i + 1 :] == other}
            if len(mine) >= 2:
                lo, hi = mine[min(mine)], mine[max(mine)]
                steps = grid_values.index(hi) - grid_values.index(lo)
                lines.append(
                    f"- drift of the best {over} for {', '.join(other)}: {steps:+d} grid steps "
                    f"from {drift} {min(mine):g} to {max(mine):g}"
                )
    return lines


def _series(points: list[dict[str, Any]], spec: dict[str, Any]) -> dict[str, dict[float, list[float]]]:
    """``{series label: {x: [y per seed]}}`` of the finite ``spec['y']`` of points that did not fail,
    filtered by ``spec['where']``; ``x`` an axis's setting, or a figure (``params``)."""
    x_key, y, series_key = spec["x"], spec["y"], spec.get("series")
    lines: dict[str, dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
    for p in points:
        value = p.get(y, math.nan)
        if p["status"] == "failed" or value is None or not math.isfinite(value):
            continue
        if not _matches(p, spec.get("where", {})):
            continue
        name = p["labels"].get(series_key, "all") if series_key else "all"
        x = p["settings"][x_key] if x_key in p["settings"] else p[x_key]
        lines[name][float(x)].append(value)
    return lines


def slope_rows(points: list[dict[str, Any]], spec: dict[str, Any]) -> list[str]:
    """Markdown lines: per series, the least-squares slope of the seed-mean ``spec['y']`` against
    log10 of ``spec['x']`` (the change per decade: of loss against parameters, or against rows),
    for a plot with ``fit: true``."""
    x_name, y = spec["x"].rsplit(".", 1)[-1], spec["y"]
    lines = ["", f"Slope of {y} per decade of {x_name} (least squares on the seed means):", ""]
    for name, by_x in sorted(_series(points, spec).items()):
        xs = sorted(by_x)
        if len(xs) < 2:
            lines.append(f"- {name}: one {x_name} value, no slope")
            continue
        logx = np.log10(xs)
        means = [statistics.mean(by_x[x]) for x in xs]
        slope = float(np.polyfit(logx, means, 1)[0])
        series = f"{spec['series'].rsplit('.', 1)[-1]} {name}" if spec.get("series") else "all points"
        span = f"{len(xs)} points, {x_name} {min(xs):.3g} to {max(xs):.3g}"
        lines.append(f"- {series}: {slope:+.4f} ({span})")
    return lines


def plot(points: list[dict[str, Any]], spec: dict[str, Any], path: Path, title: str) -> None:
    """``spec['y']`` against axis ``spec['x']``, a line per value of axis ``spec['series']``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x_key, y, series_key = spec["x"], spec["y"], spec.get("series")
    lines = _series(points, spec)  # ``where``: only the points with these labels (e.g. {param: muP})
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for name, by_x in sorted(lines.items()):
        xs = sorted(by_x)
        means = [statistics.mean(by_x[x]) for x in xs]
        lo = [m - min(by_x[x]) for m, x in zip(means, xs)]
        hi = [max(by_x[x]) - m for m, x in zip(means, xs)]
        ax.errorbar(xs, means, yerr=[lo, hi], marker="o", capsize=3, label=str(name))
    if spec.get("logx"):
        ax.set_xscale("log", base=2)
    default = f"{title}: {y} against {x_key.rsplit('.', 1)[-1]}"
    _finish(fig, ax, path, spec, spec.get("xlabel", x_key), spec.get("ylabel", y), default, bool(series_key))


def _finish(
    fig: Any, ax: Any, path: Path, spec: dict[str, Any], xlabel: str, ylabel: str, title: str, legend: bool
) -> None:
    """Log y on request, the axis labels, the title (``spec['title']`` wins), the legend titled by
    the series axis, a grid; saved to ``path`` and closed."""
    import matplotlib.pyplot as plt

    if spec.get("logy"):
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(spec.get("title", title))
    if legend and spec.get("series") and ax.get_legend_handles_labels()[0]:  # none when no point has data
        ax.legend(title=spec["series"].rsplit(".", 1)[-1])
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _matches(point: dict[str, Any], where: dict[str, Any]) -> bool:
    return all(point["labels"].get(k) == str(v) for k, v in where.items())


def plot_trace(points: list[dict[str, Any]], spec: dict[str, Any], out: Path, path: Path, title: str) -> None:
    """``spec['trace']`` against the training step, a line per point (coloured by axis
    ``spec['series']``, one line style per seed), read from each point's run folder."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fmt, mode, ylabel = TRACES[spec["trace"]]
    series_key = spec["series"]
    names = sorted({p["labels"].get(series_key, "") for p in points})
    colours = {n: f"C{i}" for i, n in enumerate(names)}
    styles = ("-", "--", ":", "-.")
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    labelled = set()
    for p in points:
        if p["status"] == "failed" or not _matches(p, spec.get("where", {})):
            continue
        steps, values = trace(load_run(out / "points" / p["point"] / "version_0"), fmt, mode)
        if not len(steps):
            continue
        name = p["labels"].get(series_key, "")
        status = "" if p["status"] == "ok" else f" ({p['status']})"
        label = None if (name, status) in labelled else f"{name}{status}"
        labelled.add((name, status))
        style = styles[int(p["seed"]) % len(styles)]  # markers: the probe logs every 50 steps by default
        ax.plot(steps, values, style, marker="o", markersize=3, color=colours[name], label=label)
    where = ", ".join(f"{k.rsplit('.', 1)[-1]} {v}" for k, v in spec.get("where", {}).items())
    default = f"{title}: {spec['trace']} over training" + (f" ({where})" if where else "")
    _finish(fig, ax, path, spec, "training step", ylabel, default, bool(labelled))


def report(
    out: Path,
    plots: list[dict[str, Any]],
    title: str,
    best: dict[str, Any] | None = None,
    names: list[str] | None = None,
) -> list[Path]:
    """Write the report files into ``out`` from its finished points (those of ``names`` when
    given); their paths."""
    points = load_points(out, names)
    written = [out / "results.csv", out / "results.md"]
    write_csv(points, written[0])
    text = write_markdown(points, written[1], title)
    extra = best_rows(points, best) if best else []
    extra += [line for spec in plots if spec.get("fit") for line in slope_rows(points, spec)]
    if extra:
        written[1].write_text(text + "\n".join(extra) + "\n")
    for spec in plots:
        suffix = "".join(f"-{v}" for v in spec.get("where", {}).values())
        if "trace" in spec:
            name = f"trace-{spec['trace']}{suffix}.png"
            plot_trace(points, spec, out, out / name, title)
        else:
            name = f"{spec['y']}-vs-{spec['x'].rsplit('.', 1)[-1]}{suffix}.png"
            plot(points, spec, out / name, title)
        written.append(out / name)
    return written
