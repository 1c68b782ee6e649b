"""Checking Parquet logs against a FeatureSpec before the first batch.

Two layers, both reporting the file, the column (and row group) and what was expected:
- ``check_schema``: each file's Arrow schema against the spec (types, presence), from the footer only.
- the value checks (``check_label``, ``check_finite``, ``check_nonneg_ids``, ``numeric``,
  ``list_offsets``): what a footer cannot prove (label range and nulls, negative ids, NaN/Inf, aligned
  list lengths, embedding sizes). The decoder runs them on every row group it reads, so
  ``validate="footer"`` only moves the error from set-up to the batch that holds the value.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.types as pat

from recformer.batch import DataError
from recformer.config import CategoricalField, FeatureSpec


@dataclass(frozen=True)
class Where:
    """A place in the data, for error messages."""

    file: str
    row_group: int | None = None

    def __str__(self) -> str:
        return self.file if self.row_group is None else f"{self.file} (row group {self.row_group})"


# ----------------------------------------------------------------------------------------------
# Types
# ----------------------------------------------------------------------------------------------


def required(schema: pa.Schema) -> pa.Schema:
    """``schema`` with every column, and every list column's elements, declared non-null.

    The log writers (``synth``, ``movielens``) never write nulls and say so in the file: Parquet then
    stores no definition levels for those columns, and pyarrow skips rebuilding validity bitmaps
    from them when it reads, about a fifth of the read (``bench/bench_loader.py``, "Design
    measurements"). Readers accept nullable files all the same (the
    value checks reject the nulls that matter)."""

    def strict(t: pa.DataType) -> pa.DataType:
        if pat.is_list(t) or pat.is_large_list(t) or pat.is_fixed_size_list(t):
            element = t.value_field.with_type(strict(t.value_type)).with_nullable(False)
            if pat.is_fixed_size_list(t):
                return pa.list_(element, t.list_size)
            return pa.large_list(element) if pat.is_large_list(t) else pa.list_(element)
        return t

    return pa.schema(
        [f.with_type(strict(f.type)).with_nullable(False) for f in schema], metadata=schema.metadata
    )


CHECKSUMS = {"write_page_checksum": True}
"""Writer options every log writer passes: a CRC-32 per data page, which every reader here verifies
(``page_checksum_verification``). Without it a flipped bit in a page mostly decodes to another valid
value, trained on silently; with it the read is refused (``tests/test_faults.py`` flips 40 bits both
ways)."""


def _is_int(t: pa.DataType) -> bool:
    return pat.is_integer(t) or (pat.is_dictionary(t) and pat.is_integer(t.value_type))


def _is_str(t: pa.DataType) -> bool:
    return (
        pat.is_string(t) or pat.is_large_string(t) or (pat.is_dictionary(t) and pat.is_string(t.value_type))
    )


def _is_num(t: pa.DataType) -> bool:
    return pat.is_integer(t) or pat.is_floating(t) or pat.is_boolean(t)


def _is_list_of(pred: Callable[[pa.DataType], bool]) -> Callable[[pa.DataType], bool]:
    def check(t: pa.DataType) -> bool:
        is_list = pat.is_list(t) or pat.is_large_list(t) or pat.is_fixed_size_list(t)
        return is_list and pred(t.value_type)

    return check


_FLOAT_VEC = _is_list_of(lambda t: pat.is_floating(t))


def _raw_id(t: pa.DataType) -> bool:
    return _is_int(t) or _is_str(t)


def _cat_check(f: CategoricalField) -> tuple[Callable[[pa.DataType], bool], str]:
    if f.vocab_file is not None:  # raw values through the file: strings or any integers
        return _raw_id, "string or integer (its vocabulary file's kind)"
    return (_is_str, "string") if f.vocab is not None else (_is_int, "integer")


def _item_check(spec: FeatureSpec) -> tuple[Callable[[pa.DataType], bool], str]:
    if spec.item.vocab_file is not None:
        return _raw_id, "string or integer item id (the item vocabulary file's kind)"
    return _is_int, "integer item id"


def expected_types(spec: FeatureSpec) -> dict[str, tuple[Callable[[pa.DataType], bool], str]]:
    """Column -> (type predicate, human description of the expected type)."""
    exp: dict[str, tuple[Callable[[pa.DataType], bool], str]] = {
        spec.label: (_is_num, "int, bool or float in [0, 1]"),
        spec.item.column: _item_check(spec),
    }
    if spec.weight:
        exp[spec.weight] = (_is_num, "float >= 0")
    if spec.group:
        exp[spec.group] = (lambda t: _is_int(t) or _is_str(t), "integer or string")
    for f in spec.categorical:
        exp[f.name] = _cat_check(f)  # as the group too: an id or vocabulary string is a valid group
    for f in spec.dense:
        exp[f.name] = (_is_num, "float")
    for f in spec.embedding:
        exp[f.name] = (_FLOAT_VEC, f"list of float (length {f.dim})")
    for f in spec.bags:
        pred, desc = _cat_check(f)
        exp[f.name] = (_is_list_of(pred), f"list of {desc} (a bag)")
    # Keys reach the predictions through Batch.keys (int64): integers as they are, strings as their
    # row's position (key_values). A float key would be truncated: refused.
    for k in spec.keys:
        if k in exp:
            pred, desc = exp[k]
            exp[k] = (lambda t, pred=pred: pred(t) and _raw_id(t), f"{desc}, and integer or string as a key")
        else:
            exp[k] = (_raw_id, "integer or string (key columns are copied to predictions)")
    if spec.sequence is not None:
        s = spec.sequence
        pred, desc = _item_check(spec)
        exp[s.item_column] = (_is_list_of(pred), f"list of {desc}s")
        for f in s.categorical:
            pred, desc = _cat_check(f)
            exp[f.name] = (_is_list_of(pred), f"list of {desc}")
        if s.time_gap_column:
            exp[s.time_gap_column] = (_is_list_of(_is_num), "list of float seconds >= 0")
    return exp


def check_schema(spec: FeatureSpec, schema: pa.Schema, where: Where) -> None:
    """Every spec column is present with an acceptable type."""
    names = set(schema.names)
    missing = [c for c in spec.columns() if c not in names]
    if missing:
        raise DataError(
            f"{where}: column(s) {missing} named by the feature spec ({spec.path or 'spec'}) are missing; "
            f"the file has {sorted(names)}"
        )
    for col, (pred, desc) in expected_types(spec).items():
        found = schema.field(col).type
        if not pred(found):
            raise DataError(f"{where}: column {col!r} has type {found}, expected {desc}")


def check_side_table_schema(spec: FeatureSpec, schema: pa.Schema, where: Where) -> None:
    """The item side table has the spec's item columns (``item.*``), with their types."""
    it = spec.item
    exp = {it.side_id_column: _item_check(spec)}
    if it.content_column:
        exp[it.content_column] = (_FLOAT_VEC, f"list of float (length {it.content_dim})")
    for f in it.features:
        pred, desc = _cat_check(f)
        exp[f.name] = (
            (_is_list_of(pred), f"list of {desc} (max_values={f.max_values})")
            if f.max_values > 1
            else (pred, desc)
        )
    missing = [c for c in exp if c not in schema.names]
    if missing:
        raise DataError(
            f"{where}: column(s) {missing} named by item.* in the spec ({spec.path or 'spec'}) are missing; "
            f"the side table has {sorted(schema.names)}"
        )
    for col, (pred, desc) in exp.items():
        if not pred(schema.field(col).type):
            raise DataError(f"{where}: column {col!r} has type {schema.field(col).type}, expected {desc}")


