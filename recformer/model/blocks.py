"""Transformer blocks: the MLP and one small class per norm placement (DESIGN section 4).

Shape suffixes: the legend in ``recformer/__init__.py``.

Every block is attention + MLP, each a residual branch ``f``. The placements differ only in where
the norms sit, so each class writes its two lines, ``residual``, once; ``forward`` (training) and
``forward_stats`` (the eager stats path) run those same lines with their own attention branch:

=============  ==========================================  =========================================
placement      branch update                               why / source
=============  ==========================================  =========================================
``post``       x = Norm(x + f(x))                          original Transformer; starves the bottom
                                                           layers of gradient when deep
``pre``        x = x + f(Norm(x))                          GPT-2; stable, but deep layers idle
``sandwich``   x = x + Norm(f(Norm(x)))                    CogView (Ding et al. 2021); bounds f
``reordered``  x = x + Norm(f(x))                          OLMo 2 (2025); norm on the branch output
``deepnorm``   x = Norm(alpha * x + f(x))                  DeepNet (Wang et al. 2022)
=============  ==========================================  =========================================

With ``layernorm_scaling`` every norm of block ``l`` (1-based) multiplies its output by 1/sqrt(l)
(Sun et al. 2025, "The Curse of Depth"), which damps the variance growth of deep pre-norm stacks.

``keep`` (a slice of token positions) makes a block update only those rows: attention still reads
keys and values from every token, but queries, the output projection and the MLP run on the kept
rows alone. The ranker's last block uses it for the tokens its head reads. In ``residual``, ``attn``
maps the (normalised) stream to the attention update of the kept rows, ``mlp`` maps the kept rows
to their MLP update and ``rows`` selects them.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from recformer.config import RankerConfig
from recformer.model.attention import Attention, AttentionStats
from recformer.model.dropout import branch_dropout
from recformer.model.norms import layer_scale, make_norm
from recformer.model.token_params import TokenLayout, specific_weight, token_linear


def mlp_hidden(cfg: RankerConfig) -> int:
    """MLP hidden width M: mlp_ratio * D for GELU and ReLU; 2/3 of that for SwiGLU, rounded up to 8, so both
    have the same parameter count (Shazeer 2020)."""
    hidden = cfg.mlp_ratio * cfg.d_model
    if cfg.mlp == "swiglu":
        return 8 * math.ceil(hidden * 2 / 3 / 8)
    return max(1, round(hidden))


Branch = Callable[[torch.Tensor], torch.Tensor]
"""A residual branch or row selection as ``residual`` receives it."""


def rows(x_BTD: torch.Tensor, keep: slice | None) -> torch.Tensor:
    """The residual rows a block updates: all tokens, or the ``keep`` slice (the last block only
    needs the tokens the head reads; the others' outputs would be computed and thrown away)."""
    return x_BTD if keep is None else x_BTD[:, keep]


class MLP(nn.Module):
    """``down(act(up(x)))``: GELU, ReLU, or SwiGLU with ``up`` holding the gate rows then the value rows.
    With a ``layout`` the non-sequence tokens use their own ``up_specific`` and ``down_specific``."""

    def __init__(self, cfg: RankerConfig, layout: TokenLayout | None = None) -> None:
        super().__init__()
        self.kind = cfg.mlp
        self.hidden = mlp_hidden(cfg)
        self.layout = layout
        n_up = 2 * self.hidden if cfg.mlp == "swiglu" else self.hidden
        self.up = nn.Linear(cfg.d_model, n_up, bias=False)
        self.down = nn.Linear(self.hidden, cfg.d_model, bias=False)
        self.up_specific = specific_weight(layout, self.up)
        self.down_specific = specific_weight(layout, self.down)
        self.dropout = cfg.dropout
        self.dropout_mask = cfg.dropout_mask

    def forward(self, x_BTD: torch.Tensor, keep: slice | None = None) -> torch.Tensor:
        """``x_BTD``: every token, or the rows ``keep`` selects."""
        u_BTX = token_linear(x_BTD, self.up.weight, self.up_specific, self.layout, keep)
        if self.kind == "swiglu":
            gate_BTM, value_BTM = u_BTX.split(self.hidden, dim=-1)
            h_BTM = F.silu(gate_BTM) * value_BTM
        elif self.kind == "relu":
            h_BTM = F.relu(u_BTX)
        else:
            h_BTM = F.gelu(u_BTX)
        y_BTD = token_linear(h_BTM, self.down.weight, self.down_specific, self.layout, keep)
        return branch_dropout(y_BTD, self.dropout, self.training, self.dropout_mask)


class Block(nn.Module):
    """Attention and MLP sublayers plus two norms (``attn_norm``, ``mlp_norm``); subclasses place them.

    ``layer`` is the 0-based block index (init policies and LayerNorm Scaling depend on it).
    """

    placement = ""

    def __init__(self, cfg: RankerConfig, layer: int, layout: TokenLayout | None = None) -> None:
        super().__init__()
        self.layer = layer
        scale = layer_scale(layer, cfg.layernorm_scaling)
        self.attn = Attention(cfg, layout)
        self.mlp = MLP(cfg, layout)
        self.attn_norm = make_norm(cfg.norm, cfg.d_model, scale)
        self.mlp_norm = make_norm(cfg.norm, cfg.d_model, scale)

    def forward(
        self, x_BTD: torch.Tensor, attend_B11T: torch.Tensor | None, keep: slice | None = None
    ) -> torch.Tensor:
        """New residual stream [B, T, D], or only the rows ``keep`` selects ([B, Q, D])."""
        return self.residual(
            x_BTD,
            lambda h_BTD: self.attn(h_BTD, attend_B11T, keep),
            lambda h_BQD: self.mlp(h_BQD, keep),
            lambda t: rows(t, keep),
        )

    def forward_stats(
        self, x_BTD: torch.Tensor, attend_B11T: torch.Tensor | None
    ) -> tuple[torch.Tensor, AttentionStats]:
        """``forward`` over every token, attention formed explicitly: the stream and its statistics."""
        found: list[AttentionStats] = []

        def attn(h_BTD: torch.Tensor) -> torch.Tensor:
            y_BTD, stats = self.attn.explicit(h_BTD, attend_B11T)
            found.append(stats)
            return y_BTD

        return self.residual(x_BTD, attn, self.mlp, lambda t: t), found[0]

    def residual(self, x_BTD: torch.Tensor, attn: Branch, mlp: Branch, rows: Branch) -> torch.Tensor:
        """The placement: the block's two residual updates, in two lines."""
        raise NotImplementedError(f"{type(self).__name__} must define residual")


class PostNormBlock(Block):
    """x = Norm(x + f(x)) (Vaswani et al. 2017)."""

    placement = "post"

    def residual(self, x_BTD: torch.Tensor, attn: Branch, mlp: Branch, rows: Branch) -> torch.Tensor:
        h_BQD = self.attn_norm(rows(x_BTD) + attn(x_BTD))
        return self.mlp_norm(h_BQD + mlp(h_BQD))


class PreNormBlock(Block):
    """x = x + f(Norm(x)) (GPT-2; Xiong et al. 2020)."""

    placement = "pre"

    def residual(self, x_BTD: torch.Tensor, attn: Branch, mlp: Branch, rows: Branch) -> torch.Tensor:
        h_BQD = rows(x_BTD) + attn(self.attn_norm(x_BTD))
        return h_BQD + mlp(self.mlp_norm(h_BQD))


class SandwichNormBlock(Block):
    """x = x + Norm(f(Norm(x))) (Ding et al. 2021, CogView): two more norms on the branch outputs."""

    placement = "sandwich"

    def __init__(self, cfg: RankerConfig, layer: int, layout: TokenLayout | None = None) -> None:
        super().__init__(cfg, layer, layout)
        scale = layer_scale(layer, cfg.layernorm_scaling)
        self.attn_out_norm = make_norm(cfg.norm, cfg.d_model, scale)
        self.mlp_out_norm = make_norm(cfg.norm, cfg.d_model, scale)

    def residual(self, x_BTD: torch.Tensor, attn: Branch, mlp: Branch, rows: Branch) -> torch.Tensor:
        h_BQD = rows(x_BTD) + self.attn_out_norm(attn(self.attn_norm(x_BTD)))
        return h_BQD + self.mlp_out_norm(mlp(self.mlp_norm(h_BQD)))


class ReorderedNormBlock(Block):
    """x = x + Norm(f(x)) (OLMo 2, Team OLMo 2025): the stream is never normalised in place."""

    placement = "reordered"

    def residual(self, x_BTD: torch.Tensor, attn: Branch, mlp: Branch, rows: Branch) -> torch.Tensor:
        h_BQD = rows(x_BTD) + self.attn_norm(attn(x_BTD))
        return h_BQD + self.mlp_norm(mlp(h_BQD))


def deepnorm_alpha(n_layers: int) -> float:
    """DeepNet residual up-weighting for an encoder-only stack: alpha = (2L)^(1/4) (Wang et al. 2022)."""
    return (2 * n_layers) ** 0.25


def deepnorm_beta(n_layers: int) -> float:
    """DeepNet init gain of the v / out / MLP weights for an encoder-only stack: beta = (8L)^(-1/4)."""
    return (8 * n_layers) ** -0.25


class DeepNormBlock(Block):
    """x = Norm(alpha * x + f(x)): post-norm with the residual up-weighted by alpha so that, with the
    beta-scaled init (``init='deepnorm'``), each update is bounded by O(1/L) (DeepNet, Wang et al. 2022)."""

    placement = "deepnorm"

    def __init__(self, cfg: RankerConfig, layer: int, layout: TokenLayout | None = None) -> None:
        super().__init__(cfg, layer, layout)
        self.alpha = deepnorm_alpha(cfg.n_layers)

    def residual(self, x_BTD: torch.Tensor, attn: Branch, mlp: Branch, rows: Branch) -> torch.Tensor:
        h_BQD = self.attn_norm(self.alpha * rows(x_BTD) + attn(x_BTD))
        return self.mlp_norm(self.alpha * h_BQD + mlp(h_BQD))


BLOCKS: dict[str, type[Block]] = {
    cls.placement: cls
    for cls in (PostNormBlock, PreNormBlock, SandwichNormBlock, ReorderedNormBlock, DeepNormBlock)
}
"""Block class per ``RankerConfig.norm_placement``."""

NORMALISED_STREAM = {"post", "deepnorm"}
"""Placements whose block output is already a norm output (the ranker adds no final norm)."""


def make_block(cfg: RankerConfig, layer: int, layout: TokenLayout | None = None) -> Block:
    """Block ``layer`` of ``cfg``'s placement; ``layout``: where the non-sequence tokens sit when
    they have their own weights (``token_params: specific``), else None."""
    if cfg.norm_placement not in BLOCKS:
        raise ValueError(
            f"RankerConfig.norm_placement={cfg.norm_placement!r}; expected one of {sorted(BLOCKS)}"
        )
    return BLOCKS[cfg.norm_placement](cfg, layer, layout)
