"""``recformer data vocab DIR``: fit the vocabularies a spec names (``vocab_file``) on the train split.

Logs keep their raw ids: strings, or integers of any range (hashed or sparse ids). A field of
``DIR/spec.yaml`` that names a ``vocab_file`` (a context categorical, a bag, an event categorical,
an item side feature, or the item itself) gets that file written here: its ``value`` column lists
the values seen in the train split, most frequent first (ties by value), its ``count`` column how
often; ``vocab_size`` in the spec is set to match. Values seen fewer than ``--min-count`` times, or
past the ``--max-size`` most frequent, are left out: at train and serve time they share the OOV
row, which then learns what a rare value is.

The item vocabulary counts the target column and the history column of the train split together.
Items the side table holds but that vocabulary leaves out (new items, rare ones) follow as cold
items (``item.cold_items``): their id embedding is the OOV row, their side features and content
their own. Side features are fit on the side table itself.

Files that exist are kept unless ``--refit``. The loader maps every raw value through these files
(``recformer.data.vocab``); ``recformer data build`` fits them the same way.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import yaml

from recformer.config import FeatureSpec
from recformer.data.schema import CHECKSUMS
from recformer.data.shards import list_split_files
from recformer.data.vocab import COUNT, VALUE


@dataclass
class Fitted:
    """One vocabulary written: where, how many values, and what it covers."""

    setting: str
    path: Path
    size: int
    distinct: int
    coverage: float
    """Share of the counted occurrences whose value the vocabulary keeps."""
    cold: int = 0


def count_values(files: list[Path], columns: list[str]) -> pa.Table:
    """``value``, ``count`` of every value of ``columns`` (list columns flattened) over ``files``,
    a row group at a time (memory: the distinct values)."""
    parts = []
    for path in files:
        pf = pq.ParquetFile(path, page_checksum_verification=True)
        for g in range(pf.metadata.num_row_groups):
            table = pf.read_row_group(g, columns=columns, use_threads=False)
            for name in columns:
                arr = table.column(name).combine_chunks()
                if pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type):
                    arr = pc.list_flatten(arr)
                arr = arr.dictionary_decode() if pa.types.is_dictionary(arr.type) else arr
                vc = pc.value_counts(arr.drop_null())
                parts.append(pa.table({VALUE: vc.field("values"), COUNT: vc.field("counts")}))
    if not parts:
        return pa.table({VALUE: pa.array([], pa.int64()), COUNT: pa.array([], pa.int64())})
    tables = [_normalise(t) for t in parts]
    merged = pa.concat_tables(tables).group_by(VALUE).aggregate([(COUNT, "sum")])
    return merged.rename_columns([VALUE, COUNT])


def _normalise(t: pa.Table) -> pa.Table:
    """One value type for every part: int64 for integers, string for strings."""
    kind = pa.int64() if pa.types.is_integer(t.schema.field(VALUE).type) else pa.string()
    return pa.table({VALUE: t.column(VALUE).cast(kind), COUNT: t.column(COUNT).cast(pa.int64())})


def keep(counts: pa.Table, min_count: int, max_size: int | None) -> pa.Table:
    """The kept values, most frequent first, ties by value."""
    kept = counts.filter(pc.greater_equal(counts.column(COUNT), min_count))
    kept = kept.sort_by([(COUNT, "descending"), (VALUE, "ascending")])
    return kept.slice(0, max_size) if max_size is not None else kept


def fit_column(files: list[Path], column: str, path: Path, min_count: int = 1) -> int:
    """Fit one column's vocabulary on ``files``, write it to ``path``; return its size."""
    kept = keep(count_values(files, [column]), min_count, None)
    write_vocab(path, kept)
    return len(kept)


def write_vocab(path: Path, table: pa.Table) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, compression="zstd", **CHECKSUMS)


def _fields(raw: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any], str]]:
    """(setting, field mapping, where its values are counted) of every field naming a vocab_file:
    ``train`` (a log column), or ``side`` (an item feature of the side table)."""
    for key in ("categorical", "bags"):
        for i, f in enumerate(raw.get(key) or []):
            if f.get("vocab_file"):
                yield f"{key}[{i}] {f['name']}", f, "train"
    for i, f in enumerate((raw.get("sequence") or {}).get("categorical") or []):
        if f.get("vocab_file"):
            yield f"sequence.categorical[{i}] {f['name']}", f, "train"
    for i, f in enumerate((raw.get("item") or {}).get("features") or []):
        if f.get("vocab_file"):
            yield f"item.features[{i}] {f['name']}", f, "side"


