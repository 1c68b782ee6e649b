"""``recformer lab run`` killed or run twice at once (``make faults``): a point's fit dies with its
runner, even under SIGKILL, and a point whose fit is alive is refused by name, never run twice.

The point's fit holds at step 3 (``HoldAt``, a setting of the grid, so both runners' commands are
the same), which puts a live writer in the point's folder for as long as the test needs one.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tests._subprocess import ROOT, run_recformer, start_recformer, wait_for_file
from tests.test_lab import MICRO

pytestmark = pytest.mark.faults


def _grid(tmp_path: Path, marker: Path) -> Path:
    settings = {
        **MICRO["settings"],
        "trainer.callbacks+": "tests.fault_callbacks.HoldAt",
        "trainer.callbacks.step": 3,
        "trainer.callbacks.path": str(marker),
    }
    path = tmp_path / "micro.yaml"
    path.write_text(yaml.safe_dump({**MICRO, "settings": settings}))
    return path


def _runner(grid: Path, out: Path) -> subprocess.Popen:
    return start_recformer(["lab", "run", str(grid), "--out", str(out), "--jobs", "1"], ROOT)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"  # a zombie has ended; only its exit status waits to be read


def _held_fit(runner: subprocess.Popen, marker: Path) -> int:
    """The pid of the runner's fit, once it holds at step 3."""
    wait_for_file(marker, runner, "the point's fit reaching step 3")
    time.sleep(0.2)  # the pid is written; let the write finish
    return int(marker.read_text())


def test_kill_9_of_the_runner_takes_its_fit_with_it(tmp_path):
    marker = tmp_path / "held"
    runner = _runner(_grid(tmp_path, marker), tmp_path / "out")
    fit = _held_fit(runner, marker)
    assert _alive(fit)
    os.kill(runner.pid, signal.SIGKILL)  # the runner alone, as the OOM killer or `kill -9 PID` does
    runner.communicate(timeout=60)
    deadline = time.monotonic() + 10
    while _alive(fit) and time.monotonic() < deadline:
        time.sleep(0.1)
    orphaned = _alive(fit)
    if orphaned:
        os.kill(fit, signal.SIGKILL)  # leave nothing running behind the test
    assert not orphaned, "the point's fit outlived its runner (orphaned, still writing its folder)"


def test_a_point_whose_fit_is_alive_is_refused_by_name_not_run_twice(tmp_path):
    marker, out = tmp_path / "held", tmp_path / "out"
    grid = _grid(tmp_path, marker)
    first = _runner(grid, out)
    try:
        fit = _held_fit(first, marker)
        (point,) = (out / "points").glob("variant=pre-*")
        before = sorted(p.name for p in (point / "version_0").iterdir())
        second = run_recformer(["lab", "run", str(grid), "--out", str(out), "--jobs", "1"], cwd=ROOT)
        assert _alive(fit) and sorted(p.name for p in (point / "version_0").iterdir()) == before
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.communicate(timeout=60)
    assert second.returncode == 1, second.stderr[-3000:]
    assert f"{point.name}: busy" in second.stdout
    (line,) = [
        x for x in second.stderr.splitlines() if x.startswith(f"recformer lab: lab point {point.name}:")
    ]
    assert f"is being written by a live process (pid {first.pid} on" in line, line
    (post,) = (out / "points").glob("variant=post-*/version_0/point.json")
    assert json.loads(post.read_text())["status"] == "ok"  # the other point ran
