"""All initialisation policy, named by method (``RankerConfig.init``); see ``matrix_std``.

Shape legend: ``D`` model width, ``L`` number of blocks (``n_layers``), ``l`` 0-based block index.

Matrix roles inside a block: ``q``, ``k``, ``v`` (row chunks of the fused ``qkv``), ``attn_out``,
``mlp_up`` (for SwiGLU the gate and value chunks, each D -> M), ``mlp_down``; plus ``head_hidden``.
``attn_out`` and ``mlp_down`` write into the residual stream, which is what the depth-aware methods
scale down: each block adds two such updates, so the stream variance would otherwise grow with L.

=========  =================================================================================
method     matrices
=========  =================================================================================
normal     N(0, std) everywhere (BERT)
xavier     N(0, 2 / (fan_in + fan_out)) (Glorot & Bengio 2010)
scaled     N(0, std); residual writers std / sqrt(2L) (GPT-2, Radford et al. 2019)
depth      N(0, std); residual writers of block l std / sqrt(2(l + 1)) (OLMo "mitchell" init)
deepnorm   xavier; v, attn_out, mlp_up, mlp_down with gain beta = (8L)^(-1/4) (DeepNet 2022)
=========  =================================================================================

Under muP (``RankerConfig.mup``) every hidden matrix's std is further divided by sqrt(m),
m = d_model / base_d_model: fan-in scaling, so activations keep their size as width grows (Yang et
al. 2022, Tensor Programs V; ``recformer.model.mup``).

Everything else is the same for every method: embedding tables, CLS and slot embeddings N(0, std)
(constant in width, as muP wants for input weights); input projections (dense / content / per-row
embedding -> D) N(0, std), or xavier under xavier / deepnorm; norm gains 1 and biases 0; the head's
last layer zero with its bias at log(p / (1 - p)) of ``base_rate``, so the first predictions equal the
base rate and the first gradients do not depend on a random readout.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Protocol

import torch
from torch import nn

from recformer.config import RankerConfig
from recformer.model.blocks import deepnorm_beta
from recformer.model.embedding import FeatureTokenizer
from recformer.model.mup import hidden_init_multiplier
from recformer.model.norms import LayerNorm, RMSNorm


class Initialisable(Protocol):
    """What ``init_weights`` reads of the Transformer ranker (``model/ranker.py``'s ``Ranker``, which
    calls it from its constructor: naming the members here keeps ranker.py the only importer)."""

    cfg: RankerConfig
    tokens: FeatureTokenizer
    blocks: nn.ModuleList
    head: nn.Module
    """``Head``: ``hidden`` and ``out`` linear layers."""
    item_bias: nn.Embedding | None
    history_gate: nn.Embedding | None
    cross: nn.Module | None
    """``CrossTower`` or None: initialises itself (``reset``)."""
    history_pool: nn.Sequential | None
    """DIN's attention unit (``fm.attention_unit``) or None."""

    def named_parameters(self) -> Iterator[tuple[str, nn.Parameter]]: ...

    def modules(self) -> Iterator[nn.Module]: ...


RESIDUAL_WRITERS = frozenset({"attn_out", "mlp_down"})
"""Roles whose output is added to the residual stream."""

DEEPNORM_BETA_ROLES = frozenset({"v", "attn_out", "mlp_up", "mlp_down"})
"""Roles DeepNet scales by beta at init (q and k keep gain 1)."""


def xavier_std(fan_in: int, fan_out: int) -> float:
    return math.sqrt(2.0 / (fan_in + fan_out))


def matrix_std(cfg: RankerConfig, role: str, layer: int | None, fan_in: int, fan_out: int) -> float:
    """Standard deviation of a hidden matrix of ``role`` in block ``layer`` (None = outside blocks):
    the init method's, times muP's fan-in factor (``mup.hidden_init_multiplier``, 1 without muP)."""
    return _method_std(cfg, role, layer, fan_in, fan_out) * hidden_init_multiplier(cfg)


def _method_std(cfg: RankerConfig, role: str, layer: int | None, fan_in: int, fan_out: int) -> float:
    std = cfg.init_std
    writer = role in RESIDUAL_WRITERS and layer is not None
    if cfg.init in ("normal", "mup"):  # "mup": the deprecated name of normal under mup=True
        return std
    if cfg.init == "xavier":
        return xavier_std(fan_in, fan_out)
    if cfg.init == "scaled":
        return std / math.sqrt(2 * cfg.n_layers) if writer else std
    if cfg.init == "depth":
        return std / math.sqrt(2 * (layer + 1)) if writer else std
    if cfg.init == "deepnorm":
        gain = deepnorm_beta(cfg.n_layers) if role in DEEPNORM_BETA_ROLES and layer is not None else 1.0
        return gain * xavier_std(fan_in, fan_out)
    raise ValueError(
        f"RankerConfig.init={cfg.init!r}; expected normal, xavier, scaled, depth, deepnorm or mup"
    )


def input_std(cfg: RankerConfig, fan_in: int, fan_out: int) -> float:
    """Input projections (fixed fan-in): constant in width, xavier for the xavier-family methods."""
    return xavier_std(fan_in, fan_out) if cfg.init in ("xavier", "deepnorm") else cfg.init_std


