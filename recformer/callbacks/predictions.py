"""Writes ``predict`` scores with their sample keys to Parquet, streaming (bounded memory: the CLI
runs predict with ``return_predictions=False``).

Where: ``output`` if given (``recformer predict --output FILE``), else
``predictions-<split>-<checkpoint name>.parquet`` in the run folder of the checkpoint it scores
(``recformer predict`` runs with the checkpoint's run folder as its root and no loggers, so
scoring makes no run of its own). An existing file is never replaced without ``overwrite``;
that is checked before the first batch, for every rank's file.

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
from lightning.pytorch.utilities import rank_zero_info

from recformer.data.schema import CHECKSUMS

log = logging.getLogger(__name__)


def rank_file(base: Path, rank: int, world: int) -> Path:
    """Rank ``rank``'s file of ``base`` under DDP (``<stem>-rank<r><suffix>``); ``base`` alone."""
    return base if world == 1 else base.with_name(f"{base.stem}-rank{rank}{base.suffix}")


class ParquetPredictionWriter(BasePredictionWriter):
    def __init__(self, output: str | None = None, overwrite: bool = False):
        """
        Args:
            output: Parquet file for the scores; default ``predictions-<split>-<checkpoint
                name>.parquet`` in the scored checkpoint's run folder. Under DDP each rank writes
                ``<stem>-rank<r>.parquet`` beside it.
            overwrite: Replace an existing file (otherwise predict stops before it starts).
        """
        super().__init__(write_interval="batch")
        self.output = output
        self.overwrite = overwrite
        self._writer: pq.ParquetWriter | None = None
        self._rows = 0
        self.path: Path | None = None
        """The final file (``<file>.partial`` until predict has finished)."""
        self.checkpoint: str | None = None
        """The checkpoint predict scores (set by the CLI: Lightning restores it only after setup)."""
        self.wrote, self.world = False, 1

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage != "predict":
            return
        log_dir = trainer.log_dir  # broadcasts under DDP: every rank asks, even one with no batches
        name = default_name(trainer, self.checkpoint or trainer.ckpt_path)
        base = Path(self.output) if self.output else Path(log_dir or ".") / name
        world = trainer.world_size
        taken = [str(p) for p in (rank_file(base, r, world) for r in range(world)) if p.exists()]
        if taken and not self.overwrite:  # every rank sees every rank's file: all stop, or none
            raise ValueError(
                f"predictions file {', '.join(taken)} exists; predict would replace it. Name another "
                "with --output, or pass --overwrite"
            )
        self.path = rank_file(base, trainer.global_rank, world)

    def _partial(self) -> Path:
        assert self.path is not None
        return self.path.with_name(self.path.name + ".partial")

    def write_on_batch_end(
        self, trainer, pl_module, prediction, batch_indices, batch, batch_idx, dataloader_idx
    ):
        keys = prediction["keys"].cpu().numpy()
        dm = trainer.datamodule
        unsigned = dm.unsigned_keys.get(dm.predict_split, frozenset())
        strings = dm.string_keys(dm.predict_split)
        cols = {}
        for j, n in enumerate(dm.spec.keys):
            if n in strings:  # a string key crossed as its row's position in the split
                cols[n] = strings[n].take(keys[:, j])
            else:  # uint64 keys crossed as their bits in int64: the same values back, not wrapped ones
                cols[n] = keys[:, j].view(np.uint64) if n in unsigned else keys[:, j]
        cols.update({k: prediction[k].float().cpu().numpy() for k in ("score", "logit", "label")})
        table = pa.table(cols)
        if self._writer is None:
            assert self.path is not None, "ParquetPredictionWriter.setup did not run for predict"
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._rows = 0
            self._writer = pq.ParquetWriter(self._partial(), table.schema, **CHECKSUMS)
        self._writer.write_table(table)
        self._rows += table.num_rows

    def on_predict_end(self, trainer, pl_module) -> None:
        self.wrote = self._writer is not None
        if self.wrote:
            self._writer.close()
            self._writer = None
            self._partial().replace(self.path)  # complete: the final name, atomically
        self.world = trainer.world_size

    def say_where(self) -> None:
        """Where the scores went, as evaluate says where its report went (rank 0, for every rank).
        The CLI calls it once predict has returned, below the closed progress bar."""
        if self.path is None:
            return
        if not self.wrote:
            said = f"predict scored no rows: {self.path} not written"
        elif self.world > 1:
            said = (
                f"wrote {self._rows} prediction rows to {self.path} (each other rank: its own file beside it)"
            )
        else:
            said = f"wrote {self._rows} prediction rows to {self.path}"
        rank_zero_info(said)

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


def default_name(trainer: Any, ckpt: str | None) -> str:
    """``predictions-<split>[-<checkpoint name>].parquet``."""
    split = trainer.datamodule.predict_split
    return f"predictions-{split}" + (f"-{Path(ckpt).stem}" if ckpt else "") + ".parquet"
