"""``RecDataModule``: streams Parquet logs (DESIGN sections 3 and 7) to any number of ranks and workers.

Layout of a data directory::

    DIR/spec.yaml                 the FeatureSpec
    DIR/items.parquet             item side table (optional, named by the spec)
    DIR/{train,val,test}/*.parquet  (or in sub-folders at any depth: date=.../part.parquet)

Set-up reads every footer and checks every file's schema before the first batch; with
``validate="full"`` it also decodes every row once (label range, ids, NaN/Inf, list alignment) and
reports the out-of-vocabulary counts. ``feature_dims`` is known at construction, so LightningCLI can
link it into the model (``link_arguments("data.feature_dims", "model.dims", apply_on="instantiate")``).
"""

from __future__ import annotations

import functools
import logging
import math
import multiprocessing as mp
import os
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import lightning.pytorch as pl
import numpy as np
import pyarrow as pa
import torch
from torch.utils.data import DataLoader

from recformer.batch import DataError
from recformer.config import FeatureDims, FeatureSpec
from recformer.data import storage
from recformer.data.checksums import has_page_checksums, unchecked_warning
from recformer.data.dataset import ParquetStream, StreamPlan, keep_freed_memory
from recformer.data.decode import BatchLayout, Decoder, load_item_tables
from recformer.data.packed import PackedBatch
from recformer.data.ring import WorkerPool
from recformer.data.schema import Where, check_schema, key_kinds
from recformer.data.shards import SplitIndex, find_split_files, list_split_files, read_footer
from recformer.data.vocab import encodings

log = logging.getLogger(__name__)

Split = Literal["train", "val", "test", "predict"]

SPEC_STATE = "spec"
"""Key of the feature spec's YAML text in the DataModule's checkpoint state: the encodings (dense
statistics, vocabulary files by name) the model was trained with, which ``recformer export`` ships."""


