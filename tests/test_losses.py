"""The training terms beside the log loss (``recformer/losses.py``) against slow per-group loops,
the optimizer's embedding-group options they come with, and the branch loss of the module."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from recformer.config import OptimConfig, RankerConfig
from recformer.losses import listwise_loss, table_l2
from recformer.module import RankerModule
from recformer.optim import build_param_groups
from tests._model_batches import random_batch, random_item_tables, tiny_dims


def _batch(n: int = 60, groups: int = 6, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, generator=g, requires_grad=True)
    label = (torch.rand(n, generator=g) < 0.4).float()
    group = torch.randint(0, groups, (n,), generator=g)
    return logits, label, group


def _listwise_by_loop(logits, label, group):
    losses = []
    for gid in group.unique():
        rows = group == gid
        y, s = label[rows], logits[rows]
        if y.sum() == 0 or (1 - y).sum() == 0:
            continue
        log_p = s - torch.logsumexp(s, 0)
        losses.append(-(y / y.sum() * log_p).sum())
    return torch.stack(losses).mean()


def test_listwise_loss_is_softmax_cross_entropy_per_group():
    logits, label, group = _batch()
    got = listwise_loss(logits, label, group)
    want = _listwise_by_loop(logits, label, group)
    assert torch.allclose(got, want, atol=1e-6), (got, want)
    got.backward()
    # Descent lowers every negative of a group and raises its positives together (one positive
    # far above the others may be lowered: the target spreads its mass evenly over them).
    first = group == group[0]
    assert (logits.grad[first & (label == 0)] > 0).all()
    assert logits.grad[first & (label == 1)].sum() < 0
    assert torch.allclose(logits.grad[first].sum(), torch.tensor(0.0), atol=1e-6)  # softmax: shift-free


def test_listwise_loss_skips_groups_with_one_label_and_weighs_soft_labels():
    logits, label, group = _batch(seed=1)
    assert listwise_loss(logits, torch.ones_like(label), group).item() == 0.0  # nothing to order
    assert listwise_loss(logits, torch.zeros_like(label), group).item() == 0.0
    # A group of all positives beside mixed ones changes nothing.
    only_pos = torch.cat([label, torch.ones(5)])
    grp = torch.cat([group, torch.full((5,), 99)])
    s = torch.cat([logits.detach(), torch.randn(5)])
    assert torch.allclose(listwise_loss(s, only_pos, grp), listwise_loss(logits.detach(), label, group))
    soft = label * 0.5 + 0.25  # labels in (0, 1) are each row's share of the target mass
    assert torch.allclose(
        listwise_loss(logits, soft, group), _listwise_by_loop(logits, soft, group), atol=1e-6
    )


def test_listwise_loss_is_invariant_to_a_per_group_shift():
    """What a group's rows share (a user's level) cannot change a within-group loss."""
    logits, label, group = _batch(seed=2)
    shifted = logits.detach() + 3.0 * group.float()
    assert torch.allclose(listwise_loss(shifted, label, group), listwise_loss(logits.detach(), label, group))


def test_table_l2_is_the_sum_of_squares_of_every_row():
    a, b = torch.randn(7, 3), torch.randn(2, 1)
    assert math.isclose(table_l2([a, b]).item(), (a.square().sum() + b.square().sum()).item(), rel_tol=1e-6)


def test_embedding_lr_mult_scales_the_embedding_group_only():
    model = torch.nn.ModuleDict({"emb": torch.nn.Embedding(5, 4), "lin": torch.nn.Linear(4, 4)})
    kinds = {"emb.weight": "embedding", "lin.weight": "hidden", "lin.bias": "vector"}
    groups = {
        g["name"]: g for g in build_param_groups(model, kinds, OptimConfig(lr=1e-3, embedding_lr_mult=30))
    }
    assert groups["embedding"]["lr"] == pytest.approx(3e-2) and groups["embedding"]["lr_mult"] == 30
    assert groups["hidden"]["lr"] == pytest.approx(1e-3) and groups["vector"]["lr"] == pytest.approx(1e-3)


@pytest.mark.parametrize("bad", [0.0, -1.0, float("inf"), float("nan")])
def test_embedding_lr_mult_must_be_positive_and_finite(bad):
    with pytest.raises(ValueError, match="embedding_lr_mult"):
        OptimConfig(embedding_lr_mult=bad)


def test_embedding_l2_must_not_be_negative():
    with pytest.raises(ValueError, match="embedding_l2"):
        OptimConfig(embedding_l2=-0.1)


@pytest.mark.parametrize("branch", [{"cross_layers": 1}, {"fm": True}, {"item_bias": True}])
def test_branch_loss_trains_the_head_and_the_branch_each_on_the_labels(branch):
    dims = tiny_dims()
    torch.manual_seed(0)
    m = RankerModule(ranker=RankerConfig(d_model=16, n_heads=2, **branch), dims=dims, branch_loss=0.5)
    m.ranker.set_item_tables(*random_item_tables(dims))
    with torch.no_grad():  # zero readouts would make every part's loss log 2
        for p in m.ranker.parameters():
            if p.ndim == 2 and not p.abs().sum():
                p.normal_()
    batch = random_batch(dims, batch_size=8)
    head, wide = m.ranker.forward_parts(batch)
    torch.testing.assert_close(m.ranker(batch), head + wide)

    def bce(z):
        w = batch.weight
        return (F.binary_cross_entropy_with_logits(z, batch.label, reduction="none") * w).sum() / w.sum()

    want = bce(head + wide) + 0.5 * (bce(head) + bce(wide))
    assert bce(head) != bce(wide)
    with pytest.warns(UserWarning, match="self.trainer"):  # no Trainer: self.log only warns
        got = m._shared_step(batch, "train")
    torch.testing.assert_close(got, want)


def test_branch_loss_needs_a_branch():
    with pytest.raises(ValueError, match=r"model.branch_loss=1.0 needs a logit term beside"):
        RankerModule(ranker=RankerConfig(d_model=16, n_heads=2), dims=tiny_dims(), branch_loss=1.0)
    with pytest.raises(ValueError, match=r"model.branch_loss=-1 must be >= 0"):
        RankerModule(ranker=RankerConfig(d_model=16, n_heads=2), dims=tiny_dims(), branch_loss=-1)
