"""The training terms beside the log loss: within-group ranking losses and the embedding L2 penalty.

Everything here runs on the device with no host sync (no ``.item()``, no data-dependent shapes), so
it can sit in the compiled training step.

- ``pairwise_loss``: RankNet over a batch's (positive, negative) pairs of one group (user).
- ``listwise_loss``: softmax cross-entropy over each group's rows (ListNet's top-one form).
- ``table_l2``: the squared norm of the embedding tables, for an L2 penalty as CTR libraries apply
  it (FuxiCTR's ``embedding_regularizer``, DeepCTR's ``l2_reg_embedding``): on every row, every step.

Both ranking losses see a group's rows only where the batch holds several of them: with rows
shuffled on their own a batch of 256 MovieLens rows holds few same-user pairs;
``data.group_rows`` keeps each user's rows together in chunks (``recformer/data/dataset.py``).

Shape suffixes: the legend in ``recformer/__init__.py``.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F


def pairwise_loss(logits_B: torch.Tensor, label_B: torch.Tensor, group_B: torch.Tensor) -> torch.Tensor:
    """Mean RankNet loss ``log(1 + exp(-(s_pos - s_neg)))`` (Burges et al. 2005) over (positive,
    negative) pairs of one group in the batch; 0 when there are none."""
    pairs_BB = (group_B[:, None] == group_B[None, :]) & (label_B[:, None] > label_B[None, :])
    margin_BB = logits_B[:, None] - logits_B[None, :]
    n = pairs_BB.sum()
    return (F.softplus(-margin_BB) * pairs_BB).sum() / n.clamp_min(1)


def listwise_loss(logits_B: torch.Tensor, label_B: torch.Tensor, group_B: torch.Tensor) -> torch.Tensor:
    """Softmax cross-entropy over each group's rows in the batch, averaged over the groups that have
    both a positive and a negative row; 0 when none has.

    A group's target distribution is its labels normalised to sum to 1 (ListNet's top-one
    probability, Cao et al. 2007), its predicted one the softmax of its logits over its own rows:
    ``-sum_i y_i / sum(y) * log softmax_g(s)_i``. Unlike RankNet it compares each positive with
    all of the group's rows at once, so a negative that outscores many positives costs more. Labels
    in (0, 1) weigh their rows by the label."""
    same_BB = group_B[:, None] == group_B[None, :]
    # log sum_j exp(s_j) over row i's group; the diagonal is always in, so never -inf.
    lse_B = logits_B[None, :].masked_fill(~same_BB, float("-inf")).logsumexp(dim=1)
    pos_B = (same_BB * label_B[None, :]).sum(1)  # the group's total label mass, per row
    neg_B = (same_BB * (1 - label_B)[None, :]).sum(1)
    mixed_B = (pos_B > 0) & (neg_B > 0)  # groups with something to order
    # Each mixed group's rows carry y_i / sum(y); summed, a group counts once.
    w_B = torch.where(mixed_B, label_B / pos_B.clamp_min(1e-12), 0.0)
    groups = torch.where(mixed_B, 1.0 / same_BB.sum(1), 0.0).sum()
    return (w_B * (lse_B - logits_B)).sum() / groups.clamp_min(1)


def table_l2(tables: Iterable[torch.Tensor]) -> torch.Tensor:
    """``sum ||W||^2`` over the given embedding tables (every row, seen by the batch or not)."""
    return torch.stack([t.float().square().sum() for t in tables]).sum()
