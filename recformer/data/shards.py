"""Which rows each (rank, worker) reads, computed from Parquet footers alone.

The unit of storage is a row group; the unit of assignment is a row range. Per epoch the row
groups are put in a (seeded) order and concatenated into one global row space of ``N`` rows.

- Training: every rank gets ``R = ceil(N / W)`` consecutive positions of that space (the last ranks
  wrap around to the start, as DistributedSampler pads), so every rank has exactly the same number
  of batches *by construction* and DDP never hangs on uneven files (DESIGN section 7).
- Evaluation: ranks split ``N`` exactly (sizes differ by at most one row) so every row is seen once.

Inside a rank, the rank's batches are split into contiguous blocks, one per DataLoader worker; the
DataLoader's in-order round robin interleaves them deterministically, which makes the position of
every batch computable (exact mid-epoch resume).
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from recformer.batch import DataError
from recformer.data import storage

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RowGroup:
    file: int
    """Index into ``SplitIndex.files``."""
    index: int
    """Row group index in that file."""
    rows: int


@dataclass(frozen=True)
class Piece:
    """Rows ``[start, stop)`` of one row group."""

    group: RowGroup
    start: int
    stop: int


@dataclass
class SplitIndex:
    """Files and row groups of one split, read from the footers."""

    name: str
    files: list[str]
    groups: list[RowGroup]

    @property
    def num_rows(self) -> int:
        return sum(g.rows for g in self.groups)

    @functools.cached_property
    def first_rows(self) -> dict[RowGroup, int]:
        """Each row group's first row in the split's order (files sorted, row groups in order)."""
        starts = np.cumsum([0] + [g.rows for g in self.groups])
        return dict(zip(self.groups, starts.tolist()))

    @classmethod
    def from_paths(cls, name: str, paths: list[str | Path]) -> SplitIndex:
        files, groups = [], []
        for p in sorted(str(p) for p in paths):
            meta = read_footer(p)
            fi = len(files)
            files.append(p)
            groups += [RowGroup(fi, i, meta.row_group(i).num_rows) for i in range(meta.num_row_groups)]
        groups = [g for g in groups if g.rows > 0]
        index = cls(name, files, groups)
        if index.num_rows == 0:
            raise DataError(
                f"{name} split: the files {files or '(none)'} hold no rows; expected a non-empty dataset"
            )
        return index


def read_footer(path: str) -> pq.FileMetaData:  # a local path or a URI
    """The footer of ``path``, or an error saying the file is truncated or not Parquet."""
    try:
        return storage.open_parquet(path).metadata
    except storage.StorageError:
        raise
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError) as e:
        raise DataError(f"{path}: not a readable Parquet file (truncated or corrupt?): {e}") from None


def _hidden(parts: Sequence[str]) -> bool:
    """Hidden or bookkeeping (``.crc``, ``_SUCCESS``, ``_temporary/``) as Spark and Arrow datasets
    write them: a name (of a path's parts below the split folder) starting with ``.`` or ``_``."""
    return any(part.startswith((".", "_")) for part in parts)


def _split_dir_files(d: Path) -> list[Path]:
    """Every visible file under ``d``, at any depth (partitioned logs: ``d/date=.../part.parquet``)."""
    if not d.is_dir():
        return []
    return sorted(p for p in d.rglob("*") if p.is_file() and not _hidden(p.relative_to(d).parts))


def _scan_split(root: Path | str, split: str) -> tuple[list, list]:
    """(Parquet files, other visible files) of ``root/split`` at any depth, sorted by path; the
    files fall back to ``root/split.parquet`` when the folder holds none. For a URI root
    (``storage``), the same rules over URIs (strings)."""
    if storage.is_uri(root):
        d = str(storage.join(root, split))
        visible = [f for f in storage.list_files(d) if not _hidden(f[len(d) + 1 :].split("/"))]
        files = [f for f in visible if f.endswith(".parquet")]
        single = str(storage.join(root, f"{split}.parquet"))
        if not files and storage.is_file(single):
            files = [single]
        return files, [f for f in visible if not f.endswith(".parquet")]
    root = Path(root)
    visible = _split_dir_files(root / split)
    files = [p for p in visible if p.suffix == ".parquet"]
    if not files and (root / f"{split}.parquet").is_file():
        files = [root / f"{split}.parquet"]
    return files, [p for p in visible if p.suffix != ".parquet"]


def find_split_files(root: str | Path, split: str) -> list[Path]:
    """``root/split/**/*.parquet`` (or ``root/split.parquet``), sorted by path; [] if there are none."""
    return _scan_split(root, split)[0]


OWN_PARTS = "part-*.parquet"
"""The files the data commands write in each split folder, and the only ones they remove (a
previous run's, which would otherwise be read as data)."""


def refuse_foreign_parquet(root: Path, splits: Sequence[str], written: Collection[str]) -> None:
    """Before a data command writes under ``root``: stop, naming them, if the loader would read
    Parquet files of ``splits`` there that the command does not write: any in a split folder
    besides its own top-level ``part-*.parquet`` (``train/date=1/x.parquet``, at any depth), and
    the ``root/<split>.parquet`` the loader falls back to for a split the command writes no rows of
    (``written`` are the splits it writes rows to). Changes nothing."""
    foreign = []
    for name in splits:
        own = set((root / name).glob(OWN_PARTS))
        foreign += [f for f in _split_dir_files(root / name) if f.suffix == ".parquet" and f not in own]
        single = root / f"{name}.parquet"
        foreign += [single] if name not in written and single.is_file() else []
    if foreign:
        listed = [str(f) for f in foreign[:10]] + (
            [f"... and {len(foreign) - 10} more"] if len(foreign) > 10 else []
        )
        raise ValueError(
            f"--out {root}: {len(foreign)} Parquet file(s) there that this command does not write "
            f"would be read with the new rows as data: {listed}; remove them or use an empty --out"
        )


def remove_own_parts(root: Path, splits: Sequence[str]) -> None:
    """Remove the split folders' own ``part-*.parquet`` of an earlier run (more files than this
    run writes, or a split it now writes no rows of, would be read as data); only those."""
    for name in splits:
        for stale in sorted((root / name).glob(OWN_PARTS)):
            stale.unlink()


def list_split_files(root: str | Path, split: str) -> list[Path]:
    """``find_split_files``, or an error naming where the files were expected. Other visible files
    in the split's folder are named in a warning, not read."""
    files, others = _scan_split(root, split)
    d = storage.join(root, split)
    if not files:
        raise DataError(f"{split} split: no Parquet files under {d} (expected {d}/*.parquet)")
    if others:
        names = [str(p)[len(str(d)) + 1 :] for p in others]
        log.warning(
            "%s split: %d file(s) under %s are not *.parquet and are not read: %s",
            split,
            len(names),
            d,
            names[:10] + (["..."] if len(names) > 10 else []),
        )
    return files


def epoch_order(index: SplitIndex, seed: int, epoch: int, shuffle: bool) -> list[RowGroup]:
    if not shuffle:
        return list(index.groups)
    rng = np.random.default_rng([seed, epoch, 0x5EED])
    return [index.groups[i] for i in rng.permutation(len(index.groups))]


def rank_range(n_rows: int, rank: int, world: int, pad: bool) -> tuple[int, int]:
    """Global positions ``[start, stop)`` of ``rank``; with ``pad`` they may run past ``n_rows``
    (wrap around) so that every rank has ``ceil(n_rows / world)`` positions."""
    if pad:
        per = math.ceil(n_rows / world)
        return rank * per, (rank + 1) * per
    return rank * n_rows // world, (rank + 1) * n_rows // world


def num_batches(rows: int, batch_size: int, drop_last: bool) -> int:
    return rows // batch_size if drop_last else math.ceil(rows / batch_size)


def worker_batches(n_batches: int, worker: int, n_workers: int) -> tuple[int, int]:
    """Contiguous block ``[first, stop)`` of the rank's batch indices read by ``worker``."""
    return worker * n_batches // n_workers, (worker + 1) * n_batches // n_workers


def pieces_for(order: list[RowGroup], start: int, stop: int) -> list[Piece]:
    """Row-group pieces covering global positions ``[start, stop)``, wrapping past the end."""
    sizes = np.array([g.rows for g in order], dtype=np.int64)
    ends = np.cumsum(sizes)
    out: list[Piece] = []
    pos = start
    while pos < stop:
        p = pos % int(ends[-1])
        i = int(np.searchsorted(ends, p, side="right"))
        lo = p - int(ends[i] - sizes[i])
        hi = min(int(sizes[i]), lo + (stop - pos))
        out.append(Piece(order[i], lo, hi))
        pos += hi - lo
    return out


def round_robin_resume(counts: list[int], consumed: int) -> tuple[list[int], list[int]]:
    """Replay the DataLoader's in-order round robin (which skips exhausted workers) over workers
    with ``counts`` batches each, for ``consumed`` batches. Returns the batches each worker had
    delivered and the order in which the workers that still have batches would deliver next."""
    n = len(counts)
    if consumed > sum(counts):
        raise ValueError(f"cannot skip {consumed} batches: the epoch has only {sum(counts)}")
    taken = [0] * n
    w = 0
    for _ in range(consumed):
        while taken[w] >= counts[w]:
            w = (w + 1) % n
        taken[w] += 1
        w = (w + 1) % n
    order = [(w + k) % n for k in range(n) if taken[(w + k) % n] < counts[(w + k) % n]]
    return taken, order
