"""Pre-emption: a fit stopped by SIGTERM saves its state, says so, and exits non-zero.

Cluster schedulers send SIGTERM before they kill a job (pre-emption, the time limit). Lightning's
loops raise ``SIGTERMException`` at a batch boundary once ``trainer.received_sigterm`` is set: a
``SystemExit`` with no code, so the process would exit 0 and ``fit && evaluate`` would carry on with
a half-trained model. This callback:

- replaces Lightning's SIGTERM handler, which broadcasts from inside the handler: a signal that
  lands while its rank is inside another collective (Lightning's own per-step broadcast) starts a
  second one no other rank joins, and every rank waits for good (seen on 2 gloo ranks);
  the handler here only records the signal;
- lets the ranks agree on the step to stop at: every optimizer step each rank contributes its flag
  to an asynchronous MAX all-reduce over a gloo group (CPU tensors: no GPU sync), issued at one
  step and read at the next, so every rank reads the same answer at the same step, whichever
  ranks got the signal, and the latency hides behind a step;
- at that step sets Lightning's flag on every rank, and when the loops raise, saves the state to
  ``<checkpoint dir>/last.ckpt`` (the file that always holds the latest state; the DataModule's
  stream position in it resumes mid-epoch exactly) and records where on the exception;
  ``recformer.__main__`` prints one line and exits with 143 (128 + SIGTERM), the status a
  scheduler expects of a terminated job.
"""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
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
        self._signalled = False
        self._group: Any = None
        self._flag: torch.Tensor | None = None
        self._work: Any = None
        self._last_step = -1

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        self._signalled = True  # nothing else: a handler can run in the middle of a collective

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._signalled, self._work, self._last_step = False, None, trainer.global_step
        if threading.current_thread() is threading.main_thread():  # where Lightning installs its own
            signal.signal(signal.SIGTERM, self._on_sigterm)  # Lightning restores the original at teardown
        if trainer.world_size > 1 and dist.is_available() and dist.is_initialized():
            self._group = dist.new_group(backend="gloo")  # every rank, at the same point

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if trainer.global_step == self._last_step:  # between micro-batches of one optimizer step
            return
        self._last_step = trainer.global_step
        if self._agreed_to_stop():
            # Lightning's loops raise SIGTERMException at the end of this batch, on every rank alike.
            trainer._signal_connector.received_sigterm = True

    def _agreed_to_stop(self) -> bool:
        if self._group is None:
            return self._signalled
        stop = False
        if self._work is not None:
            self._work.wait()  # issued a step ago: done by now, on every rank
            stop = bool(self._flag.item())  # a CPU tensor: no device sync
            self._work = None
        if not stop:
            self._flag = torch.tensor([int(self._signalled)], dtype=torch.int32)
            self._work = dist.all_reduce(self._flag, op=dist.ReduceOp.MAX, group=self._group, async_op=True)
        return stop

    def _drain(self) -> None:
        """Wait for the last all-reduce: every rank issued it, so it completes."""
        if self._work is not None:
            self._work.wait()
            self._work = None

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._drain()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        if not isinstance(exception, SIGTERMException) or trainer.state.fn != "fit":
            return
        self._drain()
        path = checkpoint_folder(trainer) / self.filename
        trainer.save_checkpoint(path, weights_only=False)  # every rank calls it (a barrier inside)
        exception.checkpoint = path  # type: ignore[attr-defined]  # for the one line __main__ prints
        exception.step = trainer.global_step  # type: ignore[attr-defined]
