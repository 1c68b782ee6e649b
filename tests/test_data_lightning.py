"""The DataModule under a real Lightning Trainer: epoch reshuffle, exact mid-epoch resume, DDP."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from recformer.data.datamodule import RecDataModule

ROOT = Path(__file__).resolve().parents[1]


class Recorder(pl.LightningModule):
    """Fits a linear model on the dense features and records which rows each step saw."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(2, 1)
        self.seen: list[tuple[int, list[int]]] = []

    def training_step(self, batch, batch_idx):
        self.seen.append((self.current_epoch, batch.keys[:, 0].tolist()))
        return torch.nn.functional.binary_cross_entropy_with_logits(
            self.lin(batch.dense).squeeze(-1), batch.label
        )

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def trainer(tmp_path, **kw) -> pl.Trainer:
    return pl.Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        **kw,
    )


@pytest.mark.parametrize("workers", [0, 2])
def test_killed_mid_epoch_and_resumed_sees_the_same_batches(tiny_data, tmp_path, workers):
    dm = lambda: RecDataModule(
        str(tiny_data), batch_size=32, num_workers=workers, shuffle_window=96, validate="footer"
    )
    ref = Recorder()
    trainer(tmp_path / "a", max_epochs=2, enable_checkpointing=False, limit_val_batches=0).fit(ref, dm())
    assert len(ref.seen) == 2 * 17
    assert ref.seen[0][1] != ref.seen[17][1]  # reshuffled between epochs

    ck = ModelCheckpoint(dirpath=tmp_path / "ck", every_n_train_steps=23, save_top_k=-1)
    first = Recorder()
    trainer(tmp_path / "b", max_steps=23, callbacks=[ck], limit_val_batches=0).fit(first, dm())
    ckpt = next((tmp_path / "ck").glob("*.ckpt"))
    second = Recorder()
    trainer(tmp_path / "c", max_epochs=2, enable_checkpointing=False, limit_val_batches=0).fit(
        second, dm(), ckpt_path=ckpt
    )
    assert first.seen + second.seen == ref.seen


@pytest.mark.parametrize("stop", [10, 13])
def test_resume_with_limit_train_batches_starts_the_next_epoch(tiny_data, tmp_path, stop):
    """With ``limit_train_batches`` an epoch ends before the stream does: a checkpoint after its last
    batch (10) resumes at the next epoch's first batch, not in the old epoch's unseen tail; one in
    the middle of the next epoch (13) resumes there."""
    dm = lambda: RecDataModule(
        str(tiny_data), batch_size=32, num_workers=0, shuffle_window=96, validate="footer"
    )
    run = dict(limit_val_batches=0, limit_train_batches=10)
    ref = Recorder()
    trainer(tmp_path / "a", max_epochs=3, enable_checkpointing=False, **run).fit(ref, dm())
    assert [e for e, _ in ref.seen] == [0] * 10 + [1] * 10 + [2] * 10

    ck = ModelCheckpoint(dirpath=tmp_path / "ck", every_n_train_steps=stop, save_top_k=-1)
    first = Recorder()
    trainer(tmp_path / "b", max_steps=stop, callbacks=[ck], **run).fit(first, dm())
    second = Recorder()
    trainer(tmp_path / "c", max_epochs=3, enable_checkpointing=False, **run).fit(
        second, dm(), ckpt_path=next((tmp_path / "ck").glob("*.ckpt"))
    )
    assert first.seen + second.seen == ref.seen


def test_two_process_ddp_on_uneven_files_finishes(tiny_data, tmp_path):
    out = tmp_path / "ranks.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "ddp_data_script.py"), str(tiny_data), str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = json.loads(out.read_text())
    assert sorted(ranks) == ["0", "1"]
    counts = [len(ranks[r]["train"]) for r in ("0", "1")]
    assert counts[0] == counts[1] == 2 * 9  # ceil(ceil(515 / 2) / 32) batches, 2 epochs
    train_rows = {r for k in ranks for b in ranks[k]["train"][:9] for r in b}
    assert train_rows == set(range(515))
    val_rows = sorted(r for k in ranks for b in ranks[k]["val"] for r in b)
    assert val_rows == sorted(list(range(515, 635)) * 2)  # every validation row exactly once per epoch
