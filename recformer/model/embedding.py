"""Turns a ``Batch`` into the token sequence the blocks attend over (DESIGN section 4).

Shape suffixes: the legend in ``recformer/__init__.py``.

Token layout, fixed per model so every position has a meaning::

    [CLS] [dense_1 .. dense_Td] [emb_1 .. emb_E] [cat_1 .. cat_F] [bag tokens] [event_1 .. event_L] [target]

- a bag field (a list column of ids) is one token, the mean or sum of its values' embeddings, or
  (``pooling: tokens``) one token per value, absent values masked out of attention;

- history event = item + item side features + projected content + event categoricals (action,
  rating, ...) + time-gap bucket; target = item + item side features + projected content. History and
  target share the item tables, so what is learnt about an item from clicks transfers to scoring it.
- content vectors enter through a learned linear projection, one per token, not compressed by a side
  network first: the Transformer decides what in them matters.
- ``slot_emb`` adds one learned vector per position: it is the field / type embedding of the
  context tokens and of the target, and the position embedding of the history events.

All categorical rows (context fields, items, item features, event categoricals, time gaps) live in
one table with per-field row offsets; each token's ids form one bag of a single ``embedding_bag``
call, so the lookup is one gather (and one scatter-add in backward) and no [B, S, I, D] temporary.
On CPU, eager, an item's bag (id and feature rows) and content projection are computed once per
distinct item of the batch and gathered into its slots (``FeatureTokenizer._distinct``).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from recformer.batch import ID_FIELDS, Batch
from recformer.config import FeatureDims, RankerConfig
from recformer.model import flops


class Distinct(NamedTuple):
    """A batch's distinct item rows [U] and each slot's index among them [B, S] (``torch.unique``)."""

    items_U: torch.Tensor
    inverse_BS: torch.Tensor


def drop_event_categoricals(hist_cat_BLC: torch.Tensor, p: float) -> torch.Tensor:
    """``history_cat_dropout``: each event's categoricals [B, L, C] become the OOV row (0, unknown)
    with probability ``p``, one draw per event; the event still names its item."""
    kept_BL1 = torch.rand(hist_cat_BLC.shape[:2], device=hist_cat_BLC.device) >= p
    return hist_cat_BLC * kept_BL1.unsqueeze(-1)  # OOV_ROW = 0


class FeatureTokenizer(nn.Module):
    """Embedding tables and input projections; ``forward(batch) -> (x_BTD, valid_BT | None)``.

    ``valid_BT`` is True for every token except padded history slots and absent bag values; it is
    None when there are neither (every token is always valid, so attention needs no mask at all).

    Item side tables (``item_content`` [item_side_rows, P] float16, ``item_feats`` [item_side_rows, I]
    int64) are persistent buffers so a checkpoint is self-contained; fill them with
    ``set_item_tables``. Their rows are the batch's item rows: the trained items, then the cold items
    (``ItemSpec.cold_items``), which read their id embedding from the item OOV row.
    """

    def __init__(self, cfg: RankerConfig, dims: FeatureDims) -> None:
        super().__init__()
        D = cfg.d_model
        self.dims = dims
        self.d_model = D
        self.n_cat = len(dims.cat_rows)
        self.dense_per_feature = cfg.dense_per_feature and dims.n_dense > 0
        self.dense_tokens = (
            (dims.n_dense if self.dense_per_feature else cfg.dense_tokens) if dims.n_dense > 0 else 0
        )
        self.content_tokens = cfg.content_tokens if dims.content_dim else "add"
        self.embedding_dropout = cfg.embedding_dropout
        self.history_cat_dropout = cfg.history_cat_dropout
        self.history_content = cfg.history_content or not dims.max_len
        self.register_buffer("cat_dropout", _categorical_dropout(cfg, dims), persistent=False)
        self.any_cat_dropout = bool(self.cat_dropout.gt(0).any())  # a Python flag: no device sync a step
        self.emb_dims = list(dims.emb_dims)
        self.max_len = dims.max_len
        self.n_item_feats = sum(dims.item_feat_values)  # values: a multi-valued feature has several
        self.n_hist_cat = len(dims.hist_cat_rows) if dims.max_len else 0
        self.bag_tokens = [M if pool == "tokens" else 1 for M, pool in zip(dims.bag_values, dims.bag_pooling)]
        self.n_context = 1 + self.n_cat + self.dense_tokens + len(self.emb_dims) + sum(self.bag_tokens)
        extra = {"add": 0, "target": 1, "all": self.max_len + 1}[self.content_tokens]
        self.n_tokens = self.n_context + self.max_len + extra + 1
        _check_dims(dims)
        self._build_table(dims)
        self.cls = nn.Parameter(torch.zeros(D))
        if self.dense_per_feature:
            self.dense_weight = nn.Parameter(torch.zeros(dims.n_dense, D))
            self.dense_bias = nn.Parameter(torch.zeros(dims.n_dense, D))
        elif self.dense_tokens:
            self.dense_proj = nn.Linear(dims.n_dense, self.dense_tokens * D, bias=False)
        self.emb_proj = nn.ModuleList(nn.Linear(d, D, bias=False) for d in self.emb_dims)
        if self.n_item_feats:
            self.register_buffer(
                "item_feats", torch.zeros(dims.item_side_rows, self.n_item_feats, dtype=torch.long)
            )
        if dims.content_dim:
            self.content_proj = nn.Linear(dims.content_dim, D, bias=False)
            # float16 halves the memory of the largest buffer; cast to the projection dtype at use.
            self.register_buffer(
                "item_content", torch.zeros(dims.item_side_rows, dims.content_dim, dtype=torch.float16)
            )
        self.slot_emb = nn.Parameter(torch.zeros(self.n_tokens, D))

    def _build_table(self, dims: FeatureDims) -> None:
        """One table for every categorical row: context fields, items, item features, event
        categoricals, time gaps, in that order (``table_groups``). Each token's ids (a history event
        has 1 + I + C + 1 of them) are one bag of the same embedding_bag call, so the whole lookup
        is one gather and one scatter-add in backward, whatever the number of fields."""
        sizes = {
            "cat": list(dims.cat_rows),
            "item": [dims.item_rows],
            "item_feat": list(dims.item_feat_rows),
            "hist_cat": list(dims.hist_cat_rows) if self.max_len else [],
            "gap": [dims.time_gap_buckets] if self.max_len and dims.time_gap_buckets else [],
            "bag": list(dims.bag_rows),
        }
        starts, row = {}, 0
        self.table_groups: dict[str, tuple[int, int]] = {}
        """Row range of each feature group in ``table`` (the groups that have rows)."""
        for group, group_rows in sizes.items():
            starts[group] = []
            for r in group_rows:
                starts[group].append(row)
                row += r
            if sum(group_rows):
                self.table_groups[group] = (starts[group][0], row)
        # A zero row for absent values (multi-valued item features, bags), which embedding_bag's
        # padding_idx leaves out of sums, means and gradients; only models that have them get it.
        needs_pad = bool(dims.bag_rows) or any(v > 1 for v in dims.item_feat_values)
        self.pad_row = row if needs_pad else None
        self.table_rows = row + needs_pad
        self.table = nn.Embedding(self.table_rows, self.d_model)
        self.item_offset = starts["item"][0]
        self.gap_offset = starts["gap"][0] if starts["gap"] else -1
        per_value = lambda offsets, values: [o for o, v in zip(offsets, values) for _ in range(v)]
        for name, offsets in (
            ("cat_offsets", starts["cat"]),
            ("feat_offsets", per_value(starts["item_feat"], dims.item_feat_values)),
            ("hist_cat_offsets", starts["hist_cat"]),
            ("bag_offsets", per_value(starts["bag"], dims.bag_values)),
        ):
            self.register_buffer(name, torch.tensor(offsets, dtype=torch.long), persistent=False)
        # Bag layout of one sample: F single-id bags, L event bags (J ids, C event ids, a gap), one
        # target bag of J ids.
        self.item_ids = 1 + self.n_item_feats  # J
        self.event_ids = self.item_ids + self.n_hist_cat + (1 if self.gap_offset >= 0 else 0)
        bag_sizes = [1] * self.n_cat + [self.event_ids] * self.max_len + [self.item_ids]
        self.ids_per_sample = sum(bag_sizes)
        self.register_buffer("bag_starts", torch.tensor([0, *bag_sizes[:-1]]).cumsum(0), persistent=False)
        # The once-per-item path's bags (``_distinct``): a slot's bag holds only the event's own ids
        # (categoricals, gap), none for the target; its item's bag is summed once per distinct item.
        own_sizes = [1] * self.n_cat + [self.event_ids - self.item_ids] * self.max_len + [0]
        self.register_buffer("own_starts", torch.tensor([0, *own_sizes[:-1]]).cumsum(0), persistent=False)

    def embedding_groups(self) -> dict[str, tuple[nn.Embedding, int, int]]:
        """Rows of ``table`` by feature group: ``{name: (table, start, stop)}``."""
        return {name: (self.table, a, b) for name, (a, b) in self.table_groups.items()}

    def flop_terms(self) -> list[flops.Term]:
        """The dense and embedding projections once per sample, the content projection once per item
        token (the target and every history slot). Table lookups are no FLOPs."""
        dense, content = getattr(self, "dense_proj", None), getattr(self, "content_proj", None)
        once = flops.matrix_params(self.emb_proj) + (flops.matrix_params(dense) if dense is not None else 0)
        terms = [flops.Matmul(once, 1)]
        if content is not None:
            terms.append(flops.Matmul(flops.matrix_params(content), self.max_len + 1))
        return terms

    def param_kinds(self, prefix: str = "tokens.") -> dict[str, str]:
        """Optimizer / muP kind of each of its parameters (``recformer.optim``), names under
        ``prefix``: the input projections' weights ``input`` (dense matrices of a fixed fan-in:
        decayed, LR constant in width), their biases ``vector``, the id table ``table`` (rows updated
        only where a batch reads them), the learned CLS / slot vectors ``embedding`` (not decayed)."""
        kinds = {}
        for mod_name, module in self.named_modules():
            for p_name, _ in module.named_parameters(recurse=False):
                name = f"{prefix}{mod_name}.{p_name}" if mod_name else f"{prefix}{p_name}"
                if isinstance(module, nn.Linear):
                    kinds[name] = "input" if p_name == "weight" else "vector"
                elif isinstance(module, nn.Embedding):
                    kinds[name] = "table"
                else:
                    kinds[name] = "embedding"
        return kinds

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
            if tuple(content.shape) != (d.item_side_rows, d.content_dim) or not content.is_floating_point():
                raise ValueError(
                    f"set_item_tables: content is {content.dtype} {tuple(content.shape)}; expected a float "
                    f"tensor [item_side_rows={d.item_side_rows}, content_dim={d.content_dim}]"
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
            if tuple(features.shape) != (d.item_side_rows, self.n_item_feats) or features.is_floating_point():
                raise ValueError(
                    f"set_item_tables: features is {features.dtype} {tuple(features.shape)}; expected an "
                    f"integer tensor [item_side_rows={d.item_side_rows}, n_item_feats={self.n_item_feats}]"
                )
            # Per value column: its feature's rows; a multi-valued feature's values may be absent (-1).
            field = [j for j, v in enumerate(d.item_feat_values) for _ in range(v)]
            rows = torch.tensor([d.item_feat_rows[j] for j in field], device=features.device)
            low = torch.tensor(
                [0 if d.item_feat_values[j] == 1 else -1 for j in field], device=features.device
            )
            bad = (features < low) | (features >= rows)
            if bad.any():
                j = field[int(bad.any(dim=0).nonzero()[0])]
                raise ValueError(
                    f"set_item_tables: item feature {j} has rows outside [0, {d.item_feat_rows[j]}) "
                    f"(FeatureDims.item_feat_rows[{j}])"
                )
            self.item_feats.copy_(features.to(self.item_feats.device, torch.long))
        elif features is not None and features.numel():
            raise ValueError("set_item_tables: got features but FeatureDims.item_feat_rows is empty")

    # -- forward ---------------------------------------------------------------------------------
    def check_batch(self, batch: Batch) -> None:
        """Shape and dtype checks only (static under compile: no sync, no graph break)."""
        for name in ID_FIELDS:
            # Rows are offset into one concatenated table; a narrow dtype (as the loader ships them)
            # would wrap silently. ``Batch.to(device)`` widens them.
            if getattr(batch, name).dtype != torch.long:
                raise ValueError(
                    f"Batch.{name} is {getattr(batch, name).dtype}; the model needs int64 rows: "
                    "move batches with Batch.to(device), which widens the id fields"
                )
        d = self.dims
        expected = {
            "cat": (batch.cat.shape[1], self.n_cat, "len(cat_rows)"),
            "dense": (batch.dense.shape[1], d.n_dense, "n_dense"),
            "emb": (batch.emb.shape[1], sum(self.emb_dims), "sum(emb_dims)"),
            "hist_item": (batch.hist_item.shape[1], self.max_len, "max_len"),
            "bag": (batch.bag.shape[1], sum(d.bag_values), "sum(bag_values)"),
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
        bag_BUD, items_BS, distinct = self._lookup(batch)
        F_ = self.n_cat
        context, bags_valid_BT = self._context_tokens(batch, bag_BUD[:, :F_])
        items, content_valid_BT = self._item_tokens(batch, bag_BUD[:, F_:], items_BS, distinct)
        x_BTD = torch.cat(context + items, dim=1) + self.slot_emb
        if self.embedding_dropout > 0:
            x_BTD = F.dropout(x_BTD, self.embedding_dropout, self.training)
        if not self.max_len and bags_valid_BT is None:
            return x_BTD, None
        # CLS, context and target tokens are always valid: no sample ever has zero valid keys.
        B = x_BTD.shape[0]
        ones = lambda n: batch.hist_mask.new_ones(B, n)
        n_before_bags = self.n_context - sum(self.bag_tokens)
        bags_valid_BT = ones(sum(self.bag_tokens)) if bags_valid_BT is None else bags_valid_BT
        parts = [ones(n_before_bags), bags_valid_BT, batch.hist_mask, content_valid_BT, ones(1)]
        return x_BTD, torch.cat(parts, dim=1)

    def _lookup(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, Distinct | None]:
        """Every id bag of the batch: the context categoricals' tokens, then each item slot's
        (history events, target), as [B, F + S, D]; the item rows [B, S]; and the batch's distinct
        items (``_distinct``) when it takes the once-per-item path."""
        B, D, L, F_ = batch.target_item.shape[0], self.d_model, self.max_len, self.n_cat
        # History events and the target share the item rows (and the item side buffers).
        items_BS = (
            torch.cat([batch.hist_item, batch.target_item[:, None]], dim=1)
            if L
            else batch.target_item[:, None]
        )
        S = items_BS.shape[1]
        pieces = [self._context_cat(batch.cat) + self.cat_offsets] if F_ else []
        distinct = self._distinct(items_BS)
        if distinct is not None:
            return self._bags_once_per_item(batch, pieces, distinct), items_BS, distinct
        ids_BSJ = self._item_ids(items_BS)
        if L:
            event = [ids_BSJ[:, :L]]
            if self.event_ids > self.item_ids:
                event.append(self._event_ids(batch))
            pieces.append(torch.cat(event, dim=-1).view(B, L * self.event_ids))
        pieces.append(ids_BSJ[:, L])
        if torch.compiler.is_exporting():
            return self._bags_by_segments(torch.cat(pieces, dim=1)), items_BS, None
        ids_Z = torch.cat(pieces, dim=1).view(-1)
        starts_Z = (
            self.bag_starts + self.ids_per_sample * torch.arange(B, device=ids_Z.device)[:, None]
        ).view(-1)
        bag_Z = F.embedding_bag(ids_Z, self.table.weight, starts_Z, mode="sum", padding_idx=self.pad_row)
        return bag_Z.view(B, F_ + S, D), items_BS, None

    def _bags_once_per_item(
        self, batch: Batch, pieces: list[torch.Tensor], distinct: Distinct
    ) -> torch.Tensor:
        """``_lookup``'s sums, [B, F + S, D], with each distinct item's bag (id and feature rows)
        summed once and gathered into its slots: a slot's own bag holds only its event's ids
        (categoricals, gap; none for the target), ``pieces`` the context categoricals' rows."""
        B, D, L, F_ = batch.target_item.shape[0], self.d_model, self.max_len, self.n_cat
        S = distinct.inverse_BS.shape[1]
        w = self.table.weight
        item_UD = F.embedding_bag(self._item_ids(distinct.items_U), w, mode="sum", padding_idx=self.pad_row)
        if L and self.event_ids > self.item_ids:
            pieces = [*pieces, self._event_ids(batch).view(B, -1)]
        ids_Z = torch.cat(pieces, dim=1).view(-1) if pieces else distinct.items_U.new_zeros(0)
        starts_Z = self.own_starts + ids_Z.numel() // B * torch.arange(B, device=ids_Z.device)[:, None]
        own_BUD = F.embedding_bag(ids_Z, w, starts_Z.view(-1), mode="sum").view(B, F_ + S, D)
        # A zero row past the distinct items: the context slots' share of the gather.
        item_UD = torch.cat([item_UD, item_UD.new_zeros(1, D)])
        context_BF = distinct.inverse_BS.new_full((B, F_), item_UD.shape[0] - 1)
        at_N = torch.cat([context_BF, distinct.inverse_BS], dim=1).flatten()
        return own_BUD + item_UD.index_select(0, at_N).view(B, F_ + S, D)  # backward: index_add_

    def sample_id_rows(self, batch: Batch) -> torch.Tensor:
        """[B, J]: the table rows of each sample's single-valued ids, its context categoricals and
        its target item's bag (id, side features; an absent value's row is the padding row)."""
        target_BJ = self._item_ids(batch.target_item)
        return torch.cat([batch.cat + self.cat_offsets, target_BJ], dim=1) if self.n_cat else target_BJ

    def _item_ids(self, items: torch.Tensor) -> torch.Tensor:
        """Table rows of each item's bag: its id row, then its feature values' rows, [*items, J]."""
        ids = self._item_embedding_rows(items).unsqueeze(-1) + self.item_offset
        if not self.n_item_feats:
            return ids
        feats = self.item_feats.index_select(0, items.flatten()).view(*items.shape, self.n_item_feats)
        return torch.cat([ids, self._rows(feats, self.feat_offsets)], dim=-1)

    def _event_ids(self, batch: Batch) -> torch.Tensor:
        """Table rows of each history event's own ids (categoricals, time gap), [B, L, C + 1]."""
        own = [self._hist_cat_ids(batch.hist_cat)] if self.n_hist_cat else []
        if self.gap_offset >= 0:
            own.append(batch.hist_gap.unsqueeze(-1) + self.gap_offset)
        return torch.cat(own, dim=-1) if len(own) > 1 else own[0]

    def _distinct(self, items_BS: torch.Tensor) -> Distinct | None:
        """The batch's distinct items and each slot's index among them, on the once-per-item path:
        on CPU, eager (``once_per_item``). A batch's B x S slots name far fewer distinct items
        (MovieLens, batch 256: about 3,400 of 13,056), so each item's id-and-features sum and its
        content projection are computed once and gathered per slot; the embedding bags' ids
        shrink 2.7x (715 a sample to 103, plus 12 per distinct item). Elsewhere None:
        ``torch.unique`` has a data-dependent size, a device sync on GPU and a dynamic shape for
        ``torch.compile`` / ``torch.export``."""
        eager = not (torch.compiler.is_compiling() or torch.compiler.is_exporting())
        if not (self.once_per_item and items_BS.device.type == "cpu" and eager):
            return None
        items_U, inverse_N = torch.unique(items_BS.flatten(), return_inverse=True)
        return Distinct(items_U, inverse_N.view(items_BS.shape))

    def _context_cat(self, cat_BF: torch.Tensor) -> torch.Tensor:
        """The context categoricals' ids [B, F]; in training, with ``categorical_dropout``, each
        named field's value is the OOV row (0, unknown) with its probability, one draw per row."""
        if not (self.training and self.any_cat_dropout):
            return cat_BF
        kept_BF = torch.rand(cat_BF.shape, device=cat_BF.device) >= self.cat_dropout
        return cat_BF * kept_BF

    def _hist_cat_ids(self, hist_cat_BLC: torch.Tensor) -> torch.Tensor:
        """Table rows of the history events' categoricals. In training, with ``history_cat_dropout``,
        each event's are the OOV rows (unknown) with that probability: the event still names its item."""
        if self.training and self.history_cat_dropout > 0:
            hist_cat_BLC = drop_event_categoricals(hist_cat_BLC, self.history_cat_dropout)
        return hist_cat_BLC + self.hist_cat_offsets

    def _bags_by_segments(self, ids_BJ: torch.Tensor) -> torch.Tensor:
        """``_lookup``'s bag sums as a gather and fixed-layout sums: what ``embedding_bag`` computes,
        in ops every exporter maps to plain ones (ONNX has no embedding_bag: torch.onnx lowers it
        to a loop over the bags, 100x slower). The layout is fixed per model: F bags of 1 id, L of
        ``event_ids``, the target's of ``item_ids``."""
        B, F_, L, D = ids_BJ.shape[0], self.n_cat, self.max_len, self.d_model
        emb_BJD = F.embedding(ids_BJ, self.table.weight)
        if self.pad_row is not None:  # embedding_bag leaves the padding row out of each sum
            emb_BJD = emb_BJD * (ids_BJ != self.pad_row).unsqueeze(-1).to(emb_BJD.dtype)
        parts = [emb_BJD[:, :F_]]
        if L:
            events = emb_BJD[:, F_ : F_ + L * self.event_ids]
            parts.append(events.reshape(B, L, self.event_ids, D).sum(2))
        parts.append(emb_BJD[:, F_ + L * self.event_ids :].sum(1, keepdim=True))
        return torch.cat(parts, dim=1)

    def _context_tokens(
        self, batch: Batch, cat_BFD: torch.Tensor
    ) -> tuple[list[torch.Tensor], torch.Tensor | None]:
        """CLS, dense, per-row embedding, categorical and bag tokens; the bags' validity."""
        B, D = cat_BFD.shape[0], self.d_model
        parts = [self.cls.expand(B, 1, D)]
        if self.dense_per_feature:  # a token per feature: x_j * w_j + b_j (Gorishniy et al. 2021)
            parts.append(batch.dense.unsqueeze(-1) * self.dense_weight + self.dense_bias)
        elif self.dense_tokens:
            parts.append(self.dense_proj(batch.dense).view(B, self.dense_tokens, D))
        if self.emb_dims:
            for proj, e_BE in zip(self.emb_proj, batch.emb.split(self.emb_dims, dim=-1)):
                parts.append(proj(e_BE).unsqueeze(1))
        parts.append(cat_BFD)
        bags, bags_valid_BT = self._bag_tokens(batch.bag)
        return parts + bags, bags_valid_BT

    def _item_tokens(
        self, batch: Batch, items_BSD: torch.Tensor, items_BS: torch.Tensor, distinct: Distinct | None
    ) -> tuple[list[torch.Tensor], torch.Tensor]:
        """The history events' and the target's tokens, with each item's content projection added
        to its token or as a token of its own (``content_tokens``), and those content tokens'
        validity (their events' mask)."""
        B, L = items_BSD.shape[0], self.max_len
        none_BT = batch.hist_mask.new_ones(B, 0)
        if not self.dims.content_dim:
            return [items_BSD], none_BT
        if not self.history_content:  # the target's content alone; the events keep their ids
            c_B1D = self._content(items_BS[:, L:], None)
            if self.content_tokens == "add":
                return [items_BSD[:, :L], items_BSD[:, L:] + c_B1D], none_BT
            return [items_BSD[:, :L], c_B1D, items_BSD[:, L:]], batch.hist_mask.new_ones(B, 1)
        c_BSD = self._content(items_BS, distinct)
        if self.content_tokens == "add":
            return [items_BSD + c_BSD], none_BT
        if self.content_tokens == "target":  # events keep theirs added; the target's is a token
            events_BLD = items_BSD[:, :L] + c_BSD[:, :L]
            return [events_BLD, c_BSD[:, L:], items_BSD[:, L:]], batch.hist_mask.new_ones(B, 1)
        ones_B1 = batch.hist_mask.new_ones(B, 1)  # "all": every item slot's content is a token
        return [items_BSD[:, :L], c_BSD, items_BSD[:, L:]], torch.cat([batch.hist_mask, ones_B1], dim=1)

    once_per_item: bool = True
    """On CPU, eager: sum each distinct item's id and feature rows and project its content once per
    batch (``_distinct``); False: once per slot, as on GPU (``bench/bench_throughput.py
    --per-slot-content`` compares the two)."""

    def _content(self, items_BS: torch.Tensor, distinct: Distinct | None) -> torch.Tensor:
        """The projected content of every item slot, [B, S, D]: once per distinct item and copied
        out by index when the batch has taken that path (``_distinct``: the projection's forward and
        weight gradient shrink by the same factor), else per slot."""
        w = self.content_proj.weight
        B, S = items_BS.shape
        if distinct is not None:
            c_UD = self.content_proj(self.item_content.index_select(0, distinct.items_U).to(w.dtype))
            return c_UD.index_select(0, distinct.inverse_BS.flatten()).view(B, S, -1)
        return self.content_proj(
            self.item_content.index_select(0, items_BS.flatten()).view(B, S, -1).to(w.dtype)
        )

    def item_id_embeddings(self, items: torch.Tensor) -> torch.Tensor:
        """The item-id rows of ``items`` in the tokens' table, [*items.shape, D]: the id's
        embedding alone, no side features, content or event ids (``history_pool: items``)."""
        return F.embedding(self._item_embedding_rows(items) + self.item_offset, self.table.weight)

    def _item_embedding_rows(self, items_BS: torch.Tensor) -> torch.Tensor:
        return item_id_rows(items_BS, self.dims)

    def _rows(self, rows_BxV: torch.Tensor, offsets_V: torch.Tensor) -> torch.Tensor:
        """Per-field rows (-1 = no value) as rows of ``table`` (absent values: the padding row)."""
        if self.pad_row is None:  # every value present by construction
            return rows_BxV + offsets_V
        return torch.where(rows_BxV >= 0, rows_BxV + offsets_V, self.pad_row)

    def _bag_tokens(self, bag_BG: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor | None]:
        """The bag fields' tokens ([B, 1 or M, D] each, in field order) and their validity: None when
        no field makes a token per value (a pooled token is always valid, empty or not)."""
        if not self.bag_tokens:
            return [], None
        ids_BG = self._rows(bag_BG, self.bag_offsets)
        emb_BGD = F.embedding(ids_BG, self.table.weight, padding_idx=self.pad_row)
        present_BG = bag_BG >= 0
        parts, valid, at = [], [], 0
        for M, pool in zip(self.dims.bag_values, self.dims.bag_pooling):
            e_BMD, p_BM = emb_BGD[:, at : at + M], present_BG[:, at : at + M]
            at += M
            if pool == "tokens":
                parts.append(e_BMD * p_BM.unsqueeze(-1))  # absent values: zero, and masked
                valid.append(p_BM)
                continue
            s_B1D = (e_BMD * p_BM.unsqueeze(-1)).sum(1, keepdim=True)
            if pool == "mean":
                s_B1D = s_B1D / p_BM.sum(1, keepdim=True).clamp_min(1).unsqueeze(-1)
            parts.append(s_B1D)
            valid.append(p_BM.new_ones(p_BM.shape[0], 1))
        return parts, torch.cat(valid, dim=1) if "tokens" in self.dims.bag_pooling else None


def _categorical_dropout(cfg: RankerConfig, dims: FeatureDims) -> torch.Tensor:
    """``categorical_dropout`` as one probability per context categorical field [F], by the spec
    columns the dims name; a name that is not one of them is refused."""
    names = dims.columns.get("categorical", [])
    unknown = sorted(set(cfg.categorical_dropout) - set(names))
    if unknown:
        raise ValueError(
            f"model.ranker.categorical_dropout names {unknown}, which are not context categorical "
            f"columns of the feature spec (those are {names or 'none'})"
        )
    p_F = [cfg.categorical_dropout.get(name, 0.0) for name in names]
    return torch.tensor(p_F or [0.0] * len(dims.cat_rows))


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


def item_id_rows(items: torch.Tensor, dims: FeatureDims) -> torch.Tensor:
    """Item rows (of the side tables) as rows of an id-indexed item table: a cold item's (past
    ``item_rows``) is the OOV row 0."""
    if dims.item_side_rows == dims.item_rows:  # no cold items
        return items
    return torch.where(items < dims.item_rows, items, 0)
