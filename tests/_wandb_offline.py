"""Read back what an offline W&B run wrote (its ``run-<id>.wandb`` files), to test what reaches W&B
without a server: the run's name, its summary, the keys it logged, its artifacts.

The file is W&B's record log: a 7-byte header (``:W&B``, a 2-byte magic, a version byte), then
LevelDB-log framing (32 KiB blocks of chunks: crc32c, length, type FULL / FIRST / MIDDLE / LAST)
around ``wandb_internal_pb2.Record`` messages."""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path
from typing import Any

BLOCK = 32 * 1024
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


class Truncated(Exception):
    """The file ends inside a chunk or a record: W&B's writer has not flushed it all yet."""


def records(path: Path) -> list[Any]:
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B record log"
    pos, pending, out = HEADER, b"", []
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # the block's tail is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        if length == 0 and kind == 0:
            pos += left
            continue
        if pos + HEADER + length > len(data):
            raise Truncated(f"{path}: a chunk runs past the end of the file (still being written)")
        pending += data[pos + HEADER : pos + HEADER + length]
        pos += HEADER + length
        if kind in (FULL, LAST):
            record = pb.Record()
            try:
                record.ParseFromString(pending)
            except Exception as e:  # protobuf's DecodeError: a record cut at a flush boundary
                raise Truncated(f"{path}: record {len(out)} does not parse: {e}") from e
            out.append(record)
            pending = b""
    return out


def settled_records(path: Path, timeout: float = 60.0) -> list[Any]:
    """``records(path)`` once the file parses whole and its size has not changed for 0.5 s.

    W&B's service process writes the log behind the client: ``finish()`` can return while the
    last records are still buffered, and on a loaded machine a read may land between two flushes."""
    deadline = time.monotonic() + timeout
    while True:
        size = path.stat().st_size
        try:
            out = records(path)
        except Truncated:
            if time.monotonic() > deadline:
                raise
        else:
            time.sleep(0.5)
            if path.stat().st_size == size:
                return out
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} kept growing for {timeout:.0f} s")
        time.sleep(0.5)


def read_run(wandb_dir: Path, run_id: str) -> dict[str, Any]:
    """Every offline folder of run ``run_id`` under ``wandb_dir`` (a resumed run writes a second one),
    merged: ``names`` (display names set), ``summary`` (key -> JSON value), ``logged`` (history
    keys), ``artifacts`` (name, type, aliases, metadata)."""
    run: dict[str, Any] = {"names": [], "summary": {}, "logged": set(), "artifacts": [], "folders": 0}
    for path in sorted(wandb_dir.glob(f"offline-run-*-{run_id}*/run-{run_id}.wandb")):
        run["folders"] += 1
        for r in settled_records(path):
            kind = r.WhichOneof("record_type")
            if kind == "run" and r.run.display_name:
                run["names"].append(r.run.display_name)
            elif kind == "summary":
                for u in r.summary.update:
                    key = u.key or "/".join(u.nested_key)
                    run["summary"][key] = json.loads(u.value_json)
            elif kind == "history":
                run["logged"].update(i.key or "/".join(i.nested_key) for i in r.history.item)
            elif kind == "artifact":
                a = r.artifact
                run["artifacts"].append(
                    {"name": a.name, "type": a.type, "aliases": list(a.aliases), "metadata": a.metadata}
                )
    return run
