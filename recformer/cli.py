"""``recformer fit | validate | test | predict``: LightningCLI with YAML configs from configs/.

The feature spec decides the embedding sizes: ``data.feature_dims`` is linked into ``model.dims``
at instantiation, so no size is copied between YAML files. ``configs/trainer.yaml`` holds the
trainer defaults (loggers, checkpoints, callbacks) and is applied first when it is present.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import warnings
from pathlib import Path
from typing import Any, NoReturn

from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.fabric.utilities.rank_zero import _get_rank
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

from recformer.callbacks.predictions import ParquetPredictionWriter
from recformer.callbacks.sink import HEALTH_FILE
from recformer.checkpoints import AtomicCheckpointIO, is_remote, read_checkpoint
from recformer.cli_fixes import (  # KNOWN_FALSE_ALARMS: still recformer.cli.KNOWN_FALSE_ALARMS
    KNOWN_FALSE_ALARMS,  # noqa: F401
    NOT_FIT_FALSE_ALARMS,
    batches_or_fraction,
    describe_settings,
    quiet_known_false_alarms,
)
from recformer.data.datamodule import RecDataModule
from recformer.loggers import SafeWandbLogger
from recformer.module import RankerModule
from recformer.resume import (
    RUN_LOGGERS,
    Requeue,
    comparable,
    continue_metrics,
    find_requeue,
    fixed_ckpt_dir,
    flat,
    remove_partials,
    resume_hint,
    runs_root,
    trim_health,
    version_name,
    versions,
)
from recformer.tracking import RECORD_FILE, read_record, run_folder_of
from recformer.writer_lock import LOCK_FILE, held_by, hold

DEFAULT_TRAINER_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "trainer.yaml"


_NEW_RUN_DIRS: list[Path] = []
"""Run folders this process made (rank 0), for ``cli_main`` to remove if the run stops on a bad
setting or input before it writes a result."""
_TRAINERS: list[Any] = []
"""Trainers this process made; their W&B run folders go with a removed run folder."""
_LOCKS: list[int] = []
"""Writer locks of the run folders this process writes (``recformer.writer_lock``), held until
``cli_main`` returns."""
_START_FILES = {"config.yaml", "hparams.yaml", RECORD_FILE, LOCK_FILE}
"""What a run writes before its first step."""
_WANDB_LOGGER = "recformer.loggers.SafeWandbLogger"


def holds_no_result(run: Path) -> bool:
    """``run`` holds nothing but what a run writes at its start: its configs, a ``health.jsonl`` with
    only its ``meta`` line, a ``metrics.csv`` with only its header, empty folders (or is missing)."""
    for p in (p for p in run.rglob("*") if p.is_file()):
        if p.name in _START_FILES:
            continue
        if p.name == HEALTH_FILE and all('"meta"' in line for line in p.read_text().splitlines()):
            continue
        if p.name == "metrics.csv" and len(p.read_text().splitlines()) <= 1:
            continue
        return False
    return True


def own_run_dir(trainer: Any) -> Path | None:
    """The folder only this run writes to: the first logger's version folder (CSV, TensorBoard), or
    default_root_dir without loggers; None for another first logger, whose folder is its save_dir,
    shared by every run. Read before the run starts, so no rank needs to broadcast it."""
    if not trainer.loggers:
        return Path(trainer.default_root_dir)
    first = trainer.loggers[0]
    return Path(first.log_dir) if isinstance(first, CSVLogger | TensorBoardLogger) else None


def _is_launch_rank_zero() -> bool:
    """This process is global rank 0, as far as the environment tells before any strategy runs
    (Lightning's own rule, plus the node rank of its multi-node launcher)."""
    node = int(os.environ.get("NODE_RANK", os.environ.get("GROUP_RANK", "0")) or 0)
    return _get_rank() in (None, 0) and node == 0


def claim_version(root: Path) -> Path:
    """The next free ``root/version_N``, made here. ``mkdir`` fails for all but one of several
    processes that try the same name, so two runs started at once get a folder each (CSVLogger's
    own numbering lists the folders and gave both version_0)."""
    root.mkdir(parents=True, exist_ok=True)
    taken = [int(p.name[8:]) for p in root.glob("version_*") if p.name[8:].isdigit()]
    n = max(taken, default=-1) + 1
    while True:
        try:
            (root / f"version_{n}").mkdir()
        except FileExistsError:
            n += 1
            continue
        _NEW_RUN_DIRS.append(root / f"version_{n}")
        _LOCKS.append(hold(root / f"version_{n}", "run folder"))  # new: nobody else holds it
        return root / f"version_{n}"


def remove_runs_without_result() -> None:
    """Remove the run folders this process made that hold no result, with their W&B runs."""
    removed = False
    for run_dir in _NEW_RUN_DIRS:
        if holds_no_result(run_dir):
            shutil.rmtree(run_dir, ignore_errors=True)
            removed = True
    if removed:
        for trainer in _TRAINERS:
            for logger in trainer.loggers:
                folder = getattr(logger, "run_folder", None)
                if folder is not None:
                    shutil.rmtree(folder, ignore_errors=True)
                    remove_links_into(folder.parent, folder)


def remove_links_into(parent: Path, removed: Path) -> None:
    """The symbolic links in ``parent`` that point into the removed folder ``removed``: W&B's
    ``latest-run``, ``debug.log`` and ``debug-internal.log`` beside its run folders. Links to
    another run (a later one's, started meanwhile) stay."""
    for link in parent.iterdir() if parent.is_dir() else []:
        if not link.is_symlink():
            continue
        target = Path(os.readlink(link))
        target = target if target.is_absolute() else parent / target
        if target == removed or removed in target.parents:
            link.unlink(missing_ok=True)


class LoggedSaveConfig(SaveConfigCallback):
    """Saves the resolved config in the run's own directory (never another run's) and sends it to
    every logger that takes one (W&B)."""

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage != "predict":  # scoring is not a run: it writes its predictions file only
            super().setup(trainer, pl_module, stage)

    def save_config(self, trainer: Any, pl_module: Any, stage: str) -> None:
        config = self.parser.dump(self.config, skip_none=False, format="yaml")
        import yaml

        as_dict = yaml.safe_load(config)
        run_dir = own_run_dir(trainer)
        for logger in trainer.loggers:
            if hasattr(logger, "log_config"):
                logger.log_config(as_dict)
            if isinstance(logger, SafeWandbLogger) and run_dir is not None:
                logger.record_in(run_dir)  # wandb.json: evaluate and doctor log to this run


class _OneLineErrors(LightningArgumentParser):
    """A bad setting is one line naming it and where to see them all, not the usage of every
    setting (60 lines) above it. No prefix matching: ``--trainer.max_step`` is an unknown setting,
    not ``max_steps``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        if not self.exit_on_error or os.environ.get("JSONARGPARSE_DEBUG"):
            super().error(message, ex)  # a parse jsonargparse tries and catches; its debug mode
        self._logger.error(message)
        prog = (getattr(ex, "subcommand_parser", None) or self).prog.replace(" [options]", "")
        sys.stderr.write(f"{prog}: error: {message}\n(every setting: {prog} --help)\n")
        self.exit(2)


RUNTIME_SETTINGS = ("compile", "auc_exact_max_rows", "ranker.attention_kernel")
"""Model settings that do not change what a checkpoint computes (how it is run: compiled, the
attention's kernel; the exact AUC's bound): given with ``--ckpt_path`` they apply; every other
``model.*`` setting comes from the checkpoint."""


def is_runtime_setting(key: str) -> bool:
    """``key`` (dotted, under ``model.``) is one of ``RUNTIME_SETTINGS`` or inside one."""
    return any(key == name or key.startswith(name + ".") for name in RUNTIME_SETTINGS)


_CKPT_KEYWORDS = ("last", "best", "hpc", "registry")
"""``ckpt_path`` values Lightning resolves itself."""


def _leaves(value: Any, prefix: str = "") -> dict[str, Any]:
    """Nested mappings / Namespaces as ``{"a.b": leaf}``."""
    items = vars(value).items() if hasattr(value, "__dict__") and not isinstance(value, type) else None
    if isinstance(value, dict):
        items = value.items()
    if items is None:
        return {prefix: value}
    out: dict[str, Any] = {}
    for k, v in items:
        if not str(k).startswith("__"):
            out.update(_leaves(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def _plain(value: Any) -> Any:
    return [_plain(v) for v in value] if isinstance(value, list | tuple) else value


class RecformerCLI(LightningCLI):
    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.link_arguments("data.feature_dims", "model.dims", apply_on="instantiate")
        batches_or_fraction(parser)

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        self._given_args = (
            list(sys.argv[1:] if args is None else args) if not isinstance(args, dict) else None
        )
        self._requeue: Requeue | None = None
        with warnings.catch_warnings():
            # ``recformer.__main__.main(argv)`` passes its own arguments from Python (the tests, the
            # lab, a notebook) while sys.argv holds the caller's (pytest's): args are what count, as
            # Lightning itself does; its warning about having both says nothing here.
            warnings.filterwarnings("ignore", message=r"LightningCLI's args parameter is intended")
            super().parse_arguments(parser, args)

    def _run_subcommand(self, subcommand: str) -> None:
        with warnings.catch_warnings():
            if subcommand != "fit":
                for message in NOT_FIT_FALSE_ALARMS:
                    warnings.filterwarnings("ignore", message=message)
            super()._run_subcommand(subcommand)

    def _parse_ckpt_path(self) -> None:
        """A checkpoint's model settings replace the config's, as Lightning's own version does, but a
        ``model.*`` setting the user gave that the checkpoint contradicts is refused by name (it was
        silently replaced), and an unreadable file is one line, not torch's traceback."""
        sub = self.config.get("subcommand")
        ckpt_path = self.config[sub].get("ckpt_path") if sub else None
        if sub == "fit" and ckpt_path == "last":
            ckpt_path = self._resolve_last(sub)
        if not ckpt_path or str(ckpt_path).split(":")[0] in _CKPT_KEYWORDS:
            return
        hparams = dict(read_checkpoint(ckpt_path).get("hyper_parameters") or {})
        hparams.pop("_instantiator", None)
        if not hparams:
            return
        given = self._given_model_settings(sub)
        saved = _leaves(hparams)
        clashes = [
            f"--model.{key}={value!r} (the checkpoint's: {saved[key]!r})"
            for key, value in given.items()
            if not is_runtime_setting(key) and key in saved and _plain(value) != _plain(saved[key])
        ]
        if clashes:
            fresh = "; or train a new model without --ckpt_path" if sub == "fit" else ""
            raise ValueError(
                f"--ckpt_path {ckpt_path} was trained with other model settings than given: "
                f"{', '.join(clashes)}. A checkpoint keeps the model settings it was trained with: drop "
                f"them{fresh}"
            )
        self.config = self.parser.parse_object({sub: {"model": hparams}}, self.config)
        for key, value in given.items():  # compile, the attention kernel...: the user's value applies
            if is_runtime_setting(key):
                self.config[sub]["model"][key] = value

    def _resolve_last(self, sub: str) -> str | None:
        """``fit --ckpt_path last``: the last.ckpt of the latest run of this config, continued in its
        own run folder (``recformer.resume.find_requeue``); None (a new run, or step 0 in that
        folder) when it has none. Every rank resolves it alike from the same files."""
        config = self.config[sub]
        root, version = runs_root(config["trainer"])
        if root is None:
            raise ValueError(
                "--ckpt_path last resumes the latest run of this config in its run folder: it needs a "
                "CSVLogger or TensorBoardLogger as the first trainer.logger (or --trainer.logger false); "
                "or give --ckpt_path PATH"
            )
        candidates = [root / version_name(version)] if version is not None else versions(root)
        self._requeue = find_requeue(
            root, candidates, lambda saved: self._differences(sub, saved), fixed_ckpt_dir(config)
        )
        config["ckpt_path"] = str(self._requeue.ckpt) if self._requeue.ckpt is not None else None
        return config["ckpt_path"]

    def _differences(self, sub: str, saved: Path) -> list[str]:
        """The settings in which this command differs from the run whose config.yaml is ``saved``:
        ``key: the run's value vs this command's``; the checkpoint path, the loggers and the
        default root (which name the run, not what it computes) aside."""
        import yaml

        try:
            then = yaml.safe_load(saved.read_text())
        except (OSError, yaml.YAMLError):
            return [f"{saved} is not readable"]
        try:
            now = yaml.safe_load(self._parser(sub).dump(self.config[sub], skip_none=False, format="yaml"))
        except (TypeError, ValueError) as e:  # a setting jsonargparse cannot write back as YAML
            return [f"this command's settings cannot be written as YAML to compare ({e})"]
        a, b = flat(comparable(now)), flat(comparable(then))
        short = lambda v: repr(v) if len(repr(v)) <= 40 else repr(v)[:37] + "..."
        return [
            f"{k}: {short(b.get(k))} vs {short(a.get(k))} now"
            for k in sorted(set(a) | set(b))
            if _plain(a.get(k)) != _plain(b.get(k))
        ]

    def _given_model_settings(self, sub: str) -> dict[str, Any]:
        """The ``model.*`` settings given on the command line or in ``--config`` files (not defaults)."""
        if self._given_args is None:
            return {}
        given = self.parser.parse_args(self._given_args, defaults=False)[sub].get("model")
        return {k: v for k, v in _leaves(given).items() if v is not None} if given is not None else {}

    def _prepare_subcommand_parser(
        self, klass: type, subcommand: str, **kwargs: Any
    ) -> LightningArgumentParser:
        parser = super()._prepare_subcommand_parser(klass, subcommand, **kwargs)
        if subcommand == "predict":
            parser.add_argument(
                "--output",
                type=str | None,
                default=None,
                help="Parquet file for the scores (default: predictions-<split>-<checkpoint name>.parquet "
                "in the checkpoint's run folder)",
            )
            parser.add_argument("--overwrite", type=bool, default=False, help="Replace an existing --output")
        return parser

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        trainer = config["trainer"]
        if self.subcommand == "predict":
            # Scoring makes no run of its own (no run folder, no W&B run): its root is the run folder
            # of the checkpoint it scores, where the predictions go (ParquetPredictionWriter).
            trainer["logger"] = False
            ckpt = config.get("ckpt_path")
            if ckpt and not is_remote(ckpt) and Path(ckpt).is_file():
                trainer["default_root_dir"] = str(run_folder_of(Path(ckpt)))
                return
        loggers = trainer.get("logger")
        if not _is_launch_rank_zero():
            return
        if loggers in (False, []):  # None is Lightning's default logger
            # Without loggers Lightning writes a run's files (config.yaml, checkpoints/,
            # health.jsonl, predictions) straight into default_root_dir, where the next such run
            # would mix its files with this one's: it gets a version_N folder of its own.
            root = Path(trainer.get("default_root_dir") or ".") / "recformer"
            trainer["default_root_dir"] = str(self._own_folder(root, None))
            return
        loggers = loggers if isinstance(loggers, list) else [loggers]
        run_name = None
        for logger in loggers:
            args = getattr(logger, "init_args", None)
            if getattr(logger, "class_path", None) in RUN_LOGGERS and args is not None:
                root = Path(args.get("save_dir") or ".") / (args.get("name") or "")
                folder = self._own_folder(root, args.get("version"))
                version = folder.name.removeprefix("version_")
                args["version"] = int(version) if version.isdigit() else folder.name
                run_name = run_name or f"{args.get('name') or 'lightning_logs'}/{folder.name}"
        self._name_wandb_run(loggers, run_name)

    def _own_folder(self, root: Path, version: int | str | None) -> Path:
        """The run's folder under ``root``, with its writer lock held by this process: the
        requeued run's (``--ckpt_path last``), the ``version`` given, or a new ``version_N``. A
        folder a live process is writing is refused (``WriterAlive``), naming that process."""
        requeue = self._requeue
        if requeue is not None and requeue.run is not None and requeue.run.parent == root:
            folder = requeue.run
        elif version is not None:
            folder = root / version_name(version)
        else:
            return claim_version(root)
        new = not folder.exists()
        _LOCKS.append(hold(folder, "run folder"))
        if new:
            _NEW_RUN_DIRS.append(folder)
        return folder

    def _name_wandb_run(self, loggers: list[Any], run_name: str | None) -> None:
        """The W&B run is named after the run folder (recformer/version_N); a requeued run goes on
        in the W&B run its folder records (wandb.json), which Lightning's logger resumes."""
        requeue = self._requeue
        record = read_record(requeue.run) if requeue is not None and requeue.run is not None else None
        for logger in loggers:
            args = getattr(logger, "init_args", None)
            if getattr(logger, "class_path", None) != _WANDB_LOGGER or args is None:
                continue
            if run_name and args.get("name") is None:
                args["name"] = run_name
            if record is not None and args.get("id") is None and args.get("version") is None:
                args["id"] = record["id"]

    def instantiate_trainer(self, **kwargs: Any) -> Any:
        if self._requeue is not None and self._requeue.run is not None:
            self.save_config_kwargs["overwrite"] = True  # the same settings, into its own folder
        trainer = super().instantiate_trainer(**kwargs)
        _TRAINERS.append(trainer)
        if trainer.is_global_zero and self.subcommand == "fit":
            self._continue_requeued(trainer)
            self._remove_killed_writes()
        # Checkpoints written in place (see recformer.checkpoints), unless a plugin brought its own IO.
        if type(trainer.strategy.checkpoint_io) is TorchCheckpointIO:
            trainer.strategy.checkpoint_io = AtomicCheckpointIO()
        if self.subcommand != "fit":  # they never save outside fit; restored, they warn of a changed dirpath
            trainer.callbacks = [cb for cb in trainer.callbacks if not isinstance(cb, ModelCheckpoint)]
        run_dir = own_run_dir(trainer)
        if trainer.is_global_zero and run_dir is not None and not run_dir.exists():
            _NEW_RUN_DIRS.append(run_dir)
        _start_csv_writers(trainer)
        bar = trainer.progress_bar_callback
        if bar is not None and run_dir is not None and run_dir.name.removeprefix("version_").isdigit():
            bar.get_metrics = _numbered(bar.get_metrics, int(run_dir.name.removeprefix("version_")))
        return trainer

    def before_predict(self) -> None:
        # Scores stream to Parquet (ParquetPredictionWriter); Lightning would also keep every
        # batch's output in memory for the return value nobody reads here. --return_predictions
        # true still asks for it.
        config = self.config_init["predict"]
        if config.get("return_predictions") is None:
            config["return_predictions"] = False
        writers = [cb for cb in self.trainer.callbacks if isinstance(cb, ParquetPredictionWriter)]
        for writer in writers:
            writer.output = config.get("output") or writer.output
            writer.overwrite = bool(config.get("overwrite")) or writer.overwrite
            writer.checkpoint = config.get("ckpt_path")
        if config.get("output") and not writers:
            raise ValueError(
                "--output needs the recformer.callbacks.predictions.ParquetPredictionWriter callback"
            )

    def after_predict(self) -> None:
        for writer in (cb for cb in self.trainer.callbacks if isinstance(cb, ParquetPredictionWriter)):
            writer.say_where()

    def _continue_requeued(self, trainer: Any) -> None:
        """Say what ``--ckpt_path last`` resolved to; in a continued run folder keep metrics.csv and
        health.jsonl up to the checkpoint's step (the stopped attempt may have logged past it)."""
        requeue = self._requeue
        if requeue is None:
            return
        dropped = 0
        if requeue.run is not None:
            for logger in trainer.loggers:
                if isinstance(logger, CSVLogger) and Path(logger.log_dir) == requeue.run:
                    dropped += continue_metrics(logger, requeue.step)
            dropped += trim_health(requeue.run, requeue.step)
        past = f"; {dropped} log row(s) the stopped attempt wrote after step {requeue.step} dropped"
        print(f"recformer fit: --ckpt_path last: {requeue.note}{past if dropped else ''}", file=sys.stderr)

    def _remove_killed_writes(self) -> None:
        """Remove the checkpoint writes a kill cut short beside the checkpoint this fit resumes
        from, unless a live process writes that run (its writer lock), and say so in one line."""
        ckpt = self.config[self.subcommand].get("ckpt_path")
        if not ckpt or is_remote(ckpt) or not Path(ckpt).is_file():
            return
        run = run_folder_of(Path(ckpt))
        if held_by(run) is not None and not (self._requeue is not None and self._requeue.run == run):
            return
        removed = remove_partials(Path(ckpt).parent)
        if removed:
            print(
                f"recformer fit: removed {len(removed)} checkpoint write(s) a kill cut short: "
                f"{', '.join(str(p) for p in removed)} (the checkpoints beside them are whole)",
                file=sys.stderr,
            )


def _start_csv_writers(trainer: Any) -> None:
    """Start the CSV writer of each new run folder now: Lightning's warns that the folder is not
    empty and its "previous log files will be deleted" when it finds only the writer lock there."""
    for logger in trainer.loggers if trainer.is_global_zero else []:
        if isinstance(logger, CSVLogger) and Path(logger.log_dir) in _NEW_RUN_DIRS:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="Experiment logs directory")
                logger.experiment  # noqa: B018 - creating the writer is the point


