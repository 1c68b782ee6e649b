"""What a user reads from ``recformer fit``, ``predict`` and ``--help`` (issue 30): how a fit ended,
where predict wrote, no warnings or adverts on the shipped path, settings read as Lightning
documents them, and no W&B leftovers from a fit refused at its start. Defaults on: the progress
bar, the CSV and W&B loggers, every default callback."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from recformer.__main__ import main as recformer_main
from recformer.cli import cli_main
from tests._subprocess import run_recformer

TINY = ["--model.ranker.d_model=16", "--model.ranker.n_layers=2", "--model.ranker.n_heads=2"]


def fit_args(data: Path, root: Path, *extra: str) -> list[str]:
    """A tiny fit on ``data`` with the default trainer config (progress bar, loggers, callbacks),
    its run files under ``root``."""
    loggers = root / "loggers.yaml"
    root.mkdir(parents=True, exist_ok=True)
    loggers.write_text(
        "trainer:\n  logger:\n"
        "    - class_path: lightning.pytorch.loggers.CSVLogger\n"
        f"      init_args: {{save_dir: {root}, name: recformer}}\n"
        "    - class_path: recformer.loggers.SafeWandbLogger\n"
        f"      init_args: {{save_dir: {root}}}\n"
    )
    return [
        "fit",
        f"--config={loggers}",
        f"--data.data_dir={data}",
        "--data.batch_size=64",
        "--data.num_workers=0",
        *TINY,
        "--model.optim.warmup_steps=2",
        "--trainer.accelerator=cpu",
        "--trainer.devices=1",
        "--trainer.log_every_n_steps=2",
        f"--trainer.default_root_dir={root}",
        *extra,
    ]


def test_limit_val_batches_1_is_one_batch_and_a_float_a_fraction(tiny_data, tmp_path):
    """Lightning reads an int as batches and a float as a fraction; typing's union cache had made
    the CLI read "1" as 1.0, all of validation."""
    args = fit_args(tiny_data, tmp_path, "--data.eval_batch_size=16", "--trainer.max_epochs=1")
    cli = cli_main([*args, "--trainer.limit_val_batches=1", "--trainer.limit_train_batches=0.5"])
    assert cli.trainer.limit_val_batches == 1 and isinstance(cli.trainer.limit_val_batches, int)
    assert cli.trainer.num_val_batches == [1]  # of 8 (120 rows in batches of 16)
    assert cli.trainer.limit_train_batches == 0.5 and cli.trainer.num_training_batches == 4  # of 9
    whole = cli_main([*args[1:], "--trainer.limit_val_batches=1.0"], run=False)
    assert whole.trainer.limit_val_batches == 1.0 and isinstance(whole.trainer.limit_val_batches, float)


def test_a_fit_refused_at_its_start_leaves_no_wandb_link_behind(tiny_data, tmp_path, monkeypatch):
    """W&B's latest-run, debug.log and debug-internal.log links went with the refused run's folder,
    pointing at nothing; a finished run's folder and the links into it are kept."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    wandb_dir = tmp_path / "wandb"
    cli_main(fit_args(tiny_data, tmp_path, "--trainer.max_epochs=1", "--trainer.enable_progress_bar=false"))
    kept = sorted(wandb_dir.glob("offline-run-*"))
    assert len(kept) == 1
    refused = fit_args(tiny_data, tmp_path, "--trainer.max_steps=3", "--model.optim.warmup_steps=10")
    assert recformer_main(refused) == 2
    assert sorted(wandb_dir.glob("offline-run-*")) == kept  # the refused run's folder is gone
    dangling = [p.name for p in wandb_dir.iterdir() if p.is_symlink() and not p.exists()]
    assert dangling == []


def test_fit_says_how_it_ended_and_predict_where_it_wrote(tiny_data, tmp_path):
    """As a user runs them: early stopping fired, at which validation, and whose weights the model
    ends with; predict names its file; neither prints Lightning's litlogger advert, nor the ckpt_path
    callbacks warning, which a predict cannot act on. A learning rate too small to move any float32
    weight (the zero readout included: its 1e-30 is lost beside the base-rate bias) makes every
    validation score the same, so early stopping (configs/trainer.yaml: patience 4) fires at the
    fifth."""
    still = ["--model.optim.lr=1e-30", "--model.ranker.base_rate=0.4", "--trainer.max_epochs=8"]
    fit = run_recformer(fit_args(tiny_data, tmp_path, *still), tmp_path)
    assert fit.returncode == 0, fit.stderr[-3000:]
    said = re.search(
        r"Early stopping: val/auc did not improve in 4 validations; the fit stopped after validation 5 "
        r"\(epoch 4, step 45\); the model holds the best weights by val/auc_gauc \(\d\.\d{4}\): validation 1 "
        r"\(epoch 0, step 9\), (\S+\.ckpt)",
        fit.stdout + fit.stderr,
    )
    assert said, (fit.stdout + fit.stderr)[-3000:]
    best = Path(said.group(1))
    assert best.is_file() and best.parent.name == "checkpoints"
    predict = run_recformer(
        ["predict", f"--data.data_dir={tiny_data}", "--data.num_workers=0", *TINY, f"--ckpt_path={best}"],
        tmp_path,
    )
    assert predict.returncode == 0, predict.stderr[-3000:]
    out = best.parent.parent / f"predictions-test-{best.stem}.parquet"
    lines = (predict.stdout + predict.stderr).replace("\r", "\n").splitlines()
    assert f"wrote 90 prediction rows to {out}" in lines  # a line of its own, below the bar
    for proc in (fit, predict):
        assert "litlogger" not in proc.stdout + proc.stderr
        assert "Be aware that when using `ckpt_path`" not in proc.stderr
        assert "Couldn't infer the batch indices" not in proc.stderr


def test_in_process_runs_print_no_args_warning(tiny_data, tmp_path, recwarn):
    """``recformer.__main__.main(argv)`` from Python (tests, the lab, a notebook) while sys.argv
    holds another program's arguments: LightningCLI warned on every such run (57 times in make test)."""
    assert recformer_main(fit_args(tiny_data, tmp_path, "--trainer.max_steps=4")) == 0
    said = [str(w.message) for w in recwarn]
    assert not [m for m in said if "LightningCLI's args parameter" in m], said


def test_fit_help_describes_every_setting(capsys):
    """Each config field's docstring is its --help line (STYLE.md), read only for --help."""
    with pytest.raises(SystemExit) as done:
        cli_main(["fit", "--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--model.ranker.d_model D_MODEL Model width D." in text
    assert "--model.optim.eps EPS Adam epsilon." in text
    assert "--data.batch_size BATCH_SIZE Training batch size per rank." in text
    assert os.environ.get("JSONARGPARSE_DEBUG") is None
