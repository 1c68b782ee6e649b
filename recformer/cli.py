"""``recformer fit | validate | test | predict``: LightningCLI with YAML configs from configs/.

The feature spec decides the embedding sizes: ``data.feature_dims`` is linked into ``model.dims``
at instantiation, so no size is copied between YAML files. ``configs/trainer.yaml`` holds the
trainer defaults (loggers, checkpoints, callbacks) and is applied first when it is present.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback

from recformer.data.datamodule import RecDataModule
from recformer.module import RankerModule

DEFAULT_TRAINER_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "trainer.yaml"

KNOWN_FALSE_ALARMS = (
    # ParquetStream plans its rows per (rank, worker) itself: __len__ is exact with any workers.
    r"Your `IterableDataset` has `__len__` defined",
    # RankerModule.transfer_batch_to_device is meant to win: it widens Batch's compact ids.
    r"You have overridden `transfer_batch_to_device` in `LightningModule`",
    # Lightning's own use of torch's pytree API, about to change upstream; nothing to do here.
    r"`isinstance\(treespec, LeafSpec\)` is deprecated",
)
"""Lightning warnings every run printed that say nothing about the run (checked 2026-11-30,
Lightning 2.6); the rest are left alone."""


def quiet_known_false_alarms() -> None:
    for message in KNOWN_FALSE_ALARMS:
        warnings.filterwarnings("ignore", message=message)


class LoggedSaveConfig(SaveConfigCallback):
    """Saves the resolved config in the run's own directory (never another run's) and sends it to
    every logger that takes one (W&B)."""

    def save_config(self, trainer: Any, pl_module: Any, stage: str) -> None:
        config = self.parser.dump(self.config, skip_none=False, format="yaml")
        import yaml

        as_dict = yaml.safe_load(config)
        for logger in trainer.loggers:
            if hasattr(logger, "log_config"):
                logger.log_config(as_dict)


class RecformerCLI(LightningCLI):
    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.link_arguments("data.feature_dims", "model.dims", apply_on="instantiate")

    def before_predict(self) -> None:
        # Scores stream to Parquet (ParquetPredictionWriter); Lightning would also keep every
        # batch's output in memory for the return value nobody reads here. --return_predictions
        # true still asks for it.
        config = self.config_init["predict"]
        if config.get("return_predictions") is None:
            config["return_predictions"] = False


def cli_main(args: list[str] | None = None, run: bool = True) -> RecformerCLI:
    quiet_known_false_alarms()
    defaults = [str(DEFAULT_TRAINER_CONFIG)] if DEFAULT_TRAINER_CONFIG.is_file() else []
    return RecformerCLI(
        RankerModule,
        RecDataModule,
        save_config_callback=LoggedSaveConfig,
        save_config_kwargs={"overwrite": False},
        parser_kwargs={
            cmd: {"default_config_files": defaults} for cmd in ("fit", "validate", "test", "predict")
        },
        args=args,
        run=run,
        auto_configure_optimizers=False,
    )