def _numbered(get_metrics: Any, number: int) -> Any:
    """The progress bar's ``v_num`` as the run folder's number. Lightning joins every logger's
    version ("3_k2x9abcd") and shows its last 4 characters: the W&B run id's, not the run's. A
    string, as Lightning's own is: the Rich bar (Lightning's default where ``rich`` is installed,
    as ``.[embed]`` brings it) prints a number as a metric, "0.000"."""

    def get_run_metrics(trainer: Any, pl_module: Any) -> dict[str, Any]:
        items = get_metrics(trainer, pl_module)
        if "v_num" in items:
            items["v_num"] = str(number)
        return items

    return get_run_metrics


def _note_resume(error: BaseException) -> None:
    """Put on ``error`` what the line ``recformer.__main__`` prints needs (rank 0, which owns the
    run): the run folder (an OS error from a library names no file) and, for a fit that saved a
    checkpoint, where it resumes (``recformer.resume``)."""
    for trainer in _TRAINERS:
        if not trainer.is_global_zero:
            continue
        with contextlib.suppress(AttributeError):
            error.run_dir = own_run_dir(trainer)  # type: ignore[attr-defined]
            error.resume_hint = resume_hint(trainer)  # type: ignore[attr-defined]


def cli_main(args: list[str] | None = None, run: bool = True) -> RecformerCLI:
    quiet_known_false_alarms()
    described = describe_settings(args)
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
    except Exception as e:  # a bad setting or input, the store or the disk failing, a bug
        _note_resume(e)
        # A run stopped before it wrote a result leaves no version_N folder holding only its
        # config (the next run's number would skip it; doctor would find nothing there), nor a
        # W&B run. A run that wrote a checkpoint or metrics keeps its folder, whatever stopped it.
        remove_runs_without_result()
        raise
    finally:
        if described:  # a process that goes on to run (a test, a notebook) starts as fast as before
            from jsonargparse import set_parsing_settings

            set_parsing_settings(docstring_parse_attribute_docstrings=False)
        _NEW_RUN_DIRS.clear()
        _TRAINERS.clear()
        while _LOCKS:
            os.close(_LOCKS.pop())
