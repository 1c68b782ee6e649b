"""Checkpoint files: written so that a kill never destroys one, read so that a bad one says so.

- ``AtomicCheckpointIO``: Lightning's checkpoint IO, but every local checkpoint is written to a
  temporary file in the checkpoint's own folder, flushed to disk, then renamed over the old one
  (``os.replace``: atomic within one file system). Lightning's own save goes through fsspec's
  transaction, which writes the temporary file in the system temp folder and *moves* it: when that
  folder is on another file system (local /tmp, checkpoints on a network share) the move is a copy
  into the truncated target, and a kill during it leaves ``last.ckpt`` at 0 bytes.
- ``read_checkpoint``: ``torch.load(weights_only=True)`` whose failures on a file that is not a
  checkpoint (empty, truncated, another format, pickled code) become one ``ValueError`` naming the
  file; errors about anything else keep their own message and traceback.
- ``check_features``: data a checkpoint's model cannot read as it was trained to is refused.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import pickle
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from recformer.batch import DataError
from recformer.config import FeatureDims

log = logging.getLogger(__name__)

PARTIAL = ".partial-"
"""Infix of a checkpoint being written: ``.<name>.partial-<pid>`` beside ``<name>``."""

_SHORT_WRITE = ("unexpected pos", "file write failed", "PytorchStreamWriter failed")
"""What torch says when the bytes of a checkpoint did not all reach the file (torch 2.11-2.13)."""
_UNREADABLE = ("PytorchStreamReader", "zip archive", "Invalid argument", "Weights only load failed")
"""What torch says when the file itself is not a checkpoint it can read (checked on torch 2.11-2.13)."""


def is_remote(path: str | Path) -> bool:
    return "://" in str(path)


def unreadable_checkpoint(path: str | Path, error: BaseException) -> ValueError | None:
    """The one-line error for ``error`` raised while loading ``path`` if it says the file is not a
    checkpoint; None when the error is about something else (a device, a state dict)."""
    text = str(error)
    if isinstance(error, pickle.UnpicklingError) and ("GLOBAL" in text or "Unsupported global" in text):
        return ValueError(
            f"{path} holds objects other than tensors and plain values (pickled code?); recformer "
            "loads checkpoints with torch.load(weights_only=True) and refuses it"
        )
    if isinstance(error, RuntimeError | OSError) and not any(s in str(error) for s in _UNREADABLE):
        return None
    if not isinstance(error, pickle.UnpicklingError | EOFError | OSError | RuntimeError):
        return None
    lines = text.strip().splitlines()
    said = "" if isinstance(error, pickle.UnpicklingError) or not lines else f": {lines[0][:160]}"
    return ValueError(
        f"{path} is not a readable checkpoint written by recformer fit ({type(error).__name__}{said}); "
        "another kind of file, or truncated?"
    )


def check_checkpoint_path(path: str | Path, flag: str = "--ckpt_path") -> None:
    """A local ``path`` exists and is a file, or a ``FileNotFoundError`` naming ``flag``."""
    if is_remote(path):
        return
    p = Path(path)
    if p.is_dir():
        raise FileNotFoundError(f"{flag} {p} is a folder; expected a .ckpt file in it")
    if not p.is_file():
        raise FileNotFoundError(f"{flag} {p} does not exist")


def read_checkpoint(path: str | Path, map_location: Any = "cpu", flag: str = "--ckpt_path") -> dict[str, Any]:
    """The checkpoint dict at ``path``, loaded with ``weights_only=True`` (no code runs)."""
    check_checkpoint_path(path, flag)
    try:
        from lightning.fabric.utilities.cloud_io import _load

        return _load(str(path), map_location=map_location, weights_only=True)
    except (pickle.UnpicklingError, EOFError, OSError, RuntimeError) as e:
        said = unreadable_checkpoint(path, e)
        if said is None:
            raise
        raise said from None


def checkpoint_entries(path: str | Path, *keys: str) -> dict[str, Any]:
    """Top-level entries of the local checkpoint ``path`` (``global_step``, a DataModule's state),
    read memory-mapped: its tensors are not loaded."""
    ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    return {k: ckpt.get(k) for k in keys}


def _fsync_dir(folder: Path) -> None:
    with contextlib.suppress(OSError):  # some file systems cannot open a folder for fsync
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_torch_save(obj: Any, path: str | Path) -> None:
    """``torch.save(obj, path)`` that leaves either the old file or the new one, never a part."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in path.parent.glob(f".{path.name}{PARTIAL}*"):  # left by a writer that was killed
        stale.unlink(missing_ok=True)
    tmp = path.with_name(f".{path.name}{PARTIAL}{os.getpid()}")
    try:
        with open(tmp, "wb") as fh:
            torch.save(obj, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        failed = _write_failure(e, path)
        tmp.unlink(missing_ok=True)
        if failed is not None:
            raise failed from e
        raise
    _fsync_dir(path.parent)  # the rename itself survives a power cut


FULL_BELOW = 1 << 20
"""Free bytes under which a failed write is put down to a full disk."""


def _write_failure(error: BaseException, path: Path) -> OSError | None:
    """The write of ``path`` failing as an ``OSError`` naming ``path`` (not its temporary file):
    torch reports a short write as a ``RuntimeError`` ("unexpected pos"), or the OS error names no
    file; a full file system (measured before the partial file is removed) is ENOSPC. None for
    anything that is not a failed write."""
    if isinstance(error, OSError) and error.errno is not None:
        return OSError(error.errno, error.strerror, str(path))
    if not isinstance(error, RuntimeError) or not any(s in str(error) for s in _SHORT_WRITE):
        return None
    try:
        st = os.statvfs(path.parent)
        full = st.f_bavail * st.f_frsize < FULL_BELOW
    except OSError:
        full = False
    code = errno.ENOSPC if full else errno.EIO
    return OSError(code, os.strerror(code), str(path))


class AtomicCheckpointIO(TorchCheckpointIO):
    """``TorchCheckpointIO`` with same-folder atomic saves and one-line errors for unreadable files."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        if storage_options is not None or is_remote(path):  # object stores replace whole objects
            return super().save_checkpoint(checkpoint, path, storage_options)
        atomic_torch_save(checkpoint, path)

    def load_checkpoint(self, path: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        try:
            return super().load_checkpoint(path, *args, **kwargs)
        except (pickle.UnpicklingError, EOFError, OSError, RuntimeError) as e:
            said = unreadable_checkpoint(path, e)
            if said is None:
                raise
            raise said from None


def check_features(
    data: FeatureDims,
    ckpt: FeatureDims,
    data_name: str,
    ckpt_name: str,
    labels: tuple[str, str] = ("data", "checkpoint"),
    warn: bool = True,
) -> None:
    """Refuse data whose features a model built from ``ckpt``'s dims cannot read as it was trained
    to (other columns, other sizes, string vocabularies in another order); warn (``warn``: one rank
    of several) where a dense column is normalised otherwise, which the sizes do not show."""
    wrong = data.mismatch(ckpt, *labels)
    if wrong:
        raise DataError(f"{data_name} does not match {ckpt_name}: {wrong}")
    changed = data.encoding_changes(ckpt, *labels)
    if changed and warn:
        log.warning(
            "%s encodes some columns otherwise than %s was trained on (the model sees shifted inputs): %s",
            data_name,
            ckpt_name,
            "; ".join(changed),
        )
