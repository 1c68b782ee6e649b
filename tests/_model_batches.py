"""Tiny FeatureDims and random Batch factories for the model tests (imported, not a conftest)."""

from __future__ import annotations

import torch

from recformer.batch import Batch, batch_of
from recformer.config import FeatureDims


def tiny_dims(
    max_len: int = 6, content_dim: int = 8, n_dense: int = 3, emb_dims: tuple[int, ...] = (5,)
) -> FeatureDims:
    """Every token kind present: 2 categorical fields, dense, a per-row embedding, item features,
    content, per-event categoricals and time gaps."""
    return FeatureDims(
        cat_rows=[7, 4],
        n_dense=n_dense,
        emb_dims=list(emb_dims),
        item_rows=30,
        content_dim=content_dim,
        item_feat_rows=[5, 3],
        max_len=max_len,
        hist_cat_rows=[6] if max_len else [],
        time_gap_buckets=9 if max_len else 0,
    )


def random_batch(dims: FeatureDims, batch_size: int = 8, seed: int = 0, empty_history: int = 1) -> Batch:
    """A valid random Batch: left-padded histories of random length; the first ``empty_history``
    samples have no history at all (every slot masked)."""
    g = torch.Generator().manual_seed(seed)
    B, L = batch_size, dims.max_len

    def rows(n: int, *shape: int) -> torch.Tensor:
        return torch.randint(1, n, shape, generator=g) if n > 1 else torch.zeros(shape, dtype=torch.long)

    cat = (
        torch.stack([rows(r, B) for r in dims.cat_rows], dim=1)
        if dims.cat_rows
        else torch.zeros(B, 0, dtype=torch.long)
    )
    lengths = torch.randint(0, L + 1, (B,), generator=g)
    lengths[:empty_history] = 0
    hist_mask = torch.arange(L)[None, :] >= (L - lengths)[:, None]  # left-padded: real events at the end
    hist_item = rows(dims.item_rows, B, L) * hist_mask
    C = len(dims.hist_cat_rows)
    hist_cat = (
        torch.stack([rows(r, B, L) for r in dims.hist_cat_rows], dim=2)
        if C
        else torch.zeros(B, L, 0, dtype=torch.long)
    )
    hist_cat = hist_cat * hist_mask[..., None]
    gap = (
        rows(dims.time_gap_buckets, B, L) * hist_mask
        if dims.time_gap_buckets
        else torch.zeros(B, L, dtype=torch.long)
    )
    tensors = dict(
        label=torch.randint(0, 2, (B,), generator=g).float(),
        weight=torch.ones(B),
        group=torch.arange(B),
        target_item=rows(dims.item_rows, B),
        cat=cat,
        dense=torch.randn(B, dims.n_dense, generator=g),
        emb=torch.randn(B, sum(dims.emb_dims), generator=g),
        hist_item=hist_item,
        hist_cat=hist_cat,
        hist_gap=gap,
        hist_mask=hist_mask,
        bag=random_bag(dims, B, g),
    )
    return batch_of(**tensors)


def random_bag(dims: FeatureDims, B: int, g: torch.Generator) -> torch.Tensor:
    """Per bag field, a random number of values (0 to max_values) first, -1 after them: [B, G]."""
    parts = []
    for rows, M in zip(dims.bag_rows, dims.bag_values):
        n_B = torch.randint(0, M + 1, (B,), generator=g)
        values = torch.randint(0, rows, (B, M), generator=g)
        parts.append(torch.where(torch.arange(M)[None, :] < n_B[:, None], values, -1))
    return torch.cat(parts, dim=1) if parts else torch.zeros(B, 0, dtype=torch.long)


def random_item_tables(dims: FeatureDims, seed: int = 0) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Content [item_rows, content_dim] (unit-norm rows) and features [item_rows, I] for set_item_tables."""
    g = torch.Generator().manual_seed(seed)
    content = None
    if dims.content_dim:
        content = torch.randn(dims.item_rows, dims.content_dim, generator=g)
        content = content / content.norm(dim=1, keepdim=True)
    features = None
    if dims.item_feat_rows:
        columns = []
        for r, M in zip(dims.item_feat_rows, dims.item_feat_values):
            values = torch.randint(0, r, (dims.item_rows, M), generator=g)
            if M > 1:  # a multi-valued feature: 1 to M values an item, -1 after them
                n = torch.randint(1, M + 1, (dims.item_rows,), generator=g)
                values = torch.where(torch.arange(M)[None, :] < n[:, None], values, -1)
            columns.append(values)
        features = torch.cat(columns, dim=1)
    return content, features
