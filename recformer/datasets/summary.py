"""``recformer data summary DIR``: what a prepared dataset folder holds, from Parquet footers.

Reads ``DIR/spec.yaml`` and, for every split folder (``DIR/<split>/**/*.parquet``, the files the loader
reads), each file's footer (files, row groups, rows, and per list column the element count) plus the
label column alone (for the positive rate). Nothing else is decoded, so it is fast on large logs.
Every file's schema is checked first, as the loader checks it (``schema.check_schema``: each spec
column present, with its type), then the label values (no nulls, finite, in [0, 1]). An unreadable
file, a missing or mistyped column or a bad label is an error (exit 2) that names the file, the
column (and row group). A ``train``, ``val`` or ``test`` folder without Parquet files is listed as
empty, not left out: the loader finds no such split there (fit then runs without validation).

Mean list length comes from the footer: a list column's leaf chunk stores one level per element and
one per empty or null list, and its null count covers the latter, so elements = values - nulls
(null elements inside a list are not counted).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from recformer.batch import DataError
from recformer.config import FeatureSpec
from recformer.data.decode import Decoder, load_item_tables
from recformer.data.schema import Where, check_label, check_schema, numeric
from recformer.data.shards import find_split_files, read_footer

NAMED_SPLITS = ("train", "val", "test")
"""Splits the loader reads by name: listed first, in this order, and listed as empty when their folder
holds no Parquet file (other folders are splits only when they hold one)."""
MAX_SCHEMA_ERRORS = 5
"""Files whose schema errors are spelled out; the rest are counted."""


@dataclass
class SplitSummary:
    name: str
    folder: Path
    files: int = 0
    """Parquet files; 0 for a named split whose folder holds none."""
    row_groups: int = 0
    rows: int = 0
    positives: float = 0.0
    list_elements: dict[str, int] = field(default_factory=dict)

    @property
    def pos_rate(self) -> float:
        return self.positives / self.rows if self.rows else float("nan")

    def mean_len(self, column: str) -> float:
        return self.list_elements[column] / self.rows if self.rows else float("nan")


def _list_elements(meta: pq.FileMetaData, column: str) -> int:
    """Non-null elements of list column ``column`` in a file, from chunk metadata only."""
    total = 0
    for g in range(meta.num_row_groups):
        rg = meta.row_group(g)
        for c in range(rg.num_columns):
            chunk = rg.column(c)
            if chunk.path_in_schema.split(".")[0] != column:
                continue
            stats = chunk.statistics
            if stats is None or not stats.has_null_count:
                raise ValueError(
                    f"column {column!r}: row group {g} has no null-count statistics "
                    "(written with write_statistics=False); cannot count list elements from the footer"
                )
            total += chunk.num_values - stats.null_count
            break
    return total


def _positives(f: pq.ParquetFile, g: int, label: str, where: Where) -> float:
    """The label sum of row group ``g``, its labels checked as the loader checks them (no nulls,
    finite, in [0, 1]): a bad label stops the summary rather than skew its positive rate."""
    try:
        arr = f.read_row_group(g, columns=[label], use_threads=False).column(0).combine_chunks()
    except (OSError, ValueError) as e:
        raise DataError(f"{where}: could not read {label!r} ({e}); truncated or corrupt file?") from None
    y = numeric(arr, where, label)
    check_label(y, where, label)
    return float(y.sum())


def summarize_split(
    split_dir: Path, footers: list[tuple[Path, pq.FileMetaData]], spec: FeatureSpec
) -> SplitSummary:
    """Counts of one split from its files' footers (schemas already checked) and label columns."""
    s = SplitSummary(split_dir.name, split_dir)
    for path, meta in footers:
        f = pq.ParquetFile(path, metadata=meta, page_checksum_verification=True)
        schema = f.schema_arrow
        s.files += 1
        s.row_groups += meta.num_row_groups
        s.rows += meta.num_rows
        for g in range(meta.num_row_groups):
            s.positives += _positives(f, g, spec.label, Where(str(path), g))
        for name in schema.names:
            if pa.types.is_list(schema.field(name).type) or pa.types.is_large_list(schema.field(name).type):
                try:
                    n = _list_elements(meta, name)
                except ValueError as e:
                    raise ValueError(f"{path}: {e}") from None
                s.list_elements[name] = s.list_elements.get(name, 0) + n
    return s


