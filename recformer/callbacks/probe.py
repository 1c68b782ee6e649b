"""Activation and attention statistics from a fixed probe batch, run eagerly every N steps.

The training path carries no hooks (it may be compiled); instead, on the probe's steps, the model
runs once more on the same small batch through its stats path, ``ranker.forward_stats(batch)``
(``recformer.model.protocol``: eager, explicit attention), under ``torch.no_grad`` in eval mode,
and the train mode is restored afterwards. Metrics, per block ``i`` (DESIGN section 6):

- ``health/cos_adjacent/block_{i}``: cosine of the hidden state entering and leaving block i;
  near 1.0 the block passes its input through unchanged (idle deep Pre-Norm layers);
- ``health/resid_rms/block_{i}``: residual-stream RMS after block i; growth with depth is the
  variance explosion of deep Pre-Norm stacks (Sun et al. 2025, "The Curse of Depth");
- ``health/attn_logit_max/block_{i}`` (max over heads) and ``health/attn_entropy/block_{i}`` (mean
  over heads of entropy / log(keys)), and per head with ``per_head``: a rising max logit with entropy
  going to 0 is the one-hot collapse QK-Norm prevents (Dehghani et al. 2023); entropy near 1 is
  uniform averaging;
- ``health/emb_row_norm/{table}/p{q}``: percentiles of the embedding row norms per feature group
  the model reports (``embedding_groups``: ``item``, ``cat``, ``item_feat``, ``hist_cat``, ``gap``):
  rows that explode, or never move from init.

The probe batch is the first ``batch_size`` rows of the validation split (the same rows every
time, so changes are the model's); a run without a validation loader uses its first training
batch. Models without blocks (the baselines) get the embedding percentiles only.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import torch

from recformer.batch import Batch
from recformer.callbacks.sink import MetricSource, StepMetrics
from recformer.metric_names import (
    ATTN_ENTROPY,
    ATTN_ENTROPY_HEAD,
    ATTN_LOGIT_MAX,
    ATTN_LOGIT_MAX_HEAD,
    COS_ADJACENT,
    EMB_ROW_NORM,
    RESID_RMS,
)

log = logging.getLogger(__name__)


def take_rows(batches: list[Batch], n: int) -> Batch:
    """The first ``n`` samples of consecutive batches as one batch (``oov`` counts are summed)."""
    joined = {
        f.name: torch.cat([getattr(b, f.name) for b in batches])[:n].clone()  # not a view of all rows
        for f in dataclasses.fields(Batch)
        if f.name != "oov"
    }
    return Batch(**joined, oov=torch.stack([b.oov for b in batches]).sum(0))


def row_norm_percentiles(weight_VD: torch.Tensor, percentiles: tuple[float, ...]) -> torch.Tensor:
    """Percentiles (0-100, nearest rank) of the L2 row norms; sort-based, so any table size works
    (``torch.quantile`` refuses inputs above 2**24 elements)."""
    norms_V = torch.linalg.vector_norm(weight_VD.detach().float(), dim=-1).sort().values
    last = norms_V.numel() - 1
    idx = torch.tensor([round(q / 100 * last) for q in percentiles], device=norms_V.device)
    return norms_V[idx]


class ProbeStats(MetricSource):
    def __init__(
        self,
        every_n_steps: int | None = None,
        batch_size: int = 64,
        per_head: bool = True,
        percentiles: tuple[float, ...] = (50.0, 90.0, 99.0),
    ) -> None:
        """
        Args:
            every_n_steps: Cadence in optimizer steps; None = ``trainer.log_every_n_steps``, 0 = off.
                One probe costs about one forward pass on ``batch_size`` rows.
            batch_size: Rows of the probe batch.
            per_head: Also log max logit and entropy per attention head.
            percentiles: Row-norm percentiles (0-100) logged per embedding table.
        """
        super().__init__(every_n_steps)
        if batch_size < 1:
            raise ValueError(f"ProbeStats.batch_size={batch_size} must be >= 1")
        bad = [q for q in percentiles if not 0.0 <= q <= 100.0]
        if bad:
            raise ValueError(f"ProbeStats.percentiles has values outside [0, 100]: {bad}")
        self.batch_size = batch_size
        self.per_head = per_head
        self.percentiles = tuple(percentiles)
        self._probe: Batch | None = None

    def meta(self, trainer: Any, pl_module: Any) -> dict[str, Any]:
        return {**super().meta(trainer, pl_module), "batch_size": self.batch_size}

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if self._probe is not None or not trainer.is_global_zero:
            return
        dm = trainer.datamodule
        if dm is None:
            return
        batches: list[Batch] = []
        try:
            for batch in dm.val_dataloader():
                if not isinstance(batch, Batch):
                    return
                batches.append(batch)
                if sum(len(b) for b in batches) >= self.batch_size:
                    break
        except Exception as e:  # noqa: BLE001 - no validation data is fine: fall back to a train batch
            log.info(
                "probe batch: no validation batch (%s: %s); using the training batch of the first probe step",
                type(e).__name__,
                e,
            )
            return
        if batches:
            self._set_probe(batches, pl_module)

    def _set_probe(self, batches: list[Batch], pl_module: Any) -> None:
        self._probe = take_rows(batches, self.batch_size).to(pl_module.device)

    @torch.no_grad()
    def collect(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, step: int, out: StepMetrics
    ) -> None:
        ranker = pl_module.ranker
        for group, (emb, start, stop) in ranker.embedding_groups().items():
            out.add(
                [EMB_ROW_NORM.format(table=group, q=f"{q:g}") for q in self.percentiles],
                row_norm_percentiles(emb.weight[start:stop], self.percentiles),
            )
        Y = len(ranker.transformer_blocks())
        if not Y:
            return
        if self._probe is None and isinstance(batch, Batch):
            self._set_probe([batch], pl_module)
        if self._probe is None:
            return
        was_training = ranker.training
        ranker.eval()  # no dropout: the same rows give the same statistics
        try:
            _, stats = ranker.forward_stats(self._probe)
        finally:
            ranker.train(was_training)
        out.add([COS_ADJACENT.format(i=i) for i in range(Y)], stats.cos_adjacent_Y)
        out.add([RESID_RMS.format(i=i) for i in range(Y)], stats.resid_rms_Y)
        out.add([ATTN_LOGIT_MAX.format(i=i) for i in range(Y)], stats.attn_logit_max_YN.amax(dim=-1))
        out.add([ATTN_ENTROPY.format(i=i) for i in range(Y)], stats.attn_entropy_YN.mean(dim=-1))
        if self.per_head:
            N = stats.attn_logit_max_YN.shape[-1]
            heads = [(i, h) for i in range(Y) for h in range(N)]
            out.add([ATTN_LOGIT_MAX_HEAD.format(i=i, h=h) for i, h in heads], stats.attn_logit_max_YN)
            out.add([ATTN_ENTROPY_HEAD.format(i=i, h=h) for i, h in heads], stats.attn_entropy_YN)
