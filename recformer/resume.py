"""Where a stopped fit resumes from, and resuming it in its own run folder.

- ``resume_hint``: when a fit stops on an error (the object store gone mid-epoch, a full disk), the
  one line ``recformer.__main__`` prints ends with the step it stopped at, the checkpoint that holds
  the latest state and its step, and the flag that resumes from it, as the SIGTERM line does.
- The requeue (``recformer fit ... --ckpt_path last``, the same command a scheduler reruns after a
  pre-emption): ``find_requeue`` picks the latest run of this config, the newest ``version_N``
  whose saved ``config.yaml`` equals this command's settings (the checkpoint path and the loggers
  aside), so runs of other configs sharing ``runs/`` are never resumed by mistake; the fit goes on
  from its ``last.ckpt`` in that folder (``recformer.cli``), where ``continue_metrics`` and
  ``trim_health`` keep the logs up to the checkpoint's step, and the checkpoint writes a kill cut
  short are removed (``remove_partials``).
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recformer.callbacks.preemption import checkpoint_folder
from recformer.callbacks.sink import HEALTH_FILE
from recformer.checkpoints import PARTIAL, checkpoint_entries

LAST = "last.ckpt"
"""The checkpoint that always holds a run's latest state (configs/trainer.yaml)."""
RUN_LOGGERS = ("lightning.pytorch.loggers.CSVLogger", "lightning.pytorch.loggers.TensorBoardLogger")
"""Loggers whose ``version_N`` folder is the run's own folder (``recformer.cli.claim_version``)."""


def latest_checkpoint(folder: Path) -> Path | None:
    """``folder/last.ckpt``, else the newest checkpoint in ``folder``; None when there is none."""
    last = folder / LAST
    if last.is_file():
        return last
    found = [p for p in folder.glob("*.ckpt") if p.is_file()]
    return max(found, key=lambda p: p.stat().st_mtime_ns) if found else None


def resume_hint(trainer: Any) -> str | None:
    """For a fit stopped by an error: its step, the checkpoint holding the latest state and its
    step, and how to resume from it; None when nothing was saved (or this is no fit)."""
    if getattr(trainer.state.fn, "value", trainer.state.fn) != "fit":
        return None
    try:
        found = latest_checkpoint(checkpoint_folder(trainer))
        step = checkpoint_entries(found, "global_step")["global_step"] if found is not None else None
    except Exception:  # noqa: BLE001 - an unreadable file: no hint rather than a second error
        return None
    if found is None:
        return None
    requeue = ", or the same command with --ckpt_path last" if found.name == LAST else ""
    return (
        f"stopped at step {trainer.global_step}; {found} holds step {step} "
        f"(resume: --ckpt_path {found}{requeue})"
    )


# -- the requeue: `recformer fit ... --ckpt_path last` -----------------------------------------------


@dataclass
class Requeue:
    """What ``--ckpt_path last`` resolved to."""

    run: Path | None
    """The run folder the fit continues in; None: a new run."""
    ckpt: Path | None
    """The checkpoint it resumes from; None: step 0."""
    note: str
    """The one line said at start."""
    step: int = -1
    """The checkpoint's step: logs past it belong to a stopped attempt (-1: from step 0)."""


def find_requeue(
    root: Path, candidates: list[Path], differences: Callable[[Path], list[str]], ckpt_dir: Path | None
) -> Requeue:
    """The latest run of this config among ``candidates`` (newest first): the first whose saved
    ``config.yaml`` ``differences`` finds equal to this command's. Its last.ckpt (in ``ckpt_dir``
    when the config fixes one, else in its ``checkpoints/``) is resumed, or, without one, it
    starts again from step 0 in the same folder. No such run: a new one, saying which run came
    closest and how it differs."""
    closest: tuple[Path, list[str]] | None = None
    for run in candidates:
        saved = run / "config.yaml"
        if not saved.is_file():
            continue
        differ = differences(saved)
        if differ:
            closest = closest or (run, differ)
            continue
        last = (ckpt_dir or run / "checkpoints") / LAST
        if last.is_file():
            step = checkpoint_entries(last, "global_step")["global_step"]
            said = f"resuming {run} (the latest run of this config) from {last}, step {step}"
            return Requeue(run, last, said, int(step))
        return Requeue(
            run,
            None,
            f"{run} (the latest run of this config) has no {LAST} (stopped before its first "
            "checkpoint): it starts again from step 0 in that folder",
        )
    if closest is None:
        return Requeue(None, None, f"no earlier run of this config under {root}: starting a new run")
    run, differ = closest
    more = f" and {len(differ) - 3} more" if len(differ) > 3 else ""
    return Requeue(
        None,
        None,
        f"no earlier run of this config under {root} (the latest, {run.name}, differs: "
        f"{'; '.join(differ[:3])}{more}): starting a new run",
    )


