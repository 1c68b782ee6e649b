"""A recformer process that dies with the process that started it.

``recformer lab run`` starts each point as a child ``recformer fit``; killed with SIGKILL, the
runner gets no chance to stop them, and an orphaned fit would go on writing into its point's
folder. So the runner starts children with ``child_env()``, which names it in
``RECFORMER_DIE_WITH``, and a child's first act (``bind_to_parent``, from ``recformer.__main__``) is
to ask Linux for SIGKILL when its parent dies (``prctl(PR_SET_PDEATHSIG)``), then to check that the
parent is still the one named: if it died while the child started, the child exits at once. The
child then names itself in the variable, so the processes it starts in turn (DDP ranks) die with
it, and so on down. The parent's threads matter: the signal comes when the thread that started the
child ends, so a runner starts each child from a thread that waits for it.

Why not a ``preexec_fn`` in the runner: Python runs it between fork and exec, where a lock held by
another thread of the runner (it runs points from a thread pool) can block the child for good. Why
not a thread in the child polling its parent: it acts a poll late, and only when it gets to run.
Off Linux there is no such signal: the point's writer lock (``recformer.writer_lock``) still
refuses a second writer while an orphan lives.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

ENV = "RECFORMER_DIE_WITH"
"""The pid of the process a child must die with."""
PR_SET_PDEATHSIG = 1
"""prctl option: the signal a process gets when its parent dies (linux/prctl.h)."""


def child_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's environment) naming this process as the one to die with."""
    return {**(os.environ if env is None else env), ENV: str(os.getpid())}


def bind_to_parent() -> None:
    """If started with ``child_env``: die (SIGKILL) when the parent dies, or exit now if it is
    already gone; then name this process for the children it starts."""
    parent = os.environ.get(ENV)
    if parent is None or not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        return  # not allowed here (a sandbox): the writer lock still guards the folder
    if os.getppid() != int(parent):  # the parent died before the signal was asked for
        os._exit(128 + signal.SIGKILL)
    os.environ[ENV] = str(os.getpid())
