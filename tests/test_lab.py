"""recformer lab: a micro grid run end to end (points, resume, divergence as a result, a failed
point), grids refused by name, and the report on known inputs."""

from __future__ import annotations

import csv
import json
import math
import re
from pathlib import Path

import pytest
import yaml

from recformer.__main__ import main as recformer_main
from recformer.lab.grids import list_grids, load_grid
from recformer.lab.report import report

ROOT = Path(__file__).resolve().parents[1]
MICRO = {
    "description": "two points",
    "configs": ["configs/model/tiny.yaml", "configs/data/synthetic.yaml"],
    "data": {
        "synth": {"rows": 3000, "val_rows": 600, "test_rows": 600, "users": 100, "items": 80, "max_len": 8}
    },
    "settings": {
        "trainer.max_epochs": 1,
        "data.num_workers": 0,
        "data.batch_size": 64,
        "model.optim.warmup_steps": 5,
        "trainer.log_every_n_steps": 5,
    },
    "axes": {
        "variant": [
            {"name": "pre", "model.ranker.norm_placement": "pre"},
            {"name": "post", "model.ranker.norm_placement": "post"},
        ]
    },
    "seeds": [0],
    "plots": [{"x": "params", "y": "best_val_auc", "series": "variant"}],
    "sizes": {"smoke": {}},
}


def _grid(tmp_path: Path, **changes) -> Path:
    path = tmp_path / "micro.yaml"
    path.write_text(yaml.safe_dump({**MICRO, **changes}))
    return path


def _points(out: Path) -> dict[str, dict]:
    files = (out / "points").glob("*/version_0/point.json")
    return {json.loads(p.read_text())["labels"]["variant"]: json.loads(p.read_text()) for p in files}


def test_a_micro_grid_runs_every_point_reports_and_resumes(tmp_path, capsys, monkeypatch):
    # Started from a folder of its own with a relative --out (issue 30: from outside the repository
    # it failed renaming its synthetic data, which it wrote into the repository's runs/lab/).
    grid, elsewhere = _grid(tmp_path), tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    repo_lab = ROOT / "runs" / "lab"
    before = sorted(repo_lab.rglob("*")) if repo_lab.is_dir() else []
    assert recformer_main(["lab", "run", str(grid), "--out", "out", "--jobs", "2"]) == 0
    out = elsewhere / "out"
    assert [p.name for p in elsewhere.iterdir()] == ["out"]  # written only where told
    assert (sorted(repo_lab.rglob("*")) if repo_lab.is_dir() else []) == before
    points = _points(out)
    assert sorted(points) == ["post", "pre"] and all(p["status"] == "ok" for p in points.values())
    for p in points.values():  # an ordinary run folder, with the figures read from it
        run = Path(p["run"])
        assert run.is_absolute() and (run / "config.yaml").is_file() and (run / "health.jsonl").is_file()
        assert 0 < p["best_val_auc"] < 1 and p["params"] > 0 and p["command"].startswith("recformer fit ")
        configs = re.findall(r"--config (\S+)", p["command"])  # results.md's rerun: from any folder
        assert configs and all(Path(c).is_absolute() and Path(c).is_file() for c in configs)
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert sorted(r["variant"] for r in rows) == ["post", "pre"]
    assert "| post |" in (out / "results.md").read_text() and (out / "best_val_auc-vs-params.png").is_file()
    # A point interrupted half-way (no point.json; a partial file) is rerun; the finished one kept.
    pre = Path(points["pre"]["run"])
    (pre / "point.json").unlink()
    (pre / "partial").write_text("left by a killed run")
    kept = (Path(points["post"]["run"]) / "point.json").stat().st_mtime_ns
    capsys.readouterr()
    assert recformer_main(["lab", "run", str(grid), "--out", str(out)]) == 0
    assert (Path(points["post"]["run"]) / "point.json").stat().st_mtime_ns == kept
    assert (pre / "point.json").is_file() and not (pre / "partial").exists()
    assert "[2/2]" in capsys.readouterr().out


def test_a_diverging_point_is_a_result_and_a_failing_one_is_named(tmp_path, capsys):
    settings = {
        **MICRO["settings"],
        "trainer.callbacks+": "tests.fault_callbacks.HugeWeightsFrom",
        "trainer.callbacks.step": 3,
        "model.optim.max_nonfinite_steps": 2,
    }
    axes = {
        "variant": [{"name": "pre", "model.ranker.d_model": 16}, {"name": "bad", "model.ranker.d_model": 0}]
    }
    out = tmp_path / "out"
    assert (
        recformer_main(["lab", "run", str(_grid(tmp_path, settings=settings, axes=axes)), "--out", str(out)])
        == 1
    )
    points = _points(out)
    assert points["pre"]["status"] == "diverged" and points["pre"]["nonfinite_steps"] >= 1
    assert points["bad"]["status"] == "failed" and "d_model=0" in points["bad"]["error"]
    assert "1 point(s) failed" in capsys.readouterr().out


