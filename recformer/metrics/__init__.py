"""Ranking metrics, one job per file:

- ``training.py``: torchmetrics ``Metric`` classes the LightningModule logs on device
  (``BinnedAUC``, ``LogLoss``, ``NormalizedEntropy``, ``Calibration``, ``GroupAUC``), DDP-exact.
- ``exact.py``: exact float64 numpy metrics (``exact_auc``, ``delong_ci``, ``delong_paired``,
  ``gauc``, ``logloss``, ``normalized_entropy``, ``calibration``, ``calibration_table``), the
  conventions every file follows (logits in, soft labels, weights, ties one half), and the helpers
  the other two share.
- ``streaming.py``: ``StreamingEvaluator``, every offline metric over data of any size in bounded
  memory (``recformer evaluate``).

The public names are re-exported here, so ``from recformer.metrics import X`` works for each.
"""

from recformer.metrics.exact import (
    DEFAULT_LOGIT_RANGE,
    calibration,
    calibration_table,
    delong_ci,
    delong_paired,
    exact_auc,
    gauc,
    logloss,
    normalized_entropy,
)
from recformer.metrics.streaming import EvalResult, StreamingEvaluator
from recformer.metrics.training import (
    DEFAULT_AUC_BINS,
    DEFAULT_AUC_EXACT_MAX_ROWS,
    BinnedAUC,
    Calibration,
    GroupAUC,
    LogLoss,
    NormalizedEntropy,
)

__all__ = [
    "DEFAULT_AUC_BINS",
    "DEFAULT_AUC_EXACT_MAX_ROWS",
    "DEFAULT_LOGIT_RANGE",
    "BinnedAUC",
    "Calibration",
    "EvalResult",
    "GroupAUC",
    "LogLoss",
    "NormalizedEntropy",
    "StreamingEvaluator",
    "calibration",
    "calibration_table",
    "delong_ci",
    "delong_paired",
    "exact_auc",
    "gauc",
    "logloss",
    "normalized_entropy",
]
