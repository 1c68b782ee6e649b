"""Exact ranking metrics in float64 numpy, for ``recformer evaluate`` and as the reference the
on-device metrics are tested against: ``exact_auc``, ``delong_ci``, ``delong_paired``, ``gauc``,
``logloss``, ``normalized_entropy``, ``calibration``, ``calibration_table``.

Conventions shared by every metric in this package:

- Predictions are **logits** (the model's output), never probabilities. AUC is invariant to the
  monotone sigmoid, and logits keep the ordering that float32 probabilities lose to rounding near 0
  and 1 (DESIGN section 7 warns that torchmetrics' own binned AUROC wants probabilities; ours bins
  logits directly, on a logit-scale grid).
- Labels are in [0, 1]; a soft label ``y`` counts as weight ``w*y`` positive and ``w*(1-y)``
  negative, which is the usual Mann-Whitney statistic for binary labels.
- Weights are per-sample and >= 0 (ones when absent). Ties in score count one half, as in the
  Mann-Whitney U statistic with average ranks.
- A group's GAUC weight is its total sample weight, i.e. its impression count when unweighted.

The private helpers here that ``training.py`` or ``streaming.py`` also call (the logit range and
histogram AUC, input checks, GAUC partial sums, the calibration-table cut) live in this file so
that both compute the same definitions.
"""

from __future__ import annotations

import math
from dataclasses import astuple, dataclass
from statistics import NormalDist
from typing import Any

import numpy as np

DEFAULT_LOGIT_RANGE = 12.0
"""Bins span logits [-12, 12] (probabilities 6e-6 .. 1 - 6e-6); logits outside go to the edge bins."""


def _histogram_auc(pos: Any, neg: Any) -> Any:
    """AUC from per-bin positive and negative weight, bins in ascending score order.

    A positive in bin b beats every negative in the bins below and ties (counts half) with the
    negatives of its own bin. Returns 0/0 = nan when a class is absent; callers decide.
    """
    neg_below = neg.cumsum(0) - neg
    return (pos * (neg_below + 0.5 * neg)).sum() / (pos.sum() * neg.sum())


def _check_bins(n_bins: int, logit_range: float) -> None:
    """The histogram settings of ``BinnedAUC`` and ``StreamingEvaluator``, checked alike."""
    if n_bins < 2:
        raise ValueError(f"n_bins={n_bins} must be >= 2")
    if not (math.isfinite(logit_range) and logit_range > 0):
        raise ValueError(f"logit_range={logit_range} must be a finite number > 0")


