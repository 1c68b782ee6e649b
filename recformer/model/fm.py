"""Factorisation-machine interactions over the tokenizer's fields (Rendle 2010), as DeepFM's FM
component computes them (Guo et al. 2017): shared by ``DeepFMRanker`` and the Transformer's
``fm`` option.

The fields are the tokenizer's context tokens (not CLS), the history pooled over its valid events
when there is one, and the target item token. The history's pooling is the mean (as FuxiCTR and
TorchRec pool a sequence feature) or, given an attention unit, DIN's target attention
(``target_pool``). Their pairwise inner products are explicit second-order crosses: user id x target item,
pooled history x target item (item-item collaborative filtering), genre x history, ...

Shape suffixes: the legend in ``recformer/__init__.py``.
"""

from __future__ import annotations

import torch
from torch import nn

from recformer.model.embedding import FeatureTokenizer


def n_fields(tokens: FeatureTokenizer, history: int = 1) -> int:
    """Fields per sample: the context tokens but CLS, the ``history`` pooled history fields (if there
    is a history), the target."""
    return tokens.n_context - 1 + (history if tokens.max_len else 0) + 1


def fields(
    tokens: FeatureTokenizer,
    x_BTD: torch.Tensor,
    hist_mask_BL: torch.Tensor,
    unit: nn.Module | None = None,
    history: bool = True,
    gate_BL: torch.Tensor | None = None,
    with_mean: bool = False,
    events_BLD: torch.Tensor | None = None,
) -> torch.Tensor:
    """[B, n_fields, D] from the tokenizer's output ``x_BTD`` (its layout: ``FeatureTokenizer``);
    the history pooled by ``target_pool`` with ``unit`` when given (after its mean, two fields,
    ``with_mean``), by ``gated_means`` with the events' weights ``gate_BL`` when given (two
    fields), else its mean; no history field without ``history``. ``events_BLD``: what is pooled
    instead of the history's tokens (``Ranker``'s ``history_pool: items``)."""
    n_context, L = tokens.n_context, tokens.max_len
    parts = [x_BTD[:, 1:n_context]]
    if L and history:
        hist_BLD = x_BTD[:, n_context : n_context + L] if events_BLD is None else events_BLD
        if gate_BL is not None:
            parts.append(gated_means(hist_BLD, gate_BL, hist_mask_BL))
        elif unit is not None:
            if with_mean:
                parts.append(masked_mean(hist_BLD, hist_mask_BL).unsqueeze(1))
            parts.append(target_pool(unit, hist_BLD, x_BTD[:, -1], hist_mask_BL).unsqueeze(1))
        else:
            parts.append(masked_mean(hist_BLD, hist_mask_BL).unsqueeze(1))
    return torch.cat([*parts, x_BTD[:, -1:]], dim=1)


def masked_mean(x_BLD: torch.Tensor, mask_BL: torch.Tensor) -> torch.Tensor:
    """[B, D]: the mean of ``x_BLD`` over the L slots ``mask_BL`` marks valid; 0 where none is."""
    m_BL1 = mask_BL.unsqueeze(-1).to(x_BLD.dtype)
    return (x_BLD * m_BL1).sum(1) / m_BL1.sum(1).clamp_min(1)


def gated_means(hist_BLD: torch.Tensor, gate_BL: torch.Tensor, mask_BL: torch.Tensor) -> torch.Tensor:
    """[B, 2, D]: the valid events' mean weighted by ``gate_BL`` (in [0, 1]) and their mean weighted
    by ``1 - gate_BL``; 0 where a sample has no weight. With the gate a learned function of each
    event's rating, what the user liked and what they did not, two fields where one mean mixes
    them (a cross of the liked mean with the target is item-to-item collaborative filtering)."""
    m_BL, gate_BL = mask_BL.to(hist_BLD.dtype), gate_BL.to(hist_BLD.dtype)
    w_B2L = torch.stack([gate_BL * m_BL, (1 - gate_BL) * m_BL], dim=1)
    return (w_B2L @ hist_BLD) / w_B2L.sum(-1, keepdim=True).clamp_min(1e-6)


def attention_unit(d: int, hidden: int = 0) -> nn.Sequential:
    """DIN's activation unit (Zhou et al. 2018, section 4.3): an MLP from an event's and the
    target's embeddings, [h, t, h - t, h * t], to the event's weight; ``hidden`` wide (0: 2 d)."""
    hidden = hidden or 2 * d
    return nn.Sequential(nn.Linear(4 * d, hidden), nn.GELU(), nn.Linear(hidden, 1))


def target_pool(
    unit: nn.Module, hist_BLD: torch.Tensor, tgt_BD: torch.Tensor, hist_mask_BL: torch.Tensor
) -> torch.Tensor:
    """DIN's user interest [B, D]: the valid events' embeddings weighted by ``unit`` given the
    target, summed. No softmax: DIN keeps the weights' sum, the intensity of the user's interest
    in the target (Zhou et al. 2018, section 4.3)."""
    t_BLD = tgt_BD[:, None, :].expand_as(hist_BLD)
    score_BL = unit(torch.cat([hist_BLD, t_BLD, hist_BLD - t_BLD, hist_BLD * t_BLD], -1)).squeeze(-1)
    score_BL = score_BL * hist_mask_BL  # padded events contribute nothing
    return (score_BL[:, :, None] * hist_BLD).sum(1)


def pairwise(v_BFD: torch.Tensor) -> torch.Tensor:
    """sum over field pairs i < j of <v_i, v_j>, [B]: ((sum_i v_i)^2 - sum_i v_i^2) / 2 summed over
    the embedding dimension, O(F D) instead of O(F^2 D) (Rendle 2010, lemma 3.1)."""
    return 0.5 * (v_BFD.sum(1).square() - v_BFD.square().sum(1)).sum(-1)
