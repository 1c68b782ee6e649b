"""The encoder: raw feature values to the values the model reads, for the loader and the server alike.

An ``Encoder`` turns raw columns (Arrow arrays: a row group's, or the rows of a batch of serving
requests, ``recformer.data.requests``) into encoded fields: ids to table rows (``id + 1`` through
the spec's vocabularies; unknown ids to the OOV row 0, flagged so they are counted), dense features
through ``sign(x) * log1p(|x|)`` where the spec says so and standardised with its train
statistics, embedding vectors and bags checked and cut, and the history's ids mapped and its time
gaps bucketed (``GAP_UNIT_S``), still ragged (``History``). Every value is checked; a bad one
raises ``DataError`` naming the column.

``recformer.data.decode.Decoder`` adds the training columns (label, weight, group, keys) and cuts
padded batches; the server adds placeholders for those and cuts its batches with the same code, so
what it feeds the model cannot drift from what the model was trained on.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from recformer.batch import DataError
from recformer.config import CategoricalField, FeatureSpec
from recformer.data import kernels
from recformer.data.schema import Where, cast_finite, check_finite, check_nonneg_ids, list_offsets, numeric
from recformer.data.vocab import VALUE, field_vocab, item_vocab, lookup, read_vocab

GAP_UNIT_S = 60.0
"""Seconds in one time-gap unit: bucket row ``b >= 1`` holds the gaps with
``floor(log2(1 + gap / GAP_UNIT_S)) == b - 1`` (the last row also every longer gap), roughly
"within 2**(b-1) minutes"; row 0 is padding. ``recformer export`` writes it into the artifact's
manifest (``encoder.time_gap_unit_s``), which is where the server reads it."""

ITEM_IDS = "item_ids.parquet"
"""The artifact's item raw-id map (``encodings/item_ids.parquet``, ``recformer export --item-ids``):
its ``value`` column holds each item id's raw id (what requests name items by), in id order."""

INT_DTYPES = (np.int8, np.int16, np.int32)


def narrowest(top_row: int, dtypes: tuple[type, ...] = INT_DTYPES) -> type:
    """The narrowest of ``dtypes`` that holds ``top_row``."""
    return next(t for t in dtypes if top_row <= np.iinfo(t).max)


@dataclass
class History:
    """A window's history, still ragged as the Arrow list columns hold it: row ``i``'s events are
    positions ``off[i]:off[i + 1]`` of every value array (aligned lists share offsets). Values are
    table rows already (one sequential pass per column at decode, ``kernels.map_ids`` /
    ``map_gaps``, which also checks them), in the narrowest dtype that holds them:
    ``kernels.gather_events`` then only copies each batch's rows. Slicing rows shares the arrays.

    Mapping at decode rather than per batch: the batch kernel reads 4 bytes per event instead of 9
    (int32 id, int8 action, float32 gap) and does no arithmetic, and a window takes half the
    memory, which matters when several workers share one L3 cache."""

    off: np.ndarray  # int64 [S + 1]
    items: np.ndarray  # [N] item rows (Encoder.item_dtype); 0 = OOV
    cats: np.ndarray  # [C, N] event-categorical rows (field-major, Encoder.cat_dtype); 0 = OOV
    gaps: np.ndarray  # [N] time-gap bucket rows (uint8), or [0] without a time-gap column

    def slice(self, lo: int, hi: int) -> History:
        return History(self.off[lo : hi + 1], self.items, self.cats, self.gaps)


Columns = Callable[[str], pa.Array]
"""A column of the rows being encoded, by name."""