def test_a_grid_is_refused_by_name(tmp_path, capsys):
    assert recformer_main(["lab", "run", "no-such-grid"]) == 2
    (line,) = [x for x in capsys.readouterr().err.splitlines() if x.startswith("recformer lab: error:")]
    assert "no-such-grid.yaml does not exist" in line and "depth" in line  # the grids there, listed
    with pytest.raises(ValueError, match="no size 'huge'"):
        load_grid(str(_grid(tmp_path)), "huge")
    with pytest.raises(ValueError, match="axes.variant: a variant"):
        load_grid(str(_grid(tmp_path, axes={"variant": [{"model.ranker.d_model": 8}]})), "smoke")


def test_every_shipped_grid_loads_at_every_size():
    grids = list_grids()
    assert grids
    for name, _, sizes in grids:
        assert "smoke" in sizes and "full" in sizes, name
        for size in sizes:
            assert load_grid(name, size).points()


def test_the_report_on_known_inputs(tmp_path):
    out = tmp_path / "out"
    for seed, auc in ((0, 0.70), (1, 0.74)):
        for variant, shift in (("a", 0.0), ("b", 0.1)):
            run = out / "points" / f"{variant}-{seed}" / "version_0"
            run.mkdir(parents=True)
            point = {
                "point": f"{variant}-{seed}",
                "labels": {"variant": variant},
                "settings": {"model.ranker.n_layers": 2},
                "seed": seed,
                "status": "ok",
                "seconds": 1.0,
                "command": f"recformer fit --seed_everything={seed}",
                "best_val_auc": auc + shift,
                "findings": ["idle"] if variant == "b" else [],
            }
            (run / "point.json").write_text(json.dumps(point))
    plots = [{"x": "model.ranker.n_layers", "y": "best_val_auc", "series": "variant"}]
    report(out, plots, "known")
    md = (out / "results.md").read_text()
    assert "| a | 2 | ok | - | 0.72 (0.7-0.74) |" in md  # mean (min-max) over the two seeds
    assert "| b | 2 | ok | - | 0.82 (0.8-0.84) |" in md and md.rstrip().endswith(
        "`recformer fit --seed_everything=1`"
    )
    assert "| idle |" in md and "| clean |" in md
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert len(rows) == 4 and math.isclose(float(rows[0]["best_val_auc"]), 0.70)
    assert (out / "best_val_auc-vs-n_layers.png").stat().st_size > 1000
    # Points of an earlier definition of the grid (not among its names now) leave the report.
    report(out, plots, "known", names=["a-0", "a-1"])
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert (
        sorted(r["variant"] for r in rows) == ["a", "a"] and "| b |" not in (out / "results.md").read_text()
    )


def test_the_slope_per_decade_on_known_inputs():
    """loss = a - b * log10(params) per series, two seeds around each mean: the slope is -b."""
    from recformer.lab.report import slope_rows

    points = []
    for order, b in (("1", 0.01), ("4", 0.05)):
        for params in (1e4, 1e5, 1e6):
            for seed, noise in ((0, -0.001), (1, 0.001)):
                points.append(
                    {
                        "labels": {"synth.order": order},
                        "settings": {},
                        "params": params,
                        "seed": seed,
                        "status": "ok",
                        "val_logloss": 0.7 - b * math.log10(params) + noise,
                    }
                )
    points.append({**points[0], "status": "failed", "val_logloss": 99.0})  # a failed point is left out
    lines = slope_rows(points, {"x": "params", "y": "val_logloss", "series": "synth.order", "fit": True})
    assert "- order 1: -0.0100 (3 points, params 1e+04 to 1e+06)" in lines
    assert "- order 4: -0.0500 (3 points, params 1e+04 to 1e+06)" in lines


