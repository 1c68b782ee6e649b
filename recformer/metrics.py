"""Ranking metrics: on-device torchmetrics for training and validation, exact numpy ones offline.

Two families, one set of definitions:

- ``BinnedAUC``, ``LogLoss``, ``NormalizedEntropy``, ``Calibration``, ``GroupAUC``: torchmetrics
  ``Metric`` subclasses for the LightningModule. Their states are sums (``dist_reduce_fx="sum"``) or
  concatenated rows (``"cat"``: ``GroupAUC``, and ``BinnedAUC`` up to its row cap), so the value
  reduced over DDP ranks equals the single-process value on all the data. ``update`` never syncs the
  device (no ``.item()``, no data-dependent Python branch); ``compute`` runs once per logging
  interval / epoch.
- ``exact_auc``, ``delong_ci``, ``gauc``, ``logloss``, ``normalized_entropy``, ``calibration``,
  ``calibration_table`` and ``StreamingEvaluator``: float64 numpy for ``recformer evaluate``, exact
  over data of any size.

Conventions used everywhere in this file:

- Predictions are **logits** (the model's output), never probabilities. AUC is invariant to the
  monotone sigmoid, and logits keep the ordering that float32 probabilities lose to rounding near 0
  and 1 (DESIGN section 7 warns that torchmetrics' own binned AUROC wants probabilities; ours bins
  logits directly, on a logit-scale grid).
- Labels are in [0, 1]; a soft label ``y`` counts as weight ``w*y`` positive and ``w*(1-y)``
  negative, which is the usual Mann-Whitney statistic for binary labels.
- Weights are per-sample and >= 0 (ones when absent). Ties in score count one half, as in the
  Mann-Whitney U statistic with average ranks.
- A group's GAUC weight is its total sample weight, i.e. its impression count when unweighted.
"""

from __future__ import annotations

import math
import shutil
import tempfile
import zlib
from collections.abc import Callable, Sequence
from dataclasses import asdict, astuple, dataclass, field
from pathlib import Path
from statistics import NormalDist
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torchmetrics import Metric
from torchmetrics.utilities import dim_zero_cat, rank_zero_warn

DEFAULT_AUC_BINS = 4096
"""Histogram bins of the binned AUC: 24 logits / 4096 = 0.006 logit per bin. Error ~1e-4 when the
scores spread over many bins, far more when they crowd into few: logits spanning 0.4 (67 bins) read
5e-4 high, and a MovieLens checkpoint whose probabilities sat in 0.486-0.492 (4 bins) read 0.6437
against the exact 0.6486 (1e-2 to 2e-2 low on such scores in tests/test_metrics.py). Hence
``BinnedAUC`` is exact below ``DEFAULT_AUC_EXACT_MAX_ROWS``."""
DEFAULT_AUC_EXACT_MAX_ROWS = 1_000_000
"""Rows (over all ranks) that ``BinnedAUC`` keeps for the exact AUC (12 bytes each, float32 logit,
label and weight; about 80 bytes each at the peak of ``compute``, measured) before it falls back to
its histograms."""
DEFAULT_LOGIT_RANGE = 12.0
"""Bins span logits [-12, 12] (probabilities 6e-6 .. 1 - 6e-6); logits outside go to the edge bins."""


# ----------------------------------------------------------------------------------------------
# Shared math (works on numpy arrays and torch tensors alike)
# ----------------------------------------------------------------------------------------------


def _histogram_auc(pos: Any, neg: Any) -> Any:
    """AUC from per-bin positive and negative weight, bins in ascending score order.

    A positive in bin b beats every negative in the bins below and ties (counts half) with the
    negatives of its own bin. Returns 0/0 = nan when a class is absent; callers decide.
    """
    neg_below = neg.cumsum(0) - neg
    return (pos * (neg_below + 0.5 * neg)).sum() / (pos.sum() * neg.sum())


def _check_bins(n_bins: int, logit_range: float) -> None:
    if n_bins < 2:
        raise ValueError(f"n_bins={n_bins} must be >= 2")
    if not (math.isfinite(logit_range) and logit_range > 0):
        raise ValueError(f"logit_range={logit_range} must be a finite number > 0")


# ----------------------------------------------------------------------------------------------
# torchmetrics metrics (training / validation, on device, DDP-exact)
# ----------------------------------------------------------------------------------------------


