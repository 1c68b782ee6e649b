"""``ParquetStream``: an IterableDataset that yields whole ``Batch`` objects from Parquet shards.

Row assignment comes from ``shards`` (footers only). Each DataLoader worker reads a contiguous block
of its rank's batches in windows of ``window`` rows (a multiple of the batch size): a window is read
(row groups, sliced), decoded once, permuted with an RNG seeded by (seed, epoch, rank, worker,
window), and cut into batches. Because a window's permutation depends only on those numbers,
skipping ``s`` batches after a resume jumps straight to window ``s * B // window`` without reading
anything before it: the resumed stream is exactly the uninterrupted one.
"""

from __future__ import annotations

import ctypes
import errno
import sys
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from torch.utils.data import IterableDataset, get_worker_info

from recformer.batch import DataError
from recformer.config import FeatureSpec
from recformer.data import storage
from recformer.data.decode import Decoded, Decoder, Window
from recformer.data.schema import Where
from recformer.data.shards import (
    Piece,
    RowGroup,
    SplitIndex,
    epoch_order,
    num_batches,
    pieces_for,
    rank_range,
    round_robin_resume,
    worker_batches,
)

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
"""glibc's ``mallopt`` parameters (malloc.h)."""


def keep_freed_memory() -> None:
    """Let this process keep the memory it frees for its next row group instead of handing it back
    to the kernel; for loader workers, which free and allocate the same few MB per row group.

    Both allocators return memory eagerly by default: Arrow's mimalloc purges freed pages after
    10 ms (a worker that waits on a full slot does so every window), and glibc trims the top of the
    heap that numpy's decode arrays come from. The next row group then faults the same pages in
    again and the kernel clears each one (transparent huge pages: 2 MB at a time), a few percent of
    a worker's CPU (bench/bench_loader.py, "Design measurements"). Here Arrow allocates from its
    jemalloc pool with purging off, and glibc serves blocks under 32 MB from a heap it trims only
    past 1 GB. A worker's memory stays at its high-water mark, which it reaches in the first
    window anyway. Process-wide, so only for recformer's own worker processes."""
    try:
        pool = pa.jemalloc_memory_pool()
    except NotImplementedError:  # a pyarrow built without jemalloc keeps its default
        pool = None
    if pool is not None:
        pa.jemalloc_set_decay_ms(-1)
        pa.set_memory_pool(pool)
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL("libc.so.6")
        except OSError:  # not glibc (e.g. musl), which has no such knobs
            return
        libc.mallopt(_M_MMAP_THRESHOLD, 32 << 20)  # glibc's largest allowed value
        libc.mallopt(_M_TRIM_THRESHOLD, 1 << 30)