class Encoder:
    """Encodes raw columns that follow ``spec``.

    ``item_ids``: raw item ids in item-id order (the artifact's item map, ``ITEM_IDS``), looked up
    like an item vocabulary for the target and history items; ``gap_unit_s``: the time-gap unit
    (the artifact's, when serving one)."""

    def __init__(self, spec: FeatureSpec, item_ids: pa.Array | None = None, gap_unit_s: float = GAP_UNIT_S):
        self.spec = spec
        seq = spec.sequence
        self.max_len = seq.max_len if seq else 0
        events = seq.categorical if seq else []
        # Raw values to ids, by column: the string and file vocabularies (``data/vocab.py``).
        fields = [*spec.categorical, *events, *spec.item.features, *spec.bags]
        self.vocabs = {f.name: v for f in fields if (v := field_vocab(spec, f)) is not None}
        items = item_vocab(spec)
        if items is not None and item_ids is not None:
            raise DataError("an item raw-id map was given; the spec's item.vocab_file maps raw ids already")
        if items is not None:
            self.vocabs.update({c: items for c in (spec.item.column, spec.item.side_id_column)})
        elif item_ids is not None:  # serving: the side table lives inside the exported model
            items = self.vocabs[spec.item.column] = item_ids
        if items is not None and seq is not None:
            self.vocabs[seq.item_column] = items
        self.item_limit = spec.item.vocab_size + spec.item.cold_items  # side rows: cold items have theirs
        self.item_dtype = narrowest(self.item_limit, (np.int16, np.int32))
        self.cat_dtype = narrowest(max((f.rows for f in events), default=0))
        self.gap_buckets = seq.time_gap_buckets if seq and seq.time_gap_column else 0
        self.gap_unit_s = gap_unit_s

    def oov_fields(self) -> list[str]:
        """Names of the id fields whose unknown ids are counted, in ``row_oov`` column order, then
        the history's."""
        names = [self.spec.item.column] + [f.name for f in self.spec.categorical]
        names += [f.name for f in self.spec.bags]
        if self.spec.sequence:
            names += [self.spec.sequence.item_column] + [f.name for f in self.spec.sequence.categorical]
        return names

    # -- the model's per-row inputs ------------------------------------------------------------
    def row_features(self, col: Columns, n: int, where: Where) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """The model's per-row fields of ``n`` rows (``target_item``, ``cat``, ``bag``, ``dense``,
        ``emb``) and ``row_oov`` (an unknown-id flag per row and id field), each checked, by name;
        and per bag field the values past its ``max_values`` that were left out."""
        spec = self.spec
        target, oov = self.item_rows(col(spec.item.column), spec.item.column, where)
        oov_cols = [oov]
        cat = np.zeros((n, len(spec.categorical)), np.int32)
        for j, f in enumerate(spec.categorical):
            cat[:, j], oov = self.cat_rows(col(f.name), f, where)
            oov_cols.append(oov)
        bags = [self.value_rows(col(f.name), f, where) for f in spec.bags]
        oov_cols += [unknown for _, unknown, _ in bags]
        values = {"target_item": target, "cat": cat, "dense": self.dense(col, n, where)}
        bag = [b for b, _, _ in bags]
        values["bag"] = np.concatenate(bag, axis=1) if bags else np.zeros((n, 0), np.int32)
        embs = [self.fixed_vectors(col(f.name), f.dim, f.name, where) for f in spec.embedding]
        values["emb"] = np.concatenate(embs, axis=1) if embs else np.zeros((n, 0), np.float32)
        values["row_oov"] = np.stack(oov_cols, axis=1) if n else np.zeros((0, len(oov_cols)), np.int32)
        return values, np.array([cut for _, _, cut in bags], np.int64)

    def cat_rows(self, arr: pa.Array, f: CategoricalField, where: Where) -> tuple[np.ndarray, np.ndarray]:
        """Table rows (int32) and an OOV flag per value; nulls count as OOV."""
        if pa.types.is_dictionary(arr.type):
            arr = arr.dictionary_decode()
        valid = None
        if f.name not in self.vocabs and arr.null_count:  # a vocabulary lookup maps nulls to OOV itself
            valid = arr.is_valid().to_numpy(zero_copy_only=False)
            arr = pc.fill_null(arr, 0)
        ids = self.raw_ids(arr, f.name, where, f)
        rows = self.rows(ids, f.vocab_size, np.empty(len(ids), np.int32), where, f.name)
        if valid is not None:
            rows[~valid] = 0
        return rows, rows == 0

    def value_rows(
        self, arr: pa.Array, f: CategoricalField, where: Where
    ) -> tuple[np.ndarray, np.ndarray, int]:
        """A list column of ids (a bag, a multi-valued item feature) as its first ``f.max_values``
        table rows per row, -1 where a row has fewer: int32 [n, max_values]; each row's unknown
        ids (mapped to the OOV row, counted); and how many values past ``max_values`` were left
        out. A null list is a row without values."""
        if pa.types.is_large_list(arr.type):
            arr = arr.cast(pa.list_(arr.type.value_type))
        if arr.null_count:
            arr = pc.if_else(arr.is_null(), pa.scalar([], arr.type), arr)
        off = list_offsets(arr, where, f.name)
        rows, unknown = self.cat_rows(arr.values.slice(int(off[0]), int(off[-1] - off[0])), f, where)
        M, lens = f.max_values, np.diff(off)
        kept = np.minimum(lens, M)
        at_M = np.arange(M)
        idx = (off[:-1] - off[0])[:, None] + at_M[None, :]
        mask = at_M[None, :] < kept[:, None]
        safe = np.minimum(idx, max(len(rows) - 1, 0))
        out = np.where(mask, rows[safe] if len(rows) else 0, -1).astype(np.int32)
        n_unknown = np.where(mask, unknown[safe] if len(rows) else False, False).sum(axis=1).astype(np.int32)
        return out, n_unknown, int((lens - kept).sum())

    def item_rows(self, arr: pa.Array, col: str, where: Where) -> tuple[np.ndarray, np.ndarray]:
        """Item rows (int32: side-table rows, which cold items have too) and an unknown flag per value."""
        if arr.null_count:
            raise DataError(f"{where}: item id column {col!r} has {arr.null_count} null(s)")
        ids = self.raw_ids(arr, col, where)
        rows = self.rows(ids, self.item_limit, np.empty(len(ids), np.int32), where, col)
        return rows, rows == 0

    @staticmethod
    def rows(ids: np.ndarray, limit: int, out: np.ndarray, where: Where, name: str) -> np.ndarray:
        """``out`` = table rows of ids (``kernels.map_ids``: ``id + 1``, OOV row 0 from ``limit``
        on), in ``out``'s dtype; negative ids are rejected, naming the column."""
        if kernels.map_ids(ids, limit, out) < 0:
            check_nonneg_ids(ids, where, name)  # raises
        return out

    def dense(self, col: Columns, n: int, where: Where) -> np.ndarray:
        dense = np.zeros((n, len(self.spec.dense)), np.float32)
        for j, f in enumerate(self.spec.dense):
            x = numeric(col(f.name), where, f.name)
            check_finite(x, where, f.name)
            if f.log1p:
                x = np.sign(x) * np.log1p(np.abs(x))
            dense[:, j] = cast_finite((x - f.mean) / f.std, np.float32, where, f.name, " after normalisation")
        return dense

    def fixed_vectors(self, arr: pa.Array, dim: int, name: str, where: Where) -> np.ndarray:
        off = list_offsets(arr, where, name)
        lens = np.diff(off)
        if len(lens) and (lens != dim).any():
            i = int(np.flatnonzero(lens != dim)[0])
            raise DataError(
                f"{where}: column {name!r} row {i} has {lens[i]} values; "
                f"the spec says dim={dim} for every row"
            )
        inner = arr.values.slice(int(off[0]), int(off[-1] - off[0]))
        if inner.null_count:
            raise DataError(f"{where}: column {name!r} holds {inner.null_count} null element(s)")
        vals = inner.to_numpy(zero_copy_only=False).reshape(len(arr), dim)
        check_finite(vals, where, name)
        return cast_finite(vals, np.float32, where, name)

    # -- the history ---------------------------------------------------------------------------
    def sequence(self, col: Columns, n: int, where: Where) -> History | None:
        """The history columns, checked and still ragged, as table rows (see ``History``)."""
        s = self.spec.sequence
        if s is None:
            return None
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

        def flat(name: str, o: np.ndarray) -> pa.Array:
            # The values of this slice of rows only; offsets are re-based to start at 0.
            vals = col(name).values.slice(o[0], o[-1] - o[0]) if n else pa.array([], pa.int64())
            if vals.null_count:
                raise DataError(f"{where}: list column {name!r} holds {vals.null_count} null element(s)")
            return vals.dictionary_decode() if pa.types.is_dictionary(vals.type) else vals

        n_events = int(off[-1] - off[0])
        cats = np.empty((len(s.categorical), n_events), self.cat_dtype)
        for j, f in enumerate(s.categorical):
            ids = self.raw_ids(flat(f.name, offsets[f.name]), f.name, where, f)
            self.rows(ids, f.vocab_size, cats[j], where, f.name)
        gaps = np.zeros(0, np.uint8)
        if s.time_gap_column:
            o = offsets[s.time_gap_column]
            gaps = self.gap_rows(flat(s.time_gap_column, o), o - o[0], where)
        ids = self.raw_ids(flat(s.item_column, off), s.item_column, where)
        items = self.rows(ids, self.item_limit, np.empty(n_events, self.item_dtype), where, s.item_column)
        return History(off - off[0], items, cats, gaps)

    def raw_ids(
        self, arr: pa.Array, name: str, where: Where, f: CategoricalField | None = None
    ) -> np.ndarray:
        """Ids of an array (not yet checked: ``kernels.map_ids`` does, as it maps them); the values of
        a column with a vocabulary (a list, or a file) become their index in it, unknown values and
        nulls its length (``map_ids``' OOV test is ``id >= limit``); other arrays must be null-free."""
        vocab = self.vocabs.get(name)
        if vocab is not None:
            idx = lookup(arr, vocab, name, where)
            return pc.fill_null(idx, len(vocab)).to_numpy(zero_copy_only=False)
        if pa.types.is_integer(arr.type):
            ids = arr.to_numpy(zero_copy_only=False)  # zero-copy view of the Arrow buffer
        else:
            ids = numeric(arr, where, name, np.int64)
        return ids

    def gap_rows(self, arr: pa.Array, off: np.ndarray, where: Where) -> np.ndarray:
        """Time-gap bucket rows (uint8) of gaps in seconds, checked finite and >= 0 in the same
        compiled pass."""
        name = self.spec.sequence.time_gap_column
        gaps = arr.to_numpy(zero_copy_only=False)
        if gaps.dtype == np.float16 or gaps.dtype.kind not in "iuf":  # the kernel takes int / f32 / f64
            gaps = gaps.astype(np.float32 if gaps.dtype == np.float16 else np.float64)
        rows = np.empty(len(gaps), np.uint8)
        nonfinite, negative = kernels.map_gaps(gaps, self.gap_unit_s, self.gap_buckets, rows)
        if nonfinite:
            bad = np.searchsorted(off, np.flatnonzero(~np.isfinite(gaps)), side="right") - 1
            raise DataError(
                f"{where}: column {name!r} has NaN or Inf in {len(np.unique(bad))} row(s) (first at batch "
                f"row {bad[0]}); expected finite values"
            )
        if negative:
            raise DataError(f"{where}: column {name!r} has negative time gaps; expected seconds >= 0")
        return rows


