"""Metrics against slow reference implementations, and DDP reduction with 2 gloo CPU processes."""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from recformer.metrics import (
    BinnedAUC,
    Calibration,
    GroupAUC,
    LogLoss,
    NormalizedEntropy,
    StreamingEvaluator,
    calibration,
    calibration_table,
    delong_ci,
    exact_auc,
    gauc,
    logloss,
    normalized_entropy,
)


def _data(n: int, seed: int, n_groups: int = 40, ties: bool = False):
    """Logits that carry signal about the labels, per-user base rates, positive weights."""
    rng = np.random.default_rng(seed)
    groups = rng.integers(0, n_groups, n)
    user_bias = rng.normal(0, 1, n_groups)[groups]
    labels = (rng.random(n) < 1 / (1 + np.exp(-(user_bias - 1)))).astype(np.float64)
    logits = user_bias - 1 + 0.8 * labels + rng.normal(0, 1.2, n)
    if ties:
        logits = np.round(logits, 1)  # many exact ties, within and across classes
    weights = rng.uniform(0.2, 3.0, n)
    return groups, logits, labels, weights


def _psi(a: float, b: float) -> float:
    return 1.0 if a > b else 0.5 if a == b else 0.0


def _pairwise_auc(s, y, w=None) -> float:
    """O(n^2) reference: every (positive-weight, negative-weight) pair, ties one half."""
    w = np.ones_like(s) if w is None else w
    pos, neg = w * y, w * (1 - y)
    num = sum(pos[i] * neg[j] * _psi(s[i], s[j]) for i in range(len(s)) for j in range(len(s)))
    return num / (pos.sum() * neg.sum())


# ----------------------------------------------------------------------------------------------
# Offline exact metrics
# ----------------------------------------------------------------------------------------------


def test_exact_auc_equals_pairwise_reference_with_ties_and_weights():
    _, s, y, w = _data(300, seed=1, ties=True)
    assert len(np.unique(s)) < 150  # the data really has ties
    assert exact_auc(s, y, w) == pytest.approx(_pairwise_auc(s, y, w), abs=1e-12)
    assert exact_auc(s, y) == pytest.approx(_pairwise_auc(s, y), abs=1e-12)
    # Soft labels: a row counts w*y positive and w*(1-y) negative.
    y_soft = np.random.default_rng(2).random(s.size)
    assert exact_auc(s, y_soft, w) == pytest.approx(_pairwise_auc(s, y_soft, w), abs=1e-12)


def test_exact_auc_known_values():
    assert exact_auc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1]) == pytest.approx(0.75)
    assert exact_auc([1, 1, 1, 1], [0, 1, 0, 1]) == pytest.approx(0.5)  # all tied
    assert exact_auc([3, 2, 1], [1, 0, 0]) == pytest.approx(1.0)


def test_delong_se_matches_structural_components():
    _, s, y, _ = _data(160, seed=3, ties=True)
    x_pos, x_neg = s[y == 1], s[y == 0]
    m, n = len(x_pos), len(x_neg)
    psi = np.array([[_psi(a, b) for b in x_neg] for a in x_pos])  # m x n
    v10, v01 = psi.mean(axis=1), psi.mean(axis=0)
    se_ref = math.sqrt(v10.var(ddof=1) / m + v01.var(ddof=1) / n)
    auc, lo, hi, se = delong_ci(s, y, alpha=0.95)
    assert auc == pytest.approx(psi.mean(), abs=1e-12)
    assert se == pytest.approx(se_ref, rel=1e-10)
    assert lo == pytest.approx(auc - 1.959963984540054 * se, abs=1e-9)
    assert hi == pytest.approx(auc + 1.959963984540054 * se, abs=1e-9)


