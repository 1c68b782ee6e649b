"""Running a lab grid: its data made once, each point an ordinary ``recformer fit`` in its own run
folder (config.yaml, metrics.csv, health.jsonl, checkpoints, a W&B run grouped by grid), ``--jobs``
points at a time, each summarised from its metrics when it ends.

A point is finished when its run folder holds ``point.json``; ``lab run`` again keeps those and
reruns the rest from scratch (a half-written folder is removed first), so an interrupted grid
resumes. A point's fit dies with the runner, even one killed with SIGKILL (``recformer.lifeline``),
and while it runs the runner holds the point's writer lock (``recformer.writer_lock``), passed on to
the fit: a second ``lab run`` finds the point ``busy`` (its writer named) and leaves it alone. A
point that diverges (the module stops it after ``optim.max_nonfinite_steps`` non-finite steps in a
row) is a result, recorded as ``diverged``; any other failure is recorded as ``failed`` with the end
of its stderr; ``lab run`` exits non-zero after the other points when a point failed or was busy.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import math
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from recformer.lab.grids import REPO_ROOT, Grid, Point, config_path
from recformer.lab.summary import summarize
from recformer.lifeline import child_env
from recformer.writer_lock import WriterAlive, hold

POINT_FILE = "point.json"
BUSY = "busy"
"""The status of a point another live process is running (its writer lock is held): not run."""
DIVERGED = "the run diverged"
"""What the module's non-finite stop says (``RankerModule._skip_nonfinite_step``)."""


SYNTH = "synth."
"""Settings of a point that change its synthetic data (``synth.order``, ``synth.rows``): arguments
of ``recformer data synth``, not of ``recformer fit``."""


def data_dir(grid: Grid, point: Point, out: Path) -> Path:
    """The point's data: a folder the grid names, or synthetic data written once per distinct set of
    ``recformer data synth`` arguments under ``out/data`` (points that share them share it)."""
    if "data_dir" in grid.data:
        path = Path(grid.data["data_dir"])
        return path if path.is_absolute() else REPO_ROOT / path
    args = {
        **grid.data["synth"],
        **{k[len(SYNTH) :]: v for k, v in point.settings.items() if k.startswith(SYNTH)},
    }
    key = "-".join(f"{k}{v}" for k, v in sorted(args.items()))
    path = out / "data" / f"synth-{key}"
    with _DATA_LOCK:  # two points of this process that need the same data: one writes it
        if not (path / "spec.yaml").is_file():
            # Written into a folder of this process, then renamed into place: job-array tasks on
            # other machines that share ``out`` may write the same data at once; the first rename
            # wins and the others use it (a rename onto a non-empty folder fails).
            tmp = path.with_name(f"{path.name}.tmp-{socket.gethostname()}-{os.getpid()}")
            shutil.rmtree(tmp, ignore_errors=True)
            cmd = [sys.executable, "-m", "recformer", "data", "synth", "--out", str(tmp)]
            cmd += [f"--{k.replace('_', '-')}={v}" for k, v in args.items()]
            proc = subprocess.run(cmd, capture_output=True, text=True, env=child_env())
            if proc.returncode != 0:
                raise RuntimeError(f"lab data of {grid.name}: {' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
            if path.exists() and not (path / "spec.yaml").is_file():
                shutil.rmtree(path, ignore_errors=True)  # a half-written one from an older version
            try:
                os.rename(tmp, path)
            except OSError:
                if not (path / "spec.yaml").is_file():
                    raise
                shutil.rmtree(tmp, ignore_errors=True)  # another task's copy is in place
    return path


_DATA_LOCK = threading.Lock()


def command(grid: Grid, point: Point, data: Path, out: Path) -> list[str]:
    """The ``recformer fit`` of ``point``: what the report prints to rerun it alone."""
    cmd = [sys.executable, "-m", "recformer", "fit"]
    for config in grid.configs:  # absolute: results.md's command reruns the point from any folder
        cmd += ["--config", str(config_path(config))]
    cmd += ["--config", str(_loggers(grid, point, out)), f"--data.data_dir={data}"]
    cmd += [f"--{k}={_cli(v)}" for k, v in point.settings.items() if not k.startswith(SYNTH)]
    return cmd + [f"--seed_everything={point.seed}", "--trainer.enable_progress_bar=false"]


def _cli(value: Any) -> str:
    return json.dumps(value) if isinstance(value, (list, dict, bool)) or value is None else str(value)


def _loggers(grid: Grid, point: Point, out: Path) -> Path:
    """CSV in ``out/points/<point>/version_0``, and W&B grouped by grid and size."""
    path = out / "loggers" / f"{point.name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "trainer:\n  logger:\n"
        "    - class_path: lightning.pytorch.loggers.CSVLogger\n"
        f"      init_args: {{save_dir: {out / 'points'}, name: {point.name}, version: 0}}\n"
        "    - class_path: recformer.loggers.SafeWandbLogger\n"
        f"      init_args: {{save_dir: {out}, name: {point.name}, group: lab-{grid.name}-{grid.size}}}\n"
    )
    return path


