"""recformer: a tokenized-feature Transformer ranker that scales, and the instrument that shows why."""

__version__ = "0.1.0"
