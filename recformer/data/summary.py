"""``recformer data summary DIR``: what a prepared dataset folder holds, from Parquet footers.

Reads ``DIR/spec.yaml`` and, for every split folder (``DIR/<split>/*.parquet``), each file's footer
(files, row groups, rows, and per list column the element count) plus the label column alone (for
the positive rate, its values checked as the loader checks them). Nothing else is decoded, so it is
fast on large logs. An unreadable file or a bad label is an error that names the file (and row
group).

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

from recformer.config import FeatureSpec
from recformer.data.schema import DataError, Where, check_label, numeric
from recformer.data.shards import find_split_files, read_footer


@dataclass
class SplitSummary:
    name: str
    files: int = 0
    row_groups: int = 0
    rows: int = 0
    positives: float = 0.0
    list_elements: dict[str, int] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    """Spec columns absent from some file of this split, as ``file: column``."""

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


def summarize_split(split_dir: Path, spec: FeatureSpec) -> SplitSummary:
    s = SplitSummary(split_dir.name)
    for path in find_split_files(split_dir.parent, split_dir.name):  # the files the loader reads
        meta = read_footer(str(path))
        f = pq.ParquetFile(path, metadata=meta)
        schema = f.schema_arrow
        s.files += 1
        s.row_groups += meta.num_row_groups
        s.rows += meta.num_rows
        s.missing += [f"{path.name}: {c}" for c in spec.columns() if c not in schema.names]
        if spec.label in schema.names:
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


def summarize(root: Path) -> tuple[FeatureSpec, list[SplitSummary]]:
    root = Path(root)
    spec = FeatureSpec.load(root / "spec.yaml")
    split_dirs = sorted(d for d in root.iterdir() if d.is_dir() and find_split_files(root, d.name))
    if not split_dirs:
        raise FileNotFoundError(f"{root} has no split folder holding *.parquet files (e.g. {root}/train/)")
    # train / val / test first, in that order, then any other split folders by name.
    rank = {"train": 0, "val": 1, "test": 2}
    split_dirs.sort(key=lambda d: (rank.get(d.name, 3), d.name))
    return spec, [summarize_split(d, spec) for d in split_dirs]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "summary",
        help="files, row groups, rows, positive rate and list lengths of a prepared dataset",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("dir", type=Path, help="dataset folder holding spec.yaml and split folders")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        spec, splits = summarize(args.dir)
    except (FileNotFoundError, ValueError) as e:
        print(f"recformer data summary: error: {e}", file=sys.stderr)
        return 2
    print(f"{args.dir}: label {spec.label!r}, group {spec.group!r}, {spec.item.vocab_size} items")
    status = 0
    for s in splits:
        lists = "  ".join(f"{c} {s.mean_len(c):.1f}" for c in sorted(s.list_elements))
        print(
            f"{s.name:5s}  files {s.files}  row groups {s.row_groups:>4d}  rows {s.rows:>9d}  "
            f"positive rate {s.pos_rate:.3f}" + (f"  mean length: {lists}" if lists else "")
        )
        if s.missing:
            print(f"  error: spec columns missing in {s.name}: {s.missing}", file=sys.stderr)
            status = 1
    return status
