"""One PNG per metric family of a run (value per block over steps), plus the loss and throughput.

matplotlib is imported when the plots are drawn, so ``--no-plots`` and the checks do without it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from recformer import metric_names as mn
from recformer.doctor.runs import RunMetrics

FAMILIES = (
    ("grad_norm", "gradient norm per block", mn.GRAD_NORM, True, "gradient L2 norm"),
    ("update_ratio", "update / weight ratio per block", mn.UPDATE_RATIO, True, "||update|| / ||weight||"),
    ("weight_norm", "weight norm per block", mn.WEIGHT_NORM, False, "weight L2 norm"),
    ("cos_adjacent", "cosine(block input, block output)", mn.COS_ADJACENT, False, "cosine"),
    ("resid_rms", "residual RMS after each block", mn.RESID_RMS, False, "residual-stream RMS"),
    ("attn_logit_max", "max attention logit per block", mn.ATTN_LOGIT_MAX, False, "max pre-softmax logit"),
    (
        "attn_entropy",
        "attention entropy / log(keys) per block",
        mn.ATTN_ENTROPY,
        False,
        "entropy / log(keys)",
    ),
    ("adam_v", "Adam sqrt(second moment) per group", mn.ADAM_V, True, "sqrt(Adam v), mean"),
    ("emb_row_norm", "embedding row-norm percentiles", mn.EMB_ROW_NORM, False, "row L2 norm"),
)
"""(file stem, title, metric name format, log y-axis, y-axis label)."""

PERF = {
    mn.SAMPLES_PER_S: "training samples / s",
    mn.TOKENS_PER_S: "training tokens / s",
    mn.MFU: "model FLOPs utilisation",
}
"""Throughput metrics and what their panels are called."""

LINESTYLES = ("-", "--", ":", "-.")

Figure = tuple[str, str, Any]
"""(file stem, title, matplotlib figure)."""


def write_plots(run: RunMetrics, out: Path) -> list[tuple[str, str]]:
    """One PNG per metric family that has data; returns (file name, title) pairs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    # One figure open at a time: each is saved and closed before the next is drawn.
    for stem, title, fig in figures(plt, run):
        fig.tight_layout()
        fig.savefig(out / f"{stem}.png", dpi=90)
        plt.close(fig)
        written.append((f"{stem}.png", title))
    return written


def figures(plt: Any, run: RunMetrics) -> Iterator[Figure]:
    """Every figure of ``run``, one at a time (the caller saves and closes each)."""
    return itertools.chain(_family_figures(plt, run), _loss_figure(plt, run), _perf_figure(plt, run))


def _family_figures(plt: Any, run: RunMetrics) -> Iterator[Figure]:
    """A line per block (or per group, table and percentile) for each of ``FAMILIES`` with data."""
    for stem, title, fmt, logy, ylabel in FAMILIES:
        lines = run.per_block(fmt) if "{i}" in fmt else run.matching(fmt)
        if not lines:
            continue
        fig, ax = plt.subplots(figsize=(7, 4))
        if "{table}" in fmt:
            _by_table(plt, ax, lines)
        else:
            cmap = plt.get_cmap("viridis")
            for k, (label, s) in enumerate(lines.items()):
                color = cmap(k / max(1, len(lines) - 1))
                ax.plot(
                    s.steps, s.values, color=color, label=f"block {label}" if "{i}" in fmt else str(label)
                )
            ax.legend(fontsize=7, ncol=2 if len(lines) > 8 else 1)
        if logy and all(np.all(s.values > 0) for s in lines.values()):
            ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        yield stem, title, fig


def _by_table(plt: Any, ax: Any, lines: dict[str, Any]) -> None:
    """Embedding row norms: a color per table and a line style per percentile, the legend beside
    the axes (15 shades of one colormap over the lines could not be told apart)."""
    tables = list(dict.fromkeys(key.rsplit("/", 1)[0] for key in lines))
    quantiles = list(dict.fromkeys(key.rsplit("/", 1)[1] for key in lines))
    colors = plt.get_cmap("tab10")
    for key, s in lines.items():
        table, q = key.rsplit("/", 1)
        style = LINESTYLES[quantiles.index(q) % len(LINESTYLES)]
        ax.plot(
            s.steps, s.values, color=colors(tables.index(table) % 10), linestyle=style, label=f"{table} {q}"
        )
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)


def _loss_figure(plt: Any, run: RunMetrics) -> Iterator[Figure]:
    """The training loss and its running mean, a red mark on the loss at each log step with spikes."""
    loss, ema, spikes = run.get(mn.TRAIN_LOSS), run.get(mn.LOSS_EMA), run.get(mn.LOSS_SPIKE)
    if loss is None and ema is None:
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    if loss is not None:
        ax.plot(loss.steps, loss.values, lw=0.8, label="training loss")
    if ema is not None:
        ax.plot(ema.steps, ema.values, lw=1.5, label="running mean")
    at = spikes.steps[spikes.values > 0] if spikes is not None else np.array([])
    curve = loss if loss is not None else ema
    if len(at):
        # On the curve at the nearest logged step: a log step's spike count covers the steps since
        # the previous one, so the mark sits where the spike was logged.
        y = np.interp(at, curve.steps, curve.values)
        ax.scatter(at, y, color="red", marker="v", s=40, zorder=3, label=f"loss spike ({len(at)} log steps)")
        title = f"training loss, {len(at)} log step(s) with spikes (red)"
    else:
        title = "training loss (no loss spikes)"
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(title)
    ax.legend(fontsize=7)
    yield "loss", "training loss and spikes", fig


def _perf_figure(plt: Any, run: RunMetrics) -> Iterator[Figure]:
    """Throughput and MFU side by side, those the run logged."""
    perf = {name: run.get(name) for name in PERF}
    perf = {k: v for k, v in perf.items() if v is not None}
    if not perf:
        return
    fig, axes = plt.subplots(1, len(perf), figsize=(4 * len(perf), 3.5), squeeze=False)
    for ax, (name, s) in zip(axes[0], perf.items()):
        ax.plot(s.steps, s.values)
        ax.set_title(PERF[name])
        ax.set_xlabel("step")
        ax.set_ylabel(PERF[name].removeprefix("training "))
    yield "perf", "throughput", fig
