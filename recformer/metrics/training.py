"""On-device ranking metrics for the LightningModule: torchmetrics ``Metric`` subclasses that
``recformer/module.py`` logs during training, validation and test.

``BinnedAUC``, ``LogLoss``, ``NormalizedEntropy``, ``Calibration`` and ``GroupAUC`` follow the
conventions of ``exact.py`` (logits in, soft labels, weights, ties one half) and are tested against
its functions. Their states are sums (``dist_reduce_fx="sum"``) or concatenated rows (``"cat"``:
``GroupAUC``, and ``BinnedAUC`` up to its row cap), so the value reduced over DDP ranks equals the
single-process value on all the data. ``update`` never syncs the device (no ``.item()``, no
data-dependent Python branch); ``compute`` runs once per logging interval / epoch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torchmetrics import Metric
from torchmetrics.utilities import dim_zero_cat, rank_zero_warn

from recformer.metrics.exact import DEFAULT_LOGIT_RANGE, _check_bins, _histogram_auc

DEFAULT_AUC_BINS = 4096
"""Histogram bins of the binned AUC: 24 logits / 4096 = 0.006 logit per bin. The error is ~1e-4 when
the scores spread over many bins and 1e-2 to 2e-2 when they crowd into a few (a barely trained model
whose logits all fall in 3-4 bins: tests/test_metrics_training.py), which is why ``BinnedAUC`` is
exact below ``DEFAULT_AUC_EXACT_MAX_ROWS``."""
DEFAULT_AUC_EXACT_MAX_ROWS = 1_000_000
"""Rows (over all ranks) that ``BinnedAUC`` keeps for the exact AUC (12 bytes each, float32 logit,
label and weight; about 80 bytes each at the peak of ``compute``) before it falls back to its
histograms."""


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
        num, pos, neg = _grouped_auc_torch(g, x, w * y, w * (1 - y))
        used = (pos > 0) & (neg > 0)  # groups holding both labels
        group_auc = num[used] / (pos * neg)[used]
        group_weight = (pos + neg)[used]
        return ((group_weight * group_auc).sum() / group_weight.sum()).float()


def _exact_auc_torch(scores: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Weighted AUC of float32 scores with ties one half, from one sort: per run of equal scores
    its positive and negative weight (float64), then each positive run against the negatives below.
    About 80 bytes a row at its peak with the gathered rows; nan with one class (0/0). The ``del``
    statements free each sorted copy once it is used, which keeps the peak there."""
    order = torch.argsort(scores)
    scores = scores[order]
    new_run = torch.ones_like(scores, dtype=torch.bool)
    new_run[1:] = scores[1:] != scores[:-1]
    del scores
    run_of_row = new_run.cumsum(0) - 1
    n_runs = int(run_of_row[-1]) + 1  # syncs: compute runs once per validation, not per step
    del new_run
    weights, labels = weights[order].double(), labels[order].double()
    del order
    run_pos = torch.zeros(n_runs, dtype=torch.float64, device=weights.device)
    run_neg = torch.zeros_like(run_pos)
    run_pos.index_add_(0, run_of_row, weights * labels)
    run_neg.index_add_(0, run_of_row, weights * (1 - labels))
    neg_below = run_neg.cumsum(0) - run_neg
    return (run_pos * (neg_below + 0.5 * run_neg)).sum() / (run_pos.sum() * run_neg.sum())


def _grouped_auc_torch(
    groups: torch.Tensor, scores: torch.Tensor, pos: torch.Tensor, neg: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-group Mann-Whitney numerator, positive weight and negative weight: the torch twin of
    ``exact._grouped_auc_terms``, over runs of equal (group, score)."""
    # Lexicographic sort (group major, score minor) from two stable sorts.
    order = torch.argsort(scores, stable=True)
    order = order[torch.argsort(groups[order], stable=True)]
    g, s, pos, neg = groups[order], scores[order], pos[order], neg[order]
    new_run = torch.ones_like(g, dtype=torch.bool)
    new_run[1:] = (g[1:] != g[:-1]) | (s[1:] != s[:-1])
    run_of_row = new_run.cumsum(0) - 1
    n_runs = int(run_of_row[-1]) + 1  # syncs: compute runs once per validation epoch, not per step
    run_pos = torch.zeros(n_runs, dtype=pos.dtype, device=pos.device).index_add_(0, run_of_row, pos)
    run_neg = torch.zeros(n_runs, dtype=neg.dtype, device=neg.device).index_add_(0, run_of_row, neg)
    run_g = g[new_run]
    new_group = torch.ones_like(run_g, dtype=torch.bool)
    new_group[1:] = run_g[1:] != run_g[:-1]
    group_of_run = new_group.cumsum(0) - 1
    group_start = torch.nonzero(new_group).squeeze(1)  # first run of each group
    neg_before = run_neg.cumsum(0) - run_neg  # negatives below this run, over all groups so far
    neg_below = neg_before - neg_before[group_start][group_of_run]  # ... within its own group
    zeros = torch.zeros(group_start.numel(), dtype=pos.dtype, device=pos.device)
    group_num = zeros.clone().index_add_(0, group_of_run, run_pos * (neg_below + 0.5 * run_neg))
    group_pos = zeros.clone().index_add_(0, group_of_run, run_pos)
    group_neg = zeros.clone().index_add_(0, group_of_run, run_neg)
    return group_num, group_pos, group_neg
