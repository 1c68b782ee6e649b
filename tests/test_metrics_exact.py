"""Exact offline metrics (recformer/metrics/exact.py) against slow reference implementations.

The data generator and the pairwise AUC reference here are shared with the other metrics tests.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from recformer.metrics import (
    calibration,
    calibration_table,
    delong_ci,
    delong_paired,
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


def _slow_components(s, y):
    pos, neg = s[y == 1], s[y == 0]
    psi = (pos[:, None] > neg[None, :]) + 0.5 * (pos[:, None] == neg[None, :])
    return psi.mean(), psi.mean(axis=1), psi.mean(axis=0)


def test_delong_paired_matches_the_structural_components_by_brute_force():
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


def test_the_paired_p_value_keeps_its_digits_far_in_the_tail():
    """p from the log survival function: 2 * (1 - cdf(z)) gave 0 past z of about 8.3 (issue 30:
    z = 9.41 printed "p < 1e-300" and stored 0.0)."""
    from recformer.metrics.exact import two_sided_log_p

    assert math.exp(two_sided_log_p(1.959963984540054)) == pytest.approx(0.05, rel=1e-12)
    assert math.exp(two_sided_log_p(9.41)) == pytest.approx(4.96137e-21, rel=1e-5)  # erfc(9.41 / sqrt 2)
    # Past erfc's range the tail series takes over, continuous where they meet and beyond a double.
    assert two_sided_log_p(36.999) == pytest.approx(two_sided_log_p(37.0), abs=0.04)
    assert two_sided_log_p(40.0) / math.log(10) == pytest.approx(-349.1360, abs=1e-4)
    rng = np.random.default_rng(3)
    y = (rng.random(4000) < 0.5).astype(float)
    good, noise = y + rng.normal(size=4000), rng.normal(size=4000)  # z about 21
    r = delong_paired(good, noise, y)
    z = r["diff"] / r["se"]
    assert z > 9 and 0 < r["p_value"] < 1e-90  # 0.0 before
    assert r["log10_p_value"] == pytest.approx(math.log10(math.erfc(z / math.sqrt(2))), rel=1e-9)


def test_the_compare_line_sits_with_the_metrics_and_prints_p_past_a_double():
    from recformer.evaluate import format_table

    r = {
        "split": "test",
        "data": "d",
        "rows": 10,
        "base_rate": 0.5,
        "auc": 0.8,
        "auc_exact": True,
        "auc_lo": 0.7,
        "auc_hi": 0.9,
        "gauc": 0.6,
        "gauc_groups": 3,
        "gauc_groups_excluded": 0,
        "gauc_excluded_share": 0.0,
        "logloss": 0.5,
        "ne": 0.8,
        "calibration": 1.0,
        "unknown_ids": {},
        "calibration_table": [{"bin": 0, "mean_pred": 0.2, "mean_label": 0.25, "rows": 10}],
        "compare": {"checkpoint": "b.ckpt", "arch": "din", "diff": 0.05, "lo": 0.04, "hi": 0.06}
        | {"se": 0.001, "p_value": 0.0, "log10_p_value": -543.21},
    }
    lines = format_table(r).splitlines()
    (i,) = [k for k, line in enumerate(lines) if "b.ckpt" in line]
    assert "p = 6.2e-544 (paired DeLong)" in lines[i]
    assert i < lines.index("  calibration table (bin: mean prediction vs observed):")
    r["compare"] |= {"p_value": 4.96e-21, "log10_p_value": math.log10(4.96e-21)}
    assert "p = 5e-21 (paired DeLong)" in format_table(r)
