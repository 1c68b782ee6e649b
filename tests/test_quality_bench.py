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
        "score": ["val_auc"],
        "axes": {"model.optim.lr": {"values": [1.0e-3, 3.0e-3], "scale": "log", "max": 3.0e-3}},
        "defaults": {"model.optim.lr": 1.0e-3},
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
    # Each model at both LRs, seed 0, and one more below an edge best (3e-3 is the axis' max).
    assert {r["seed"] for r in tuning} == {0}
    for arch in ("transformer", "popularity"):
        lrs = sorted(r["setting"]["model.optim.lr"] for r in tuning if r["arch"] == arch)
        assert {1e-3, 3e-3} <= set(lrs) and len(lrs) == len(set(lrs)) <= 3, (arch, lrs)
    assert all("hit_cap" in r and r["best_epoch"] == 1 for r in tuning)
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
    assert table in proc.stdout and "| transformer | lr " in table and "| seed 0 | seed 1 |" in table
    assert table.count("\n| popularity | ") == 3  # its row, its GAUC per seed, its paired tests
    assert "Tuning on validation" in table and "| lr 0.001 | " in table  # every point searched


def _fake_fit(peak: dict[str, float]):
    """A stand-in for quality.fit whose validation AUC falls with the log distance from ``peak``."""
    import math

    calls = []

    def fit(arch, grid, setting, seed, out):
        calls.append(dict(setting))
        dist = sum(
            abs(math.log10(setting[k] + 1e-6) - math.log10(v + 1e-6)) for k, v in peak.items() if k in setting
        )
        return {"arch": arch, "setting": setting, "seed": seed, "val_auc": 0.8 - 0.01 * dist, "val_gauc": 0.6}

    return fit, calls


def test_quality_search_walks_each_axis_and_extends_an_edge(tmp_path, monkeypatch):
    """The coordinate search: every axis tried with the others held, an edge best extended until it
    is inside, then the learning rate once more; the preset's own values are the start."""
    from tests.conftest import load_bench

    monkeypatch.syspath_prepend(str(ROOT / "bench"))  # its sibling cli_runs
    q = load_bench("quality")
    grid = yaml.safe_load((ROOT / "configs/quality/grid.yaml").read_text())
    fit, calls = _fake_fit(
        {"model.optim.lr": 3e-2, "model.optim.embedding_l2": 1e-2, "model.ranker.dropout": 0.1}
    )
    monkeypatch.setattr(q, "fit", fit)
    chosen, tried = q.search(grid, "deepfm", tmp_path)
    # lr's best 3e-3 is the grid's top: 1e-2, then 3e-2 (the max) are added; the penalty's best
    # 1e-2 is inside; dropout's peak 0.1 (on a log distance, so 0.1 beats 0 and 0.2).
    assert chosen == {"model.optim.lr": 0.03, "model.optim.embedding_l2": 0.01, "model.ranker.dropout": 0.1}
    preset = yaml.safe_load((ROOT / "configs/model/deepfm.yaml").read_text())["model"]
    lrs = sorted({c["model.optim.lr"] for c in calls})  # the grid's, its extensions, the preset's own
    assert lrs == sorted({3e-4, 1e-3, 3e-3, 0.01, 0.03, preset["optim"]["lr"]})
    assert len(tried) == len({json.dumps(c, sort_keys=True) for c in calls})
    start = calls[0]  # the preset's own penalty and dropout, whatever they were tuned to
    assert start["model.optim.embedding_l2"] == preset["optim"]["embedding_l2"]
    assert start["model.ranker.dropout"] == preset["ranker"]["dropout"]