def open_file_cap() -> int:
    """How many Parquet files one process keeps open: an eighth of its open-file limit (128 under
    the usual 1024), so a split of thousands of part files reads without running out of file
    descriptors. Reopening a file its reader closed costs ~0.5 ms (the footer is parsed again), 2%
    of reading one of ``synth``'s row groups, and only happens past the cap."""
    try:
        import resource
    except ImportError:  # not POSIX
        return 64
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 4096
    return max(4, soft // 8)


@dataclass
class StreamPlan:
    """Everything that decides the batch sequence of one rank for one epoch."""

    epoch: int = 0
    rank: int = 0
    world: int = 1
    skip: int = 0
    """Batches of this epoch already consumed on this rank (resume)."""
    num_workers: int = 1
    """DataLoader workers the stream is split over (0 counts as 1)."""


def grouped_permutation(
    perm: np.ndarray,
    groups: np.ndarray,
    k: int,
    rng: np.random.Generator,
    position: np.ndarray | None = None,
) -> np.ndarray:
    """``perm`` (a permutation of window rows) reordered so that each group's rows come in chunks
    of up to ``k`` consecutive rows, the chunks in random order: a batch of B rows then holds about
    B / k groups with up to k rows each, the pairs a within-group loss learns from. On MovieLens
    train a 256-row batch holds about 174 same-user pairs with different labels shuffled row by row
    (a window spans a stretch of the time-ordered log, where few users are active), 548 with k = 8
    and 918 with k = 16. Which rows share a chunk follows ``perm``'s order, so it changes every
    epoch; every row stays exactly once.

    With ``position`` (each window row's place in the log), a chunk holds rows adjacent in the log
    instead: each group's rows in log order, cut into chunks of k at a random phase per group and
    epoch. In a log written as events come that is a user's k consecutive impressions, the rows
    GAUC orders on a temporal split, where the user's level hardly moves and the order is the
    items' own; rows far apart in time also differ by the user's drift, which a within-user loss
    would then learn as order."""
    g = groups[perm]
    # positions in perm, grouped; within a group in perm order, or in log order with ``position``
    by_group = np.argsort(g, kind="stable") if position is None else np.lexsort((position[perm], g))
    sg = g[by_group]
    new_group = np.r_[True, sg[1:] != sg[:-1]]
    starts = np.flatnonzero(new_group)
    rank = np.arange(len(sg)) - np.repeat(starts, np.diff(np.r_[starts, len(sg)]))
    if position is not None:  # a random phase per group, so chunk edges move between epochs
        rank = rank + np.repeat(rng.integers(0, k, len(starts)), np.diff(np.r_[starts, len(sg)]))
    chunk = rank // k
    chunk_id = np.cumsum(new_group | np.r_[True, chunk[1:] != chunk[:-1]]) - 1
    key = rng.random(int(chunk_id[-1]) + 1 if len(chunk_id) else 0)[chunk_id]
    return perm[by_group[np.lexsort((rank, key))]]


def log_positions(index: SplitIndex, pieces: list[Piece]) -> np.ndarray:
    """Each row of a window read from ``pieces``: its place in the split's log (files in the
    index's order, then row groups, then rows), int64."""
    first = {}  # (file, row group) -> the log position of its first row
    at = 0
    for g in index.groups:
        first[(g.file, g.index)] = at
        at += g.rows
    return np.concatenate(
        [first[(p.group.file, p.group.index)] + np.arange(p.start, p.stop) for p in pieces]
        or [np.zeros(0, np.int64)]
    ).astype(np.int64)


@dataclass
class ParquetStream(IterableDataset):
    index: SplitIndex
    spec: FeatureSpec
    batch_size: int
    train: bool
    """Training: pad ranks to equal size, shuffle if ``shuffle``; evaluation: exact partition."""
    shuffle: bool = True
    seed: int = 0
    window: int = 32768
    """Rows decoded and shuffled together (rounded up to a multiple of batch_size)."""
    drop_last: bool = False
    group_rows: int = 0
    """Shuffled training rows of one group (the spec's ``group``, e.g. the user) kept together in
    chunks of up to this many (``grouped_permutation``); 0: every row shuffled on its own."""
    group_order: Literal["shuffled", "log"] = "shuffled"
    """Which of a group's rows share a chunk: any (``shuffled``), or rows adjacent in the log
    (``log``: the files' order, row groups' order, rows' order)."""
    plan: StreamPlan = field(default_factory=StreamPlan)
    verify_checksums: bool = True
    """Verify the CRC-32 of every data page that has one (``schema.CHECKSUMS``)."""

    def __post_init__(self) -> None:
        super().__init__()
        if self.batch_size <= 0:
            raise ValueError(f"batch_size={self.batch_size} must be > 0")
        if self.group_rows < 0:
            raise ValueError(f"group_rows={self.group_rows} must be >= 0 (0 = rows shuffled on their own)")
        if self.group_order not in ("shuffled", "log"):
            raise ValueError(f"group_order={self.group_order!r}; expected 'shuffled' or 'log'")
        if self.group_rows and self.spec.group is None:
            raise ValueError(
                f"group_rows={self.group_rows} keeps a group's rows together, but the feature spec "
                "names no group column (spec.yaml: group: user_id)"
            )
        self.window = -(-max(self.window, self.batch_size) // self.batch_size) * self.batch_size
        self._decoder: Decoder | None = None
        self._files: OrderedDict[int, pq.ParquetFile] = OrderedDict()
        """Open files by index, least recently read first, at most ``open_file_cap()``."""
        self._cached: tuple[RowGroup, Decoded] | None = None
        self._warmed = False

    # -- sizes ---------------------------------------------------------------------------------
    def rank_rows(self) -> tuple[int, int]:
        return rank_range(self.index.num_rows, self.plan.rank, self.plan.world, pad=self.train)

    def __len__(self) -> int:
        """Batches this rank yields in a full epoch (identical on every rank when training)."""
        lo, hi = self.rank_rows()
        return num_batches(hi - lo, self.batch_size, self.drop_last and self.train)

    def worker_counts(self) -> list[int]:
        n, nw = len(self), max(1, self.plan.num_workers)
        return [b - a for a, b in (worker_batches(n, w, nw) for w in range(nw))]

    # -- iteration -----------------------------------------------------------------------------
    def __iter__(self):
        """This process's batches: all of them, or in a DataLoader worker that worker's, each as
        one PackedBatch to pickle through the pipe (``RecDataLoader`` pads it on arrival).
        Forked workers do not come here: ``ring.WorkerPool`` runs ``worker_batches``."""
        info = get_worker_info()
        wid, nw = (info.id, info.num_workers) if info else (0, 1)
        if nw != max(1, self.plan.num_workers):
            raise RuntimeError(
                f"ParquetStream planned for {self.plan.num_workers} workers but runs in {nw}; "
                "build the DataLoader through RecDataModule"
            )
        for data, idx in self.worker_batches(wid, nw):
            yield data.gather(idx, packed=info is not None)

    def worker_batches(self, wid: int, nw: int):
        """(window, row indices) of each batch worker ``wid`` of ``nw`` delivers, in order."""
        counts = self.worker_counts()
        taken, order = round_robin_resume(counts, self.plan.skip)
        # After a resume the DataLoader's round robin restarts at its worker 0; hand worker 0 the
        # logical block that would have delivered next, so the sequence continues unchanged.
        if wid >= len(order):
            return
        logical = order[wid]
        yield from self._iter_block(logical, nw, skip=taken[logical])

    @property
    def decoder(self) -> Decoder:
        """This process's decoder of the spec (made once; not pickled into workers)."""
        if self._decoder is None:
            self._decoder = Decoder(self.spec)
        return self._decoder

    def batch_bytes(self) -> int:
        """Bytes of the largest batch in transit this stream ships from a worker (``PackedBatch``)."""
        return self.decoder.layout.slot_bytes(self.batch_size)

    def _iter_block(self, logical: int, nw: int, skip: int):
        """(window, row indices) per batch of one logical worker block."""
        B = self.batch_size
        lo, hi = self.rank_rows()
        b0, b1 = worker_batches(len(self), logical, nw)
        start = lo + b0 * B
        stop = min(lo + b1 * B, hi)
        order = epoch_order(self.index, self.seed, self.plan.epoch, self.shuffle and self.train)
        n_rows = stop - start
        first_window = skip * B // self.window
        for j in range(first_window, -(-n_rows // self.window)):
            w_lo = start + j * self.window
            w_hi = min(w_lo + self.window, stop)
            pieces = pieces_for(order, w_lo, w_hi)
            data = self._read(pieces)
            perm = None
            if self.shuffle and self.train:
                rng = np.random.default_rng([self.seed, self.plan.epoch, self.plan.rank, logical, j])
                perm = rng.permutation(len(data))
                if self.group_rows:
                    at = log_positions(self.index, pieces) if self.group_order == "log" else None
                    perm = grouped_permutation(perm, data.field("group"), self.group_rows, rng, at)
            k0 = (skip * B - j * self.window) if j == first_window else 0
            for k in range(k0, len(data), B):
                if self.drop_last and self.train and k + B > len(data):
                    break
                idx = slice(k, min(k + B, len(data))) if perm is None else perm[k : k + B]
                yield data, idx

    # -- reading -------------------------------------------------------------------------------
    def _read(self, pieces: list[Piece]) -> Window:
        return Window([self._group(p.group).slice(p.start, p.stop) for p in pieces])

    def warm_up(self) -> None:
        """Decode and gather a few rows of the first file in this process, so the kernels are
        compiled (or loaded from numba's cache, ~0.3 s) here once and inherited by forked workers,
        instead of each worker paying for it every epoch."""
        if self._warmed or not self.index.files:
            return
        self._warmed = True  # the kernel stays compiled in this process: once per stream is enough
        path = self.index.files[0]
        try:
            batches = storage.open_parquet(path).iter_batches(batch_size=8, columns=self.spec.columns())
            first = next(batches, None)
        except (OSError, ValueError):
            return  # the workers raise the error with its context
        if first is not None and first.num_rows:
            self.decoder.decode(first, Where(path, 0)).gather(np.arange(first.num_rows))

    def _group(self, g: RowGroup) -> Decoded:
        if self._cached is not None and self._cached[0] == g:
            return self._cached[1]
        path = self.index.files[g.file]
        where = Where(path, g.index)
        try:
            pf = self._open(g.file)
            table = pf.read_row_group(g.index, columns=self.spec.columns(), use_threads=False)
        except storage.StorageError:
            raise
        except (OSError, ValueError) as e:
            said = storage.failure(e, path)
            if said is not None:  # the store, not the file: a retry may read it
                raise storage.StorageError(f"{where}: {said.removeprefix(str(path) + ': ')}") from None
            if getattr(e, "errno", None) == errno.EMFILE or "Too many open files" in str(e):
                raise DataError(
                    f"{where}: could not open ({e}); this process has run out of file descriptors "
                    f"(it keeps up to {open_file_cap()} Parquet files open); raise `ulimit -n`"
                ) from None
            raise DataError(
                f"{where}: could not read{self._bad_column(g)} ({e}); truncated or corrupt file?"
            ) from None
        if table.num_rows != g.rows:
            raise DataError(f"{where}: read {table.num_rows} rows, the footer promised {g.rows}")
        decoded = self.decoder.decode(table, where, self.index.first_rows[g])
        self._cached = (g, decoded)
        return decoded

    def _bad_column(self, g: RowGroup) -> str:
        """`` column 'x'``: the first spec column of row group ``g`` that fails to read on its own
        (a page whose checksum or compressed data is damaged), or "" if none does alone."""
        try:
            pf = self._open(g.file)
        except (OSError, ValueError):
            return ""
        for column in self.spec.columns():
            try:
                pf.read_row_group(g.index, columns=[column], use_threads=False)
            except (OSError, ValueError):
                return f" column {column!r}"
        return ""

    def _open(self, file: int) -> pq.ParquetFile:
        """File ``file`` of the split, opened once and kept open while it is among the
        ``open_file_cap()`` most recently read (row groups come in a shuffled order across files)."""
        pf = self._files.pop(file, None)
        if pf is None:
            while len(self._files) >= open_file_cap():
                self._files.popitem(last=False)[1].close()
            # Pages written with a CRC (every recformer writer: schema.CHECKSUMS) are verified.
            pf = storage.open_parquet(
                self.index.files[file], page_checksum_verification=self.verify_checksums
            )
        self._files[file] = pf
        return pf

    def __getstate__(self):
        # Open files and decoded caches stay in the process that made them.
        state = self.__dict__.copy()
        state.update(_files=OrderedDict(), _cached=None, _decoder=None)
        return state
