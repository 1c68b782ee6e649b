"""The architectures ``model.arch`` names, and ``build_model``."""

from __future__ import annotations

from typing import Literal

from recformer.config import FeatureDims, RankerConfig
from recformer.model.baselines import BSTRanker, DCNv2Ranker, DeepFMRanker, DINRanker, PopularityRanker
from recformer.model.protocol import RankerNet
from recformer.model.ranker import Ranker

Arch = Literal["transformer", "din", "deepfm", "dcnv2", "dcnv2_parallel", "bst", "popularity"]
"""``transformer`` (the ranker), or a baseline (``model/baselines.py``)."""

BASELINES = {
    "din": DINRanker,
    "deepfm": DeepFMRanker,
    "dcnv2": DCNv2Ranker,
    "dcnv2_parallel": lambda cfg, dims: DCNv2Ranker(cfg, dims, parallel=True),
    "bst": BSTRanker,
}
"""The baselines that share the tokenizer (and so every feature) with the Transformer."""


def build_model(arch: Arch, cfg: RankerConfig, dims: FeatureDims) -> RankerNet:
    if cfg.first_order != "fields" and arch != "deepfm":
        raise ValueError(
            f"model.ranker.first_order={cfg.first_order!r} is DeepFM's first-order term; arch={arch!r} "
            "has none: leave it at 'fields' (the Transformer's per-item scalar is model.ranker.item_bias)"
        )
    if arch == "transformer":
        return Ranker(cfg, dims)
    if arch in BASELINES:
        if cfg.content_tokens != "add":
            raise ValueError(
                f"arch={arch!r} reads item tokens with their content added; set "
                "model.ranker.content_tokens=add (content tokens of their own are the Transformer's option)"
            )
        if cfg.mup:
            # Their MLPs would get muP's hidden LR / m, but not its init or readout scaling.
            raise ValueError(
                f"arch={arch!r} does not implement muP (its init and readout do not scale with width); "
                f"set model.ranker.mup=false for the {arch} baseline"
            )
        return BASELINES[arch](cfg, dims)
    if arch == "popularity":
        return PopularityRanker(cfg, dims)
    raise ValueError(f"arch={arch!r}; expected one of transformer, {', '.join(BASELINES)}, popularity")