def _step(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return -math.inf


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def trim_health(run: Path, step: int) -> int:
    """Drop the records of ``run/health.jsonl`` past a checkpoint at ``step`` (its callbacks log
    at the step a batch makes, so up to ``step`` is before), written by a stopped attempt after
    the checkpoint a resume continues from; the number dropped."""
    path = run / HEALTH_FILE
    if not path.is_file():
        return 0
    lines = path.read_text().splitlines()
    kept = [x for x in lines if _step(_json_step(x)) <= step]
    if len(kept) < len(lines):
        _write_atomic(path, "".join(x + "\n" for x in kept))
    return len(lines) - len(kept)


def _json_step(line: str) -> Any:
    try:
        return json.loads(line).get("step")
    except (ValueError, AttributeError):
        return None


def continue_metrics(logger: Any, step: int) -> int:
    """Let a CSVLogger continue its folder's ``metrics.csv`` from a checkpoint at ``step`` instead
    of deleting it, as Lightning's writer does when it finds a folder that is not empty: the rows
    logged before the checkpoint are read, the file is moved aside while the writer starts, then
    they are written back with the writer told its columns. Lightning logs a batch's rows at the
    step before the one the batch makes (and an epoch's closing rows at its last batch's), so the
    rows before a checkpoint at ``step`` are those with a smaller step. The number dropped."""
    path = Path(logger.log_dir) / "metrics.csv"
    aside = path.with_name(f".{path.name}.resume")
    if path.is_file():
        os.replace(path, aside)  # an aside left by an attempt killed here is used as it is
    rows, header = [], []
    if aside.is_file():
        with aside.open(newline="") as f:
            reader = csv.DictReader(f)
            header, rows = list(reader.fieldnames or []), list(reader)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Experiment logs directory")
        writer = logger.experiment
    kept = [r for r in rows if _step(r.get("step")) < step]
    if header:
        out = io.StringIO()
        table = csv.DictWriter(out, fieldnames=header)
        table.writeheader()
        table.writerows(kept)
        _write_atomic(path, out.getvalue())
        writer.metrics_keys = list(header)
    aside.unlink(missing_ok=True)
    return len(rows) - len(kept)


def remove_partials(folder: Path) -> list[Path]:
    """Remove the temporary files of checkpoint writes killed half-way in ``folder``
    (``checkpoints.PARTIAL``); the caller knows no live process writes there."""
    found = sorted(folder.glob(f".*{PARTIAL}*")) if folder.is_dir() else []
    for p in found:
        p.unlink(missing_ok=True)
    return found


def runs_root(trainer: Any) -> tuple[Path | None, Any]:
    """The folder holding a config's ``version_N`` run folders, and a fixed version if the logger
    gives one: the first logger's ``save_dir/name`` (CSV, TensorBoard), or
    ``default_root_dir/recformer`` without loggers; None for another first logger."""
    loggers = trainer.get("logger")
    if loggers in (False, []):
        return Path(trainer.get("default_root_dir") or ".") / "recformer", None
    first = (loggers if isinstance(loggers, list) else [loggers])[0]
    args = getattr(first, "init_args", None)
    if getattr(first, "class_path", None) not in RUN_LOGGERS or args is None:
        return None, None
    return Path(args.get("save_dir") or ".") / (args.get("name") or ""), args.get("version")


def version_name(version: int | str) -> str:
    return version if isinstance(version, str) else f"version_{version}"


def versions(root: Path) -> list[Path]:
    """``root``'s ``version_N`` folders, newest (highest N) first."""
    found = [p for p in root.glob("version_*") if p.is_dir() and p.name[8:].isdigit()]
    return sorted(found, key=lambda p: int(p.name[8:]), reverse=True)


def fixed_ckpt_dir(config: Any) -> Path | None:
    """The folder a ``last`` ModelCheckpoint of the config writes to when it names one."""
    for cb in config["trainer"].get("callbacks") or []:
        args = getattr(cb, "init_args", None)
        if not str(getattr(cb, "class_path", "")).endswith("ModelCheckpoint") or args is None:
            continue
        if args.get("filename") == LAST.removesuffix(".ckpt") and args.get("dirpath"):
            return Path(args["dirpath"])
    return None


def flat(value: Any, prefix: str = "") -> dict[str, Any]:
    """A dumped config as ``{"trainer.callbacks[3].init_args.step": 12, ...}``: every leaf by path,
    list items by index, so that two configs' differences name the setting."""
    if isinstance(value, dict):
        items = [(f"{prefix}.{k}" if prefix else str(k), v) for k, v in value.items()]
    elif isinstance(value, list) and any(isinstance(v, dict | list) for v in value):
        items = [(f"{prefix}[{i}]", v) for i, v in enumerate(value)]
    else:
        return {prefix: value}
    out: dict[str, Any] = {}
    for key, v in items:
        out.update(flat(v, key))
    return out


def comparable(config: Any) -> dict[str, Any]:
    """A dumped config without what names a run rather than what it computes, nor the attention
    kernel (``model.ranker.attention_kernel``: how it computes)."""
    config = dict(config or {})
    config.pop("ckpt_path", None)
    trainer = dict(config.get("trainer") or {})
    for key in ("logger", "default_root_dir"):
        trainer.pop(key, None)
    config["trainer"] = trainer
    model = config.get("model")
    if isinstance(model, dict) and isinstance(model.get("ranker"), dict):
        # How attention is computed, not what; absent from the configs of runs before 2026-12-07.
        ranker = {k: v for k, v in model["ranker"].items() if k != "attention_kernel"}
        config["model"] = {**model, "ranker": ranker}
    return config
