"""The model a fit ends with is its best by validation: the monitored checkpoint's weights, reloaded.

Sparse-id rankers overfit within a few epochs (the "one-epoch phenomenon" of CTR models, Zhang et
al., CIKM 2022): the last weights are often worse than an earlier validation's. With
``EarlyStopping`` the run stops a few validations after its peak, and without this callback it
would still end holding the weights of its last step. ``RestoreBest`` loads the weights of the
checkpoint that ``ModelCheckpoint(monitor=...)`` judged best into the module at the end of the fit,
so what follows in the same process (``trainer.test``, ``trainer.predict``, a notebook's next cell)
scores the best model. ``last.ckpt`` is written before this runs and keeps the latest state, for
resume; the files on disk are not touched. Under DDP only global rank 0 reads the file, and sends
the weights to the others: a node need not see rank 0's checkpoint folder.

It also says how the fit ended, in one line after the progress bar: whether early stopping fired
and after which validation, and which validation's weights the model now holds (and from which
file). Validations are counted from the fit's start, a resumed one included (the count is kept in
the checkpoint).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from lightning.pytorch.callbacks import Callback, EarlyStopping, ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_info

log = logging.getLogger(__name__)


class RestoreBest(Callback):
    """At fit end, the module's weights become those of the best monitored checkpoint (if any)."""

    def __init__(self) -> None:
        self.validations: list[tuple[int, int]] = []
        """(epoch, global step) of each validation of the fit, in order."""

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        # Before ModelCheckpoint's own hook (Lightning runs checkpoint callbacks last), so a
        # checkpoint saved at this validation already counts it.
        if not trainer.sanity_checking and trainer.state.fn == "fit":
            self.validations.append((trainer.current_epoch, trainer.global_step))

    def state_dict(self) -> dict[str, Any]:
        return {"validations": [list(v) for v in self.validations]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.validations = [(int(e), int(s)) for e, s in state_dict.get("validations", [])]

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        monitored = [c for c in trainer.checkpoint_callbacks if isinstance(c, ModelCheckpoint) and c.monitor]
        if not monitored or not monitored[0].best_model_path:
            if trainer.is_global_zero and _stopped_early(trainer):
                rank_zero_info(f"{self._stop_said(trainer)}; no best checkpoint to restore")
            return
        best = monitored[0]
        # Global rank 0 wrote the file and reads it; the other ranks receive the weights from it, so
        # nodes without a shared file system (or another working directory) end the same way.
        loaded, step = None, None
        if trainer.is_global_zero:
            try:
                state = torch.load(best.best_model_path, map_location=pl_module.device, weights_only=True)
                pl_module.load_state_dict(state["state_dict"])
                loaded, step = best.best_model_path, state.get("global_step")
            except (OSError, RuntimeError, KeyError) as e:
                log.warning("could not restore the best weights from %s: %s", best.best_model_path, e)
        if trainer.world_size > 1:
            loaded = trainer.strategy.broadcast(loaded, src=0)
            if loaded is not None:
                _broadcast_weights(pl_module)
        if loaded is None or not trainer.is_global_zero:
            return
        score = float(best.best_model_score) if best.best_model_score is not None else float("nan")
        held = (
            f"the model holds the best weights by {best.monitor} ({score:.4f}): {self._which(step)}, {loaded}"
        )
        rank_zero_info(
            f"{self._stop_said(trainer)}; {held}" if _stopped_early(trainer) else held[0].upper() + held[1:]
        )

    def _which(self, step: int | None) -> str:
        """ "validation 3 (epoch 1, step 634)" for the validation at ``step``, or the step alone."""
        for n, (epoch, at) in enumerate(self.validations, 1):
            if at == step:
                return f"validation {n} (epoch {epoch}, step {at})"
        return f"step {step}"

    def _stop_said(self, trainer: Any) -> str:
        """ "Early stopping: val/auc did not improve in 4 validations; the fit stopped after
        validation 6 (epoch 2, step 951)"."""
        stop = next(c for c in trainer.callbacks if isinstance(c, EarlyStopping) and _fired(c))
        if stop.wait_count >= stop.patience:
            why = f"{stop.monitor} did not improve in {stop.wait_count} validations"
        else:  # a threshold or a non-finite value: Lightning's own sentence says which
            why = str(stop.stopping_reason_message or "its condition was met").rstrip(".")
            why = why.removesuffix(" Signaling Trainer to stop").rstrip(".")
        n, (epoch, step) = len(self.validations), (self.validations or [(trainer.current_epoch, 0)])[-1]
        return f"Early stopping: {why}; the fit stopped after validation {n} (epoch {epoch}, step {step})"


def _fired(cb: EarlyStopping) -> bool:
    return bool(getattr(cb, "stopping_reason_message", None))


def _stopped_early(trainer: Any) -> bool:
    return any(isinstance(c, EarlyStopping) and _fired(c) for c in trainer.callbacks)


def _broadcast_weights(module: torch.nn.Module) -> None:
    """Every floating-point tensor of ``module``'s state from global rank 0 to the other ranks."""
    import torch.distributed as dist

    with torch.no_grad():
        for t in module.state_dict().values():
            if t.is_floating_point():
                dist.broadcast(t, src=0)
