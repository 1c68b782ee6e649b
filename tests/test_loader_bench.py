"""bench/bench_loader.py: every raw read it compares reads the same rows, across files."""

from __future__ import annotations

import argparse
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from recformer.datasets.synth import write_synth
from tests.conftest import load_bench


@pytest.fixture(scope="module")
def bench():
    return load_bench("bench_loader")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("synth")
    # Three files of uneven row groups: 1200 rows, 500 per file, 256 per row group.
    write_synth(
        out, 1200, val_rows=0, test_rows=0, users=50, items=100, max_len=8, content_dim=4,
        rows_per_file=500, row_group_size=256,
    )  # fmt: skip
    return out


def test_raw_reads_agree_on_rows_and_stop_at_the_limit(bench, data: Path) -> None:
    files = sorted((data / "train").glob("*.parquet"))
    assert [pq.ParquetFile(f).metadata.num_rows for f in files] == [500, 500, 200]
    for kwargs in bench.RAW_VARIANTS.values():
        assert bench.raw_scan(data, 10**9, **kwargs)[0] == 1200
        # From the last file (200 rows) round to the first: the limit is crossed in the first file.
        rows = bench.raw_scan(data, 300, first_file=2, **kwargs)[0]
        step = kwargs.get("chunk") or 256
        assert 300 <= rows <= 200 + -(-100 // step) * step


def test_raw_variants_are_ratios_to_read_row_group(bench, data: Path) -> None:
    out = bench.raw_variants(data, 10**9, rounds=2)
    assert list(out) == list(bench.RAW_VARIANTS)
    assert out["read_row_group"]["ratio"] == 1.0
    for v in out.values():
        assert v["q1"] <= v["ratio"] <= v["q3"] and v["cpu_us_row"] > 0


def test_throughput_compares_n_workers_with_n_scans_at_once(bench, data: Path) -> None:
    a = argparse.Namespace(data=data, limit=600, batch_size=64, repeats=1, workers=[1, 2], unpadded=[])
    out = bench.throughput(a)
    w1, w2 = out["loader w1"], out["loader w2"]
    assert "vs_parallel_raw" not in w1 and "par_raw" not in w1["runs"][0]
    run = w2["runs"][0]
    assert run["rows_s"] > 0 and run["par_raw"] > 0
    assert run["vs_par_raw"] == pytest.approx(run["rows_s"] / run["par_raw"])
    assert w2["vs_parallel_raw"]["median"] == run["vs_par_raw"]
    assert out["raw x2 in parallel"] == run["par_raw"]


def test_parallel_scans_add_up_each_scans_rate(bench, data: Path, monkeypatch) -> None:
    # Forked scans inherit the patch: each reports 100 rows in 0.5 s once all three have started.
    monkeypatch.setattr(bench, "raw_scan", lambda data, limit: (100, 0.5, 0.4))
    assert bench.raw_parallel(data, 10**9, 3) == 600.0
