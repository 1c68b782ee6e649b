"""Gradient, update, weight and Adam-state statistics from the optimizer hooks, on log steps only.

Per block ``i`` of the ranker's ``transformer_blocks()`` (0 = bottom), DESIGN section 6:

- ``health/grad_norm/block_{i}``: L2 norm of all the block's gradients, read in
  ``on_before_optimizer_step``: after backward (under DDP already all-reduced, so every rank holds
  the same value and nothing is reduced again) and before clipping, so it is the raw gradient.
  ``health/grad_ratio_bottom_top`` = block 0 / last block: far below 0.1 under Post-Norm means the
  bottom layers are starved (Xiong et al. 2020, "On Layer Normalization in the Transformer").
- ``health/update_ratio/block_{i}``: ||dW|| / ||W|| of the step actually taken (weight decay, LR
  schedule, clipping and a skipped non-finite step included), over the block's matrices: the
  matrices are copied before the step and compared after it. ~1e-3 is healthy (Karpathy's
  "update/data ratio"); far below 1e-4 does not learn, far above 1e-2 is unstable.
- ``health/weight_norm/block_{i}``: L2 norm of the block's matrices (the ones weight decay acts on).
- ``health/adam_v/{group}``: sqrt of the mean bias-corrected Adam second moment over an optimizer
  group ("hidden", "embedding", ...): the gradient RMS Adam divides by. It jumps after a loss spike
  and decays over ~1 / (1 - beta2) steps; until it does, that group's updates stay small.

All norms are ``torch._foreach_norm`` over lists (one kernel per dtype/device), kept on the device
and handed to the sink, which makes the one host copy of the step. On other steps the hooks return
after one integer comparison. Models without blocks (the baselines) get only ``adam_v``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from recformer.callbacks.gate import step_in_progress
from recformer.callbacks.sink import MetricSource, StepMetrics
from recformer.metric_names import ADAM_V, GRAD_NORM, GRAD_RATIO_BOTTOM_TOP, UPDATE_RATIO, WEIGHT_NORM


def _segment_norms(norms: list[torch.Tensor], segment: torch.Tensor, n: int) -> torch.Tensor:
    """Combine per-tensor L2 norms into per-segment L2 norms: sqrt(sum of squares) per block."""
    sq = torch.stack(norms).float().square()
    return torch.zeros(n, device=sq.device).index_add_(0, segment.to(sq.device), sq).sqrt()


class OptimizerHealth(MetricSource):
    def __init__(self, every_n_steps: int | None = None, update_ratio: bool = True) -> None:
        """
        Args:
            every_n_steps: Cadence in optimizer steps; None = ``trainer.log_every_n_steps``, 0 = off.
            update_ratio: Measure ||dW||/||W|| (copies the block matrices before the step, on log
                steps only).
        """
        super().__init__(every_n_steps)
        self.update_ratio = update_ratio
        self._blocks: list[nn.Module] = []
        self._pending_step = -1
        self._grad_norms: torch.Tensor | None = None
        self._before: list[torch.Tensor] | None = None

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        self._blocks = list(pl_module.ranker.transformer_blocks())
        # Parameter lists and block ids are built once; the hooks only index into them.
        self._params = [p for b in self._blocks for p in b.parameters()]
        self._param_block = [i for i, b in enumerate(self._blocks) for _ in b.parameters()]
        self._mats = [p for b in self._blocks for p in b.parameters() if p.ndim >= 2]
        self._mat_block = torch.tensor(
            [i for i, b in enumerate(self._blocks) for p in b.parameters() if p.ndim >= 2], dtype=torch.long
        )

    def meta(self, trainer: Any, pl_module: Any) -> dict[str, Any]:
        groups = []
        for opt in trainer.optimizers:
            for i, g in enumerate(opt.param_groups):
                groups.append({"name": g.get("name", str(i)), "betas": list(g.get("betas", ()))})
        return {**super().meta(trainer, pl_module), "n_blocks": len(self._blocks), "groups": groups}

    @torch.no_grad()
    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        step = step_in_progress(trainer)
        if not self._blocks or not self.due(trainer, step):
            return
        self._pending_step = step
        grads = [(p.grad, i) for p, i in zip(self._params, self._param_block) if p.grad is not None]
        n = len(self._blocks)
        if grads:
            norms = torch._foreach_norm([g for g, _ in grads])
            segment = torch.tensor([i for _, i in grads], dtype=torch.long)
            self._grad_norms = _segment_norms(norms, segment, n)
        else:  # every block frozen
            self._grad_norms = torch.zeros(n, device=self._mats[0].device if self._mats else "cpu")
        if self.update_ratio and self._mats:
            self._before = torch._foreach_mul([p.detach() for p in self._mats], 1.0)  # a copy

    @torch.no_grad()
    def collect(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, step: int, out: StepMetrics
    ) -> None:
        n = len(self._blocks)
        if n and self._pending_step == step and self._grad_norms is not None:
            g = self._grad_norms
            out.add([GRAD_NORM.format(i=i) for i in range(n)], g)
            out.add([GRAD_RATIO_BOTTOM_TOP], g[0] / g[-1].clamp_min(1e-30))
        if self._mats:
            weights = torch._foreach_norm([p.detach() for p in self._mats])
            w_norm = _segment_norms(weights, self._mat_block, n)
            out.add([WEIGHT_NORM.format(i=i) for i in range(n)], w_norm)
            if self._before is not None and self._pending_step == step:
                delta = torch._foreach_sub([p.detach() for p in self._mats], self._before)
                d_norm = _segment_norms(torch._foreach_norm(delta), self._mat_block, n)
                w_before = _segment_norms(torch._foreach_norm(self._before), self._mat_block, n)
                out.add([UPDATE_RATIO.format(i=i) for i in range(n)], d_norm / w_before.clamp_min(1e-30))
        self._before = None
        self._grad_norms = None
        self._add_adam_v(trainer, step, out)

    def _add_adam_v(self, trainer: Any, step: int, out: StepMetrics) -> None:
        names, values = [], []
        for opt in trainer.optimizers:
            for gi, group in enumerate(opt.param_groups):
                vs = [
                    opt.state[p]["exp_avg_sq"]
                    for p in group["params"]
                    if "exp_avg_sq" in opt.state.get(p, {})
                ]
                if not vs:
                    continue
                numel = sum(v.numel() for v in vs)
                total = torch.stack(torch._foreach_norm(vs, 1)).float().sum()  # v >= 0: L1 norm = sum
                beta2 = group.get("betas", (0.9, 0.999))[1]
                # Bias correction with the optimizer steps taken (host int: no sync). A skipped
                # non-finite step makes it slightly off for a few steps, never by more than 1/step.
                correction = 1.0 - beta2 ** max(step, 1)
                names.append(ADAM_V.format(group=group.get("name", str(gi))))
                values.append((total / (numel * correction)).sqrt())
        if names:
            out.add(names, torch.stack([v.to(values[0].device) for v in values]))
