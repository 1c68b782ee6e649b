"""Plain, torch-free configuration dataclasses.

Every field carries a docstring under it: LightningCLI turns those into ``--help`` and
``--print_config`` comments. Validation lives in ``__post_init__`` and says what to change.

- ``FeatureSpec``: what each Parquet column means (DESIGN section 3); loaded from YAML.
- ``FeatureDims``: the sizes the model needs, derived from a ``FeatureSpec`` by the data layer and
  linked into the model through LightningCLI, so no number is copied into two YAML files.
- ``RankerConfig``: the Transformer ranker and its scale controls (DESIGN section 4).
- ``OptimConfig``: AdamW, parameter groups and schedule (DESIGN section 5).
"""

from recformer.config.features import (
    OOV_ROW,
    VOCAB_DIGEST,
    BagField,
    BagPooling,
    CategoricalField,
    DenseField,
    EmbeddingField,
    FeatureDims,
    FeatureSpec,
    ItemSpec,
    SequenceSpec,
    _coerce,
)
from recformer.config.optim import OptimConfig
from recformer.config.ranker import InitMethod, NormPlacement, RankerConfig

__all__ = [
    "OOV_ROW",
    "VOCAB_DIGEST",
    "BagField",
    "BagPooling",
    "CategoricalField",
    "DenseField",
    "EmbeddingField",
    "FeatureDims",
    "FeatureSpec",
    "InitMethod",
    "ItemSpec",
    "NormPlacement",
    "OptimConfig",
    "RankerConfig",
    "SequenceSpec",
    "_coerce",
]
