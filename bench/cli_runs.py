"""What the quality benches share: ``recformer fit`` and ``recformer evaluate`` run as a user runs
them (subprocesses of the CLI), the best validation checkpoint of a run, its test metrics, and the
paired DeLong test of two checkpoints on the same rows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
METRICS = ("auc", "auc_lo", "auc_hi", "gauc", "gauc_groups", "logloss", "ne", "calibration", "rows")
"""The fields of ``recformer evaluate``'s JSON a bench row keeps."""


def run(cmd: list[str], threads: int | None = None) -> str:
    """``cmd`` from the repository root; its stdout, or its stderr's tail in the error."""
    env = {**os.environ, "WANDB_MODE": "disabled"}
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-4000:]}")
    return proc.stdout


def fit(
    configs: list[str], args: list[str], logs: Path, name: str, threads: int | None = None
) -> tuple[Path, float]:
    """``recformer fit --config C ... ARGS`` logging to ``<logs>/<name>/version_0`` (CSV only);
    that folder and the fit's wall seconds."""
    loggers = logs / f"{name}-loggers.yaml"
    loggers.parent.mkdir(parents=True, exist_ok=True)
    loggers.write_text(
        "trainer:\n  logger:\n    - class_path: lightning.pytorch.loggers.CSVLogger\n"
        f"      init_args: {{save_dir: {logs}, name: {name}, version: 0}}\n"
    )
    cmd = [sys.executable, "-m", "recformer", "fit"]
    for c in [*configs, str(loggers)]:
        cmd += ["--config", c]
    start = time.perf_counter()
    run(cmd + ["--trainer.enable_progress_bar=false", *args], threads)
    return logs / name / "version_0", time.perf_counter() - start


def best_checkpoint(run_dir: Path) -> Path:
    """The run's monitored best checkpoint (the one file beside ``last.ckpt``)."""
    best = [p for p in (run_dir / "checkpoints").glob("*.ckpt") if p.name != "last.ckpt"]
    if len(best) != 1:
        raise RuntimeError(f"expected one best checkpoint in {run_dir / 'checkpoints'}, found {best}")
    return best[0]


def _evaluate_once(ckpt: Path, data_dir: str, out: Path, *extra: str) -> dict:
    """``recformer evaluate --ckpt CKPT [EXTRA] --data DATA --out OUT`` unless ``out`` exists (run
    once); its JSON."""
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "recformer", "evaluate", "--ckpt", str(ckpt), *extra]
        run(cmd + ["--data", data_dir, "--out", str(out)])
    return json.loads(out.read_text())


def evaluate(ckpt: Path, data_dir: str, out: Path) -> dict:
    """``recformer evaluate`` of ``ckpt`` on the test split (kept in ``out``: run once)."""
    r = _evaluate_once(ckpt, data_dir, out)
    return {k: r[k] for k in METRICS}


def paired(ckpt: Path, other: Path, data_dir: str, out: Path) -> dict:
    """Paired DeLong test of AUC(ckpt) - AUC(other) on the same test rows (``evaluate --compare``)."""
    return _evaluate_once(ckpt, data_dir, out, "--compare", str(other))["compare"]
