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
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

log = logging.getLogger(__name__)


class RestoreBest(Callback):
    """At fit end, the module's weights become those of the best monitored checkpoint (if any)."""

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        monitored = [c for c in trainer.checkpoint_callbacks if isinstance(c, ModelCheckpoint) and c.monitor]
        if not monitored or not monitored[0].best_model_path:
            return
        best = monitored[0]
        # Global rank 0 wrote the file and reads it; the other ranks receive the weights from it, so
        # nodes without a shared file system (or another working directory) end the same way.
        loaded = None
        if trainer.is_global_zero:
            try:
                state = torch.load(best.best_model_path, map_location=pl_module.device, weights_only=True)
                pl_module.load_state_dict(state["state_dict"])
                loaded = best.best_model_path
            except (OSError, RuntimeError, KeyError) as e:
                log.warning("could not restore the best weights from %s: %s", best.best_model_path, e)
        if trainer.world_size > 1:
            loaded = trainer.strategy.broadcast(loaded, src=0)
            if loaded is not None:
                _broadcast_weights(pl_module)
        if loaded is None:
            return
        score = float(best.best_model_score) if best.best_model_score is not None else float("nan")
        if trainer.is_global_zero:
            log.info("restored the best weights by %s (%.4f): %s", best.monitor, score, loaded)


def _broadcast_weights(module: torch.nn.Module) -> None:
    """Every floating-point tensor of ``module``'s state from global rank 0 to the other ranks."""
    import torch.distributed as dist

    with torch.no_grad():
        for t in module.state_dict().values():
            if t.is_floating_point():
                dist.broadcast(t, src=0)
