"""The DataModule under a real Lightning Trainer: epoch reshuffle, exact mid-epoch resume, DDP."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
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


def run_ddp_script(
    data: Path, out: Path, validate: str = "footer", epochs: int = 2
) -> subprocess.CompletedProcess:
    script = str(ROOT / "tests" / "ddp_data_script.py")
    return subprocess.run(
        [sys.executable, script, str(data), str(out), validate, str(epochs)],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )


def with_unknown_items(data: Path, dest: Path, every: int = 7) -> Path:
    """A copy of ``data`` whose every ``every``-th training row has an item id outside the vocabulary
    (in every row group, so every rank's share of the value check holds some)."""
    shutil.copytree(data, dest)
    for f in sorted((dest / "train").glob("*.parquet")):
        t = pq.read_table(f)
        ids = t["item_id"].to_numpy().copy()
        ids[::every] = 10_000
        t = t.set_column(t.schema.get_field_index("item_id"), "item_id", pa.array(ids))
        pq.write_table(t, f, row_group_size=32)
    return dest


def test_two_process_ddp_on_uneven_files_finishes(tiny_data, tmp_path):
    """Also: with ``validate="full"`` each rank checks half the row groups and the OOV report is
    the whole split's on both ranks, as one process counts it."""
    data = with_unknown_items(tiny_data, tmp_path / "data")
    single = RecDataModule(str(data), batch_size=32, num_workers=0)
    single.setup("fit")
    assert single.oov_report["train"]["item_id"] > 0
    out = tmp_path / "ranks.json"
    proc = run_ddp_script(data, out, "full")
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = json.loads(out.read_text())
    assert sorted(ranks) == ["0", "1"]
    counts = [len(ranks[r]["train"]) for r in ("0", "1")]
    assert counts[0] == counts[1] == 2 * 9  # ceil(ceil(515 / 2) / 32) batches, 2 epochs
    train_rows = {r for k in ranks for b in ranks[k]["train"][:9] for r in b}
    assert train_rows == set(range(515))
    val_rows = sorted(r for k in ranks for b in ranks[k]["val"] for r in b)
    assert val_rows == sorted(list(range(515, 635)) * 2)  # every validation row exactly once per epoch
    assert ranks["0"]["oov"] == ranks["1"]["oov"] == single.oov_report


@pytest.mark.slow
def test_many_ddp_epochs_with_forked_workers_finish(tiny_data, tmp_path):
    """Every epoch forks each rank's workers right after the last step's collectives; on CPython
    before 3.11.8 about one fork in a thousand leaves its child stuck (python/cpython#112275), and
    the rank waited on it forever: this fit hung in 3 of 7 runs. 600 forks, within the timeout."""
    proc = run_ddp_script(tiny_data, tmp_path / "ranks.json", "footer", epochs=150)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = json.loads((tmp_path / "ranks.json").read_text())
    assert [len(ranks[r]["train"]) for r in ("0", "1")] == [150 * 9] * 2


def test_bad_data_on_one_ddp_rank_stops_every_rank(tiny_data, tmp_path):
    """The value check's OOV sum is a collective: a rank that finds bad data must not leave the
    other waiting in it. Both exit at once, one naming the file, the other pointing to it."""
    data = tmp_path / "data"
    shutil.copytree(tiny_data, data)
    f = sorted((data / "train").glob("*.parquet"))[-1]
    t = pq.read_table(f)
    label = t["label"].to_numpy().astype(np.float32)
    label[-1] = 3.0  # in the file's last row group only: one rank's share
    pq.write_table(
        t.set_column(t.schema.get_field_index("label"), "label", pa.array(label)), f, row_group_size=32
    )
    proc = run_ddp_script(data, tmp_path / "ranks.json", "full")
    assert proc.returncode != 0
    assert f"{f.name}" in proc.stderr and "outside [0, 1]" in proc.stderr
    assert "bad data found by 1 other rank(s)" in proc.stderr


def test_seed_everything_seeds_the_data_order_unless_data_seed_is_given(tiny_data, monkeypatch, tmp_path):
    """One seed makes a run: --seed_everything reseeds the shuffle too (data.seed follows it), and
    an explicit --data.seed still wins."""
    from recformer.cli import cli_main

    monkeypatch.chdir(tmp_path)
    args = ["--config=configs/model/tiny.yaml", f"--data.data_dir={tiny_data}", "--data.num_workers=0"]
    args = [a.replace("configs/", str(ROOT / "configs") + "/") for a in args]
    seeds = {s: cli_main([*args, f"--seed_everything={s}"], run=False).datamodule.seed for s in (3, 4)}
    assert seeds == {3: 3, 4: 4}
    assert cli_main([*args, "--seed_everything=3", "--data.seed=9"], run=False).datamodule.seed == 9

    def first_rows(seed: int) -> list[int]:
        dm = RecDataModule(str(tiny_data), batch_size=32, num_workers=0, shuffle_window=96, seed=seed)
        return next(iter(dm.train_dataloader())).keys[:, 0].tolist()

    assert first_rows(3) != first_rows(4)  # the seed reaches the order
