"""bench/library_baselines.py: the library's inputs from a MovieLens-shaped folder, its search and
its stopping rule (the library itself is not a recformer dependency: not needed here)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import yaml

from tests.conftest import load_bench

SPEC = {
    "label": "label",
    "group": "user_id",
    "keys": ["user_id", "item_id", "timestamp"],
    "item": {
        "column": "item_id",
        "vocab_size": 3,
        "side_table": "items.parquet",
        "content_column": "content_emb",
        "content_dim": 3,
    },
    "dense": [
        {"name": "user_n_prior", "mean": 1.0, "std": 2.0, "log1p": True},
        {"name": "item_pos_rate_prior", "mean": 0.5, "std": 0.25, "log1p": False},
    ],
}


def _folder(root: Path, item_ids: list[int]) -> Path:
    """Three rows of a MovieLens-shaped split and a side table of items 0, 1 and 2."""
    root.mkdir()
    (root / "spec.yaml").write_text(yaml.safe_dump(SPEC))
    content = pa.array([[float(i)] * 3 for i in (0, 1, 2)], pa.list_(pa.float16(), 3))
    pq.write_table(
        pa.table(
            {
                "item_id": pa.array([2, 0, 1], pa.int32()),  # not in id order: rows are looked up
                "year_bucket": pa.array([7, 5, 6], pa.int8()),
                "genre_ids": pa.array([[3], [0, 1], [2]], pa.list_(pa.int8())),
                "content_emb": content.take([2, 0, 1]),
            }
        ),
        root / "items.parquet",
    )
    (root / "train").mkdir()
    hist = [[], [0, 1, 2], list(range(60))]  # a history longer than the library's 50 slots
    pq.write_table(
        pa.table(
            {
                "user_id": pa.array([1, 1, 2], pa.int64()),
                "item_id": pa.array(item_ids, pa.int32()),
                "timestamp": pa.array([1, 2, 3], pa.int64()),
                "label": pa.array([1, 0, 1], pa.int8()),
                "hist_item_ids": pa.array(hist, pa.list_(pa.int32())),
                "hist_ratings": pa.array([[], [1, 10, 4], [2] * 60], pa.list_(pa.int8())),
                "hour": pa.array([0, 23, 5], pa.int8()),
                "dow": pa.array([6, 0, 1], pa.int8()),
                "user_n_prior": pa.array([-1.0, 3.0, 9.0], pa.float32()),  # a negative: sign log1p |x|
                "item_pos_rate_prior": pa.array([0.5, 0.75, 0.25], pa.float32()),
            }
        ),
        root / "train" / "part-00000.parquet",
    )
    return root


def test_the_library_inputs_shift_ids_pad_histories_and_scale_as_the_spec_says(tmp_path):
    lb = load_bench("library_baselines")
    x, y, users = lb.library_inputs(_folder(tmp_path / "ml", [1, 2, 0]), "train")
    assert y.tolist() == [1.0, 0.0, 1.0] and users.tolist() == [1, 1, 2]
    assert x["item_id"].tolist() == [2, 3, 1]  # 0 is the padding row
    assert x["hour"].tolist() == [1, 24, 6] and x["dow"].tolist() == [7, 1, 2]
    assert x["year_bucket"].tolist() == [7, 8, 6]  # items 1, 2, 0 of the side table: 6, 7, 5
    assert x["genre_ids"][1].tolist() == [4] + [0] * 9 and x["genre_len"].tolist() == [1, 1, 2]
    assert x["hist_len"].tolist() == [0, 3, 50]
    assert x["hist_item_id"][1, :4].tolist() == [1, 2, 3, 0]
    assert x["hist_item_id"][2].tolist() == list(range(11, 61))  # the 50 most recent, shifted
    assert x["hist_ratings"][1, :4].tolist() == [1, 10, 4, 0]  # coded 1-10 already: kept
    assert x["hist_ratings"].shape == (3, 50) and (x["hist_ratings"][0] == 0).all()
    scaled = (np.array([-np.log1p(1.0), np.log1p(3.0), np.log1p(9.0)]) - 1.0) / 2.0  # recformer's encoder's
    np.testing.assert_allclose(x["user_n_prior"], scaled, rtol=1e-6)
    np.testing.assert_allclose(x["item_pos_rate_prior"], [0.0, 1.0, -1.0])
    np.testing.assert_array_equal(x["content"], [[1.0] * 3, [2.0] * 3, [0.0] * 3])
    sizes = lb.vocab_sizes([x])
    assert sizes["item_id"] == 61 and sizes["hist_ratings"] == 11 and sizes["user_id"] == 3


def test_an_item_missing_from_the_side_table_is_named(tmp_path):
    lb = load_bench("library_baselines")
    with pytest.raises(ValueError, match=r"train: item_id values missing from items.parquet"):
        lb.library_inputs(_folder(tmp_path / "ml", [1, 2, 7]), "train")


def test_the_search_extends_an_edge_choice_and_keeps_each_stages_best(monkeypatch):
    lb = load_bench("library_baselines")
    best = {"lr": 1e-2, "l2": 0.0, "dropout": 0.9}  # past lr's grid, at l2's floor, dropout's cap
    runs = []

    def fake_run(jobs, n_jobs):
        out = []
        for j in jobs:
            s = j["setting"]
            runs.append(dict(s))
            score = -sum(abs(np.log10(s[k] + 1e-9) - np.log10(best[k] + 1e-9)) for k in best)
            out.append({**j, "kept": {"auc": score, "gauc": 0.0}})
        return out

    monkeypatch.setattr(lb, "_run", fake_run)
    args = type("A", (), {"data": Path("."), "max_epochs": 3, "patience": 2, "jobs": 1})()
    chosen = lb.tune(args, "deepfm", done := [])
    final = {"lr": 9e-3, "l2": 0.0, "dropout": 0.9, "embed": 16}  # the widths tie: the first
    assert chosen == final
    assert [r["lr"] for r in runs[:5]] == [3e-4, 1e-3, 3e-3, 9e-3, 2.7e-2]  # 3e-3 at the edge: on
    assert len(done) == len(runs)
    assert sorted({r["l2"] for r in runs}) == [
        0.0,
        1e-6,
        1e-5,
        1e-4,
        1e-3,
        1e-2,
        1e-1,
    ]  # 0 best: not extended
    dropouts = [r["dropout"] for r in runs if r["l2"] == 0.0 and r["embed"] == 16 and r["lr"] == 9e-3]
    assert dropouts == [0.0, 0.1, 0.3, 0.5, 0.7, 0.9]  # the l2 stage's 0, then on from each edge to the cap
    assert [r["embed"] for r in runs if r["embed"] != 16] == [64, 8]  # 16 at the lower edge: halved
    assert all(type(r["embed"]) is int for r in runs)  # a width is never rounded to a float
    # the rate once more at the final values: its neighbours run, the chosen fit is not rerun
    assert runs[-2:] == [{**final, "lr": 3e-3}, {**final, "lr": 2.7e-2}] and runs.count(final) == 1
    assert lb._extended("embed", [16, 64], 64) == 128 and lb._extended("embed", [4, 8], 4) is None
    assert lb._extended("embed", [5, 8], 5) is None and lb._extended("dropout", [0.1, 0.3], 0.1) == 0.0
    assert lb._extended("l2", [0.0, 1e-6], 0.0) is None and lb._extended("lr", [1e-3, 3e-3], 1e-3) == 1e-3 / 3


class _Net:
    """The library model's surface ``fit`` uses: an epoch counter for weights."""

    def __init__(self):
        self.epoch, self.loaded = 0, None

    def fit(self, *args, **kwargs):
        self.epoch += 1

    def state_dict(self):
        return {"epoch": torch.tensor(self.epoch)}

    def load_state_dict(self, state):
        self.loaded = int(state["epoch"])


