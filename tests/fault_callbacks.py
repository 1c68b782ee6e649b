"""Callbacks that inject faults into a real ``recformer fit`` (named by class path on the command
line of the fault suite, ``tests/test_faults.py``)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import lightning.pytorch as pl


class SignalAt(pl.Callback):
    """Sends ``signal`` to this process when optimizer step ``step`` is done, on rank ``rank``."""

    def __init__(self, step: int, signal: str = "SIGKILL", rank: int = 0):
        self.step, self.signal, self.rank = step, signal, rank

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step and trainer.global_rank == self.rank:
            os.kill(os.getpid(), getattr(signal, self.signal))


class HugeWeightsAt(pl.Callback):
    """Gives two rows of the batch of step ``step`` on rank ``rank`` a finite but huge sample
    weight: the loss is inf / inf = NaN while every gradient is w / inf = 0."""

    def __init__(self, step: int, rank: int = 0):
        self.step, self.rank = step, rank

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.step and trainer.global_rank == self.rank:
            batch.weight[:2] = 3.0e38


class HugeWeightsFrom(pl.Callback):
    """``HugeWeightsAt`` at every step from ``step`` on: every loss is NaN, so the module skips each
    step until ``optim.max_nonfinite_steps`` in a row stop the run as diverged."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step >= self.step:
            batch.weight[:2] = 3.0e38


class RecordRows(pl.Callback):
    """Writes the ``row_id`` key of every training row this rank takes, a line per batch, into
    ``<out>/rank<global rank>-epoch<epoch>.txt`` (multi-node sharding checks)."""

    def __init__(self, out: str):
        self.out = out

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        path = Path(self.out) / f"rank{trainer.global_rank}-epoch{trainer.current_epoch}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as f:
            f.write(" ".join(str(int(k)) for k in batch.keys[:, 0].tolist()) + "\n")


class KillProcessAt(pl.Callback):
    """SIGKILLs process ``pid`` (a server the run reads from) when optimizer step ``step`` is done."""

    def __init__(self, step: int, pid: int):
        self.step, self.pid = step, pid

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step and trainer.global_rank == 0:
            os.kill(self.pid, signal.SIGKILL)


class FillDiskAt(pl.Callback):
    """Fills the file system of ``path`` (a file it writes there) when optimizer step ``step`` is
    done: every write after it meets a full disk."""

    def __init__(self, step: int, path: str):
        self.step, self.path = step, path

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step and trainer.global_rank == 0:
            with open(self.path, "wb") as f:
                try:
                    while True:
                        f.write(b"\0" * 65536)
                        f.flush()
                except OSError:
                    pass


class HoldAt(pl.Callback):
    """At optimizer step ``step`` writes its pid to ``path`` and waits to be killed, the first time
    only (while ``path`` does not exist): the same command run again goes past that step. A kill
    lands at a known step, however fast the machine."""

    def __init__(self, step: int, path: str):
        self.step, self.path = step, path

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step and trainer.global_rank == 0 and not Path(self.path).exists():
            Path(self.path).write_text(str(os.getpid()))
            while True:
                time.sleep(1)
