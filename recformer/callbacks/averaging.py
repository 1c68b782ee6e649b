"""Latest weight averaging: each validation scores the mean of the weights at the latest validations.

Sparse-id rankers peak within a few epochs while the learning rate is still near its top (a cosine
over a 20-epoch cap has decayed by a tenth at epoch 4), so the weights at one validation carry the
noise of the last few hundred steps. The uniform mean of the weights at the latest ``window``
validations (LAWA: Kaddour, "Stop Wasting My Time! Saving Days of ImageNet and BERT Training with
Latest Weight Averaging", 2022; Sanyal et al., "Early Weight Averaging meets High Learning Rates
for LLM Pre-training", 2023) averages that noise out at no training cost: training goes on from the
raw weights, only what is validated, kept and restored is the mean. An exponential moving average
over steps (Lightning's ``EMAWeightAveraging``, decay 0.99-0.995) lost within-user order here
(docs/levers.md); the mean over validations half an epoch apart is another window.

At each validation of a fit (not the sanity check) the callback records the weights, and while
there are at least two records it swaps their mean in for the validation; ``on_validation_end``
(before the checkpoint callbacks, which Lightning runs last) leaves the mean in place for the
checkpoints saved at that validation and swaps the raw weights back at the next training batch.
Every checkpoint the fit writes holds the mean as its ``state_dict`` (what ``recformer evaluate``,
export, serving and ``RestoreBest`` read) and the raw weights under ``RAW_KEY`` with the records
in the callback's state, so a resumed fit (``--ckpt_path``, the SIGTERM save) trains on from the raw
weights with the same window. Memory: ``window`` + 1 copies of the parameters.
"""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch.callbacks import Callback

RAW_KEY = "raw_state_dict"
"""Where a checkpoint keeps the training weights (its ``state_dict`` holds the validated mean)."""


class LatestWeightAverage(Callback):
    """Validate, keep and end with the mean of the weights at the latest ``window`` validations."""

    def __init__(self, window: int = 2) -> None:
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"LatestWeightAverage: window must be an integer >= 1 (1 = off), got {window!r}")
        self.window = window
        self.records: list[list[torch.Tensor]] = []
        """The parameters at the latest validations (oldest first), at most ``window``."""
        self._raw: list[torch.Tensor] | None = None
        """The training weights while the mean sits in the module (None: the module holds them)."""

    @staticmethod
    def _params(pl_module: Any) -> list[torch.Tensor]:
        return list(pl_module.parameters())

    def on_validation_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        if self.window == 1 or trainer.sanity_checking or trainer.state.fn != "fit":
            return
        self._restore(pl_module)  # a validation that follows another with no training batch between
        params = self._params(pl_module)
        with torch.no_grad():
            # Records read back from a checkpoint sit on the CPU: onto the parameters' device.
            old = [[t.to(p.device) for t, p in zip(r, params)] for r in self.records]
            self.records = [*old, [p.detach().clone() for p in params]][-self.window :]
            if len(self.records) < 2:
                return
            self._raw = [p.detach().clone() for p in params]
            for i, p in enumerate(params):
                p.copy_(torch.stack([r[i] for r in self.records]).mean(0))

    def _restore(self, pl_module: Any) -> None:
        """Put the training weights back in the module."""
        if self._raw is None:
            return
        with torch.no_grad():
            for p, raw in zip(self._params(pl_module), self._raw):
                p.copy_(raw)
        self._raw = None

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self._restore(pl_module)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        # The fit ends on the mean of its last validation; RestoreBest (on_fit_end) then loads the
        # best checkpoint, which holds the mean of its own validation.
        self._raw = None

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        """The module's ``state_dict`` already is what was validated (the mean while it is swapped
        in); the training weights go under ``RAW_KEY`` when they differ from it."""
        if self._raw is None:
            return
        names = [name for name, _ in pl_module.named_parameters()]
        raw = dict(checkpoint["state_dict"])
        raw.update(zip(names, self._raw))  # already private copies: nothing else writes them
        checkpoint[RAW_KEY] = raw

    def on_load_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        """A resumed fit trains on from the training weights, not the mean (the module was loaded
        from ``state_dict`` before this runs). Lightning calls this for ``validate``, ``test`` and
        ``predict`` with a ``ckpt_path`` too: those score the checkpoint's mean, as evaluate does."""
        if RAW_KEY in checkpoint and trainer.state.fn == "fit":
            pl_module.load_state_dict(checkpoint[RAW_KEY])

    def state_dict(self) -> dict[str, Any]:
        return {"window": self.window, "records": [[t.cpu() for t in r] for r in self.records]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if state_dict.get("window") != self.window:
            return  # another window: start averaging afresh rather than mix two definitions
        self.records = [list(r) for r in state_dict.get("records", [])]
