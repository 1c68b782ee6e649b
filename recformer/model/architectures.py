"""The architectures ``model.arch`` names, and ``build_model``."""

from __future__ import annotations

from typing import Literal

from recformer.config import FeatureDims, RankerConfig
from recformer.model.baselines import DINRanker, PopularityRanker
from recformer.model.protocol import RankerNet
from recformer.model.ranker import Ranker

Arch = Literal["transformer", "din", "popularity"]
"""``transformer`` (the ranker), or a baseline (``model/baselines.py``)."""


def build_model(arch: Arch, cfg: RankerConfig, dims: FeatureDims) -> RankerNet:
    if arch == "transformer":
        return Ranker(cfg, dims)
    if arch == "din":
        if cfg.mup:
            # Its MLPs would get muP's hidden LR / m, but not its init or readout scaling.
            raise ValueError(
                "arch='din' does not implement muP (its init and readout do not scale with width); "
                "set model.ranker.mup=false for the DIN baseline"
            )
        return DINRanker(cfg, dims)
    if arch == "popularity":
        return PopularityRanker(cfg, dims)
    raise ValueError(f"arch={arch!r}; expected 'transformer', 'din' or 'popularity'")
