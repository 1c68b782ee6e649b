"""Running ``recformer`` in a child process under a hang guard.

The command runs in a session of its own with ``PYTHONFAULTHANDLER=1`` (inherited by the DDP ranks
Lightning starts). If it outlives ``timeout``, every process of the session gets SIGABRT, on which
faulthandler prints each thread's Python stack to stderr, and the test fails with those stacks: a
hang becomes a failure that says where each rank waited.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def recformer_env(**extra: str) -> dict[str, str]:
    """The environment of a child ``recformer``: this checkout importable, W&B as a user has it
    (offline by default: conftest disables it for in-process tests only), faulthandler on."""
    env = {k: v for k, v in os.environ.items() if k != "WANDB_MODE"}
    env.update(PYTHONPATH=str(ROOT), PYTHONFAULTHANDLER="1", WANDB_SILENT="true", **extra)
    return env


def run_recformer(
    args: list[str],
    cwd: Path,
    timeout: float = 240,
    env: dict[str, str] | None = None,
    expect_hang_free: bool = True,
) -> subprocess.CompletedProcess:
    """``python -m recformer *args`` in ``cwd``; a run past ``timeout`` fails the test with the
    Python stacks of every process it started."""
    proc = start_recformer(args, cwd, env)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGABRT)  # faulthandler: every thread's stack, in every rank
        time.sleep(2)
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        if expect_hang_free:
            pytest.fail(f"recformer {' '.join(args[:1])} hung for {timeout} s; stacks:\n{err[-20000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def start_recformer(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """``python -m recformer *args`` started in a session of its own (to be killed as a group), its
    stdout and stderr piped."""
    return subprocess.Popen(
        [sys.executable, "-m", "recformer", *args],
        cwd=cwd,
        env=env or recformer_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def wait_for_file(path: Path, proc: subprocess.Popen, what: str, timeout: float = 240) -> None:
    """Wait until ``path`` exists (a marker ``proc`` writes when it gets somewhere); should
    ``proc`` end or ``timeout`` pass first, its session is killed and the test fails with its stderr."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"{what} never happened: {proc.communicate()[1][-3000:]}")
        time.sleep(0.05)
