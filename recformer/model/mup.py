"""muP (Yang et al. 2022, "Tensor Programs V"): every width rule, behind one switch,
``RankerConfig.mup``.

With ``m = d_model / base_d_model`` (``RankerConfig.width_mult``) and muP on:

=====================  ===========================================================================
where                  rule (Table 3 of the paper, Adam column; the ``mup`` package's MuAdam)
=====================  ===========================================================================
hidden matrices        init std / sqrt(m) (fan-in scaling), Adam LR / m
attention logits       scale 1/H instead of 1/sqrt(H): trained q and k correlate, so q . k grows
                       like H (section 4)
readout                its input multiplied by 1/m (``MuReadout``); Adam LR constant
embeddings, input      init and LR constant in width
projections, vectors
=====================  ===========================================================================

The rest of the code asks these functions; nothing else branches on ``cfg.mup``. The coordinate
check that shows the rules hold is ``recformer.model.coord_check``.
"""

from __future__ import annotations

import math

from recformer.config import RankerConfig


def attention_scale(cfg: RankerConfig) -> float:
    """Logit scale: 1/sqrt(H) (Vaswani et al. 2017), or 1/H under muP."""
    return 1.0 / cfg.d_head if cfg.mup else 1.0 / math.sqrt(cfg.d_head)


def readout_multiplier(cfg: RankerConfig) -> float:
    """What the head's readout input is multiplied by: 1/m under muP, else 1."""
    return 1.0 / cfg.width_mult if cfg.mup else 1.0


def hidden_init_multiplier(cfg: RankerConfig) -> float:
    """Factor on the init std of every hidden matrix (width x width): 1/sqrt(m) under muP."""
    return 1.0 / math.sqrt(cfg.width_mult) if cfg.mup else 1.0


def hidden_lr_multiplier(cfg: RankerConfig) -> float:
    """Factor on the Adam LR of the hidden matrices: 1/m under muP."""
    return 1.0 / cfg.width_mult if cfg.mup else 1.0
