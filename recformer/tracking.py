"""The W&B run as the record of a model.

``recformer fit`` names its W&B run after its run folder (``recformer/version_N``) and writes
``wandb.json`` into that folder: the run's id, project, name, mode and W&B folder. The commands that
come after fit read it and log to that same run: ``recformer evaluate`` its results (AUC with its
interval, GAUC, NE, logloss, the calibration table), ``recformer doctor`` its findings and plots.
They resume the run (``wandb.init(id=..., resume="allow")``); offline, the resumed part is a second
offline folder with the same id, which ``wandb sync`` uploads into the one run.

W&B never costs a command its result: absent, disabled (``WANDB_MODE=disabled``), unreachable or
failing, the command warns in one line and carries on.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

RECORD_FILE = "wandb.json"
"""The run folder's record of its W&B run."""


def run_folder_of(ckpt: Path) -> Path:
    """The run folder a checkpoint belongs to: the folder above ``checkpoints/``, else its own."""
    return ckpt.parent.parent if ckpt.parent.name == "checkpoints" else ckpt.parent


def write_record(run_dir: Path, experiment: Any, save_dir: str | None) -> dict[str, Any]:
    """Write ``run_dir/wandb.json`` for a started W&B run; the record."""
    record = {
        "id": experiment.id,
        "project": experiment.project,
        "name": experiment.name,
        "mode": "offline" if getattr(experiment, "offline", False) else "online",
        "save_dir": str(Path(save_dir).resolve()) if save_dir else None,
    }
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / RECORD_FILE).write_text(json.dumps(record, indent=2) + "\n")
    return record


def read_record(run_dir: Path) -> dict[str, Any] | None:
    path = run_dir / RECORD_FILE
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and record.get("id") else None


def _warn(command: str, message: str) -> None:
    print(
        f"{command}: W&B: {message}; the result is not logged there (it is on screen and on disk)",
        file=sys.stderr,
    )


@contextmanager
def resumed_run(run_dir: Path, command: str, job_type: str) -> Iterator[Any]:
    """The W&B run ``run_dir`` records, resumed; None (with a one-line warning where there is a
    record) when there is no record, W&B is disabled or absent, or it cannot start. Finished on exit."""
    record = read_record(run_dir)
    env = os.environ.get("WANDB_MODE")
    if record is None or env == "disabled":
        yield None
        return
    mode = env if env in ("online", "offline") else record.get("mode", "offline")
    try:
        import wandb

        run = wandb.init(
            id=record["id"],
            project=record.get("project"),
            dir=record.get("save_dir") or str(run_dir),
            resume="allow",
            mode=mode,
            job_type=job_type,
            settings=wandb.Settings(silent=True, init_timeout=30.0),
            reinit="create_new",
        )
    except Exception as e:  # noqa: BLE001 - no W&B, no network, a bad record: the command goes on
        _warn(command, f"could not resume run {record['id']} ({type(e).__name__}: {e})")
        yield None
        return
    try:
        yield run
    except Exception as e:  # noqa: BLE001 - a failed log call
        _warn(command, f"logging to run {record['id']} failed ({type(e).__name__}: {e})")
    finally:
        try:
            run.finish()
        except Exception as e:  # noqa: BLE001
            _warn(command, f"finishing run {record['id']} failed ({type(e).__name__}: {e})")


EVAL_KEYS = ("auc", "auc_lo", "auc_hi", "gauc", "gauc_groups", "ne", "logloss", "rows")
"""The scalar results of ``recformer evaluate`` logged to the run's summary."""


def log_evaluation(ckpt: Path, split: str, result: dict[str, Any]) -> str | None:
    """Log ``recformer evaluate``'s result to the W&B run of the checkpoint's run folder, as
    ``eval/<split>/<key>`` in its summary and the calibration table; the run id, or None."""
    with resumed_run(run_folder_of(ckpt), "recformer evaluate", "evaluate") as run:
        if run is None:
            return None
        import wandb

        prefix = f"eval/{split}"
        summary = {f"{prefix}/{k}": result[k] for k in EVAL_KEYS if isinstance(result.get(k), (int, float))}
        summary[f"{prefix}/checkpoint"] = ckpt.name
        for k, v in (result.get("compare") or {}).items():
            if isinstance(v, (int, float)):
                summary[f"{prefix}/compare/{k}"] = v
        rows = result.get("calibration_table") or []
        columns = ["bin", "mean_pred", "mean_label", "rows"]
        table = wandb.Table(columns=columns, data=[[row[c] for c in columns] for row in rows])
        run.log({f"{prefix}/calibration": table})
        run.summary.update(summary)
        return run.id
    return None


def log_doctor(run_dir: Path, diagnosis: Any, plots: list[Path]) -> str | None:
    """Log ``recformer doctor``'s findings (a table, their names, healthy or not) and its plots to
    the W&B run ``run_dir`` records; the run id, or None."""
    with resumed_run(run_dir, "recformer doctor", "doctor") as run:
        if run is None:
            return None
        import wandb

        findings = wandb.Table(
            columns=["check", "title", "metric", "blocks", "steps", "evidence", "advice"],
            data=[
                [f.check, f.title, f.metric, str(f.blocks), str(f.steps), "\n".join(f.evidence), f.advice]
                for f in diagnosis.findings
            ],
        )
        images = {f"doctor/plots/{p.stem}": wandb.Image(str(p)) for p in plots if p.suffix == ".png"}
        run.log({"doctor/findings": findings, **images})
        run.summary.update(
            {
                "doctor/healthy": diagnosis.healthy,
                "doctor/findings_count": len(diagnosis.findings),
                "doctor/findings_names": sorted({f.check for f in diagnosis.findings}),
                "doctor/checks_passed": len(diagnosis.passed),
            }
        )
        return run.id
    return None
