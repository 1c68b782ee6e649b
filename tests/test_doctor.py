"""``recformer doctor`` on tiny runs built to have one failure each, and on a healthy run.

Each failure is made on purpose (a tiny model, a few dozen CPU steps) and must raise the matching
finding; the default healthy config must raise none and get the clean bill of health.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from lightning.pytorch.callbacks import Callback

from recformer import metric_names as mn
from recformer.config import OptimConfig, RankerConfig
from recformer.doctor import Series, adam_recovery, diagnose, load_run, main
from tests.test_callbacks import TINY, fit_tiny


class KickHead(Callback):
    """Adds large noise to the head's readout before one step: a loss spike, then large gradients."""

    def __init__(self, step: int, scale: float = 10.0) -> None:
        self.step, self.scale = step, scale

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.step:
            w = pl_module.ranker.head.out.weight
            with torch.no_grad():
                w.add_(self.scale * torch.randn(w.shape, generator=torch.Generator().manual_seed(0)))


class NaNBatch(Callback):
    """Fills one batch's dense features with NaN: non-finite gradients, the module skips the step."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.step:
            batch.dense.fill_(float("nan"))


def _scale_qk(factor: float):
    def prep(module):
        D = module.ranker.cfg.d_model
        with torch.no_grad():
            for b in module.ranker.blocks:
                b.attn.qkv.weight[: 2 * D].mul_(factor)  # rows: q then k then v

    return prep


def _scale_tokens(module):
    with torch.no_grad():
        for p in module.ranker.tokens.parameters():
            p.mul_(50.0)  # a residual stream 50x larger than what any block adds to it


def _freeze_bottom(module):
    module.ranker.blocks[0].requires_grad_(False)


CONSTANT = dict(warmup_steps=0, schedule="constant")

SCENARIOS = {
    # name: (ranker, optim, steps, prep, extra callbacks, expected checks)
    "post_norm_no_warmup_large_lr": (
        RankerConfig(d_model=16, n_layers=6, n_heads=2, norm_placement="post", init="normal"),
        OptimConfig(lr=0.1, **CONSTANT),
        40,
        None,
        (),
        {"bottom_starvation", "update_ratio_high"},
    ),
    "huge_embeddings_deep_pre_norm": (
        RankerConfig(d_model=16, n_layers=6, n_heads=2),
        OptimConfig(warmup_steps=10),
        40,
        _scale_tokens,
        (),
        {"idle_deep_layers"},
    ),
    "deep_pre_norm_large_init": (
        RankerConfig(d_model=16, n_layers=8, n_heads=2, init="normal", init_std=0.5),
        OptimConfig(warmup_steps=10),
        40,
        None,
        (),
        {"residual_growth"},
    ),
    "no_qk_norm_qk_scaled_up": (
        RankerConfig(**TINY, qk_norm="none"),
        OptimConfig(warmup_steps=10),
        40,
        _scale_qk(100.0),
        (),
        {"attention_collapse"},
    ),
    "qk_zeroed": (
        RankerConfig(**TINY, qk_norm="none"),
        OptimConfig(warmup_steps=10),
        40,
        _scale_qk(0.0),
        (),
        {"attention_uniform"},
    ),
    "frozen_bottom_block": (
        RankerConfig(**TINY),
        OptimConfig(warmup_steps=10),
        40,
        _freeze_bottom,
        (),
        {"update_ratio_low", "bottom_starvation"},
    ),
    "no_weight_decay_high_constant_lr": (
        RankerConfig(**TINY),
        OptimConfig(lr=1e-2, weight_decay=0.0, **CONSTANT),
        60,
        None,
        (),
        {"weight_norm_runaway"},
    ),
    "nan_batch": (
        RankerConfig(**TINY),
        OptimConfig(warmup_steps=10),
        40,
        None,
        (NaNBatch(20),),
        {"nonfinite_steps"},
    ),
}


@pytest.fixture(scope="module")
def healthy_run(tiny_data, tmp_path_factory) -> Path:
    """The default config (pre-norm, QK-Norm, scaled init, AdamW defaults), tiny width."""
    out = tmp_path_factory.mktemp("healthy")
    fit_tiny(tiny_data, out, RankerConfig(**TINY), OptimConfig(warmup_steps=10), steps=60)
    return out


def test_healthy_run_gets_a_clean_bill(healthy_run, capsys):
    assert main([str(healthy_run)]) == 0
    text = capsys.readouterr().out
    assert "clean bill of health: all 8 checks with data passed" in text
    d = diagnose(load_run(healthy_run), healthy_run)
    assert d.findings == [] and d.skipped == []


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_each_built_failure_triggers_its_finding(tiny_data, tmp_path, name, capsys):
    ranker, optim, steps, prep, extra, expected = SCENARIOS[name]
    fit_tiny(tiny_data, tmp_path, ranker, optim, steps=steps, prep=prep, extra=extra)
    assert main([str(tmp_path), "--json", "--no-plots"]) == 1
    report = json.loads(capsys.readouterr().out)
    found = {f["check"] for f in report["findings"]}
    assert expected <= found, (name, found)
    for f in report["findings"]:
        assert f["evidence"] and f["metric"], f  # every finding carries its evidence
    print(name, sorted(found))


def test_a_kicked_head_is_a_loss_spike_with_adam_evidence(tiny_data, tmp_path):
    fit_tiny(
        tiny_data,
        tmp_path,
        RankerConfig(**TINY),
        OptimConfig(warmup_steps=10),
        steps=60,
        extra=(KickHead(35),),
    )
    d = diagnose(load_run(tmp_path), tmp_path)
    assert {f.check for f in d.findings} == {"loss_spikes"}
    spikes = d.findings[0]
    assert spikes.steps[0] == 40  # the kick before step 36 is counted at the next log step
    hidden = next(e for e in spikes.evidence if mn.ADAM_V.format(group="hidden") in e)
    assert "jumped" in hidden and "beta2=0.95" in hidden


def test_adam_recovery_reads_the_jump_and_the_return():
    steps = np.arange(10, 110, 10)
    v = np.array([1.0, 1.0, 1.0, 50.0, 20.0, 5.0, 1.5, 1.2, 1.1, 1.0])
    text = adam_recovery(Series(steps, v), start=40, beta2=0.95)
    assert "jumped 50.0x" in text and "by step 70: 30 steps" in text and "~20 steps" in text
    stuck = adam_recovery(Series(steps, np.where(steps >= 40, 50.0, 1.0)), start=40, beta2=0.95)
    assert "not recovered" in stuck
    assert adam_recovery(Series(steps, np.ones(10)), start=40, beta2=0.95).startswith("no jump")


def test_plots_and_html_one_png_per_family(healthy_run, tmp_path, capsys):
    out = tmp_path / "report"
    assert main([str(healthy_run), "--out", str(out)]) == 0
    pngs = {p.stem for p in out.glob("*.png")}
    expected = {"grad_norm", "update_ratio", "weight_norm", "cos_adjacent", "resid_rms", "attn_logit_max"}
    assert expected | {"attn_entropy", "adam_v", "emb_row_norm", "loss", "perf"} <= pngs
    page = (out / "index.html").read_text()
    assert "Clean bill of health" in page
    assert all(f"src='{stem}.png'" in page for stem in pngs)
    assert all((out / f"{stem}.png").read_bytes()[:4] == b"\x89PNG" for stem in pngs)


def test_metrics_csv_alone_is_enough(healthy_run, tmp_path, capsys):
    run = tmp_path / "csv_only"
    run.mkdir()
    (run / "metrics.csv").write_text((healthy_run / "metrics.csv").read_text())
    assert main([str(run), "--no-plots"]) == 0
    assert "clean bill of health" in capsys.readouterr().out


def test_no_metrics_is_exit_2_with_a_hint(tmp_path, capsys):
    (tmp_path / "version_0").mkdir()
    assert main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "health.jsonl" in err and "version_0" in err
    assert main([str(tmp_path / "missing")]) == 2
    (tmp_path / "health.jsonl").touch()  # a run that stopped before its first log step
    assert main([str(tmp_path)]) == 2
    assert (
        "health.jsonl: no metric rows (the run stopped before its first log step?)" in capsys.readouterr().err
    )


def test_a_run_without_health_metrics_gets_no_verdict(tmp_path, capsys):
    """Loss and AUC only: no check has its metrics, so no clean bill of health (exit 2)."""
    run = tmp_path / "bare"
    run.mkdir()
    rows = "".join(f"{s},0.6,\n{s},,0.7\n" for s in range(10, 60, 10))
    (run / "metrics.csv").write_text("step,train/loss,val/auc\n" + rows)
    assert main([str(run), "--no-plots"]) == 2
    out = capsys.readouterr()
    assert "no verdict" in out.out and "none of the" in out.err


def test_an_all_nan_gradient_ratio_is_not_called_starvation(tmp_path, capsys):
    """A diverged run logs NaN ratios: that is no evidence of Post-Norm starvation."""
    run = tmp_path / "nan"
    run.mkdir()
    rows = "".join(f"{s},0.6,nan\n" for s in range(10, 110, 10))
    (run / "metrics.csv").write_text(f"step,train/loss,{mn.GRAD_RATIO_BOTTOM_TOP}\n" + rows)
    main([str(run), "--no-plots", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert not [f for f in report["findings"] if f["check"] == "bottom_starvation"]


def test_a_nan_loss_is_a_finding_even_with_no_step_counted(tmp_path, capsys):
    """train/loss NaN at two steps while health/nonfinite_steps stays 0 (a NaN loss with zero
    gradients, which a gradient guard alone lets through): a finding, not a clean bill."""
    run = tmp_path / "nan_loss"
    run.mkdir()
    loss = {20: "nan", 40: "nan"}
    rows = "".join(f"{s},{loss.get(s, 0.6)},0\n" for s in range(10, 110, 10))
    (run / "metrics.csv").write_text(f"step,train/loss,{mn.NONFINITE_STEPS}\n" + rows)
    assert main([str(run), "--no-plots", "--json"]) == 1
    findings = json.loads(capsys.readouterr().out)["findings"]
    assert [(f["check"], f["steps"]) for f in findings] == [("nonfinite_loss", [20, 40])]


def test_every_plot_labels_its_axes_and_marks_what_its_title_promises():
    """Issue 30: no y-axis labels; a loss title promising red spike marks that were not drawn; perf
    panels titled with raw metric names; 15 near-identical shades over the embedding norms."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from recformer.doctor.plots import figures
    from recformer.doctor.runs import RunMetrics

    steps = np.arange(10, 110, 10)
    ramp = Series(steps, np.linspace(1.0, 2.0, 10))
    spikes = np.zeros(10)
    spikes[[3, 7]] = 1.0
    series = {
        mn.GRAD_NORM.format(i=0): ramp,
        mn.TRAIN_LOSS: Series(steps, np.linspace(0.7, 0.5, 10)),
        mn.LOSS_SPIKE: Series(steps, spikes),
        mn.SAMPLES_PER_S: ramp,
        mn.TOKENS_PER_S: ramp,
    }
    tables, quantiles = ["item", "user_id", "hour", "dow", "hist_ratings"], ["50", "90", "99"]
    series |= {mn.EMB_ROW_NORM.format(table=t, q=q): ramp for t in tables for q in quantiles}
    drawn = {stem: fig for stem, _, fig in figures(plt, RunMetrics(series, {}, []))}
    assert set(drawn) == {"grad_norm", "emb_row_norm", "loss", "perf"}
    for stem, fig in drawn.items():
        for ax in fig.axes:
            assert ax.get_ylabel() and ax.get_xlabel() == "step", stem
    loss = drawn["loss"].axes[0]
    marks = [c for c in loss.collections if len(c.get_offsets())]
    assert [m.get_offsets()[:, 0].tolist() for m in marks] == [[40.0, 80.0]]  # at the spike steps
    assert matplotlib.colors.same_color(marks[0].get_facecolor()[0], "red") and "red" in loss.get_title()
    assert [ax.get_title() for ax in drawn["perf"].axes] == ["training samples / s", "training tokens / s"]
    norms = drawn["emb_row_norm"].axes[0]
    colors = {matplotlib.colors.to_hex(line.get_color()) for line in norms.get_lines()}
    styles = {line.get_linestyle() for line in norms.get_lines()}
    assert len(colors) == len(tables) and len(styles) == len(quantiles)
    legend = norms.get_legend()
    assert legend.get_bbox_to_anchor().x0 > norms.get_window_extent().x1 - 1  # beside the lines
    quiet = dict(series)
    quiet[mn.LOSS_SPIKE] = Series(steps, np.zeros(10))
    loss = next(fig for stem, _, fig in figures(plt, RunMetrics(quiet, {}, [])) if stem == "loss").axes[0]
    assert "red" not in loss.get_title() and not [c for c in loss.collections if len(c.get_offsets())]
    plt.close("all")
