"""``recformer fit | validate | test | predict``: LightningCLI with YAML configs from configs/.

The feature spec decides the embedding sizes: ``data.feature_dims`` is linked into ``model.dims``
at instantiation, so no size is copied between YAML files. ``configs/trainer.yaml`` holds the
trainer defaults (loggers, checkpoints, callbacks) and is applied first when it is present.
"""

from __future__ import annotations

import os
import shutil
import sys
import warnings
from pathlib import Path
from typing import Any, NoReturn

from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

from recformer.callbacks.sink import HEALTH_FILE
from recformer.data.datamodule import RecDataModule
from recformer.module import RankerModule

DEFAULT_TRAINER_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "trainer.yaml"

KNOWN_FALSE_ALARMS = (
    # ParquetStream plans its rows per (rank, worker) itself: __len__ is exact with any workers.
    r"Your `IterableDataset` has `__len__` defined",
    # RankerModule.transfer_batch_to_device is meant to win: it widens Batch's compact ids.
    r"You have overridden `transfer_batch_to_device` in `LightningModule`",
    # The loader resumes exactly mid-epoch from the DataModule's state in the checkpoint (tested);
    # Lightning only looks for its own state_dict protocol on the DataLoader.
    r"You're resuming from a checkpoint that ended before the epoch ended and your dataloader is not",
    # Lightning's own use of torch's pytree API, about to change upstream; nothing to do here.
    r"`isinstance\(treespec, LeafSpec\)` is deprecated",
)
"""Lightning warnings every run printed that say nothing about the run (checked 2026-11-30,
Lightning 2.6); the rest are left alone."""


def quiet_known_false_alarms() -> None:
    for message in KNOWN_FALSE_ALARMS:
        warnings.filterwarnings("ignore", message=message)


_NEW_RUN_DIRS: list[Path] = []
"""Run folders of this process's trainers that did not exist when the trainer was made (rank 0),
for ``cli_main`` to remove if the run stops on a bad setting or input before it writes a result."""
_START_FILES = {"config.yaml", "hparams.yaml"}
"""What a run writes before its first step; with an empty ``health.jsonl`` and empty folders, a run
folder holding only these has no result in it."""


def holds_no_result(run: Path) -> bool:
    """``run`` holds nothing but what a run writes at its start (or is missing or empty)."""
    files = [p for p in run.rglob("*") if p.is_file()]
    return all(p.name in _START_FILES or (p.name == HEALTH_FILE and p.stat().st_size == 0) for p in files)


def own_run_dir(trainer: Any) -> Path | None:
    """The folder only this run writes to: the first logger's version folder (CSV, TensorBoard), or
    default_root_dir without loggers; None for another first logger, whose folder is its save_dir,
    shared by every run. Read before the run starts, so no rank needs to broadcast it."""
    if not trainer.loggers:
        return Path(trainer.default_root_dir)
    first = trainer.loggers[0]
    return Path(first.log_dir) if isinstance(first, CSVLogger | TensorBoardLogger) else None


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


class _OneLineErrors(LightningArgumentParser):
    """A bad setting is one line naming it and where to see them all, not the usage of every
    setting (60 lines) above it."""

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        if not self.exit_on_error or os.environ.get("JSONARGPARSE_DEBUG"):
            super().error(message, ex)  # a parse jsonargparse tries and catches; its debug mode
        self._logger.error(message)
        prog = (getattr(ex, "subcommand_parser", None) or self).prog.replace(" [options]", "")
        sys.stderr.write(f"{prog}: error: {message}\n(every setting: {prog} --help)\n")
        self.exit(2)


class RecformerCLI(LightningCLI):
    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.link_arguments("data.feature_dims", "model.dims", apply_on="instantiate")

    def before_instantiate_classes(self) -> None:
        # Without loggers Lightning writes a run's files (config.yaml, checkpoints/, health.jsonl,
        # predictions) straight into default_root_dir: the next such run stopped on the config
        # already there, and would have mixed its checkpoints with the first one's. It gets the
        # run folder a CSVLogger would have made instead.
        config = self.config[self.subcommand] if self.subcommand else self.config
        trainer = config["trainer"]
        if trainer.get("logger") in (False, []):  # None is Lightning's default logger
            # CSVLogger's own numbering of <root>/recformer/version_N (it creates nothing here).
            trainer["default_root_dir"] = CSVLogger(
                trainer.get("default_root_dir") or ".", name="recformer"
            ).log_dir

    def instantiate_trainer(self, **kwargs: Any) -> Any:
        trainer = super().instantiate_trainer(**kwargs)
        run_dir = own_run_dir(trainer)
        if trainer.is_global_zero and run_dir is not None and not run_dir.exists():
            _NEW_RUN_DIRS.append(run_dir)
        return trainer

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
    try:
        return RecformerCLI(
            RankerModule,
            RecDataModule,
            save_config_callback=LoggedSaveConfig,
            parser_class=_OneLineErrors,
            save_config_kwargs={"overwrite": False},
            parser_kwargs={
                "prog": "recformer",
                **{cmd: {"default_config_files": defaults} for cmd in ("fit", "validate", "test", "predict")},
            },
            args=args,
            run=run,
            auto_configure_optimizers=False,
        )
    except (ValueError, FileNotFoundError):  # a bad setting or input (DataError is a ValueError)
        # A run stopped by one before it wrote a result leaves no version_N folder holding only
        # its config (the next run's number would skip it; doctor would find nothing there). An
        # interrupted or crashed run keeps its folder, whatever it holds.
        for run_dir in _NEW_RUN_DIRS:
            if holds_no_result(run_dir):
                shutil.rmtree(run_dir, ignore_errors=True)
        raise
    finally:
        _NEW_RUN_DIRS.clear()
