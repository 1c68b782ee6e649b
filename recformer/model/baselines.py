"""Baselines run by the same module and CLI as the Transformer (``RankerNet``, ``model/protocol.py``).

- ``popularity``: one learned logit per item plus a global bias: a logistic regression on the item
  id, i.e. the item's (smoothed) positive rate. What a ranker must beat to be worth anything.
- ``din``: Deep Interest Network (Zhou et al., KDD 2018): target attention over the history
  (an MLP scores each event against the target from [h, t, h - t, h * t]; the weights are not
  softmax-normalised, so the pooled vector keeps the intensity of interest), then an MLP over the
  target, the pooled history and the context tokens. It shares the Transformer's tokenizer, so the
  two differ only in what happens after the embeddings.

Shape suffixes: the legend in ``recformer/__init__.py``.
"""

from __future__ import annotations

import dataclasses
import math

import torch
from torch import nn

from recformer.batch import Batch
from recformer.config import FeatureDims, RankerConfig
from recformer.model import flops
from recformer.model.embedding import FeatureTokenizer
from recformer.model.init import init_tokens
from recformer.model.protocol import BlockStats, ParamKind
from recformer.optim import DEFAULT_RULES

OPTIONAL_GROUPS = tuple(dataclasses.replace(r, allow_empty=True) for r in DEFAULT_RULES)
"""The Transformer's group rules, each optional: a baseline may have no hidden matrices
(popularity) or no readout."""


def _log_odds(p: float) -> float:
    return math.log(p / (1.0 - p))


class PopularityRanker(nn.Module):
    """logit = bias + item_logit[target item]."""

    optimizer_rules = OPTIONAL_GROUPS
    n_tokens = 1

    def __init__(self, cfg: RankerConfig, dims: FeatureDims) -> None:
        super().__init__()
        self.cfg, self.dims = cfg, dims
        self.item_logit = nn.Embedding(dims.item_rows, 1)
        nn.init.zeros_(self.item_logit.weight)
        self.bias = nn.Parameter(torch.tensor([_log_odds(cfg.base_rate)]))

    def set_item_tables(self, content: torch.Tensor | None, features: torch.Tensor | None) -> None:
        """Content is not used by this baseline."""

    def transformer_blocks(self) -> tuple[nn.Module, ...]:
        return ()

    def embedding_groups(self) -> dict[str, tuple[nn.Embedding, int, int]]:
        return {}  # one logit per item: no embedding rows to watch

    def param_kinds(self) -> dict[str, ParamKind]:
        return {"item_logit.weight": "embedding", "bias": "vector"}

    def flop_terms(self) -> list[flops.Term]:
        return []  # a table lookup and an add

    def forward(self, batch: Batch) -> torch.Tensor:
        return (self.item_logit(batch.target_item).squeeze(-1) + self.bias).float()

    def forward_stats(self, batch: Batch) -> tuple[torch.Tensor, BlockStats | None]:
        return self(batch), None


class DINRanker(nn.Module):
    optimizer_rules = OPTIONAL_GROUPS

    def __init__(self, cfg: RankerConfig, dims: FeatureDims) -> None:
        super().__init__()
        self.cfg, self.dims = cfg, dims
        if not dims.max_len:
            raise ValueError("arch='din' needs a history (feature spec with a sequence)")
        D = cfg.d_model
        self.tokens = FeatureTokenizer(cfg, dims)
        self.n_context = self.tokens.n_context
        self.max_len = dims.max_len
        self.attn_mlp = nn.Sequential(nn.Linear(4 * D, 2 * D), nn.GELU(), nn.Linear(2 * D, 1))
        hidden = cfg.head_hidden or 2 * D
        # Context tokens except CLS, the pooled history and the target.
        d_in = (self.n_context - 1) * D + 2 * D
        self.mlp = nn.Sequential(
            nn.Linear(d_in, hidden), nn.GELU(), nn.Dropout(cfg.dropout), nn.Linear(hidden, hidden), nn.GELU()
        )
        self.out = nn.Linear(hidden, 1)
        nn.init.zeros_(self.out.weight)  # start at the base rate, like the Transformer's head
        nn.init.constant_(self.out.bias, _log_odds(cfg.base_rate))
        for m in [*self.attn_mlp, *self.mlp]:
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=cfg.init_std)
                nn.init.zeros_(m.bias)
        with torch.no_grad():
            init_tokens(self.tokens, cfg)  # the Transformer's token init, not PyTorch's N(0, 1) tables

    @property
    def n_tokens(self) -> int:
        return self.tokens.n_tokens

    def set_item_tables(self, content: torch.Tensor | None, features: torch.Tensor | None) -> None:
        self.tokens.set_item_tables(content, features)

    def transformer_blocks(self) -> tuple[nn.Module, ...]:
        return ()

    def embedding_groups(self) -> dict[str, tuple[nn.Embedding, int, int]]:
        return self.tokens.embedding_groups()

    def forward_stats(self, batch: Batch) -> tuple[torch.Tensor, BlockStats | None]:
        return self(batch), None

    def param_kinds(self) -> dict[str, ParamKind]:
        kinds = self.tokens.param_kinds("tokens.")
        for name, p in self.named_parameters():
            if name.startswith("tokens."):
                continue
            elif name == "out.weight":
                kinds[name] = "readout"
            else:
                kinds[name] = "vector" if p.ndim == 1 else "hidden"
        return kinds

    def flop_terms(self) -> list[flops.Term]:
        """The attention MLP once per history slot, the MLP and output once per sample, plus the
        tokenizer's input projections."""
        per_sample = flops.matrix_params(self.mlp) + flops.matrix_params(self.out)
        return [
            *self.tokens.flop_terms(),
            flops.Matmul(flops.matrix_params(self.attn_mlp), self.max_len),
            flops.Matmul(per_sample, 1),
        ]

    def forward(self, batch: Batch) -> torch.Tensor:
        x_BTD, _ = self.tokens(batch)
        B, _, D = x_BTD.shape
        ctx_BTD = x_BTD[:, 1 : self.n_context]
        hist_BLD = x_BTD[:, self.n_context : self.n_context + self.max_len]
        tgt_BD = x_BTD[:, -1]
        t_BLD = tgt_BD[:, None, :].expand_as(hist_BLD)
        score_BL = self.attn_mlp(
            torch.cat([hist_BLD, t_BLD, hist_BLD - t_BLD, hist_BLD * t_BLD], -1)
        ).squeeze(-1)
        score_BL = score_BL * batch.hist_mask  # padded events contribute nothing
        pooled_BD = (score_BL[:, :, None] * hist_BLD).sum(1)
        h = self.mlp(torch.cat([ctx_BTD.reshape(B, -1), pooled_BD, tgt_BD], -1))
        return self.out(h).squeeze(-1).float()
