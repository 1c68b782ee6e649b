"""On-device torchmetrics (recformer/metrics/training.py) against the exact offline metrics, and
DDP reduction with 2 gloo CPU processes."""

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
    calibration,
    exact_auc,
    gauc,
    logloss,
    normalized_entropy,
)
from tests.test_metrics_exact import _data, _pairwise_auc


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
    """A rank with no rows holds empty list states, for which torchmetrics sends a float32 stand-in
    at the gather: an int64 state there would make gloo abort the process. Group keys beyond 2**24
    stay exact."""
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
    # The histograms alone are far off on these scores: why BinnedAUC keeps the rows up to its cap.
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
