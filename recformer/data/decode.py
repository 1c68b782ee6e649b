"""Vectorised decoding of Arrow record batches into fixed-shape arrays, then ``Batch`` tensors.

A window of rows (one or more row groups) is decoded once into numpy arrays (``Decoded``): ids mapped
to table rows, histories truncated to the most recent ``max_len`` events and left-padded, dense
features normalised, values checked. Batches are then cut from the window by fancy indexing with a
(shuffled) row order, which is cheap next to the Parquet decode. No per-row Python anywhere.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, fields

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch

from recformer.config import CategoricalField, FeatureSpec
from recformer.data.batch import Batch, PackedBatch
from recformer.data.schema import (
    DataError,
    Where,
    check_finite,
    check_label,
    check_nonneg_ids,
    list_offsets,
    numeric,
)

# Time gaps: bucket b >= 1 holds gaps with floor(log2(1 + gap / 60 s)) == b - 1 (clipped), i.e.
# roughly "within 2**(b-1) minutes"; bucket 0 is padding.
_GAP_UNIT_S = 60.0


@dataclass
class Decoded:
    """A decoded window; every array has the window's rows as its first axis."""

    label: np.ndarray  # float32 [S]
    weight: np.ndarray  # float32 [S]
    group: np.ndarray  # int64 [S]
    target_item: np.ndarray  # int32 [S]
    cat: np.ndarray  # int32 [S, F]
    dense: np.ndarray  # float32 [S, Dn]
    emb: np.ndarray  # float32 [S, E]
    hist_item: np.ndarray  # int32 [S, L]
    hist_cat: np.ndarray  # int16 (int32 for vocabularies >= 2**15) [S, L, C]
    hist_gap: np.ndarray  # uint8 [S, L]
    hist_mask: np.ndarray  # bool [S, L]
    keys: np.ndarray  # int64 [S, K]
    oov: np.ndarray  # int32 [S, n_id_fields]: unknown ids per row and id field

    def __len__(self) -> int:
        return len(self.label)

    def slice(self, lo: int, hi: int) -> Decoded:
        return Decoded(**{f.name: getattr(self, f.name)[lo:hi] for f in fields(self)})

    @staticmethod
    def concat(parts: list[Decoded]) -> Decoded:
        if len(parts) == 1:
            return parts[0]
        return Decoded(
            **{f.name: np.concatenate([getattr(p, f.name) for p in parts]) for f in fields(Decoded)}
        )

    def gather(self, idx: np.ndarray | slice, packed: bool = False) -> Batch | PackedBatch:
        """Rows ``idx`` (an index array, or a slice for unshuffled reads) as a Batch, or as a
        PackedBatch whose shared-memory buffer the rows are gathered into directly: one copy per
        row, wherever the batch goes. Ids stay compact (int32/int16/uint8) through the worker queue
        and the pinned copy; ``Batch.to`` widens them on the device."""
        rows = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "oov"}
        oov = torch.from_numpy(self.oov[idx].sum(axis=0, dtype=np.int64))
        if not packed:
            if isinstance(idx, slice):  # contiguous rows: views, no copy
                return Batch(**{k: torch.from_numpy(v[idx]) for k, v in rows.items()}, oov=oov)
            return Batch(**{k: torch.from_numpy(np.take(v, idx, axis=0)) for k, v in rows.items()}, oov=oov)
        n = len(range(*idx.indices(len(self)))) if isinstance(idx, slice) else len(idx)
        specs = [(k, torch.from_numpy(v[:0]).dtype, (n, *v.shape[1:])) for k, v in rows.items()]
        specs.append(("oov", torch.int64, tuple(oov.shape)))
        out = PackedBatch.empty(specs)
        views = out.views()
        for k, v in rows.items():
            dst = views[k].numpy()
            if isinstance(idx, slice):
                dst[...] = v[idx]
            else:
                np.take(v, idx, axis=0, out=dst)
        views["oov"].copy_(oov)
        return out


def stable_hash(values: list[str]) -> np.ndarray:
    """64-bit hashes of strings that do not change across processes or Python versions."""
    out = np.empty(len(values), dtype=np.int64)
    for i, v in enumerate(values):
        out[i] = int.from_bytes(hashlib.blake2b(v.encode(), digest_size=8).digest(), "little", signed=True)
    return out


