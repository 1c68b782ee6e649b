"""A finished point's figures, read from its run folder with the doctor's loader and checks.

- ``val_auc``, ``val_logloss``: the last validation's; ``best_val_auc``: the best one;
- ``nonfinite_steps``: steps skipped for non-finite gradients; ``loss_spikes``: spikes counted;
- ``grad_ratio``: bottom/top block gradient-norm ratio, median over the second half of training;
- ``cos_deep``: adjacent-block cosine of the deepest quarter of blocks (at least one), median over
  the second half (near 1: those blocks barely change the stream, they idle);
- ``attn_logit_max``: the largest attention logit seen in any block;
- ``attn_entropy_min``: the lowest attention entropy seen in any block, as the probe logs it
  (entropy / log(keys), 0 to 1; near 0: attention collapsed onto one key);
- ``params``: the ranker's trainable parameters (from ``last.ckpt``; its item side-table buffers
  are data, not counted);
- ``findings``: the names of the doctor's findings on the run (``recformer doctor``).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from recformer.doctor.checks import diagnose
from recformer.doctor.runs import RunMetrics, load_run
from recformer.metric_names import (
    ATTN_ENTROPY,
    ATTN_LOGIT_MAX,
    COS_ADJACENT,
    GRAD_RATIO_BOTTOM_TOP,
    LOSS_SPIKE,
    NONFINITE_STEPS,
)

NAN = float("nan")


def _last(run: RunMetrics, name: str) -> float:
    s = run.get(name)
    return float(s.values[-1]) if s is not None else NAN


def _late_median(run: RunMetrics, name: str) -> float:
    s = run.get(name)
    return float(np.median(s.tail(0.5).values)) if s is not None else NAN


def _cos_deep(run: RunMetrics) -> float:
    blocks = run.per_block(COS_ADJACENT)
    if not blocks:
        return NAN
    deepest = sorted(blocks)[-max(1, math.ceil(len(blocks) / 4)) :]
    return float(np.mean([np.median(blocks[i].tail(0.5).values) for i in deepest]))


def _params(run_dir: Path) -> float:
    import torch

    ckpt = run_dir / "checkpoints" / "last.ckpt"
    if not ckpt.is_file():
        return NAN
    state = torch.load(ckpt, map_location="cpu", weights_only=True)["state_dict"]
    buffers = ("ranker.tokens.item_content", "ranker.tokens.item_feats")
    return float(
        sum(
            v.numel()
            for k, v in state.items()
            if k.startswith("ranker.") and k not in buffers and v.is_floating_point()
        )
    )


def trace(run: RunMetrics, fmt: str, mode: str = "max") -> tuple[np.ndarray, np.ndarray]:
    """A per-block metric (``fmt`` of ``recformer.metric_names``) over training, reduced across
    blocks at each logged step (``mode`` max or min): the steps and the values."""
    blocks = run.per_block(fmt)
    by_step: dict[int, list[float]] = {}
    for s in blocks.values():
        for step, value in zip(s.steps, s.values):
            if math.isfinite(value):
                by_step.setdefault(int(step), []).append(float(value))
    steps = np.array(sorted(by_step), dtype=np.int64)
    pick = max if mode == "max" else min
    return steps, np.array([pick(by_step[int(k)]) for k in steps], dtype=np.float64)


def summarize(run_dir: Path) -> dict[str, Any]:
    run = load_run(run_dir)
    val = run.get("val/auc")
    logit_max = [float(np.nanmax(s.values)) for s in run.per_block(ATTN_LOGIT_MAX).values()]
    entropy_min = [float(np.nanmin(s.values)) for s in run.per_block(ATTN_ENTROPY).values()]
    spikes = run.get(LOSS_SPIKE)
    findings = diagnose(run, run_dir).findings if run.series else []
    return {
        "val_auc": _last(run, "val/auc"),
        "best_val_auc": float(np.nanmax(val.values)) if val is not None else NAN,
        "val_logloss": _last(run, "val/logloss"),
        "nonfinite_steps": _last(run, NONFINITE_STEPS),
        "loss_spikes": float(np.nansum(spikes.values)) if spikes is not None else NAN,
        "grad_ratio": _late_median(run, GRAD_RATIO_BOTTOM_TOP),
        "cos_deep": _cos_deep(run),
        "attn_logit_max": max(logit_max) if logit_max else NAN,
        "attn_entropy_min": min(entropy_min) if entropy_min else NAN,
        "steps": run.n_steps,
        "params": _params(run_dir),
        "findings": sorted({f.check for f in findings}),
    }
