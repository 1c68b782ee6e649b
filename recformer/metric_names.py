"""Every metric name users chart, defined once (DESIGN section 6). W&B groups charts by prefix."""

# Internal health metrics, per block i (0 = bottom).
GRAD_NORM = "health/grad_norm/block_{i}"
GRAD_RATIO_BOTTOM_TOP = "health/grad_ratio_bottom_top"
UPDATE_RATIO = "health/update_ratio/block_{i}"
WEIGHT_NORM = "health/weight_norm/block_{i}"
ADAM_V = "health/adam_v/{group}"
COS_ADJACENT = "health/cos_adjacent/block_{i}"
RESID_RMS = "health/resid_rms/block_{i}"
ATTN_LOGIT_MAX = "health/attn_logit_max/block_{i}"
ATTN_ENTROPY = "health/attn_entropy/block_{i}"
ATTN_LOGIT_MAX_HEAD = "health/attn_logit_max/block_{i}/head_{h}"
ATTN_ENTROPY_HEAD = "health/attn_entropy/block_{i}/head_{h}"
EMB_ROW_NORM = "health/emb_row_norm/{table}/p{q}"
LOSS_SPIKE = "health/loss_spike"
LOSS_Z_MAX = "health/loss_z_max"
LOSS_EMA = "health/loss_ema"
NONFINITE_STEPS = "health/nonfinite_steps"

# Losses as the module logs them (f"{stage}/loss").
TRAIN_LOSS = "train/loss"
VAL_LOSS = "val/loss"

# The validation score the kept checkpoint is chosen by (configs/trainer.yaml): val/auc + val/gauc,
# one point of within-user order worth one of overall AUC, as bench/quality.py scores a setting.
VAL_SCORE = "val/auc_gauc"

# Throughput.
SAMPLES_PER_S = "perf/samples_per_s"
TOKENS_PER_S = "perf/tokens_per_s"
MFU = "perf/mfu"

# Data.
OOV = "data/oov/{field}"
