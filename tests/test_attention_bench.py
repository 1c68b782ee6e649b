"""bench/bench_attention.py end to end at tiny shapes: both kernels timed, ``auto``'s choice named."""

from __future__ import annotations

import json

from tests.conftest import load_bench


def test_attention_bench_times_both_kernels_and_names_autos_choice(tmp_path):
    bench = load_bench("bench_attention")
    out = tmp_path / "a.json"
    rows = bench.main(
        ["--tokens", "8", "96", "--heads", "2", "--batch-tokens", "192", "--steps", "1", "--threads", "1"]
        + ["--out", str(out)]
    )
    assert [(r["tokens"], r["queries"]) for r in rows] == [(8, 8), (8, 2), (96, 96), (96, 2)]
    assert [r["auto"] for r in rows] == ["matmul", "matmul", "sdpa", "sdpa"]
    assert all(r["sdpa_ms"] > 0 and r["matmul_ms"] > 0 for r in rows)
    assert json.loads(out.read_text())["rows"] == rows
