"""Token-specific weights for the non-sequence tokens (``RankerConfig.token_params: specific``).

Shape suffixes: the legend in ``recformer/__init__.py``; S is the number of non-sequence tokens.

OneTrans (Zhang et al. 2025, "OneTrans: Unified Feature Interaction and Sequence Modeling with One
Transformer in Industrial Recommender") gives each non-sequence token (a user, context or target
feature) its own query / key / value and FFN weights, while the sequence tokens (history events)
share one set: a feature token is a field of its own rather than one more position of a sequence,
and a matrix shared with the events has to serve both. Here each block's ``qkv``,
``out`` (the attention's output projection, made specific too), MLP ``up`` and ``down`` keep their
shared ``nn.Linear`` for the history events and add one ``[S, out, in]`` tensor for the S
non-sequence tokens; every token still runs one matrix of the same shape, so the FLOPs per sample
are the shared model's (``flops.matrix_params``).

The tokenizer (``model/embedding.py``) puts the non-sequence tokens at both ends: CLS and the
context features first (``front``), the target (and, with ``content_tokens: target``, its content
token) last (``back``), the history events (and, with ``content_tokens: all``, their content tokens)
between them. ``TokenLayout`` holds those counts; ``token_linear`` applies the right matrix to each row.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class TokenLayout:
    """Where the non-sequence tokens sit: the first ``front`` and the last ``back`` of ``n_tokens``."""

    front: int
    back: int
    n_tokens: int

    def __post_init__(self) -> None:
        if self.front < 1 or self.back < 1 or self.front + self.back > self.n_tokens:
            raise ValueError(
                f"TokenLayout(front={self.front}, back={self.back}, n_tokens={self.n_tokens}): "
                "expected CLS in front, the target at the back and front + back <= n_tokens"
            )

    @property
    def n_specific(self) -> int:
        """S: the non-sequence tokens, each with its own matrices."""
        return self.front + self.back

    def specific_rows(self, keep: slice) -> slice | torch.Tensor:
        """The rows of a ``[S, out, in]`` tensor for the token positions ``keep`` selects, which must
        all be non-sequence tokens (the head reads CLS and the target)."""
        positions = range(self.n_tokens)[keep]
        first_back = self.n_tokens - self.back
        if any(self.front <= p < first_back for p in positions):
            raise ValueError(
                f"keep={keep} selects a sequence token (positions {self.front}..{first_back - 1}); "
                "token-specific weights serve only the non-sequence tokens"
            )
        rows = [p if p < self.front else p - first_back + self.front for p in positions]
        step = rows[1] - rows[0] if len(rows) > 1 else 1
        if step > 0 and rows == list(range(rows[0], rows[-1] + 1, step)):
            return slice(rows[0], rows[-1] + 1, step)
        return torch.tensor(rows)


def specific_weight(layout: TokenLayout | None, linear: nn.Linear) -> nn.Parameter | None:
    """A ``[S, out, in]`` tensor beside ``linear`` for the non-sequence tokens, or None without a
    layout (``init_weights`` fills it as it fills ``linear``)."""
    if layout is None:
        return None
    return nn.Parameter(torch.empty(layout.n_specific, linear.out_features, linear.in_features))


def _per_token(x_BSI: torch.Tensor, w_SOI: torch.Tensor) -> torch.Tensor:
    return torch.einsum("bsi,soi->bso", x_BSI, w_SOI)


def token_linear(
    x_BQI: torch.Tensor,
    weight_OI: torch.Tensor,
    specific_SOI: torch.Tensor | None,
    layout: TokenLayout | None,
    keep: slice | None = None,
) -> torch.Tensor:
    """``x @ weight.T`` for the sequence tokens and each non-sequence token's own matrix for it.

    ``x_BQI`` holds every token (``keep`` None) or the rows ``keep`` selects. Without specific
    weights it is ``F.linear``, whatever the layout."""
    if specific_SOI is None or layout is None:
        return F.linear(x_BQI, weight_OI)
    if keep is not None:
        return _per_token(x_BQI, specific_SOI[layout.specific_rows(keep)])
    front, first_back = layout.front, layout.n_tokens - layout.back
    return torch.cat(
        [
            _per_token(x_BQI[:, :front], specific_SOI[:front]),
            F.linear(x_BQI[:, front:first_back], weight_OI),
            _per_token(x_BQI[:, first_back:], specific_SOI[front:]),
        ],
        dim=1,
    )
