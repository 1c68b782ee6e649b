"""What the recformer CLI corrects in Lightning 2.6 and jsonargparse: warnings that say nothing
about a run, Lightning's litlogger advert, integer batch counts read as fractions, and the settings'
docstrings that --help shows only when asked to read them."""

from __future__ import annotations

import logging
import sys
import warnings

from lightning.pytorch.cli import LightningArgumentParser

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
    # ParquetPredictionWriter writes each batch's own keys with its scores, never batch indices,
    # which Lightning looks for on every predict with a batch-interval writer.
    r"Couldn't infer the batch indices fetched from your dataloader",
)
"""Lightning warnings that every run prints and that say nothing about the run (Lightning 2.6);
the rest are left alone."""


NOT_FIT_FALSE_ALARMS = (
    # validate / test / predict drop the ModelCheckpoint callbacks on purpose (they never save outside
    # fit; RecformerCLI.instantiate_trainer), so the checkpoint's state for them has no taker.
    r"Be aware that when using `ckpt_path`, callbacks used to create the checkpoint need to be provided",
)
"""Lightning warnings that every validate, test and predict from a checkpoint prints; in a fit the
same warning means a callback went missing, and is left alone."""


class _NoAdvert(logging.Filter):
    """Drops Lightning's "Tip: ... try installing litlogger" line, printed at every Trainer's start:
    an advertisement, not something about the run."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("\N{ELECTRIC LIGHT BULB} Tip:")


def quiet_known_false_alarms() -> None:
    for message in KNOWN_FALSE_ALARMS:
        warnings.filterwarnings("ignore", message=message)
    import lightning_utilities.core.rank_zero as rank_zero

    # rank_zero_info logs through whichever logger Lightning last set there (its own module's).
    for logger in {rank_zero.log, logging.getLogger("lightning.pytorch.utilities.rank_zero")}:
        if not any(isinstance(f, _NoAdvert) for f in logger.filters):
            logger.addFilter(_NoAdvert())


BATCH_COUNTS = tuple(f"trainer.limit_{stage}_batches" for stage in ("train", "val", "test", "predict"))
"""Trainer settings where an int is a number of batches and a float a fraction of them."""


def batches_or_fraction(parser: LightningArgumentParser) -> None:
    """``--trainer.limit_val_batches 1`` is one batch, as Lightning documents, not ``1.0`` (all).

    Trainer annotates these ``Optional[Union[int, float]]``, but ``typing`` caches unions by equality
    (``Union[int, float] == Union[float, int]``), so the annotation Python hands jsonargparse is
    whichever order some earlier import spelled first: ``Union[float, int, None]`` here, and
    jsonargparse, trying float first, reads "1" as 1.0. ``int | float | None`` is not cached that
    way: int is tried first, and "0.5" still reads as a fraction."""
    for action in parser._actions:
        if action.dest in BATCH_COUNTS and hasattr(action, "_typehint"):
            action._typehint = int | float | None


def describe_settings(args: list[str] | None) -> bool:
    """``--help`` and ``--print_config`` show each setting's docstring (the line under every field
    of the config dataclasses): jsonargparse reads them only when asked to, which costs about a
    second of start-up, so only there."""
    given = sys.argv[1:] if args is None else args
    if any(a in ("-h", "--help") or a.startswith("--print_config") for a in given):
        from jsonargparse import set_parsing_settings

        set_parsing_settings(docstring_parse_attribute_docstrings=True)
        return True
    return False