def test_gauc_equals_per_user_loop():
    g, s, y, w = _data(600, seed=4, n_groups=30, ties=True)
    g[:5] = 999  # a group of one class only: must be left out
    y[:5] = 1.0

    def slow(weights):
        num, den, used = 0.0, 0.0, 0
        for u in np.unique(g):
            m = g == u
            if 0 < y[m].sum() < m.sum():
                gw = m.sum() if weights is None else weights[m].sum()
                num += gw * _pairwise_auc(s[m], y[m], None if weights is None else weights[m])
                den += gw
                used += 1
        return num / den, used

    for weights in (None, w):
        value, used = gauc(g, s, y, weights)
        ref, ref_used = slow(weights)
        assert used == ref_used and used < len(np.unique(g))
        assert value == pytest.approx(ref, abs=1e-12)
    # String group keys give the same answer.
    assert gauc(np.array([f"user-{u}" for u in g]), s, y)[0] == pytest.approx(slow(None)[0], abs=1e-12)


def test_logloss_ne_calibration_equal_direct_formulas():
    _, x, y, w = _data(500, seed=5)
    p = 1 / (1 + np.exp(-x))
    ll = -(w * (y * np.log(p) + (1 - y) * np.log(1 - p))).sum() / w.sum()
    base = (w * y).sum() / w.sum()
    h = -(base * np.log(base) + (1 - base) * np.log(1 - base))
    assert logloss(x, y, w) == pytest.approx(ll, rel=1e-12)
    assert normalized_entropy(x, y, w) == pytest.approx(ll / h, rel=1e-12)
    assert calibration(x, y, w) == pytest.approx((w * p).sum() / (w * y).sum(), rel=1e-12)
    # Stable at extreme logits where 1 - sigmoid(x) rounds to 0.
    assert logloss([60.0, -60.0], [0, 1]) == pytest.approx(60.0, rel=1e-12)


def test_calibration_table_per_bin_means():
    _, x, y, w = _data(103, seed=6)
    rows = calibration_table(x, y, bins=4, weights=w)
    order = np.argsort(x)
    # Equal-weight bins: a row goes to the bin its cumulative weight before it falls in.
    before = np.cumsum(w[order]) - w[order]
    k = np.minimum((4 * before / w.sum()).astype(int), 3)
    cuts = np.searchsorted(k, np.arange(5))
    assert [r["rows"] for r in rows] == list(np.diff(cuts))
    assert [r["weight"] for r in rows] == pytest.approx([w.sum() / 4] * 4, rel=0.1)
    unweighted = calibration_table(x, y, bins=4)
    assert [r["rows"] for r in unweighted] == [26, 26, 26, 25]  # equal counts without weights
    for r, lo, hi in zip(rows, cuts[:-1], cuts[1:]):
        idx = order[lo:hi]
        p = 1 / (1 + np.exp(-x[idx]))
        assert r["mean_pred"] == pytest.approx((w[idx] * p).sum() / w[idx].sum(), rel=1e-12)
        assert r["mean_label"] == pytest.approx((w[idx] * y[idx]).sum() / w[idx].sum(), rel=1e-12)
        assert r["pred_min"] <= r["mean_pred"] <= r["pred_max"]


def test_offline_errors_name_the_problem():
    with pytest.raises(ValueError, match="only one class"):
        exact_auc([0.1, 0.2], [1, 1])
    with pytest.raises(ValueError, match="labels hold 1 values outside"):
        exact_auc([0.1, 0.2], [0, 2])
    with pytest.raises(ValueError, match="non-finite"):
        logloss([0.1, float("nan")], [0, 1])
    with pytest.raises(ValueError, match="weights hold 1 values that are negative"):
        gauc([1, 1], [0.1, 0.2], [0, 1], [1.0, -1.0])
    with pytest.raises(ValueError, match="groups must be integers or strings"):
        gauc([0.5, 0.5], [0.1, 0.2], [0, 1])
    with pytest.raises(ValueError, match="no group holds both"):
        gauc([1, 2], [0.1, 0.2], [0, 1])
    with pytest.raises(ValueError, match="binary labels"):
        delong_ci([0.1, 0.2, 0.3, 0.4], [0, 0.5, 1, 1])


# ----------------------------------------------------------------------------------------------
# torchmetrics
# ----------------------------------------------------------------------------------------------