class Decoder:
    """Decodes Arrow tables that follow ``spec`` (schema already checked by ``check_schema``)."""

    def __init__(self, spec: FeatureSpec):
        self.spec = spec
        self.max_len = spec.sequence.max_len if spec.sequence else 0
        self._vocab = {
            f.name: pa.array(f.vocab, pa.string())
            for f in spec.categorical + (spec.sequence.categorical if spec.sequence else [])
            if f.vocab is not None
        }

    def oov_fields(self) -> list[str]:
        """Names of the id fields whose unknown ids are counted, in ``Decoded.oov`` column order."""
        names = [self.spec.item.column] + [f.name for f in self.spec.categorical]
        if self.spec.sequence:
            names += [self.spec.sequence.item_column] + [f.name for f in self.spec.sequence.categorical]
        return names

    # -- fields --------------------------------------------------------------------------------
    def _cat_rows(self, arr: pa.Array, f: CategoricalField, where: Where) -> tuple[np.ndarray, np.ndarray]:
        """Table rows (int32) and an OOV flag per value; nulls count as OOV."""
        if pa.types.is_dictionary(arr.type):
            arr = arr.dictionary_decode()
        if f.vocab is not None:
            idx = pc.index_in(arr, value_set=self._vocab[f.name])
            rows = pc.fill_null(idx, -1).to_numpy(zero_copy_only=False).astype(np.int32) + 1
            return rows, rows == 0
        valid = None
        if arr.null_count:
            valid = arr.is_valid().to_numpy(zero_copy_only=False)
            arr = pc.fill_null(arr, 0)
        ids = arr.to_numpy(zero_copy_only=False)  # native width: no int64 copy of a hot column
        check_nonneg_ids(ids, where, f.name)
        oov = ids >= f.vocab_size
        if valid is not None:
            oov |= ~valid
        rows = ids.astype(np.int32) + 1
        if oov.any():
            rows[oov] = 0
        return rows, oov

    def _item_rows(self, arr: pa.Array, col: str, where: Where) -> tuple[np.ndarray, np.ndarray]:
        """Item table rows (int32) and an OOV flag per value."""
        if arr.null_count:
            raise DataError(f"{where}: item id column {col!r} has {arr.null_count} null(s)")
        ids = numeric(arr, where, col, np.int64) if not pa.types.is_integer(arr.type) else arr.to_numpy()
        check_nonneg_ids(ids, where, col)
        oov = ids >= self.spec.item.vocab_size
        rows = ids.astype(np.int32) + 1
        if oov.any():
            rows[oov] = 0
        return rows, oov

    # -- whole table ---------------------------------------------------------------------------
    def decode(self, table: pa.Table | pa.RecordBatch, where: Where) -> Decoded:
        spec = self.spec
        if isinstance(table, pa.Table):
            table = table.combine_chunks()
            col = lambda name: table.column(name).chunk(0) if table.num_rows else pa.array([])
        else:
            col = table.column
        n = table.num_rows

        label = numeric(col(spec.label), where, spec.label)
        check_label(label, where, spec.label)
        if spec.weight:
            weight = numeric(col(spec.weight), where, spec.weight)
            check_finite(weight, where, spec.weight)
            if len(weight) and weight.min() < 0:
                raise DataError(f"{where}: weight column {spec.weight!r} has negative values; expected >= 0")
        else:
            weight = np.ones(n)
        group = self._group(col(spec.group), where) if spec.group else np.full(n, -1, np.int64)

        oov_cols = []
        target, oov = self._item_rows(col(spec.item.column), spec.item.column, where)
        oov_cols.append(oov)
        cat = np.zeros((n, len(spec.categorical)), np.int32)
        for j, f in enumerate(spec.categorical):
            cat[:, j], oov = self._cat_rows(col(f.name), f, where)
            oov_cols.append(oov)

        dense = np.zeros((n, len(spec.dense)), np.float32)
        for j, f in enumerate(spec.dense):
            x = numeric(col(f.name), where, f.name)
            check_finite(x, where, f.name)
            if f.log1p:
                x = np.sign(x) * np.log1p(np.abs(x))
            dense[:, j] = (x - f.mean) / f.std

        embs = [self._fixed_vectors(col(f.name), f.dim, f.name, where) for f in spec.embedding]
        emb = np.concatenate(embs, axis=1) if embs else np.zeros((n, 0), np.float32)

        keys = np.zeros((n, len(spec.keys)), np.int64)
        for j, k in enumerate(spec.keys):
            keys[:, j] = numeric(col(k), where, k, np.int64)

        hist_item, hist_cat, hist_gap, hist_mask, seq_oov = self._sequence(col, n, where)
        oov_cols += seq_oov
        return Decoded(
            label=label.astype(np.float32),
            weight=weight.astype(np.float32),
            group=group,
            target_item=target,
            cat=cat,
            dense=dense,
            emb=emb,
            hist_item=hist_item,
            hist_cat=hist_cat,
            hist_gap=hist_gap,
            hist_mask=hist_mask,
            keys=keys,
            oov=np.stack(oov_cols, axis=1).astype(np.int32) if n else np.zeros((0, len(oov_cols)), np.int32),
        )

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

    def _fixed_vectors(self, arr: pa.Array, dim: int, name: str, where: Where) -> np.ndarray:
        off = list_offsets(arr, where, name)
        lens = np.diff(off)
        if len(lens) and (lens != dim).any():
            i = int(np.flatnonzero(lens != dim)[0])
            raise DataError(
                f"{where}: column {name!r} row {i} has {lens[i]} values; "
                f"the spec says dim={dim} for every row"
            )
        vals = arr.values.to_numpy(zero_copy_only=False)[off[0] : off[-1]].astype(np.float32)
        check_finite(vals, where, name)
        return vals.reshape(len(arr), dim)

    def _sequence(self, col, n: int, where: Where):
        s = self.spec.sequence
        L = self.max_len
        if s is None:
            z = np.zeros((n, 0), np.int32)
            return z, np.zeros((n, 0, 0), np.int32), z, np.zeros((n, 0), bool), []
        items = col(s.item_column)
        off = list_offsets(items, where, s.item_column)
        lens = np.diff(off)
        # Aligned list columns must agree row by row (DESIGN section 3).
        aligned = [f.name for f in s.categorical] + ([s.time_gap_column] if s.time_gap_column else [])
        offsets = {}
        for name in aligned:
            o = list_offsets(col(name), where, name)
            other = np.diff(o)
            if (other != lens).any():
                i = int(np.flatnonzero(other != lens)[0])
                raise DataError(
                    f"{where}: aligned list columns {s.item_column!r} and {name!r} differ in length in "
                    f"{int((other != lens).sum())} row(s) (first at batch row {i}: {lens[i]} vs {other[i]})"
                )
            offsets[name] = o

        # Keep the most recent L events (the tail of each list) and left-pad, so the newest event
        # always sits at position L - 1. Row-major, the valid slots of the padded [n, L] matrix
        # come in exactly the order of the kept flat values, so every column is one boolean-mask
        # scatter; no per-element index arrays.
        keep = np.minimum(lens, L)
        mask = np.arange(L)[None, :] >= (L - keep)[:, None]
        truncated = bool((lens > L).any())
        if truncated:
            # Drop the oldest len - L values of each long row: +1/-1 marks, then a running sum.
            marks = np.zeros(int(lens.sum()) + 1, np.int64)
            starts = np.cumsum(lens) - lens
            long_rows = lens > L
            np.add.at(marks, starts[long_rows], 1)
            np.add.at(marks, starts[long_rows] + lens[long_rows] - L, -1)
            kept = np.cumsum(marks[:-1]) == 0
        pick = (lambda v: v[kept]) if truncated else (lambda v: v)
        row_of = lambda flags: np.repeat(np.arange(n), keep)[flags]  # only called when some id is OOV

        def flat_values(name: str, o: np.ndarray) -> pa.Array:
            flat = col(name).values.slice(o[0], o[-1] - o[0]) if n else pa.array([], pa.int64())
            if flat.null_count:
                raise DataError(f"{where}: list column {name!r} holds {flat.null_count} null element(s)")
            return flat.dictionary_decode() if pa.types.is_dictionary(flat.type) else flat

        def oov_counts(flags: np.ndarray) -> np.ndarray:
            return np.bincount(row_of(flags), minlength=n) if flags.any() else np.zeros(n, np.int64)

        item_rows, item_oov = self._item_rows(flat_values(s.item_column, off), s.item_column, where)
        hist_item = np.zeros((n, L), np.int32)
        hist_item[mask] = pick(item_rows)
        seq_oov = [oov_counts(pick(item_oov))]

        cat_dtype = np.int16 if max((f.rows for f in s.categorical), default=0) < 2**15 else np.int32
        hist_cat = np.zeros((n, L, len(s.categorical)), cat_dtype)
        for j, f in enumerate(s.categorical):
            r, oov = self._cat_rows(flat_values(f.name, offsets[f.name]), f, where)
            hist_cat[:, :, j][mask] = pick(r)
            seq_oov.append(oov_counts(pick(oov)))

        hist_gap = np.zeros((n, L), np.uint8)
        if s.time_gap_column:
            name = s.time_gap_column
            gaps = pick(flat_values(name, offsets[name]).to_numpy(zero_copy_only=False))
            check_finite(gaps, where, name)
            if len(gaps) and gaps.min() < 0:
                raise DataError(f"{where}: column {name!r} has negative time gaps; expected seconds >= 0")
            b = np.log2(1.0 + gaps.astype(np.float32) * np.float32(1.0 / _GAP_UNIT_S))
            hist_gap[mask] = np.minimum(b, s.time_gap_buckets - 1).astype(np.uint8) + 1
        return hist_item, hist_cat, hist_gap, mask, seq_oov