# ----------------------------------------------------------------------------------------------
# The item raw-id map of an artifact
# ----------------------------------------------------------------------------------------------


def item_raw_ids(spec: FeatureSpec, column: str) -> pa.Array:
    """Each item id's raw id, in id order, from ``column`` of the spec's side table: the map a
    server needs when the logs' item ids are not what requests carry (MovieLens: ``item_id`` is
    the rank of ``movie_id``). Every item id must have one row, and raw ids must be unique."""
    it = spec.item
    if it.vocab_file is not None:
        raise DataError(f"item.vocab_file={it.vocab_file!r} maps raw item ids already; drop --item-ids")
    path = spec.side_table_path()
    if path is None:
        raise DataError("--item-ids names a column of the item side table; the spec has no item.side_table")
    schema = pq.read_schema(path)
    if column not in schema.names:
        raise DataError(f"--item-ids {column!r}: item side table {path} has no such column ({schema.names})")
    table = pq.read_table(path, columns=[it.side_id_column, column], page_checksum_verification=True)
    ids_col = table.column(it.side_id_column).combine_chunks()
    ids = numeric(ids_col, Where(str(path)), it.side_id_column, np.int64)
    raw = table.column(column).combine_chunks()
    if raw.null_count or not (pa.types.is_integer(raw.type) or pa.types.is_string(raw.type)):
        raise DataError(
            f"--item-ids {column!r} in {path}: expected null-free integers or strings, found {raw.type}"
        )
    n = it.vocab_size + it.cold_items
    if len(ids) != n or not np.array_equal(np.sort(ids), np.arange(n)):
        raise DataError(
            f"--item-ids {column!r}: {path} must hold each item id 0..{n - 1} once (item.vocab_size + "
            f"item.cold_items) to map every item; it has {len(ids)} row(s)"
        )
    if len(pc.unique(raw)) != len(raw):
        raise DataError(f"--item-ids {column!r} in {path}: raw ids are not unique")
    return raw.take(pa.array(np.argsort(ids)))


