"""Latest weight averaging under a real tiny Trainer: what is validated, kept, restored and resumed."""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
import yaml
from lightning.pytorch.callbacks import ModelCheckpoint

from recformer.callbacks.averaging import RAW_KEY, LatestWeightAverage
from recformer.callbacks.best import RestoreBest
from recformer.data.datamodule import RecDataModule
from recformer.module import RankerModule
from tests.test_module import KillAt, Killed, _module

ROOT = Path(__file__).resolve().parents[1]


def _params(module: pl.LightningModule) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.named_parameters()}


class Watch(pl.Callback):
    """Records the parameters at validation start (``at``) and after the next training batch starts."""

    def __init__(self) -> None:
        self.at: list[dict[str, torch.Tensor]] = []
        self.next_batch: list[dict[str, torch.Tensor]] = []
        self._waiting = False

    def on_validation_epoch_start(self, trainer, pl_module):
        self.at.append(_params(pl_module))
        self._waiting = True

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self._waiting:
            self.next_batch.append(_params(pl_module))
            self._waiting = False


def _dm(data: Path) -> RecDataModule:
    return RecDataModule(str(data), batch_size=64, num_workers=0, validate="footer")


def _trainer(root: Path, callbacks: list, **kw) -> pl.Trainer:
    return pl.Trainer(
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        default_root_dir=root,
        deterministic=True,
        num_sanity_val_steps=0,
        callbacks=callbacks,
        **kw,
    )


@pytest.mark.parametrize("window", [0, -1, 1.5, True, "2"])
def test_window_must_be_a_positive_integer(window):
    with pytest.raises(ValueError, match=r"window must be an integer >= 1"):
        LatestWeightAverage(window=window)


def test_validation_scores_the_mean_and_training_goes_on_from_the_raw_weights(tiny_data, tmp_path):
    """Window 3, validations every 3 of the 9 steps an epoch: each validation sees the mean of the
    weights at the latest (up to) 3 validations, the next step starts from the raw weights, the
    checkpoints hold the mean (and the raw weights beside it) and the fit ends on the best mean."""
    dm = _dm(tiny_data)
    before, after = Watch(), Watch()
    best = ModelCheckpoint(
        dirpath=tmp_path / "ck", monitor="val/auc", mode="max", save_top_k=-1, filename="{step}"
    )
    callbacks = [before, LatestWeightAverage(window=3), after, RestoreBest(), best]
    module = _module(dm)
    _trainer(tmp_path, callbacks, max_epochs=2, val_check_interval=3).fit(module, dm)
    assert len(before.at) == 6
    for i, (raw, seen) in enumerate(zip(before.at, after.at)):
        window = before.at[max(0, i - 2) : i + 1]
        for name, value in seen.items():
            mean = torch.stack([w[name] for w in window]).mean(0)
            torch.testing.assert_close(value, mean, rtol=0, atol=1e-6, msg=name)
        if i < len(after.next_batch):
            assert all(torch.equal(after.next_batch[i][k], v) for k, v in raw.items())
    # Every validation's checkpoint: the validated mean as its state_dict, the raw weights apart.
    for i, ckpt in enumerate(sorted((tmp_path / "ck").glob("*.ckpt"), key=lambda p: p.stat().st_mtime)):
        state = torch.load(ckpt, weights_only=True)
        assert all(torch.equal(state["state_dict"][k], v) for k, v in after.at[i].items()), ckpt
        if i == 0:
            assert RAW_KEY not in state  # one record: the mean is the raw weights
        else:
            assert all(torch.equal(state[RAW_KEY][k], v) for k, v in before.at[i].items()), ckpt
    kept = torch.load(best.best_model_path, weights_only=True)["state_dict"]
    assert all(torch.equal(module.state_dict()[k], v) for k, v in kept.items())


def test_a_resumed_fit_trains_on_from_the_raw_weights_and_the_records(tiny_data, tmp_path):
    """Killed after the checkpoint of epoch 1's validation (which holds the mean) and resumed from
    it, a fit ends exactly where the uninterrupted one does."""

    def run(root: Path, *extra: pl.Callback, ckpt_path: Path | None = None) -> RankerModule:
        module = _module(_dm(tiny_data))
        last = ModelCheckpoint(dirpath=root / "ck", filename="last")
        trainer = _trainer(root, [LatestWeightAverage(window=2), last, *extra], max_epochs=3)
        trainer.fit(module, _dm(tiny_data), ckpt_path=ckpt_path)
        return module

    ref = run(tmp_path / "ref")
    with pytest.raises(Killed):
        run(tmp_path / "cut", KillAt(18))
    saved = torch.load(tmp_path / "cut" / "ck" / "last.ckpt", weights_only=True)
    assert saved["global_step"] == 18 and RAW_KEY in saved
    resumed = run(tmp_path / "resumed", ckpt_path=tmp_path / "cut" / "ck" / "last.ckpt")
    assert resumed.global_step == ref.global_step == 27
    for (name, a), b in zip(ref.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name


def test_the_default_trainer_config_averages_the_latest_six_validations_last_in_its_list():
    callbacks = yaml.safe_load((ROOT / "configs" / "trainer.yaml").read_text())["trainer"]["callbacks"]
    path = "recformer.callbacks.averaging.LatestWeightAverage"
    (entry,) = [c for c in callbacks if c["class_path"] == path]
    assert entry["init_args"] == {"window": 6}
    assert callbacks[-1] is entry  # so that --trainer.callbacks.window=N sets it


def test_validate_test_and_predict_from_a_checkpoint_score_its_mean(tiny_data, tmp_path):
    """Lightning hands a checkpoint to the callbacks for every stage: only a resumed fit takes the
    raw weights; ``validate``, ``test`` and ``predict`` with ``ckpt_path`` score the kept mean (as
    ``recformer evaluate``, export and serving do)."""
    dm = _dm(tiny_data)
    last = ModelCheckpoint(dirpath=tmp_path / "ck", filename="last")
    _trainer(tmp_path, [LatestWeightAverage(window=2), last], max_epochs=2).fit(_module(dm), dm)
    saved = torch.load(tmp_path / "ck" / "last.ckpt", weights_only=True)
    assert RAW_KEY in saved
    for stage in ("validate", "test", "predict"):
        module = _module(dm)
        trainer = _trainer(tmp_path / stage, [LatestWeightAverage(window=2)])
        getattr(trainer, stage)(module, _dm(tiny_data), ckpt_path=tmp_path / "ck" / "last.ckpt")
        for name, value in module.state_dict().items():
            assert torch.equal(value, saved["state_dict"][name]), (stage, name)