def test_attention_traces_over_training_on_known_inputs(tmp_path):
    """The trace is the max (logit) or min (entropy) across blocks at each logged step, a line per
    point; the plot is drawn from the run folders, filtered by ``where``."""
    from recformer.doctor.runs import load_run
    from recformer.lab.summary import summarize, trace
    from recformer.metric_names import ATTN_ENTROPY, ATTN_LOGIT_MAX

    out = tmp_path / "out"
    for qk, growth in (("none", 10.0), ("full", 1.0)):
        run = out / "points" / f"{qk}-0" / "version_0"
        run.mkdir(parents=True)
        lines = [
            {
                "step": s,
                ATTN_LOGIT_MAX.format(i=0): 1 + growth * s,
                ATTN_LOGIT_MAX.format(i=1): 2 + s,
                ATTN_ENTROPY.format(i=0): 0.9 / (1 + growth * s),
                ATTN_ENTROPY.format(i=1): 0.8,
            }
            for s in (0, 5, 10)
        ]
        (run / "health.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
        point = {
            "point": f"{qk}-0",
            "labels": {"qk_norm": qk, "lr": "0.016"},
            "settings": {},
            "seed": 0,
            "status": "ok",
            "seconds": 1.0,
            "command": "recformer fit",
        }
        (run / "point.json").write_text(json.dumps(point))
    steps, logits = trace(load_run(out / "points" / "none-0" / "version_0"), ATTN_LOGIT_MAX, "max")
    assert steps.tolist() == [0, 5, 10] and logits.tolist() == [2.0, 51.0, 101.0]
    _, entropy = trace(load_run(out / "points" / "full-0" / "version_0"), ATTN_ENTROPY, "min")
    assert entropy.tolist() == pytest.approx([0.8, 0.15, 0.9 / 11])
    figures = summarize(out / "points" / "none-0" / "version_0")
    assert figures["attn_logit_max"] == 101.0 and figures["attn_entropy_min"] == pytest.approx(0.9 / 101)
    plots = [
        {"trace": "attn_logit_max", "series": "qk_norm", "where": {"lr": 0.016}, "logy": True},
        {"trace": "attn_entropy", "series": "qk_norm", "where": {"lr": 0.001}},  # no point matches
    ]
    written = report(out, plots, "known")
    assert (out / "trace-attn_logit_max-0.016.png").stat().st_size > 1000 and len(written) == 4
    assert (out / "trace-attn_entropy-0.001.png").is_file()  # drawn, empty: axes and title only
    with pytest.raises(ValueError, match="a trace plot needs trace"):
        load_grid(str(_grid(tmp_path, plots=[{"trace": "loss", "series": "variant"}])), "smoke")
    with pytest.raises(ValueError, match=r"plots\[0\] needs x and y"):
        load_grid(str(_grid(tmp_path, plots=[{"y": "val_auc"}])), "smoke")


def test_the_best_learning_rate_per_width_and_its_drift_on_known_inputs():
    from recformer.lab.report import best_rows

    lrs = [1e-3, 2e-3, 4e-3, 8e-3]
    # SP: the best LR moves from 4e-3 at width 32 to 1e-3 at width 128 (2 grid steps down);
    # muP: 2e-3 at both widths.
    best = {("SP", "32"): 4e-3, ("SP", "128"): 1e-3, ("muP", "32"): 2e-3, ("muP", "128"): 2e-3}
    points = []
    for (param, width), at in best.items():
        for lr in lrs:
            loss = 0.5 + abs(math.log2(lr / at)) * 0.01
            labels = {"param": param, "width": width}
            points.append(
                {"labels": labels, "settings": {"model.optim.lr": lr}, "status": "ok", "val_logloss": loss}
            )
    spec = {
        "over": "model.optim.lr",
        "y": "val_logloss",
        "mode": "min",
        "per": ["param", "width"],
        "drift": "width",
    }
    text = "\n".join(best_rows(points, spec))
    assert "- SP, 32: 0.004" in text and "- muP, 128: 0.002" in text
    assert "for SP: -2 grid steps from width 32 to 128" in text
    assert "for muP: +0 grid steps from width 32 to 128" in text


def test_the_coordinate_check_writes_its_table_and_plot(tiny_data, tmp_path, capsys):
    out = tmp_path / "coord"
    args = ["--data", str(tiny_data), "--widths", "16", "32", "--steps", "2", "--out", str(out)]
    assert recformer_main(["lab", "coord-check", *args]) == 0
    printed = capsys.readouterr().out.splitlines()  # the table itself, not only the file names
    assert printed[1].split() == ["SP", "16", "32", "ratio"] and printed[6].split()[0] == "muP"
    assert [line.split()[0] for line in printed[2:6]] == ["tokens", "block", "block", "logits"]
    assert printed[-2:] == [f"wrote {out / 'coord_check.csv'}", f"wrote {out / 'coord_check.png'}"]
    rows = list(csv.DictReader((out / "coord_check.csv").open()))
    # SP and muP x 2 widths x (tokens, 2 blocks, logits), every RMS finite and positive
    assert len(rows) == 2 * 2 * 4 and all(0 < float(r["rms"]) < math.inf for r in rows)
    assert {r["param"] for r in rows} == {"SP", "muP"} and (out / "coord_check.png").stat().st_size > 1000


def test_a_job_array_task_runs_one_point_and_the_report_reads_what_is_done(tmp_path, capsys):
    grid, out = _grid(tmp_path), tmp_path / "out"
    assert recformer_main(["lab", "run", str(grid), "--count"]) == 0
    assert capsys.readouterr().out.strip() == "2"
    assert (
        recformer_main(["lab", "run", str(grid), "--out", str(out), "--index", "1"]) == 0
    )  # as SLURM task 1
    assert sorted(_points(out)) == ["post"]
    assert recformer_main(["lab", "report", str(out)]) == 0
    assert "| post |" in (out / "results.md").read_text()
    assert recformer_main(["lab", "run", str(grid), "--out", str(out), "--index", "2"]) == 2
    assert "--index 2; the grid has points 0 to 1" in capsys.readouterr().err
