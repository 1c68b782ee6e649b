"""The training application end to end on tiny data: CLI, metrics, checkpoints, resume, guards."""

from __future__ import annotations

import contextlib
import csv
import json
import logging
import math
import re
import shutil
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import lightning.pytorch as pl
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import yaml
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from torchmetrics import Metric

from recformer.__main__ import main as recformer_main
from recformer.batch import DataError
from recformer.callbacks.best import RestoreBest
from recformer.callbacks.predictions import ParquetPredictionWriter
from recformer.cli import KNOWN_FALSE_ALARMS, cli_main
from recformer.config import OptimConfig, RankerConfig
from recformer.data.datamodule import RecDataModule
from recformer.evaluate import compare_aucs, evaluate, format_table
from recformer.metrics import exact_auc
from recformer.module import RankerModule
from tests._subprocess import run_recformer
from tests.conftest import write_tiny_data

ROOT = Path(__file__).resolve().parents[1]
TINY = RankerConfig(d_model=16, n_layers=2, n_heads=2)


def logger_config(root: Path) -> str:
    """The default loggers (CSV, then W&B), saving under ``root`` instead of ./runs."""
    path = root / "loggers.yaml"
    root.mkdir(parents=True, exist_ok=True)
    csv_logger = "lightning.pytorch.loggers.CSVLogger"
    path.write_text(
        "trainer:\n  logger:\n"
        f"    - class_path: {csv_logger}\n      init_args: {{save_dir: {root}, name: recformer}}\n"
        f"    - class_path: recformer.loggers.SafeWandbLogger\n      init_args: {{save_dir: {root}}}\n"
    )
    return f"--config={path}"


def fit_args(data: Path, root: Path, *extra: str) -> list[str]:
    return [
        "fit",
        logger_config(root),
        f"--data.data_dir={data}",
        "--data.batch_size=64",
        "--data.num_workers=0",
        "--model.ranker.d_model=16",
        "--model.ranker.n_layers=2",
        "--model.ranker.n_heads=2",
        "--model.optim.warmup_steps=2",
        "--trainer.max_epochs=2",
        "--trainer.accelerator=cpu",
        "--trainer.devices=1",
        "--trainer.enable_progress_bar=false",
        "--trainer.log_every_n_steps=2",
        f"--trainer.default_root_dir={root}",
        *extra,
    ]


def predict_args(data: Path, root: Path, ckpt: Path) -> list[str]:
    """``recformer predict`` of ``ckpt`` (the fit_args model) on ``data``, run files under ``root``."""
    return [
        "predict",
        logger_config(root),
        f"--data.data_dir={data}",
        "--data.num_workers=0",
        "--model.ranker.d_model=16",
        "--model.ranker.n_layers=2",
        "--model.ranker.n_heads=2",
        "--trainer.accelerator=cpu",
        "--trainer.enable_progress_bar=false",
        f"--trainer.default_root_dir={root}",
        f"--ckpt_path={ckpt}",
    ]


def read_metrics(run: Path) -> list[dict[str, str]]:
    with open(run / "metrics.csv") as fh:
        return list(csv.DictReader(fh))


def test_top_level_help_names_every_command(capsys):
    assert recformer_main(["--help"]) == 0
    out = capsys.readouterr().out
    for command in ("fit", "validate", "test", "predict", "data", "evaluate", "doctor", "lab"):
        assert command in out
    assert recformer_main([]) == 2  # no command: the same usage, on stderr
    assert "doctor" in capsys.readouterr().err
    assert recformer_main(["foo"]) == 2  # LightningCLI's own error named only its four
    assert (
        "unknown command 'foo'; expected one of fit, validate, test, predict, data, evaluate, doctor, lab"
        in (capsys.readouterr().err)
    )


def test_cli_fit_logs_metrics_and_keeps_each_runs_config(tiny_data, tmp_path):
    cli = cli_main(fit_args(tiny_data, tmp_path))
    run = Path(cli.trainer.log_dir)
    rows = read_metrics(run)
    val = [r for r in rows if r.get("val/auc")]
    assert len(val) == 2  # one validation per epoch
    for key in ("val/auc", "val/gauc", "val/logloss", "val/ne", "val/calibration", "train/auc"):
        assert any(r.get(key) for r in rows), key
    assert 0.0 <= float(val[-1]["val/auc"]) <= 1.0
    # The kept checkpoint is the validation best by val AUC + val GAUC (configs/trainer.yaml).
    for r in val:
        assert float(r["val/auc_gauc"]) == pytest.approx(float(r["val/auc"]) + float(r["val/gauc"]), abs=1e-6)
    kept = max(val, key=lambda r: float(r["val/auc_gauc"]))
    (ckpt,) = [p for p in (run / "checkpoints").glob("epoch*.ckpt")]
    assert torch.load(ckpt, weights_only=False)["global_step"] == int(kept["step"]) + 1
    assert any(r.get("train/loss") for r in rows)
    assert [float(r["data/oov/item_id"]) for r in rows if r.get("data/oov/item_id")] == [0.0, 0.0]
    # The model was sized from the data's spec (linked), not from YAML.
    assert cli.model.dims == cli.datamodule.feature_dims
    assert (run / "config.yaml").is_file()
    assert list((run / "checkpoints").glob("last.ckpt"))
    cli2 = cli_main(fit_args(tiny_data, tmp_path))
    run2 = Path(cli2.trainer.log_dir)
    assert run2 != run and (run2 / "config.yaml").is_file() and (run / "config.yaml").is_file()


