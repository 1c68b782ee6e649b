"""Where the health metrics go: every configured logger, and a local JSONL file the doctor reads.

The sink is the only place that copies metric values to the host. On a log step it asks every
``MetricSource`` callback of the trainer whose gate is open for its values (device tensors or host
floats), concatenates the tensors into one, and makes **one** ``.tolist()`` for the step
(DESIGN section 6). Then, on rank 0 only:

- ``logger.log_metrics(values, step=trainer.global_step)`` on every logger (W&B charts group by the
  ``health/`` and ``perf/`` prefixes; the W&B logger is failure-safe, ``recformer.loggers``). The
  step is the count of optimizer steps done, so the health row of optimizer step ``s`` carries
  ``s``; Lightning logs that step's ``train/loss`` under ``s - 1`` (the index it had while its
  batch ran): in ``metrics.csv`` and W&B the two sit one step apart;
- one JSON object per line appended to ``<trainer.log_dir>/health.jsonl``:
  ``{"step": 120, "health/grad_norm/block_0": 0.31, ...}``. The first line of each fit is
  ``{"meta": {...}}`` (architecture, optimizer betas, cadences) so ``recformer doctor`` can judge a
  run without W&B and without the config.

The sources are pulled, not pushed, so their order in ``trainer.callbacks`` does not matter; a
source that finds no sink in the trainer adds one (``attach_sink``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

import torch
from lightning.pytorch.callbacks import Callback

from recformer.callbacks.gate import cadence, check_every_n, should_log

log = logging.getLogger(__name__)

HEALTH_FILE = "health.jsonl"
"""Default name of the local metrics file inside the run directory."""


class StepMetrics:
    """The values of one log step, collected from every source; ``resolve`` copies them to the host."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.tensors: list[torch.Tensor] = []
        self.host: dict[str, float] = {}

    def add(self, names: Sequence[str], values: torch.Tensor) -> None:
        """``values``: a device tensor with one element per name (any shape); stays on the device."""
        if values.numel() != len(names):
            raise ValueError(
                f"{len(names)} metric names for a tensor of {values.numel()} values: {names[:3]}..."
            )
        self.names.extend(names)
        self.tensors.append(values.detach().reshape(-1))

    def add_host(self, values: dict[str, float]) -> None:
        """Values already on the host (wall-clock rates, step counts)."""
        self.host.update(values)

    def __bool__(self) -> bool:
        return bool(self.names or self.host)

    def resolve(self) -> dict[str, float]:
        """All values as floats: one device-to-host copy for all the tensors."""
        out: dict[str, float] = {}
        if self.tensors:
            device = self.tensors[0].device
            flat = torch.cat([t.to(device=device, dtype=torch.float32) for t in self.tensors])
            # The one host sync of a log step (gated by should_log in every source).
            out.update(zip(self.names, flat.tolist()))
        out.update(self.host)
        return out


class MetricSource(Callback):
    """A callback whose metrics the sink pulls on the steps its gate opens."""

    def __init__(self, every_n_steps: int | None = None) -> None:
        """
        Args:
            every_n_steps: Cadence in optimizer steps; None = ``trainer.log_every_n_steps``, 0 = off.
        """
        check_every_n(f"{type(self).__name__}.every_n_steps", every_n_steps)
        self.every_n_steps = every_n_steps

    def due(self, trainer: Any, step: int) -> bool:
        """This source's gate: rank 0 only (nothing else logs), on its cadence."""
        return trainer.is_global_zero and should_log(step, cadence(trainer, self.every_n_steps))

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage == "fit":
            attach_sink(trainer)

    def collect(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, step: int, out: StepMetrics
    ) -> None:
        """Add this source's values for ``step`` to ``out`` (called only when ``due``)."""
        raise NotImplementedError

    def meta(self, trainer: Any, pl_module: Any) -> dict[str, Any]:
        """Settings the doctor needs to judge this source's metrics."""
        return {"every_n_steps": cadence(trainer, self.every_n_steps)}


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return value


class MetricSink(Callback):
    def __init__(self, filename: str = HEALTH_FILE) -> None:
        """
        Args:
            filename: The local metrics file, relative to the run directory (``trainer.log_dir``),
                or an absolute path.
        """
        self.filename = filename
        self.path: Path | None = None
        self._file: TextIO | None = None
        self._last_step = -1

    def _sources(self, trainer: Any) -> list[MetricSource]:
        return [cb for cb in trainer.callbacks if isinstance(cb, MetricSource)]

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage != "fit":
            return
        # trainer.log_dir broadcasts from rank 0 under DDP: every rank must ask, or the ranks'
        # collectives fall out of step and the next broadcast (SaveConfigCallback's) waits for good.
        log_dir = trainer.log_dir
        if not trainer.is_global_zero:
            return
        run_dir = Path(log_dir or trainer.default_root_dir or ".")
        self.path = Path(self.filename) if Path(self.filename).is_absolute() else run_dir / self.filename
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", encoding="utf-8")

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        # Here, not in setup: the optimizers (whose betas the doctor needs) exist from now on.
        if self._file is None:
            return
        meta: dict[str, Any] = {
            "module": type(pl_module).__name__,
            "log_every_n_steps": trainer.log_every_n_steps,
            "world_size": trainer.world_size,
            "max_steps": trainer.max_steps,
        }
        meta.update(
            arch=pl_module.arch, ranker=_jsonable(pl_module.ranker.cfg), optim=_jsonable(pl_module.optim_cfg)
        )
        for source in self._sources(trainer):
            meta[type(source).__name__] = source.meta(trainer, pl_module)
        self._write({"meta": meta, "step": trainer.global_step})

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = trainer.global_step
        # Under gradient accumulation several batches end at the same optimizer step: log it once.
        if step == self._last_step or not trainer.is_global_zero:
            return
        collected = StepMetrics()
        for source in self._sources(trainer):
            if source.due(trainer, step):
                source.collect(trainer, pl_module, outputs, batch, step, collected)
        if not collected:
            return
        self._last_step = step
        values = collected.resolve()
        for logger in trainer.loggers:
            logger.log_metrics(values, step=step)
        self._write({"step": step, **values})

    def _write(self, record: dict[str, Any]) -> None:
        if self._file is None:
            return
        self._file.write(json.dumps(record, default=_jsonable) + "\n")
        self._file.flush()  # the doctor may read a run that is still going

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        # The loggers' buffered rows (CSVLogger writes every flush_logs_every_n_steps) reach disk
        # with every checkpoint: after a kill, the logs hold everything up to the state a resume
        # continues from (recformer.resume.continue_metrics keeps them; later rows are redone).
        for logger in trainer.loggers:
            logger.save()

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def state_dict(self) -> dict[str, Any]:
        return {"last_step": self._last_step}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._last_step = int(state_dict.get("last_step", -1))


def attach_sink(trainer: Any) -> MetricSink:
    """The trainer's ``MetricSink``; one is appended to ``trainer.callbacks`` if there is none."""
    for cb in trainer.callbacks:
        if isinstance(cb, MetricSink):
            return cb
    sink = MetricSink()
    trainer.callbacks.append(sink)
    return sink
