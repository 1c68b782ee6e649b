"""The tokenized-feature Transformer ranker: tokens -> blocks -> head -> one click logit per sample.

Shape suffixes: the legend in ``recformer/__init__.py``.

Two forward paths over the same modules (the ``RankerNet`` contract, ``model/protocol.py``):

- ``ranker(batch)``: the training path. No hooks, no host syncs, no branching on tensor values;
  ``ranker.compile()`` (in place, state-dict keys unchanged) captures it as one graph. The last
  block updates only the token(s) the head reads (its other outputs would be dead compute), which
  removes most of that block's matmuls: about (Y - 1) / Y of the model's block FLOPs remain.
- ``ranker.forward_stats(batch)``: the stats path for the health callbacks and the coordinate
  check. It runs eagerly even on a compiled ranker (``torch.compiler.disable``), forms attention
  explicitly to read the logits, and returns its statistics (``BlockStats``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from recformer.batch import Batch
from recformer.config import FeatureDims, RankerConfig
from recformer.model import flops, fm
from recformer.model.blocks import NORMALISED_STREAM, make_block
from recformer.model.cross import CrossTower
from recformer.model.embedding import FeatureTokenizer, drop_event_categoricals, item_id_rows
from recformer.model.init import init_weights
from recformer.model.mup import readout_multiplier
from recformer.model.norms import make_norm
from recformer.model.protocol import BlockStats, ParamKind
from recformer.model.token_params import TokenLayout
from recformer.optim import DEFAULT_RULES


class Head(nn.Module):
    """MLP from the CLS and/or target token to one logit; ``out`` is the muP readout layer.

    Under muP the readout input is multiplied by 1/m (m = d_model / base_d_model), the "MuReadout"
    of Yang et al. 2022: the readout's fan-in grows with width while its Adam LR stays constant.
    """

    def __init__(self, cfg: RankerConfig, d_fields: int = 0) -> None:
        """``d_fields``: the width of the flattened fields it reads too (``head_fields``), or 0."""
        super().__init__()
        self.read = cfg.head
        self.product = cfg.head_product
        n_in = (2 * cfg.d_model if cfg.head == "both" else cfg.d_model) + d_fields
        n_in += cfg.d_model if cfg.head_product else 0
        self.hidden = nn.Linear(n_in, cfg.head_hidden or 2 * cfg.d_model)
        self.out = nn.Linear(self.hidden.out_features, 1)
        self.readout_mult = readout_multiplier(cfg)

    def keep(self, n_tokens: int) -> slice:
        """Positions the head reads: CLS at 0, the target at T - 1 (see FeatureTokenizer)."""
        if self.read == "cls":
            return slice(0, 1)
        if self.read == "target":
            return slice(n_tokens - 1, n_tokens)
        return slice(0, n_tokens, n_tokens - 1)  # 0 and T - 1 (T >= 2: CLS and target always exist)

    def select(self, x_BTD: torch.Tensor) -> torch.Tensor:
        return x_BTD[:, self.keep(x_BTD.shape[1])]

    def forward(self, z_BRD: torch.Tensor, fields_BX: torch.Tensor | None = None) -> torch.Tensor:
        """``z_BRD``: the selected (and normalised) tokens; ``fields_BX``: the flattened fields when
        it reads them; returns logits [B]."""
        parts = [z_BRD.flatten(1)]
        if self.product:
            parts.append(z_BRD[:, 0] * z_BRD[:, 1])
        if fields_BX is not None:
            parts.append(fields_BX)
        x_BX = parts[0] if len(parts) == 1 else torch.cat(parts, -1)
        h_BM = F.gelu(self.hidden(x_BX))
        if self.readout_mult != 1.0:
            h_BM = h_BM * self.readout_mult
        return self.out(h_BM).squeeze(-1)


class Ranker(nn.Module):
    """Pure ``nn.Module`` ranker built from a ``RankerConfig`` and the data's ``FeatureDims``."""

    optimizer_rules = DEFAULT_RULES

    def __init__(self, cfg: RankerConfig, dims: FeatureDims) -> None:
        super().__init__()
        self.cfg = cfg
        self.dims = dims
        self.tokens = FeatureTokenizer(cfg, dims)
        self.block_slices, self.older_slices = self._block_slices()
        layout = self._layout() if cfg.token_params == "specific" else None
        self.blocks = nn.ModuleList(make_block(cfg, layer, layout) for layer in range(cfg.n_layers))
        # Post / DeepNorm blocks end in a norm already; the others leave the stream unnormalised.
        self.final_norm = (
            nn.Identity() if cfg.norm_placement in NORMALISED_STREAM else make_norm(cfg.norm, cfg.d_model)
        )
        pools = {"none": 0, "rating": 2, "mean_target": 2}.get(cfg.history_pool, 1)
        d_fields = fm.n_fields(self.tokens, pools) * cfg.d_model
        self.head = Head(cfg, d_fields if cfg.head_fields else 0)
        self.item_bias = nn.Embedding(dims.item_rows, 1) if cfg.item_bias else None
        self.history_pool, self.history_gate = self._history_poolers(cfg, dims)
        self.cross = (
            CrossTower(d_fields, cfg.cross_layers, not cfg.head_fields, cfg.cross_hidden)
            if cfg.cross_layers
            else None
        )
        init_weights(self)

    @staticmethod
    def _history_poolers(
        cfg: RankerConfig, dims: FeatureDims
    ) -> tuple[nn.Module | None, nn.Embedding | None]:
        """What pools the history for the fields (``history_pool``): DIN's attention unit
        (``target``, ``mean_target``), or the gate table of ``rating``, one logit per value of the
        events' first categorical (MovieLens: the rating); None each otherwise."""
        if cfg.history_pool not in ("mean", "none") and not dims.max_len:  # every other pool reads events
            raise ValueError(
                f"history_pool={cfg.history_pool!r} needs a history (a feature spec with a sequence)"
            )
        if cfg.history_pool == "rating" and not dims.hist_cat_rows:
            raise ValueError(
                "history_pool='rating' needs an event categorical (sequence.categorical in the spec)"
            )
        targeted = cfg.history_pool in ("target", "mean_target")
        unit = fm.attention_unit(cfg.d_model, cfg.history_unit_hidden) if targeted else None
        gate = nn.Embedding(dims.hist_cat_rows[0], 1) if cfg.history_pool == "rating" else None
        return unit, gate

    def _layout(self) -> TokenLayout:
        """Where the non-sequence tokens sit (``token_params: specific``): CLS and the context in
        front, the target (and its own content token) at the back; see ``FeatureTokenizer``."""
        back = 2 if self.tokens.content_tokens == "target" else 1
        return TokenLayout(self.tokens.n_context, back, self.n_tokens)

    def _block_slices(self) -> tuple[list[slice] | None, list[slice]]:
        """The tokenizer's token positions the blocks see, as slices (None: all of them), and those
        they do not: the history events before the last ``history_tokens`` (their content tokens
        too, with ``content_tokens: all``). The history is left-padded, most recent last
        (``SequenceSpec``), so the kept slots hold a sample's most recent events."""
        n_context, L, kept = self.tokens.n_context, self.dims.max_len, self.cfg.history_tokens
        if not kept or kept >= L:
            return None, []
        drop = L - kept
        older = [slice(n_context, n_context + drop)]
        if self.tokens.content_tokens != "all":
            return [slice(0, n_context), slice(n_context + drop, None)], older
        contents = n_context + L  # the events' content tokens, then the target's, then the target
        older.append(slice(contents, contents + drop))
        return [slice(0, n_context), slice(n_context + drop, contents), slice(contents + drop, None)], older

    @property
    def n_tokens(self) -> int:
        """Tokens per sample T the blocks attend over (CLS + context + history + target)."""
        if self.block_slices is None:
            return self.tokens.n_tokens
        summary = 1 if self.cfg.history_older == "mean" else 0
        return summary + sum(len(range(self.tokens.n_tokens)[s]) for s in self.block_slices)

    def _tokens(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """The blocks' tokens and key mask ([B, 1, 1, T], None when every token is valid), and the
        tokenizer's full output, which the fields beside the blocks read."""
        all_BTD, valid_BT = self.tokens(batch)
        x_BTD = all_BTD
        if self.block_slices is not None:
            parts = [all_BTD[:, s] for s in self.block_slices]
            masks = [valid_BT[:, s] for s in self.block_slices]
            if self.cfg.history_older == "mean":  # one token after the context: the older events
                older_BLD = torch.cat([all_BTD[:, s] for s in self.older_slices], dim=1)
                older_BL = torch.cat([valid_BT[:, s] for s in self.older_slices], dim=1)
                parts.insert(1, fm.masked_mean(older_BLD, older_BL).unsqueeze(1))
                masks.insert(1, older_BL.any(1, keepdim=True))
            x_BTD, valid_BT = torch.cat(parts, dim=1), torch.cat(masks, dim=1)
        return x_BTD, None if valid_BT is None else valid_BT[:, None, None, :], all_BTD

    def transformer_blocks(self) -> nn.ModuleList:
        return self.blocks

    def embedding_groups(self) -> dict[str, tuple[nn.Embedding, int, int]]:
        return self.tokens.embedding_groups()

    def set_item_tables(self, content: torch.Tensor | None, features: torch.Tensor | None) -> None:
        """Copy the item side table (content [item_rows, P] any float dtype, features [item_rows, I]
        int) into the persistent buffers; row 0 is the OOV row. See ``FeatureTokenizer``."""
        self.tokens.set_item_tables(content, features)

    def flop_terms(self) -> list[flops.Term]:
        """Every block but the last runs all T tokens; the last updates only the R tokens the head
        reads (its keys and values still cover all T). The head runs once per sample; the
        tokenizer counts its own projections."""
        T, D = self.n_tokens, self.cfg.d_model
        R = len(range(T)[self.head.keep(T)])
        terms = self.tokens.flop_terms()
        for i, block in enumerate(self.blocks):
            terms += flops.block_terms(block, D, T, R if i == len(self.blocks) - 1 else None)
        once = flops.matrix_params(self.head) + (flops.matrix_params(self.cross) if self.cross else 0)
        if self.history_pool is not None:  # the attention unit once per history slot
            terms.append(flops.Matmul(flops.matrix_params(self.history_pool), self.dims.max_len))
        return terms + [flops.Matmul(once, 1)]

    def param_kinds(self) -> dict[str, ParamKind]:
        """muP / optimizer category of every parameter (Yang et al. 2022, Table 3 for Adam):

        - ``input``: projections of the dense, embedding and content inputs (fixed fan-in): init
          and Adam LR constant in width, weight decay as any dense matrix;
        - ``table``: id tables (the tokenizer's, the per-item bias): a row gets a gradient only where
          a batch reads it; init and LR constant in width, no weight decay;
        - ``embedding``: CLS / slot embeddings: init and Adam LR constant in width, no weight decay;
        - ``hidden``: matrices with both dimensions proportional to width: init std / sqrt(m),
          Adam LR / m;
        - ``vector``: norm gains and biases: constant;
        - ``readout``: the head's last weight: constant LR, its input is scaled by 1/m instead.
        """
        kinds: dict[str, ParamKind] = self.tokens.param_kinds("tokens.")
        for name, p in self.named_parameters():
            if name.startswith("tokens."):
                continue
            elif name in ("head.out.weight", "cross.out.weight"):
                kinds[name] = "readout"
            elif name in ("item_bias.weight", "history_gate.weight"):
                kinds[name] = "table"
            elif p.ndim == 1:
                kinds[name] = "vector"
            elif p.ndim == 2 or name.endswith("_specific"):  # [S, out, in]: S hidden matrices
                kinds[name] = "hidden"
            else:
                raise RuntimeError(f"param_kinds: no rule for parameter {name} of shape {tuple(p.shape)}")
        return kinds

    @property
    def has_branch(self) -> bool:
        """Whether a logit term sits beside the head's (``item_bias``, ``fm``, or ``cross_layers``
        with its own readout): what ``forward_parts`` returns second."""
        crossed = self.cross is not None and self.cross.out is not None
        return self.item_bias is not None or self.cfg.fm or crossed

    def forward(self, batch: Batch) -> torch.Tensor:
        """Click logits, float32 [B]: the head's logit plus the branch's (``forward_parts``)."""
        return self._logits(*self.forward_parts(batch))

    def forward_parts(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The head's logit and the sum of the terms beside the blocks (None without any), float32
        [B] each. The module's ``branch_loss`` trains each part on the labels too."""
        x_BTD, attend_B11T, all_BTD = self._tokens(batch)
        wide_B, fields_BX = self._beside(all_BTD, batch)
        for block in self.blocks[:-1]:
            x_BTD = block(x_BTD, attend_B11T)
        # The head reads 1-2 tokens, so the last block updates only those (queries, out projection
        # and MLP on R tokens instead of T); their keys and values still come from every token.
        z_BRD = self.blocks[-1](x_BTD, attend_B11T, self.head.keep(x_BTD.shape[1]))
        head_B = self.head(self.final_norm(z_BRD), fields_BX).float()
        return head_B, None if wide_B is None else wide_B.float()

    def _beside(self, x_BTD: torch.Tensor, batch: Batch) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """What the tokens feed beside the blocks: the logit terms added to the head's (the per-item
        bias ``item_bias``, the FM crosses ``fm``, the cross network ``cross_layers``; the crosses
        read out like the head, times muP's 1/m), and the flattened fields the head reads
        (``head_fields``, through the cross layers when there are some); each None when off."""
        wide, fields_BX = [], None
        if self.item_bias is not None:
            wide.append(self.item_bias(item_id_rows(batch.target_item, self.dims)).squeeze(-1))
        if self.cfg.fm or self.cross is not None or self.cfg.head_fields:
            v_BFD = self._fields(x_BTD, batch)
            crossed_BX = None if self.cross is None else self.cross.cross(v_BFD)
            if self.cfg.fm:
                wide.append(fm.pairwise(v_BFD) * self.head.readout_mult)
            if self.cross is not None and self.cross.out is not None:
                wide.append(self.cross.logit(v_BFD, crossed_BX) * self.head.readout_mult)
            if self.cfg.head_fields:
                fields_BX = v_BFD.flatten(1) if crossed_BX is None else crossed_BX
        return (sum(wide[1:], wide[0]) if wide else None), fields_BX

    def _fields(self, x_BTD: torch.Tensor, batch: Batch) -> torch.Tensor:
        """The fields [B, F, D] the terms beside the blocks read (``fm.fields``), the history pooled
        as ``history_pool`` says."""
        pool = self.cfg.history_pool
        gate_BL = None if self.history_gate is None else self._gate(batch)
        items_BLD = self.tokens.item_id_embeddings(batch.hist_item) if pool == "items" else None
        return fm.fields(
            self.tokens,
            x_BTD,
            batch.hist_mask,
            self.history_pool,
            pool != "none",
            gate_BL,
            pool == "mean_target",
            items_BLD,
        )

    def _gate(self, batch: Batch) -> torch.Tensor:
        """[B, L]: each event's weight in the first of ``gated_means``'s fields, sigmoid of its
        first categorical's row of ``history_gate``. In training the rating dropout hides an event's
        rating from the gate too (its OOV row, unknown), with its own draw: at ff4283c the gate read
        every rating, and its fits learned faster, then fell behind (docs/levers.md)."""
        cat_BLC = batch.hist_cat
        if self.training and self.cfg.history_cat_dropout > 0:
            cat_BLC = drop_event_categoricals(cat_BLC, self.cfg.history_cat_dropout)
        return torch.sigmoid(self.history_gate(cat_BLC[..., 0]).squeeze(-1).float())

    @staticmethod
    def _logits(head_B: torch.Tensor, wide_B: torch.Tensor | None) -> torch.Tensor:
        """``forward``'s sum: each part in float32 first."""
        return head_B.float() if wide_B is None else head_B.float() + wide_B.float()

    @torch.compiler.disable
    def forward_stats(self, batch: Batch) -> tuple[torch.Tensor, BlockStats]:
        """The logits of ``forward`` and the blocks' statistics (``BlockStats``), eagerly."""
        x_BTD, attend_B11T, all_BTD = self._tokens(batch)
        wide_B, fields_BX = self._beside(all_BTD, batch)
        if attend_B11T is None:
            w_BT = x_BTD.new_ones(x_BTD.shape[:2], dtype=torch.float32)
        else:
            w_BT = attend_B11T[:, 0, 0].float()
        n_valid = w_BT.sum()

        hidden = [x_BTD.detach()]
        resid, logit_max, entropy, cos = [], [], [], []
        for block in self.blocks:
            y_BTD, attn = block.forward_stats(x_BTD, attend_B11T)
            with torch.no_grad():
                y32_BTD, x32_BTD = y_BTD.detach().float(), x_BTD.detach().float()
                resid.append(((y32_BTD.square().mean(-1) * w_BT).sum() / n_valid).sqrt())
                cos.append((F.cosine_similarity(x32_BTD, y32_BTD, dim=-1) * w_BT).sum() / n_valid)
            logit_max.append(attn.logit_max_N.float())
            entropy.append(attn.entropy_N.float())
            hidden.append(y_BTD.detach())
            x_BTD = y_BTD
        # Select first, then normalise: the final norm is per token, so only the read tokens need it.
        logits_B = self._logits(self.head(self.final_norm(self.head.select(x_BTD)), fields_BX), wide_B)
        stats = BlockStats(
            hidden, torch.stack(resid), torch.stack(logit_max), torch.stack(entropy), torch.stack(cos)
        )
        return logits_B, stats

    def extra_repr(self) -> str:
        c = self.cfg
        return (
            f"T={self.n_tokens}, D={c.d_model}, Y={c.n_layers}, N={c.n_heads}, placement={c.norm_placement}, "
            f"norm={c.norm}, qk_norm={c.qk_norm}, init={c.init}, mup={c.mup} (m={c.width_mult:.3g})"
        )
