"""``recformer serve`` in a child process, for tests, benchmarks and a team's own integration checks:
started on a free loopback port, waited for until ``/health`` answers 200 (or it exits, or a
deadline passes), and always stopped, its whole process group, when the block ends."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


def free_port() -> int:
    """A port nothing listens on now (the OS's pick; another process could take it before us)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    """Status and body of a GET (an HTTP error status is an answer, not an exception)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


@dataclass(frozen=True)
class Served:
    url: str
    """``http://127.0.0.1:PORT``."""
    pid: int
    """The server's process, which leads the process group of its workers."""


@contextlib.contextmanager
def running_server(
    export_dir: Path,
    *args: str,
    timeout: float = 180.0,
    log: Path | None = None,
    env: dict[str, str] | None = None,
) -> Iterator[Served]:
    """``recformer serve export_dir *args`` on a free port, yielded once healthy. Its output goes
    to ``log`` (a temporary file otherwise), quoted in the error if it never gets healthy. The
    server runs in a session of its own: stopping it stops its workers too."""
    port = free_port()
    log = log or Path(os.environ.get("TMPDIR", "/tmp")) / f"recformer-serve-{port}.log"
    cmd = [sys.executable, "-m", "recformer", "serve", str(export_dir), "--port", str(port), *args]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, proc, timeout, log)
        yield Served(url, proc.pid)
    finally:
        stop(proc)


def _wait_healthy(url: str, proc: subprocess.Popen, timeout: float, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"recformer serve exited with {proc.returncode}: {_tail(log)}")
        with contextlib.suppress(OSError):
            if get(f"{url}/health", timeout=2.0)[0] == 200:
                return
        time.sleep(0.2)
    raise TimeoutError(f"recformer serve was not healthy within {timeout:g} s: {_tail(log)}")


def stop(proc: subprocess.Popen, grace: float = 15.0) -> None:
    """SIGTERM to the server's process group (it shuts down as on Ctrl-C), SIGKILL after ``grace``."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace)
    with contextlib.suppress(ProcessLookupError):  # its workers, if any outlived it
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=grace)


def _tail(log: Path, chars: int = 3000) -> str:
    text = log.read_text(errors="replace") if log.is_file() else ""
    return text[-chars:].strip() or "(no output)"