def test_quality_search_extends_a_penalty_up_but_not_below_zero(tmp_path, monkeypatch):
    from tests.conftest import load_bench

    monkeypatch.syspath_prepend(str(ROOT / "bench"))  # its sibling cli_runs
    q = load_bench("quality")
    grid = yaml.safe_load((ROOT / "configs/quality/grid.yaml").read_text())
    fit, _ = _fake_fit({"model.optim.lr": 1e-3, "model.optim.embedding_l2": 1.0, "model.ranker.dropout": 0.0})
    monkeypatch.setattr(q, "fit", fit)
    chosen, _ = q.search(grid, "popularity", tmp_path)  # no dropout axis
    assert chosen == {"model.optim.lr": 1e-3, "model.optim.embedding_l2": 1.0}
    assert q.extend(grid["axes"]["model.optim.embedding_l2"], [0.0, 1e-3], 0.0) is None
    assert q.extend(grid["axes"]["model.ranker.dropout"], [0.0, 0.1, 0.2, 0.3], 0.3) == 0.4


def test_throughput_bench_times_every_model_and_token_option(tiny_data, tmp_path):
    cmd = [sys.executable, "bench/bench_throughput.py", "--grid", str(_grid(tmp_path, tiny_data))]
    cmd += ["--data", str(tiny_data), "--batch", "32", "--steps", "2", "--warmup", "1", "--threads", "1"]
    cmd += ["--bf16"]
    proc = subprocess.run(
        cmd + ["--out", str(tmp_path / "t.json")], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads((tmp_path / "t.json").read_text())["models"]
    base = rows["transformer"]
    assert rows["transformer"]["vs_reference"] == 1.0
    # The paired ratio: each round's reference step over the model's; the reference's own is 1.
    assert base["vs_reference_paired"] == 1.0 and base["vs_reference_iqr"] == [1.0, 1.0]
    lo, hi = rows["popularity"]["vs_reference_iqr"]
    assert 0 < lo <= rows["popularity"]["vs_reference_paired"] <= hi
    assert rows["transformer content=target"]["tokens"] == base["tokens"] + 1
    assert rows["transformer content=all"]["tokens"] == base["tokens"] + 1 + 6  # + every history event (6)
    assert rows["popularity"]["tokens"] == 1
    # 32 and 40 recent events are more than the 6 the tiny data has: every event stays a token.
    assert rows["transformer history tokens 32, older mean"]["tokens"] == base["tokens"]
    assert {"transformer bf16-mixed", "popularity bf16-mixed", "transformer fm bf16-mixed"} <= set(rows)
    assert all(r["samples_per_s"] > 0 for r in rows.values())


def test_the_paired_ratios_quartiles_stay_within_its_rounds(monkeypatch):
    """Two rounds 5x apart (a busy machine): the quartiles lie within the rounds' ratios, where
    statistics.quantiles' default method extrapolated the lower one below zero."""
    import torch

    from tests.conftest import load_bench

    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    b = load_bench("bench_throughput")
    module = torch.nn.Linear(2, 2)
    module.ranker = type("R", (), {"n_tokens": 3})()
    rows = b.table(
        {"ref": (module, None), "other": (module, None)}, {"ref": [1.0, 1.0], "other": [1.0, 0.2]}, "ref", 8
    )
    lo, hi = rows["other"]["vs_reference_iqr"]
    assert 1.0 <= lo <= rows["other"]["vs_reference_paired"] == 3.0 <= hi <= 5.0
    assert rows["ref"]["vs_reference_iqr"] == [1.0, 1.0]


def test_gauc_headroom_factorises_the_train_split_and_scores_its_chosen_epoch(tiny_data):
    from tests.conftest import load_bench

    best = load_bench("gauc_headroom").factorise(tiny_data, factors=4, l2=1e-4, epochs=2, seed=0)
    assert best["epoch"] in (0, 1)
    for key in ("val_auc", "val_gauc", "test_auc", "test_gauc"):
        assert 0.0 <= best[key] <= 1.0, key


def test_the_joint_pass_reaches_a_pair_that_pays_only_with_both_changed(tmp_path, monkeypatch):
    """Rate and penalty each worse alone, better together: one axis at a time stays put, the joint
    pass moves there and stops when its neighbourhood holds nothing better."""
    from tests.conftest import load_bench

    monkeypatch.syspath_prepend(str(ROOT / "bench"))  # its sibling cli_runs
    q = load_bench("quality")
    grid = yaml.safe_load((ROOT / "configs/quality/grid.yaml").read_text())
    lr, l2, dr = "model.optim.lr", "model.optim.embedding_l2", "model.ranker.dropout"
    table = {(1e-3, 1e-3): 0.80, (3e-4, 1e-3): 0.79, (1e-3, 1e-2): 0.79, (3e-4, 1e-2): 0.82}
    calls = []

    def fit(arch, grid, setting, seed, out):
        calls.append(dict(setting))
        auc = table.get((setting[lr], setting[l2]), 0.7)
        return {"arch": arch, "setting": setting, "seed": seed, "val_auc": auc, "val_gauc": 0.6}

    monkeypatch.setattr(q, "fit", fit)
    start = {lr: 1e-3, l2: 1e-3, dr: 0.1}
    tried = {}
    chosen = q.joint(grid, "deepfm", [lr, l2, dr], start, tried, tmp_path)
    assert chosen == {lr: 3e-4, l2: 1e-2, dr: 0.1}
    first = {(c[lr], c[l2]) for c in calls[:9]}  # the 3 x 3 around the start, dropout held
    assert first == {(a, b) for a in (3e-4, 1e-3, 3e-3) for b in (0.0, 1e-3, 1e-2)}
    assert all(c[dr] == 0.1 for c in calls)
    assert len(calls) == len({json.dumps(c, sort_keys=True) for c in calls})  # no point twice
    assert {(c[lr], c[l2]) for c in calls[9:]} == {(3e-4, 0.1), (1e-3, 0.1)}  # the new neighbours


def test_a_cached_run_of_another_preset_is_set_aside_and_rerun(tmp_path, monkeypatch):
    """A finished point is reused only while its saved config holds what the preset and the
    point's flags give; otherwise it moves aside (with its paired tests) and runs again."""
    from tests.conftest import load_bench

    monkeypatch.syspath_prepend(str(ROOT / "bench"))  # its sibling cli_runs
    q = load_bench("quality")
    preset, data_config = tmp_path / "preset.yaml", tmp_path / "data.yaml"
    preset.write_text("model:\n  ranker:\n    d_model: 16\n  optim:\n    lr: 1.0e-3\n")
    data_config.write_text("data:\n  batch_size: 64\n")
    grid = {
        "data_dir": "d",
        "epochs": 3,
        "data_config": str(data_config),
        "models": {"t": {"config": str(preset)}},
    }
    name = q.name_of("t", {"model.optim.lr": 3e-05}, 0)
    run = tmp_path / "runs" / name / "version_0"
    run.mkdir(parents=True)
    saved = {
        "seed_everything": 0,
        "trainer": {"max_epochs": 3},
        "data": {"data_dir": "d", "batch_size": 64},
        "model": {"ranker": {"d_model": 16, "dropout": 0.0}, "optim": {"lr": 3e-05}},
    }
    (run / "config.yaml").write_text(yaml.safe_dump(saved))
    (run / "done.json").write_text(json.dumps({"cached": True}))
    (tmp_path / "paired").mkdir()
    (tmp_path / "paired" / f"{name}-vs-other-seed0.json").write_text("{}")
    (tmp_path / "paired" / f"{name}0-vs-other-seed0.json").write_text("{}")  # another run's

    def fake_fit(configs, args, logs, name, threads=None):
        raise AssertionError("rerun")

    monkeypatch.setattr(q.cli_runs, "fit", fake_fit)
    trainer = tmp_path / "trainer.yaml"
    trainer.write_text("trainer:\n  max_epochs: 20\n")  # no callbacks of its own: test_...callbacks below
    monkeypatch.setattr(q.cli_runs, "TRAINER_CONFIG", trainer)
    assert q.fit("t", grid, {"model.optim.lr": 3e-05}, 0, tmp_path) == {"cached": True}
    preset.write_text("model:\n  ranker:\n    d_model: 16\n    cross_layers: 1\n")  # the preset changed
    args = ["--data.data_dir=d", "--seed_everything=0", "--trainer.max_epochs=3", "--model.optim.lr=3e-05"]
    assert q.cli_runs.stale(run, [str(preset), str(data_config)], args) == [
        "model.ranker.cross_layers: 1, the run 'unset'"
    ]
    # An option the run predates matches its default; an appended callback matches one of the run's.
    callback = "--trainer.callbacks+={class_path: a.B, init_args: {decay: 0.9}}"
    saved["trainer"]["callbacks"] = [{"class_path": "a.B", "init_args": {"decay": 0.9, "other": 1}}]
    (run / "config.yaml").write_text(yaml.safe_dump(saved))
    same = [*args, "--model.ranker.token_params=shared", "--model.branch_loss=0.0", callback]
    same.append("--model.ranker.cross_hidden=[]")  # a list option: its default comes from a factory
    assert q.cli_runs.stale(run, [str(data_config)], same) == []
    assert q.cli_runs.stale(run, [str(data_config)], [*args, callback.replace("0.9", "0.5")]) != []
    # --trainer.callbacks.NAME=V sets the last callback's argument (jsonargparse's rule).
    assert q.cli_runs.stale(run, [str(data_config)], [*args, "--trainer.callbacks.other=1"]) == []
    assert q.cli_runs.stale(run, [str(data_config)], [*args, "--trainer.callbacks.other=2"]) != []
    with pytest.raises(AssertionError, match="rerun"):
        q.fit("t", grid, {"model.optim.lr": 3e-05}, 0, tmp_path)
    aside = tmp_path / "runs" / f"{name}.stale-1"
    assert (aside / "version_0" / "done.json").is_file() and not run.exists()
    assert (aside / f"{name}-vs-other-seed0.json").is_file()
    assert (tmp_path / "paired" / f"{name}0-vs-other-seed0.json").is_file()


def test_a_cached_run_under_other_trainer_callbacks_is_stale(tmp_path, monkeypatch):
    """configs/trainer.yaml's callbacks belong to every fit: a run saved with another early-stopping
    patience is another point; a --trainer.callbacks.NAME override of the last callback and a
    config that replaces the list are read as the CLI reads them."""
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import cli_runs  # noqa: PLC0415 (bench/ is on the path from here)

    trainer = tmp_path / "trainer.yaml"
    stop = {"class_path": "l.EarlyStopping", "init_args": {"monitor": "val/auc", "patience": 4}}
    average = {"class_path": "r.Average", "init_args": {"window": 6}}
    trainer.write_text(yaml.safe_dump({"trainer": {"callbacks": [stop, average]}}))
    monkeypatch.setattr(cli_runs, "TRAINER_CONFIG", trainer)
    run = tmp_path / "run"
    run.mkdir()

    def saved(patience: int, window: int) -> None:
        init = {"monitor": "val/auc", "patience": patience, "mode": "max"}  # saved: every argument
        callbacks = [
            {"class_path": "l.EarlyStopping", "init_args": init},
            {"class_path": "r.Average", "init_args": {"window": window}},
        ]
        (run / "config.yaml").write_text(yaml.safe_dump({"trainer": {"callbacks": callbacks}}))

    saved(4, 6)
    assert cli_runs.stale(run, [], []) == []
    saved(2, 6)
    assert cli_runs.stale(run, [], []) == [
        "trainer.callbacks: l.EarlyStopping {'monitor': 'val/auc', 'patience': 4}, not among the run's"
    ]
    saved(4, 1)
    assert cli_runs.stale(run, [], []) != []
    assert cli_runs.stale(run, [], ["--trainer.callbacks.window=1"]) == []
    assert cli_runs.stale(run, [], ["--trainer.callbacks.window=3"]) != []
    saved(2, 6)  # a config's own list replaces trainer.yaml's
    own = tmp_path / "own.yaml"
    own.write_text(yaml.safe_dump({"trainer": {"callbacks": [{**stop, "init_args": {"patience": 2}}]}}))
    assert cli_runs.stale(run, [str(own)], []) == []


def test_choose_where_keeps_the_best_point_that_has_the_settings(monkeypatch):
    """``models.<arch>.choose_where``: the search's points stay, the choice is the best of those
    with the given settings (the Transformer's: no dropout, for its training rate)."""
    from tests.conftest import load_bench

    monkeypatch.syspath_prepend(str(ROOT / "bench"))  # its sibling cli_runs
    q = load_bench("quality")
    ranked = [{"setting": {"lr": 3e-3, "dropout": 0.2}}, {"setting": {"lr": 1e-2, "dropout": 0.0}}]
    grid = {"models": {"t": {"config": "x"}}}
    assert q._choose(grid, "t", ranked, ranked[0]["setting"]) is ranked[0]
    grid["models"]["t"]["choose_where"] = {"dropout": 0.0}
    assert q._choose(grid, "t", ranked, ranked[0]["setting"]) is ranked[1]


def test_the_presets_stage_writes_each_models_preset_values_on_its_axes(tmp_path, monkeypatch):
    """``--stage presets``: chosen.json from the shipped presets (the tuning's choices, written in
    them), each model on its own axes; what the grid's ``defaults`` give where a preset is silent."""
    from tests.conftest import load_bench

    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    q = load_bench("quality")
    grid = q.load_grid(ROOT / "configs" / "quality" / "grid.yaml")
    chosen = q.from_presets(grid, ["transformer", "popularity", "bst"], tmp_path)
    small = yaml.safe_load((ROOT / "configs/model/small.yaml").read_text())["model"]
    assert chosen["transformer"] == {
        "model.optim.lr": small["optim"]["lr"],
        "model.optim.embedding_l2": small["optim"]["embedding_l2"],
        "model.ranker.dropout": small["ranker"]["dropout"],
    }
    assert set(chosen["popularity"]) == {"model.optim.lr", "model.optim.embedding_l2"}
    # popularity.yaml is silent on the penalty: the grid's default; bst.yaml states its own.
    assert chosen["popularity"]["model.optim.embedding_l2"] == grid["defaults"]["model.optim.embedding_l2"]
    bst = yaml.safe_load((ROOT / "configs/model/bst.yaml").read_text())["model"]
    assert chosen["bst"]["model.optim.embedding_l2"] == bst["optim"]["embedding_l2"]
    assert json.loads((tmp_path / "chosen.json").read_text()) == chosen


def test_the_kept_validation_is_the_best_auc_plus_gauc_or_auc_in_older_runs(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import cli_runs

    head = "epoch,step,train/loss,val/auc,val/gauc,val/auc_gauc\n"
    rows = ["0,9,0.7,,,\n", "0,9,,0.80,0.60,1.40\n", "1,19,,0.81,0.58,1.39\n", "2,29,,0.79,0.62,1.41\n"]
    (tmp_path / "metrics.csv").write_text(head + "".join(rows))
    val, kept = cli_runs.validations(tmp_path)
    assert len(val) == 3 and (kept["epoch"], kept["val/auc"]) == ("2", "0.79")
    older = "epoch,step,val/auc,val/gauc\n0,9,0.80,0.60\n1,19,0.81,0.58\n"  # before val/auc_gauc
    (tmp_path / "metrics.csv").write_text(older)
    assert cli_runs.validations(tmp_path)[1]["val/auc"] == "0.81"


def test_the_rate_refinement_climbs_the_1_2_5_ladder_until_its_best_is_inside(tmp_path, monkeypatch):
    """bench/quality_refine.py: the chosen rate's two neighbours, then one rung further while the
    best is on an edge; the other settings held; a chosen rate that stays best costs two fits."""
    from tests.conftest import load_bench

    monkeypatch.syspath_prepend(str(ROOT / "bench"))  # its siblings quality and cli_runs
    r = load_bench("quality_refine")
    grid = yaml.safe_load((ROOT / "configs/quality/grid.yaml").read_text())
    lr, l2, dr = "model.optim.lr", "model.optim.embedding_l2", "model.ranker.dropout"
    start = {lr: 1e-3, l2: 1e-3, dr: 0.1}
    fit, calls = _fake_fit({lr: 2e-2, l2: 1e-3, dr: 0.1})
    monkeypatch.setattr(r.quality, "fit", fit)
    best, points = r.refine(grid, "deepfm", start, tmp_path)
    assert best == {lr: 0.02, l2: 1e-3, dr: 0.1}
    assert [c[lr] for c in calls] == [5e-4, 1e-3, 2e-3, 5e-3, 0.01, 0.02, 0.05]
    assert all(c[l2] == 1e-3 and c[dr] == 0.1 for c in calls) and len(points) == len(calls)
    calls.clear()
    monkeypatch.setattr(r.quality, "fit", _fake_fit({lr: 1e-3})[0])
    best, points = r.refine(grid, "deepfm", start, tmp_path)
    assert best == start and sorted(p["setting"][lr] for p in points) == [5e-4, 1e-3, 2e-3]
    assert r.rung(3e-3, 1) == 5e-3 and r.rung(1e-2, -1) == 5e-3  # 3e-3's nearest rung is 2e-3


def test_the_l2_refinement_steps_the_1_3_ladder_and_stops_at_zero(tmp_path, monkeypatch):
    """``--key l2``: the penalty's neighbours on the 1, 3 ladder, one rung further while the best
    is on an edge; a penalty of 0 has one neighbour (3e-4) and nothing below it."""
    from tests.conftest import load_bench

    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    r = load_bench("quality_refine")
    grid = yaml.safe_load((ROOT / "configs/quality/grid.yaml").read_text())
    lr, l2 = "model.optim.lr", "model.optim.embedding_l2"
    fit, calls = _fake_fit({lr: 1e-3, l2: 1e-4})
    monkeypatch.setattr(r.quality, "fit", fit)
    best, points = r.refine(grid, "deepfm", {lr: 1e-3, l2: 1e-3}, tmp_path, l2)
    assert best == {lr: 1e-3, l2: 1e-4}
    assert [c[l2] for c in calls] == [3e-4, 1e-3, 3e-3, 1e-4, 3e-5]
    assert all(c[lr] == 1e-3 for c in calls) and len(points) == len(calls)
    calls.clear()
    best, points = r.refine(grid, "bst", {lr: 1e-3, l2: 0.0}, tmp_path, l2)
    assert [c[l2] for c in calls] == [0.0, 3e-4, 1e-3] and best == {lr: 1e-3, l2: 3e-4}
    calls.clear()
    monkeypatch.setattr(r.quality, "fit", _fake_fit({lr: 1e-3, l2: 0.0})[0])
    best, points = r.refine(grid, "bst", {lr: 1e-3, l2: 0.0}, tmp_path, l2)
    assert best == {lr: 1e-3, l2: 0.0} and sorted(p["setting"][l2] for p in points) == [0.0, 3e-4]


def test_the_early_stopping_overlay_is_the_default_callback_list_but_its_monitor():
    """configs/quality/es_auc_gauc.yaml replaces the whole callback list, so it must follow
    configs/trainer.yaml: the same callbacks, only early stopping's monitor changed."""
    import yaml

    default = yaml.safe_load((ROOT / "configs" / "trainer.yaml").read_text())["trainer"]["callbacks"]
    overlay = yaml.safe_load((ROOT / "configs" / "quality" / "es_auc_gauc.yaml").read_text())
    overlay = overlay["trainer"]["callbacks"]
    stops = [i for i, c in enumerate(default) if c["class_path"].endswith(".EarlyStopping")]
    assert len(stops) == 1 and overlay[stops[0]]["init_args"].pop("monitor") == "val/auc_gauc"
    default[stops[0]]["init_args"].pop("monitor")
    assert overlay == default


def test_the_levers_table_gives_each_seeds_change_against_the_reference_and_the_rule(tmp_path, monkeypatch):
    """bench/levers.py --reference: the change of the kept checkpoint's val AUC + GAUC per seed
    against the reference run of that seed, and the rule's verdict (mean above zero, no seed below
    -0.002, over 3 seeds: "so far" with fewer, unless a seed is already below the floor); a
    reference folder without metrics, or a path without {seed}, is named in the error."""
    from tests.conftest import load_bench

    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    levers = load_bench("levers")
    head = "epoch,step,val/auc,val/gauc,val/auc_gauc\n"
    refs = {
        0: "0,9,0.80,0.60,1.40\n1,19,0.81,0.61,1.42\n",
        1: "0,9,0.80,0.60,1.40\n",
        2: "0,9,0.79,0.6,1.39\n",
    }
    for seed, rows in refs.items():
        (tmp_path / f"ref{seed}").mkdir()
        (tmp_path / f"ref{seed}" / "metrics.csv").write_text(head + rows)
    row = dict(best_val_gauc=0.62, peak_epoch=3, hit_cap=False)
    gains = [
        dict(row, name="up", seed=0, val_auc=0.815, val_gauc=0.610),
        dict(row, name="up", seed=1, val_auc=0.80, val_gauc=0.601),
        dict(row, name="up", seed=2, val_auc=0.789, val_gauc=0.6),
    ]
    mixed = [
        dict(row, name="mixed", seed=0, val_auc=0.83, val_gauc=0.61),
        dict(row, name="mixed", seed=1, val_auc=0.797, val_gauc=0.600),
    ]
    reference = str(tmp_path / "ref{seed}")
    out = levers.table(gains + mixed, ["up", "mixed"], reference)
    up, mixed_row = out.splitlines()[2:]
    assert up.endswith("| +0.0050 / +0.0010 / -0.0010: passes |"), up
    assert mixed_row.endswith("| +0.0200 / -0.0030: fails |"), mixed_row  # one seed below the floor
    assert out.splitlines()[1].count("---") == out.splitlines()[0].count(" |")
    two = levers.table(gains[:2], ["up"], reference).splitlines()[2]
    assert two.endswith("| +0.0050 / +0.0010: passes so far (2 of the rule's 3 seeds) |"), two
    assert "change of AUC + GAUC" not in levers.table(gains, ["up"])
    with pytest.raises(FileNotFoundError, match="ref3"):
        levers.table([dict(gains[0], seed=3)], ["up"], reference)
    with pytest.raises(ValueError, match="expected a path with {seed}"):
        levers.reference_run(str(tmp_path / "ref0"), 0)


def test_levers_checks_the_reference_before_any_fit(tmp_path, monkeypatch):
    """A --reference with no run for a seed fails at once, naming the folder, not after the fits."""
    from tests.conftest import load_bench

    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    levers = load_bench("levers")
    spec = tmp_path / "spec.yaml"
    spec.write_text("config: c.yaml\ndata_dir: d\ndata_config: dc.yaml\nepochs: 2\nvariants: {a: []}\n")
    monkeypatch.setattr(levers, "run_variant", lambda *a: pytest.fail("a fit ran before the check"))
    argv = ["levers.py", "--spec", str(spec), "--out", str(tmp_path / "out"), "--seeds", "0"]
    monkeypatch.setattr(sys, "argv", [*argv, "--reference", str(tmp_path / "none{seed}")])
    with pytest.raises(FileNotFoundError, match="none0"):
        levers.main()


@pytest.mark.slow
def test_throughput_bench_times_the_compiled_step_beside_the_eager_one(tiny_data, tmp_path):
    """``--compile``: each model again under the module's own ``compile`` (compiled in the warmup),
    trained on the same batches; its row is the same model, named apart."""
    cmd = [sys.executable, "bench/bench_throughput.py", "--grid", str(_grid(tmp_path, tiny_data))]
    cmd += ["--data", str(tiny_data), "--batch", "32", "--steps", "2", "--warmup", "1", "--threads", "1"]
    cmd += ["--archs", "transformer", "--options", "--compile", "--out", str(tmp_path / "t.json")]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads((tmp_path / "t.json").read_text())["models"]
    assert set(rows) == {"transformer", "transformer compiled"}
    assert rows["transformer compiled"]["params"] == rows["transformer"]["params"]
    assert rows["transformer compiled"]["samples_per_s"] > 0
