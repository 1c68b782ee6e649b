"""muP: coordinate check across widths 64..512, readout multiplier, attention scale, LR multipliers."""

from __future__ import annotations

import pytest
import torch

from recformer.config import OptimConfig, RankerConfig
from recformer.model import Ranker
from recformer.model.coord_check import coord_check
from recformer.model.mup import attention_scale, hidden_lr_multiplier
from recformer.optim import build_param_groups
from tests._model_batches import random_batch, random_item_tables, tiny_dims

WIDTHS = [64, 128, 256, 512]


def _coord(mup: bool) -> dict[int, torch.Tensor]:
    dims = tiny_dims(max_len=4)
    batch = random_batch(dims, batch_size=8)
    tables = random_item_tables(dims)

    def make(width: int) -> Ranker:
        cfg = RankerConfig(d_model=width, n_heads=4, n_layers=2, base_d_model=64, mup=mup, init="normal")
        ranker = Ranker(cfg, dims)
        ranker.set_item_tables(*tables)
        return ranker

    return coord_check(make, batch, WIDTHS, steps=3, lr=3e-3)


def test_coordinate_check_flat_under_mup_and_growing_under_standard_parametrization() -> None:
    # Many small ops: one thread is as fast here and immune to OpenMP spin-waits on a busy machine.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        mup, sp = _coord(True), _coord(False)
    finally:
        torch.set_num_threads(threads)
    for res in (mup, sp):
        assert set(res) == set(WIDTHS) and all(v.shape == (3, 2 + 2) for v in res.values())
    # Columns: embeddings, block 1, block 2, logits; after every one of the 3 steps.
    mup_AWY = torch.stack([mup[w] for w in WIDTHS], dim=1)  # steps x widths x (blocks + 2) columns
    spread = mup_AWY.amax(dim=1) / mup_AWY.amin(dim=1)
    assert spread.max() < 2.0, f"muP activations vary {spread.max():.2f}x across widths:\n{mup_AWY}"
    # Standard parametrization: a constant Adam LR moves hidden outputs by O(width).
    blocks_growth = sp[512][-1, 1:3] / sp[64][-1, 1:3]
    assert blocks_growth.min() > 5.0, f"SP block activations grew only {blocks_growth}x from width 64 to 512"


def test_readout_input_is_scaled_by_one_over_m() -> None:
    dims = tiny_dims()
    torch.manual_seed(0)
    cfg = RankerConfig(d_model=128, n_heads=4, base_d_model=32, mup=True)
    ranker = Ranker(cfg, dims)
    head = ranker.head
    with torch.no_grad():
        head.out.weight.normal_()
    x = torch.randn(3, ranker.n_tokens, 128)
    z = torch.cat([x[:, 0], x[:, -1]], dim=-1)
    want = head.out(torch.nn.functional.gelu(head.hidden(z)) / 4.0).squeeze(-1)  # m = 128 / 32
    torch.testing.assert_close(head(head.select(x)), want)


def test_attention_scale_and_lr_multipliers() -> None:
    mup = RankerConfig(d_model=256, n_heads=4, base_d_model=64, mup=True, init="normal")
    sp = RankerConfig(d_model=256, n_heads=4)
    assert attention_scale(mup) == pytest.approx(1 / 64) and attention_scale(sp) == pytest.approx(1 / 8)
    for cfg, hidden_mult in ((mup, 0.25), (sp, 1.0)):
        model = Ranker(cfg, tiny_dims())
        groups = {
            g["name"]: g["lr_mult"]
            for g in build_param_groups(model, model.param_kinds(), OptimConfig(), hidden_lr_multiplier(cfg))
        }
        assert groups["hidden"] == pytest.approx(hidden_mult)
        assert [groups[k] for k in ("table", "embedding", "vector", "readout")] == [1.0, 1.0, 1.0, 1.0]


def test_the_old_two_flag_mup_is_the_one_switch_with_a_deprecation_message() -> None:
    """``init: mup`` (muP's init, named apart from ``mup: true`` before the switch became one) still
    reads, says it is deprecated, and builds the very same weights as ``mup: true`` alone."""
    dims = tiny_dims()
    with pytest.warns(FutureWarning, match="init='mup' is deprecated"):
        old = RankerConfig(d_model=128, n_heads=4, base_d_model=32, mup=True, init="mup")
    new = RankerConfig(d_model=128, n_heads=4, base_d_model=32, mup=True, init="normal")
    torch.manual_seed(0)
    a = Ranker(old, dims).state_dict()
    torch.manual_seed(0)
    b = Ranker(new, dims).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert b["blocks.0.attn.qkv.weight"].std() == pytest.approx(0.02 / 2, rel=0.1)  # m = 4: std / 2
