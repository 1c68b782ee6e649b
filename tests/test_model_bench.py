"""bench/bench_model.py: the FLOP count behind MFU, and a one-step smoke run of the script."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from recformer.config import RankerConfig
from tests.conftest import load_bench


@pytest.fixture(scope="module")
def bench():
    return load_bench("bench_model")


def test_flops_per_sample_matches_the_textbook_count(bench) -> None:
    D, L, T = 64, 3, 20
    cfg = RankerConfig(d_model=D, n_layers=L, n_heads=4, mlp="gelu")  # M = 4D
    full_block = 24 * D * D * T + 4 * T * T * D  # 2 x 12 D^2 per token, q k^T and p v
    assert bench.flops_per_sample(cfg, T) == 3 * L * full_block
    # Last block updating 2 read tokens: k, v for all T, the rest for 2 queries.
    last = 4 * D * D * T + 20 * D * D * 2 + 4 * 2 * T * D
    assert bench.flops_per_sample(cfg, T, last_block_queries=2) == 3 * ((L - 1) * full_block + last)


def test_bench_runs_and_writes_json(bench, tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    args = ["--iters", "1", "--warmup", "0", "--batch", "4", "--tokens", "10", "--d-model", "16"]
    result = bench.main([*args, "--heads", "2", "--layers", "1", "--json", str(out)])
    saved = json.loads(out.read_text())
    assert saved["tokens"] == 10 and result["tokens"] == 10
    for name in ("ranker", "reference", "ranker-all"):
        assert saved[name]["samples_per_s"] > 0
    assert saved["ratio"] == pytest.approx(
        saved["ranker"]["samples_per_s"] / saved["reference"]["samples_per_s"]
    )
