"""Turns a ``Batch`` into the token sequence the blocks attend over (DESIGN section 4).

Shape legend: ``B`` batch, ``T`` tokens, ``D`` model width, ``F`` context categorical fields,
``C`` per-event categorical fields, ``I`` item side features, ``L`` history length, ``S`` item slots
(the L history events and the target, L + 1), ``V`` table rows, ``K`` content dimension.

Token layout, fixed per model so every position has a meaning::

    [CLS] [cat_1 .. cat_F] [dense_1 .. dense_Td] [emb_1 .. emb_E] [event_1 .. event_L] [target]

- history event = item + item side features + projected content + event categoricals (action,
  rating, ...) + time-gap bucket; target = item + item side features + projected content. History and
  target share the item tables, so what is learnt about an item from clicks transfers to scoring it.
- content vectors enter through a learned linear projection, one per token, not compressed by a side
  network first: the Transformer decides what in them matters.
- ``slot_emb`` adds one learned vector per position: it is the field / type embedding of the
  context tokens and of the target, and the position embedding of the history events.

Each group of per-field tables is one concatenated table with per-field row offsets (a buffer), so
every lookup is one gather; multi-field sums use ``embedding_bag`` to skip the [B, S, I, D] temporary.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from recformer.config import FeatureDims, RankerConfig
from recformer.data.batch import Batch


def _offsets(rows: list[int]) -> torch.Tensor:
    """Start row of each field inside the concatenated table."""
    starts = [0]
    for r in rows[:-1]:
        starts.append(starts[-1] + r)
    return torch.tensor(starts, dtype=torch.long)


class FeatureTokenizer(nn.Module):
    """Embedding tables and input projections; ``forward(batch) -> (x_BTD, valid_BT | None)``.

    ``valid_BT`` is True for every token except padded history slots; it is None when the model has
    no history (every token is always valid, so attention needs no mask at all).

    Item side tables (``item_content`` [item_rows, K] float16, ``item_feats`` [item_rows, I] int64)
    are persistent buffers so a checkpoint is self-contained; fill them with ``set_item_tables``.
    """

    def __init__(self, cfg: RankerConfig, dims: FeatureDims) -> None:
        super().__init__()
        D = cfg.d_model
        self.dims = dims
        self.d_model = D
        self.n_cat = len(dims.cat_rows)
        self.dense_tokens = cfg.dense_tokens if dims.n_dense > 0 else 0
        self.emb_dims = list(dims.emb_dims)
        self.max_len = dims.max_len
        self.n_item_feats = len(dims.item_feat_rows)
        self.n_hist_cat = len(dims.hist_cat_rows) if dims.max_len else 0
        self.n_context = 1 + self.n_cat + self.dense_tokens + len(self.emb_dims)
        self.n_tokens = self.n_context + self.max_len + 1
        _check_dims(dims)

        self.cls = nn.Parameter(torch.zeros(D))
        if self.n_cat:
            self.cat_table = nn.Embedding(sum(dims.cat_rows), D)
            self.register_buffer("cat_offsets", _offsets(dims.cat_rows), persistent=False)
        if self.dense_tokens:
            self.dense_proj = nn.Linear(dims.n_dense, self.dense_tokens * D, bias=False)
        self.emb_proj = nn.ModuleList(nn.Linear(d, D, bias=False) for d in self.emb_dims)

        self.item_table = nn.Embedding(dims.item_rows, D)
        if self.n_item_feats:
            self.item_feat_table = nn.Embedding(sum(dims.item_feat_rows), D)
            self.register_buffer("item_feat_offsets", _offsets(dims.item_feat_rows), persistent=False)
            self.register_buffer(
                "item_feats", torch.zeros(dims.item_rows, self.n_item_feats, dtype=torch.long)
            )
        if dims.content_dim:
            self.content_proj = nn.Linear(dims.content_dim, D, bias=False)
            # float16 halves the memory of the largest buffer; cast to the projection dtype at use.
            self.register_buffer(
                "item_content", torch.zeros(dims.item_rows, dims.content_dim, dtype=torch.float16)
            )

        if self.n_hist_cat:
            self.hist_cat_table = nn.Embedding(sum(dims.hist_cat_rows), D)
            self.register_buffer("hist_cat_offsets", _offsets(dims.hist_cat_rows), persistent=False)
        if self.max_len and dims.time_gap_buckets:
            self.gap_table = nn.Embedding(dims.time_gap_buckets, D)
        self.slot_emb = nn.Parameter(torch.zeros(self.n_tokens, D))

    # -- item side tables ------------------------------------------------------------------------
    @torch.no_grad()
    def set_item_tables(self, content: torch.Tensor | None, features: torch.Tensor | None) -> None:
        """Copy the item side table into the buffers (row 0 = OOV); shapes must match FeatureDims."""
        d = self.dims
        if d.content_dim:
            if content is None:
                raise ValueError(
                    f"set_item_tables: FeatureDims.content_dim={d.content_dim} needs a content tensor"
                )
            if tuple(content.shape) != (d.item_rows, d.content_dim) or not content.is_floating_point():
                raise ValueError(
                    f"set_item_tables: content is {content.dtype} {tuple(content.shape)}; expected a float "
                    f"tensor [item_rows={d.item_rows}, content_dim={d.content_dim}]"
                )
            half = content.to(self.item_content.device, torch.float16)
            if not torch.isfinite(half).all():  # setup-time check, not on the training path
                raise ValueError(
                    "set_item_tables: content has non-finite values or values beyond float16 range"
                )
            self.item_content.copy_(half)
        elif content is not None and content.numel():
            raise ValueError(
                "set_item_tables: got content but FeatureDims.content_dim=0 (no item.content_column)"
            )
        if self.n_item_feats:
            if features is None:
                raise ValueError(
                    f"set_item_tables: FeatureDims.item_feat_rows={d.item_feat_rows} needs a features tensor"
                )
            if tuple(features.shape) != (d.item_rows, self.n_item_feats) or features.is_floating_point():
                raise ValueError(
                    f"set_item_tables: features is {features.dtype} {tuple(features.shape)}; expected an "
                    f"integer tensor [item_rows={d.item_rows}, n_item_feats={self.n_item_feats}]"
                )
            rows = torch.tensor(d.item_feat_rows, device=features.device)
            bad = (features < 0) | (features >= rows)
            if bad.any():
                col = int(bad.any(dim=0).nonzero()[0])
                raise ValueError(
                    f"set_item_tables: item feature {col} has rows outside [0, {d.item_feat_rows[col]}) "
                    f"(FeatureDims.item_feat_rows[{col}])"
                )
            self.item_feats.copy_(features.to(self.item_feats.device, torch.long))
        elif features is not None and features.numel():
            raise ValueError("set_item_tables: got features but FeatureDims.item_feat_rows is empty")

    # -- forward ---------------------------------------------------------------------------------
    def check_batch(self, batch: Batch) -> None:
        """Shape checks only (static under compile: no sync, no graph break)."""
        d = self.dims
        expected = {
            "cat": (batch.cat.shape[1], self.n_cat, "len(cat_rows)"),
            "dense": (batch.dense.shape[1], d.n_dense, "n_dense"),
            "emb": (batch.emb.shape[1], sum(self.emb_dims), "sum(emb_dims)"),
            "hist_item": (batch.hist_item.shape[1], self.max_len, "max_len"),
        }
        if self.max_len:
            expected["hist_cat"] = (batch.hist_cat.shape[2], self.n_hist_cat, "len(hist_cat_rows)")
        for name, (got, want, field) in expected.items():
            if got != want:
                raise ValueError(
                    f"Batch.{name} has {got} columns but the model was built for FeatureDims.{field}={want}; "
                    "the feature spec of the data and of the model differ"
                )

    def forward(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor | None]:
        self.check_batch(batch)
        B, D, L = batch.target_item.shape[0], self.d_model, self.max_len
        parts_BxD = [self.cls.expand(B, 1, D)]
        if self.n_cat:
            parts_BxD.append(self.cat_table(batch.cat + self.cat_offsets))
        if self.dense_tokens:
            parts_BxD.append(self.dense_proj(batch.dense).view(B, self.dense_tokens, D))
        if self.emb_dims:
            for proj, e_BK in zip(self.emb_proj, batch.emb.split(self.emb_dims, dim=-1)):
                parts_BxD.append(proj(e_BK).unsqueeze(1))

        # History events and the target look up the same item tables in one gather each.
        items_BS = (
            torch.cat([batch.hist_item, batch.target_item[:, None]], dim=1)
            if L
            else batch.target_item[:, None]
        )
        S = items_BS.shape[1]
        item_BSD = self.item_table(items_BS)
        if self.n_item_feats:
            feat_X = (self.item_feats[items_BS] + self.item_feat_offsets).view(B * S, self.n_item_feats)
            item_BSD = item_BSD + F.embedding_bag(feat_X, self.item_feat_table.weight, mode="sum").view(
                B, S, D
            )
        if self.dims.content_dim:
            w = self.content_proj.weight
            item_BSD = item_BSD + self.content_proj(self.item_content[items_BS].to(w.dtype))
        event_BLD = None
        if self.n_hist_cat:
            cat_X = (batch.hist_cat + self.hist_cat_offsets).view(B * L, self.n_hist_cat)
            event_BLD = F.embedding_bag(cat_X, self.hist_cat_table.weight, mode="sum").view(B, L, D)
        if L and self.dims.time_gap_buckets:
            gap_BLD = self.gap_table(batch.hist_gap)
            event_BLD = gap_BLD if event_BLD is None else event_BLD + gap_BLD
        if event_BLD is not None:
            item_BSD = torch.cat([item_BSD[:, :L] + event_BLD, item_BSD[:, L:]], dim=1)
        parts_BxD.append(item_BSD)

        x_BTD = torch.cat(parts_BxD, dim=1) + self.slot_emb
        if not L:
            return x_BTD, None
        # CLS, context and target tokens are always valid: no sample ever has zero valid keys.
        ones_BC = batch.hist_mask.new_ones(B, self.n_context)
        valid_BT = torch.cat([ones_BC, batch.hist_mask, batch.hist_mask.new_ones(B, 1)], dim=1)
        return x_BTD, valid_BT


def _check_dims(dims: FeatureDims) -> None:
    """Every table needs at least the OOV row; say which FeatureDims field is wrong."""
    checks = {
        "cat_rows": dims.cat_rows,
        "item_feat_rows": dims.item_feat_rows,
        "hist_cat_rows": dims.hist_cat_rows,
        "emb_dims": dims.emb_dims,
    }
    for field, values in checks.items():
        if any(v < 1 for v in values):
            raise ValueError(f"FeatureDims.{field}={values}: every entry must be >= 1")
    if dims.item_rows < 1 or dims.n_dense < 0 or dims.content_dim < 0 or dims.max_len < 0:
        raise ValueError(
            f"FeatureDims item_rows={dims.item_rows}, n_dense={dims.n_dense}, "
            f"content_dim={dims.content_dim}, max_len={dims.max_len}: "
            "item_rows must be >= 1 and the others >= 0"
        )
    if dims.time_gap_buckets == 1:
        raise ValueError("FeatureDims.time_gap_buckets=1 leaves only the pad row; use 0 (no gaps) or >= 2")
