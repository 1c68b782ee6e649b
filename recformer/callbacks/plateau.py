"""Divide the learning rate when validation stops improving: the annealing CTR libraries train with.

A sparse-id ranker peaks within a few epochs and then overfits, long before a schedule set by
``max_epochs`` has decayed its learning rate, so the peak is reached at a high rate. FuxiCTR's
trainer (``reduce_lr_on_plateau``, on by default) multiplies the rate by 0.1 at each validation
that does not beat the best, and stops after ``early_stop_patience`` such validations in a row:
the validations after the first miss run at a tenth of the rate, where the model often climbs
above its earlier best. ``DecayOnPlateau`` does the same beside Lightning's ``EarlyStopping``: on
each validation whose ``monitor`` is not better than the best so far by ``min_delta``, every
scheduler's base rates (and so the rates it sets from then on: warmup and cosine keep their shape)
and every optimizer group's current rate are multiplied by ``factor``.

The decision reads ``trainer.callback_metrics``, already reduced across ranks, so every rank takes
it alike with no collective of its own. Its best and count travel in checkpoints; the schedulers'
base rates travel in theirs, so a resumed run continues at the decayed rate.
"""

from __future__ import annotations

import math
from typing import Any

from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info


class DecayOnPlateau(Callback):
    def __init__(
        self, monitor: str = "val/auc", mode: str = "max", factor: float = 0.1, min_delta: float = 0.0
    ) -> None:
        """
        Args:
            monitor: The validation metric watched (logged by the module).
            mode: "max" (higher is better) or "min".
            factor: What the learning rates are multiplied by at each validation without a new best
                (FuxiCTR's 0.1); in (0, 1).
            min_delta: How much better than the best a validation must be to count as a new best.
        """
        if mode not in ("max", "min"):
            raise ValueError(f"DecayOnPlateau: mode={mode!r}; expected 'max' or 'min'")
        if not 0 < factor < 1:
            raise ValueError(f"DecayOnPlateau: factor={factor} must be in (0, 1)")
        if not min_delta >= 0:
            raise ValueError(f"DecayOnPlateau: min_delta={min_delta} must be >= 0")
        self.monitor, self.mode, self.factor, self.min_delta = monitor, mode, factor, min_delta
        self.best = -math.inf if mode == "max" else math.inf
        self.decays = 0

    def _improved(self, value: float) -> bool:
        if self.mode == "max":
            return value > self.best + self.min_delta
        return value < self.best - self.min_delta

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if trainer.sanity_checking or self.monitor not in trainer.callback_metrics:
            return
        value = float(trainer.callback_metrics[self.monitor])  # a host value: reduced at epoch end
        if math.isnan(value):
            return
        if self._improved(value):
            self.best = value
            return
        self.decays += 1
        for config in trainer.lr_scheduler_configs:
            scheduler = config.scheduler
            if hasattr(scheduler, "base_lrs"):
                scheduler.base_lrs = [lr * self.factor for lr in scheduler.base_lrs]
        for optimizer in trainer.optimizers:
            for group in optimizer.param_groups:
                group["lr"] *= self.factor
        rank_zero_info(
            f"{self.monitor} {value:.4f} is no better than its best {self.best:.4f}: learning rates x "
            f"{self.factor:g} ({self.decays} decay{'s' if self.decays > 1 else ''} so far)"
        )

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "decays": self.decays}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.best = float(state_dict["best"])
        self.decays = int(state_dict["decays"])
