"""Vectorised decoding of Arrow record batches, and the compiled cutting of batches from them.

Each row group is decoded once (``Decoded``): the per-row fields into one record per row (the
model's inputs encoded by ``recformer.data.encode.Encoder``: ids mapped to table rows, dense
features normalised, OOV flags; and the training columns: label, weight, group, keys), every value
checked, and the history left ragged (``encode.History``). A window (``Window``: slices of one or
more row groups) cuts batches with a (shuffled) row order through compiled kernels (``kernels``)
into the *transit* form a worker ships (``BatchLayout.transit``): whole records, and each row's
newest ``max_len`` events id-mapped and gap-bucketed but still ragged. ``BatchLayout.to_batch``
turns that into the padded ``Batch`` in the training process, as it takes the batch out of the
worker's slot. No per-row Python anywhere. The server cuts its batches the same way
(``recformer.data.requests``).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch

from recformer.batch import FIELDS, Batch, BatchField, DataError
from recformer.config import FeatureSpec
from recformer.data import kernels
from recformer.data.encode import GAP_UNIT_S, Encoder, History
from recformer.data.packed import PackedBatch, numpy_dtype
from recformer.data.schema import (
    Where,
    cast_finite,
    check_finite,
    check_label,
    check_nonneg_ids,
    check_side_table_schema,
    key_values,
    numeric,
)
from recformer.data.vocab import lookup

log = logging.getLogger(__name__)

# The narrowest of these that holds every row of a history id field carries it through decoding
# and transit, and the Batch keeps it (``Batch.to`` widens every id field to int64 on the device):
# padded to ``max_len`` the history is most of a batch's bytes, so its width is what the training
# process writes and what crosses to the GPU.
_TORCH_INT = {np.int8: torch.int8, np.int16: torch.int16, np.int32: torch.int32}
"""Torch dtypes of ``encode.INT_DTYPES`` (``Encoder.item_dtype`` / ``cat_dtype``)."""


ROW_FIELDS = tuple(f for f in FIELDS if f.role == "row")
"""The fields each row's record holds (``BatchLayout.record``); the history is ``Decoded.hist``."""
EVENT_FIELDS = tuple(f for f in FIELDS if f.role == "event")
"""The fields a row holds per history event: ragged in transit (``ev_<name>``), padded in the Batch."""


def transit_name(f: BatchField) -> str:
    """The name of an event field in transit: ``hist_item`` -> ``ev_item``."""
    return "ev_" + f.name.removeprefix("hist_")


