"""bench/quality.py and bench/bench_throughput.py end to end on a tiny dataset: the grid tuned on
validation, the chosen settings over two seeds with paired tests, the throughput table."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def _grid(tmp_path: Path, data: Path) -> Path:
    """Two models, two learning rates, one regulariser value, one epoch, on ``data``."""
    model = tmp_path / "tiny-model.yaml"
    model.write_text(yaml.safe_dump({"model": {"ranker": {"d_model": 16, "n_heads": 2}}}))
    data_config = tmp_path / "data.yaml"
    tiny = {"data": {"batch_size": 64, "num_workers": 0}, "model": {"optim": {"warmup_steps": 2}}}
    data_config.write_text(yaml.safe_dump(tiny))  # every model: 9 steps an epoch
    grid = {
        "epochs": 1,
        "data_dir": str(data),
        "data_config": str(data_config),
        "lr": [1.0e-3, 3.0e-3],
        "regularisation": {"model.optim.embedding_decay": [0.0]},
        "models": {
            "transformer": {"config": str(model)},
            "popularity": {"config": "configs/model/popularity.yaml"},
        },
    }
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(grid))
    return path


@pytest.mark.slow
def test_quality_bench_tunes_on_validation_then_tests_the_chosen_settings_over_seeds(tiny_data, tmp_path):
    out = tmp_path / "q"
    cmd = [sys.executable, "bench/quality.py", "--grid", str(_grid(tmp_path, tiny_data)), "--seeds", "0", "1"]
    proc = subprocess.run(cmd + ["--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    tuning = json.loads((out / "tuning.json").read_text())
    assert len(tuning) == 4 and {r["seed"] for r in tuning} == {0}  # 2 models x 2 LRs, seed 0
    chosen = json.loads((out / "chosen.json").read_text())
    for arch in ("transformer", "popularity"):  # the best validation AUC of its points
        best = max((r for r in tuning if r["arch"] == arch), key=lambda r: r["val_auc"])
        assert chosen[arch] == best["setting"]
    final = json.loads((out / "final.json").read_text())
    assert sorted((r["arch"], r["seed"]) for r in final) == sorted(
        (a, s) for a in ("transformer", "popularity") for s in (0, 1)
    )
    paired = json.loads((out / "paired.json").read_text())
    assert [(t["baseline"], t["seed"]) for t in paired] == [("popularity", 0), ("popularity", 1)]
    for t in paired:
        ref = next(r for r in final if r["arch"] == "transformer" and r["seed"] == t["seed"])
        other = next(r for r in final if r["arch"] == "popularity" and r["seed"] == t["seed"])
        assert t["diff"] == pytest.approx(ref["auc"] - other["auc"], abs=1e-9)
    throughput = json.loads((out / "throughput.json").read_text())["models"]
    assert {"transformer", "popularity", "transformer content=target"} <= set(throughput)
    assert "transformer - popularity" in proc.stdout and "samples/s" in proc.stdout
    table = (out / "report.md").read_text()  # the README's table, also printed
    assert table in proc.stdout and "| transformer | lr " in table and "- popularity, seed 1: " in table


def test_throughput_bench_times_every_model_and_token_option(tiny_data, tmp_path):
    cmd = [sys.executable, "bench/bench_throughput.py", "--grid", str(_grid(tmp_path, tiny_data))]
    cmd += ["--data", str(tiny_data), "--batch", "32", "--steps", "2", "--warmup", "1", "--threads", "1"]
    proc = subprocess.run(
        cmd + ["--out", str(tmp_path / "t.json")], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads((tmp_path / "t.json").read_text())["models"]
    base = rows["transformer"]
    assert rows["transformer"]["vs_reference"] == 1.0
    assert rows["transformer content=target"]["tokens"] == base["tokens"] + 1
    assert rows["transformer content=all"]["tokens"] == base["tokens"] + 1 + 6  # + every history event (6)
    assert rows["popularity"]["tokens"] == 1
    assert all(r["samples_per_s"] > 0 for r in rows.values())


def test_gauc_headroom_factorises_the_train_split_and_scores_its_chosen_epoch(tiny_data):
    from tests.conftest import load_bench

    best = load_bench("gauc_headroom").factorise(tiny_data, factors=4, l2=1e-4, epochs=2, seed=0)
    assert best["epoch"] in (0, 1)
    for key in ("val_auc", "val_gauc", "test_auc", "test_gauc"):
        assert 0.0 <= best[key] <= 1.0, key
