"""``recformer data checksum DIR``: give every Parquet file under DIR that lacks them page checksums.

A file a team's own tool wrote without ``write_page_checksum`` is read unverified: a flipped bit in
a page mostly decodes to another valid value and is trained on (``tests/test_faults.py``). Set-up
names such files (``recformer.data.checksums``) and this command. It rewrites each of them with a
CRC-32 per page and changes nothing else a reader sees: the same Arrow schema (with its metadata),
the same row groups, each column's compression codec. The new file is written beside the old one,
read back and compared with it value for value, and only then renamed over it; a file that does
not compare equal is left as it was and named. Files that already have checksums are not touched.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path

import pyarrow.parquet as pq

from recformer.data import storage
from recformer.data.checksums import has_page_checksums
from recformer.data.schema import CHECKSUMS

CODECS = {"UNCOMPRESSED": "none", "LZ4_RAW": "lz4", "LZ4": "lz4"}
"""Footer codec names pyarrow's writer spells otherwise (the rest: the same name, lower case)."""


def _codecs(meta: pq.FileMetaData) -> dict[str, str]:
    """Each column's compression codec (of the first row group), by column path."""
    if meta.num_row_groups == 0:
        return {}
    group = meta.row_group(0)
    out = {}
    for i in range(meta.num_columns):
        codec = group.column(i).compression
        out[group.column(i).path_in_schema] = CODECS.get(codec, codec.lower())
    return out


def _group_rows(meta: pq.FileMetaData) -> list[int]:
    return [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]


def add_checksums(path: Path) -> None:
    """Rewrite ``path`` with page checksums, row group for row group; replaced only once the new
    file reads back equal to the old (``ValueError`` naming the file otherwise)."""
    tmp = path.with_name(f".{path.name}.checksum-{os.getpid()}")
    source = pq.ParquetFile(path)
    meta, schema = source.metadata, source.schema_arrow
    try:
        with pq.ParquetWriter(tmp, schema, compression=_codecs(meta) or "zstd", **CHECKSUMS) as w:
            for i, rows in enumerate(_group_rows(meta)):
                w.write_table(source.read_row_group(i), row_group_size=max(1, rows))
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        written = pq.ParquetFile(tmp, page_checksum_verification=True)
        same = _group_rows(written.metadata) == _group_rows(meta) and written.schema_arrow == schema
        if not (same and written.read().equals(source.read())):
            raise ValueError(f"{path}: the rewrite with checksums did not read back equal; left as it was")
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        source.close()


def parquet_files(root: Path) -> list[Path]:
    """Every visible ``*.parquet`` under ``root`` (hidden and ``_``-prefixed ones are not data)."""
    return sorted(
        p
        for p in root.rglob("*.parquet")
        if p.is_file() and not any(part.startswith((".", "_")) for part in p.relative_to(root).parts)
    )


HELP = """Give every Parquet file under DIR that lacks them page checksums (CRC-32), so a flipped bit is
refused instead of trained on. Each file is rewritten beside the old one with the same schema, row
groups and compression, read back and compared value for value, and only then put in its place;
files that already have checksums are not touched.
"""
"""What --help says: plain text, for a person at a terminal (the module docstring is for developers)."""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "checksum",
        help="rewrite the Parquet files under DIR that lack page checksums with them (data unchanged)",
        description=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("dir", help="a local data folder (or any folder of Parquet files)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    root = Path(args.dir)
    if storage.is_uri(args.dir) or not root.is_dir():
        print(
            f"recformer data checksum: error: {args.dir} is not a local folder; object stores replace "
            "whole objects: rewrite a local copy, then upload it",
            file=sys.stderr,
        )
        return 2
    files = parquet_files(root)
    todo = [p for p in files if not has_page_checksums(p)]
    try:
        for p in todo:
            add_checksums(p)
            print(f"added page checksums: {p}")
    except (OSError, ValueError) as e:
        print(f"recformer data checksum: error: {e}", file=sys.stderr)
        return 2
    print(f"{len(todo)} of {len(files)} Parquet file(s) under {root} rewritten with page checksums")
    return 0
