"""StreamingEvaluator (recformer/metrics/streaming.py) against the exact offline metrics, in memory
and after spilling to disk."""

from __future__ import annotations

import math

import numpy as np
import pytest

from recformer.metrics import (
    StreamingEvaluator,
    calibration,
    calibration_table,
    delong_ci,
    exact_auc,
    gauc,
    logloss,
    normalized_entropy,
)
from tests.test_metrics_exact import _data


def _stream(ev: StreamingEvaluator, g, x, y, w, n_chunks: int = 9):
    for chunk in np.array_split(np.arange(x.size), n_chunks):
        ev.update(x[chunk], y[chunk], w[chunk], g[chunk])
    return ev.compute()


def test_streaming_in_memory_is_exact():
    g, x, y, w = _data(4_000, seed=11, ties=True)
    with StreamingEvaluator(calibration_bins=5) as ev:
        r = _stream(ev, g, x, y, w)
    assert r.auc_exact and r.rows == 4_000 and r.calibration_table_exact
    assert r.auc == pytest.approx(exact_auc(x, y, w), abs=1e-12)
    assert abs(r.auc_binned - r.auc) < 2e-3
    assert math.isnan(r.auc_se)  # weighted: no DeLong interval
    assert (r.gauc, r.gauc_groups) == pytest.approx(gauc(g, x, y, w), abs=1e-12)
    assert r.logloss == pytest.approx(logloss(x, y, w), rel=1e-12)
    assert r.ne == pytest.approx(normalized_entropy(x, y, w), rel=1e-12)
    assert r.calibration == pytest.approx(calibration(x, y, w), rel=1e-12)
    assert r.calibration_table == calibration_table(x, y, 5, w)
    with StreamingEvaluator() as ev:
        r = _stream(ev, g, x, y, np.ones_like(w))
    assert (r.auc, r.auc_lo, r.auc_hi, r.auc_se) == pytest.approx(delong_ci(x, y), abs=1e-12)


def test_streaming_spilled_gauc_stays_exact(tmp_path):
    g, x, y, w = _data(5_000, seed=12, n_groups=300)
    for groups in (g, np.array([f"u{u}" for u in g])):
        # 500 rows in memory over 4 partitions of ~1250 rows: spills, and re-splits every partition.
        with StreamingEvaluator(max_rows_in_memory=500, n_partitions=4, spill_dir=tmp_path) as ev:
            r = _stream(ev, groups, x, y, w, n_chunks=23)
            assert ev.spilled and any((ev._spill_dir / "part-000-split").glob("*.parquet"))
        assert not r.auc_exact and not r.calibration_table_exact
        assert (r.gauc, r.gauc_groups) == pytest.approx(gauc(g, x, y, w), abs=1e-12)
        assert r.auc == r.auc_binned == pytest.approx(exact_auc(x, y, w), abs=2e-3)
        assert r.logloss == pytest.approx(logloss(x, y, w), rel=1e-12)
        assert sum(row["rows"] for row in r.calibration_table) == 5_000
        assert list(tmp_path.iterdir()) == []  # close() removed the spill directory


def test_calibration_table_means_the_same_in_memory_and_spilled(tmp_path):
    """Weighted data: the exact table and the histogram one (after a spill) cut the same
    equal-weight bins, so the two agree up to the histogram's resolution."""
    g, x, y, w = _data(6_000, seed=13)
    w = w * np.where(x > 0, 10.0, 1.0)  # weight concentrated on high scores
    tables = []
    for limit in (10_000, 1_000):
        with StreamingEvaluator(max_rows_in_memory=limit, calibration_bins=4, spill_dir=tmp_path) as ev:
            r = _stream(ev, g, x, y, w)
        tables.append(r.calibration_table)
        assert r.calibration_table_exact == (limit == 10_000)
    exact, binned = tables
    assert [t["weight"] for t in binned] == pytest.approx([t["weight"] for t in exact], rel=0.01)
    assert [t["mean_pred"] for t in binned] == pytest.approx([t["mean_pred"] for t in exact], abs=2e-3)


def test_gauc_reports_the_groups_it_leaves_out():
    g = np.array([1, 1, 2, 2, 3, 3, 3, 4])
    x = np.array([0.1, 0.9, 0.2, 0.8, 0.3, 0.4, 0.5, 0.6])
    y = np.array([0, 1, 1, 0, 1, 1, 1, 0])  # groups 3 (all positive) and 4 (one row) lack a class
    with StreamingEvaluator() as ev:
        ev.update(x, y, groups=g)
        r = ev.compute()
    assert r.gauc_groups == 2 and r.gauc_groups_excluded == 2
    assert r.gauc_excluded_share == pytest.approx(4 / 8)
    assert r.gauc == pytest.approx(0.5)  # group 1 ranks right, group 2 wrong


def test_streaming_rejects_bad_batches():
    ev = StreamingEvaluator()
    ev.update([0.1, 0.2], [0, 1], groups=[1, 2])
    with pytest.raises(ValueError, match="batch starting at row 2.*labels hold 1 values outside"):
        ev.update([0.1, 0.2], [0, 3], groups=[1, 2])
    with pytest.raises(ValueError, match="groups given on some batches but not others"):
        ev.update([0.1, 0.2], [0, 1])
