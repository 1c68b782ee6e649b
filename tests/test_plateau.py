"""DecayOnPlateau: the learning rate divided at each validation without a new best, through a real
Lightning fit, its schedule keeping its shape, and its state through a checkpoint."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch

from recformer.callbacks.plateau import DecayOnPlateau

SCORES = [0.50, 0.60, 0.55, 0.70, 0.69, 0.68]
"""The validation metric the stub logs at its validations, in order."""


class Stub(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(3))
        self.lrs: list[float] = []  # the learning rate each training step ran at

    def training_step(self, batch, batch_idx):
        self.lrs.append(self.trainer.optimizers[0].param_groups[0]["lr"])
        return (self.w - batch[0]).square().sum()

    def validation_step(self, batch, batch_idx):
        pass

    def on_validation_epoch_end(self):
        self.log("val/auc", SCORES[min(self.trainer.current_epoch, len(SCORES) - 1)])

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=1e-2)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (1 + step))  # a shape to keep
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.ones(2, 3), batch_size=1)

    def val_dataloader(self):
        return torch.utils.data.DataLoader(torch.ones(1, 3), batch_size=1)


def _trainer(tmp_path, callbacks, epochs=6):
    return pl.Trainer(
        max_epochs=epochs,
        callbacks=callbacks,
        default_root_dir=tmp_path,
        logger=False,
        enable_checkpointing=False,
        num_sanity_val_steps=2,  # the sanity check's metric must not count
        accelerator="cpu",
    )


def test_each_validation_without_a_new_best_divides_the_rates(tmp_path):
    stub, cb = Stub(), DecayOnPlateau(monitor="val/auc", factor=0.1)
    _trainer(tmp_path, [cb]).fit(stub)
    # Epochs 0, 1, 3 set a new best; the validations after epochs 2, 4, 5 do not.
    decays_before_epoch = [0, 0, 0, 1, 1, 2]
    for epoch, n in enumerate(decays_before_epoch):
        for i in (2 * epoch, 2 * epoch + 1):  # two steps an epoch; step i of LambdaLR: 1 / (1 + i)
            assert stub.lrs[i] == pytest.approx(1e-2 / (1 + i) * 0.1**n), (epoch, i)
    assert cb.decays == 3 and cb.best == pytest.approx(0.70)


def test_its_state_resumes_from_a_checkpoint(tmp_path):
    cb = DecayOnPlateau()
    cb.load_state_dict({"best": 0.8, "decays": 2})
    assert cb.state_dict() == {"best": 0.8, "decays": 2}
    assert not cb._improved(0.8) and cb._improved(0.81)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"factor": 1.0}, "factor=1.0"), ({"mode": "up"}, "mode='up'"), ({"min_delta": -1}, "min_delta=-1")],
)
def test_bad_settings_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DecayOnPlateau(**kwargs)