def test_binned_auc_close_to_exact():
    for seed in (7, 8):
        g, x, y, w = _data(20_000, seed=seed)
        x[:50] = 30.0  # beyond the bin range: clamped into the edge bin
        m = BinnedAUC(exact_max_rows=0)  # the histograms alone
        for chunk in np.array_split(np.arange(x.size), 7):
            m.update(torch.tensor(x[chunk]), torch.tensor(y[chunk]), torch.tensor(w[chunk]))
        assert float(m.compute()) == pytest.approx(exact_auc(x, y, w), abs=2e-3)
    coarse = BinnedAUC(n_bins=4, exact_max_rows=0)  # a wrong bin rule would not be this far off
    coarse.update(torch.tensor(x), torch.tensor(y))
    assert abs(float(coarse.compute()) - exact_auc(x, y)) > 5e-3


def test_binned_auc_nan_logit_gives_nan():
    m = BinnedAUC()
    m.update(torch.tensor([0.1, float("nan"), 2.0]), torch.tensor([0.0, 1.0, 1.0]))
    assert math.isnan(float(m.compute()))


def test_torchmetrics_equal_offline_metrics():
    g, x, y, w = _data(2_000, seed=9, ties=True)
    t = {k: torch.tensor(v) for k, v in dict(g=g, x=x, y=y, w=w).items()}
    for cls, ref in ((LogLoss, logloss), (NormalizedEntropy, normalized_entropy), (Calibration, calibration)):
        m = cls()
        m.update(t["x"][:700], t["y"][:700], t["w"][:700])
        m.update(t["x"][700:], t["y"][700:], t["w"][700:])
        assert float(m.compute()) == pytest.approx(ref(x, y, w), rel=1e-6), cls.__name__
    m = GroupAUC()
    m.update(t["x"][:900], t["y"][:900], t["g"][:900], t["w"][:900])
    m.update(t["x"][900:], t["y"][900:], t["g"][900:], t["w"][900:])
    # float32 storage of logits rounded to 0.1 keeps every tie and every order.
    assert float(m.compute()) == pytest.approx(gauc(g, x, y, w)[0], abs=1e-6)


def test_metric_update_checks_shapes():
    with pytest.raises(ValueError, match="preds_logits shape"):
        LogLoss().update(torch.zeros(3), torch.zeros(4))
    with pytest.raises(ValueError, match="group must be an integer"):
        GroupAUC().update(torch.zeros(3), torch.zeros(3), torch.zeros(3))


def _metrics() -> dict[str, object]:
    return {"auc": BinnedAUC(), "logloss": LogLoss(), "ne": NormalizedEntropy(), "gauc": GroupAUC()}


def _update_all(metrics: dict, g, x, y, w) -> dict[str, float]:
    for name, m in metrics.items():
        if name == "gauc":
            m.update(x, y, g, w)
        else:
            m.update(x, y, w)
    return {name: float(m.compute()) for name, m in metrics.items()}