@functools.lru_cache(maxsize=16)
def _record_copy_plan(layout: BatchLayout, batch_layout: tuple) -> tuple[np.ndarray, ...]:
    """For ``kernels.scatter_records``: per Batch field of the row record, its offset in the record,
    its offset in a batch buffer (``PackedBatch.layout``) and its size per row, all in 4-byte
    words."""
    dst = {name: offset for name, _, _, offset in batch_layout}
    record = [(name, r) for name, r in layout.record.items() if name in dst]
    plan = [
        (off // 4, dst[name] // 4, math.prod(shape) * dt.itemsize // 4) for name, (off, dt, shape) in record
    ]
    return tuple(np.array(column, np.int64) for column in zip(*plan))


@dataclass(frozen=True)
class BatchLayout:
    """The shape of every batch of a spec, and what the padding kernel needs to know."""

    n_cat: int
    n_dense: int
    emb_dim: int
    n_keys: int
    max_len: int
    item_limit: int
    cat_limits: tuple[int, ...]
    """Vocab size of each event categorical."""
    cat_dtype: type
    item_dtype: type
    """Of history item rows in a window and in transit (int16 while the vocabulary allows)."""
    gap_buckets: int
    """0 when the spec has no time-gap column."""
    has_history: bool
    bag_values: tuple[int, ...] = ()
    """Values kept per bag field (``max_values``)."""

    @property
    def n_oov(self) -> int:
        return self.n_row_oov + (1 + len(self.cat_limits) if self.has_history else 0)

    @property
    def n_row_oov(self) -> int:
        """Unknown-id counts per row: the target item, each context categorical, each bag field."""
        return 1 + self.n_cat + len(self.bag_values)

    def sizes(self, n: int) -> dict[str, int]:
        """Each axis letter of ``FIELDS``' shapes, for an ``n``-row batch."""
        rows = {"B": n, "F": self.n_cat, "Dn": self.n_dense, "E": self.emb_dim, "K": self.n_keys}
        rows["G"] = sum(self.bag_values)
        return rows | {"L": self.max_len, "C": len(self.cat_limits), "O": self.n_oov}

    def host_dtype(self, f: BatchField) -> torch.dtype:
        """``f.host``, with the narrow history ids resolved for this spec."""
        narrow = {"item": _TORCH_INT[self.item_dtype], "event_cat": _TORCH_INT[self.cat_dtype]}
        return narrow[f.host] if f.host in narrow else getattr(torch, f.host)

    @functools.lru_cache(maxsize=8)  # noqa: B019 (a handful of layouts per process)
    def fields(self, n: int) -> tuple[tuple[str, torch.dtype, tuple[int, ...]], ...]:
        """(name, dtype, shape) of every field of an ``n``-row Batch, in ``FIELDS`` order."""
        size = self.sizes(n)
        return tuple((f.name, self.host_dtype(f), tuple(size[a] for a in f.shape)) for f in FIELDS)

    def transit(self, n: int, events: int) -> tuple[tuple[str, torch.dtype, tuple[int, ...]], ...]:
        """(name, dtype, shape) of the fields of an ``n``-row batch in transit from a worker, whose
        rows keep ``events`` history events in all: ``rec`` the rows' records (4-byte words,
        ``record``), the batch's ``count`` fields, ``hist_len`` each row's kept events, then each
        ``event`` field's values, row after row (``ev_item``, ``ev_cat`` event-major, ``ev_gap``)."""
        size = self.sizes(n)
        head = [("rec", torch.int32, (n, self.record_bytes // 4))]
        head += [
            (f.name, self.host_dtype(f), tuple(size[a] for a in f.shape)) for f in FIELDS if f.role == "count"
        ]
        head += [("hist_len", torch.int32, (n,))]
        tail = [
            (transit_name(f), self.host_dtype(f), (events, *(size[a] for a in f.shape[2:])))
            for f in EVENT_FIELDS
        ]
        return tuple(head + tail)

    def transit_plan(self, n: int, events: int) -> tuple[tuple, int]:
        """``PackedBatch.plan(self.transit(n, events))``, from the event-free part planned once per
        ``n``: every batch keeps a different number of events, so the plan's cache never hit."""
        head, at, per_event = self._transit_head(n)
        ev = []
        for name, dtype, tail, size in per_event:
            ev.append((name, dtype, (events, *tail), at))
            at += -(-events * size // 8) * 8
        return head + tuple(ev), at

    @functools.lru_cache(maxsize=8)  # noqa: B019 (a handful of layouts and batch sizes per process)
    def _transit_head(self, n: int) -> tuple[tuple, int, tuple]:
        """The planned fields of an ``n``-row batch in transit before its events, where the events
        start, and per event field its (name, dtype, shape after the event axis, bytes per event)."""
        specs = self.transit(n, 0)
        layout, _ = PackedBatch.plan(specs)
        head = len(specs) - len(EVENT_FIELDS)
        per_event = tuple(
            (name, dtype, shape[1:], math.prod(shape[1:]) * numpy_dtype(dtype).itemsize)
            for name, dtype, shape in specs[head:]
        )
        return layout[:head], layout[head][3], per_event

    def slot_bytes(self, n: int) -> int:
        """Bytes of the largest ``n``-row batch in transit (every row keeping ``max_len`` events)."""
        return self.transit_plan(n, n * self.max_len)[1]

    def to_batch(self, packed: PackedBatch, pin: bool = False) -> Batch:
        """The padded Batch of a batch in transit (``transit``), in one fresh buffer (pinned with
        ``pin``): records become field columns, each row's events go behind its padding. Reads
        ``packed`` once; it can be reused as soon as this returns."""
        t = packed.arrays()
        n = t["rec"].shape[0]
        layout, nbytes = PackedBatch.plan(self.fields(n))
        out = PackedBatch(torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin), layout)
        v = out.arrays()
        src_off, dst_off, width = _record_copy_plan(self, layout)
        words = out.buffer.numpy().view(np.uint32)
        kernels.scatter_records(t["rec"].view(np.uint32), src_off, dst_off, width, words)
        v["oov"][:] = t["oov"]
        kernels.pad_events(
            t["hist_len"], t["ev_item"], t["ev_cat"].reshape(-1), t["ev_gap"],
            v["hist_item"], v["hist_cat"], v["hist_gap"], v["hist_mask"],
        )  # fmt: skip
        if pin:
            # Views of the pinned tensor itself: an asynchronous copy to the GPU records its event
            # on that tensor's allocation, so the block is not handed out again mid-copy. Tensors
            # made from numpy views would not be recognised as that allocation.
            return out.unpack()
        # Tensors over the numpy views the kernels wrote (they keep the buffer alive): one call
        # per field, where slicing and viewing the tensor would take three.
        return Batch(**{name: torch.from_numpy(a) for name, a in v.items()})

    @functools.cached_property
    def record(self) -> dict[str, tuple[int, np.dtype, tuple[int, ...]]]:
        """Where each per-row field sits in a window's row record (``Decoded.rows``): byte
        offset, numpy dtype and per-row shape; the ``ROW_FIELDS`` in order, then ``row_oov``, the
        row's OOV flags (``n_row_oov`` int32)."""
        out, offset = {}, 0
        rows = {f.name for f in ROW_FIELDS}
        per_row = tuple(f for f in self.fields(1) if f[0] in rows)
        per_row += (("row_oov", torch.int32, (1, self.n_row_oov)),)
        for name, dtype, shape in per_row:
            np_dtype = numpy_dtype(dtype)
            out[name] = (offset, np_dtype, shape[1:])
            offset += math.prod(shape[1:]) * np_dtype.itemsize
        return out

    @property
    def record_bytes(self) -> int:
        offset, dtype, shape = list(self.record.values())[-1]
        return offset + math.prod(shape) * dtype.itemsize


@dataclass
class Decoded:
    """A decoded row group (or a slice of one): the per-row fields packed in one record per row
    (``rows``), and the history still ragged, as table rows. ``fill`` writes batch rows into a
    batch in transit: each row's record whole and its kept events (``kernels``)."""

    rows: np.ndarray
    """uint8 [S, layout.record_bytes]: label, weight, group, target_item, cat, dense, emb, keys,
    row_oov."""
    hist: History | None
    """None when the spec has no sequence."""
    layout: BatchLayout
    truncated: np.ndarray | None = None
    """Per bag field, the values past its ``max_values`` that were left out (int64)."""

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def oov(self) -> np.ndarray:
        """int32 [S, 1 + F]: unknown target / context ids per row (a view into ``rows``)."""
        return self.field("row_oov")

    def field(self, name: str) -> np.ndarray:
        """A per-row field as a (strided) view into ``rows``: [S, *shape]."""
        offset, dtype, shape = self.layout.record[name]
        width = math.prod(shape) * dtype.itemsize
        return self.rows[:, offset : offset + width].view(dtype).reshape(len(self), *shape)

    def slice(self, lo: int, hi: int) -> Decoded:
        hist = self.hist.slice(lo, hi) if self.hist else None
        return Decoded(self.rows[lo:hi], hist, self.layout)

    def oov_totals(self) -> np.ndarray:
        """Unknown ids per id field (``Decoder.oov_fields()`` order) over every row, counting the
        history events a batch keeps."""
        out = np.zeros(self.layout.n_oov, np.int64)
        k0 = self.oov.shape[1]
        out[:k0] = self.oov.sum(axis=0, dtype=np.int64)
        if self.hist:
            h, lay = self.hist, self.layout
            kernels.count_oov(h.off, h.items, h.cats, lay.max_len, out[k0:])
        return out

    def gather(
        self, idx: np.ndarray | slice, packed: bool = False, buffer: np.ndarray | None = None
    ) -> Batch | PackedBatch:
        """Rows ``idx`` as a batch (see ``Window.gather``)."""
        return Window([self]).gather(idx, packed, buffer)

    def fill(self, idx: np.ndarray, pos: np.ndarray, start: np.ndarray, views: dict[str, np.ndarray]) -> None:
        """Write rows ``idx`` of this part as rows ``pos`` of a batch in transit (``views``: its
        fields; row ``pos[r]``'s events start at ``start[pos[r]]``), adding their OOV counts to
        ``views["oov"]``."""
        lay, oov = self.layout, views["oov"]
        k0 = lay.n_row_oov
        oov_at = lay.record["row_oov"][0] // 4
        rec = views["rec"].view(np.uint32)
        kernels.gather_records(self.rows.view(np.uint32), idx, pos, oov_at, rec, oov[:k0])
        if self.hist:
            h, v = self.hist, views
            kernels.gather_events(
                h.off, h.items, h.cats, h.gaps, lay.max_len, idx, pos, start,
                v["ev_item"], v["ev_cat"].reshape(-1), v["ev_gap"], oov[k0:],
            )  # fmt: skip


@dataclass
class Window:
    """Consecutive decoded slices (usually of two or three row groups) read as one window of rows.

    The parts are not concatenated: a batch's rows are split by part and each part writes its rows
    into their batch positions: concatenating would copy every event once more (about 0.1 us per
    row, more than half the padding kernel)."""

    parts: list[Decoded]

    def __post_init__(self) -> None:
        self.starts = np.cumsum([0] + [len(p) for p in self.parts])
        L = self.parts[0].layout.max_len if self.parts else 0
        # Events each window row keeps, once per window rather than per batch.
        self.kept = np.concatenate(
            [np.minimum(np.diff(p.hist.off), L) if p.hist else np.zeros(len(p), np.int64) for p in self.parts]
            or [np.zeros(0, np.int64)]
        ).astype(np.int32)

    def __len__(self) -> int:
        return int(self.starts[-1])

    def field(self, name: str) -> np.ndarray:
        """A per-row field over the window's rows (``Decoded.field``), [len, *shape], a copy."""
        return np.concatenate([p.field(name) for p in self.parts])

    def gather(
        self, idx: np.ndarray | slice, packed: bool = False, buffer: np.ndarray | None = None
    ) -> Batch | PackedBatch:
        """Rows ``idx`` (window rows, or a slice for unshuffled reads) as a Batch, or as the
        PackedBatch in transit form (``BatchLayout.transit``) that a worker ships. Every value is
        written once, straight into one buffer (``buffer``, e.g. a shared-memory slot, or a fresh
        one)."""
        if isinstance(idx, slice):
            idx = np.arange(*idx.indices(len(self)))
        B = len(idx)
        lens, (first, rows, pos) = np.empty(B, np.int32), np.empty((3, B), np.int64)
        bounds = np.empty(len(self.parts) + 1, np.int64)
        # The kernels do not check bounds: cut_plan refuses an index outside the window.
        events = kernels.cut_plan(idx, self.starts, self.kept, rows, pos, bounds, lens, first)
        if events < 0:
            raise IndexError(f"row {idx[-1 - events]} outside a window of {len(self)} rows")
        lay = self.parts[0].layout
        out = PackedBatch.empty(lay.transit_plan(B, events), buffer)
        views = out.arrays()
        views["hist_len"][:] = lens
        views["oov"][:] = 0
        for p, decoded in enumerate(self.parts):
            a, b = bounds[p], bounds[p + 1]
            if b > a:
                decoded.fill(rows[a:b], pos[a:b], first, views)
        return out if packed else lay.to_batch(out)


def stable_hash(values: list[str]) -> np.ndarray:
    """64-bit hashes of strings that do not change across processes or Python versions."""
    out = np.empty(len(values), dtype=np.int64)
    for i, v in enumerate(values):
        out[i] = int.from_bytes(hashlib.blake2b(v.encode(), digest_size=8).digest(), "little", signed=True)
    return out


class Decoder(Encoder):
    """Decodes Arrow tables that follow ``spec`` (schema already checked by ``check_schema``): the
    encoded features (``Encoder``) and the training columns (label, weight, group, keys), packed
    into one record per row (``Decoded``)."""

    def __init__(self, spec: FeatureSpec, item_ids: pa.Array | None = None, gap_unit_s: float = GAP_UNIT_S):
        super().__init__(spec, item_ids, gap_unit_s)
        seq = spec.sequence
        self.layout = BatchLayout(
            n_cat=len(spec.categorical),
            n_dense=len(spec.dense),
            emb_dim=sum(f.dim for f in spec.embedding),
            n_keys=len(spec.keys),
            has_history=seq is not None,
            max_len=self.max_len,
            item_limit=self.item_limit,
            cat_limits=tuple(f.vocab_size for f in seq.categorical) if seq else (),
            cat_dtype=self.cat_dtype,
            item_dtype=self.item_dtype,
            gap_buckets=self.gap_buckets,
            bag_values=tuple(f.max_values for f in spec.bags),
        )

    def decode(self, table: pa.Table | pa.RecordBatch, where: Where, first_row: int = 0) -> Decoded:
        """The rows of ``table`` (a row group, or part of one), checked; ``first_row``: its first
        row's position in the split (the code of a string key)."""
        if isinstance(table, pa.Table):
            table = table.combine_chunks()
            col = lambda name: table.column(name).chunk(0) if table.num_rows else pa.array([])
        else:
            col = table.column
        n, spec = table.num_rows, self.spec
        label = numeric(col(spec.label), where, spec.label)
        check_label(label, where, spec.label)
        values = {"label": label, "weight": self._weight(col, n, where)}
        values["group"] = self._group(col(spec.group), where) if spec.group else np.full(n, -1, np.int64)
        features, truncated = self.row_features(col, n, where)
        values |= features
        values["keys"] = np.zeros((n, len(spec.keys)), np.int64)
        for j, k in enumerate(spec.keys):
            values["keys"][:, j] = key_values(col(k), where, k, first_row)
        hist = self.sequence(col, n, where)  # rows checked before the history
        return self.pack(values, hist, truncated)

    def pack(self, values: dict[str, np.ndarray], hist: History | None, truncated=None) -> Decoded:
        """Rows of encoded ``values`` (every field of ``BatchLayout.record``) and their history."""
        n = len(values["row_oov"])
        return Decoded(rows=self._records(values, n), hist=hist, layout=self.layout, truncated=truncated)

    def unlabelled(self, n: int) -> dict[str, np.ndarray]:
        """The training columns of ``n`` rows to score (a server's): label 0, weight 1, no group, key 0.
        The model reads none of them."""
        keys = np.zeros((n, len(self.spec.keys)), np.int64)
        return {"label": np.zeros(n), "weight": np.ones(n), "group": np.full(n, -1, np.int64), "keys": keys}

    def _weight(self, col: Callable[[str], pa.Array], n: int, where: Where) -> np.ndarray:
        w = self.spec.weight
        if not w:
            return np.ones(n)
        weight = numeric(col(w), where, w)
        check_finite(weight, where, w)
        if len(weight) and weight.min() < 0:
            raise DataError(f"{where}: weight column {w!r} has negative values; expected >= 0")
        return cast_finite(weight, np.float32, where, w)

    def _records(self, values: dict[str, np.ndarray], n: int) -> np.ndarray:
        """One record per row (``BatchLayout.record``) holding ``values``."""
        if values.keys() != self.layout.record.keys():  # a field added to FIELDS needs its producer here
            raise RuntimeError(f"decoded {sorted(values)}, the record holds {sorted(self.layout.record)}")
        rows = np.empty((n, self.layout.record_bytes), np.uint8)
        words = rows.view(np.uint32)
        for name, x in values.items():
            # A compiled copy into the records (numpy's strided assignment costs ~8 ns per row and field).
            offset, dtype, shape = self.layout.record[name]
            src = np.ascontiguousarray(x.reshape(n, math.prod(shape)), dtype=dtype).view(np.uint32)
            kernels.put_words(words, offset // 4, src)
        return rows

    def _group(self, arr: pa.Array, where: Where) -> np.ndarray:
        if pa.types.is_dictionary(arr.type):
            arr = arr.dictionary_decode()
        if arr.null_count:
            raise DataError(f"{where}: group column {self.spec.group!r} has {arr.null_count} null(s)")
        if pa.types.is_integer(arr.type):
            return arr.to_numpy(zero_copy_only=False).astype(np.int64)
        uniq = pc.unique(arr)
        hashes = stable_hash(uniq.to_pylist())
        return hashes[pc.index_in(arr, value_set=uniq).to_numpy(zero_copy_only=False)]


# ----------------------------------------------------------------------------------------------
# Item side table
# ----------------------------------------------------------------------------------------------


def load_item_tables(spec: FeatureSpec) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The side table as dense per-row tensors, a row per item id (trained and cold items) and row
    0 = OOV: content [rows, content_dim] (float16) and features [rows, sum of their max_values]
    (int64 rows: row 0 = OOV, -1 = no value of a multi-valued feature). Also returns how many known
    items have no side-table row (their content stays zero, features OOV)."""
    it = spec.item
    rows = it.vocab_size + it.cold_items + 1
    content = torch.zeros(rows, it.content_dim, dtype=torch.float16)
    width = [f.max_values for f in it.features]
    feats = torch.full((rows, sum(width)), -1, dtype=torch.int64)
    feats[:, np.cumsum([0, *width[:-1]]).tolist() if width else []] = 0  # no row: one OOV value each
    path = spec.side_table_path()
    if path is None:
        return content, feats, 0
    if not path.is_file():
        raise DataError(f"item side table {path} (item.side_table in {spec.path}) does not exist")
    try:
        table = pq.read_table(path, page_checksum_verification=True)
    except (pa.ArrowInvalid, OSError) as e:
        raise DataError(f"item side table {path}: not a readable Parquet file ({e})") from None
    where = Where(str(path))
    check_side_table_schema(spec, table.schema, where)
    dec = Decoder(spec)
    ids, table = _side_ids(spec, table.combine_chunks(), where, dec)
    if it.content_column:
        vecs = dec.fixed_vectors(
            table.column(it.content_column).chunk(0), it.content_dim, it.content_column, where
        )
        # The table is float16: a value past 65504 would become Inf in every batch that uses it.
        content[torch.from_numpy(ids + 1)] = torch.from_numpy(
            cast_finite(vecs, np.float16, where, it.content_column)
        )
    at = 0
    for f in it.features:
        column = table.column(f.name).chunk(0)
        if f.max_values == 1:
            r = dec.cat_rows(column, f, where)[0][:, None]
        else:
            r, _, cut = dec.value_rows(column, f, where)
            if cut:
                log.warning(
                    "%s: %d value(s) past max_values=%d of %r not used", where, cut, f.max_values, f.name
                )
        feats[torch.from_numpy(ids + 1), at : at + f.max_values] = torch.from_numpy(r.astype(np.int64))
        at += f.max_values
    return content, feats, it.vocab_size + it.cold_items - len(ids)


def _side_ids(spec: FeatureSpec, table: pa.Table, where: Where, dec: Decoder) -> tuple[np.ndarray, pa.Table]:
    """The item id of each side-table row, and the rows of known items (with an item vocabulary,
    rows of items it does not know are left out, and said)."""
    it = spec.item
    column = table.column(it.side_id_column).chunk(0)
    if it.side_id_column in dec.vocabs:
        idx = lookup(column, dec.vocabs[it.side_id_column], it.side_id_column, where)
        known = idx.is_valid()
        if not pc.all(known).as_py():
            log.info(
                "%s: %d row(s) of items the item vocabulary does not know, not used",
                where,
                pc.sum(pc.invert(known)).as_py(),
            )
            table, idx = table.filter(known), idx.filter(known)
        ids = idx.to_numpy(zero_copy_only=False).astype(np.int64)
    else:
        ids = numeric(column, where, it.side_id_column, np.int64)
        check_nonneg_ids(ids, where, it.side_id_column)
        limit = it.vocab_size + it.cold_items
        if (ids >= limit).any():
            raise DataError(
                f"{where}: column {it.side_id_column!r} has ids >= item.vocab_size + item.cold_items = "
                f"{limit} (max {ids.max()}); the side table and the spec disagree"
            )
    if len(np.unique(ids)) != len(ids):
        raise DataError(f"{where}: column {it.side_id_column!r} has duplicate item ids")
    return ids, table
