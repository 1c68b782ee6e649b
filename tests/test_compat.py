"""Checkpoints written by an earlier recformer still load for evaluate, predict and resume.

``tests/data/v0-tiny*.ckpt`` were written by the code as it stood before the redesign of issue 17
(commit 6229bec): 1 epoch of ``configs/model/tiny.yaml`` on ``write_tiny_data``'s default data,
one with QK-Norm over the full width and SwiGLU, one with the two-flag muP of that time
(``mup: true`` and ``init: mup``, base width 8). ``v0-tiny*.json`` hold what ``evaluate`` said
of them then; the same code path must say the same now.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

from recformer.cli import cli_main
from recformer.evaluate import evaluate
from tests.conftest import write_tiny_data

DATA = Path(__file__).parent / "data"
CHECKPOINTS = ["v0-tiny", "v0-tiny-mup"]


@pytest.fixture(scope="module")
def v0_data(tmp_path_factory) -> Path:
    return write_tiny_data(tmp_path_factory.mktemp("v0") / "data")  # what the checkpoints trained on


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_an_old_checkpoint_evaluates_to_the_same_figures(v0_data, name):
    then = json.loads((DATA / f"{name}.json").read_text())
    now = evaluate(DATA / f"{name}.ckpt", v0_data, split="test", batch_size=32, num_workers=0)
    assert now["rows"] == then["rows"]
    for key in ("auc", "gauc", "logloss"):
        assert now[key] == pytest.approx(then[key], abs=1e-7), key


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_an_old_checkpoint_predicts_and_resumes(v0_data, tmp_path, name):
    ckpt = tmp_path / f"{name}.ckpt"
    ckpt.write_bytes((DATA / f"{name}.ckpt").read_bytes())
    common = [f"--data.data_dir={v0_data}", "--data.num_workers=0", "--trainer.accelerator=cpu"]
    common += ["--trainer.enable_progress_bar=false", f"--trainer.default_root_dir={tmp_path}"]
    cli_main(["predict", *common, f"--ckpt_path={ckpt}", f"--output={tmp_path / 'p.parquet'}"])
    assert pq.read_table(tmp_path / "p.parquet").num_rows == 90
    fit = cli_main(
        ["fit", *common, "--data.batch_size=64", "--trainer.max_epochs=2", "--trainer.logger=false"]
        + [f"--ckpt_path={ckpt}"]
    )
    assert fit.trainer.global_step == 18  # 9 steps from the checkpoint, 9 more
    assert all(torch.isfinite(p).all() for p in fit.model.parameters())