def _ddp_worker(rank: int, world: int, init_file: str, data_file: str, out_dir: str, cut: int) -> None:
    """Rank 0 updates on rows ``:cut``, rank 1 on ``cut:``; a rank with no rows (fewer validation
    rows than ranks) makes no update at all."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        g, x, y, w = torch.load(data_file)
        sl = slice(0, cut) if rank == 0 else slice(cut, None)
        metrics = _metrics()
        if len(g[sl]):
            values = _update_all(metrics, g[sl], x[sl], y[sl], w[sl])
        else:
            values = {name: float(m.compute()) for name, m in metrics.items()}
        torch.save(values, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def _run_ddp(tmp_path: Path, data, cut: int) -> None:
    torch.save(data, tmp_path / "data.pt")
    # fork, not spawn: a spawned child re-imports torchmetrics (~5 s each on a loaded 2-core box).
    # Nothing here has started threads that fork could break (gloo is set up inside the children).
    mp.start_processes(
        _ddp_worker,
        args=(2, str(tmp_path / "init"), str(tmp_path / "data.pt"), str(tmp_path), cut),
        nprocs=2,
        join=True,
        start_method="fork",
    )


def test_ddp_rank_without_rows_still_reduces(tmp_path):
    """Its list states were empty; torchmetrics sends a float32 stand-in, which an int64 state
    met in the gather (gloo aborted the process). Group keys beyond 2**24 stay exact."""
    g, x, y, w = (torch.tensor(a) for a in _data(400, seed=14, n_groups=20))
    g = g * (1 << 40) + 12345  # hashed-key sized: float32 would merge them
    _run_ddp(tmp_path, (g, x, y, w), cut=len(g))  # rank 1 sees no rows
    full = _update_all(_metrics(), g, x, y, w)
    for rank in (0, 1):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        assert got == pytest.approx(full, abs=1e-6), rank


def test_ddp_reduction_equals_single_process(tmp_path):
    g, x, y, w = (torch.tensor(a) for a in _data(3_000, seed=10, n_groups=50))
    # Uneven halves: the "cat" state of GroupAUC is padded and trimmed by torchmetrics.
    _run_ddp(tmp_path, (g, x, y, w), cut=1700)
    full = _update_all(_metrics(), g, x, y, w)
    half = _update_all(_metrics(), g[:1700], x[:1700], y[:1700], w[:1700])
    for rank in (0, 1):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        for name in full:
            assert got[name] == pytest.approx(full[name], abs=1e-6), (rank, name)
            assert abs(half[name] - full[name]) > 1e-5, name  # rank 0 alone would differ: reduction ran


# ----------------------------------------------------------------------------------------------
# StreamingEvaluator
# ----------------------------------------------------------------------------------------------


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


def test_torch_gauc_and_calibration_refuse_to_hide_a_bad_epoch():
    m = GroupAUC()
    m.update(
        torch.tensor([0.1, float("nan"), 0.3, 0.9]),
        torch.tensor([0.0, 1.0, 0.0, 1.0]),
        torch.tensor([1, 1, 2, 2]),
    )
    assert math.isnan(m.compute())  # a NaN logit: NaN, not the AUC of the rest
    c = Calibration()
    c.update(torch.tensor([0.1, -0.3]), torch.tensor([0.0, 0.0]))
    assert math.isnan(c.compute())  # no positives: undefined, not inf


def test_streaming_rejects_bad_batches():
    ev = StreamingEvaluator()
    ev.update([0.1, 0.2], [0, 1], groups=[1, 2])
    with pytest.raises(ValueError, match="batch starting at row 2.*labels hold 1 values outside"):
        ev.update([0.1, 0.2], [0, 3], groups=[1, 2])
    with pytest.raises(ValueError, match="groups given on some batches but not others"):
        ev.update([0.1, 0.2], [0, 1])


def _slow_components(s, y):
    pos, neg = s[y == 1], s[y == 0]
    psi = (pos[:, None] > neg[None, :]) + 0.5 * (pos[:, None] == neg[None, :])
    return psi.mean(), psi.mean(axis=1), psi.mean(axis=0)


def test_delong_paired_matches_the_structural_components_by_brute_force():
    from recformer.metrics import delong_paired

    rng = np.random.default_rng(7)
    y = (rng.random(300) < 0.35).astype(float)
    a = np.round(y + rng.normal(size=300), 1)  # rounding makes ties
    b = np.round(0.5 * y + rng.normal(size=300), 1)
    r = delong_paired(a, b, y)
    auc_a, v10a, v01a = _slow_components(a, y)
    auc_b, v10b, v01b = _slow_components(b, y)
    m, n = v10a.size, v01a.size
    var = (np.var(v10a - v10b, ddof=1)) / m + (np.var(v01a - v01b, ddof=1)) / n
    assert r["auc_a"] == pytest.approx(auc_a) and r["auc_b"] == pytest.approx(auc_b)
    assert r["se"] == pytest.approx(np.sqrt(var), rel=1e-9)
    # Paired: far tighter than the two single-model intervals combined.
    assert r["se"] < np.hypot(delong_ci(a, y)[3], delong_ci(b, y)[3])
    assert r["lo"] < r["diff"] < r["hi"] and 0 <= r["p_value"] <= 1
    same = delong_paired(a, a, y)
    assert same["diff"] == 0 and same["se"] == 0 and same["p_value"] == 1.0


# ----------------------------------------------------------------------------------------------
# BinnedAUC: exact up to its row cap, binned beyond
# ----------------------------------------------------------------------------------------------


def _crowded(n: int, seed: int):
    """Scores of a barely trained model: logits in a 0.02-wide band (3-4 histogram bins) that still
    carry signal, on a 1e-4 grid (ties within and across classes); float32-exact, as the module's."""
    rng = np.random.default_rng(seed)
    y = (rng.random(n) < 0.4).astype(np.float64)
    x = np.round(np.clip(-0.044 + 0.0015 * y + rng.normal(0, 0.004, n), -0.054, -0.034), 4)
    w = rng.uniform(0.5, 2.0, n)
    return tuple(a.astype(np.float32).astype(np.float64) for a in (x, y, w))


