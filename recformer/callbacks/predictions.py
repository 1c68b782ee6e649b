"""Writes ``predict`` scores with their sample keys to Parquet, streaming (bounded memory)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from lightning.pytorch.callbacks import BasePredictionWriter


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
        self.path: Path | None = None

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
        self._writer = pq.ParquetWriter(base, schema)

    def write_on_batch_end(
        self, trainer, pl_module, prediction, batch_indices, batch, batch_idx, dataloader_idx
    ):
        keys = prediction["keys"].cpu().numpy()
        names = trainer.datamodule.spec.keys if trainer.datamodule is not None else []
        cols = {name: keys[:, j] for j, name in enumerate(names)}
        cols.update({k: prediction[k].float().cpu().numpy() for k in ("score", "logit", "label")})
        table = pa.table(cols)
        if self._writer is None:
            self._open(trainer, table.schema)
        self._writer.write_table(table)

    def on_predict_end(self, trainer, pl_module) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
