"""``StreamingEvaluator``: every offline metric over data of any size in bounded memory, for
``recformer evaluate``. Exact while the rows fit in memory (the functions of ``exact.py`` on them);
beyond that it spills rows to hash-partitioned Parquet files by group, so GAUC stays exact, and
falls back to logit histograms for AUC and the calibration table.
"""

from __future__ import annotations

import math
import shutil
import tempfile
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from recformer.metrics.exact import (
    DEFAULT_LOGIT_RANGE,
    _auc_or_nan,
    _bce,
    _calibration_rows,
    _check_arrays,
    _check_bins,
    _entropy,
    _equal_weight_bins,
    _gauc_sums,
    _GaucSums,
    _group_codes,
    _histogram_auc,
    _sigmoid,
    calibration_table,
    delong_ci,
)


@dataclass
class EvalResult:
    """What ``StreamingEvaluator.compute`` reports. Undefined metrics (one label class, no usable
    group) are NaN rather than errors, so a report is always written."""

    rows: int
    """Rows seen."""
    weight_sum: float
    """Sum of sample weights."""
    base_rate: float
    """Weighted mean label."""
    auc: float
    """Exact AUC when ``auc_exact``, else the binned AUC."""
    auc_exact: bool
    """Whether every row fitted in memory, so ``auc`` (and the CI) are exact."""
    auc_binned: float
    """Binned AUC from the logit histogram (always computed; a check on the exact one)."""
    auc_lo: float
    """Lower end of the DeLong interval (NaN when not exact, weighted or soft labels)."""
    auc_hi: float
    """Upper end of the DeLong interval."""
    auc_se: float
    """DeLong standard error of the AUC."""
    gauc: float
    """Impression-weighted group AUC (NaN without groups)."""
    gauc_groups: int
    """Groups holding both labels, i.e. those GAUC averages over."""
    gauc_groups_excluded: int
    """Groups holding one label class only: GAUC leaves them out."""
    gauc_excluded_share: float
    """Their share of the weight (of the rows, unweighted); NaN without groups."""
    logloss: float
    """Weighted mean binary cross-entropy (nats)."""
    ne: float
    """Normalized entropy: logloss / entropy(base_rate)."""
    calibration: float
    """Mean predicted probability / mean label."""
    calibration_table_exact: bool
    """Whether the calibration table cuts its equal-weight bins at exact rows (else at
    histogram-bin edges)."""
    calibration_table: list[dict[str, float]] = field(default_factory=list)
    """Per-bin mean predicted vs observed (see ``calibration_table``)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX = np.uint64(0xBF58476D1CE4E5B9)


def _partition_of(groups: np.ndarray, n_parts: int, seed: int) -> np.ndarray:
    """Hash partition of each group key (splitmix64 finaliser); every row of a group lands in the
    same partition, so per-group AUC is exact within a partition. ``seed`` re-splits a partition."""
    if groups.dtype.kind in "iub":
        h = groups.astype(np.int64).view(np.uint64)
    else:  # strings: crc32 of each distinct value, then the same mixing
        uniq, inv = np.unique(groups, return_inverse=True)
        h = np.array([zlib.crc32(str(u).encode()) for u in uniq], dtype=np.uint64)[inv.reshape(-1)]
    with np.errstate(over="ignore"):
        h = (h + np.uint64(seed + 1) * _GOLDEN) * _MIX
        h ^= h >> np.uint64(31)
        h *= _MIX
        h ^= h >> np.uint64(29)
    return (h % np.uint64(n_parts)).astype(np.int64)


class StreamingEvaluator:
    """Accumulates (logit, label, weight, group) batches and computes every offline metric.

    Memory bound, by construction:

    - Always (constant memory): a float64 histogram of ``n_bins`` logit-scale bins (positives,
      negatives, predicted-probability sums) for the binned AUC and an approximate calibration
      table, and running sums for logloss, NE and calibration, which are exact at any size.
    - Up to ``max_rows_in_memory`` rows: the rows themselves (~32 bytes each), so AUC (with its
      DeLong interval), GAUC and the calibration table are exact. ``compute`` on them needs about
      five times that at its peak (concatenation, sorts, midranks: ~180 bytes a row in all, so
      the default 20M rows can take ~3.6 GB), and ``recformer evaluate --compare`` holds two
      models' scores besides.
    - Beyond that, rows are spilled to ``n_partitions`` temporary Parquet files partitioned by a
      hash of the group key, and the buffer is flushed whenever it refills, so memory stays at
      ``max_rows_in_memory`` rows. AUC falls back to the binned one (``auc_exact=False``). GAUC stays
      exact: each partition holds whole groups and is read on its own; a partition larger than
      ``max_rows_in_memory`` is re-split with a new hash seed. The one case that cannot be bounded
      is a single group with more rows than ``max_rows_in_memory``; it is then read whole.

    Use as a context manager (or call ``close``) so the spill directory is removed.
    """

    def __init__(
        self,
        *,
        max_rows_in_memory: int = 20_000_000,
        n_bins: int = 1 << 16,
        logit_range: float = DEFAULT_LOGIT_RANGE,
        n_partitions: int = 64,
        calibration_bins: int = 10,
        ci_alpha: float = 0.95,
        spill_dir: str | Path | None = None,
    ) -> None:
        _check_bins(n_bins, logit_range)
        if max_rows_in_memory < 1:
            raise ValueError(f"max_rows_in_memory={max_rows_in_memory} must be >= 1")
        if n_partitions < 2:
            raise ValueError(f"n_partitions={n_partitions} must be >= 2")
        if calibration_bins < 1:
            raise ValueError(f"calibration_bins={calibration_bins} must be >= 1")
        self.max_rows_in_memory = max_rows_in_memory
        self.n_bins, self.logit_range = n_bins, float(logit_range)
        self.n_partitions, self.calibration_bins, self.ci_alpha = n_partitions, calibration_bins, ci_alpha
        self._spill_parent = spill_dir
        self._spill_dir: Path | None = None
        self._writers: dict[int, pq.ParquetWriter] = {}
        self._group_type: pa.DataType | None = None
        self.pos_hist = np.zeros(n_bins)
        self.neg_hist = np.zeros(n_bins)
        self.pred_hist = np.zeros(n_bins)  # sum of w * p per bin, for the calibration table
        self.rows_hist = np.zeros(n_bins, dtype=np.int64)
        self.loss_sum = 0.0
        self.rows = 0
        self.has_groups: bool | None = None
        self._buf: list[tuple[np.ndarray, ...]] = []
        self._buf_rows = 0
        self.spilled = False
        self._closed_spill = False  # set once compute() has closed the spill writers

    # -- accumulation ------------------------------------------------------------------------------
    def update(self, logits: Any, labels: Any, weights: Any = None, groups: Any = None) -> None:
        """Add one record batch. ``groups`` must be given on every batch or on none."""
        batch = f"batch starting at row {self.rows}"
        if self._closed_spill:
            raise RuntimeError(
                "StreamingEvaluator.update after compute() on spilled data; use a new evaluator"
            )
        try:
            x, y, w = _check_arrays(logits, labels, weights, what="logits")
        except ValueError as e:
            raise ValueError(f"StreamingEvaluator.update ({batch}): {e}") from None
        if self.has_groups is None:
            self.has_groups = groups is not None
        if self.has_groups != (groups is not None):
            raise ValueError(
                f"StreamingEvaluator.update ({batch}): groups given on some batches but not others"
            )
        g = np.zeros(x.size, np.int64) if groups is None else np.asarray(groups).reshape(-1)
        if g.size != x.size:
            raise ValueError(
                f"StreamingEvaluator.update ({batch}): groups has {g.size} values, logits {x.size}"
            )
        if g.dtype.kind in "fc":
            raise ValueError(
                f"StreamingEvaluator.update ({batch}): groups must be integers or strings, found {g.dtype}"
            )
        r = self.logit_range
        b = np.floor((np.clip(x, -r, r) + r) * (self.n_bins / (2 * r))).astype(np.int64)
        b = np.minimum(b, self.n_bins - 1)
        p = _sigmoid(x)
        self.pos_hist += np.bincount(b, w * y, self.n_bins)
        self.neg_hist += np.bincount(b, w * (1 - y), self.n_bins)
        self.pred_hist += np.bincount(b, w * p, self.n_bins)
        self.rows_hist += np.bincount(b, minlength=self.n_bins)
        self.loss_sum += float((w * _bce(x, y)).sum())
        self.rows += x.size
        self._buf.append((g, x, y, w))
        self._buf_rows += x.size
        if self._buf_rows > self.max_rows_in_memory:
            self._flush()

    def _flush(self) -> None:
        """Move the buffered rows into the hash-partitioned spill files."""
        if not self._buf:
            return
        g, x, y, w = (np.concatenate(c) for c in zip(*self._buf))
        self._buf, self._buf_rows = [], 0
        if self._spill_dir is None:
            self._spill_dir = Path(tempfile.mkdtemp(prefix="recformer-eval-", dir=self._spill_parent))
        self.spilled = True
        self._write_partitions(g, x, y, w, self._spill_dir, seed=0, writers=self._writers)

    def _table(self, g: np.ndarray, x: np.ndarray, y: np.ndarray, w: np.ndarray) -> pa.Table:
        gcol = pa.array(g) if g.dtype.kind in "iub" else pa.array(g.astype(str), type=pa.string())
        if self._group_type is None:
            self._group_type = gcol.type
        if gcol.type != self._group_type:
            raise ValueError(
                f"StreamingEvaluator: groups changed type from {self._group_type} to {gcol.type} "
                "between batches; give every batch the same group column type"
            )
        return pa.table({"group": gcol, "score": x, "label": y, "weight": w})

    def _write_partitions(self, g, x, y, w, folder: Path, seed: int, writers: dict) -> None:
        part = _partition_of(g, self.n_partitions, seed)
        order = np.argsort(part, kind="stable")
        bounds = np.searchsorted(part[order], np.arange(self.n_partitions + 1))
        for k in range(self.n_partitions):
            idx = order[bounds[k] : bounds[k + 1]]
            if idx.size == 0:
                continue
            t = self._table(g[idx], x[idx], y[idx], w[idx])
            if k not in writers:
                writers[k] = pq.ParquetWriter(folder / f"part-{k:03d}.parquet", t.schema)
            writers[k].write_table(t)

    # -- results -----------------------------------------------------------------------------------
    def _spilled_gauc(self, files: list[Path], seed: int) -> _GaucSums:
        sums = _GaucSums()
        for f in files:
            meta = pq.ParquetFile(f)
            if meta.metadata.num_rows > self.max_rows_in_memory and seed < 4:
                sub = f.parent / f"{f.stem}-split"
                sub.mkdir(exist_ok=True)
                writers: dict[int, pq.ParquetWriter] = {}
                for rb in meta.iter_batches(batch_size=max(1, self.max_rows_in_memory // 2)):
                    cols = [
                        rb.column(c).to_numpy(zero_copy_only=False)
                        for c in ("group", "score", "label", "weight")
                    ]
                    self._write_partitions(*cols, folder=sub, seed=seed + 1, writers=writers)
                for wr in writers.values():
                    wr.close()
                parts = self._spilled_gauc(sorted(sub.glob("*.parquet")), seed + 1)
            else:
                t = pq.read_table(f)
                s = t.column("score").to_numpy()
                codes = _group_codes(t.column("group").to_numpy(zero_copy_only=False), s.size)
                parts = _gauc_sums(codes, s, t.column("label").to_numpy(), t.column("weight").to_numpy())
            sums = sums + parts
        return sums

    def _histogram_calibration_table(self) -> list[dict[str, float]]:
        """Equal-weight bins cut at histogram-bin edges (each histogram bin goes whole to one row)."""
        wt = self.pos_hist + self.neg_hist
        if wt.sum() <= 0:
            return []
        k = _equal_weight_bins(wt, self.calibration_bins)
        nb = self.calibration_bins
        edges = np.linspace(-self.logit_range, self.logit_range, self.n_bins + 1)
        occupied = self.rows_hist > 0
        lo = np.full(nb, np.nan)
        hi = np.full(nb, np.nan)
        for i in range(nb):  # calibration_bins rows, not a loop over data
            sel = np.flatnonzero(occupied & (k == i))
            if sel.size:
                lo[i], hi[i] = _sigmoid(edges[sel[0]]), _sigmoid(edges[sel[-1] + 1])
        return _calibration_rows(
            lo,
            hi,
            np.bincount(k, wt, nb),
            np.bincount(k, self.pred_hist, nb),
            np.bincount(k, self.pos_hist, nb),
            np.bincount(k, self.rows_hist, nb),
        )

    def compute(self) -> EvalResult:
        if self.rows == 0:
            raise ValueError("StreamingEvaluator.compute: no rows were added")
        wsum = float(self.pos_hist.sum() + self.neg_hist.sum())
        ysum = float(self.pos_hist.sum())
        base = ysum / wsum if wsum > 0 else math.nan
        ll = self.loss_sum / wsum if wsum > 0 else math.nan
        h = _entropy(base) if wsum > 0 else 0.0
        with np.errstate(invalid="ignore", divide="ignore"):
            auc_binned = float(_histogram_auc(self.pos_hist, self.neg_hist))
        auc, lo, hi, se = auc_binned, math.nan, math.nan, math.nan
        gs = _GaucSums()
        cal_table = None
        if not self.spilled:
            g, x, y, w = (np.concatenate(c) for c in zip(*self._buf))
            auc = _auc_or_nan(x, y, w)
            unweighted_binary = bool((w == 1).all() and np.isin(y, (0.0, 1.0)).all())
            if unweighted_binary and (y == 1).sum() >= 2 and (y == 0).sum() >= 2:
                auc, lo, hi, se = delong_ci(x, y, self.ci_alpha)
            if self.has_groups:
                gs = _gauc_sums(_group_codes(g, x.size), x, y, w)
            if x.size >= self.calibration_bins:
                cal_table = calibration_table(x, y, self.calibration_bins, w)
        else:
            self._flush()
            for wr in self._writers.values():
                wr.close()
            self._writers = {}
            self._closed_spill = True
            if self.has_groups:
                assert self._spill_dir is not None
                gs = self._spilled_gauc(sorted(self._spill_dir.glob("part-*.parquet")), seed=0)
        return EvalResult(
            rows=self.rows,
            weight_sum=wsum,
            base_rate=base,
            auc=auc,
            auc_exact=not self.spilled,
            auc_binned=auc_binned,
            auc_lo=lo,
            auc_hi=hi,
            auc_se=se,
            gauc=gs.gauc,
            gauc_groups=gs.used,
            gauc_groups_excluded=gs.excluded,
            gauc_excluded_share=gs.excluded_share,
            logloss=ll,
            ne=ll / h if h > 0 else math.nan,
            calibration=float(self.pred_hist.sum() / ysum) if ysum > 0 else math.nan,
            calibration_table_exact=cal_table is not None,
            calibration_table=cal_table if cal_table is not None else self._histogram_calibration_table(),
        )

    def close(self) -> None:
        for wr in self._writers.values():
            wr.close()
        self._writers = {}
        if self._spill_dir is not None:
            shutil.rmtree(self._spill_dir, ignore_errors=True)
            self._spill_dir = None

    def __enter__(self) -> StreamingEvaluator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