def _rank_sum_auc(s, y, w) -> float:
    """Reference for binary labels: each positive beats the negative weight below its score and
    ties half the negative weight at its score (searchsorted over the sorted negatives)."""
    pos, neg = y == 1, y == 0
    order = np.argsort(s[neg])
    s_neg, cum = s[neg][order], np.concatenate([[0.0], np.cumsum(w[neg][order])])
    below = cum[np.searchsorted(s_neg, s[pos], "left")]
    up_to = cum[np.searchsorted(s_neg, s[pos], "right")]
    return float((w[pos] * (below + 0.5 * (up_to - below))).sum() / (w[pos].sum() * w[neg].sum()))


def _auc_of(m: BinnedAUC, x, y, w=None, n_chunks: int = 7) -> float:
    """The metric's value (float32, as it is logged: exact means within 1e-7 below)."""
    for chunk in np.array_split(np.arange(x.size), n_chunks):
        m.update(*(torch.tensor(a[chunk]) for a in (x, y) + (() if w is None else (w,))))
    return float(m.compute())


def test_binned_auc_is_exact_on_crowded_scores():
    x, y, w = _crowded(20_000, seed=20)
    assert len(np.unique(x)) < 250  # 20k rows on a few hundred scores: ties everywhere
    ref = _rank_sum_auc(x, y, w)
    assert _auc_of(BinnedAUC(), x, y, w) == pytest.approx(ref, abs=1e-7)
    assert _auc_of(BinnedAUC(), x, y) == pytest.approx(_rank_sum_auc(x, y, np.ones_like(w)), abs=1e-7)
    # The histograms alone are far off on these scores: what val/auc used to report.
    assert abs(_auc_of(BinnedAUC(exact_max_rows=0), x, y, w) - ref) > 5e-3


def test_binned_auc_exact_path_equals_pairwise_reference_with_soft_labels():
    x, y, w = _crowded(400, seed=21)
    y_soft = np.round(np.random.default_rng(22).random(x.size), 2).astype(np.float32).astype(np.float64)
    for labels in (y, y_soft):
        ref = _pairwise_auc(x, labels, w)
        assert _auc_of(BinnedAUC(), x, labels, w, n_chunks=3) == pytest.approx(ref, abs=1e-7)
        assert abs(_auc_of(BinnedAUC(exact_max_rows=0), x, labels, w, n_chunks=3) - ref) > 1e-3


def test_binned_auc_falls_back_past_its_row_cap_and_warns_once():
    x, y, w = _crowded(20_000, seed=23)
    binned = _auc_of(BinnedAUC(exact_max_rows=0), x, y, w)
    m = BinnedAUC(exact_max_rows=5_000)
    with pytest.warns(UserWarning, match=r"exact_max_rows=5000 .*20000 rows not kept"):
        assert _auc_of(m, x, y, w) == binned  # 7 chunks of ~2.9k rows: the second passes the cap
    assert m.logits == [] and m.labels == []  # past the cap the kept rows are freed
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert float(m.compute()) == binned  # warned once, not at every epoch
        m.reset()  # a new epoch under the cap is exact again
        assert _auc_of(m, x[:5_000], y[:5_000], w[:5_000]) == pytest.approx(
            _rank_sum_auc(x[:5_000], y[:5_000], w[:5_000]), abs=1e-7
        )
        assert _auc_of(BinnedAUC(exact_max_rows=0), x, y, w) == binned  # 0: binned, no warning


