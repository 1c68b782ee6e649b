"""Dropout of a residual branch's update (the attention and MLP outputs of a block).

``RankerConfig.dropout_mask`` picks the mask:

- ``element``: one Bernoulli draw per element of the [B, T, D] update (``F.dropout``), the usual
  Transformer dropout (Vaswani et al. 2017, section 5.4);
- ``feature``: one draw per sample and feature, [B, 1, D], shared by every token of the sample:
  the same features of every token's update are dropped together, as variational ("locked")
  dropout shares one mask across an RNN's time steps (Gal & Ghahramani 2016; Merity et al. 2018).
  It draws T times fewer random numbers. On CPU ``F.dropout``'s Bernoulli draws are most of
  dropout's cost: at 0.2 on the residual branches the default trains 15-18% slower with
  ``element`` and no measurably slower with ``feature`` (``bench/bench_throughput.py``,
  2026-12-06; docs/levers.md).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def branch_dropout(y_BTD: torch.Tensor, p: float, training: bool, mask: str = "element") -> torch.Tensor:
    """``y_BTD`` with dropout ``p`` in training (kept values scaled by 1 / (1 - p)); unchanged
    otherwise. ``mask``: ``element`` or ``feature`` (the module docstring)."""
    if p == 0 or not training:
        return y_BTD
    if mask == "element":
        return F.dropout(y_BTD, p, True)
    shape = (y_BTD.shape[0], *([1] * (y_BTD.ndim - 2)), y_BTD.shape[-1])
    keep_B1D = torch.empty(shape, dtype=y_BTD.dtype, device=y_BTD.device).bernoulli_(1.0 - p)
    return y_BTD * (keep_B1D / (1.0 - p))
