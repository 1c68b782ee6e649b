"""Baselines run by the same module and CLI as the Transformer (``RankerNet``, ``model/protocol.py``).

- ``popularity``: one learned logit per item plus a global bias: a logistic regression on the item
  id, i.e. the item's (smoothed) positive rate. What a ranker must beat to be worth anything.
- ``din``: Deep Interest Network (Zhou et al., KDD 2018): target attention over the history
  (an MLP scores each event against the target from [h, t, h - t, h * t]; the weights are not
  softmax-normalised, so the pooled vector keeps the intensity of interest), then an MLP over the
  target, the pooled history and the context tokens.
- ``deepfm``: DeepFM (Guo et al., IJCAI 2017): a factorisation machine (first-order terms plus
  every pairwise inner product of the field embeddings) beside a DNN over the same embeddings.
- ``dcnv2`` / ``dcnv2_parallel``: DCN-V2 (Wang et al., WWW 2021): a cross network
  (x_{l+1} = x_0 * (W_l x_l + b_l) + x_l, full-rank W) stacked under a DNN, or beside it.
- ``bst``: Behavior Sequence Transformer (Chen et al., DLP-KDD 2019): one Transformer layer
  (post-norm, as in the paper) over the history events and the target, its outputs concatenated
  with the other fields into an MLP of 1024-512-256 LeakyReLU units.

Every model but popularity shares the Transformer's tokenizer (``FeatureTokenizer``) and so the same
features: the models differ only in what happens after the embeddings. The fields of the
non-sequence models (DeepFM, DCN-V2) are the tokenizer's context tokens (categoricals, dense, per-row
embeddings, bags), the history mean-pooled over its events (as FuxiCTR and TorchRec pool a sequence
feature), and the target item token.

Shape suffixes: the legend in ``recformer/__init__.py``.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import nn

from recformer.batch import Batch
from recformer.config import FeatureDims, RankerConfig
from recformer.model import flops, fm
from recformer.model.blocks import PostNormBlock
from recformer.model.cross import CrossLayer, dnn
from recformer.model.embedding import FeatureTokenizer, item_id_rows
from recformer.model.init import init_tokens
from recformer.model.protocol import BlockStats, ParamKind
from recformer.optim import DEFAULT_RULES

OPTIONAL_GROUPS = tuple(dataclasses.replace(r, allow_empty=True) for r in DEFAULT_RULES)
"""The Transformer's group rules, each optional: a baseline may have no hidden matrices
(popularity) or no readout."""


def _log_odds(p: float) -> float:
    return math.log(p / (1.0 - p))


class PopularityRanker(nn.Module):
    """logit = bias + item_logit[target item]."""

    optimizer_rules = OPTIONAL_GROUPS
    n_tokens = 1

    def __init__(self, cfg: RankerConfig, dims: FeatureDims) -> None:
        super().__init__()
        self.cfg, self.dims = cfg, dims
        self.item_logit = nn.Embedding(dims.item_rows, 1)
        nn.init.zeros_(self.item_logit.weight)
        self.bias = nn.Parameter(torch.tensor([_log_odds(cfg.base_rate)]))

    def set_item_tables(self, content: torch.Tensor | None, features: torch.Tensor | None) -> None:
        """Content is not used by this baseline."""

    def transformer_blocks(self) -> tuple[nn.Module, ...]:
        return ()

    def embedding_groups(self) -> dict[str, tuple[nn.Embedding, int, int]]:
        return {}  # one logit per item: no embedding rows to watch

    def param_kinds(self) -> dict[str, ParamKind]:
        return {"item_logit.weight": "table", "bias": "vector"}

    def flop_terms(self) -> list[flops.Term]:
        return []  # a table lookup and an add

    def forward(self, batch: Batch) -> torch.Tensor:
        return (self.item_logit(item_id_rows(batch.target_item, self.dims)).squeeze(-1) + self.bias).float()

    def forward_stats(self, batch: Batch) -> tuple[torch.Tensor, BlockStats | None]:
        return self(batch), None


class TokenBaseline(nn.Module):
    """The ``RankerNet`` plumbing every tokenizer-based baseline shares: its tokenizer's tables,
    no Transformer blocks (BST overrides), its parameters' kinds (``out.weight`` the readout), and
    the init: normal(init_std) matrices, zero biases, the readout zero with its bias at the base
    rate's log-odds, like the Transformer's head."""

    optimizer_rules = OPTIONAL_GROUPS

    def _setup(self, cfg: RankerConfig, dims: FeatureDims, needs_history: str | None = None) -> None:
        """The shared tokenizer; ``needs_history``: the arch's name, refused without a sequence."""
        if needs_history and not dims.max_len:
            raise ValueError(f"arch='{needs_history}' needs a history (feature spec with a sequence)")
        self.cfg, self.dims = cfg, dims
        self.tokens = FeatureTokenizer(cfg, dims)
        self.n_context = self.tokens.n_context
        self.max_len = dims.max_len

    def _init(self) -> None:
        for name, m in self.named_modules():
            if isinstance(m, nn.Linear) and not name.startswith("tokens.") and m is not self.out:
                nn.init.normal_(m.weight, std=self.cfg.init_std)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
        nn.init.zeros_(self.out.weight)  # start at the base rate, like the Transformer's head
        nn.init.constant_(self.out.bias, _log_odds(self.cfg.base_rate))
        with torch.no_grad():
            init_tokens(self.tokens, self.cfg)  # the Transformer's token init, not PyTorch's N(0, 1)

    @property
    def n_tokens(self) -> int:
        return self.tokens.n_tokens

    def set_item_tables(self, content: torch.Tensor | None, features: torch.Tensor | None) -> None:
        self.tokens.set_item_tables(content, features)

    def transformer_blocks(self) -> tuple[nn.Module, ...]:
        return ()

    def embedding_groups(self) -> dict[str, tuple[nn.Embedding, int, int]]:
        return self.tokens.embedding_groups()

    def forward_stats(self, batch: Batch) -> tuple[torch.Tensor, BlockStats | None]:
        return self(batch), None

    def param_kinds(self) -> dict[str, ParamKind]:
        kinds = self.tokens.param_kinds("tokens.")
        for name, p in self.named_parameters():
            if name.startswith("tokens."):
                continue
            elif name == "out.weight":
                kinds[name] = "readout"
            else:
                kinds[name] = "vector" if p.ndim == 1 else "hidden"
        return kinds

    def fields(self, batch: Batch) -> torch.Tensor:
        """[B, n_fields, D]: the FM fields (``model/fm.py``): context tokens but CLS, the pooled
        history, the target item token."""
        x_BTD, _ = self.tokens(batch)
        return fm.fields(self.tokens, x_BTD, batch.hist_mask)

    @property
    def n_fields(self) -> int:
        return fm.n_fields(self.tokens)


