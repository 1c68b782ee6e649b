"""A folder's writer, known for as long as it lives: an exclusive ``flock`` on ``<folder>/.writer.lock``.

A fit holds the lock of its run folder, and ``recformer lab run`` that of each point it runs, from
before the first byte is written until the process ends. The kernel drops a flock when the last
descriptor of its open file closes, however the holder ends (SIGKILL, an out-of-memory kill), and
never while it lives, so a held lock means a live writer and a free one means none: no pid file to
go stale, no pid reused by another process. Processes forked by the holder (DataLoader workers)
share the lock while they live; a child started with the descriptor in ``pass_fds`` holds it too.

The file also records who holds it (pid, host, command, since), for the message that names a live
writer. On one machine this is exact; across machines it holds where the file system implements
flock (local disks, NFSv4, Lustre mounted with ``-o flock``).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import sys
import time
from pathlib import Path

LOCK_FILE = ".writer.lock"
"""The lock file in a folder being written."""


class WriterAlive(ValueError):
    """The folder is being written by a live process; the message names the folder and the writer."""


def _holder(fd: int) -> str:
    with contextlib.suppress(OSError, ValueError):
        os.lseek(fd, 0, os.SEEK_SET)
        who = json.loads(os.read(fd, 4096).decode() or "{}")
        if who:
            return (
                f"pid {who.get('pid')} on {who.get('host')}, since {who.get('since')}: {who.get('command')}"
            )
    return "a process that has not said who it is"


def hold(folder: Path, what: str) -> int:
    """Take ``folder``'s writer lock (made with the folder if need be) and return its descriptor,
    to keep open while writing; ``WriterAlive`` naming ``what`` and the holder if a live process
    has it."""
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(fd)
        os.close(fd)
        raise WriterAlive(
            f"{what} {folder} is being written by a live process ({holder}); two writers would mix "
            "one folder: wait for it to end or stop it, then run again"
        ) from None
    record = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "since": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "command": " ".join(sys.argv)[:300],
    }
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(record).encode(), 0)
    return fd


def held_by(folder: Path) -> str | None:
    """Who holds ``folder``'s writer lock, or None when no live process does (or it has none)."""
    path = folder / LOCK_FILE
    if not path.is_file():
        return None
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _holder(fd)
    finally:
        os.close(fd)
    return None
