"""Where a data folder lives: a local path, or any URI a pyarrow file system reads (``s3://``,
``gs://``, ``abfs://``, ``hdfs://``; ``file://`` too).

- The split files stay where they are and are read as local ones are: each file's footer at set-up,
  then, per row group, the byte ranges of the columns the spec names (Parquet's layout makes these
  ranged GETs on an object store). Nothing is downloaded whole; ``bench``-style figures of bytes
  fetched against file sizes are in ``tests/test_s3.py``.
- The small files the loader opens by path (``spec.yaml``, ``vocab/``, the item side table) are
  copied once per process into a private temporary folder (``localize``), so every path the spec
  resolves is local and each DDP rank has its own copy (no two processes write one file).

Credentials and endpoints come from the environment as the file system reads them (for S3:
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION``, ``AWS_ENDPOINT_URL`` for an
S3-compatible server). ``recformer data build`` reads event URIs through polars, which reads the
same variables (plus ``AWS_ALLOW_HTTP=true`` for a plain-HTTP endpoint).

A store that refuses or cannot be reached (access denied, the endpoint down or gone mid-epoch, a
bucket that does not exist) is a ``StorageError``: one line naming the URI, what the store said and
what to check, never a "truncated or corrupt file" (``failure`` tells them apart).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from recformer.batch import DataError

LOCAL_FOLDERS = ("vocab",)
"""What ``localize`` copies besides spec.yaml and the side table the spec names."""


class StorageError(DataError):
    """The object store refused or could not be reached: not the data's fault, and not a bug."""


_FAILURES = (
    (
        ("ACCESS_DENIED", "AccessDenied", "INVALID_ACCESS_KEY_ID", "SIGNATURE_DOES_NOT_MATCH", "Forbidden"),
        "access denied; check the credentials (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_PROFILE) "
        "and the bucket's policy",
    ),
    (
        ("NETWORK_CONNECTION", "Could not connect", "curlCode", "Connection refused", "timed out"),
        "the store cannot be reached{endpoint}; check the endpoint and the network, then run again",
    ),
    (("NO_SUCH_BUCKET", "NoSuchBucket"), "the bucket does not exist{endpoint}"),
)
"""What pyarrow's file systems say (their messages carry the AWS SDK's error names) and the line
recformer says instead."""


def _endpoint() -> str:
    url = os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT_URL_S3")
    return f" at {url} (AWS_ENDPOINT_URL)" if url else ""


def failure(error: BaseException, uri: str | Path) -> str | None:
    """One line for ``error`` raised reading ``uri`` when it is the store failing (refused,
    unreachable, no bucket); None for anything else (a missing key, a corrupt file, a local one)."""
    if not is_uri(uri) or not isinstance(error, OSError) or isinstance(error, FileNotFoundError):
        return None
    text = " ".join(str(error).split())
    for markers, said in _FAILURES:
        if any(m in text for m in markers):
            sdk = text[text.find("AWS Error") :] if "AWS Error" in text else text
            return f"{uri}: {said.format(endpoint=_endpoint())} ({sdk[:200]})"
    return None


@contextlib.contextmanager
def store_errors(uri: str | Path) -> Iterator[None]:
    """Turn the store failing on ``uri`` into a ``StorageError`` with its one line."""
    try:
        yield
    except OSError as e:
        said = failure(e, uri)
        if said is None:
            raise
        raise StorageError(said) from None


def is_uri(path: str | Path) -> bool:
    """A URI with a scheme (``s3://bucket/key``); local paths (and ``Path`` objects) are not."""
    return isinstance(path, str) and "://" in path


def join(root: str | Path, *parts: str) -> str | Path:
    """``root / parts`` for a path, ``root/parts`` for a URI (a ``Path`` would fold ``//``)."""
    if is_uri(root):
        return "/".join([str(root).rstrip("/"), *parts])
    return Path(root).joinpath(*parts)


@functools.lru_cache(maxsize=16)
def _filesystem(prefix: str) -> tuple[pafs.FileSystem, str]:
    """The file system of ``scheme://bucket`` and that prefix's path in it, made once per process
    (an S3 file system is a client: making one per file opened would cost a client per open)."""
    return pafs.FileSystem.from_uri(prefix)