def run_point(grid: Grid, point: Point, out: Path, threads: int) -> dict[str, Any]:
    """Point ``point``'s result: its ``point.json`` when finished, else its fit run now (from
    scratch) under the point's writer lock; ``busy``, written nowhere, while another live process
    holds that lock."""
    out = out.resolve()  # the point's commands and data paths hold it: absolute, from any folder
    folder = out / "points" / point.name
    try:
        lock = hold(folder, f"lab point {point.name}:")
    except WriterAlive as e:
        return {
            "point": point.name,
            "labels": point.labels,
            "status": "busy",
            "seconds": 0.0,
            "error": str(e),
        }
    try:
        done = folder / "version_0" / POINT_FILE
        if done.is_file():
            return json.loads(done.read_text())
        return _run_fit(grid, point, out, threads, lock)
    finally:
        os.close(lock)


def _run_fit(grid: Grid, point: Point, out: Path, threads: int, lock: int) -> dict[str, Any]:
    """The point's ``recformer fit``, started afresh (a half-written folder removed first) as a
    child that dies with this process and holds the point's lock too, then summarised."""
    run_dir = out / "points" / point.name / "version_0"
    shutil.rmtree(run_dir, ignore_errors=True)  # a point interrupted half-way starts again
    data = data_dir(grid, point, out)
    cmd = command(grid, point, data, out)
    env = child_env({**os.environ, "OMP_NUM_THREADS": str(threads)})
    start = time.perf_counter()
    # In the folder lab run was started from, as results.md's command would be run: every path the
    # fit is given is absolute (it writes under ``out`` only), and a callback or module a grid names
    # imports from there as it would for the user's own ``recformer fit``.
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, pass_fds=(lock,))
    seconds = time.perf_counter() - start
    status = "ok" if proc.returncode == 0 else ("diverged" if DIVERGED in proc.stderr else "failed")
    result = {
        "point": point.name,
        "labels": point.labels,
        "settings": point.settings,
        "seed": point.seed,
        "status": status,
        "seconds": round(seconds, 1),
        "run": str(run_dir),
        "command": "recformer " + " ".join(shlex.quote(c) for c in cmd[3:]),
        **(summarize(run_dir) if run_dir.is_dir() else {}),
    }
    if status == "diverged":  # the stop's own count: the last log step may be before it
        said = re.search(r"(\d+) optimizer steps in a row had non-finite", proc.stderr)
        logged = result.get("nonfinite_steps", math.nan)
        result["nonfinite_steps"] = max(
            int(said.group(1)) if said else 0, 0 if math.isnan(logged) else logged
        )
    if status == "failed":
        result["error"] = proc.stderr[-2000:]
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / POINT_FILE).write_text(json.dumps(result, indent=2))
    return result


def run_grid(grid: Grid, out: Path, jobs: int = 1, log=print) -> list[dict[str, Any]]:
    """Every point of ``grid`` (finished ones kept), ``jobs`` at a time; their results."""
    out = out.resolve()
    points = grid.points()
    threads = max(1, (os.cpu_count() or 1) // jobs)
    results: list[dict[str, Any]] = []
    with cf.ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(run_point, grid, p, out, threads): p for p in points}
        for future in cf.as_completed(futures):
            r = future.result()
            results.append(r)
            log(f"[{len(results)}/{len(points)}] {r['point']}: {r['status']} ({r['seconds']:.0f} s)")
    order = {p.name: i for i, p in enumerate(points)}
    return sorted(results, key=lambda r: order[r["point"]])