# ----------------------------------------------------------------------------------------------
# Values
# ----------------------------------------------------------------------------------------------


def list_offsets(arr: pa.Array, where: Where, col: str) -> np.ndarray:
    """Offsets (int64, len B+1, starting wherever the slice starts) of a list array; nulls rejected."""
    if arr.null_count:
        raise DataError(f"{where}: column {col!r} has {arr.null_count} null list(s); expected a list per row")
    if pat.is_fixed_size_list(arr.type):
        n = arr.type.list_size
        return (np.arange(len(arr) + 1, dtype=np.int64) + arr.offset) * n
    return np.asarray(arr.offsets, dtype=np.int64)


def numeric(arr: pa.Array, where: Where, col: str, dtype: type = np.float64) -> np.ndarray:
    """A primitive column as numpy, rejecting nulls (with the column named)."""
    if arr.null_count:
        raise DataError(f"{where}: column {col!r} has {arr.null_count} null value(s)")
    if pat.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    return arr.to_numpy(zero_copy_only=False).astype(dtype, copy=False)


def _is_uint64(t: pa.DataType) -> bool:
    return pat.is_uint64(t) or (pat.is_dictionary(t) and pat.is_uint64(t.value_type))


def key_kinds(spec: FeatureSpec, schema: pa.Schema) -> dict[str, str]:
    """How each key column of ``schema`` travels in ``Batch.keys`` (int64): ``uint64`` as the same
    64 bits, written back as uint64 (64-bit hashed ids); ``string`` as its row's position
    (``key_values``); ``signed`` as it is."""
    kinds = {}
    for k in spec.keys:
        t = schema.field(k).type
        kinds[k] = "string" if _is_str(t) else "uint64" if _is_uint64(t) else "signed"
    return kinds