def test_binned_auc_forward_keeps_the_row_cap():
    """forward() resets the states, updates on the batch and merges them back: the cap must still
    be counted over all the rows kept, not over the last batch."""
    x, y, w = _crowded(6_000, seed=24)
    m = BinnedAUC(exact_max_rows=2_500)
    for chunk in np.array_split(np.arange(x.size), 12):
        m(*(torch.tensor(a[chunk]) for a in (x, y, w)))
        assert sum(t.numel() for t in m.logits) <= 2_500
    with pytest.warns(UserWarning, match="exact_max_rows=2500"):
        assert float(m.compute()) == _auc_of(BinnedAUC(exact_max_rows=0), x, y, w)


def test_binned_auc_keeps_its_rows_float32_under_to_dtype():
    x, y, w = _crowded(3_000, seed=25)
    m = BinnedAUC()
    m.update(*(torch.tensor(a) for a in (x, y, w)))
    m.to(dtype=torch.bfloat16)  # what Lightning's bf16-true does to the whole module
    assert {t.dtype for t in m.logits + m.labels + m.weights} == {torch.float32}
    assert m.pos_hist.dtype == m.rows_not_kept.dtype == torch.float64
    assert float(m.compute()) == pytest.approx(_rank_sum_auc(x, y, w), abs=1e-7)


@pytest.mark.filterwarnings("ignore:The ``compute`` method of metric BinnedAUC was called before")
def test_binned_auc_undefined_cases_stay_nan():
    for cap in (0, 100):
        assert math.isnan(BinnedAUC(exact_max_rows=cap).compute())  # no rows
        one_class = BinnedAUC(exact_max_rows=cap)
        one_class.update(torch.tensor([0.1, 0.2, 0.3]), torch.ones(3))
        assert math.isnan(one_class.compute())
        zero_weight = BinnedAUC(exact_max_rows=cap)
        zero_weight.update(torch.tensor([0.1, 0.2]), torch.tensor([0.0, 1.0]), torch.zeros(2))
        assert math.isnan(zero_weight.compute())
    with pytest.raises(ValueError, match="exact_max_rows=-1 must be >= 0"):
        BinnedAUC(exact_max_rows=-1)


def _auc_ddp_worker(rank: int, world: int, init_file: str, data_file: str, out_dir: str, cut: int) -> None:
    """Rank 0 updates on rows ``:cut``, rank 1 on ``cut:``, under a cap whose per-rank share (half)
    only rank 0 passes and under one neither does."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        x, y, w = torch.load(data_file)
        sl = slice(0, cut) if rank == 0 else slice(cut, None)
        values = {}
        for cap in (cut - 1, cut):
            m = BinnedAUC(exact_max_rows=world * cap)  # each rank keeps up to its share, cap
            m.update(x[sl], y[sl], w[sl])
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                values[cap] = float(m.compute())
        torch.save(values, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_ddp_binned_auc_exact_or_binned_on_every_rank_alike(tmp_path):
    x, y, w = _crowded(3_000, seed=26)
    cut = 1_700  # rank 0 holds 1700 rows, rank 1 1300
    torch.save(tuple(torch.tensor(a) for a in (x, y, w)), tmp_path / "data.pt")
    mp.start_processes(
        _auc_ddp_worker,
        args=(2, str(tmp_path / "init"), str(tmp_path / "data.pt"), str(tmp_path), cut),
        nprocs=2,
        join=True,
        start_method="fork",  # as _run_ddp
    )
    exact, binned = _rank_sum_auc(x, y, w), _auc_of(BinnedAUC(exact_max_rows=0), x, y, w)
    assert abs(exact - binned) > 5e-3
    for rank in (0, 1):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        assert got[cut] == pytest.approx(exact, abs=1e-7), rank  # both ranks under the cap
        assert got[cut - 1] == pytest.approx(binned, abs=1e-7), rank  # rank 0 passed it
