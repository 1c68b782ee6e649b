"""The ranker and its baselines as pure ``nn.Module`` (no Lightning): tokens, blocks, head, init,
muP, FLOP counts, and the contract the rest of recformer reads them by (``protocol.RankerNet``)."""

from recformer.model.architectures import Arch, build_model
from recformer.model.init import init_weights
from recformer.model.protocol import BlockStats, RankerNet
from recformer.model.ranker import Ranker

__all__ = ["Arch", "BlockStats", "Ranker", "RankerNet", "build_model", "init_weights"]