def key_values(arr: pa.Array, where: Where, col: str, first_row: int) -> np.ndarray:
    """A key column as int64, every value kept: uint64 keys as their bits (``unsigned_keys``), not
    cast, which would wrap those past 2**63 to negative ones; a string key as each row's position
    in the split (its rows start at ``first_row``), by which the prediction writer takes the
    string back (``RecDataModule.string_keys``)."""
    if _is_str(arr.type):
        return np.arange(first_row, first_row + len(arr), dtype=np.int64)
    if _is_uint64(arr.type):
        return numeric(arr, where, col, np.uint64).view(np.int64)
    return numeric(arr, where, col, np.int64)


def check_finite(x: np.ndarray, where: Where, col: str) -> None:
    """Reject NaN/Inf, naming the first offending row of the record batch."""
    ok = np.isfinite(x)
    if not ok.all():
        bad_rows = np.flatnonzero(~ok.reshape(len(x), -1).all(axis=1))
        raise DataError(
            f"{where}: column {col!r} has NaN or Inf in {len(bad_rows)} row(s) (first at batch row "
            f"{bad_rows[0]}); expected finite values"
        )


def cast_finite(x: np.ndarray, dtype: type, where: Where, col: str, what: str = "") -> np.ndarray:
    """``x`` (finite, checked) in ``dtype``, rejecting values beyond its range, which the cast
    would turn into Inf (float32 past 3.4e38, float16 past 65504); ``what`` says what ``x`` is
    when it is not the column's own values (e.g. " after normalisation")."""
    with np.errstate(over="ignore"):  # the overflow is reported below, with its column and row
        out = x.astype(dtype, copy=False)
    ok = np.isfinite(out)
    if not ok.all():
        bad_rows = np.flatnonzero(~ok.reshape(len(x), -1).all(axis=1))
        flat = x.reshape(len(x), -1)[bad_rows[0]]
        value = flat[~np.isfinite(out.reshape(len(x), -1)[bad_rows[0]])][0]
        raise DataError(
            f"{where}: column {col!r}{what} has values beyond {np.dtype(dtype).name}'s range "
            f"(|x| <= {float(np.finfo(dtype).max):.4g}) in {len(bad_rows)} row(s) (first at batch row "
            f"{bad_rows[0]}: {value:.4g})"
        )
    return out


def check_label(y: np.ndarray, where: Where, col: str) -> None:
    check_finite(y, where, col)
    if len(y) and (y.min() < 0 or y.max() > 1):
        bad = np.flatnonzero((y < 0) | (y > 1))
        raise DataError(
            f"{where}: label column {col!r} has {len(bad)} value(s) outside [0, 1] (e.g. {y[bad[0]]}); "
            "expected a probability or 0/1 label"
        )


def check_nonneg_ids(ids: np.ndarray, where: Where, col: str) -> None:
    if len(ids) and ids.min() < 0:
        raise DataError(f"{where}: column {col!r} has negative id(s) (min {ids.min()}); expected ids >= 0")