class DINRanker(TokenBaseline):
    def __init__(self, cfg: RankerConfig, dims: FeatureDims) -> None:
        super().__init__()
        self._setup(cfg, dims, needs_history="din")
        D = cfg.d_model
        self.attn_mlp = fm.attention_unit(D)
        hidden = cfg.head_hidden or 2 * D
        # Context tokens except CLS, the pooled history and the target.
        d_in = (self.n_context - 1) * D + 2 * D
        self.mlp = nn.Sequential(
            nn.Linear(d_in, hidden), nn.GELU(), nn.Dropout(cfg.dropout), nn.Linear(hidden, hidden), nn.GELU()
        )
        self.out = nn.Linear(hidden, 1)
        self._init()

    def flop_terms(self) -> list[flops.Term]:
        """The attention MLP once per history slot, the MLP and output once per sample, plus the
        tokenizer's input projections."""
        per_sample = flops.matrix_params(self.mlp) + flops.matrix_params(self.out)
        return [
            *self.tokens.flop_terms(),
            flops.Matmul(flops.matrix_params(self.attn_mlp), self.max_len),
            flops.Matmul(per_sample, 1),
        ]

    def forward(self, batch: Batch) -> torch.Tensor:
        x_BTD, _ = self.tokens(batch)
        B, _, D = x_BTD.shape
        ctx_BTD = x_BTD[:, 1 : self.n_context]
        hist_BLD = x_BTD[:, self.n_context : self.n_context + self.max_len]
        tgt_BD = x_BTD[:, -1]
        pooled_BD = fm.target_pool(self.attn_mlp, hist_BLD, tgt_BD, batch.hist_mask)
        h = self.mlp(torch.cat([ctx_BTD.reshape(B, -1), pooled_BD, tgt_BD], -1))
        return self.out(h).squeeze(-1).float()