def _check_arrays(
    scores: Any, labels: Any, weights: Any = None, *, what: str = "scores"
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """float64 1-D copies of scores/logits, labels and weights, with every bad value named."""
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    y = np.asarray(labels, dtype=np.float64).reshape(-1)
    if s.shape != y.shape:
        raise ValueError(f"{what} has {s.size} values but labels has {y.size}")
    w = np.ones_like(s) if weights is None else np.asarray(weights, dtype=np.float64).reshape(-1)
    if w.shape != s.shape:
        raise ValueError(f"weights has {w.size} values but {what} has {s.size}")
    bad = int((~np.isfinite(s)).sum())
    if bad:
        raise ValueError(
            f"{what} holds {bad} non-finite values (NaN/Inf); the model diverged or the file is bad"
        )
    bad = int((~((y >= 0) & (y <= 1))).sum())
    if bad:
        raise ValueError(f"labels hold {bad} values outside [0, 1]")
    bad = int((~(np.isfinite(w) & (w >= 0))).sum())
    if bad:
        raise ValueError(f"weights hold {bad} values that are negative or non-finite; expected >= 0")
    return s, y, w


def _grouped_auc_terms(
    codes: np.ndarray, scores: np.ndarray, pos: np.ndarray, neg: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-group Mann-Whitney numerator, positive weight and negative weight.

    Sort by (group, score); each run of equal (group, score) is a tie block whose positives beat
    the group's negatives in lower runs and tie (one half) with the negatives of their own run.
    AUC of group g = num[g] / (pos[g] * neg[g]); with unit weights this is the average-rank
    Mann-Whitney U / (n_pos * n_neg).
    """
    if codes.size == 0:
        empty = np.zeros(0)
        return empty, empty, empty
    order = np.lexsort((scores, codes))
    g, s, p, n = codes[order], scores[order], pos[order], neg[order]
    new_run = np.empty(g.size, dtype=bool)
    new_run[0] = True
    new_run[1:] = (g[1:] != g[:-1]) | (s[1:] != s[:-1])
    run_start = np.flatnonzero(new_run)
    run_pos = np.add.reduceat(p, run_start)
    run_neg = np.add.reduceat(n, run_start)
    run_g = g[run_start]
    new_group = np.empty(run_g.size, dtype=bool)
    new_group[0] = True
    new_group[1:] = run_g[1:] != run_g[:-1]
    group_start = np.flatnonzero(new_group)
    group_of_run = np.cumsum(new_group) - 1
    neg_before = np.cumsum(run_neg) - run_neg
    neg_below = neg_before - neg_before[group_start][group_of_run]
    num = np.add.reduceat(run_pos * (neg_below + 0.5 * run_neg), group_start)
    return num, np.add.reduceat(run_pos, group_start), np.add.reduceat(run_neg, group_start)


def _group_codes(groups: Any, n: int) -> np.ndarray:
    g = np.asarray(groups).reshape(-1)
    if g.size != n:
        raise ValueError(f"groups has {g.size} values but scores has {n}")
    if g.dtype.kind in "iub":
        return g.astype(np.int64, copy=False)
    if g.dtype.kind in "fc":
        raise ValueError(f"groups must be integers or strings (a user id), found {g.dtype}")
    return np.unique(g, return_inverse=True)[1].reshape(-1).astype(np.int64)


def _auc_or_nan(s: np.ndarray, y: np.ndarray, w: np.ndarray) -> float:
    num, pos, neg = _grouped_auc_terms(np.zeros(s.size, np.int64), s, w * y, w * (1 - y))
    if num.size == 0 or pos[0] <= 0 or neg[0] <= 0:
        return math.nan
    return float(num[0] / (pos[0] * neg[0]))


def exact_auc(scores: Any, labels: Any, weights: Any = None) -> float:
    """Exact (weighted) ROC AUC; ties count one half (average ranks). O(n log n).

    Raises ``ValueError`` when the data hold only one label class (AUC is undefined).
    """
    s, y, w = _check_arrays(scores, labels, weights)
    auc = _auc_or_nan(s, y, w)
    if math.isnan(auc):
        raise ValueError("AUC is undefined: the labels hold only one class (or the weights sum to 0)")
    return auc


def _midranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks, tied values sharing the mean of their ranks."""
    order = np.argsort(x, kind="mergesort")
    xs = x[order]
    new = np.empty(xs.size, dtype=bool)
    new[0] = True
    new[1:] = xs[1:] != xs[:-1]
    start = np.flatnonzero(new)
    end = np.append(start[1:], xs.size)  # run covers sorted positions start .. end-1
    ranks = np.empty(x.size)
    ranks[order] = np.repeat((start + 1 + end) / 2.0, end - start)
    return ranks


def _delong_components(scores: Any, labels: Any, what: str) -> tuple[float, np.ndarray, np.ndarray]:
    """AUC and DeLong's structural components V10 (per positive) and V01 (per negative), from
    midranks of the pooled, positive-only and negative-only scores in O(n log n) (Sun & Xu 2014)."""
    s, y, _ = _check_arrays(scores, labels)
    if not np.isin(y, (0.0, 1.0)).all():
        raise ValueError(f"{what} needs binary labels (0/1); found soft labels")
    x_pos, x_neg = s[y == 1], s[y == 0]
    m, n = x_pos.size, x_neg.size
    if m < 2 or n < 2:
        raise ValueError(f"{what} needs >= 2 positives and >= 2 negatives; found {m} and {n}")
    tz = _midranks(np.concatenate([x_pos, x_neg]))
    tx, ty = _midranks(x_pos), _midranks(x_neg)
    auc = (tz[:m].sum() - m * (m + 1) / 2.0) / (m * n)
    v10 = (tz[:m] - tx) / n  # fraction of negatives each positive beats (ties half)
    v01 = 1.0 - (tz[m:] - ty) / m  # fraction of positives that beat each negative
    return float(auc), v10, v01


def delong_ci(scores: Any, labels: Any, alpha: float = 0.95) -> tuple[float, float, float, float]:
    """AUC with its DeLong confidence interval: ``(auc, lo, hi, se)``.

    Fast DeLong (Sun & Xu 2014, "Fast implementation of DeLong's algorithm for comparing the areas
    under correlated ROC curves"): var(AUC) = var(V10)/m + var(V01)/n (DeLong et al. 1988) over
    the structural components. Unweighted, binary labels. The interval is the normal one,
    auc +- z * se, clipped to [0, 1].
    """
    if not 0 < alpha < 1:
        raise ValueError(f"alpha={alpha} must be in (0, 1), e.g. 0.95 for a 95% interval")
    auc, v10, v01 = _delong_components(scores, labels, "delong_ci")
    se = math.sqrt(v10.var(ddof=1) / v10.size + v01.var(ddof=1) / v01.size)
    z = NormalDist().inv_cdf(0.5 + alpha / 2)
    return auc, max(0.0, auc - z * se), min(1.0, auc + z * se), se


def delong_paired(scores_a: Any, scores_b: Any, labels: Any, alpha: float = 0.95) -> dict[str, float]:
    """Two models scored on the same rows: AUC(a) - AUC(b) with its DeLong interval and p-value.

    The two AUCs are correlated (same positives, same negatives), so the variance of their
    difference is far smaller than the two single-model intervals suggest:
    var = [var(V10a) + var(V10b) - 2 cov(V10a, V10b)] / m + the same for V01 over n
    (DeLong, DeLong & Clarke-Pearson 1988). Two-sided p-value of a normal z test.
    """
    if not 0 < alpha < 1:
        raise ValueError(f"alpha={alpha} must be in (0, 1)")
    a, b = np.asarray(scores_a).reshape(-1), np.asarray(scores_b).reshape(-1)
    if a.size != b.size:
        raise ValueError(
            f"delong_paired: {a.size} scores for model a, {b.size} for model b; same rows needed"
        )
    auc_a, v10a, v01a = _delong_components(a, labels, "delong_paired")
    auc_b, v10b, v01b = _delong_components(b, labels, "delong_paired")
    var10 = np.cov(v10a, v10b, ddof=1)
    var01 = np.cov(v01a, v01b, ddof=1)
    var = (var10[0, 0] + var10[1, 1] - 2 * var10[0, 1]) / v10a.size
    var += (var01[0, 0] + var01[1, 1] - 2 * var01[0, 1]) / v01a.size
    se = math.sqrt(max(var, 0.0))
    diff = auc_a - auc_b
    z = NormalDist().inv_cdf(0.5 + alpha / 2)
    log_p = two_sided_log_p(abs(diff) / se) if se > 0 else (-math.inf if diff else 0.0)
    return {
        "auc_a": auc_a,
        "auc_b": auc_b,
        "diff": diff,
        "lo": diff - z * se,
        "hi": diff + z * se,
        "se": se,
        "p_value": math.exp(log_p),  # 0.0 only below the smallest double (z past about 38)
        "log10_p_value": log_p / math.log(10),
    }


def two_sided_log_p(z: float) -> float:
    """log of the two-sided normal p-value ``2 * P(Z > z)`` for z >= 0, from the log survival
    function: ``2 * (1 - cdf(z))`` loses every digit to cancellation past z of about 8.3 (p read
    0 where it is 1e-16 and smaller); ``erfc`` keeps full precision until it underflows near z = 38,
    and past that the asymptotic series of the normal tail (Abramowitz and Stegun 26.2.12), which
    agrees with it to 3e-11 of p at z = 36.9, and better beyond."""
    if z < 37.0:
        return math.log(math.erfc(z / math.sqrt(2.0)))
    series = 1.0 - 1.0 / z**2 + 3.0 / z**4 - 15.0 / z**6
    return math.log(2.0) - z * z / 2.0 - math.log(z * math.sqrt(2.0 * math.pi)) + math.log(series)


@dataclass
class _GaucSums:
    """Partial sums of GAUC over some groups (added up over spill partitions)."""

    total: float = 0.0
    """Sum of group weight * group AUC over the groups holding both labels."""
    weight: float = 0.0
    """Their summed weight."""
    used: int = 0
    """Groups holding both labels."""
    excluded: int = 0
    """Groups holding one label class only (no AUC of their own)."""
    excluded_weight: float = 0.0

    def __add__(self, o: _GaucSums) -> _GaucSums:
        return _GaucSums(*(a + b for a, b in zip(astuple(self), astuple(o))))

    @property
    def gauc(self) -> float:
        return self.total / self.weight if self.used else math.nan

    @property
    def excluded_share(self) -> float:
        """Share of the weight (of the rows, unweighted) in excluded groups."""
        all_weight = self.weight + self.excluded_weight
        return self.excluded_weight / all_weight if all_weight > 0 else math.nan


def _gauc_sums(codes: np.ndarray, s: np.ndarray, y: np.ndarray, w: np.ndarray) -> _GaucSums:
    num, pos, neg = _grouped_auc_terms(codes, s, w * y, w * (1 - y))
    used = (pos > 0) & (neg > 0)
    gw = (pos + neg)[used]
    return _GaucSums(
        total=float((gw * num[used] / (pos * neg)[used]).sum()),
        weight=float(gw.sum()),
        used=int(used.sum()),
        excluded=int((~used).sum()),
        excluded_weight=float((pos + neg)[~used].sum()),
    )


def gauc(groups: Any, scores: Any, labels: Any, weights: Any = None) -> tuple[float, int]:
    """Group AUC: ``(gauc, n_groups_used)``.

    Per-group exact AUC (ties half) averaged over the groups holding both labels, each weighted by
    its total sample weight (its impression count when unweighted). Vectorised: one lexsort by
    (group, score) and segment sums, no loop over groups. ``groups`` may be integers or strings.
    """
    s, y, w = _check_arrays(scores, labels, weights)
    sums = _gauc_sums(_group_codes(groups, s.size), s, y, w)
    if sums.used == 0:
        raise ValueError("GAUC is undefined: no group holds both a positive and a negative label")
    return sums.gauc, sums.used


def _sigmoid(x: np.ndarray) -> np.ndarray:
    e = np.exp(-np.abs(x))  # never overflows
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def _bce(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Binary cross-entropy from logits: max(x, 0) - x*y + log(1 + exp(-|x|)), stable for any x."""
    return np.maximum(x, 0.0) - x * y + np.log1p(np.exp(-np.abs(x)))


def _entropy(p: float) -> float:
    return -sum(q * math.log(q) for q in (p, 1.0 - p) if q > 0)


def logloss(logits: Any, labels: Any, weights: Any = None) -> float:
    """Weighted mean binary cross-entropy (nats) from logits."""
    x, y, w = _check_arrays(logits, labels, weights, what="logits")
    if w.sum() <= 0:
        raise ValueError("logloss is undefined: the weights sum to 0")
    return float((w * _bce(x, y)).sum() / w.sum())


def normalized_entropy(logits: Any, labels: Any, weights: Any = None) -> float:
    """Logloss over the entropy of the weighted base rate of the same data (He et al. 2014)."""
    x, y, w = _check_arrays(logits, labels, weights, what="logits")
    h = _entropy(float((w * y).sum() / w.sum())) if w.sum() > 0 else 0.0
    if h <= 0:
        raise ValueError("normalized entropy is undefined: the labels hold only one value")
    return float((w * _bce(x, y)).sum() / w.sum()) / h


def calibration(logits: Any, labels: Any, weights: Any = None) -> float:
    """Weighted mean predicted probability over weighted mean label (1.0 = calibrated)."""
    x, y, w = _check_arrays(logits, labels, weights, what="logits")
    if (w * y).sum() <= 0:
        raise ValueError("calibration is undefined: there are no positive labels")
    return float((w * _sigmoid(x)).sum() / (w * y).sum())


def _calibration_rows(pred_lo, pred_hi, weight, pred_sum, label_sum, rows) -> list[dict[str, float]]:
    out = []
    for i in range(len(weight)):
        wt = float(weight[i])
        mp = float(pred_sum[i] / wt) if wt > 0 else math.nan
        ml = float(label_sum[i] / wt) if wt > 0 else math.nan
        out.append(
            {
                "bin": i,
                "rows": int(rows[i]),
                "weight": wt,
                "pred_min": float(pred_lo[i]),
                "pred_max": float(pred_hi[i]),
                "mean_pred": mp,
                "mean_label": ml,
                "ratio": mp / ml if ml > 0 else math.nan,
            }
        )
    return out


def calibration_table(
    logits: Any, labels: Any, bins: int = 10, weights: Any = None
) -> list[dict[str, float]]:
    """Reliability table: rows sorted by predicted probability and cut into ``bins`` bins of equal
    weight (equal row counts when unweighted; deciles by default), a row going to the bin its
    cumulative weight before it falls in, which is also how ``StreamingEvaluator`` cuts its
    histogram once rows spill; per bin the weighted mean prediction vs the weighted mean label.

    Returns one dict per bin: bin, rows, weight, pred_min, pred_max, mean_pred, mean_label, ratio.
    """
    if bins < 1:
        raise ValueError(f"bins={bins} must be >= 1")
    x, y, w = _check_arrays(logits, labels, weights, what="logits")
    if x.size < bins:
        raise ValueError(f"calibration_table needs at least bins={bins} rows, found {x.size}")
    order = np.argsort(x, kind="mergesort")
    p, y, w = _sigmoid(x[order]), y[order], w[order]
    k = _equal_weight_bins(w, bins)
    n = np.bincount(k, minlength=bins)
    hi = np.cumsum(n)  # k is non-decreasing: bin i holds sorted rows hi[i] - n[i] .. hi[i] - 1
    has = n > 0
    lo_p = np.where(has, p[np.minimum(hi - n, p.size - 1)], math.nan)
    hi_p = np.where(has, p[np.maximum(hi - 1, 0)], math.nan)
    return _calibration_rows(
        lo_p,
        hi_p,
        np.bincount(k, w, bins),
        np.bincount(k, w * p, bins),
        np.bincount(k, w * y, bins),
        n,
    )


def _equal_weight_bins(w: np.ndarray, bins: int) -> np.ndarray:
    """Bin of each (sorted) row or histogram cell: ``floor(bins * weight before it / total)``."""
    total = w.sum()
    if total <= 0:
        return np.minimum(np.arange(w.size) * bins // max(w.size, 1), bins - 1)
    return np.minimum(((np.cumsum(w) - w) / total * bins).astype(np.int64), bins - 1)
