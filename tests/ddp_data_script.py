"""Run by test_data_lightning: 2-process CPU DDP (gloo) over uneven files; writes rows seen and the
OOV report per rank. ``python ddp_data_script.py DATA OUT [footer|full] [EPOCHS]``."""

import json
import sys

import lightning.pytorch as pl
import torch

from recformer.data.datamodule import RecDataModule


class Recorder(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(2, 1)
        self.rows = {"train": [], "val": []}

    def training_step(self, batch, batch_idx):
        self.rows["train"].append(batch.keys[:, 0].tolist())
        return torch.nn.functional.binary_cross_entropy_with_logits(
            self.lin(batch.dense).squeeze(-1), batch.label
        )

    def validation_step(self, batch, batch_idx):
        self.rows["val"].append(batch.keys[:, 0].tolist())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


if __name__ == "__main__":
    data, out = sys.argv[1], sys.argv[2]
    validate = sys.argv[3] if len(sys.argv) > 3 else "footer"
    epochs = int(sys.argv[4]) if len(sys.argv) > 4 else 2
    model = Recorder()
    dm = RecDataModule(data, batch_size=32, num_workers=1, validate=validate)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=epochs,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(model, dm)
    gathered = [None, None]
    torch.distributed.all_gather_object(gathered, {**model.rows, "oov": dm.oov_report})
    if trainer.global_rank == 0:
        with open(out, "w") as fh:
            json.dump({str(r): rows for r, rows in enumerate(gathered)}, fh)
    # Gloo's threads must not outlive the interpreter: without this the process can abort at exit
    # ("terminate called without an active exception").
    torch.distributed.destroy_process_group()
