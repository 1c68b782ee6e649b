"""W&B that never costs a run (DESIGN section 7).

``SafeWandbLogger`` defaults to offline mode. If wandb is not installed, cannot start, or fails
while logging (no network in online mode, a full disk, a server error), it warns once and turns
itself off; the other loggers (CSV) carry on and training continues. Lightning already restricts
logging to rank 0 under DDP (``rank_zero_only``); this class keeps that behaviour.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import Logger
from lightning.pytorch.utilities import rank_zero_only, rank_zero_warn

from recformer.tracking import write_record

log = logging.getLogger(__name__)

try:
    from lightning.pytorch.loggers import WandbLogger
except ImportError:  # pragma: no cover - lightning always ships it
    WandbLogger = Logger  # type: ignore[misc,assignment]


def _guarded(fn: Callable) -> Callable:
    @functools.wraps(fn)
    def wrapper(self: SafeWandbLogger, *args: Any, **kwargs: Any) -> Any:
        if self.disabled:
            return None
        try:
            return fn(self, *args, **kwargs)
        except Exception as e:  # noqa: BLE001 - any W&B failure must not stop training
            self._disable(f"{fn.__name__} failed: {type(e).__name__}: {e}")
            return None

    return wrapper


class SafeWandbLogger(WandbLogger):
    def __init__(
        self,
        project: str = "recformer",
        name: str | None = None,
        save_dir: str = "runs",
        online: bool | None = None,
        init_timeout: float = 30.0,
        log_best: bool = False,
        **kwargs: Any,
    ):
        """
        Args:
            project: W&B project.
            name: Run name (default: W&B's).
            save_dir: Where the offline run directory goes (``save_dir/wandb``).
            online: Sync live to the W&B server (True) or write an offline run that syncs later
                with ``wandb sync`` (False), so a machine with no network never stalls. None (the
                default): the ``WANDB_MODE`` environment variable decides, offline when unset. A
                value given here wins over ``WANDB_MODE``, which Lightning itself sets to
                ``dryrun`` once an offline W&B logger has started in the process; only
                ``WANDB_MODE=disabled`` turns W&B off whatever this says.
            init_timeout: Seconds W&B may take to start before it is given up on.
            log_best: At the end of a fit, log the best checkpoint (of the ModelCheckpoint that
                monitors a metric) as the W&B artifact ``model-<run id>``, type ``model``, alias
                ``best``, with the metric and its score in its metadata.
        """
        self.disabled = False
        self.log_best = log_best
        self._best_checkpoint: Any = None
        self._reason = ""
        self.run_folder: Path | None = None
        """This run's W&B folder, once W&B has started (removed with a run refused at its start)."""
        env = os.environ.get("WANDB_MODE")
        explicit = {True: "online", False: "offline", None: None}[online]
        mode = (env or "offline") if env == "disabled" or explicit is None else explicit
        if rank_zero_only.rank == 0:  # W&B runs on global rank 0 only: another node writes nothing
            os.makedirs(save_dir, exist_ok=True)
        try:
            import wandb  # noqa: F401

            settings = wandb.Settings(init_timeout=init_timeout, silent=True)
            super().__init__(
                project=project,
                name=name,
                save_dir=save_dir,
                offline=mode != "online",
                mode=mode,
                settings=settings,
                **kwargs,
            )
            if self._wandb_init.get("anonymous") is None:  # wandb warns on every run that it is unused
                self._wandb_init.pop("anonymous", None)
        except Exception as e:  # noqa: BLE001 - not installed / bad settings: continue without it
            Logger.__init__(self)
            self._disable(f"could not set up W&B ({type(e).__name__}: {e})")

    def _disable(self, reason: str) -> None:
        if not self.disabled:
            rank_zero_warn(
                f"W&B logging is off for this run: {reason}. Training continues; metrics "
                "still go to the other loggers (CSV)."
            )
        self.disabled = True
        self._reason = reason

    @property
    @_guarded
    def experiment(self) -> Any:  # type: ignore[override]
        exp = super().experiment
        if self.run_folder is None and getattr(exp, "dir", None):
            self.run_folder = Path(exp.dir).parent  # <save_dir>/wandb/<offline-run-...>/files
        return exp

    @rank_zero_only
    @_guarded
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        super().log_metrics(metrics, step)

    @rank_zero_only
    @_guarded
    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        super().log_hyperparams(params, *args, **kwargs)

    @_guarded
    def log_config(self, config: dict[str, Any]) -> None:
        """The resolved CLI config, as the run's W&B config."""
        exp = self.experiment
        if exp is not None and hasattr(exp, "config"):
            exp.config.update({"cli": config}, allow_val_change=True)

    @rank_zero_only
    @_guarded
    def finalize(self, status: str) -> None:
        # One W&B run per Trainer run: finishing flushes an offline run's files to disk, and a later
        # Trainer in the same process (tests, sweeps) starts its own run instead of reusing this one.
        super().finalize(status)
        if self.log_best and status == "success":
            try:
                self._log_best()
            except Exception as e:  # noqa: BLE001 - the run is still finished below
                rank_zero_warn(f"log_best: could not log the best checkpoint ({type(e).__name__}: {e})")
        if self._experiment is not None and hasattr(self._experiment, "finish"):
            self._experiment.finish(exit_code=0 if status == "success" else 1)
            self._experiment = None

    @rank_zero_only
    @_guarded
    def record_in(self, run_dir: Path) -> None:
        """Write ``run_dir/wandb.json`` (``recformer.tracking``): evaluate and doctor log to this run."""
        exp = self.experiment
        if exp is not None and getattr(exp, "id", None):
            write_record(run_dir, exp, self.save_dir)

    @_guarded
    def after_save_checkpoint(self, checkpoint_callback: Any) -> None:
        super().after_save_checkpoint(checkpoint_callback)
        if getattr(checkpoint_callback, "monitor", None):
            self._best_checkpoint = checkpoint_callback

    def _log_best(self) -> None:
        cb = self._best_checkpoint
        path = Path(getattr(cb, "best_model_path", "") or "")
        if cb is None or not path.is_file() or self._experiment is None:
            rank_zero_warn("log_best: no best checkpoint was saved in this run; no model artifact logged")
            return
        import wandb

        score = cb.best_model_score
        artifact = wandb.Artifact(
            f"model-{self._experiment.id}",
            type="model",
            metadata={
                "monitor": cb.monitor,
                "score": None if score is None else float(score),
                "checkpoint": path.name,
            },
        )
        artifact.add_file(str(path), name="model.ckpt")
        self._experiment.log_artifact(artifact, aliases=["best"])

    @property
    def name(self) -> str | None:
        return None if self.disabled else super().name

    @property
    def version(self) -> str | None:
        return None if self.disabled else super().version

    @property
    def save_dir(self) -> str | None:
        return None if self.disabled else super().save_dir
