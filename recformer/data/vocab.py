"""Vocabulary files: raw ids (strings, or integers of any range) to the ids the model embeds.

A field with ``vocab_file`` (``CategoricalField``, ``BagField``, ``ItemSpec``) names a Parquet file,
relative to the spec, whose ``value`` column lists the known raw values in id order (row i = id i);
``recformer data vocab`` fits it on the train split (``recformer.datasets.vocab``). The loader maps
every raw value through it (``pc.index_in``); a value not in it goes to the OOV row and is counted.
The item vocabulary serves the target column, the history column and the side table's id column
alike: the items trained on first (``item.vocab_size`` of them), then the cold ones the side table
adds (``item.cold_items``).
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from recformer.batch import DataError
from recformer.config import VOCAB_DIGEST, CategoricalField, FeatureSpec

VALUE = "value"
"""The column of a vocabulary file holding the raw values, in id order."""
COUNT = "count"
"""Optional column: how often the value occurred in the split the vocabulary was fit on."""


def vocab_path(spec: FeatureSpec, name: str) -> Path:
    base = Path(spec.path).parent if spec.path else Path(".")
    return base / name


def item_vocab(spec: FeatureSpec) -> pa.Array | None:
    """The item vocabulary's values (trained items, then cold ones), or None without a file."""
    it = spec.item
    if it.vocab_file is None:
        return None
    return read_vocab(vocab_path(spec, it.vocab_file), it.vocab_size + it.cold_items, "item.vocab_file")


def field_vocab(spec: FeatureSpec, f: CategoricalField) -> pa.Array | None:
    """A field's vocabulary values: its ``vocab`` list, its ``vocab_file``, or None (integer ids)."""
    if f.vocab is not None:
        return pa.array(f.vocab, pa.string())
    if f.vocab_file is None:
        return None
    return read_vocab(vocab_path(spec, f.vocab_file), f.vocab_size, f"{f.name}.vocab_file")


def digest(values: pa.Array) -> str:
    """A short digest of a vocabulary's values in order (what ``FeatureDims.encoding`` keeps)."""
    text = "\n".join(str(v) for v in values.to_pylist())
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def _id_fields(spec: FeatureSpec) -> list[CategoricalField]:
    """Every categorical field (context, history event, item side feature, bag)."""
    events = spec.sequence.categorical if spec.sequence else []
    return [*spec.categorical, *events, *spec.item.features, *spec.bags]


def vocab_files(spec: FeatureSpec) -> list[str]:
    """Every ``vocab_file`` the spec names (relative to it), the item's last."""
    files = [f.vocab_file for f in _id_fields(spec) if f.vocab_file is not None]
    return files + ([spec.item.vocab_file] if spec.item.vocab_file is not None else [])


def encodings(spec: FeatureSpec) -> dict[str, str]:
    """``FeatureDims.encoding`` of ``spec`` with its vocabulary files read: each dense column's
    normalisation and each vocabulary's digest (a file's order decides which row a raw value
    reads, as a list's does)."""
    out = spec.encoding()
    for f in _id_fields(spec):
        if f.vocab_file is not None:
            out[f.name] = VOCAB_DIGEST + digest(field_vocab(spec, f))
    if spec.item.vocab_file is not None:
        out[spec.item.column] = VOCAB_DIGEST + digest(item_vocab(spec))
    return out


@functools.lru_cache(maxsize=64)
def _read(path: str, mtime_ns: int) -> pa.Array:
    try:
        table = pq.read_table(path, columns=[VALUE], page_checksum_verification=True)
    except (pa.ArrowInvalid, OSError, KeyError) as e:
        raise DataError(
            f"vocabulary {path}: not a readable Parquet file with a {VALUE!r} column ({e})"
        ) from None
    return table.column(VALUE).combine_chunks()


def read_vocab(path: Path, size: int, setting: str) -> pa.Array:
    """The ``value`` column of the vocabulary file at ``path``, checked: it exists, holds strings or
    integers, no nulls, no duplicates, and exactly ``size`` values (what the spec says)."""
    if not path.is_file():
        raise FileNotFoundError(
            f"{setting}: vocabulary {path} does not exist; `recformer data vocab DIR` fits it on the "
            "train split and writes it there"
        )
    values = _read(str(path), path.stat().st_mtime_ns)
    t = values.type
    if pa.types.is_dictionary(t):
        values, t = values.dictionary_decode(), t.value_type
    if not (pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_large_string(t)):
        raise DataError(f"vocabulary {path}: column {VALUE!r} has type {t}, expected strings or integers")
    if values.null_count:
        raise DataError(f"vocabulary {path}: column {VALUE!r} has {values.null_count} null(s)")
    if len(values) != size:
        raise DataError(
            f"vocabulary {path} holds {len(values)} values, the spec says {size} ({setting}); fit it "
            "again with `recformer data vocab DIR`, which writes both"
        )
    if len(pc.unique(values)) != len(values):
        raise DataError(f"vocabulary {path}: column {VALUE!r} has duplicate values")
    return values.cast(pa.int64()) if pa.types.is_integer(t) else values.cast(pa.string())


def lookup(arr: pa.Array, vocab: pa.Array, column: str, where: object) -> pa.Array:
    """Each value's index in ``vocab`` (int32; null where it is absent), for ``arr`` of the matching
    kind (strings for a string vocabulary, integers for an integer one)."""
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    strings = pa.types.is_string(vocab.type)
    if strings != (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
        kind = "strings" if strings else "integers"
        raise DataError(f"{where}: column {column!r} holds {arr.type} values, its vocabulary holds {kind}")
    arr = arr.cast(vocab.type) if arr.type != vocab.type else arr
    return pc.index_in(arr, value_set=vocab)
