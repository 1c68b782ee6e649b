"""``OptimConfig``: AdamW, parameter groups and schedule (DESIGN section 5)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# ----------------------------------------------------------------------------------------------
# Optimisation (DESIGN section 5)
# ----------------------------------------------------------------------------------------------


@dataclass
class OptimConfig:
    """AdamW with explicit parameter groups, warmup and a schedule."""

    lr: float = 1e-3
    """Base (peak) learning rate."""
    betas: tuple[float, float] = (0.9, 0.95)
    """Adam betas; beta2 0.95 recovers from spikes faster than 0.999."""
    eps: float = 1e-8
    """Adam epsilon."""
    weight_decay: float = 0.1
    """Decoupled weight decay, applied to matrices only (not norms, biases, embedding tables)."""
    embedding_decay: float = 0.0
    """Decoupled decay of the embedding-table rows a step touches (the rows its batch read):
    ``row *= 1 - lr * embedding_decay``, as AdamW decays a matrix, but only where the batch looked,
    so rows seen rarely are not pulled to 0 between their updates: DIN's mini-batch aware
    regularisation (Zhou et al. 2018, section 5.1) in AdamW's decoupled form."""
    embedding_lr_mult: float = 1.0
    """Learning-rate multiplier of the embedding group (the id tables, per-item biases, CLS and slot
    vectors). Under Adam a row moves about one learning rate per step that gives it a gradient, and
    an item's row gets one only from the rows that name it, while every dense matrix gets one every
    step; at the base rate an item's embedding barely leaves its init in a few epochs."""
    item_bias_lr_mult: float = 1.0
    """Learning-rate multiplier of the per-item bias (``model.ranker.item_bias``) alone. An item's
    bias gets a gradient only from the rows whose target it is: at the base rate it is still far
    from the item's rate when the rest of the model peaks (item popularity alone, one such logit
    per item at lr 1e-3, peaks after about 11 epochs on MovieLens)."""
    embedding_l2: float = 0.0
    """L2 penalty on the embedding tables as CTR libraries apply it: ``embedding_l2 / 2 * sum ||W||^2``
    over every row of every table, added to the training loss at every step (FuxiCTR's
    ``embedding_regularizer``; DeepCTR's ``l2_reg_embedding``). Unlike ``embedding_decay`` it also
    pulls the rows a batch did not read toward 0, which shrinks rarely seen ids the most."""
    table_optimizer: Literal["adamw", "rowwise_adagrad"] = "adamw"
    """What steps the id tables (the ``table`` group): AdamW like every other group, or row-wise
    Adagrad at ``table_lr`` (one accumulator per row; the sparse optimizer DLRM and TorchRec
    train tables with), every other group staying on AdamW."""
    table_lr: float = 0.05
    """Learning rate of the id tables under ``table_optimizer: rowwise_adagrad`` (row-wise Adagrad
    rates are of order 0.01-0.1; it follows the same warmup and schedule); unused under AdamW."""
    warmup_steps: int = 100
    """Linear warmup steps from 0 to lr."""
    schedule: Literal["cosine", "constant", "linear"] = "cosine"
    """Decay after warmup."""
    min_lr_ratio: float = 0.1
    """Final LR as a fraction of lr for cosine / linear decay."""
    decay_steps: int = 0
    """Steps of the cosine / linear decay after warmup, the LR held at ``min_lr_ratio`` after them;
    0: the decay spans the whole run (``trainer.max_epochs`` / ``max_steps``). A run stopped early
    at epoch 4 of a 20-epoch cap has decayed by a tenth at most; a horizon near the epoch it peaks
    at anneals it there."""
    grad_clip: float = 1.0
    """Gradient-norm clipping threshold (0 = off)."""
    max_nonfinite_steps: int = 20
    """Stop training after this many non-finite steps in a row."""

    def __post_init__(self) -> None:
        if self.lr <= 0:
            raise ValueError(f"lr={self.lr} must be > 0")
        self.betas = tuple(self.betas)  # YAML and checkpoints give lists
        b1, b2 = self.betas
        if not (0 <= b1 < 1 and 0 <= b2 < 1):
            raise ValueError(f"betas={self.betas} must both be in [0, 1)")
        if self.warmup_steps < 0:
            raise ValueError(f"warmup_steps={self.warmup_steps} must be >= 0")
        if self.decay_steps < 0:
            raise ValueError(f"decay_steps={self.decay_steps} must be >= 0 (0 = the whole run)")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"min_lr_ratio={self.min_lr_ratio} must be in [0, 1]")
        if not self.eps > 0:
            raise ValueError(f"eps={self.eps} must be > 0")
        for name in ("embedding_lr_mult", "item_bias_lr_mult", "table_lr"):
            if not 0 < getattr(self, name) < float("inf"):
                raise ValueError(f"{name}={getattr(self, name)} must be a finite number > 0")
        if self.table_optimizer not in ("adamw", "rowwise_adagrad"):
            raise ValueError(
                f"table_optimizer={self.table_optimizer!r}; expected 'adamw' or 'rowwise_adagrad'"
            )
        for name in ("weight_decay", "grad_clip", "embedding_decay", "embedding_l2"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 0 (0 = off)")
        if self.max_nonfinite_steps < 1:
            raise ValueError(f"max_nonfinite_steps={self.max_nonfinite_steps} must be >= 1")