class DecliningAUC(pl.Callback):
    """val/auc and the kept checkpoint's val/auc_gauc fall after the first epoch, so only that one
    is a new best. Runs before the checkpoint callbacks (Lightning puts those last)."""

    def on_validation_end(self, trainer, pl_module):
        for key in ("val/auc", "val/auc_gauc"):
            trainer.callback_metrics[key] = torch.tensor(0.9 - 0.1 * trainer.current_epoch)


def test_last_ckpt_is_the_end_of_training_even_when_the_last_epoch_is_not_the_best(tiny_data, tmp_path):
    cli = cli_main(fit_args(tiny_data, tmp_path, "--trainer.callbacks+=tests.test_module.DecliningAUC"))
    ckpts = Path(cli.trainer.log_dir) / "checkpoints"
    best = list(ckpts.glob("epoch*.ckpt"))
    assert len(best) == 1 and torch.load(best[0], weights_only=False)["epoch"] == 0
    last = torch.load(ckpts / "last.ckpt", weights_only=False)
    assert last["global_step"] == cli.trainer.global_step and last["epoch"] == 1
    assert sorted(p.name for p in ckpts.iterdir()) == sorted([best[0].name, "last.ckpt"])


def test_a_fit_stops_early_and_ends_holding_the_best_checkpoints_weights(tiny_data, tmp_path, caplog):
    # The default trainer config stops on val/auc and restores the best weights ...
    callbacks = yaml.safe_load((ROOT / "configs" / "trainer.yaml").read_text())["trainer"]["callbacks"]
    stop = next(c for c in callbacks if c["class_path"].endswith("EarlyStopping"))
    assert stop["init_args"] == {
        "monitor": "val/auc",
        "mode": "max",
        "patience": 4,
        "check_on_train_epoch_end": False,
    }
    assert any(c["class_path"] == "recformer.callbacks.best.RestoreBest" for c in callbacks)
    # ... so with val/auc peaking at the first of seven epochs, the fit stops after the fifth and
    # ends holding the first epoch's weights, while last.ckpt keeps the latest state.
    dm = RecDataModule(str(tiny_data), batch_size=64, num_workers=0)
    best_cb = ModelCheckpoint(dirpath=tmp_path / "ckpt", monitor="val/auc", mode="max")
    last_cb = ModelCheckpoint(dirpath=tmp_path / "ckpt", filename="last")
    es = EarlyStopping(**stop["init_args"])
    cbs = [es, RestoreBest(), best_cb, last_cb]
    trainer = pl.Trainer(
        accelerator="cpu",
        max_epochs=7,
        callbacks=cbs,
        logger=False,
        enable_progress_bar=False,
        num_sanity_val_steps=0,
        default_root_dir=tmp_path,
    )
    module = _module(dm)
    auc = module.val_metrics["auc"]
    real = auc.compute
    auc.compute = lambda: real() * 0 + 0.9 - 0.1 * trainer.current_epoch  # what val/auc logs
    with caplog.at_level(logging.INFO, logger="lightning.pytorch"):
        trainer.fit(module, dm)
    assert trainer.current_epoch == 5 and es.stopped_epoch == 4
    best = torch.load(best_cb.best_model_path, weights_only=True)
    assert best["epoch"] == 0
    # One line says so: that early stopping fired, after which validation, and whose weights the
    # model holds (9 steps an epoch).
    (said,) = [r.getMessage() for r in caplog.records if "best weights" in r.getMessage()]
    assert said == (
        "Early stopping: val/auc did not improve in 4 validations; the fit stopped after validation 5 "
        f"(epoch 4, step 45); the model holds the best weights by val/auc (0.9000): validation 1 "
        f"(epoch 0, step 9), {best_cb.best_model_path}"
    )
    last = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=True)
    now = module.state_dict()
    assert all(torch.equal(now[k], v) for k, v in best["state_dict"].items())
    assert not all(torch.equal(now[k], v) for k, v in last["state_dict"].items())


def test_item_content_is_in_the_checkpoint(tiny_data, tmp_path):
    cli = cli_main(fit_args(tiny_data, tmp_path, "--trainer.max_epochs=1"))
    ckpt = Path(cli.trainer.log_dir) / "checkpoints" / "last.ckpt"
    state = torch.load(ckpt, map_location="cpu", weights_only=False)["state_dict"]
    content = state["ranker.tokens.item_content"]
    side = pq.read_table(tiny_data / "items.parquet").to_pydict()["content"]
    assert content[1 + 3].tolist() == pytest.approx(side[3], abs=1e-3)


