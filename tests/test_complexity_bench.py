"""bench/complexity.py end to end on a tiny dataset: both rankers trained and evaluated on the same
test rows, and the paired test of their AUC difference written per order."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_complexity_bench_trains_both_sizes_per_order(tmp_path: Path) -> None:
    out = tmp_path / "cx"
    cmd = [sys.executable, "bench/complexity.py", "--orders", "1", "--rows", "8000", "--epochs", "1"]
    proc = subprocess.run(cmd + ["--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    [row] = json.loads((out / "results.json").read_text())
    assert row["order"] == 1
    tiny, small, diff = row["tiny"], row["small"], row["small_minus_tiny"]
    assert tiny["rows"] == small["rows"] == 800  # the same test split, every row
    assert diff["diff"] == pytest.approx(small["auc"] - tiny["auc"], abs=1e-9)
    assert diff["lo"] < diff["diff"] < diff["hi"]
    assert "order 1: AUC tiny" in proc.stdout