class RecDataLoader(DataLoader):
    """A DataLoader over a ``ParquetStream`` that knows its epoch and can resume mid-epoch.

    Lightning never calls ``set_epoch`` on an IterableDataset (DESIGN section 7), so the epoch is
    read from ``epoch_fn`` each time an epoch's iterator is created. ``resume_state`` records how
    many batches the *training loop* consumed (``progress_fn``: the trainer's processed-batch count),
    not how many this loader produced, which with prefetching is ahead by the prefetch depth.

    Resuming goes through ``RecDataModule.state_dict`` / ``load_state_dict`` rather than Lightning's
    stateful-loader hook: Lightning restores a datamodule before it builds the optimizers, but the
    loop counters (``current_epoch``) only after, and anything that reads
    ``trainer.estimated_stepping_batches`` in ``configure_optimizers`` makes Lightning create (and
    prefetch from) the epoch's iterator in between; Lightning then skips its own loader-state
    restore and keeps that iterator. So a pending resume carries its own epoch and is applied by
    whichever iterator starts first.
    """

    def __init__(
        self,
        stream: ParquetStream,
        epoch_fn: Callable[[], int] | None = None,
        progress_fn: Callable[[], int] | None = None,
        epoch_batches_fn: Callable[[], float] | None = None,
        **kwargs: Any,
    ):
        # collate_fn=_as_is: the default converter would turn a PackedBatch's numpy buffer into a
        # tensor inside the worker, sending it back through shared memory (see PackedBatch).
        super().__init__(stream, batch_size=None, collate_fn=_as_is, **kwargs)
        self.stream = stream
        self._epoch_fn = epoch_fn
        self._progress_fn = progress_fn
        self._epoch_batches_fn = epoch_batches_fn
        self._own_epoch = -1
        self._yielded = 0
        self._pending: dict[str, int] | None = None

    def __iter__(self):
        pending, self._pending = self._pending, None
        if pending is not None and pending["consumed"] < pending["epoch_batches"]:
            epoch, skip = pending["epoch"], pending["consumed"]
        elif pending is not None:  # saved at the very end of an epoch: the next one starts
            epoch, skip = pending["epoch"] + 1, 0
        else:
            epoch, skip = self._own_epoch + 1 if self._epoch_fn is None else self._epoch_fn(), 0
        self._own_epoch = epoch
        self.stream.plan = StreamPlan(
            epoch=epoch,
            rank=self.stream.plan.rank,
            world=self.stream.plan.world,
            skip=skip,
            num_workers=max(1, self.num_workers),
        )
        self._yielded = skip
        # Batches from workers arrive in transit form and are padded here, pinned straight away
        # when the loader pins.
        pin = self.pin_memory and torch.cuda.is_available()
        layout = self.stream.decoder.layout
        pool = self._pool(layout, pin)
        batches = iter(pool) if pool is not None else super().__iter__()
        try:
            for batch in batches:
                self._yielded += 1
                yield layout.to_batch(batch, pin) if isinstance(batch, PackedBatch) else batch
        except DataError as e:
            check = _worker_check(e) if pool is None else None
            if check is None:
                raise
            raise DataError(check) from e  # the check's sentence, the worker's traceback below it
        finally:
            if pool is not None:
                pool.close()  # an abandoned epoch stops its workers now, not when collected

    def _pool(self, layout: BatchLayout, pin: bool) -> WorkerPool | None:
        """This epoch's forked workers with their shared batch slots (see ``ring``), or None when
        workers are not started by fork (the DataLoader's own workers then use the pipe)."""
        if self.num_workers == 0:
            return None
        if self.multiprocessing_context is not None:
            method = self.multiprocessing_context.get_start_method()
        else:  # the default, without fixing it (the first of get_all_start_methods is the default)
            method = mp.get_start_method(allow_none=True) or mp.get_all_start_methods()[0]
        if method != "fork":
            return None
        # A worker reads and decodes a whole window, then cuts all of its batches. With only
        # prefetch_factor (+2) slots it would stop cutting a few batches into the window, and while
        # it read the next one the round robin would wait on it with the other workers' slots full
        # (cores idle: bench/bench_loader.py, "Design measurements"). A ring a window deep lets a
        # worker cut one window ahead while it reads the next; the mapping's pages are touched
        # only as slots fill, so that costs about one window of batches in transit per worker.
        # Two more slots keep the worker busy while the training process takes one out.
        s = self.stream
        per_window = min(-(-s.window // s.batch_size), max(s.worker_counts(), default=0))
        slots = max(self.prefetch_factor or 2, per_window) + 2
        return WorkerPool(
            self.stream,
            self.num_workers,
            slots,
            layout,
            pin,
            self.worker_init_fn,
            self.timeout,
            self.generator,
        )

    def _fingerprint(self) -> dict[str, int]:
        """Everything besides the position that decides the batch sequence; a resume refuses to
        continue when any of it changed. ``groups``: a checksum of the row groups in order (file
        name, row group, rows), so other files of the same total size are caught too."""
        s = self.stream
        groups = ";".join(f"{Path(s.index.files[g.file]).name}:{g.index}:{g.rows}" for g in s.index.groups)
        return {
            "world": s.plan.world,
            "batch_size": s.batch_size,
            "num_workers": max(1, self.num_workers),
            "seed": s.seed,
            "rows": s.index.num_rows,
            "window": s.window,
            "shuffle": int(s.shuffle),
            "drop_last": int(s.drop_last),
            "group_rows": s.group_rows,
            "group_order": int(s.group_order == "log"),
            "groups": zlib.crc32(groups.encode()),
        }

    def resume_state(self) -> dict[str, int]:
        """Where the training loop stands in this epoch: ``consumed`` of the ``epoch_batches`` it
        takes (fewer than the stream's with ``limit_train_batches``: a checkpoint after the last of
        them resumes at the next epoch, not in this one's tail)."""
        consumed = self._progress_fn() if self._progress_fn is not None else self._yielded
        limit = self._epoch_batches_fn() if self._epoch_batches_fn is not None else math.inf
        epoch_batches = min(len(self.stream), int(limit)) if math.isfinite(limit) else len(self.stream)
        return {
            "epoch": self.stream.plan.epoch,
            "consumed": int(consumed),
            "epoch_batches": epoch_batches,
            **self._fingerprint(),
        }

    def load_resume_state(self, state: dict[str, int]) -> None:
        now = self._fingerprint()
        # Checkpoints from before a key was recorded are checked on the keys they have.
        diff = {k: (state[k], v) for k, v in now.items() if k in state and state[k] != v}
        if diff:
            raise ValueError(
                "cannot resume the training stream exactly: these settings differ from the checkpoint's "
                f"(checkpoint, now): {diff}. Resume with the same data files, batch_size, num_workers, "
                "seed, shuffle, shuffle_window, group_rows, group_order, drop_last and number of devices, "
                "or start a new run."
            )
        self._pending = {
            "epoch": int(state["epoch"]),
            "consumed": int(state["consumed"]),
            "epoch_batches": int(state.get("epoch_batches", len(self.stream))),
        }


class RecDataModule(pl.LightningDataModule):
    def __init__(
        self,
        data_dir: str = "data/movielens",
        spec_path: str | None = None,
        batch_size: int = 256,
        eval_batch_size: int | None = None,
        num_workers: int = 1,
        prefetch_factor: int = 4,
        pin_memory: bool | None = None,
        shuffle: bool = True,
        shuffle_window: int = 32768,
        drop_last: bool = False,
        group_rows: int = 0,
        group_order: Literal["shuffled", "log"] = "shuffled",
        seed: int | None = None,
        validate: Literal["full", "footer"] = "full",
        predict_split: str = "test",
        verify_checksums: bool = True,
    ):
        """
        Args:
            data_dir: Directory with spec.yaml and train/, val/, test/ Parquet files.
            spec_path: Feature spec YAML; default ``data_dir/spec.yaml``.
            batch_size: Training batch size per rank.
            eval_batch_size: Batch size for validation/test/predict (default: batch_size).
            num_workers: DataLoader worker processes per rank (0 = read in the training process).
            prefetch_factor: Batches each worker keeps ready at least (forked workers may run up to a
                shuffle window of batches ahead: ``RecDataLoader._pool``).
            pin_memory: Pin host memory for faster GPU copies (default: on when CUDA is available).
            shuffle: Reshuffle training row groups and rows every epoch, seeded by (seed, epoch).
            shuffle_window: Rows decoded and shuffled together by a worker (rounded to whole batches).
            drop_last: Drop the last partial training batch.
            group_rows: Keep each group's (the spec's ``group``, e.g. the user's) shuffled training
                rows together in chunks of up to this many, so a batch holds same-user pairs for
                a within-user loss (``model.pairwise``); 0 (the default): rows shuffled on their own.
            group_order: Which of a group's rows share a chunk: any of them ("shuffled"), or rows
                adjacent in the log ("log": a user's consecutive impressions in a log written in
                time order, the rows GAUC orders on a temporal split).
            seed: Seed of the shuffle; None (the default) = the run's ``seed_everything``, so one
                seed makes a run (data order included).
            validate: "full" decodes every row at set-up to check values; "footer" checks schemas and
                footers only (values are still checked as batches are read).
            predict_split: Split that ``predict`` scores.
            verify_checksums: Verify the CRC-32 of every Parquet data page that carries one (every
                file recformer writes): a flipped bit is refused instead of trained on. Costs about
                a tenth of the read (bench/bench_loader.py --raw-variants).
        """
        super().__init__()
        self.save_hyperparameters()
        self.data_dir, self.spec, self.spec_text = _open_data(data_dir, spec_path)
        _check_settings(batch_size, eval_batch_size, shuffle_window, num_workers, prefetch_factor)
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size if eval_batch_size is not None else batch_size
        self.num_workers, self.prefetch_factor, self.drop_last = num_workers, prefetch_factor, drop_last
        self.pin_memory = torch.cuda.is_available() if pin_memory is None else pin_memory
        self.shuffle, self.shuffle_window, self.group_rows = shuffle, shuffle_window, group_rows
        self.group_order = group_order
        self.seed = seed if seed is not None else global_seed()
        self.validate, self.predict_split, self.verify_checksums = validate, predict_split, verify_checksums
        self._init_state()

    def _init_state(self) -> None:
        """What set-up and the loaders fill in: split indexes, check results, the resume position."""
        self.splits: dict[str, SplitIndex] = {}
        self.oov_report: dict[str, dict[str, int]] = {}
        self.unsigned_keys: dict[str, frozenset[str]] = {}
        """Per split, its uint64 key columns (``schema.unsigned_keys``)."""
        self._validated: set[str] = set()
        self._train_loader: RecDataLoader | None = None
        self._resume: dict[str, int] | None = None
        self._string_keys: dict[str, dict[str, pa.ChunkedArray]] = {}
        self._unchecked: dict[str, None] = {}
        """Parquet files read without page checksums (``checksums``), in the order found."""
        self._named_unchecked: set[str] = set()

    # -- checkpointed state: the training stream's position, the spec it was encoded with -----
    def state_dict(self) -> dict[str, Any]:
        stream = {"train_stream": self._train_loader.resume_state()} if self._train_loader is not None else {}
        return {SPEC_STATE: self.spec_text, **stream}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._resume = state.get("train_stream")
        if self._resume is not None and self._train_loader is not None:
            self._train_loader.load_resume_state(self._resume)

    # -- what the model links to ---------------------------------------------------------------
    @property
    def feature_dims(self) -> FeatureDims:
        dims = self.spec.dims()
        # A vocabulary file's order decides which row each raw value reads, as a vocab list's does:
        # its digest joins the encoding a checkpoint is compared on (FeatureDims.mismatch).
        dims.encoding = encodings(self.spec)
        return dims

    def item_tables(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Item content [item_rows, content_dim] and item feature rows [item_rows, n_feats]."""
        content, feats, missing = load_item_tables(self.spec)
        if missing:
            log.info(
                "item side table: %d of %d known items have no row (zero content, OOV features)",
                missing,
                self.spec.item.vocab_size,
            )
        return content, feats

    @functools.cached_property
    def oov_fields(self) -> list[str]:
        """Id fields whose unknown ids are counted, in ``Batch.oov`` order."""
        return Decoder(self.spec).oov_fields()

    # -- set-up --------------------------------------------------------------------------------
    def _split_names(self, stage: str | None) -> list[str]:
        return {
            "fit": ["train", "val"],
            "validate": ["val"],
            "test": ["test"],
            "predict": [self.predict_split],
        }.get(stage or "", ["train", "val", "test"])

    def setup(self, stage: str | None = None) -> None:
        for split in self._split_names(stage):
            if split == "val" and stage == "fit" and not self.has_split("val"):
                log.warning("no validation split under %s: training runs without validation", self.data_dir)
                continue
            if split not in self.splits:
                self.splits[split] = self.index_split(split)
            if self.validate == "full" and split not in self._validated:
                self.oov_report[split] = self.check_values(self.splits[split])
                self._validated.add(split)
                unknown = {k: v for k, v in self.oov_report[split].items() if v}
                if unknown:
                    log.warning(
                        "%s split: unknown ids mapped to the OOV row (counted, not dropped): %s",
                        split,
                        unknown,
                    )
        self._name_unchecked()

    def _name_unchecked(self) -> None:
        """One warning (first rank) naming the files found without page checksums since the last."""
        side = self.spec.side_table_path()
        if self.verify_checksums and side is not None and side.is_file() and not has_page_checksums(side):
            self._unchecked[str(storage.join(self.data_dir, self.spec.item.side_table))] = None
        new = [f for f in self._unchecked if f not in self._named_unchecked]
        if new and self._is_first_rank():
            log.warning(unchecked_warning(new, self.data_dir))
        self._named_unchecked.update(new)

    def has_split(self, split: str) -> bool:
        return bool(find_split_files(self.data_dir, split))

    def index_split(self, split: str) -> SplitIndex:
        files = list_split_files(self.data_dir, split)
        first: tuple[Path, dict[str, str]] | None = None
        for f in files:
            meta = read_footer(str(f))
            schema = meta.schema.to_arrow_schema()
            check_schema(self.spec, schema, Where(str(f)))
            if self.verify_checksums and not has_page_checksums(f, meta):
                self._unchecked[str(f)] = None
            kinds = key_kinds(self.spec, schema)
            first = first or (f, kinds)
            wrong = [k for k in kinds if kinds[k] != first[1][k]]
            if wrong:  # a key is written back one way per split
                k = wrong[0]
                raise DataError(
                    f"key column {k!r} is {kinds[k]} in {f} but {first[1][k]} in {first[0]}; a key "
                    f"column needs one kind (signed integer, uint64 or string) across the {split} files"
                )
        kinds = first[1] if first else {}
        self.unsigned_keys[split] = frozenset(k for k, kind in kinds.items() if kind == "uint64")
        return SplitIndex.from_paths(split, files)

    def check_values(self, index: SplitIndex) -> dict[str, int]:
        """Decode every row group once (the same checks as training reads); return the split's OOV
        counts. Under DDP each rank checks every world-th row group, so the data is decoded once in
        all, and the counts are summed over the ranks. A rank that finds bad data raises its error
        only after that sum, and the others raise too: no rank is left waiting in a collective."""
        stream = ParquetStream(
            index, self.spec, batch_size=1, train=False, shuffle=False, verify_checksums=self.verify_checksums
        )
        n_oov, bags = len(self.oov_fields), [f.name for f in self.spec.bags]
        # [ranks that failed, OOV counts..., values past max_values per bag field...]
        counts = np.zeros(1 + n_oov + len(bags), dtype=np.int64)
        rank, world = self._rank_world()
        error = None
        try:
            for g in index.groups[rank::world]:
                decoded = stream._group(g)
                counts[1 : 1 + n_oov] += decoded.oov_totals()
                counts[1 + n_oov :] += decoded.truncated
        except DataError as e:
            error, counts[0] = e, 1
        counts = self._sum_over_ranks(counts)
        past = {name: n for name, n in zip(bags, counts[1 + n_oov :].tolist()) if n}
        if past and error is None and self._is_first_rank():
            log.warning(
                "%s split: values past max_values not used (each row keeps its first ones): %s",
                index.name,
                past,
            )
        if error is not None:
            raise error
        if counts[0]:
            raise DataError(
                f"{index.name} split: bad data found by {counts[0]} other rank(s) while checking values; "
                "their errors name the file, column and row group"
            )
        return dict(zip(self.oov_fields, counts[1 : 1 + n_oov].tolist()))

    def string_keys(self, split: str) -> dict[str, pa.ChunkedArray]:
        """The split's string key columns in its row order (a string key travels in ``Batch.keys``
        as its row's position), read once, when predict first asks: their bytes stay in memory
        while predict runs. {} without string keys."""
        if split not in self._string_keys:
            index = self.splits[split]
            schema = read_footer(index.files[0]).schema.to_arrow_schema()
            names = [k for k in self.spec.keys if pa.types.is_string(schema.field(k).type)]
            if not names:
                return self._string_keys.setdefault(split, {})
            tables = [
                storage.read_table(f, columns=names, page_checksum_verification=True) for f in index.files
            ]
            keys = pa.concat_tables(tables, promote_options="default")
            self._string_keys[split] = {n: keys.column(n) for n in names}
        return self._string_keys[split]

    def _is_first_rank(self) -> bool:
        return self._rank_world()[0] == 0

    def _sum_over_ranks(self, x: np.ndarray) -> np.ndarray:
        """``x`` summed over the DDP ranks (the trainer's strategy; as is without a trainer)."""
        t = self.trainer
        if t is None:
            return x
        summed = t.strategy.reduce(torch.from_numpy(x).to(t.strategy.root_device), reduce_op="sum")
        return summed.cpu().numpy()

    # -- loaders -------------------------------------------------------------------------------
    def _rank_world(self) -> tuple[int, int]:
        t = self.trainer
        return (t.global_rank, t.world_size) if t is not None else (0, 1)

    def _stream(self, split: str, train: bool) -> ParquetStream:
        if split not in self.splits:
            self.setup({"train": "fit", "val": "validate", "test": "test"}.get(split, "predict"))
        rank, world = self._rank_world()
        return ParquetStream(
            self.splits[split],
            self.spec,
            batch_size=self.batch_size if train else self.eval_batch_size,
            train=train,
            shuffle=self.shuffle,
            seed=self.seed,
            window=self.shuffle_window,
            drop_last=self.drop_last,
            group_rows=self.group_rows,
            group_order=self.group_order,
            plan=StreamPlan(rank=rank, world=world, num_workers=max(1, self.num_workers)),
            verify_checksums=self.verify_checksums,
        )

    def _loader(self, stream: ParquetStream, **kw: Any) -> RecDataLoader:
        extra = {"prefetch_factor": self.prefetch_factor} if self.num_workers > 0 else {}
        return RecDataLoader(
            stream,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            worker_init_fn=_worker_init,
            **extra,
            **kw,
        )

    def train_dataloader(self) -> RecDataLoader:
        t = self.trainer
        epoch_fn = (lambda: t.current_epoch) if t is not None else None
        progress_fn = (
            (lambda: t.fit_loop.epoch_loop.batch_progress.current.processed) if t is not None else None
        )
        epoch_batches_fn = (lambda: t.num_training_batches) if t is not None else None  # limit_train_batches
        loader = self._loader(
            self._stream("train", train=True),
            epoch_fn=epoch_fn,
            progress_fn=progress_fn,
            epoch_batches_fn=epoch_batches_fn,
        )
        if self._resume is not None:
            loader.load_resume_state(self._resume)
            self._resume = None
        self._train_loader = loader
        return loader

    def val_dataloader(self) -> RecDataLoader | list:
        if "val" not in self.splits and not self.has_split("val"):
            return []  # Lightning runs no validation loop for an empty list
        return self._loader(self._stream("val", train=False))

    def test_dataloader(self) -> RecDataLoader:
        return self._loader(self._stream("test", train=False))

    def predict_dataloader(self) -> RecDataLoader:
        return self._loader(self._stream(self.predict_split, train=False))


def _open_data(data_dir: str, spec_path: str | None) -> tuple[Path | str, FeatureSpec, str]:
    """The data folder (a URI, s3://..., stays a string: its split files are read where they are,
    ``data.storage``), its feature spec and the spec's text."""
    folder = data_dir if storage.is_uri(data_dir) else Path(data_dir)
    spec = _load_spec(folder, spec_path)
    return folder, spec, Path(spec.path).read_text()


def _load_spec(data_dir: Path | str, spec_path: str | None) -> FeatureSpec:
    if spec_path is None and storage.is_uri(data_dir):
        # spec.yaml, vocab/ and the side table, copied locally: the spec resolves them by path.
        return FeatureSpec.load(storage.localize(data_dir) / "spec.yaml")
    if spec_path is None and not (data_dir / "spec.yaml").is_file():
        raise FileNotFoundError(
            f"data.data_dir={data_dir}: no spec.yaml there"
            + ("" if data_dir.is_dir() else " (the folder does not exist)")
            + "; expected a folder made by `recformer data movielens --out DIR` or "
            "`recformer data synth --out DIR` (spec.yaml beside train/, val/, test/)"
        )
    return FeatureSpec.load(spec_path or data_dir / "spec.yaml")


def _check_settings(
    batch_size: int, eval_batch_size: int | None, shuffle_window: int, num_workers: int, prefetch_factor: int
) -> None:
    """Each setting in its range, or an error naming it as ``data.<name>``."""
    for name, value in (("batch_size", batch_size), ("eval_batch_size", eval_batch_size)):
        if value is not None and value <= 0:
            raise ValueError(f"data.{name}={value}; expected a positive number of rows per batch")
    least = {"shuffle_window": (shuffle_window, 1), "num_workers": (num_workers, 0)}
    for name, (value, low) in (least | {"prefetch_factor": (prefetch_factor, 1)}).items():
        if value < low:
            raise ValueError(f"data.{name}={value}; expected an integer >= {low}")


def global_seed() -> int:
    """The seed ``seed_everything`` set in this process (LightningCLI calls it before it builds the
    DataModule, in every DDP rank), else 0."""
    return int(os.environ.get("PL_GLOBAL_SEED", "0") or 0)


def _worker_check(e: DataError) -> str | None:
    """The message of a data check a DataLoader worker (spawn / forkserver) raised, out of the text
    torch re-raises it with in the training process ("Caught DataError in DataLoader worker process
    N. Original Traceback ... recformer.data.schema.DataError: <message>"); None for another error.
    Forked workers send the message itself (``ring``)."""
    text, tag = str(e), f"{DataError.__module__}.{DataError.__qualname__}: "
    if not text.startswith("Caught DataError") or tag not in text:
        return None
    return text[text.rfind(tag) + len(tag) :].rstrip("\n")


def _as_is(item: Any) -> Any:
    return item


def _worker_init(_: int) -> None:
    # Workers decode with numpy/pyarrow; torch threads would only oversubscribe the cores.
    torch.set_num_threads(1)
    keep_freed_memory()


__all__ = ["DataError", "RecDataLoader", "RecDataModule"]
