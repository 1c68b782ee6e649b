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
    ("grad_norm", "gradient norm per block", mn.GRAD_NORM, True),
    ("update_ratio", "update / weight ratio per block", mn.UPDATE_RATIO, True),
    ("weight_norm", "weight norm per block", mn.WEIGHT_NORM, False),
    ("cos_adjacent", "cosine(block input, block output)", mn.COS_ADJACENT, False),
    ("resid_rms", "residual RMS after each block", mn.RESID_RMS, False),
    ("attn_logit_max", "max attention logit per block", mn.ATTN_LOGIT_MAX, False),
    ("attn_entropy", "attention entropy / log(keys) per block", mn.ATTN_ENTROPY, False),
    ("adam_v", "Adam sqrt(second moment) per group", mn.ADAM_V, True),
    ("emb_row_norm", "embedding row-norm percentiles", mn.EMB_ROW_NORM, False),
)
"""(file stem, title, metric name format, log y-axis)."""

Figure = tuple[str, str, Any]
"""(file stem, title, matplotlib figure)."""


def write_plots(run: RunMetrics, out: Path) -> list[tuple[str, str]]:
    """One PNG per metric family that has data; returns (file name, title) pairs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    # One figure open at a time: each is saved and closed before the next is drawn.
    for stem, title, fig in itertools.chain(
        _family_figures(plt, run), _loss_figure(plt, run), _perf_figure(plt, run)
    ):
        fig.tight_layout()
        fig.savefig(out / f"{stem}.png", dpi=90)
        plt.close(fig)
        written.append((f"{stem}.png", title))
    return written


def _family_figures(plt: Any, run: RunMetrics) -> Iterator[Figure]:
    """A line per block (or per group, table and percentile) for each of ``FAMILIES`` with data."""
    for stem, title, fmt, logy in FAMILIES:
        lines = run.per_block(fmt) if "{i}" in fmt else run.matching(fmt)
        if not lines:
            continue
        fig, ax = plt.subplots(figsize=(7, 4))
        cmap = plt.get_cmap("viridis")
        for k, (label, s) in enumerate(lines.items()):
            color = cmap(k / max(1, len(lines) - 1))
            ax.plot(s.steps, s.values, color=color, label=f"block {label}" if "{i}" in fmt else str(label))
        if logy and all(np.all(s.values > 0) for s in lines.values()):
            ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.set_title(title)
        ax.legend(fontsize=7, ncol=2 if len(lines) > 8 else 1)
        yield stem, title, fig


def _loss_figure(plt: Any, run: RunMetrics) -> Iterator[Figure]:
    """The training loss and its running mean, with a red line at each log step with spikes."""
    loss, ema, spikes = run.get(mn.TRAIN_LOSS), run.get(mn.LOSS_EMA), run.get(mn.LOSS_SPIKE)
    if loss is None and ema is None:
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    if loss is not None:
        ax.plot(loss.steps, loss.values, lw=0.8, label=mn.TRAIN_LOSS)
    if ema is not None:
        ax.plot(ema.steps, ema.values, lw=1.5, label=mn.LOSS_EMA)
    if spikes is not None:
        for st in spikes.steps[spikes.values > 0]:
            ax.axvline(st, color="red", alpha=0.4)
    ax.set_xlabel("step")
    ax.set_title("training loss (red: log steps with spikes)")
    ax.legend(fontsize=7)
    yield "loss", "training loss and spikes", fig


def _perf_figure(plt: Any, run: RunMetrics) -> Iterator[Figure]:
    """Throughput and MFU side by side, those the run logged."""
    perf = {name: run.get(name) for name in (mn.SAMPLES_PER_S, mn.TOKENS_PER_S, mn.MFU)}
    perf = {k: v for k, v in perf.items() if v is not None}
    if not perf:
        return
    fig, axes = plt.subplots(1, len(perf), figsize=(4 * len(perf), 3.5), squeeze=False)
    for ax, (name, s) in zip(axes[0], perf.items()):
        ax.plot(s.steps, s.values)
        ax.set_title(name)
        ax.set_xlabel("step")
    yield "perf", "throughput", fig
