"""The Transformer ranker (pure ``nn.Module``, no Lightning): tokens, blocks, head, init, muP."""

from recformer.model.init import init_weights
from recformer.model.ranker import Ranker

__all__ = ["Ranker", "init_weights"]
