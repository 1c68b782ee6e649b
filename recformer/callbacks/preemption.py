"""Pre-emption: a fit stopped by SIGTERM saves its state, says so, and exits non-zero.

Cluster schedulers send SIGTERM before they kill a job (pre-emption, the time limit). Lightning's
signal handler sets a flag, every DDP rank learns it at the next step (Lightning broadcasts it), and
the loops raise ``SIGTERMException`` at that batch boundary: a ``SystemExit`` with no code, so the
process would exit 0 and ``fit && evaluate`` would carry on with a half-trained model. This callback
saves the state there to ``<checkpoint dir>/last.ckpt`` (the file that always holds the latest
state; the DataModule's stream position in it resumes mid-epoch exactly) and records where on the
exception; ``recformer.__main__`` prints one line and exits with 143 (128 + SIGTERM), the status a
scheduler expects of a terminated job.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.utilities.exceptions import SIGTERMException

log = logging.getLogger(__name__)

EXIT_SIGTERM = 143
"""Exit status of a fit stopped by SIGTERM (128 + signal 15)."""


def checkpoint_folder(trainer: Any) -> Path:
    """Where the run's checkpoints go: the ``last`` ModelCheckpoint's folder, else the first
    ModelCheckpoint's, else ``<log_dir>/checkpoints``."""
    checkpoints = [cb for cb in trainer.callbacks if isinstance(cb, ModelCheckpoint)]
    checkpoints.sort(key=lambda cb: cb.filename != "last")
    for cb in checkpoints:
        if cb.dirpath:
            return Path(cb.dirpath)
    return Path(trainer.log_dir or trainer.default_root_dir) / "checkpoints"


class SaveOnSigterm(Callback):
    def __init__(self, filename: str = "last.ckpt") -> None:
        """
        Args:
            filename: Checkpoint written in the run's checkpoint folder when SIGTERM stops a fit.
        """
        self.filename = filename

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        if not isinstance(exception, SIGTERMException) or trainer.state.fn != "fit":
            return
        path = checkpoint_folder(trainer) / self.filename
        trainer.save_checkpoint(path)  # every rank calls it (a barrier inside); rank 0 writes
        exception.checkpoint = path  # type: ignore[attr-defined]  # for the one line __main__ prints
        exception.step = trainer.global_step  # type: ignore[attr-defined]