def test_evaluate_and_predict_from_a_checkpoint(tiny_data, tmp_path):
    cli = cli_main(fit_args(tiny_data, tmp_path, "--trainer.max_epochs=1"))
    ckpt = Path(cli.trainer.log_dir) / "checkpoints" / "last.ckpt"
    r = evaluate(ckpt, tiny_data, split="test", batch_size=32, num_workers=0)
    assert r["rows"] == 90 and r["auc_exact"]
    assert r["auc_lo"] <= r["auc"] <= r["auc_hi"]
    assert 0 < r["logloss"] < 2 and r["gauc_groups"] > 0
    same = evaluate(ckpt, tiny_data, split="test", batch_size=32, num_workers=0, compare=ckpt)["compare"]
    assert same["auc_a"] == same["auc_b"] == pytest.approx(r["auc"]) and same["diff"] == 0
    assert "note" not in same  # unweighted 0/1 labels: the test applies as it is
    assert r["gauc_groups_excluded"] >= 0 and 0 <= r["gauc_excluded_share"] <= 1
    # 90 rows in batches of 32, 26: the guard trips on the batch that would pass the limit.
    with pytest.raises(ValueError, match="max-rows-in-memory=89"):
        evaluate(
            ckpt, tiny_data, split="test", batch_size=32, num_workers=0, max_rows_in_memory=89, compare=ckpt
        )
    run = ckpt.parent.parent
    args = predict_args(tiny_data, tmp_path / "p", ckpt)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    pred_cli = cli_main(args)
    # Beside the checkpoint it scores, in its run folder; no run folder, config or W&B run of its own.
    out = run / "predictions-test-last.parquet"
    after = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    assert set(after) - set(before) == {out.relative_to(tmp_path)}
    pred = pq.read_table(out).to_pydict()
    assert sorted(pred["row_id"]) == list(range(635, 725))  # every test row, with its keys
    assert all(0 < s < 1 for s in pred["score"])
    assert not pred_cli.trainer.predict_loop._return_predictions  # streamed, not also held in memory
    # A second predict refuses to replace the file; --output names another; --overwrite replaces.
    with pytest.raises(ValueError, match="predictions-test-last.parquet exists"):
        cli_main(predict_args(tiny_data, tmp_path / "p", ckpt))
    cli_main([*predict_args(tiny_data, tmp_path / "p", ckpt), f"--output={tmp_path / 'mine.parquet'}"])
    assert pq.read_table(tmp_path / "mine.parquet").num_rows == 90
    cli_main([*predict_args(tiny_data, tmp_path / "p", ckpt), "--overwrite=true"])


def _respec(src: Path, dst: Path, edit) -> Path:
    """A copy of the data at ``src`` whose spec.yaml ``edit`` changed (the Parquet files are links)."""
    dst.mkdir(parents=True)
    for f in src.iterdir():
        (dst / f.name).symlink_to(f)
    (dst / "spec.yaml").unlink()
    raw = yaml.safe_load((src / "spec.yaml").read_text())
    edit(raw)
    (dst / "spec.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    return dst


def test_a_checkpoint_refuses_data_whose_columns_differ_where_sizes_agree(
    tiny_data, tmp_path, capsys, caplog
):
    """Two dense columns swapped in the spec: every size agrees, and the model would read each
    column in the other's place. evaluate and predict refuse it, naming the columns; a changed
    normalisation only warns (the sizes and columns are right, the inputs shift)."""
    cli = cli_main(fit_args(tiny_data, tmp_path / "run", "--trainer.max_epochs=1"))
    ckpt = Path(cli.trainer.log_dir) / "checkpoints" / "last.ckpt"

    def swap(raw):
        raw["dense"] = raw["dense"][::-1]

    swapped = _respec(tiny_data, tmp_path / "swapped", swap)
    with pytest.raises(
        DataError, match=r"dense: data \['age', 'activity'\] vs checkpoint \['activity', 'age'\]"
    ):
        evaluate(ckpt, swapped, split="test", batch_size=32, num_workers=0)
    predict = predict_args(swapped, tmp_path / "p", ckpt)
    assert recformer_main(predict) == 2
    said = capsys.readouterr().err
    assert "the data does not match the checkpoint: other columns feed the model (dense:" in said
    assert "Traceback" not in said

    def reorder(raw):
        raw["categorical"][1]["vocab"] = raw["categorical"][1]["vocab"][::-1]  # device: same size

    with pytest.raises(
        DataError, match=r"other string vocabularies, whose values would read other embedding rows \(device"
    ):
        evaluate(
            ckpt,
            _respec(tiny_data, tmp_path / "reorder", reorder),
            split="test",
            batch_size=32,
            num_workers=0,
        )

    def renorm(raw):
        raw["dense"][1]["std"] = 3.0

    with caplog.at_level(logging.WARNING, logger="recformer.module"):
        r = evaluate(
            ckpt, _respec(tiny_data, tmp_path / "renorm", renorm), split="test", batch_size=32, num_workers=0
        )
    assert r["rows"] == 90
    assert "age: data mean=0 std=3 log1p=False vs checkpoint mean=0 std=1 log1p=False" in caplog.text


def test_evaluate_and_predict_count_unknown_ids(tiny_data, tmp_path, caplog):
    """Rows whose item id is outside the vocabulary are scored through the OOV row and counted in
    evaluate's report and predict's warning, not dropped."""
    cli = cli_main(fit_args(tiny_data, tmp_path / "run", "--trainer.max_epochs=1"))
    ckpt = Path(cli.trainer.log_dir) / "checkpoints" / "last.ckpt"
    data = tmp_path / "oov"
    shutil.copytree(tiny_data, data)
    (part,) = (data / "test").glob("*.parquet")
    t = pq.read_table(part)
    items = t.column("item_id").to_numpy().copy()
    items[:3] = 10_000  # vocab_size is 50
    pq.write_table(
        t.set_column(t.schema.get_field_index("item_id"), t.schema.field("item_id"), pa.array(items)), part
    )
    r = evaluate(ckpt, data, split="test", batch_size=32, num_workers=0)
    assert r["rows"] == 90 and r["unknown_ids"] == {
        "item_id": 3,
        "hour": 0,
        "device": 0,
        "hist_items": 0,
        "hist_actions": 0,
    }
    assert "unknown ids  item_id 3  (mapped to the OOV row, not dropped)" in format_table(r)
    with caplog.at_level(logging.WARNING, logger="recformer.module"):
        cli_main(predict_args(data, tmp_path / "p", ckpt))
    assert "predict: unknown ids mapped to the OOV row (scored, not dropped): {'item_id': 3}" in caplog.text


def test_failed_predict_leaves_a_readable_partial_file_and_no_final_one(tiny_data, tmp_path):
    class FailAt(pl.Callback):
        def on_predict_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
            if batch_idx == 2:
                raise RuntimeError("simulated failure mid-predict")

    dm = RecDataModule(str(tiny_data), batch_size=16, num_workers=0, validate="footer")
    m = RankerModule(ranker=TINY, dims=dm.feature_dims)
    out = tmp_path / "scores.parquet"
    trainer = _trainer(tmp_path, callbacks=[ParquetPredictionWriter(str(out)), FailAt()])
    with pytest.raises(RuntimeError, match="simulated"):
        trainer.predict(m, dm, return_predictions=False)
    assert not out.exists()  # a file under the final name is always complete
    partial = pq.read_table(out.with_name("scores.parquet.partial"))
    assert partial.num_rows == 32  # the two batches written before the failure


def test_compare_with_weights_or_soft_labels_says_what_it_tested():
    rng = np.random.default_rng(0)
    y = (rng.random(400) < 0.4).astype(float)
    a, b = y + rng.normal(0, 1.0, 400), y + rng.normal(0, 1.5, 400)
    w = rng.uniform(0.1, 3.0, 400)
    unweighted = compare_aucs(a, b, y, np.ones(400))
    assert unweighted["diff"] == pytest.approx(unweighted["auc_a"] - unweighted["auc_b"])
    assert "note" not in unweighted
    weighted = compare_aucs(a, b, y, w)
    assert weighted["auc_a"] == pytest.approx(exact_auc(a, y, w))  # as the report's own (weighted) auc
    assert weighted["diff"] == pytest.approx(weighted["auc_a_unweighted"] - weighted["auc_b_unweighted"])
    assert "ignores sample weights" in weighted["note"]
    soft = compare_aucs(a, b, np.clip(y * 0.9 + 0.05, 0, 1), np.ones(400))
    assert "diff" not in soft and "soft labels" in soft["note"] and 0 < soft["auc_a"] < 1
    one_class = compare_aucs(a, b, np.ones(400), np.ones(400))
    assert math.isnan(one_class["auc_a"]) and "no paired DeLong test" in one_class["note"]


def test_evaluate_cli_writes_json(tiny_data, tmp_path):
    cli = cli_main(fit_args(tiny_data, tmp_path, "--trainer.max_epochs=1"))
    ckpt = Path(cli.trainer.log_dir) / "checkpoints" / "last.ckpt"
    out = tmp_path / "eval.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "recformer",
            "evaluate",
            "--ckpt",
            str(ckpt),
            "--data",
            str(tiny_data),
            "--out",
            str(out),
            "--num-workers",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "95% CI" in proc.stdout and "GAUC" in proc.stdout
    assert json.loads(out.read_text())["rows"] == 90
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "recformer",
            "evaluate",
            "--ckpt",
            str(tmp_path / "nope.ckpt"),
            "--data",
            str(tiny_data),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bad.returncode == 2 and "nope.ckpt" in bad.stderr


def _trainer(root: Path, **kw) -> pl.Trainer:
    return pl.Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root,
        deterministic=True,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        **kw,
    )