DNN_WIDTHS = [400, 400, 400]
"""The DNN of DeepFM and DCN-V2 when ``head_hidden`` is 0: three layers of 400 units, the default of
both papers' public implementations (and FuxiCTR's)."""


class DeepFMRanker(TokenBaseline):
    """logit = first-order terms + FM pairwise interactions + DNN (Guo et al. 2017). The first-order
    terms are a linear function of the field embeddings (a scalar per id is one of its solutions),
    and with ``first_order: ids`` also a scalar per id of its own (``_id_weights``)."""

    def __init__(self, cfg: RankerConfig, dims: FeatureDims) -> None:
        super().__init__()
        self._setup(cfg, dims)
        d_in = self.n_fields * cfg.d_model
        widths = [cfg.head_hidden] * 3 if cfg.head_hidden else DNN_WIDTHS
        self.first = nn.Linear(d_in, 1)
        self.dnn = dnn(d_in, widths, cfg.dropout)
        self.out = nn.Linear(widths[-1], 1)
        self._init()
        # One scalar per row of the tokens' table, so a sample's ids index both alike; built after
        # the rest is drawn, so every other weight starts as without it, and zero: the same model.
        rows = self.tokens.table.num_embeddings
        ids = cfg.first_order == "ids"
        self.first_ids = nn.Embedding(rows, 1, _weight=torch.zeros(rows, 1)) if ids else None

    def param_kinds(self) -> dict[str, ParamKind]:
        kinds = super().param_kinds()
        if self.first_ids is not None:
            kinds["first_ids.weight"] = "table"  # a row trains only where a batch reads it
        return kinds

    def _id_weights(self, batch: Batch) -> torch.Tensor:
        """[B]: the sum of the per-id scalars of the context categoricals and the target item's
        bag (id and side-feature rows; an absent value's padding row adds nothing)."""
        ids_BJ = self.tokens.sample_id_rows(batch)
        w = self.first_ids.weight
        return F.embedding_bag(ids_BJ, w, mode="sum", padding_idx=self.tokens.pad_row).squeeze(-1)

    def flop_terms(self) -> list[flops.Term]:
        once = flops.matrix_params(self.first) + flops.matrix_params(self.dnn) + flops.matrix_params(self.out)
        return [*self.tokens.flop_terms(), flops.Matmul(once, 1)]

    def forward(self, batch: Batch) -> torch.Tensor:
        v_BFD = self.fields(batch)
        flat_BX = v_BFD.flatten(1)
        fm_B = fm.pairwise(v_BFD)
        first_B = self.first(flat_BX).squeeze(-1)
        if self.first_ids is not None:
            first_B = first_B + self._id_weights(batch)
        return (first_B + fm_B + self.out(self.dnn(flat_BX)).squeeze(-1)).float()


class DCNv2Ranker(TokenBaseline):
    """DCN-V2 (Wang et al. 2021): ``n_layers`` cross layers over the concatenated field embeddings,
    then a DNN (``stacked``), or a DNN beside them whose outputs are concatenated (``parallel``)."""

    def __init__(self, cfg: RankerConfig, dims: FeatureDims, parallel: bool = False) -> None:
        super().__init__()
        self._setup(cfg, dims)
        self.parallel = parallel
        d_in = self.n_fields * cfg.d_model
        widths = [cfg.head_hidden] * 3 if cfg.head_hidden else DNN_WIDTHS
        self.cross = nn.ModuleList(CrossLayer(d_in) for _ in range(cfg.n_layers))
        self.dnn = dnn(d_in, widths, cfg.dropout)
        self.out = nn.Linear(widths[-1] + (d_in if parallel else 0), 1)
        self._init()
        for layer in self.cross:
            layer.reset()

    def flop_terms(self) -> list[flops.Term]:
        once = sum(flops.matrix_params(m) for m in (self.cross, self.dnn, self.out))
        return [*self.tokens.flop_terms(), flops.Matmul(once, 1)]

    def forward(self, batch: Batch) -> torch.Tensor:
        x0_BX = self.fields(batch).flatten(1)
        x_BX = x0_BX
        for layer in self.cross:
            x_BX = layer(x0_BX, x_BX)
        h_BM = torch.cat([x_BX, self.dnn(x0_BX)], -1) if self.parallel else self.dnn(x_BX)
        return self.out(h_BM).squeeze(-1).float()


