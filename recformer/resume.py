"""Where a stopped fit resumes from, said in the line that reports the stop.

``resume_hint``: when a fit stops on an error (the object store gone mid-epoch, a full disk), the
one line ``recformer.__main__`` prints ends with the step it stopped at, the checkpoint that holds
the latest state and its step, and the flag that resumes from it, as the SIGTERM line does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from recformer.callbacks.preemption import checkpoint_folder
from recformer.checkpoints import checkpoint_entries

LAST = "last.ckpt"
"""The checkpoint that always holds a run's latest state (configs/trainer.yaml)."""


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
