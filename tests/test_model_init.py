"""Init policy: coverage of every parameter, measured std per method, head at the base rate, kinds."""

from __future__ import annotations

import math
import re

import pytest
import torch

from recformer.config import RankerConfig
from recformer.model import Ranker, init_weights
from tests._model_batches import random_batch, random_item_tables, tiny_dims

METHODS = ["normal", "xavier", "scaled", "depth", "deepnorm", "mup", "scaled+mup"]
"""Init methods; "mup" is the deprecated name of normal under muP, "scaled+mup" muP on GPT-2's init."""


def _cfg(method: str, **kw) -> RankerConfig:
    base = dict(d_model=128, n_heads=4, n_layers=4, init=method.removesuffix("+mup"), init_std=0.02)
    if method == "deepnorm":
        base["norm_placement"] = "deepnorm"
    if method.endswith("mup"):
        base.update(mup=True, d_model=256, base_d_model=64)  # m = 4
    base.update(kw)
    return RankerConfig(**base)


@pytest.mark.parametrize("method", METHODS)
def test_init_weights_covers_every_parameter(method: str) -> None:
    ranker = Ranker(_cfg(method, d_model=32 if not method.endswith("mup") else 64, n_layers=2), tiny_dims())
    assert init_weights(ranker) == {name for name, _ in ranker.named_parameters()}


def _expected_std(method: str, role: str, layer: int, D: int, M: int, L: int) -> float:
    """The policy, written out independently of recformer.model.init."""
    fan = {"q": (D, D), "k": (D, D), "v": (D, D), "out": (D, D), "up": (D, M), "down": (M, D)}[role]
    xavier = math.sqrt(2 / sum(fan))
    writer = role in ("out", "down")
    if method.endswith("+mup"):  # muP divides the method's std by sqrt(m)
        return _expected_std(method.removesuffix("+mup"), role, layer, D, M, L) / math.sqrt(D / 64)
    if method == "normal":
        return 0.02
    if method == "xavier":
        return xavier
    if method == "scaled":
        return 0.02 / math.sqrt(2 * L) if writer else 0.02
    if method == "depth":
        return 0.02 / math.sqrt(2 * (layer + 1)) if writer else 0.02
    if method == "deepnorm":
        return xavier * ((8 * L) ** -0.25 if role in ("v", "out", "up", "down") else 1.0)
    return 0.02 / math.sqrt(D / 64)  # mup: std / sqrt(m)


@pytest.mark.parametrize("mlp", ["gelu", "swiglu"])
@pytest.mark.parametrize("method", METHODS)
def test_init_std_within_20_percent_of_policy(method: str, mlp: str) -> None:
    torch.manual_seed(0)
    cfg = _cfg(method, mlp=mlp)
    ranker = Ranker(cfg, tiny_dims())
    D, L = cfg.d_model, cfg.n_layers
    for layer, block in enumerate(ranker.blocks):
        M = block.mlp.hidden
        q, k, v = block.attn.qkv.weight.split(D, dim=0)
        up = block.mlp.up.weight
        parts = {
            "q": q,
            "k": k,
            "v": v,
            "out": block.attn.out.weight,
            "up": up[:M],
            "down": block.mlp.down.weight,
        }
        if mlp == "swiglu":
            parts["up_value"] = up[M:]
        for role, w in parts.items():
            want = _expected_std(method, role.removesuffix("_value"), layer, D, M, L)
            got = float(w.detach().std())
            assert got == pytest.approx(want, rel=0.2), (
                f"{method} block {layer} {role}: std {got:.4g}, policy {want:.4g}"
            )
    # Embedding tables stay at init_std under every method (muP: constant in width).
    assert float(ranker.tokens.table.weight.detach().std()) == pytest.approx(0.02, rel=0.2)
    head = ranker.head
    want_head = 0.02 / math.sqrt(D / 64) if method.endswith("mup") else 0.02
    if method in ("xavier", "deepnorm"):
        want_head = math.sqrt(2 / (head.hidden.in_features + head.hidden.out_features))
    assert float(head.hidden.weight.detach().std()) == pytest.approx(want_head, rel=0.2)


@pytest.mark.parametrize("base_rate", [0.03, 0.5, 0.8])
def test_head_starts_at_the_base_rate(base_rate: float) -> None:
    dims = tiny_dims()
    ranker = Ranker(RankerConfig(d_model=16, n_heads=2, base_rate=base_rate), dims)
    ranker.set_item_tables(*random_item_tables(dims))
    assert torch.count_nonzero(ranker.head.out.weight) == 0
    probs = torch.sigmoid(ranker(random_batch(dims)))
    torch.testing.assert_close(probs, torch.full_like(probs, base_rate))


def test_param_kinds_cover_every_parameter_with_the_right_kind() -> None:
    ranker = Ranker(RankerConfig(d_model=16, n_heads=2, norm="layer", qk_norm="head"), tiny_dims())
    kinds = ranker.param_kinds()
    assert set(kinds) == {n for n, _ in ranker.named_parameters()}
    assert kinds["head.out.weight"] == "readout"
    assert kinds["head.hidden.weight"] == "hidden" and kinds["head.out.bias"] == "vector"
    assert kinds["tokens.table.weight"] == "table" and kinds["tokens.content_proj.weight"] == "input"
    assert kinds["tokens.slot_emb"] == "embedding" and kinds["tokens.cls"] == "embedding"
    for i in range(2):
        assert kinds[f"blocks.{i}.attn.qkv.weight"] == "hidden"
        assert kinds[f"blocks.{i}.mlp.down.weight"] == "hidden"
        assert kinds[f"blocks.{i}.attn_norm.bias"] == "vector"
        assert kinds[f"blocks.{i}.attn.qk_norm.q_norm.weight"] == "vector"
    assert {k for k in kinds.values()} == {"hidden", "input", "table", "embedding", "vector", "readout"}


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"init": "deepnorm"}, "init='deepnorm' only makes sense with norm_placement='deepnorm'"),
        ({"mup": True, "init": "xavier"}, "mup=True with init='xavier'"),
    ],
)
def test_half_a_method_is_refused(kwargs, match):
    with pytest.raises(ValueError, match=re.escape(match)):
        RankerConfig(d_model=16, n_heads=2, **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"norm_placement": "deepnorm"}, "norm_placement='deepnorm' with init='scaled'"),
        ({"init": "mup"}, "init='mup' with mup=False"),
    ],
)
def test_the_other_halves_are_named_for_a_new_run(kwargs, match):
    """Refused when a new fit starts (RankerModule.setup), not here: a checkpoint that has one loads."""
    [said] = RankerConfig(d_model=16, n_heads=2, **kwargs).half_methods()
    assert said.startswith(match)
    assert RankerConfig(d_model=16, n_heads=2).half_methods() == []