def manifest_entry(item_ids: str | None) -> dict[str, object]:
    """How the encoder turns raw values into the model's inputs, for an artifact's manifest: its
    constants and its formulas (the spec in ``encodings/`` holds the statistics and sizes);
    ``item_ids``: the file of the item raw-id map under ``encodings/``, if the artifact has one."""
    return {
        "ids": "vocabulary row + 1 (raw ids through encodings/vocab/ where the spec names a file); 0 = OOV",
        "item_ids": f"encodings/{item_ids}" if item_ids else None,
        "dense": "(f(x) - mean) / std with f(x) = sign(x) * log1p(|x|) where log1p, else x",
        "history": "the newest sequence.max_len events, oldest first, left-padded with row 0",
        "time_gap_unit_s": GAP_UNIT_S,
        "time_gap_row": "1 + min(floor(log2(1 + gap_s / time_gap_unit_s)), time_gap_buckets - 1); 0 = pad",
    }


def write_item_ids(raw: pa.Array, path: Path) -> None:
    """The map as a vocabulary file (``value`` column, id order), read back by ``read_item_ids``."""
    pq.write_table(pa.table({VALUE: raw}), path)


def read_item_ids(path: Path, spec: FeatureSpec) -> pa.Array:
    """An artifact's item raw-id map, checked against ``spec`` as a vocabulary file is."""
    return read_vocab(path, spec.item.vocab_size + spec.item.cold_items, f"the item raw-id map {path.name}")
