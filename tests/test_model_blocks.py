"""Norms and norm placements against their formulas; the MLP variants; DeepNet constants."""

from __future__ import annotations

import math

import pytest
import torch

from recformer.config import RankerConfig
from recformer.model.blocks import MLP, make_block, mlp_hidden
from recformer.model.norms import LayerNorm, RMSNorm

EPS = 1e-6


def rms_formula(x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * g


def layer_formula(x: torch.Tensor, g: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    mu = x.mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt((x - mu).pow(2).mean(-1, keepdim=True) + EPS) * g + b


@pytest.mark.parametrize("scale", [1.0, 1 / math.sqrt(3)])
def test_norms_match_formula_and_gradients(scale: float) -> None:
    torch.manual_seed(0)
    x = torch.randn(4, 5, 12, dtype=torch.float64, requires_grad=True)
    rms, ln = RMSNorm(12, scale).double(), LayerNorm(12, scale).double()
    with torch.no_grad():
        for p in (rms.weight, ln.weight, ln.bias):
            p.normal_()
    cases = [
        (rms, lambda: rms_formula(x, rms.weight) * scale),
        (ln, lambda: layer_formula(x, ln.weight, ln.bias) * scale),
    ]
    for module, formula in cases:
        got, want = module(x), formula()
        torch.testing.assert_close(got, want)
        g = torch.randn_like(got)
        params = [x, *module.parameters()]
        for a, b in zip(
            torch.autograd.grad((got * g).sum(), params), torch.autograd.grad((want * g).sum(), params)
        ):
            torch.testing.assert_close(a, b)


def _block(placement: str, norm: str, layer: int, n_layers: int = 3, scaling: bool = True):
    torch.manual_seed(layer)
    cfg = RankerConfig(
        d_model=16,
        n_heads=2,
        n_layers=n_layers,
        norm_placement=placement,
        norm=norm,
        layernorm_scaling=scaling,
        init="deepnorm" if placement == "deepnorm" else "scaled",
    )
    block = make_block(cfg, layer).double()
    with torch.no_grad():  # random gains / biases so each norm's position is visible
        for name, p in block.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return block


def _norm_of(module: torch.nn.Module, kind: str, scale: float):
    if kind == "rms":
        return lambda t: rms_formula(t, module.weight) * scale
    return lambda t: layer_formula(t, module.weight, module.bias) * scale


@pytest.mark.parametrize("norm", ["rms", "layer"])
@pytest.mark.parametrize("placement", ["post", "pre", "sandwich", "reordered", "deepnorm"])
def test_each_norm_placement_equals_its_formula(placement: str, norm: str) -> None:
    layer, n_layers = 2, 3
    block = _block(placement, norm, layer, n_layers)
    s = 1 / math.sqrt(layer + 1)  # LayerNorm Scaling of block 3 (1-based)
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    valid = torch.ones(2, 6, dtype=torch.bool)
    valid[1, :3] = False
    attend = valid[:, None, None, :]
    attn = lambda t: block.attn(t, attend)
    mlp = block.mlp
    n1, n2 = _norm_of(block.attn_norm, norm, s), _norm_of(block.mlp_norm, norm, s)
    if placement == "post":
        h = n1(x + attn(x))
        want = n2(h + mlp(h))
    elif placement == "pre":
        h = x + attn(n1(x))
        want = h + mlp(n2(h))
    elif placement == "sandwich":
        o1, o2 = _norm_of(block.attn_out_norm, norm, s), _norm_of(block.mlp_out_norm, norm, s)
        h = x + o1(attn(n1(x)))
        want = h + o2(mlp(n2(h)))
    elif placement == "reordered":
        h = x + n1(attn(x))
        want = h + n2(mlp(h))
    else:
        alpha = (2 * n_layers) ** 0.25
        h = n1(alpha * x + attn(x))
        want = n2(alpha * h + mlp(h))
    torch.testing.assert_close(block(x, attend), want)


@pytest.mark.parametrize("qk", ["head", "full"])
@pytest.mark.parametrize("placement", ["post", "pre", "sandwich", "reordered", "deepnorm"])
def test_block_restricted_to_kept_rows_equals_the_full_block_rows(placement: str, qk: str) -> None:
    """The last block's shortcut (queries, out projection and MLP only on the read tokens)."""
    torch.manual_seed(0)
    init = "deepnorm" if placement == "deepnorm" else "scaled"
    cfg = RankerConfig(d_model=16, n_heads=2, n_layers=3, norm_placement=placement, qk_norm=qk, init=init)
    block = make_block(cfg, 1).double()
    x = torch.randn(3, 7, 16, dtype=torch.float64, requires_grad=True)
    attend = torch.ones(3, 1, 1, 7, dtype=torch.bool)
    attend[0, ..., 2:5] = False
    for keep in (slice(0, 1), slice(6, 7), slice(0, 7, 6)):
        full = block(x, attend)[:, keep]
        part = block(x, attend, keep)
        torch.testing.assert_close(part, full)
        g = torch.randn_like(part)
        params = [x, *block.parameters()]
        got = torch.autograd.grad((part * g).sum(), params)
        want = torch.autograd.grad((full * g).sum(), params)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b)


def test_layernorm_scaling_off_leaves_norms_unscaled() -> None:
    on, off = _block("pre", "rms", 3, 4, scaling=True), _block("pre", "rms", 3, 4, scaling=False)
    assert on.attn_norm.scale == pytest.approx(0.5) and on.mlp_norm.scale == pytest.approx(0.5)
    assert off.attn_norm.scale == 1.0 and off.mlp_norm.scale == 1.0


def test_relu_mlp_matches_formula_and_a_bad_mlp_is_named() -> None:
    torch.manual_seed(0)
    x = torch.randn(3, 4, 24, dtype=torch.float64)
    relu = MLP(RankerConfig(d_model=24, n_heads=2, mlp="relu", mlp_ratio=2.0)).double()
    assert relu.hidden == 48  # mlp_ratio * D, as GELU's
    torch.testing.assert_close(relu(x), torch.relu(x @ relu.up.weight.T) @ relu.down.weight.T)
    with pytest.raises(ValueError, match=r"mlp='tanh'; expected 'gelu', 'swiglu' or 'relu'"):
        RankerConfig(mlp="tanh")


def test_swiglu_and_gelu_mlp_match_formula() -> None:
    torch.manual_seed(0)
    x = torch.randn(3, 4, 24, dtype=torch.float64)
    swi = MLP(RankerConfig(d_model=24, n_heads=2, mlp="swiglu")).double()
    M = swi.hidden
    assert M == 64  # 4 * 24 * 2/3 = 64, already a multiple of 8
    w_gate, w_val = swi.up.weight[:M], swi.up.weight[M:]
    want = (torch.nn.functional.silu(x @ w_gate.T) * (x @ w_val.T)) @ swi.down.weight.T
    torch.testing.assert_close(swi(x), want)
    gelu = MLP(RankerConfig(d_model=24, n_heads=2, mlp="gelu")).double()
    want = torch.nn.functional.gelu(x @ gelu.up.weight.T) @ gelu.down.weight.T
    torch.testing.assert_close(gelu(x), want)
    assert mlp_hidden(RankerConfig(d_model=20, n_heads=2, mlp="swiglu")) == 56  # 53.3 rounded up to 8
