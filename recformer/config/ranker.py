"""``RankerConfig``: the tokenized-feature Transformer ranker and its scale controls (DESIGN section 4)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Literal

# ----------------------------------------------------------------------------------------------
# The ranker (DESIGN section 4)
# ----------------------------------------------------------------------------------------------

NormPlacement = Literal["post", "pre", "sandwich", "reordered", "deepnorm"]
InitMethod = Literal["normal", "xavier", "scaled", "depth", "deepnorm", "mup"]


@dataclass
class RankerConfig:
    """The tokenized-feature Transformer ranker and its scale controls."""

    d_model: int = 64
    """Model width D."""
    n_layers: int = 2
    """Number of Transformer blocks L."""
    n_heads: int = 4
    """Attention heads N; d_model must be divisible by it."""
    mlp_ratio: float = 4.0
    """MLP hidden width as a multiple of d_model (SwiGLU uses 2/3 of it, rounded up to 8)."""
    mlp: Literal["gelu", "swiglu", "relu"] = "gelu"
    """MLP type: ``gelu`` (exact, erf), ``swiglu``, or ``relu`` (on 2 CPU threads the default's
    GELU forward and backward take about 3.2 ms of its 75 ms training step, ReLU 0.4 ms)."""
    norm_placement: NormPlacement = "pre"
    """Where the norms sit in each residual branch: post, pre, sandwich, reordered (OLMo 2), deepnorm."""
    norm: Literal["rms", "layer"] = "rms"
    """RMSNorm or LayerNorm, in the blocks and in QK-Norm (there gain-only)."""
    layernorm_scaling: bool = False
    """Scale each block's norm output by 1/sqrt(layer index), layers counted from 1 (Curse of Depth)."""
    qk_norm: Literal["none", "head", "full"] = "head"
    """Normalise queries and keys (learnable gain) before the dot product: per head, over the full
    width, or not; bounds the attention logits however large the q/k weights grow."""
    init: InitMethod = "scaled"
    """Init method: normal(std), xavier, scaled (GPT-2, std/sqrt(2Y) on residual-writing projections),
    depth (std/sqrt(2(l+1)) in block l), deepnorm (DeepNet beta). 'mup' is the old name of normal
    with mup=true (deprecated: set mup=true, which brings muP's init with it)."""
    init_std: float = 0.02
    """Base standard deviation of the normal-family inits."""
    mup: bool = False
    """muP, one switch for all of it (``recformer.model.mup``): hidden-matrix init std / sqrt(m) and
    Adam LR / m, readout input / m, attention scale 1/d_head; m = d_model / base_d_model."""
    base_d_model: int = 64
    """Width at which muP hyperparameters were tuned; m = d_model / base_d_model."""
    dense_tokens: int = 1
    """Tokens the dense features are projected into (one shared linear map)."""
    dense_per_feature: bool = False
    """A token per dense feature instead, ``x_j * w_j + b_j`` (the numerical embedding of
    FT-Transformer, Gorishniy et al. 2021): each feature attended to on its own."""
    content_tokens: Literal["add", "target", "all"] = "add"
    """Where an item's projected content embedding goes: ``add``ed to its item token; the
    ``target``'s as a token of its own (history events keep theirs added); or ``all`` (every
    history event's too: L more tokens)."""
    history_content: bool = True
    """Whether the history events' tokens carry their items' content projection as the target's
    does; False: the target's alone (what a CTR library's user feeds: the candidate's text, not
    that of every item in the history). Needs ``content_tokens`` ``add`` or ``target``."""
    embedding_dropout: float = 0.0
    """Dropout on the token embeddings before the first block (on sparse-id rankers it regularises
    the embedding tables, which carry most of the parameters)."""
    history_cat_dropout: float = 0.0
    """In training, each history event's categoricals (on MovieLens its rating) are replaced by
    their OOV row (unknown) with this probability; the event keeps its item, side features and
    time gap. Aimed at the model's reliance on the user's recent ratings, which separate users and
    cost within-user order (docs/levers.md)."""
    categorical_dropout: dict[str, float] = field(default_factory=dict)
    """In training, each row's value of a named context categorical (a spec ``categorical`` column)
    is replaced by its OOV row (unknown) with the given probability, one draw per row and field:
    ``{user_id: 0.25}`` trains the model on rows whose user it cannot look up, so it reads a user's
    taste from the history and priors as well as from the id's row (which holds the user's training
    weeks), and has learnt the unknown row a new user gets. Evaluation reads every value as logged."""
    item_bias: bool = False
    """A learned logit per target item added to the head's output: the first-order term of
    FM / Wide & Deep (Rendle 2010; Cheng et al. 2016), so an item's own rate is one scalar the
    blocks need not carry, and the tokens model how it differs by user and context."""
    first_order: Literal["fields", "ids"] = "fields"
    """DeepFM's first-order term (read by ``arch: deepfm`` alone): ``fields``, a linear map of the
    flattened field embeddings (a scalar per id is one of its solutions, shared with the FM's and
    the DNN's use of that embedding); ``ids``, that plus a learned scalar per id of the context
    categoricals and of the target item's bag (its id and side features), summed: the w_i x_i of
    the FM as Guo et al. 2017 and the CTR libraries (DeepCTR's linear part) build it, each id's
    weight its own. The scalars start at zero and take ``embedding_l2`` as any table does."""
    fm: bool = False
    """DeepFM's factorisation machine beside the blocks: the pairwise inner products of the fields
    (context tokens, mean-pooled history, target; ``model/fm.py``) added to the head's logit
    (Rendle 2010; Guo et al. 2017): explicit user x item and history x item crosses, meant for
    the within-user (GAUC) order DeepFM has and the Transformer lacks. On MovieLens it did not
    raise validation AUC or GAUC (docs/quality.md). No parameters of its own; under muP
    multiplied by 1/m like the readout."""
    cross_layers: int = 0
    """DCN-V2's cross network beside the blocks (Wang et al. 2021; ``model/cross.py``): this many
    full-rank cross layers over the same fields as ``fm``, projected to a logit added to the head's
    (the parallel DCN-V2 with the blocks as its deep network): explicit user x item crosses of any
    degree up to cross_layers + 1. 0: none. Under muP its logit is multiplied by 1/m like the
    readout; its layers keep DCN-V2's Glorot init (not width-scaled)."""
    cross_hidden: list[int] = field(default_factory=list)
    """Widths of a ReLU DNN over the same flattened fields beside the cross layers, its output
    concatenated with theirs before the cross network's logit: DCN-V2's parallel structure
    (cross layers + DNN) as the branch, the blocks and head beside it. Needs ``cross_layers`` >= 1
    and the cross network's own logit (no ``head_fields``). Glorot init and, under muP, the
    ``hidden`` kind as the cross layers have. []: the cross layers alone."""
    history_pool: Literal["mean", "target", "mean_target", "rating", "items", "none"] = "mean"
    """How the fields of ``fm``, ``cross_layers`` and ``head_fields`` pool the history: ``mean``
    over its valid events, or ``target``: DIN's target attention (Zhou et al. 2018; an activation
    unit weighs each event by the target, ``model/fm.py``), the user's interest in this item,
    which the blocks reach only through softmax attention among all tokens. Needs one of the three
    and a history. On MovieLens it lost validation AUC and GAUC at 1.39x the FLOPs (docs/levers.md).
    ``rating``: two fields, the events' mean weighted by a learned gate of their first categorical
    (sigmoid of one logit per value: on MovieLens the rating) and the mean weighted by its
    complement, what the user liked apart from what they did not (``fm.gated_means``; in training
    ``history_cat_dropout`` hides ratings from the gate as from the tokens). ``mean_target``: two
    fields, the mean and DIN's target-weighted sum beside it (the unit's width
    ``history_unit_hidden``), so the field starts from the mean that ``target`` replaces. ``items``:
    the mean of the events' item-id rows alone (the tokens' table; no rating, gap, side features or
    content), what the user watched without how they rated it. ``none``:
    no history field; the history reaches the logit through the blocks alone."""
    history_unit_hidden: int = 0
    """Width of the attention unit's hidden layer (``history_pool: target | mean_target``); 0: 2 x
    d_model, the DIN baseline's. Its first layer reads [h, t, h - t, h * t] of each history slot,
    4 x d_model x width multiply-adds a slot."""
    history_tokens: int = 0
    """How many of the most recent history events the blocks attend over (0: all ``max_len``). The
    tokenizer embeds every event and the fields of ``fm``, ``cross_layers`` and ``head_fields`` pool
    them all; the older events' tokens are left out of the blocks, whose cost grows with the
    tokens (attention with their square). On MovieLens 32 of 50 trained 1.25x as fast and lost
    validation AUC and GAUC, with the older events as one token too (docs/levers.md)."""
    history_older: Literal["drop", "mean"] = "drop"
    """With ``history_tokens``, what the blocks get of the older events: nothing (``drop``), or one
    token, the mean of their tokens over the valid ones (``mean``; masked when a sample has none)."""
    head_fields: bool = False
    """The head's MLP also reads the fields of ``fm`` (flattened; through the cross layers first
    when ``cross_layers`` > 0, which then add no logit of their own) beside the tokens it reads: the
    stacked DCN-V2 / Wide & Deep's deep part, with the blocks' readout as one more input."""
    head_product: bool = False
    """With ``head: both``, the head's MLP also reads the elementwise product of the CLS and target
    readouts: an explicit user x item interaction (the h * t input of DIN's attention unit, the
    inner product of a two-tower model) that an MLP over their concatenation only approximates."""
    token_params: Literal["shared", "specific"] = "shared"
    """``specific``: each non-sequence token (CLS, context features, target) has its own query /
    key / value, output and MLP weights in every block, the history events share one set (OneTrans,
    Zhang et al. 2025; ``model/token_params.py``). The same FLOPs, S times the block matrices for
    the S non-sequence tokens. ``shared``: one set for every token."""
    head: Literal["cls", "target", "both"] = "both"
    """Which token(s) the head reads."""
    head_hidden: int = 0
    """Hidden width of the head MLP; 0 = 2 * d_model."""
    dropout: float = 0.0
    """Dropout on the residual branches (the attention and MLP outputs), and on the attention
    weights unless ``attention_dropout`` says otherwise."""
    dropout_mask: Literal["element", "feature"] = "element"
    """The residual branches' dropout mask: ``element``, one draw per element (the usual
    dropout); ``feature``, one per sample and feature, shared by every token (variational dropout;
    ``recformer/model/dropout.py``): T times fewer random draws, but a different regulariser."""
    dropout_branches: Literal["both", "mlp"] = "both"
    """Which residual branches ``dropout`` applies to: ``both`` (the attention and MLP outputs) or
    ``mlp`` (the MLP's alone: half the masks at the first block's full width)."""
    attention_dropout: float | None = None
    """Dropout on the attention weights; None: ``dropout``. On CPU any attention dropout sends SDPA
    from its fused kernel to the unfused math path (1.36x BST's training rate at 0.2 instead of
    2x; docs/quality.md), while dropout on the residual branches alone keeps the fused kernel."""
    attention_kernel: Literal["auto", "sdpa", "matmul", "mixed"] = "auto"
    """How ``forward`` (training, eager evaluation and prediction; not the stats path, and not an
    exported model, which always has SDPA) computes attention: ``sdpa``
    (``F.scaled_dot_product_attention``), or ``matmul``: per head, the logits from one batched
    matmul that adds the key mask, a softmax and a second matmul (``model/attention.py``), the math
    of SDPA's fallback without its copies. ``auto``: ``matmul`` on CPU in eager fp32 (no autocast,
    not compiled or exported) at up to 64 tokens and 8 heads, where it ran faster than SDPA's fused
    CPU kernel forward and backward (``bench/bench_attention.py``); ``sdpa`` elsewhere. ``mixed``:
    ``sdpa`` where a block updates every token, ``matmul`` in the last block, which updates only
    the 1-2 tokens the head reads: with so few queries SDPA's fused CPU kernel spends most of its
    time outside the arithmetic (the default's last block: about 4 ms of SDPA forward and backward
    a step for 0.3% of its FLOPs)."""
    base_rate: float = 0.5
    """Label base rate; the head bias starts at its log-odds."""

    @property
    def attention_dropout_p(self) -> float:
        """The dropout on the attention weights: ``attention_dropout``, or ``dropout`` when None."""
        return self.dropout if self.attention_dropout is None else self.attention_dropout

    def half_methods(self) -> list[str]:
        """Half of DeepNet, or muP's init without muP: each is one method, and half of it alone is
        silently not the method its name promises. A new fit refuses them
        (``RankerModule.on_fit_start``); a checkpoint that has one still loads, for evaluation or
        resume, since its weights are already made."""
        out = []
        if self.init == "mup" and not self.mup:
            out.append(
                "init='mup' with mup=False: muP is its init together with its LR and output "
                "scaling; set mup=true (it brings muP's init) and drop init='mup'"
            )
        if self.norm_placement == "deepnorm" and self.init != "deepnorm":
            out.append(
                f"norm_placement='deepnorm' with init={self.init!r}: DeepNet is its placement "
                "(alpha on the residual) together with its init (beta on v, out and the MLP); set "
                "both norm_placement='deepnorm' and init='deepnorm', or neither"
            )
        return out

    def __post_init__(self) -> None:
        for name in ("d_model", "n_heads"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        if self.n_layers < 1:
            raise ValueError(f"n_layers={self.n_layers} must be >= 1")
        if not 0.0 < self.base_rate < 1.0:
            raise ValueError(f"base_rate={self.base_rate} must be strictly between 0 and 1")
        for name in ("dropout", "embedding_dropout", "history_cat_dropout", "attention_dropout"):
            value = getattr(self, name)
            if value is not None and not 0.0 <= value < 1.0:
                raise ValueError(f"{name}={value} must be in [0, 1)")
        if not self.history_content and self.content_tokens == "all":
            raise ValueError(
                "history_content=false leaves the history events' content out, and "
                "content_tokens='all' gives each of them a content token: set one or the other"
            )
        for name, value in self.categorical_dropout.items():
            if not 0.0 <= value < 1.0:
                raise ValueError(f"categorical_dropout[{name!r}]={value} must be in [0, 1)")
        if self.dropout_mask not in ("element", "feature"):
            raise ValueError(f"dropout_mask={self.dropout_mask!r}; expected 'element' or 'feature'")
        if self.dropout_branches not in ("both", "mlp"):
            raise ValueError(f"dropout_branches={self.dropout_branches!r}; expected 'both' or 'mlp'")
        if self.cross_hidden and (self.cross_layers < 1 or self.head_fields):
            raise ValueError(
                f"cross_hidden={self.cross_hidden} is the DNN beside the cross layers before their own "
                f"logit: it needs cross_layers >= 1 (got {self.cross_layers}) and head_fields=false "
                f"(got {self.head_fields})"
            )
        if any(w < 1 for w in self.cross_hidden):
            raise ValueError(f"cross_hidden={self.cross_hidden}: every width must be >= 1")
        if self.dense_tokens < 1:
            raise ValueError(f"dense_tokens={self.dense_tokens} must be >= 1")
        if self.mup and self.init in ("xavier", "deepnorm"):
            raise ValueError(
                f"mup=True with init={self.init!r}: muP scales the std of the normal-family inits "
                "(normal, scaled, depth) by 1/sqrt(m); xavier-family inits set their own width scaling"
            )
        if self.init == "mup":
            warnings.warn(
                "model.ranker.init='mup' is deprecated: muP is one switch now; set "
                "model.ranker.mup=true (it brings muP's init, as init='normal' scaled by 1/sqrt(m))",
                FutureWarning,
                stacklevel=2,
            )
        if self.init == "deepnorm" and self.norm_placement != "deepnorm":
            raise ValueError("init='deepnorm' only makes sense with norm_placement='deepnorm'")
        if self.init_std <= 0:
            raise ValueError(f"init_std={self.init_std} must be > 0")
        if self.mlp_ratio <= 0:
            raise ValueError(f"mlp_ratio={self.mlp_ratio} must be > 0")
        if self.base_d_model < 1:
            raise ValueError(f"base_d_model={self.base_d_model} must be >= 1")
        self._check_head()

    def _check_head(self) -> None:
        """The head's and the cross network's settings (``__post_init__``'s last checks)."""
        if self.mup and self.head_hidden != 0:
            raise ValueError(
                f"mup=True with head_hidden={self.head_hidden}: muP needs the head width to scale with "
                "d_model; set head_hidden=0 (= 2 * d_model)"
            )
        if self.head_product and self.head != "both":
            raise ValueError(
                f"head_product=True needs head='both' (the CLS and target readouts), not {self.head!r}"
            )
        if self.cross_layers < 0:
            raise ValueError(f"cross_layers={self.cross_layers} must be >= 0 (0 = no cross network)")
        if self.history_tokens < 0:
            raise ValueError(f"history_tokens={self.history_tokens} must be >= 0 (0 = every history event)")
        if self.history_older not in ("drop", "mean"):
            raise ValueError(f"history_older={self.history_older!r}; expected 'drop' or 'mean'")
        if self.attention_kernel not in ("auto", "sdpa", "matmul", "mixed"):
            raise ValueError(
                f"attention_kernel={self.attention_kernel!r}; expected 'auto', 'sdpa', 'matmul' or 'mixed'"
            )
        if self.mlp not in ("gelu", "swiglu", "relu"):
            raise ValueError(f"mlp={self.mlp!r}; expected 'gelu', 'swiglu' or 'relu'")
        pools = ("mean", "target", "mean_target", "rating", "items", "none")
        if self.history_pool not in pools:
            raise ValueError(f"history_pool={self.history_pool!r}; expected one of {pools}")
        if self.history_unit_hidden < 0:
            raise ValueError(f"history_unit_hidden={self.history_unit_hidden} must be >= 0 (0 = 2 * d_model)")
        if self.history_pool != "mean" and not (self.fm or self.cross_layers or self.head_fields):
            raise ValueError(
                f"history_pool={self.history_pool!r} pools the history for the fields of fm, "
                "cross_layers and head_fields; set one of them (all are off)"
            )
        if self.head_hidden < 0:
            raise ValueError(f"head_hidden={self.head_hidden} must be >= 0 (0 = 2 * d_model)")

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    @property
    def width_mult(self) -> float:
        """muP width multiplier m = d_model / base_d_model."""
        return self.d_model / self.base_d_model
