"""Training FLOPs per sample, counted in one place (MFU in ``callbacks/throughput``, ``bench_model``).

A model describes what it computes for one sample as terms (``RankerNet.flop_terms``):

- ``Matmul(params, uses)``: a matrix of ``params`` parameters applied ``uses`` times per sample
  (once per token it runs on);
- ``Attention(queries, keys, width)``: ``q k^T`` and ``p v`` over queries x keys at width D.

This module alone turns them into FLOPs: 6 per matrix parameter per use (2 per multiply-add, the
backward pass twice the forward) and 12 * queries * keys * width per attention (2 * 2 * Q * T * D
forward, times 3), as in Kaplan et al. 2020 and PaLM (Chowdhery et al. 2022, appendix B). Embedding
lookups are no FLOPs; norms and elementwise ops are left out, as there.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from torch import nn

from recformer.config import RankerConfig


@dataclass(frozen=True)
class Matmul:
    params: int
    uses: float

    def flops(self) -> float:
        return 6.0 * self.params * self.uses


@dataclass(frozen=True)
class Attention:
    queries: int
    keys: int
    width: int

    def flops(self) -> float:
        return 12.0 * self.queries * self.keys * self.width


Term = Matmul | Attention


def matrix_params(module: nn.Module) -> int:
    """Parameters of ``module``'s matrices (ndim == 2): what a term multiplies by its uses. A stack
    of per-token matrices ([S, out, in], ``model/token_params.py``) serves its tokens instead of the
    shared matrix of the same shape beside it, so it adds no FLOPs and is not counted."""
    return sum(p.numel() for p in module.parameters() if p.ndim == 2)


def total(terms: Iterable[Term]) -> float:
    return sum(t.flops() for t in terms)


class CountsFlops(Protocol):
    """A model that describes its training path as terms: every ``RankerNet`` (``model/protocol.py``,
    which imports ``Term`` from here, so this module names only the member it calls)."""

    def flop_terms(self) -> list[Term]: ...


def flops_per_sample(net: CountsFlops) -> float:
    """Training FLOPs per sample of ``net``'s training path."""
    return total(net.flop_terms())


def block_terms(block: nn.Module, d_model: int, tokens: int, queries: int | None = None) -> list[Term]:
    """One Transformer block over ``tokens`` tokens that updates ``queries`` of them (all by default):
    the k and v rows of its fused ``qkv`` run on every token, its q projection, output projection
    and MLP on the updated ones, attention over queries x tokens."""
    q = tokens if queries is None else queries
    kv = 2 * d_model * d_model
    return [Matmul(kv, tokens), Matmul(matrix_params(block) - kv, q), Attention(q, tokens, d_model)]


def reference_block_terms(
    cfg: RankerConfig, mlp_hidden: int, mlp_up: int, tokens: int, queries: int
) -> list[Term]:
    """``block_terms`` of a block of ``cfg``'s shape without the module (for a reference model of
    the same shape, ``bench_model``): q, k, v, out projections and an MLP D -> up, M -> D."""
    D = cfg.d_model
    return [
        Matmul(2 * D * D, tokens),
        Matmul(2 * D * D + D * mlp_up + mlp_hidden * D, queries),
        Attention(queries, tokens, D),
    ]