def fit(
    root: Path,
    min_count: int = 1,
    max_size: int | None = None,
    refit: bool = False,
    min_counts: dict[str, int] | None = None,
) -> list[Fitted]:
    """Fit every vocabulary ``root/spec.yaml`` names that is missing (all with ``refit``), write them
    and the sizes they set into the spec; return what was written. ``min_counts``: a column's own
    ``min_count`` (``recformer data build`` bounds the user-id table so)."""
    spec_path = root / "spec.yaml"
    raw = yaml.safe_load(spec_path.read_text())
    train = list_split_files(root, "train")
    side = root / raw["item"]["side_table"] if (raw.get("item") or {}).get("side_table") else None
    done = []
    for setting, f, source in _fields(raw):
        path = root / f["vocab_file"]
        if path.is_file() and not refit:
            continue
        if source == "side" and side is None:
            raise ValueError(f"{setting}: an item feature with a vocab_file needs item.side_table")
        counts = count_values([side] if source == "side" else train, [f["name"]])
        least = (min_counts or {}).get(f["name"], min_count)
        done.append(_write(setting, path, counts, keep(counts, least, max_size)))
        f["vocab_size"] = done[-1].size
    item = raw.get("item") or {}
    if item.get("vocab_file") and (refit or not (root / item["vocab_file"]).is_file()):
        done.append(_fit_items(root, raw, train, side, min_count, max_size))
    FeatureSpec(**raw)  # what the loader will read must validate
    spec_path.write_text(yaml.safe_dump(raw, sort_keys=False, width=100))
    return done


def _fit_items(
    root: Path,
    raw: dict[str, Any],
    train: list[Path],
    side: Path | None,
    min_count: int,
    max_size: int | None,
) -> Fitted:
    """The item vocabulary: target and history values of the train split, then the cold items."""
    item = raw["item"]
    columns = [item["column"]] + ([raw["sequence"]["item_column"]] if raw.get("sequence") else [])
    counts = count_values(train, columns)
    kept = keep(counts, min_count, max_size)
    cold = pa.table({VALUE: pa.array([], kept.schema.field(VALUE).type), COUNT: pa.array([], pa.int64())})
    if side is not None:
        ids = pq.read_table(side, columns=[item.get("side_id_column", "item_id")]).column(0).combine_chunks()
        ids = ids.cast(kept.schema.field(VALUE).type) if len(kept) else ids
        new = pc.unique(ids.filter(pc.invert(pc.is_in(ids, value_set=kept.column(VALUE).combine_chunks()))))
        new = new.take(pc.sort_indices(new))  # in value order: the same file from the same table
        cold = pa.table({VALUE: new, COUNT: pa.array([0] * len(new), pa.int64())}) if len(new) else cold
    fitted = _write("item", root / item["vocab_file"], counts, pa.concat_tables([kept, cold]), cold=len(cold))
    item["vocab_size"], item["cold_items"] = len(kept), len(cold)
    return fitted


def _write(setting: str, path: Path, counts: pa.Table, kept: pa.Table, cold: int = 0) -> Fitted:
    if not len(kept) - cold:
        raise ValueError(f"{setting}: no value of the train split is kept (--min-count too high, or no rows)")
    write_vocab(path, kept)
    total = pc.sum(counts.column(COUNT)).as_py() or 0
    covered = pc.sum(kept.column(COUNT)).as_py() or 0
    return Fitted(setting, path, len(kept) - cold, len(counts), covered / total if total else 1.0, cold)


HELP = """Fit the vocabularies spec.yaml names (vocab_file) on the train split.

For logs that keep raw ids (strings, or integers of any range): each such field gets a file under
vocab/ listing the values seen in train, most frequent first, and spec.yaml gets its size. Values
seen fewer than --min-count times, or past the --max-size most frequent, share the unknown-id row.
Items the item table holds beyond them become cold items (their own side features and content).
Files that exist are kept unless --refit.
"""
"""What --help says: plain text, for a person at a terminal (the module docstring is for developers)."""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "vocab",
        help="fit the vocabularies spec.yaml names (vocab_file) on the train split",
        description=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("dir", type=Path, help="dataset folder holding spec.yaml and train/")
    p.add_argument(
        "--min-count", type=int, default=1, help="keep values seen at least this often (default: 1)"
    )
    p.add_argument("--max-size", type=int, default=None, help="keep at most this many values (default: all)")
    p.add_argument("--refit", action="store_true", help="fit again the vocabularies that exist")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.min_count < 1 or (args.max_size is not None and args.max_size < 1):
        print("recformer data vocab: error: --min-count and --max-size must be >= 1", file=sys.stderr)
        return 2
    try:
        done = fit(args.dir, args.min_count, args.max_size, args.refit)
    except (FileNotFoundError, ValueError, KeyError, yaml.YAMLError) as e:
        print(f"recformer data vocab: error: {e}", file=sys.stderr)
        return 2
    for v in done:
        cold = f", then {v.cold} cold item(s) from the side table" if v.cold else ""
        print(
            f"{v.setting}: {v.size} of {v.distinct} distinct values kept ({v.coverage:.1%} of the "
            f"occurrences){cold} -> {v.path}"
        )
    if not done:
        print(f"{args.dir / 'spec.yaml'}: every vocabulary it names exists (--refit fits them again)")
    return 0