def _module(dm: RecDataModule, **optim) -> RankerModule:
    pl.seed_everything(0)
    return RankerModule(ranker=TINY, optim=OptimConfig(warmup_steps=3, **optim), dims=dm.feature_dims)


class Killed(Exception):
    pass


class KillAt(pl.Callback):
    def __init__(self, step: int):
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.step:
            raise Killed(f"killed at step {self.step}")


def test_killed_mid_epoch_and_resumed_ends_with_the_same_weights(tiny_data, tmp_path):
    dm = lambda: RecDataModule(str(tiny_data), batch_size=64, num_workers=0, validate="footer")
    ref = _module(dm())
    _trainer(tmp_path / "a", max_epochs=2, enable_checkpointing=False).fit(ref, dm())

    ck = ModelCheckpoint(dirpath=tmp_path / "ck", every_n_train_steps=11, save_top_k=-1)
    first = _module(dm())
    with pytest.raises(Killed):  # same run configuration, killed after the step-11 checkpoint
        _trainer(tmp_path / "b", max_epochs=2, callbacks=[ck, KillAt(11)]).fit(first, dm())
    resumed = _module(dm())
    _trainer(tmp_path / "c", max_epochs=2, enable_checkpointing=False).fit(
        resumed, dm(), ckpt_path=next((tmp_path / "ck").glob("*.ckpt"))
    )
    assert ref.global_step == resumed.global_step == 2 * 9
    for (name, a), b in zip(ref.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name


class NaNAt(pl.Callback):
    """Poisons the loss on the given steps, as a data or overflow problem would."""

    def __init__(self, steps: set[int]):
        self.steps = steps

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step in self.steps:
            batch.dense[0, 0] = float("nan")


def test_nonfinite_step_is_skipped_and_counted(tiny_data, tmp_path):
    dm = RecDataModule(str(tiny_data), batch_size=64, num_workers=0, validate="footer")
    m = _module(dm)
    snapshots = {}

    class Snap(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            snapshots[trainer.global_step] = {k: v.clone() for k, v in pl_module.ranker.state_dict().items()}

    _trainer(tmp_path, max_steps=6, callbacks=[NaNAt({3}), Snap()]).fit(m, dm)
    assert int(m.nonfinite_total) == 1
    # The poisoned batch (run at global step 3) changed nothing: not the weights, not Adam's state.
    for k, v in snapshots[4].items():
        assert torch.equal(v, snapshots[3][k]), k
    assert not torch.equal(snapshots[5]["head.out.weight"], snapshots[4]["head.out.weight"])
    assert all(torch.isfinite(p).all() for p in m.parameters())
    state_steps = {int(s["step"]) for s in m.trainer.optimizers[0].state.values() if "step" in s}
    assert state_steps == {5}  # 6 batches, one skipped


def test_too_many_nonfinite_steps_stop_with_a_clear_message(tiny_data, tmp_path):
    dm = RecDataModule(str(tiny_data), batch_size=64, num_workers=0, validate="footer")
    m = _module(dm, max_nonfinite_steps=3)
    with pytest.raises(RuntimeError, match="max_nonfinite_steps=3"):
        _trainer(tmp_path, max_steps=8, callbacks=[NaNAt({1, 2, 3, 4})]).fit(m, dm)


def test_fast_dev_run_passes_with_a_warmup_longer_than_the_run(tiny_data, tmp_path, caplog):
    """A smoke run (``trainer.fast_dev_run``) of a config made for real runs: the schedule drops its
    warmup for that run and says so; a real run shorter than its warmup is still refused."""
    dm = RecDataModule(str(tiny_data), batch_size=64, num_workers=0, validate="footer")
    m = RankerModule(ranker=TINY, optim=OptimConfig(warmup_steps=100), dims=dm.feature_dims)
    with caplog.at_level("WARNING", logger="recformer.module"):
        _trainer(tmp_path, fast_dev_run=True).fit(m, dm)
    assert "without warmup" in caplog.text
    assert m.optim_cfg.warmup_steps == 100  # the user's setting is kept (and checkpointed)
    real = RankerModule(ranker=TINY, optim=OptimConfig(warmup_steps=100), dims=dm.feature_dims)
    with pytest.raises(ValueError, match="warmup_steps=100"):
        _trainer(tmp_path, max_steps=5).fit(real, dm)


@pytest.mark.parametrize("arch", ["din", "deepfm", "dcnv2", "dcnv2_parallel", "bst", "popularity"])
def test_baselines_train_through_the_same_module(tiny_data, tmp_path, arch):
    dm = RecDataModule(str(tiny_data), batch_size=64, num_workers=0, validate="footer")
    pl.seed_everything(0)
    m = RankerModule(ranker=TINY, optim=OptimConfig(warmup_steps=2, lr=1e-2), dims=dm.feature_dims, arch=arch)
    before = {k: v.clone() for k, v in m.ranker.state_dict().items()}
    _trainer(tmp_path, max_steps=5).fit(m, dm)
    changed = [k for k, v in m.ranker.state_dict().items() if not torch.equal(v, before[k])]
    assert changed


def test_wandb_offline_run_is_written(tiny_data, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    cli = cli_main(fit_args(tiny_data, tmp_path, "--trainer.max_epochs=1"))
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    assert list(runs[0].glob("*.wandb")) and (runs[0] / "files").is_dir()
    assert cli.trainer.loggers[1].disabled is False


def test_wandb_online_setting_wins_over_a_stale_wandb_mode(tmp_path, monkeypatch):
    """Lightning sets WANDB_MODE=dryrun once an offline W&B logger starts; a later logger asked to
    be online must still be. Unset, WANDB_MODE decides; WANDB_MODE=disabled always wins."""
    from recformer.loggers import SafeWandbLogger

    monkeypatch.setenv("WANDB_MODE", "dryrun")
    assert SafeWandbLogger(save_dir=str(tmp_path), online=True)._wandb_init["mode"] == "online"
    assert SafeWandbLogger(save_dir=str(tmp_path))._wandb_init["mode"] == "dryrun"
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert SafeWandbLogger(save_dir=str(tmp_path), online=True)._wandb_init["mode"] == "disabled"
    monkeypatch.delenv("WANDB_MODE")
    assert SafeWandbLogger(save_dir=str(tmp_path))._wandb_init["mode"] == "offline"


def test_wandb_failure_never_stops_training(tiny_data, tmp_path, monkeypatch):
    import wandb

    def broken_init(*a, **k):
        raise RuntimeError("simulated: cannot reach the W&B server")

    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.setattr(wandb, "init", broken_init)
    with pytest.warns(UserWarning, match="W&B logging is off"):
        cli = cli_main(fit_args(tiny_data, tmp_path, "--trainer.max_epochs=1"))
    assert cli.trainer.loggers[1].disabled
    assert any(r.get("val/auc") for r in read_metrics(Path(cli.trainer.log_dir)))  # CSV has the run


def _with_unknown_items(data: Path, n: int) -> None:
    """Give the first ``n`` rows of the first train file an item id outside the vocabulary."""
    part = sorted((data / "train").glob("*.parquet"))[0]
    t = pq.read_table(part)
    items = t.column("item_id").to_numpy().copy()
    items[:n] = 10_000  # vocab_size is 50
    col = t.schema.get_field_index("item_id")
    pq.write_table(t.set_column(col, t.schema.field("item_id"), pa.array(items)), part, row_group_size=64)


@pytest.mark.parametrize("train_files", [(300, 170), (300, 171)], ids=["even", "uneven"])
def test_two_process_ddp_fit_with_every_default(tmp_path, train_files):
    """``recformer fit`` on 2 gloo ranks exactly as a user runs it: configs/trainer.yaml's loggers
    (CSV and W&B offline), its callbacks, the progress bar, loader workers. The rank-0 progress bar
    computes the epoch metrics inside the callbacks' epoch-end hooks; a collective of the module's
    own there (the unknown-id sum) met its all_gather and both ranks waited for good."""
    # 121 validation rows: 61 and 60 on the two ranks.
    data = write_tiny_data(tmp_path / "data", train_files=train_files, val_rows=121, test_rows=30)
    _with_unknown_items(data, 7)
    args = [
        "fit",
        f"--config={ROOT / 'configs/model/tiny.yaml'}",
        f"--data.data_dir={data}",
        "--data.batch_size=64",
        "--model.optim.warmup_steps=2",
        "--trainer.accelerator=cpu",
        "--trainer.devices=2",
        "--trainer.strategy=ddp",
        "--trainer.max_epochs=2",
        "--trainer.log_every_n_steps=2",
    ]
    proc = run_recformer(args, cwd=tmp_path, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # The progress bar was on (Lightning draws it on stdout): TQDM's, or Rich's where rich is installed.
    assert "Epoch 1: 100%" in proc.stdout or "Epoch 1/1 " in proc.stdout
    runs = sorted((tmp_path / "runs" / "recformer").glob("version_*"))
    assert len(runs) == 1  # rank 0 only writes the run directory
    assert list((tmp_path / "runs" / "wandb").glob("offline-run-*"))  # W&B's offline run
    ckpts = {p.name for p in (runs[0] / "checkpoints").glob("*.ckpt")}
    rows = read_metrics(runs[0])
    val = [r for r in rows if r.get("val/loss")]
    # The kept checkpoint is the best val/auc_gauc, the sum of the two metrics synced over ranks.
    for r in val:
        assert float(r["val/auc_gauc"]) == pytest.approx(float(r["val/auc"]) + float(r["val/gauc"]), abs=1e-6)
    kept = max(val, key=lambda r: float(r["val/auc_gauc"]))
    assert "last.ckpt" in ckpts and any(c.startswith(f"epoch{kept['epoch']}-") for c in ckpts), ckpts
    # The loss is the weighted logloss over all 121 rows (it had been divided by 2 x 60 rows).
    assert len(val) == 2 and all(float(r["val/loss"]) == pytest.approx(float(r["val/logloss"])) for r in val)
    oov = [float(r["data/oov/item_id"]) for r in rows if r.get("data/oov/item_id")]
    if sum(train_files) % 2 == 0:  # no row repeated to even the ranks: the 7 rows, once per epoch
        assert oov == [7.0, 7.0]
    else:  # one rank repeats one row of the epoch's order; it counts again if it is one of the 7
        assert len(oov) == 2 and all(v in (7.0, 8.0) for v in oov)
    health = [json.loads(line) for line in (runs[0] / "health.jsonl").read_text().splitlines()]
    assert any("health/grad_norm/block_0" in r for r in health)


@pytest.mark.parametrize("precision, fused", [("16-mixed", False), ("bf16-mixed", None), ("32-true", None)])
def test_fp16_never_gets_a_fused_adamw(tiny_data, monkeypatch, precision, fused):
    """Under a GradScaler Lightning would let a fused AdamW unscale inside its step, after this
    module's clipping and the health callbacks have read the (scaled) gradients."""
    import recformer.module as module_mod

    seen = {}
    real = module_mod.build_optimizer
    monkeypatch.setattr(module_mod, "build_optimizer", lambda *a, **k: seen.update(k) or real(*a, **k))
    dm = RecDataModule(str(tiny_data), batch_size=64, num_workers=0, validate="footer")
    m = RankerModule(ranker=TINY, dims=dm.feature_dims)
    m._trainer = SimpleNamespace(precision=precision, estimated_stepping_batches=1000, fast_dev_run=False)
    m.configure_optimizers()
    assert seen["fused"] is fused


def test_gradients_are_clipped_at_optim_grad_clip(tiny_data):
    dm = RecDataModule(str(tiny_data), batch_size=64, num_workers=0, validate="footer")
    m = RankerModule(ranker=TINY, optim=OptimConfig(grad_clip=0.01), dims=dm.feature_dims)
    for p in m.parameters():
        p.grad = torch.ones_like(p)
    before = torch.nn.utils.get_total_norm([p.grad for p in m.parameters()])
    m.configure_gradient_clipping(optimizer=None)
    after = torch.nn.utils.get_total_norm([p.grad for p in m.parameters()])
    assert before > 1 and after == pytest.approx(0.01, rel=1e-3)


def test_trainer_clipping_setting_is_refused(tiny_data, tmp_path):
    dm = RecDataModule(str(tiny_data), batch_size=64, num_workers=0, validate="footer")
    with pytest.raises(ValueError, match="optim.grad_clip"):
        _trainer(tmp_path, max_steps=1, gradient_clip_val=1.0).fit(_module(dm), dm)


@pytest.mark.slow
def test_compiled_module_trains_and_keeps_state_dict_keys(tiny_data, tmp_path):
    dm = RecDataModule(str(tiny_data), batch_size=64, num_workers=0, validate="footer")
    pl.seed_everything(0)
    m = RankerModule(ranker=TINY, optim=OptimConfig(warmup_steps=1), dims=dm.feature_dims, compile=True)
    keys = set(m.state_dict())
    _trainer(tmp_path, max_steps=3).fit(m, dm)
    assert m.ranker._compiled_call_impl is not None  # nn.Module.compile() in place
    assert set(m.state_dict()) == keys  # no `_orig_mod.` prefixes
    assert all(torch.isfinite(p).all() for p in m.parameters())


def test_true_half_precision_keeps_the_metric_states_in_their_dtypes(tiny_data, tmp_path):
    """Lightning's *-true precisions convert the whole module with .to(dtype): the metrics' float64
    sums must stay float64 (bf16 sums stop counting at 256) and a step must run."""
    dm = RecDataModule(str(tiny_data), batch_size=64, num_workers=0, validate="footer")
    m = _module(dm)
    m.to(dtype=torch.bfloat16)
    assert m.ranker.head.out.weight.dtype == torch.bfloat16
    sums = lambda m: [getattr(x, n) for x in m.modules() if isinstance(x, Metric) for n in x._defaults]
    assert sums(m) and all(v == [] or v.dtype == torch.float64 for v in sums(m))
    fitted = _module(dm)
    _trainer(tmp_path, max_steps=5, precision="bf16-true").fit(fitted, dm)  # raised in BinnedAUC
    assert fitted.trainer.global_step == 5 and fitted.ranker.head.out.weight.dtype == torch.bfloat16
    assert all(v == [] or v.dtype == torch.float64 for v in sums(fitted))


def test_pure_float16_training_is_refused_before_its_first_nan_step(tiny_data, tmp_path):
    dm = RecDataModule(str(tiny_data), batch_size=64, num_workers=0, validate="footer")
    with pytest.raises(ValueError, match="precision='16-true'.*AdamW.*'bf16-true'"):
        _trainer(tmp_path, max_steps=5, precision="16-true").fit(_module(dm), dm)


def test_a_bad_setting_is_one_line_naming_it(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("RECFORMER_TRACEBACK", raising=False)
    args = fit_args(tmp_path / "nope", tmp_path)
    assert recformer_main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    # (pytest's own arguments in sys.argv make LightningCLI warn first when warnings are not captured)
    said = [line for line in err if line.startswith("recformer fit: error:")]
    assert said[0].startswith(f"recformer fit: error: data.data_dir={tmp_path / 'nope'}: no spec.yaml there")
    assert "recformer data movielens --out DIR" in said[0] and "Traceback" not in "\n".join(err)
    monkeypatch.setenv("RECFORMER_TRACEBACK", "1")
    with pytest.raises(FileNotFoundError, match="no spec.yaml"):
        recformer_main(args)


def test_a_misspelled_setting_is_named_without_the_usage_of_every_setting(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        cli_main(["fit", "--data.batchsize=128"])
    assert e.value.code == 2
    err = capsys.readouterr().err.splitlines()
    # (LightningCLI warns first about pytest's own sys.argv when pytest does not capture warnings)
    assert err[next(i for i, line in enumerate(err) if line.startswith("recformer")) :] == [
        "recformer fit: error: unrecognized arguments: --data.batchsize=128",
        "(every setting: recformer fit --help)",
    ]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--batch-size", "0"], "--batch-size=0; expected an integer >= 1"),
        (["--num-workers", "-1"], "--num-workers=-1; expected an integer >= 0"),
        (["--data", "nope"], "--data nope is not a folder (expected spec.yaml and split folders)"),
    ],
)
def test_evaluate_names_a_bad_flag(tiny_data, capsys, args, said):
    argv = ["evaluate", "--ckpt", "x.ckpt", "--data", str(tiny_data), *args]
    with pytest.raises(SystemExit) if "nope" not in args else contextlib.nullcontext():
        assert recformer_main(argv) == 2
    assert said in capsys.readouterr().err


@pytest.mark.parametrize(
    ("ckpt", "said"),
    [
        ("folder", "is a folder; expected a .ckpt file in it"),
        ("README.md", "is not a readable checkpoint written by"),
    ],
)
def test_evaluate_says_what_is_wrong_with_the_ckpt(tiny_data, tmp_path, capsys, ckpt, said):
    path = tmp_path if ckpt == "folder" else ROOT / ckpt
    assert recformer_main(["evaluate", "--ckpt", str(path), "--data", str(tiny_data)]) == 2
    err = capsys.readouterr().err
    assert said in err and len(err.strip().splitlines()) == 1


def test_fit_prints_none_of_lightnings_known_false_alarms(tiny_data, tmp_path, recwarn):
    cli_main(fit_args(tiny_data, tmp_path, "--trainer.max_epochs=1", "--data.num_workers=1"))
    said = [str(w.message) for w in recwarn]
    assert not [m for m in said if any(re.search(p, m) for p in KNOWN_FALSE_ALARMS)], said


def test_evaluate_keeps_a_device_error_its_own_message(tiny_data, tmp_path, monkeypatch):
    """Only a file that is not a checkpoint is called one; a device error is not relabelled."""
    import recformer.module as module_mod

    def no_device(*args, **kwargs):
        raise RuntimeError("Attempting to deserialize object on a CUDA device")

    monkeypatch.setattr(module_mod.RankerModule, "load_from_checkpoint", no_device)
    with pytest.raises(RuntimeError, match="CUDA device"):
        recformer_main(["evaluate", "--ckpt", str(ROOT / "README.md"), "--data", str(tiny_data)])


def test_half_deepnet_is_refused_for_a_new_fit_but_its_checkpoint_still_loads(
    tiny_data, tmp_path, monkeypatch
):
    dm = RecDataModule(str(tiny_data), batch_size=64, num_workers=0, validate="footer")
    half = RankerConfig(**{**asdict(TINY), "norm_placement": "deepnorm"})
    module = lambda: RankerModule(ranker=half, optim=OptimConfig(warmup_steps=3), dims=dm.feature_dims)
    with pytest.raises(ValueError, match="norm_placement='deepnorm' with init='scaled'"):
        _trainer(tmp_path, max_steps=5).fit(module(), dm)
    # A checkpoint written before the check existed.
    with monkeypatch.context() as m:
        m.setattr(RankerConfig, "half_methods", lambda self: [])
        trainer = _trainer(tmp_path, max_steps=5)
        trainer.fit(module(), dm)
    old = tmp_path / "old.ckpt"
    trainer.save_checkpoint(old)
    assert RankerModule.load_from_checkpoint(old, weights_only=True).ranker.cfg.norm_placement == "deepnorm"
    resumed = module()
    _trainer(tmp_path, max_steps=8).fit(resumed, dm, ckpt_path=old)
    assert resumed.trainer.global_step == 8


def test_a_bug_keeps_its_traceback(monkeypatch, capsys):
    """Only a deliberate check (a raise with its message) becomes one line; Python failing inside
    an expression is a bug, and its traceback is what helps."""
    import recformer.cli

    def buggy(args=None):
        return int("not a number")

    monkeypatch.setattr(recformer.cli, "cli_main", buggy)
    monkeypatch.setenv("RECFORMER_TRACEBACK", "0")  # "0" is off, like unset
    with pytest.raises(ValueError, match="invalid literal"):
        recformer_main(["fit"])


def test_a_run_without_loggers_trains_into_its_own_run_folder(tiny_data, tmp_path):
    """--trainer.logger false: Lightning's LearningRateMonitor had stopped such a run, and its files
    went straight into default_root_dir, where the next one stopped on the config already there."""
    for version in (0, 1):
        cli = cli_main(fit_args(tiny_data, tmp_path, "--trainer.logger=false", "--trainer.max_epochs=1"))
        run = tmp_path / "recformer" / f"version_{version}"
        assert Path(cli.trainer.log_dir) == run
        assert (run / "config.yaml").is_file() and (run / "checkpoints" / "last.ckpt").is_file()


def test_a_run_that_fails_at_its_start_leaves_no_run_folder(tiny_data, tmp_path, capsys):
    args = fit_args(tiny_data, tmp_path, "--trainer.max_steps=3", "--model.optim.warmup_steps=10")
    assert recformer_main(args) == 2
    assert "warmup_steps=10" in capsys.readouterr().err
    assert not list((tmp_path / "recformer").glob("version_*"))

    def missing_column(raw):
        raw["dense"].append({"name": "nope"})

    bad = _respec(tiny_data, tmp_path / "bad", missing_column)  # found at the DataModule's set-up
    assert recformer_main(fit_args(bad, tmp_path)) == 2
    assert "'nope'" in capsys.readouterr().err
    assert not list((tmp_path / "recformer").glob("version_*"))
    cli = cli_main(fit_args(tiny_data, tmp_path, "--trainer.max_epochs=1"))  # the next run is version_0
    assert Path(cli.trainer.log_dir).name == "version_0"


def test_a_mid_epoch_resume_prints_no_false_alarm(tiny_data, tmp_path, recwarn):
    first = cli_main(fit_args(tiny_data, tmp_path, "--trainer.max_steps=4"))  # 9 batches per epoch
    last = Path(first.trainer.log_dir) / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=False)["global_step"] == 4
    cli_main(fit_args(tiny_data, tmp_path, "--trainer.max_steps=6", f"--ckpt_path={last}"))
    said = [str(w.message) for w in recwarn]
    assert not [m for m in said if "not resumable" in m], said


def test_a_rank_without_predict_rows_still_joins_the_unknown_id_sum(tiny_data):
    """Fewer rows than ranks: a rank runs no predict batch, yet the others wait in the reduce."""
    dm = RecDataModule(str(tiny_data), num_workers=0)
    m = RankerModule(ranker=TINY, dims=dm.feature_dims)
    reduce = mock.Mock(side_effect=lambda t, reduce_op: t + 1)
    trainer = SimpleNamespace(
        datamodule=dm, world_size=2, is_global_zero=False, strategy=SimpleNamespace(reduce=reduce)
    )
    with mock.patch.object(RankerModule, "trainer", trainer):
        m.on_predict_end()
    reduce.assert_called_once()
    assert reduce.call_args.args[0].tolist() == [0.0] * len(dm.oov_fields)


def test_pairwise_loss_is_ranknet_over_same_group_pairs():
    from recformer.losses import pairwise_loss

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(40, generator=g, requires_grad=True)
    label = (torch.rand(40, generator=g) < 0.4).float()
    group = torch.randint(0, 5, (40,), generator=g)
    terms = [
        torch.nn.functional.softplus(-(logits[i] - logits[j]))
        for i in range(40)
        for j in range(40)
        if group[i] == group[j] and label[i] > label[j]
    ]
    assert len(terms) > 10
    got = pairwise_loss(logits, label, group)
    assert torch.allclose(got, torch.stack(terms).mean())
    got.backward()
    pos = (label == 1) & (group == group[0])
    assert (logits.grad[pos] <= 0).all()  # descent raises the positives' scores
    assert pairwise_loss(logits, torch.ones(40), group).item() == 0.0  # no pair: no loss


@pytest.mark.parametrize("preset", sorted(p.name for p in (ROOT / "configs" / "model").glob("*.yaml")))
def test_every_shipped_model_preset_builds(preset, tiny_data, tmp_path):
    """Each configs/model/*.yaml (with base.yaml's trainer) builds its ranker on a data folder."""
    cli = cli_main(
        [f"--config={ROOT / 'configs/model' / preset}", *fit_args(tiny_data, tmp_path)[1:]], run=False
    )
    assert sum(p.numel() for p in cli.model.parameters()) > 0
