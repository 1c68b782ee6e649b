"""What the LightningModule, the callbacks, the optimizer and the benches need from a model.

``RankerNet`` is implemented by the Transformer ranker (``model/ranker.py``) and every baseline
(``model/baselines.py``). Nothing outside ``model/`` reaches into a model's attributes: it asks
through these members. Shape suffixes: the legend in ``recformer/__init__.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

import torch
from torch import nn

if TYPE_CHECKING:
    from recformer.batch import Batch
    from recformer.config import FeatureDims, RankerConfig
    from recformer.model.flops import Term
    from recformer.optim import GroupRule

ParamKind = Literal["hidden", "input", "table", "embedding", "vector", "readout"]
"""A parameter's optimizer / muP category (``recformer.optim``, ``recformer.model.mup``)."""


@dataclass
class BlockStats:
    """Statistics of a forward pass through the blocks, detached, for the health callbacks and the
    coordinate check (``RankerNet.forward_stats``)."""

    hidden: list[torch.Tensor]
    """Y + 1 residual streams [B, T, D]: the block-0 input, then each block's output."""
    resid_rms_Y: torch.Tensor
    """RMS of each block's output over the valid tokens."""
    attn_logit_max_YN: torch.Tensor
    """Max pre-softmax logit per block and head over valid queries and keys."""
    attn_entropy_YN: torch.Tensor
    """Mean over valid queries of entropy / log(valid keys): 1 uniform averaging, 0 one-hot."""
    cos_adjacent_Y: torch.Tensor
    """Mean cosine between the stream entering and leaving each block over valid tokens: near 1
    the block barely changes its input (idles)."""


@runtime_checkable
class RankerNet(Protocol):
    cfg: RankerConfig
    dims: FeatureDims
    optimizer_rules: tuple[GroupRule, ...]
    """Parameter-group rules (``recformer.optim``); a model without some kind marks it optional."""

    @property
    def n_tokens(self) -> int:
        """Tokens per sample (for tokens/s); 1 for a model that reads no token sequence."""
        ...

    def __call__(self, batch: Batch) -> torch.Tensor:
        """Click logits, float32 [B]: the training path (compilable, no host sync)."""
        ...

    def forward_stats(self, batch: Batch) -> tuple[torch.Tensor, BlockStats | None]:
        """Logits and the blocks' statistics, run eagerly (None: a model without blocks)."""
        ...

    def transformer_blocks(self) -> Sequence[nn.Module]:
        """The blocks, bottom first, whose gradients and updates the health callbacks report."""
        ...

    def param_kinds(self) -> dict[str, ParamKind]:
        """Every trainable parameter's kind."""
        ...

    def flop_terms(self) -> list[Term]:
        """What one sample's training step computes (``recformer.model.flops``)."""
        ...

    def embedding_groups(self) -> dict[str, tuple[nn.Embedding, int, int]]:
        """Rows of its embedding tables by feature group: ``{name: (table, start, stop)}``."""
        ...

    def set_item_tables(self, content: torch.Tensor | None, features: torch.Tensor | None) -> None:
        """Copy the item side table (row 0 = OOV) into the model's buffers."""
        ...
