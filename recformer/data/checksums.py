"""Which Parquet files carry page checksums (``schema.CHECKSUMS``).

A page's CRC-32 lives in its page header, not in the footer, so the footer cannot say whether a
file has them. ``has_page_checksums`` reads the header of the file's first page (a few dozen bytes
at the first column chunk's offset, one ranged read on an object store) and looks for the ``crc``
field. A writer either checksums every page or none, so the first page stands for the file.
``unchecked_warning`` is the one line set-up prints for the files without, with the command that
adds them (``recformer data checksum``).
"""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq

from recformer.data import storage

HEADER_BYTES = 64
"""Bytes read at a page's start: the header's first four fields fit in 21."""
_CRC_FIELD = 4
"""``PageHeader.crc`` in parquet.thrift (1: type, 2: uncompressed size, 3: compressed size, 4: crc)."""
_I32 = 5
"""The Thrift compact protocol's type code of an i32 field."""
MAX_NAMED = 10
"""Files named in the warning; the rest are counted."""


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def header_has_crc(data: bytes) -> bool:
    """Whether the Thrift-compact ``PageHeader`` at the start of ``data`` sets ``crc`` (its fields
    come in id order: past id 3 the next one is either the crc or a later field)."""
    field, pos = 0, 0
    while pos < len(data):
        head = data[pos]
        pos += 1
        if head == 0:  # the struct ends
            return False
        kind, delta = head & 0x0F, head >> 4
        if delta:
            field += delta
        else:  # a long-form field id (zigzag i16) follows
            raw, pos = _varint(data, pos)
            field = (raw >> 1) ^ -(raw & 1)
        if field >= _CRC_FIELD:
            return field == _CRC_FIELD and kind == _I32
        _, pos = _varint(data, pos)  # the i32 value of fields 1-3
    return False


def has_page_checksums(path: str | Path, meta: pq.FileMetaData | None = None) -> bool:
    """Whether ``path`` (local or a URI) writes a CRC in its pages; True for a file without rows,
    whose pages hold nothing to flip."""
    meta = meta if meta is not None else storage.open_parquet(path).metadata
    if meta.num_rows == 0 or meta.num_columns == 0:
        return True
    chunk = meta.row_group(0).column(0)
    offsets = [o for o in (chunk.dictionary_page_offset, chunk.data_page_offset) if o is not None and o > 0]
    start = min(offsets)
    if storage.is_uri(path):
        fs, p = storage.resolve(str(path))
        with fs.open_input_file(p) as f:
            data = f.read_at(HEADER_BYTES, start)
    else:
        with open(path, "rb") as f:
            f.seek(start)
            data = f.read(HEADER_BYTES)
    return header_has_crc(bytes(data))


def unchecked_warning(files: list[str], data_dir: str | Path) -> str:
    """The set-up warning for ``files`` without page checksums: named, and how to add them."""
    named = ", ".join(str(f) for f in files[:MAX_NAMED])
    more = f" and {len(files) - MAX_NAMED} more" if len(files) > MAX_NAMED else ""
    return (
        f"{len(files)} Parquet file(s) carry no page checksums, so a flipped bit in them would be "
        f"read as data unnoticed: {named}{more}; add checksums (the data stays as it is) with: "
        f"recformer data checksum {data_dir}"
    )
