"""The folder ``recformer data build --out`` writes: checked before anything is read, replaced only
when an earlier build wrote all of it.

- ``check``: ``--out`` must be a folder (or a new path) whose parent can be written, must not be,
  contain or lie inside any input (the events, the side tables, the mapping), and may be replaced
  (``--overwrite``) only when every file in it is one an earlier build wrote. Each refusal is one
  error naming the folder and what is in the way; nothing is written or removed.
- ``replace``: writes the marker ``.recformer-build`` (every file the build wrote, by relative
  path) into the finished staging folder, then swaps it in for ``--out``: the old folder is renamed
  aside first and removed only once the new one is in place.

A folder built before the marker existed counts as a build's own when it holds ``build.json`` and
only the files a build writes (``LEGACY_FILES``).
"""

from __future__ import annotations

import fnmatch
import glob
import json
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

from recformer.data import storage
from recformer.datasets.build_config import BuildError

MARKER = ".recformer-build"
"""The file a build leaves in its folder: which files it wrote (JSON)."""

LEGACY_FILES = (
    "build.json",
    "spec.yaml",
    "items.parquet",
    "train/part-*.parquet",
    "val/part-*.parquet",
    "test/part-*.parquet",
    "vocab/*.parquet",
)
"""What a build wrote before the marker: such a folder (with build.json) may be replaced."""

MAX_NAMED = 10
"""Files named in an error; the rest are counted."""


def input_paths(locations: Iterable[str]) -> list[Path]:
    """The local inputs behind ``locations`` (files, folders, globs; URIs are not local), resolved:
    a glob stands for the files it matches and, when it recurses (``**``), the folder above it."""
    out: list[Path] = []
    for loc in locations:
        if storage.is_uri(loc):
            continue
        if any(ch in loc for ch in "*?["):
            out += [Path(f).resolve() for f in glob.glob(loc, recursive=True)]
            if "**" in loc:
                out.append(Path(loc.split("**")[0] or ".").resolve())
        else:
            out.append(Path(loc).resolve())
    return out


def _listed(paths: list[str]) -> str:
    more = f" and {len(paths) - MAX_NAMED} more" if len(paths) > MAX_NAMED else ""
    return ", ".join(paths[:MAX_NAMED]) + more


def check(out: Path, inputs: list[Path], overwrite: bool) -> None:
    """Refuse ``out`` (``BuildError``) when it cannot be written, overlaps an input, or holds files
    a build did not write; creates and removes nothing but a probe folder beside it."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise BuildError(f"--out {out} is a file; expected a folder to write the data into")
    target = out.resolve()
    for p in inputs:
        if p == target or target in p.parents or p in target.parents:
            where = "is" if p == target else ("holds" if target in p.parents else "lies inside")
            raise BuildError(
                f"--out {out} {where} the input {p}; a build never writes over or into what it reads: "
                "choose a folder apart from the events, side tables and mapping"
            )
    _check_writable(out)
    if out.is_dir() and any(out.iterdir()):
        if not overwrite:
            raise BuildError(f"--out {out} exists and is not empty; pass --overwrite to replace it")
        foreign = not_built(out)
        if foreign:
            raise BuildError(
                f"--out {out} holds {len(foreign)} file(s) no earlier build wrote ({_listed(foreign)}); "
                "--overwrite replaces only a folder a build wrote whole: move them, or choose another --out"
            )


def _check_writable(out: Path) -> None:
    """The nearest existing folder above ``out`` takes a new folder (the staging folder goes
    beside ``out``); probed by making one, which is what counts on a read-only file system."""
    above = out.parent.resolve()
    while not above.exists():
        above = above.parent
    if not above.is_dir():
        raise BuildError(f"--out {out}: {above} is a file, so no folder can be made under it")
    try:
        Path(tempfile.mkdtemp(prefix=f".{out.name}.probe-", dir=above)).rmdir()
    except OSError as e:
        raise BuildError(f"--out {out}: cannot write in {above} ({e.strerror})") from None


def _files(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if not p.is_dir())


def not_built(folder: Path) -> list[str]:
    """Files under ``folder`` that no build wrote: those its marker does not list, or, in a folder
    from before the marker with a ``build.json``, those no ``LEGACY_FILES`` pattern matches; every
    file when there is neither."""
    files = [f for f in _files(folder) if f != MARKER]
    marker = folder / MARKER
    if marker.is_file():
        try:
            owned = set(json.loads(marker.read_text())["files"])
        except (OSError, ValueError, KeyError, TypeError):
            owned = set()
        return [f for f in files if f not in owned]
    if (folder / "build.json").is_file():
        return [f for f in files if not any(fnmatch.fnmatch(f, pat) for pat in LEGACY_FILES)]
    return files


def staging_of(out: Path) -> Path:
    """The folder a build writes into beside ``out`` before it replaces ``out``."""
    return out.parent / f".{out.name}.building"


def replace(staging: Path, out: Path) -> None:
    """Mark ``staging`` as a build's own and put it in place of ``out``; the previous ``out`` (a
    build's own: ``check``) is renamed aside and removed only after the new one is in place."""
    (staging / MARKER).write_text(json.dumps({"files": _files(staging)}, indent=0) + "\n")
    old = None
    if out.exists():
        old = out.parent / f".{out.name}.replaced-{os.getpid()}"
        out.rename(old)
    staging.rename(out)
    if old is not None:
        shutil.rmtree(old)
