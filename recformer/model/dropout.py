"""Dropout of a residual branch's update (the attention and MLP outputs of a block).

``RankerConfig.dropout_mask`` picks the mask:

- ``element``: one Bernoulli draw per element of the [B, T, D] update, the usual Transformer
  dropout (Vaswani et al. 2017, section 5.4). On CPU, eager, the draws come from 16 random bits an
  element (``_bits_dropout``) rather than ``F.dropout``'s one float draw each: at [256, 56, 64] the
  mask costs 1.2 ms instead of about 7 ms forward and backward on 2 threads, and the default trains
  with dropout 0.2 on its residual branches at 0.90x its rate instead of 0.83x
  (``bench/bench_throughput.py``, 2026-12-06). Elsewhere (GPU, ``torch.compile``) ``F.dropout``,
  whose fused kernels draw cheaply.
- ``feature``: one draw per sample and feature, [B, 1, D], shared by every token of the sample:
  the same features of every token's update are dropped together, as variational ("locked")
  dropout shares one mask across an RNN's time steps (Gal & Ghahramani 2016; Merity et al. 2018).
  It draws T times fewer random numbers, but is a different regulariser (docs/levers.md).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

BITS = 16
"""Random bits per element of ``_bits_dropout``'s mask: the kept fraction is a multiple of 2**-16,
within 2**-17 of 1 - p."""


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
    generator (so ``torch.manual_seed`` fixes it) gives four elements' 16-bit uniforms, and an
    element is kept when its uniform is below ``round((1 - p) * 2**16)``. Kept values are scaled by
    the inverse of that exact kept fraction, so the expectation is ``y``'s."""
    n = y.numel()
    levels = 1 << BITS
    kept = max(round((1.0 - p) * levels), 1)
    if kept >= levels:  # p under 2**-17: every element kept (and 2**15 would wrap in int16)
        return y
    draws = torch.randint(-(2**63), 2**63 - 1, (-(-n // 4),), dtype=torch.int64, device=y.device)
    u16 = draws.view(torch.int16)[:n].view(y.shape)  # uniform on [-2**15, 2**15)
    keep = u16 < kept - levels // 2
    return y * (keep.to(y.dtype) * (levels / kept))