BST_WIDTHS = [1024, 512, 256]
"""The MLP of BST (Chen et al. 2019, section 2.3)."""


class BSTRanker(TokenBaseline):
    """BST (Chen et al. 2019): one post-norm Transformer layer over the history events and the
    target (positions from the tokenizer's slot embeddings), every output of it flattened beside the
    other fields into an MLP of 1024-512-256 LeakyReLU units."""

    def __init__(self, cfg: RankerConfig, dims: FeatureDims) -> None:
        super().__init__()
        self._setup(cfg, dims, needs_history="bst")
        D = cfg.d_model
        self.block = PostNormBlock(dataclasses.replace(cfg, norm="layer", qk_norm="none"), 0)
        d_in = (self.n_context - 1 + self.max_len + 1) * D
        self.mlp = dnn(d_in, BST_WIDTHS, cfg.dropout, nn.LeakyReLU)
        self.out = nn.Linear(BST_WIDTHS[-1], 1)
        self._init()
        for m in self.block.modules():  # norms start as the identity
            if hasattr(m, "weight") and m.weight is not None and m.weight.ndim == 1:
                nn.init.ones_(m.weight)

    def transformer_blocks(self) -> tuple[nn.Module, ...]:
        return (self.block,)

    def flop_terms(self) -> list[flops.Term]:
        S = self.max_len + 1
        once = flops.matrix_params(self.mlp) + flops.matrix_params(self.out)
        terms = flops.block_terms(self.block, self.cfg.d_model, S)
        return [*self.tokens.flop_terms(), *terms, flops.Matmul(once, 1)]

    def _sequence(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x_BTD, valid_BT = self.tokens(batch)
        seq_BSD = x_BTD[:, self.n_context :]  # the history events and the target
        attend_B11S = valid_BT[:, None, None, self.n_context :]
        return x_BTD[:, 1 : self.n_context], seq_BSD, attend_B11S

    def _read(self, ctx_BxD: torch.Tensor, y_BSD: torch.Tensor, attend_B11S: torch.Tensor) -> torch.Tensor:
        y_BSD = y_BSD * attend_B11S[:, 0, 0, :, None]  # padded events' outputs are not features
        h_BM = self.mlp(torch.cat([ctx_BxD.flatten(1), y_BSD.flatten(1)], -1))
        return self.out(h_BM).squeeze(-1).float()

    def forward(self, batch: Batch) -> torch.Tensor:
        ctx_BxD, seq_BSD, attend_B11S = self._sequence(batch)
        return self._read(ctx_BxD, self.block(seq_BSD, attend_B11S), attend_B11S)

    @torch.compiler.disable
    def forward_stats(self, batch: Batch) -> tuple[torch.Tensor, BlockStats | None]:
        ctx_BxD, seq_BSD, attend_B11S = self._sequence(batch)
        y_BSD, attn = self.block.forward_stats(seq_BSD, attend_B11S)
        w_BS = attend_B11S[:, 0, 0].float()
        with torch.no_grad():
            y32, x32 = y_BSD.detach().float(), seq_BSD.detach().float()
            rms = ((y32.square().mean(-1) * w_BS).sum() / w_BS.sum()).sqrt()
            cos = (torch.nn.functional.cosine_similarity(x32, y32, dim=-1) * w_BS).sum() / w_BS.sum()
        stats = BlockStats(
            [seq_BSD.detach(), y_BSD.detach()],
            rms[None],
            attn.logit_max_N[None],
            attn.entropy_N[None],
            cos[None],
        )
        return self._read(ctx_BxD, y_BSD, attend_B11S), stats
