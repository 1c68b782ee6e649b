"""The W&B run as the record of a model, tested offline: a fit names its W&B run after its run
folder and records it there (wandb.json); evaluate and doctor log to that run; the best checkpoint
goes up as an artifact on request; the saved config holds the optimizer settings; the progress bar
shows the run folder's number. Read back from the offline run files (tests/_wandb_offline.py)."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest
import yaml

from recformer.__main__ import main as recformer_main
from recformer.cli import cli_main
from tests._wandb_offline import read_run
from tests.test_module import fit_args


@pytest.fixture()
def offline(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")


def _fit(data: Path, root: Path, *extra: str) -> Path:
    cli = cli_main(fit_args(data, root, "--trainer.max_epochs=1", *extra))
    return Path(cli.trainer.loggers[0].log_dir)


def _evaluate(ckpt: Path, data: Path, *extra: str) -> list[str]:
    return ["evaluate", "--ckpt", str(ckpt), "--data", str(data), "--num-workers", "0", *extra]


def test_fit_evaluate_and_doctor_make_one_wandb_record(tiny_data, tmp_path, offline, capsys):
    run_dir = _fit(
        tiny_data,
        tmp_path,
        "--trainer.enable_progress_bar=true",  # the default: its run number is the folder's
        "--trainer.logger.init_args.log_best=true",
    )
    assert run_dir.name == "version_0"
    # Lightning's bar writes to stdout: TQDM's "v_num=0,", or Rich's "v_num: 0" where rich is
    # installed (Lightning then defaults to it; `.[embed]` brings it), never Rich's "0.000".
    assert re.search(r"v_num(=|: )0(?![.\d])", capsys.readouterr().out)
    record = json.loads((run_dir / "wandb.json").read_text())
    assert record["name"] == "recformer/version_0" and record["mode"] == "offline"
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    optim = config["model"]["optim"]  # every optimizer setting, not `optim: null`
    assert optim["lr"] == pytest.approx(1e-3) and optim["warmup_steps"] == 2 and optim["betas"] == [0.9, 0.95]

    ckpt = next(p for p in (run_dir / "checkpoints").glob("*.ckpt") if p.name != "last.ckpt")
    assert recformer_main(_evaluate(ckpt, tiny_data)) == 0
    assert f"logged to W&B run {record['id']}" in capsys.readouterr().out
    assert recformer_main(["doctor", str(run_dir)]) in (0, 1)
    assert f"logged to W&B run {record['id']}" in capsys.readouterr().out

    run = read_run(tmp_path / "wandb", record["id"])
    assert run["folders"] == 3  # fit, then evaluate and doctor each resumed it
    assert run["names"] == ["recformer/version_0"]
    summary = run["summary"]
    for key in ("auc", "auc_lo", "auc_hi", "gauc", "ne", "logloss", "rows"):
        assert f"eval/test/{key}" in summary, key
    assert summary["eval/test/checkpoint"] == ckpt.name and 0 < summary["eval/test/auc"] < 1
    assert any(k.startswith("eval/test/calibration") for k in run["logged"])
    assert isinstance(summary["doctor/healthy"], bool) and "doctor/findings_names" in summary
    assert any(k.startswith("doctor/findings") for k in run["logged"])
    assert any(k.startswith("doctor/plots/") for k in run["logged"])
    assert any(k.startswith("train/loss") for k in run["logged"])
    (artifact,) = [a for a in run["artifacts"] if a["type"] == "model"]  # tables are artifacts too
    assert artifact["name"] == f"model-{record['id']}" and artifact["type"] == "model"
    assert "best" in artifact["aliases"]
    assert json.loads(artifact["metadata"])["checkpoint"] == ckpt.name


def test_evaluate_and_doctor_never_fail_for_wandb(tiny_data, tmp_path, offline, capsys, monkeypatch):
    run_dir = _fit(tiny_data, tmp_path)
    ckpt = run_dir / "checkpoints" / "last.ckpt"
    # No record: nothing to log to, nothing said.
    (run_dir / "wandb.json").rename(run_dir / "wandb.json.kept")
    assert recformer_main(_evaluate(ckpt, tiny_data)) == 0
    captured = capsys.readouterr()
    assert "W&B" not in captured.out + captured.err
    (run_dir / "wandb.json.kept").rename(run_dir / "wandb.json")
    # W&B cannot start: one line, and the command's result and exit status are unchanged.
    import wandb

    def broken_init(*args, **kwargs):
        raise RuntimeError("simulated: cannot reach the W&B server")

    monkeypatch.setattr(wandb, "init", broken_init)
    out = tmp_path / "eval.json"
    args = _evaluate(ckpt, tiny_data, "--out", str(out))
    assert recformer_main(args) == 0 and out.is_file()
    err = capsys.readouterr().err
    assert "recformer evaluate: W&B: could not resume run" in err and "simulated" in err
    assert recformer_main(["doctor", str(run_dir), "--no-plots"]) in (0, 1)
    assert "recformer doctor: W&B: could not resume run" in capsys.readouterr().err
    # Asked not to: not tried.
    assert recformer_main([*args, "--overwrite", "--no-wandb"]) == 0
    assert "W&B" not in capsys.readouterr().err


def test_version_and_optimizer_groups_are_printed(tiny_data, tmp_path, offline, capsys):
    assert recformer_main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("recformer 0.")
    seen: list[str] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: seen.append(record.getMessage())
    console = logging.getLogger("lightning.pytorch")  # Lightning's console logger, INFO by default
    console.addHandler(handler)
    try:
        _fit(tiny_data, tmp_path, "--trainer.max_steps=3")
    finally:
        console.removeHandler(handler)
    groups = [line for line in seen if line.startswith("optimizer group")]
    assert console.getEffectiveLevel() <= logging.INFO
    assert len(groups) >= 2 and all(" lr " in g and "weight_decay" in g for g in groups)
    assert len(groups) == len(set(groups))  # once each