def _flat_inputs(
    preds_logits_B: torch.Tensor, target_B: torch.Tensor, weight_B: torch.Tensor | None, metric: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Flatten to float64 [B] logits, labels and weights; shapes are checked, values are not
    (a value check would sync the device on every step)."""
    if preds_logits_B.shape != target_B.shape:
        raise ValueError(
            f"{metric}.update: preds_logits shape {tuple(preds_logits_B.shape)} != target shape "
            f"{tuple(target_B.shape)}"
        )
    x_B = preds_logits_B.detach().reshape(-1).to(torch.float64)
    y_B = target_B.detach().reshape(-1).to(torch.float64)
    if weight_B is None:
        w_B = torch.ones_like(x_B)
    else:
        if weight_B.shape != target_B.shape:
            raise ValueError(
                f"{metric}.update: weight shape {tuple(weight_B.shape)} != target shape "
                f"{tuple(target_B.shape)}"
            )
        w_B = weight_B.detach().reshape(-1).to(torch.float64)
    return x_B, y_B, w_B


class _KeepsDtypes(Metric):
    """A metric whose states keep the dtypes they were made with when the module holding it is
    converted with ``.to(dtype=...)``: Lightning's ``*-true`` precisions convert the whole
    LightningModule that way, and torchmetrics guards only ``.half()`` / ``.float()`` and the like.
    float64 sums in bfloat16 stop counting past 256, and GroupAUC's int64 groups (stored as float32
    pairs) would be scrambled. Moves between devices still apply."""

    def _apply(self, fn: Callable, exclude_state: Sequence[str] = ()) -> Metric:
        def same_dtype(t: torch.Tensor) -> torch.Tensor:
            out = fn(t)
            return out if out.dtype == t.dtype else t.to(out.device)

        return super()._apply(same_dtype, exclude_state)


class BinnedAUC(_KeepsDtypes):
    """AUC that is exact up to ``exact_max_rows`` rows in all (over the ranks), binned beyond.

    ``update(preds_logits_B, target_B, weight_B=None)`` takes **logits**. Two records, both kept on
    the device:

    - The rows themselves (float32 logit, label and weight: 12 bytes a row, concatenated across
      ranks at ``compute``) while a rank has seen at most its share, ``exact_max_rows //
      world_size``, since the last ``reset``. Past that the rank drops them and counts itself in
      ``rows_not_kept``, a sum over ranks, so every rank takes the same branch at ``compute``.
      When no rank overflowed the AUC is exact (weighted, ties one half, as ``exact_auc`` on the
      float32 rows): one sort of at most ``exact_max_rows`` gathered rows on each rank, about 80
      bytes a row at its peak (``_exact_auc_torch``).
    - Weighted histograms of positives and negatives over ``n_bins`` logit bins, always updated:
      float64, 64 KiB with the defaults, summed over ranks. Bins are equally spaced on the logit
      scale over ``[-logit_range, logit_range]`` (logits outside are clamped into the edge bins);
      pairs that share a bin count as ties (one half). When a rank overflowed this is the AUC, and
      its error is up to half the fraction of positive-negative pairs sharing a bin: ~1e-4 when the
      scores spread, 5e-3 to 2e-2 when they crowd into a few bins (see ``DEFAULT_AUC_BINS``).
      ``compute`` then warns once per metric, naming the cap. ``exact_max_rows=0`` is always
      binned, without the warning.

    NaN when a class is absent or the weights sum to 0. A NaN logit anywhere makes ``compute``
    return NaN instead of silently dropping the row.
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False

    def __init__(
        self,
        n_bins: int = DEFAULT_AUC_BINS,
        logit_range: float = DEFAULT_LOGIT_RANGE,
        exact_max_rows: int = DEFAULT_AUC_EXACT_MAX_ROWS,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        _check_bins(n_bins, logit_range)
        if exact_max_rows < 0:
            raise ValueError(f"exact_max_rows={exact_max_rows} must be >= 0 (0 = always binned)")
        self.n_bins = n_bins
        self.logit_range = float(logit_range)
        self.exact_max_rows = int(exact_max_rows)
        # float64: float32 counts stop incrementing at 2**24 rows per bin.
        self.add_state("pos_hist", torch.zeros(n_bins, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("neg_hist", torch.zeros(n_bins, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("n_nan", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        # float32 rows, as GroupAUC's: the dtype of the empty stand-in torchmetrics sends for a
        # rank with no rows (it saw none, or dropped them), so the gather never mixes dtypes.
        # The module's logits are float32 already, so nothing is rounded there.
        self.add_state("logits", [], dist_reduce_fx="cat")
        self.add_state("labels", [], dist_reduce_fx="cat")
        self.add_state("weights", [], dist_reduce_fx="cat")
        self.add_state("rows_not_kept", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self._overflowed = False  # host-side twin of rows_not_kept > 0 on this rank: no sync
        self._n_kept = 0  # rows in the lists, counted on the host from shapes: no sync
        self._warned = False

    def reset(self) -> None:
        super().reset()
        self._overflowed, self._n_kept = False, 0

    def update(
        self, preds_logits_B: torch.Tensor, target_B: torch.Tensor, weight_B: torch.Tensor | None = None
    ) -> None:
        x_B, y_B, w_B = _flat_inputs(preds_logits_B, target_B, weight_B, "BinnedAUC")
        self._keep_rows(x_B, y_B, w_B)
        r = self.logit_range
        nan_B = torch.isnan(x_B)
        self.n_nan += nan_B.sum()
        # NaN rows get weight 0 here; n_nan turns the result into NaN at compute time.
        w_B = torch.where(nan_B, torch.zeros_like(w_B), w_B)
        x_B = torch.nan_to_num(x_B, nan=0.0).clamp(-r, r)
        bin_B = ((x_B + r) * (self.n_bins / (2 * r))).floor().long().clamp(0, self.n_bins - 1)
        self.pos_hist.index_add_(0, bin_B, w_B * y_B)
        self.neg_hist.index_add_(0, bin_B, w_B * (1.0 - y_B))

    def _keep_rows(self, x_B: torch.Tensor, y_B: torch.Tensor, w_B: torch.Tensor) -> None:
        """Append the rows while this rank stays within the cap; past it, drop the kept ones."""
        if self._overflowed:
            self.rows_not_kept += x_B.numel()
            return
        kept = self._n_kept + x_B.numel()
        if kept > self._rank_cap():
            self._drop_rows(kept)
            return
        self.logits.append(x_B.float())
        self.labels.append(y_B.float())
        self.weights.append(w_B.float())
        self._n_kept = kept

    def _drop_rows(self, n_rows: int) -> None:
        self.rows_not_kept += n_rows
        for rows in (self.logits, self.labels, self.weights):
            rows.clear()
        self._overflowed, self._n_kept = True, 0

    def _reduce_states(self, incoming_state: dict[str, Any]) -> None:
        # forward() (reset, update on the batch, merge the saved states back) and merge_state()
        # join kept rows outside update: hold those to the cap as well.
        super()._reduce_states(incoming_state)
        self._n_kept = sum(t.numel() for t in self.logits)
        if self._n_kept > self._rank_cap():
            self._drop_rows(self._n_kept)

    def _rank_cap(self) -> int:
        """This rank's share of ``exact_max_rows``: the gathered rows never pass it in all."""
        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        return self.exact_max_rows // world

    def compute(self) -> torch.Tensor:
        auc = _histogram_auc(self.pos_hist, self.neg_hist)
        # Syncs (once per epoch, not per step): every rank reads the same summed state, so all
        # take the same branch.
        if float(self.rows_not_kept) > 0:
            self._warn_binned()
        elif not (isinstance(self.logits, list) and not self.logits):
            x = dim_zero_cat(self.logits)
            if x.numel() > 0:
                auc = _exact_auc_torch(x, dim_zero_cat(self.labels), dim_zero_cat(self.weights))
        return torch.where(self.n_nan > 0, torch.full_like(auc, math.nan), auc).float()

    def _warn_binned(self) -> None:
        if self._warned or self.exact_max_rows == 0:
            return
        self._warned = True
        rank_zero_warn(
            f"BinnedAUC: more than exact_max_rows={self.exact_max_rows} rows (in all ranks) since the "
            f"last reset ({float(self.rows_not_kept):.0f} rows not kept), so this AUC is the binned "
            f"one ({self.n_bins} logit bins; off by up to ~2e-2 when scores crowd). Raise "
            "model.auc_exact_max_rows (about 80 bytes a row on every rank at compute) or run "
            "`recformer evaluate` for the exact AUC."
        )


class _WeightedSums(_KeepsDtypes):
    """The four weighted sums LogLoss, NormalizedEntropy and Calibration are computed from. Sharing
    the states (and ``update``) lets ``MetricCollection``'s compute groups run one update per
    step for all three instead of three BCE passes."""

    is_differentiable = False
    full_state_update = False

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        for name in ("loss_sum", "label_sum", "pred_sum", "weight_sum"):
            self.add_state(name, torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def update(
        self, preds_logits_B: torch.Tensor, target_B: torch.Tensor, weight_B: torch.Tensor | None = None
    ) -> None:
        x_B, y_B, w_B = _flat_inputs(preds_logits_B, target_B, weight_B, type(self).__name__)
        self.loss_sum += (w_B * F.binary_cross_entropy_with_logits(x_B, y_B, reduction="none")).sum()
        self.label_sum += (w_B * y_B).sum()
        self.pred_sum += (w_B * torch.sigmoid(x_B)).sum()
        self.weight_sum += w_B.sum()


class LogLoss(_WeightedSums):
    """Weighted mean binary cross-entropy from logits (numerically stable), summed states."""

    higher_is_better = False

    def compute(self) -> torch.Tensor:
        return (self.loss_sum / self.weight_sum).float()


def _binary_entropy(p: torch.Tensor) -> torch.Tensor:
    """Entropy in nats of a Bernoulli(p); 0 at p in {0, 1} (xlogy handles 0 log 0)."""
    return -(torch.special.xlogy(p, p) + torch.special.xlogy(1 - p, 1 - p))


class NormalizedEntropy(_WeightedSums):
    """Normalized entropy (He et al. 2014, "Practical Lessons from Predicting Clicks on Ads"):
    weighted logloss divided by the entropy of the weighted base rate of the same data. Below 1 =
    better than predicting the base rate. NaN when the data hold only one label value."""

    higher_is_better = False

    def compute(self) -> torch.Tensor:
        h = _binary_entropy(self.label_sum / self.weight_sum)
        ne = (self.loss_sum / self.weight_sum) / h
        return torch.where(h > 0, ne, torch.full_like(ne, math.nan)).float()


class Calibration(_WeightedSums):
    """Weighted mean predicted probability over weighted mean label (1 = calibrated on average)."""

    higher_is_better = None

    def compute(self) -> torch.Tensor:
        # No positives: undefined (NaN), as the offline ``calibration``, not inf.
        ratio = self.pred_sum / self.label_sum
        return torch.where(self.label_sum > 0, ratio, torch.full_like(ratio, math.nan)).float()


class GroupAUC(_KeepsDtypes):
    """GAUC for validation: per-group AUC averaged over the groups that hold both labels, each group
    weighted by its total sample weight (its impression count when unweighted).

    ``update(preds_logits_B, target_B, group_B, weight_B=None)``: ``group_B`` is the int64 grouping
    key (``Batch.group``). Exact per-group AUC needs every prediction, so this metric **stores
    them**: four tensors per update (group int64 as two float32, logit/label/weight float32: 20 bytes a row),
    concatenated across ranks (``dist_reduce_fx="cat"``) at compute time. Fine for validation sets
    (10M rows = 200 MB); for larger offline data use ``StreamingEvaluator``. ``compute`` is
    vectorised (sort by group then score, ties by run, segment sums), no Python loop over groups.
    NaN when no group holds both labels, and NaN when any logit is NaN (as ``BinnedAUC``): a sort
    would rank NaN above every score and report a finite GAUC of a diverged model.
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_state("groups", [], dist_reduce_fx="cat")
        self.add_state("logits", [], dist_reduce_fx="cat")
        self.add_state("labels", [], dist_reduce_fx="cat")
        self.add_state("weights", [], dist_reduce_fx="cat")

    def update(
        self,
        preds_logits_B: torch.Tensor,
        target_B: torch.Tensor,
        group_B: torch.Tensor,
        weight_B: torch.Tensor | None = None,
    ) -> None:
        x_B, y_B, w_B = _flat_inputs(preds_logits_B, target_B, weight_B, "GroupAUC")
        if group_B.shape != target_B.shape:
            raise ValueError(
                f"GroupAUC.update: group shape {tuple(group_B.shape)} != target shape {tuple(target_B.shape)}"
            )
        if group_B.is_floating_point():
            raise ValueError(f"GroupAUC.update: group must be an integer tensor, found {group_B.dtype}")
        # int64 keys stored as float32 pairs (the same bytes): every state is then float32, the
        # dtype torchmetrics gives the empty stand-in a rank that saw no rows sends at sync, so
        # the gather does not abort on mixed dtypes (ranks may see no validation rows).
        self.groups.append(group_B.detach().reshape(-1).long().contiguous().view(torch.float32))
        self.logits.append(x_B.float())
        self.labels.append(y_B.float())
        self.weights.append(w_B.float())

    def compute(self) -> torch.Tensor:
        if isinstance(self.groups, list) and not self.groups:
            return torch.tensor(math.nan, device=self.device)
        g = dim_zero_cat(self.groups).contiguous().view(torch.int64)
        x = dim_zero_cat(self.logits).double()
        y = dim_zero_cat(self.labels).double()
        w = dim_zero_cat(self.weights).double()
        if g.numel() == 0 or bool(torch.isnan(x).any()):
            return torch.tensor(math.nan, device=self.device)
        num_G, pos_G, neg_G = _grouped_auc_torch(g, x, w * y, w * (1 - y))
        used_G = (pos_G > 0) & (neg_G > 0)
        auc_G = num_G[used_G] / (pos_G * neg_G)[used_G]
        gw_G = (pos_G + neg_G)[used_G]
        return ((gw_G * auc_G).sum() / gw_G.sum()).float()


def _exact_auc_torch(x_R: torch.Tensor, y_R: torch.Tensor, w_R: torch.Tensor) -> torch.Tensor:
    """Weighted AUC of float32 scores with ties one half, from one sort: per run of equal scores
    its positive and negative weight (float64), then each positive run against the negatives below.
    About 80 bytes a row at its peak with the gathered rows; nan with one class (0/0)."""
    order = torch.argsort(x_R)
    x_R = x_R[order]
    new_run_R = torch.ones_like(x_R, dtype=torch.bool)
    new_run_R[1:] = x_R[1:] != x_R[:-1]
    del x_R
    run_R = new_run_R.cumsum(0) - 1
    n_runs = int(run_R[-1]) + 1  # syncs: compute runs once per validation, not per step
    del new_run_R
    w_R, y_R = w_R[order].double(), y_R[order].double()
    del order
    pos_U = torch.zeros(n_runs, dtype=torch.float64, device=w_R.device).index_add_(0, run_R, w_R * y_R)
    neg_U = torch.zeros(n_runs, dtype=torch.float64, device=w_R.device).index_add_(0, run_R, w_R * (1 - y_R))
    neg_below_U = neg_U.cumsum(0) - neg_U
    return (pos_U * (neg_below_U + 0.5 * neg_U)).sum() / (pos_U.sum() * neg_U.sum())


def _grouped_auc_torch(
    g_R: torch.Tensor, s_R: torch.Tensor, pos_R: torch.Tensor, neg_R: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-group Mann-Whitney numerator, positive weight and negative weight (torch twin of
    ``_grouped_auc_terms``; R rows, U runs of equal (group, score), G groups)."""
    # Lexicographic sort (group major, score minor) from two stable sorts.
    order = torch.argsort(s_R, stable=True)
    order = order[torch.argsort(g_R[order], stable=True)]
    g_R, s_R, pos_R, neg_R = g_R[order], s_R[order], pos_R[order], neg_R[order]
    new_run_R = torch.ones_like(g_R, dtype=torch.bool)
    new_run_R[1:] = (g_R[1:] != g_R[:-1]) | (s_R[1:] != s_R[:-1])
    run_R = new_run_R.cumsum(0) - 1
    n_runs = int(run_R[-1]) + 1  # syncs: compute runs once per validation epoch, not per step
    pos_U = torch.zeros(n_runs, dtype=pos_R.dtype, device=pos_R.device).index_add_(0, run_R, pos_R)
    neg_U = torch.zeros(n_runs, dtype=neg_R.dtype, device=neg_R.device).index_add_(0, run_R, neg_R)
    g_U = g_R[new_run_R]
    new_group_U = torch.ones_like(g_U, dtype=torch.bool)
    new_group_U[1:] = g_U[1:] != g_U[:-1]
    group_U = new_group_U.cumsum(0) - 1
    first_run_G = torch.nonzero(new_group_U).squeeze(1)
    neg_before_U = neg_U.cumsum(0) - neg_U  # negatives below this run, over all groups so far
    neg_below_U = neg_before_U - neg_before_U[first_run_G][group_U]  # ... within its own group
    n_groups = first_run_G.numel()
    zeros_G = torch.zeros(n_groups, dtype=pos_R.dtype, device=pos_R.device)
    num_G = zeros_G.clone().index_add_(0, group_U, pos_U * (neg_below_U + 0.5 * neg_U))
    pos_G = zeros_G.clone().index_add_(0, group_U, pos_U)
    neg_G = zeros_G.clone().index_add_(0, group_U, neg_U)
    return num_G, pos_G, neg_G


# ----------------------------------------------------------------------------------------------
# Offline exact metrics (numpy float64)
# ----------------------------------------------------------------------------------------------


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
    p = 2 * (1 - NormalDist().cdf(abs(diff) / se)) if se > 0 else (0.0 if diff else 1.0)
    return {
        "auc_a": auc_a,
        "auc_b": auc_b,
        "diff": diff,
        "lo": diff - z * se,
        "hi": diff + z * se,
        "se": se,
        "p_value": p,
    }


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


# ----------------------------------------------------------------------------------------------
# Streaming evaluation over data of any size (recformer evaluate)
# ----------------------------------------------------------------------------------------------


@dataclass
class EvalResult:
    """What ``StreamingEvaluator.compute`` reports. Undefined metrics (one label class, no usable
    group) are NaN rather than errors, so a report is always written."""

    rows: int
    """Rows seen."""
    weight_sum: float
    """Sum of sample weights."""
    base_rate: float
    """Weighted mean label."""
    auc: float
    """Exact AUC when ``auc_exact``, else the binned AUC."""
    auc_exact: bool
    """Whether every row fitted in memory, so ``auc`` (and the CI) are exact."""
    auc_binned: float
    """Binned AUC from the logit histogram (always computed; a check on the exact one)."""
    auc_lo: float
    """Lower end of the DeLong interval (NaN when not exact, weighted or soft labels)."""
    auc_hi: float
    """Upper end of the DeLong interval."""
    auc_se: float
    """DeLong standard error of the AUC."""
    gauc: float
    """Impression-weighted group AUC (NaN without groups)."""
    gauc_groups: int
    """Groups holding both labels, i.e. those GAUC averages over."""
    gauc_groups_excluded: int
    """Groups holding one label class only: GAUC leaves them out."""
    gauc_excluded_share: float
    """Their share of the weight (of the rows, unweighted); NaN without groups."""
    logloss: float
    """Weighted mean binary cross-entropy (nats)."""
    ne: float
    """Normalized entropy: logloss / entropy(base_rate)."""
    calibration: float
    """Mean predicted probability / mean label."""
    calibration_table_exact: bool
    """Whether the calibration table cuts its equal-weight bins at exact rows (else at
    histogram-bin edges)."""
    calibration_table: list[dict[str, float]] = field(default_factory=list)
    """Per-bin mean predicted vs observed (see ``calibration_table``)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX = np.uint64(0xBF58476D1CE4E5B9)


def _partition_of(groups: np.ndarray, n_parts: int, seed: int) -> np.ndarray:
    """Hash partition of each group key (splitmix64 finaliser); every row of a group lands in the
    same partition, so per-group AUC is exact within a partition. ``seed`` re-splits a partition."""
    if groups.dtype.kind in "iub":
        h = groups.astype(np.int64).view(np.uint64)
    else:  # strings: crc32 of each distinct value, then the same mixing
        uniq, inv = np.unique(groups, return_inverse=True)
        h = np.array([zlib.crc32(str(u).encode()) for u in uniq], dtype=np.uint64)[inv.reshape(-1)]
    with np.errstate(over="ignore"):
        h = (h + np.uint64(seed + 1) * _GOLDEN) * _MIX
        h ^= h >> np.uint64(31)
        h *= _MIX
        h ^= h >> np.uint64(29)
    return (h % np.uint64(n_parts)).astype(np.int64)


class StreamingEvaluator:
    """Accumulates (logit, label, weight, group) batches and computes every offline metric.

    Memory bound, by construction:

    - Always (constant memory): a float64 histogram of ``n_bins`` logit-scale bins (positives,
      negatives, predicted-probability sums) for the binned AUC and an approximate calibration
      table, and running sums for logloss, NE and calibration, which are exact at any size.
    - Up to ``max_rows_in_memory`` rows: the rows themselves (~32 bytes each), so AUC (with its
      DeLong interval), GAUC and the calibration table are exact. ``compute`` on them needs about
      five times that at its peak (concatenation, sorts, midranks: ~180 bytes a row in all, so
      the default 20M rows can take ~3.6 GB), and ``recformer evaluate --compare`` holds two
      models' scores besides.
    - Beyond that, rows are spilled to ``n_partitions`` temporary Parquet files partitioned by a
      hash of the group key, and the buffer is flushed whenever it refills, so memory stays at
      ``max_rows_in_memory`` rows. AUC falls back to the binned one (``auc_exact=False``). GAUC stays
      exact: each partition holds whole groups and is read on its own; a partition larger than
      ``max_rows_in_memory`` is re-split with a new hash seed. The one case that cannot be bounded
      is a single group with more rows than ``max_rows_in_memory``; it is then read whole.

    Use as a context manager (or call ``close``) so the spill directory is removed.
    """

    def __init__(
        self,
        *,
        max_rows_in_memory: int = 20_000_000,
        n_bins: int = 1 << 16,
        logit_range: float = DEFAULT_LOGIT_RANGE,
        n_partitions: int = 64,
        calibration_bins: int = 10,
        ci_alpha: float = 0.95,
        spill_dir: str | Path | None = None,
    ) -> None:
        _check_bins(n_bins, logit_range)
        if max_rows_in_memory < 1:
            raise ValueError(f"max_rows_in_memory={max_rows_in_memory} must be >= 1")
        if n_partitions < 2:
            raise ValueError(f"n_partitions={n_partitions} must be >= 2")
        if calibration_bins < 1:
            raise ValueError(f"calibration_bins={calibration_bins} must be >= 1")
        self.max_rows_in_memory = max_rows_in_memory
        self.n_bins, self.logit_range = n_bins, float(logit_range)
        self.n_partitions, self.calibration_bins, self.ci_alpha = n_partitions, calibration_bins, ci_alpha
        self._spill_parent = spill_dir
        self._spill_dir: Path | None = None
        self._writers: dict[int, pq.ParquetWriter] = {}
        self._group_type: pa.DataType | None = None
        self.pos_hist = np.zeros(n_bins)
        self.neg_hist = np.zeros(n_bins)
        self.pred_hist = np.zeros(n_bins)  # sum of w * p per bin, for the calibration table
        self.rows_hist = np.zeros(n_bins, dtype=np.int64)
        self.loss_sum = 0.0
        self.rows = 0
        self.has_groups: bool | None = None
        self._buf: list[tuple[np.ndarray, ...]] = []
        self._buf_rows = 0
        self.spilled = False
        self._closed_spill = False  # set once compute() has closed the spill writers

    # -- accumulation ------------------------------------------------------------------------------
    def update(self, logits: Any, labels: Any, weights: Any = None, groups: Any = None) -> None:
        """Add one record batch. ``groups`` must be given on every batch or on none."""
        batch = f"batch starting at row {self.rows}"
        if self._closed_spill:
            raise RuntimeError(
                "StreamingEvaluator.update after compute() on spilled data; use a new evaluator"
            )
        try:
            x, y, w = _check_arrays(logits, labels, weights, what="logits")
        except ValueError as e:
            raise ValueError(f"StreamingEvaluator.update ({batch}): {e}") from None
        if self.has_groups is None:
            self.has_groups = groups is not None
        if self.has_groups != (groups is not None):
            raise ValueError(
                f"StreamingEvaluator.update ({batch}): groups given on some batches but not others"
            )
        g = np.zeros(x.size, np.int64) if groups is None else np.asarray(groups).reshape(-1)
        if g.size != x.size:
            raise ValueError(
                f"StreamingEvaluator.update ({batch}): groups has {g.size} values, logits {x.size}"
            )
        if g.dtype.kind in "fc":
            raise ValueError(
                f"StreamingEvaluator.update ({batch}): groups must be integers or strings, found {g.dtype}"
            )
        r = self.logit_range
        b = np.floor((np.clip(x, -r, r) + r) * (self.n_bins / (2 * r))).astype(np.int64)
        b = np.minimum(b, self.n_bins - 1)
        p = _sigmoid(x)
        self.pos_hist += np.bincount(b, w * y, self.n_bins)
        self.neg_hist += np.bincount(b, w * (1 - y), self.n_bins)
        self.pred_hist += np.bincount(b, w * p, self.n_bins)
        self.rows_hist += np.bincount(b, minlength=self.n_bins)
        self.loss_sum += float((w * _bce(x, y)).sum())
        self.rows += x.size
        self._buf.append((g, x, y, w))
        self._buf_rows += x.size
        if self._buf_rows > self.max_rows_in_memory:
            self._flush()

    def _flush(self) -> None:
        """Move the buffered rows into the hash-partitioned spill files."""
        if not self._buf:
            return
        g, x, y, w = (np.concatenate(c) for c in zip(*self._buf))
        self._buf, self._buf_rows = [], 0
        if self._spill_dir is None:
            self._spill_dir = Path(tempfile.mkdtemp(prefix="recformer-eval-", dir=self._spill_parent))
        self.spilled = True
        self._write_partitions(g, x, y, w, self._spill_dir, seed=0, writers=self._writers)

    def _table(self, g: np.ndarray, x: np.ndarray, y: np.ndarray, w: np.ndarray) -> pa.Table:
        gcol = pa.array(g) if g.dtype.kind in "iub" else pa.array(g.astype(str), type=pa.string())
        if self._group_type is None:
            self._group_type = gcol.type
        if gcol.type != self._group_type:
            raise ValueError(
                f"StreamingEvaluator: groups changed type from {self._group_type} to {gcol.type} "
                "between batches; give every batch the same group column type"
            )
        return pa.table({"group": gcol, "score": x, "label": y, "weight": w})

    def _write_partitions(self, g, x, y, w, folder: Path, seed: int, writers: dict) -> None:
        part = _partition_of(g, self.n_partitions, seed)
        order = np.argsort(part, kind="stable")
        bounds = np.searchsorted(part[order], np.arange(self.n_partitions + 1))
        for k in range(self.n_partitions):
            idx = order[bounds[k] : bounds[k + 1]]
            if idx.size == 0:
                continue
            t = self._table(g[idx], x[idx], y[idx], w[idx])
            if k not in writers:
                writers[k] = pq.ParquetWriter(folder / f"part-{k:03d}.parquet", t.schema)
            writers[k].write_table(t)

    # -- results -----------------------------------------------------------------------------------
    def _spilled_gauc(self, files: list[Path], seed: int) -> _GaucSums:
        sums = _GaucSums()
        for f in files:
            meta = pq.ParquetFile(f)
            if meta.metadata.num_rows > self.max_rows_in_memory and seed < 4:
                sub = f.parent / f"{f.stem}-split"
                sub.mkdir(exist_ok=True)
                writers: dict[int, pq.ParquetWriter] = {}
                for rb in meta.iter_batches(batch_size=max(1, self.max_rows_in_memory // 2)):
                    cols = [
                        rb.column(c).to_numpy(zero_copy_only=False)
                        for c in ("group", "score", "label", "weight")
                    ]
                    self._write_partitions(*cols, folder=sub, seed=seed + 1, writers=writers)
                for wr in writers.values():
                    wr.close()
                parts = self._spilled_gauc(sorted(sub.glob("*.parquet")), seed + 1)
            else:
                t = pq.read_table(f)
                s = t.column("score").to_numpy()
                codes = _group_codes(t.column("group").to_numpy(zero_copy_only=False), s.size)
                parts = _gauc_sums(codes, s, t.column("label").to_numpy(), t.column("weight").to_numpy())
            sums = sums + parts
        return sums

    def _histogram_calibration_table(self) -> list[dict[str, float]]:
        """Equal-weight bins cut at histogram-bin edges (each histogram bin goes whole to one row)."""
        wt = self.pos_hist + self.neg_hist
        if wt.sum() <= 0:
            return []
        k = _equal_weight_bins(wt, self.calibration_bins)
        nb = self.calibration_bins
        edges = np.linspace(-self.logit_range, self.logit_range, self.n_bins + 1)
        occupied = self.rows_hist > 0
        lo = np.full(nb, np.nan)
        hi = np.full(nb, np.nan)
        for i in range(nb):  # calibration_bins rows, not a loop over data
            sel = np.flatnonzero(occupied & (k == i))
            if sel.size:
                lo[i], hi[i] = _sigmoid(edges[sel[0]]), _sigmoid(edges[sel[-1] + 1])
        return _calibration_rows(
            lo,
            hi,
            np.bincount(k, wt, nb),
            np.bincount(k, self.pred_hist, nb),
            np.bincount(k, self.pos_hist, nb),
            np.bincount(k, self.rows_hist, nb),
        )

    def compute(self) -> EvalResult:
        if self.rows == 0:
            raise ValueError("StreamingEvaluator.compute: no rows were added")
        wsum = float(self.pos_hist.sum() + self.neg_hist.sum())
        ysum = float(self.pos_hist.sum())
        base = ysum / wsum if wsum > 0 else math.nan
        ll = self.loss_sum / wsum if wsum > 0 else math.nan
        h = _entropy(base) if wsum > 0 else 0.0
        with np.errstate(invalid="ignore", divide="ignore"):
            auc_binned = float(_histogram_auc(self.pos_hist, self.neg_hist))
        auc, lo, hi, se = auc_binned, math.nan, math.nan, math.nan
        gs = _GaucSums()
        cal_table = None
        if not self.spilled:
            g, x, y, w = (np.concatenate(c) for c in zip(*self._buf))
            auc = _auc_or_nan(x, y, w)
            unweighted_binary = bool((w == 1).all() and np.isin(y, (0.0, 1.0)).all())
            if unweighted_binary and (y == 1).sum() >= 2 and (y == 0).sum() >= 2:
                auc, lo, hi, se = delong_ci(x, y, self.ci_alpha)
            if self.has_groups:
                gs = _gauc_sums(_group_codes(g, x.size), x, y, w)
            if x.size >= self.calibration_bins:
                cal_table = calibration_table(x, y, self.calibration_bins, w)
        else:
            self._flush()
            for wr in self._writers.values():
                wr.close()
            self._writers = {}
            self._closed_spill = True
            if self.has_groups:
                assert self._spill_dir is not None
                gs = self._spilled_gauc(sorted(self._spill_dir.glob("part-*.parquet")), seed=0)
        return EvalResult(
            rows=self.rows,
            weight_sum=wsum,
            base_rate=base,
            auc=auc,
            auc_exact=not self.spilled,
            auc_binned=auc_binned,
            auc_lo=lo,
            auc_hi=hi,
            auc_se=se,
            gauc=gs.gauc,
            gauc_groups=gs.used,
            gauc_groups_excluded=gs.excluded,
            gauc_excluded_share=gs.excluded_share,
            logloss=ll,
            ne=ll / h if h > 0 else math.nan,
            calibration=float(self.pred_hist.sum() / ysum) if ysum > 0 else math.nan,
            calibration_table_exact=cal_table is not None,
            calibration_table=cal_table if cal_table is not None else self._histogram_calibration_table(),
        )

    def close(self) -> None:
        for wr in self._writers.values():
            wr.close()
        self._writers = {}
        if self._spill_dir is not None:
            shutil.rmtree(self._spill_dir, ignore_errors=True)
            self._spill_dir = None

    def __enter__(self) -> StreamingEvaluator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