@torch.no_grad()
def init_tokens(tokens: FeatureTokenizer, cfg: RankerConfig) -> set[str]:
    """Token embeddings and input projections of a ``FeatureTokenizer`` (also for models other than
    the Ranker that share it); returns the parameter names relative to ``tokens``."""
    names = {id(p): n for n, p in tokens.named_parameters()}
    covered: set[str] = set()
    for module in tokens.modules():
        if isinstance(module, nn.Embedding):
            module.weight.normal_(0.0, cfg.init_std)
            covered.add(names[id(module.weight)])
        elif isinstance(module, nn.Linear):
            module.weight.normal_(0.0, input_std(cfg, module.in_features, module.out_features))
            covered.add(names[id(module.weight)])
    for p in tokens.parameters(recurse=False):  # CLS, slot embeddings, per-feature dense tokens
        p.normal_(0.0, cfg.init_std)
        covered.add(names[id(p)])
    return covered


@torch.no_grad()
def init_weights(ranker: Initialisable) -> set[str]:
    """Initialise every parameter of ``ranker`` by ``ranker.cfg.init``; return the names covered.

    Raises if any parameter was not covered, so a new module cannot silently keep PyTorch's default.
    """
    cfg = ranker.cfg
    names = {id(p): n for n, p in ranker.named_parameters()}
    covered: set[str] = set()

    def normal_(p: torch.Tensor, std: float, rows: slice = slice(None)) -> None:
        p[rows].normal_(0.0, std)

    def done(*params: torch.Tensor) -> None:
        covered.update(names[id(p)] for p in params)

    covered.update(f"tokens.{name}" for name in init_tokens(ranker.tokens, cfg))

    done(*_init_blocks(ranker))

    # Norms everywhere (block norms, QK-Norm, final norm): identity at init.
    for module in ranker.modules():
        if isinstance(module, (RMSNorm, LayerNorm)):
            module.weight.fill_(1.0)
            done(module.weight)
        if isinstance(module, LayerNorm) and module.bias is not None:
            module.bias.zero_()
            done(module.bias)

    # Head: hidden layer as a hidden matrix, readout zero with the base-rate bias.
    head = ranker.head
    normal_(
        head.hidden.weight,
        matrix_std(cfg, "head_hidden", None, head.hidden.in_features, head.hidden.out_features),
    )
    head.hidden.bias.zero_()
    head.out.weight.zero_()
    head.out.bias.fill_(math.log(cfg.base_rate / (1.0 - cfg.base_rate)))
    done(head.hidden.weight, head.hidden.bias, head.out.weight, head.out.bias)
    done(*_init_beside(ranker))

    missing = sorted(set(names.values()) - covered)
    if missing:
        raise RuntimeError(f"init_weights({cfg.init!r}) does not cover these parameters: {missing}")
    return covered


def _init_blocks(ranker: Initialisable) -> list[torch.Tensor]:
    """Every block's matrices by role; a non-sequence token's own matrices (``*_specific``,
    [S, out, in], ``model/token_params.py``) like the shared one beside them. Returns them."""
    cfg, D, params = ranker.cfg, ranker.cfg.d_model, []
    for block in ranker.blocks:
        a, m, M = block.attn, block.mlp, block.mlp.hidden
        roles = [(a.qkv, a.qkv_specific, r, D, D, slice(i * D, (i + 1) * D)) for i, r in enumerate("qkv")]
        roles += [
            (a.out, a.out_specific, "attn_out", D, D, slice(None)),
            (m.up, m.up_specific, "mlp_up", D, M, slice(None)),  # SwiGLU: gate and value chunks alike
            (m.down, m.down_specific, "mlp_down", M, D, slice(None)),
        ]
        for linear, specific, role, fan_in, fan_out, rows in roles:
            std = matrix_std(cfg, role, block.layer, fan_in, fan_out)
            for w in (linear.weight, specific):
                if w is not None:
                    w[..., rows, :].normal_(0.0, std)
                    params.append(w)
    return params


def _init_beside(ranker: Initialisable) -> list[torch.Tensor]:
    """The terms beside the blocks, each starting silent; returns their parameters."""
    params: list[torch.Tensor] = []
    if ranker.item_bias is not None:  # zero: the head's bias holds the base rate alone
        ranker.item_bias.weight.zero_()
        params.append(ranker.item_bias.weight)
    if ranker.history_gate is not None:  # zero: both gated means start as the plain mean
        ranker.history_gate.weight.zero_()
        params.append(ranker.history_gate.weight)
    if ranker.cross is not None:  # Glorot cross layers, a zero output
        ranker.cross.reset()
        params += list(ranker.cross.parameters())
    if ranker.history_pool is not None:  # as the DIN baseline: normal weights, zero biases
        for m in ranker.history_pool:
            if isinstance(m, nn.Linear):
                m.weight.normal_(0.0, ranker.cfg.init_std)
                m.bias.zero_()
                params += [m.weight, m.bias]
    return params
