"""Values ``recformer data build`` refuses although they parse: outside the range the mapping's
``limits`` (``build_config.Limits``) allows, or beyond float32, where they would become inf.

Each check is a (what is wrong, filter) pair for ``build_events._refuse_problems``, which counts every
check in one streaming pass and refuses them together, each with its count and examples; a value
that is null or does not parse is left to the checks that name that.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from recformer.datasets.build_config import BuildConfig, seconds

FLOAT32_MAX = float(np.finfo(np.float32).max)
"""Largest float32: the builder writes weights and dense values as float32, where larger is inf."""


def range_problems(cfg: BuildConfig, ts: Any) -> list[tuple[str, Any]]:
    """Checks of the event times (``ts``: the time column in int64 seconds, null where it does
    not parse), the weights and the dense columns against ``cfg.limits``."""
    import polars as pl

    lim = cfg.limits
    lo, hi = seconds(lim.time_min, "limits.time_min"), seconds(lim.time_max, "limits.time_max")
    c = cfg.columns
    problems = [
        (
            f"column {c.time!r} (columns.time) has times outside [limits.time_min, limits.time_max) = "
            f"[{lim.time_min}, {lim.time_max}): a time unit or export mistake",
            ts.is_not_null() & ((ts < lo) | (ts >= hi)),
        )
    ]
    if c.weight is not None:
        w = pl.col(c.weight).cast(pl.Float64)
        problems.append(
            (
                f"column {c.weight!r} (columns.weight) has weights above "
                f"limits.weight_max={lim.weight_max:g}",
                w.is_finite() & (w > lim.weight_max),
            )
        )
    for n in cfg.features.dense:
        x = pl.col(n).cast(pl.Float64)
        problems.append(
            (
                f"column {n!r} (features.dense) has values beyond float32 (|x| > {FLOAT32_MAX:.3g}), "
                "which would be written as inf",
                x.is_finite() & (x.abs() > FLOAT32_MAX),
            )
        )
    return problems
