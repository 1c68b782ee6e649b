"""Dropout of a residual branch's update (the attention and MLP outputs of a block).

``RankerConfig.dropout_mask`` picks the mask:

- ``element``: one Bernoulli draw per element of the [B, T, D] update, the usual Transformer
  dropout (Vaswani et al. 2017, section 5.4). On CPU, eager, the draws come from 8 random bits an
  element (``_bits_dropout``) rather than ``F.dropout``'s one float draw each: at [256, 56, 64] the
  dropout costs 1.6 ms forward and backward on 2 threads, against 2.3 ms with 16 bits and 7.6 ms
  with ``F.dropout`` (2026-12-06). p is then a multiple of 1/256 (0.2 runs as 0.1992). Elsewhere
  (GPU, ``torch.compile``) ``F.dropout``, whose fused kernels draw cheaply.
- ``feature``: one draw per sample and feature, [B, 1, D], shared by every token of the sample:
  the same features of every token's update are dropped together, as variational ("locked")
  dropout shares one mask across an RNN's time steps (Gal & Ghahramani 2016; Merity et al. 2018).
  It draws T times fewer random numbers, but is a different regulariser (docs/levers.md).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

BITS = 8
"""Random bits per element of ``_bits_dropout``'s mask: the kept fraction is a multiple of 2**-8,
within 2**-9 of 1 - p. The random draws are most of the mask's cost, and a draw of 64 bits serves
8 elements."""


def branch_dropout(y_BTD: torch.Tensor, p: float, training: bool, mask: str = "element") -> torch.Tensor:
    """``y_BTD`` with dropout ``p`` in training (kept values scaled by 1 / (1 - p)); unchanged
    otherwise. ``mask``: ``element`` or ``feature`` (the module docstring)."""
    if p == 0 or not training:
        return y_BTD
    if mask == "element":
        if y_BTD.device.type == "cpu" and not torch.compiler.is_compiling():
            return _bits_dropout(y_BTD, p)
        return F.dropout(y_BTD, p, True)
    shape = (y_BTD.shape[0], *([1] * (y_BTD.ndim - 2)), y_BTD.shape[-1])
    keep_B1D = torch.empty(shape, dtype=y_BTD.dtype, device=y_BTD.device).bernoulli_(1.0 - p)
    return y_BTD * (keep_B1D / (1.0 - p))


def _bits_dropout(y: torch.Tensor, p: float) -> torch.Tensor:
    """Per-element dropout from ``BITS`` random bits an element: one 64-bit draw of the global
    generator (so ``torch.manual_seed`` fixes it) gives eight elements' 8-bit uniforms, and an
    element is kept when its uniform is below ``round((1 - p) * 2**8)``. Kept values are scaled by
    the inverse of that exact kept fraction, so the expectation is ``y``'s."""
    n = y.numel()
    levels = 1 << BITS
    kept = max(round((1.0 - p) * levels), 1)
    if kept >= levels:  # p under 2**-9: every element kept (and 2**7 would wrap in int8)
        return y
    per_draw = 64 // BITS
    draws = torch.randint(-(2**63), 2**63 - 1, (-(-n // per_draw),), dtype=torch.int64, device=y.device)
    u8 = draws.view(torch.int8)[:n].view(y.shape)  # uniform on [-2**7, 2**7)
    keep = u8 < kept - levels // 2
    return y * keep.to(y.dtype).mul_(levels / kept)