# ----------------------------------------------------------------------------------------------
# Item side table
# ----------------------------------------------------------------------------------------------


def load_item_tables(spec: FeatureSpec) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The side table as dense per-row tensors: content [item_rows, content_dim] (float16) and
    features [item_rows, n_item_feats] (int64 rows), row 0 = OOV. Also returns how many known items
    have no side-table row (their content stays zero, features OOV)."""
    it = spec.item
    rows = it.vocab_size + 1
    content = torch.zeros(rows, it.content_dim, dtype=torch.float16)
    feats = torch.zeros(rows, len(it.features), dtype=torch.int64)
    path = spec.side_table_path()
    if path is None:
        return content, feats, 0
    if not path.is_file():
        raise DataError(f"item side table {path} (item.side_table in {spec.path}) does not exist")
    try:
        table = pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as e:
        raise DataError(f"item side table {path}: not a readable Parquet file ({e})") from None
    where = Where(str(path))
    cols = (
        [it.side_id_column]
        + ([it.content_column] if it.content_column else [])
        + [f.name for f in it.features]
    )
    missing = [c for c in cols if c not in table.column_names]
    if missing:
        raise DataError(f"{where}: column(s) {missing} named by item.* in the spec are missing")
    table = table.combine_chunks()
    ids = numeric(table.column(it.side_id_column).chunk(0), where, it.side_id_column, np.int64)
    check_nonneg_ids(ids, where, it.side_id_column)
    if (ids >= it.vocab_size).any():
        raise DataError(
            f"{where}: column {it.side_id_column!r} has ids >= item.vocab_size={it.vocab_size} "
            f"(max {ids.max()}); the side table and the spec disagree"
        )
    if len(np.unique(ids)) != len(ids):
        raise DataError(f"{where}: column {it.side_id_column!r} has duplicate item ids")
    dec = Decoder(spec)
    if it.content_column:
        vecs = dec._fixed_vectors(
            table.column(it.content_column).chunk(0), it.content_dim, it.content_column, where
        )
        content[torch.from_numpy(ids + 1)] = torch.from_numpy(vecs).to(torch.float16)
    for j, f in enumerate(it.features):
        r, _ = dec._cat_rows(table.column(f.name).chunk(0), f, where)
        feats[torch.from_numpy(ids + 1), j] = torch.from_numpy(r.astype(np.int64))
    return content, feats, it.vocab_size - len(ids)
