"""The one gate that decides when the health callbacks work (DESIGN section 6, STYLE "Training code").

Everything that copies to the host (``.tolist()``), runs the probe batch or reads optimizer state
happens only on steps for which ``should_log`` is True. Steps are counted as Lightning counts them,
by ``trainer.global_step``: the number of optimizer steps *completed*. Inside
``on_before_optimizer_step`` the step being taken is therefore ``trainer.global_step + 1``
(``step_in_progress``); in ``on_train_batch_end`` it is ``trainer.global_step``. Both name the same
step, which is also the ``step=`` the loggers receive.
"""

from __future__ import annotations

from typing import Any


def should_log(global_step: int, every_n: int) -> bool:
    """True on every ``every_n``-th completed optimizer step (never at step 0; ``every_n <= 0`` = off)."""
    return every_n > 0 and global_step > 0 and global_step % every_n == 0


def cadence(trainer: Any, every_n_steps: int | None) -> int:
    """A callback's cadence: its own ``every_n_steps`` if set, else ``trainer.log_every_n_steps``."""
    if every_n_steps is not None:
        return every_n_steps
    return int(trainer.log_every_n_steps or 0)


def step_in_progress(trainer: Any) -> int:
    """The step an ``on_before_optimizer_step`` hook belongs to (``global_step`` counts completed ones)."""
    return trainer.global_step + 1


def check_every_n(name: str, every_n_steps: int | None) -> None:
    """Validate a cadence argument at construction, naming the setting."""
    if every_n_steps is not None and (not isinstance(every_n_steps, int) or every_n_steps < 0):
        raise ValueError(
            f"{name}={every_n_steps!r} must be None (use trainer.log_every_n_steps), 0 (off) or a positive "
            "number of steps"
        )
