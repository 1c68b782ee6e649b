"""Writes ``predict`` scores with their sample keys to Parquet, streaming (bounded memory: the CLI
runs predict with ``return_predictions=False``).

Rows go to ``<file>.partial`` while predict runs; the file gets its final name only when predict
has finished, so a file under the final name is always complete. If predict fails, the rows
written so far are closed into a readable ``.partial`` file and a warning names it."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from lightning.pytorch.callbacks import BasePredictionWriter

log = logging.getLogger(__name__)


class ParquetPredictionWriter(BasePredictionWriter):
    def __init__(self, output: str | None = None):
        """
        Args:
            output: Parquet file for the scores; default ``<log_dir>/predictions.parquet``. Under DDP
                each rank writes ``<stem>-rank<r>.parquet`` beside it.
        """
        super().__init__(write_interval="batch")
        self.output = output
        self._writer: pq.ParquetWriter | None = None
        self._log_dir: str | None = None
        self._rows = 0
        self.path: Path | None = None
        """The final file (``<file>.partial`` until predict has finished)."""

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        # trainer.log_dir broadcasts under DDP: every rank asks here, even one with no batches.
        if stage == "predict":
            self._log_dir = trainer.log_dir

    def _open(self, trainer: Any, schema: pa.Schema) -> None:
        base = Path(self.output) if self.output else Path(self._log_dir or ".") / "predictions.parquet"
        if trainer.world_size > 1:
            base = base.with_name(f"{base.stem}-rank{trainer.global_rank}{base.suffix}")
        base.parent.mkdir(parents=True, exist_ok=True)
        self.path = base
        self._rows = 0
        self._writer = pq.ParquetWriter(self._partial(), schema)

    def _partial(self) -> Path:
        assert self.path is not None
        return self.path.with_name(self.path.name + ".partial")

    def write_on_batch_end(
        self, trainer, pl_module, prediction, batch_indices, batch, batch_idx, dataloader_idx
    ):
        keys = prediction["keys"].cpu().numpy()
        dm = trainer.datamodule
        names = dm.spec.keys if dm is not None else []
        unsigned = getattr(dm, "unsigned_keys", {}).get(getattr(dm, "predict_split", None), frozenset())
        # uint64 keys crossed as their bits in int64: the same values back, not wrapped ones.
        cols = {n: keys[:, j].view(np.uint64) if n in unsigned else keys[:, j] for j, n in enumerate(names)}
        cols.update({k: prediction[k].float().cpu().numpy() for k in ("score", "logit", "label")})
        table = pa.table(cols)
        if self._writer is None:
            self._open(trainer, table.schema)
        self._writer.write_table(table)
        self._rows += table.num_rows

    def on_predict_end(self, trainer, pl_module) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
            self._partial().replace(self.path)  # complete: the final name, atomically

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        if self._writer is not None:
            self._writer.close()  # a readable file of the rows so far, under the .partial name
            self._writer = None
            log.warning(
                "predict failed after %d row(s); they are in %s (the final name %s is not written)",
                self._rows,
                self._partial(),
                self.path,
            )