def resolve(uri: str) -> tuple[pafs.FileSystem, str]:
    """The file system of ``uri`` (one per scheme and bucket, kept) and the path within it."""
    scheme, rest = uri.split("://", 1)
    bucket = rest.split("/", 1)[0]
    try:
        if not bucket:  # file:///path: no bucket to key on, and a local file system costs nothing
            return pafs.FileSystem.from_uri(uri)
        fs, base = _filesystem(f"{scheme}://{bucket}")
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError) as e:
        raise FileNotFoundError(f"{uri}: no file system reads it ({e})") from None
    return fs, base.rstrip("/") + rest[len(bucket) :]


def list_files(uri: str) -> list[str]:
    """Every file under the URI folder ``uri`` at any depth, as sorted URIs; [] when there is none."""
    fs, path = resolve(uri)
    try:
        with store_errors(uri):
            infos = fs.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
    except StorageError:
        raise
    except OSError as e:
        raise FileNotFoundError(f"{uri}: cannot list it ({e})") from None
    scheme = uri.split("://", 1)[0]
    return sorted(f"{scheme}://{i.path}" for i in infos if i.type == pafs.FileType.File)


def is_file(uri: str) -> bool:
    fs, path = resolve(uri)
    try:
        return fs.get_file_info(path).type == pafs.FileType.File
    except OSError:
        return False


def open_parquet(path: str | Path, **kwargs) -> pq.ParquetFile:
    """``pq.ParquetFile`` of a local path or a URI (a random-access file: footer and column chunks
    are read by range)."""
    if is_uri(path):
        fs, p = resolve(str(path))
        with store_errors(path):
            return pq.ParquetFile(fs.open_input_file(p), **kwargs)
    return pq.ParquetFile(path, **kwargs)


def read_table(path: str | Path, **kwargs) -> pa.Table:
    if is_uri(path):
        fs, p = resolve(str(path))
        with store_errors(path):
            return pq.read_table(p, filesystem=fs, **kwargs)
    return pq.read_table(path, **kwargs)


def localize(root: str) -> Path:
    """A private local folder holding ``root``'s spec.yaml, vocab/ and the side table the spec
    names (the files opened by path); removed when the process exits."""
    fs, base = resolve(root)
    local = Path(tempfile.mkdtemp(prefix="recformer-data-"))
    atexit.register(shutil.rmtree, local, ignore_errors=True)
    with store_errors(f"data.data_dir={root}"):
        _localize(fs, root, base, local)
    return local


def _localize(fs: pafs.FileSystem, root: str, base: str, local: Path) -> None:
    import yaml

    spec = f"{base.rstrip('/')}/spec.yaml"
    if fs.get_file_info(spec).type != pafs.FileType.File:
        bucket = base.split("/", 1)[0]
        if not root.startswith("file:") and fs.get_file_info(bucket).type == pafs.FileType.NotFound:
            raise StorageError(f"data.data_dir={root}: the bucket {bucket!r} does not exist{_endpoint()}")
        raise FileNotFoundError(
            f"data.data_dir={root}: no spec.yaml there; expected a data folder (spec.yaml beside train/, "
            "val/, test/) as `recformer data build` or `recformer data movielens` writes it"
        )
    _copy(fs, spec, local / "spec.yaml")
    wanted = [*LOCAL_FOLDERS]
    raw = yaml.safe_load((local / "spec.yaml").read_text()) or {}
    side = (raw.get("item") or {}).get("side_table") if isinstance(raw, dict) else None
    if side:
        wanted.append(side)
    for rel in wanted:
        src = f"{base.rstrip('/')}/{rel}"
        info = fs.get_file_info(src)
        if info.type == pafs.FileType.File:
            _copy(fs, src, local / rel)
        elif info.type == pafs.FileType.Directory:
            for f in fs.get_file_info(pafs.FileSelector(src, recursive=True)):
                if f.type == pafs.FileType.File:
                    _copy(fs, f.path, local / rel / f.path[len(src) + 1 :])


def _copy(fs: pafs.FileSystem, src: str, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    with fs.open_input_stream(src) as fin, open(dst, "wb") as fout:
        shutil.copyfileobj(fin, fout, 1 << 20)