def _fit(lb, monkeypatch, scores: list, test: bool) -> tuple[dict, _Net]:
    """``lb.fit`` on a fake model whose successive val (then test) scores are ``scores``."""
    net, seq = _Net(), iter(scores)
    split = ({"content": np.zeros((2, 3))}, np.zeros(2), np.zeros(2))
    monkeypatch.setattr(lb, "library_inputs", lambda data, s: split)
    monkeypatch.setattr(lb, "vocab_sizes", lambda splits: {})
    monkeypatch.setattr(lb, "feature_columns", lambda *a: [])
    monkeypatch.setattr(lb, "build", lambda *a: net)
    monkeypatch.setattr(lb, "_predict", lambda n, x: np.zeros(2))
    monkeypatch.setattr(
        lb, "_scores", lambda n, s: (lambda v: v and dict(zip(("auc", "gauc"), v)))(next(seq))
    )
    monkeypatch.setattr(lb, "_spec_dense", lambda data: [])
    job = {"model": "deepfm", "setting": {"embed": 16}, "seed": 0, "data": "x", "score_test": test}
    job.update(max_epochs=5, patience=2, threads=torch.get_num_threads())  # leave the process's threads
    return lb.fit(job), net


def test_a_fit_stops_after_its_patience_and_keeps_the_best_auc_plus_gauc(monkeypatch):
    lb = load_bench("library_baselines")
    val = [(0.70, 0.60), (0.72, 0.58), (0.71, 0.62), (0.715, 0.59)]
    out, net = _fit(lb, monkeypatch, [*val, (0.80, 0.70)], test=True)
    assert [h["epoch"] for h in out["history"]] == [1, 2, 3, 4]  # no better AUC at 3 and 4: stopped
    assert out["kept"]["epoch"] == 3 and net.loaded == 3 and not out["hit_cap"]  # best AUC + GAUC
    assert out["test"] == {"auc": 0.80, "gauc": 0.70} and out["diverged"] is None
    out, net = _fit(lb, monkeypatch, [(0.70 + 0.01 * i, 0.60) for i in range(5)], test=False)
    assert len(out["history"]) == 5 and out["hit_cap"] and net.loaded is None  # still rising at the cap


def test_a_diverged_fit_keeps_its_finite_epochs_and_scores_nothing_past_them(monkeypatch):
    lb = load_bench("library_baselines")
    out, net = _fit(lb, monkeypatch, [(0.70, 0.60), None, (0.9, 0.9)], test=True)
    assert out["diverged"] == 2 and out["kept"]["epoch"] == 1 and net.loaded == 1 and not out["hit_cap"]
    out, _ = _fit(lb, monkeypatch, [None], test=True)
    assert out["kept"] is None and "test" not in out and lb._score(out) == -np.inf  # the search's worst


def test_the_report_names_the_runs_it_lacks(tmp_path):
    lb = load_bench("library_baselines")
    out = tmp_path / "library"
    with pytest.raises(SystemExit, match=r"final.json: not found; the report reads the runs of this script"):
        lb.main(["--stage", "report", "--out", str(out)])
    (out / "final.json").write_text("[]")
    np.savez(out / "test_logits.npz")
    missing = tmp_path / "quality.json"
    with pytest.raises(SystemExit, match=r"quality.json: not found; the report reads the runs of bench"):
        lb.main(["--stage", "report", "--out", str(out), "--quality", str(missing)])
