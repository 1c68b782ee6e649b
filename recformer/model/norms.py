"""Normalisation layers: RMSNorm, LayerNorm, and the QK-Norm applied to queries and keys.

Shape legend: ``B`` batch, ``T`` tokens, ``D`` model width, ``N`` heads, ``H`` head width.

Both norms go through the fused functional kernels (``F.rms_norm``, ``F.layer_norm``). The gain is
cast to the input dtype first: ``F.rms_norm`` with bf16 input and an fp32 weight falls off the fused
kernel in eager mode (1.6x slower step, DESIGN section 8), and the kernel accumulates in fp32 anyway.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

NORM_EPS = 1e-6
"""Epsilon inside the square root of every norm; small enough to be invisible at init scales."""


class RMSNorm(nn.Module):
    """``x / sqrt(mean(x^2) + eps) * g * scale`` over the last dimension (Zhang & Sennrich 2019).

    ``scale`` is a constant, not a parameter: LayerNorm Scaling sets it to 1/sqrt(layer index)
    (Sun et al. 2025, "The Curse of Depth in LLMs") so deep pre-norm blocks stop idling.
    """

    def __init__(self, dim: int, scale: float = 1.0) -> None:
        super().__init__()
        self.dim = dim
        self.scale = scale
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.rms_norm(x, (self.dim,), self.weight.to(x.dtype), NORM_EPS)
        return y * self.scale if self.scale != 1.0 else y

    def extra_repr(self) -> str:
        return f"{self.dim}, scale={self.scale:.4g}"


class LayerNorm(nn.Module):
    """``((x - mean) / sqrt(var + eps) * g + b) * scale`` over the last dimension (Ba et al. 2016).

    The whole output, bias included, is multiplied by ``scale`` (LayerNorm Scaling, see RMSNorm).
    ``bias=False`` gives the gain-only variant used for QK-Norm.
    """

    def __init__(self, dim: int, scale: float = 1.0, bias: bool = True) -> None:
        super().__init__()
        self.dim = dim
        self.scale = scale
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = None if self.bias is None else self.bias.to(x.dtype)
        y = F.layer_norm(x, (self.dim,), self.weight.to(x.dtype), b, NORM_EPS)
        return y * self.scale if self.scale != 1.0 else y

    def extra_repr(self) -> str:
        return f"{self.dim}, scale={self.scale:.4g}, bias={self.bias is not None}"


def make_norm(kind: str, dim: int, scale: float = 1.0) -> nn.Module:
    """The norm named by ``RankerConfig.norm`` ("rms" or "layer")."""
    if kind == "rms":
        return RMSNorm(dim, scale)
    if kind == "layer":
        return LayerNorm(dim, scale)
    raise ValueError(f"RankerConfig.norm={kind!r}; expected 'rms' or 'layer'")


def layer_scale(layer: int, enabled: bool) -> float:
    """LayerNorm Scaling factor of block ``layer`` (0-based): 1/sqrt(layer + 1), or 1 when off."""
    return 1.0 / math.sqrt(layer + 1) if enabled else 1.0


class QKNorm(nn.Module):
    """Normalise queries and keys before the dot product (Dehghani et al. 2023, ViT-22B; OLMo 2).

    A normalised H-vector has norm sqrt(H), so ``|q . k| <= H * max|g_q| * max|g_k|``
    (Cauchy-Schwarz): the attention logits stay bounded however large the q/k projection weights
    grow, and the softmax cannot collapse to one-hot just because weights drifted. The gains stay
    learnable so the model can still sharpen its attention on purpose.

    ``kind`` follows ``RankerConfig.norm``: RMSNorm (OLMo 2, Qwen3) or gain-only LayerNorm (ViT-22B).
    ``mode="head"`` normalises each head's H-vector (one gain of size H shared by all heads);
    ``mode="full"`` normalises the whole D-wide query / key before the head split (OLMo 2).
    """

    def __init__(self, mode: str, kind: str, d_model: int, d_head: int) -> None:
        super().__init__()
        if mode not in ("head", "full"):
            raise ValueError(f"RankerConfig.qk_norm={mode!r}; expected 'none', 'head' or 'full'")
        self.mode = mode
        width = d_head if mode == "head" else d_model
        if kind == "rms":
            self.q_norm, self.k_norm = RMSNorm(width), RMSNorm(width)
        elif kind == "layer":
            self.q_norm, self.k_norm = LayerNorm(width, bias=False), LayerNorm(width, bias=False)
        else:
            raise ValueError(f"RankerConfig.norm={kind!r}; expected 'rms' or 'layer'")
