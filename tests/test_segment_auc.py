"""bench/segment_auc.py: two models' AUC by quartile of each dense column."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import load_bench


def test_each_quartile_holds_its_rows_and_both_models_auc(monkeypatch):
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "bench"))
    sa = load_bench("segment_auc")
    rng = np.random.default_rng(0)
    n = 400
    x = np.arange(n, dtype=np.float64)  # one dense column: quartiles of 100 rows each
    y = rng.integers(0, 2, n).astype(np.float64)
    noise = rng.normal(size=n)
    a = np.where(x >= 300, y, noise)  # model a orders the last quartile perfectly, the rest at random
    rows = sa.segments("val", ["d"], x[:, None], y, {"a": a, "b": noise})
    assert len(rows) == 5
    cells = [r.strip("|").split("|") for r in rows]
    assert [int(c[2]) for c in cells] == [400, 100, 100, 100, 100]  # every row in exactly one cut
    q4 = [float(v) for v in cells[4][3:6]]
    assert q4[0] == pytest.approx(1.0) and q4[2] == pytest.approx(q4[0] - q4[1])
    for c in cells[1:4]:
        assert float(c[5]) == pytest.approx(0.0)  # the same scores there
    assert np.isnan(sa.auc(np.zeros(3), np.ones(3)))  # one class: no AUC
