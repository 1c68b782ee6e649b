"""Lightning's ``LearningRateMonitor`` for runs that may have no logger.

Lightning's stops a run without loggers (``--trainer.logger false``) at its start with an error;
``configs/trainer.yaml`` lists it for every run, so that setting could not train at all. A run
without loggers has nowhere to log learning rates: this one stays off there instead.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.callbacks import LearningRateMonitor as _LightningLearningRateMonitor


class LearningRateMonitor(_LightningLearningRateMonitor):
    _off = False

    def on_train_start(self, trainer: Any, *args: Any, **kwargs: Any) -> None:
        self._off = not trainer.loggers
        if not self._off:
            super().on_train_start(trainer, *args, **kwargs)

    def on_train_batch_start(self, trainer: Any, *args: Any, **kwargs: Any) -> None:
        if not self._off:
            super().on_train_batch_start(trainer, *args, **kwargs)

    def on_train_epoch_start(self, trainer: Any, *args: Any, **kwargs: Any) -> None:
        if not self._off:
            super().on_train_epoch_start(trainer, *args, **kwargs)
