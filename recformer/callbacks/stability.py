"""Loss spikes and non-finite steps.

A spike is a step whose training loss exceeds the running mean by more than ``threshold`` running
standard deviations (an exponential moving mean and variance over ~``window`` steps, after
``warmup_steps`` steps). Every step is checked, so a spike between two log steps is not missed,
but the check stays on the device: a few scalar ops on the loss Lightning already has
(``outputs["loss"]``, already reduced over the batch; under DDP rank 0 judges its own loss, no
collective is added), no host copy. Spikes do not enter the running statistics, so one spike does
not hide the next; but a run of ``shift_steps`` spikes in a row is a lasting level shift, not a
spike: the mean moves to the run's mean and detection goes on from there (otherwise every later
step would count). Lightning hands the callback a loss divided by ``accumulate_grad_batches``; it is
scaled back, and judged once per optimizer step (its first micro-batch). On log steps the sink
receives:

- ``health/loss_spike``: spikes since the previous log step;
- ``health/loss_z_max``: the largest (loss - mean) / std since the previous log step;
- ``health/loss_ema``: the running mean of the loss;
- ``health/nonfinite_steps``: steps the module skipped for non-finite gradients (its
  ``nonfinite_total`` buffer: a count, already the same on every rank).

The running statistics are saved in checkpoints (``state_dict``), so a resumed run keeps judging
spikes against the history it had instead of warming up again.
"""

from __future__ import annotations

from typing import Any

import torch

from recformer.callbacks.sink import MetricSource, StepMetrics
from recformer.metric_names import LOSS_EMA, LOSS_SPIKE, LOSS_Z_MAX, NONFINITE_STEPS


class LossSpikes(MetricSource):
    def __init__(
        self,
        every_n_steps: int | None = None,
        threshold: float = 6.0,
        window: int = 100,
        warmup_steps: int = 50,
        shift_steps: int = 10,
    ) -> None:
        """
        Args:
            every_n_steps: Cadence of logging in optimizer steps (detection runs every step); None =
                ``trainer.log_every_n_steps``, 0 = off.
            threshold: A spike is a loss above running mean + threshold * running std.
            window: Span of the running mean and variance, in steps (EMA weight 2 / (window + 1)).
            warmup_steps: Steps observed before any spike is called (the statistics settle first;
                at least 2, for a first variance).
            shift_steps: Spikes in a row taken as a lasting shift of the loss level: the running
                mean restarts at their mean.
        """
        super().__init__(every_n_steps)
        if threshold <= 0:
            raise ValueError(f"LossSpikes.threshold={threshold} must be > 0 (standard deviations)")
        if window < 2:
            raise ValueError(f"LossSpikes.window={window} must be >= 2 steps")
        if warmup_steps < 2:
            raise ValueError(
                f"LossSpikes.warmup_steps={warmup_steps} must be >= 2: with fewer steps seen the running "
                "variance is 0 and the next step would count as a spike"
            )
        if shift_steps < 1:
            raise ValueError(f"LossSpikes.shift_steps={shift_steps} must be >= 1")
        self.shift_steps = shift_steps
        self.threshold = threshold
        self.window = window
        self.warmup_steps = warmup_steps
        self._alpha = 2.0 / (window + 1)
        self._seen = 0  # host count of observed steps
        self._last_step = -1
        self._state: dict[str, torch.Tensor] | None = None

    def meta(self, trainer: Any, pl_module: Any) -> dict[str, Any]:
        return {**super().meta(trainer, pl_module), "threshold": self.threshold, "window": self.window}

    def _init_state(self, device: torch.device) -> dict[str, torch.Tensor]:
        z = lambda: torch.zeros((), device=device)
        return {
            "mean": z(),
            "var": z(),
            "spikes": z(),
            "z_max": z(),
            "total": z(),
            "run": z(),
            "run_sum": z(),
        }

    @torch.no_grad()
    def _observe(self, trainer: Any, outputs: Any) -> None:
        """Update the running statistics with this step's loss, once per step, on the device."""
        step = trainer.global_step
        if step == self._last_step or not trainer.is_global_zero:
            return
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if not isinstance(loss, torch.Tensor):
            return
        self._last_step = step
        # Lightning divides the training loss by the accumulation count before handing it over.
        loss = loss.detach().float() * trainer.accumulate_grad_batches
        if self._state is None:
            self._state = self._init_state(loss.device)
        elif self._state["mean"].device != loss.device:  # resumed from a checkpoint loaded elsewhere
            self._state = {k: v.to(loss.device) for k, v in self._state.items()}
        s = self._state
        # Early on, a plain average (weight 1/n) so the first losses are not over-weighted.
        a = max(self._alpha, 1.0 / (self._seen + 1))
        finite = torch.isfinite(loss)
        std = s["var"].sqrt().clamp_min(1e-8)
        z = torch.where(finite, (loss - s["mean"]) / std, torch.zeros_like(loss))
        if self._seen >= self.warmup_steps:
            spike = z > self.threshold
            s["spikes"] += spike
            s["total"] += spike
            torch.maximum(s["z_max"], z, out=s["z_max"])
            keep = finite & ~spike
            # Spikes in a row: their count and loss sum, reset by any other step.
            s["run"].copy_(torch.where(spike, s["run"] + 1, torch.zeros_like(loss)))
            s["run_sum"].copy_(torch.where(spike, s["run_sum"] + loss, torch.zeros_like(loss)))
        else:
            keep = finite
        d = torch.where(keep, loss - s["mean"], torch.zeros_like(loss))
        s["mean"] += a * d
        # Exponentially weighted variance (West 1979): var <- (1 - a) * (var + a * d^2).
        s["var"].copy_(torch.where(keep, (1 - a) * (s["var"] + a * d * d), s["var"]))
        # A lasting level shift: the mean restarts at the run's mean (the variance, the noise of
        # the loss, is kept), and the run starts over.
        shifted = s["run"] >= self.shift_steps
        s["mean"].copy_(torch.where(shifted, s["run_sum"] / s["run"].clamp_min(1), s["mean"]))
        s["run"].masked_fill_(shifted, 0)
        s["run_sum"].masked_fill_(shifted, 0)
        self._seen += 1

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._observe(trainer, outputs)

    @torch.no_grad()
    def collect(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, step: int, out: StepMetrics
    ) -> None:
        self._observe(trainer, outputs)  # the sink may run before this callback's own hook
        s = self._state
        if s is not None:
            out.add([LOSS_SPIKE, LOSS_Z_MAX, LOSS_EMA], torch.stack([s["spikes"], s["z_max"], s["mean"]]))
            s["spikes"].zero_()
            s["z_max"].zero_()
        out.add([NONFINITE_STEPS], pl_module.nonfinite_total)

    def state_dict(self) -> dict[str, Any]:
        # Tensors as they are (no host copy here); torch.save handles any device.
        return {"seen": self._seen, "state": self._state}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._seen = int(state_dict.get("seen", 0))
        self._state = state_dict.get("state")
        if self._state is not None:  # a checkpoint from before a key existed
            for k, v in self._init_state(self._state["mean"].device).items():
                self._state.setdefault(k, v)
