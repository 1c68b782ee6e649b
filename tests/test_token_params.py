"""Token-specific weights for the non-sequence tokens (``token_params: specific``, OneTrans) against
hand-written expectations: which matrix each token runs, the same function as the shared model when
the matrices are equal, init, groups and FLOPs."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from recformer.config import OptimConfig, RankerConfig
from recformer.model import Ranker, flops
from recformer.model.token_params import TokenLayout, token_linear
from recformer.module import RankerModule
from tests._model_batches import random_batch, random_item_tables, tiny_dims

SPECIFIC = ("attn.qkv", "attn.out", "mlp.up", "mlp.down")


def _pair(**kw) -> tuple[Ranker, Ranker]:
    """A shared and a token-specific ranker of the same config and shared weights."""
    dims = tiny_dims()
    tables = random_item_tables(dims)
    rankers = []
    for params in ("shared", "specific"):
        torch.manual_seed(0)
        r = Ranker(RankerConfig(**{"d_model": 16, "n_heads": 2, **kw}, token_params=params), dims).eval()
        r.set_item_tables(*tables)
        rankers.append(r)
    shared, specific = rankers
    with torch.no_grad():
        shared.head.out.weight.normal_()  # a zero readout would hide every difference
        specific.load_state_dict(shared.state_dict(), strict=False)
    return shared, specific


def _specific(ranker: Ranker) -> dict[str, torch.Tensor]:
    return {n: p for n, p in ranker.named_parameters() if n.endswith("_specific")}


def test_token_linear_runs_each_non_sequence_token_through_its_own_matrix():
    layout = TokenLayout(front=2, back=1, n_tokens=6)
    torch.manual_seed(0)
    x, w, s = torch.randn(3, 6, 4), torch.randn(5, 4), torch.randn(3, 5, 4)
    y = token_linear(x, w, s, layout)
    for t, row in [(0, 0), (1, 1), (5, 2)]:
        torch.testing.assert_close(y[:, t], x[:, t] @ s[row].T)
    torch.testing.assert_close(y[:, 2:5], x[:, 2:5] @ w.T)
    # The rows the head keeps (CLS and target): their own matrices alone.
    keep = slice(0, 6, 5)
    torch.testing.assert_close(token_linear(x[:, keep], w, s, layout, keep), y[:, keep])
    assert torch.equal(token_linear(x, w, None, layout), F.linear(x, w))


def test_the_layout_refuses_what_it_cannot_serve():
    layout = TokenLayout(front=2, back=1, n_tokens=6)
    assert layout.specific_rows(slice(5, 6)) == slice(2, 3, 1)
    assert layout.specific_rows(slice(0, 6, 5)) == slice(0, 3, 2)
    with pytest.raises(ValueError, match=r"keep=slice\(0, 3, None\) selects a sequence token"):
        layout.specific_rows(slice(0, 3))
    with pytest.raises(ValueError, match="front=0"):
        TokenLayout(front=0, back=1, n_tokens=6)


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"content_tokens": "target"},
        {"content_tokens": "all"},
        {"head": "cls"},
        {"norm_placement": "sandwich", "mlp": "swiglu"},
        {"norm_placement": "deepnorm", "init": "deepnorm", "qk_norm": "full"},
    ],
)
def test_with_every_matrix_equal_to_the_shared_one_it_is_the_shared_model(kw):
    shared, specific = _pair(**kw)
    batch = random_batch(shared.dims, batch_size=6)
    layout = specific.blocks[0].attn.layout
    assert layout.back == (2 if kw.get("content_tokens") == "target" else 1)
    assert layout.front == specific.tokens.n_context and layout.n_tokens == specific.n_tokens
    with torch.no_grad():
        for block_s, block in zip(shared.blocks, specific.blocks):
            for path in SPECIFIC:
                s_w = block_s.get_submodule(path).weight
                getattr(block.get_submodule(path.split(".")[0]), path.split(".")[1] + "_specific").copy_(
                    s_w.expand(layout.n_specific, *s_w.shape)
                )
    want = shared(batch)
    torch.testing.assert_close(specific(batch), want, rtol=1e-5, atol=1e-5)
    with torch.no_grad():  # a non-sequence token's own matrix changes the score; both paths agree
        specific.blocks[0].mlp.up_specific[0].normal_()
    got = specific(batch)
    assert (got - want).abs().max() > 1e-3
    torch.testing.assert_close(specific.forward_stats(batch)[0], got, rtol=1e-5, atol=1e-5)


def test_init_groups_and_flops_treat_each_token_matrix_as_the_shared_one():
    shared, specific = _pair(d_model=32, n_layers=4)
    params = _specific(specific)
    assert len(params) == 4 * 4 and all(p.shape[0] == specific.tokens.n_context + 1 for p in params.values())
    # attn_out writes into the residual stream: the scaled init's std / sqrt(2L), as the shared one.
    out = params["blocks.0.attn.out_specific"]
    assert out.std().item() == pytest.approx(0.02 / math.sqrt(8), rel=0.1)
    assert params["blocks.0.attn.qkv_specific"].std().item() == pytest.approx(0.02, rel=0.1)
    kinds = specific.param_kinds()
    assert {kinds[n] for n in params} == {"hidden"}
    module = RankerModule(
        ranker=RankerConfig(d_model=32, n_heads=2, n_layers=4, token_params="specific"),
        optim=OptimConfig(),
        dims=tiny_dims(),
    )
    (hidden,) = [g for g in module.make_optimizer().param_groups if g["name"] == "hidden"]
    ids = {id(p) for p in hidden["params"]}
    assert all(id(p) in ids for n, p in module.ranker.named_parameters() if n.endswith("_specific"))
    assert hidden["weight_decay"] > 0
    assert flops.flops_per_sample(specific) == flops.flops_per_sample(shared)