def check_schemas(spec: FeatureSpec, footers: list[tuple[Path, pq.FileMetaData]]) -> None:
    """``check_schema`` (the loader's check) on every file, before any value is read; one error
    naming every bad file (the first ``MAX_SCHEMA_ERRORS``), not only the first."""
    errors = []
    for path, meta in footers:
        try:
            check_schema(spec, meta.schema.to_arrow_schema(), Where(str(path)))
        except DataError as e:
            errors.append(str(e))
    if errors:
        more = len(errors) - MAX_SCHEMA_ERRORS
        tail = [f"... and {more} more file(s) with schema errors"] if more > 0 else []
        raise DataError("\n".join(errors[:MAX_SCHEMA_ERRORS] + tail))


def summarize(root: Path) -> tuple[FeatureSpec, list[SplitSummary]]:
    root = Path(root)
    spec = FeatureSpec.load(root / "spec.yaml")
    named = {(root / v[2]).resolve().parent for v in vocabularies(spec)}  # vocabularies are no split
    files = {
        d.name: find_split_files(root, d.name)  # the files the loader reads
        for d in root.iterdir()
        if d.is_dir() and not d.name.startswith((".", "_")) and d.resolve() not in named
    }
    split_names = [name for name, fs in files.items() if fs or name in NAMED_SPLITS]
    if not any(files[name] for name in split_names):
        raise FileNotFoundError(f"{root} has no split folder holding *.parquet files (e.g. {root}/train/)")
    # train / val / test first, in that order, then any other split folders by name.
    rank = {name: i for i, name in enumerate(NAMED_SPLITS)}
    split_names.sort(key=lambda name: (rank.get(name, len(rank)), name))
    footers = {name: [(p, read_footer(str(p))) for p in files[name]] for name in split_names}
    check_schemas(spec, [pm for name in split_names for pm in footers[name]])
    return spec, [summarize_split(root / name, footers[name], spec) for name in split_names]


def side_table_summary(spec: FeatureSpec) -> tuple[Path, int, int] | None:
    """(path, rows, known items without a row) of the item side table, read and checked as the
    loader reads it (columns, types, ids, vocabularies, values); None without one."""
    path = spec.side_table_path()
    if path is None:
        return None
    _, _, missing = load_item_tables(spec)
    return path, spec.item.vocab_size - missing, missing


def vocabularies(spec: FeatureSpec) -> list[tuple[str, int, str]]:
    """(field, size, file) of every vocabulary file the spec names."""
    events = spec.sequence.categorical if spec.sequence else []
    out = [
        (f.name, f.vocab_size, f.vocab_file)
        for f in [*spec.categorical, *events, *spec.item.features, *spec.bags]
    ]
    if spec.item.vocab_file:
        out.append((spec.item.column, spec.item.vocab_size + spec.item.cold_items, spec.item.vocab_file))
    return [v for v in out if v[2]]


HELP = """What a data folder holds: per split, files, row groups, rows, positive rate and mean history
length, read from the Parquet footers and the label column only (fast on large logs). Every file's
schema is checked as the loader checks it; a missing or mistyped column, a bad label or an
unreadable file is an error naming the file and the column.
"""
"""What --help says: plain text, for a person at a terminal (the module docstring is for developers)."""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "summary",
        help="files, row groups, rows, positive rate and list lengths of a prepared dataset",
        description=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("dir", type=Path, help="dataset folder holding spec.yaml and split folders")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        spec, splits = summarize(args.dir)
        Decoder(spec)  # reads and checks every vocabulary file the spec names, as the loader does
        side = side_table_summary(spec)
    except (FileNotFoundError, ValueError) as e:
        print(f"recformer data summary: error: {e}", file=sys.stderr)
        return 2
    print(f"{args.dir}: label {spec.label!r}, group {spec.group!r}, {spec.item.vocab_size} items")
    if side is not None:
        print(f"items  side table {side[0]}: {side[1]} rows, {side[2]} known item(s) without a row")
    if spec.item.cold_items:
        print(f"items  {spec.item.vocab_size} trained, {spec.item.cold_items} cold (side features only)")
    for name, size, path in vocabularies(spec):
        print(f"vocab  {name}: {size} values ({path})")
    for s in splits:
        if not s.files:
            print(
                f"{s.name:5s}  empty: no Parquet files under {s.folder} (the loader finds no {s.name} split)"
            )
            continue
        lists = "  ".join(f"{c} {s.mean_len(c):.1f}" for c in sorted(s.list_elements))
        print(
            f"{s.name:5s}  files {s.files}  row groups {s.row_groups:>4d}  rows {s.rows:>9d}  "
            f"positive rate {s.pos_rate:.3f}" + (f"  mean length: {lists}" if lists else "")
        )
    return 0
