"""muP coordinate check (Yang et al. 2022), with the optimizer groups training uses.

Shape suffixes: the legend in ``recformer/__init__.py``.

The coordinate check trains a model of each width for a few Adam steps on one fixed batch and
records the RMS of every layer's activations ("coordinate size"). Under muP those curves lie on top
of each other across widths; under the standard parametrization they grow with width, because a
constant Adam LR moves a hidden matrix by O(1) per entry and its output by O(width). The mup
package's ``get_coord_data`` is the model for this; this version is small enough to run in a test.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from recformer.batch import Batch
from recformer.config import OptimConfig
from recformer.model.mup import hidden_lr_multiplier
from recformer.model.ranker import Ranker
from recformer.optim import build_param_groups


def coord_check(
    make_model: Callable[[int], Ranker],
    batch: Batch,
    widths: Sequence[int],
    steps: int = 3,
    lr: float = 1e-2,
    seed: int = 0,
) -> dict[int, torch.Tensor]:
    """Activation RMS per layer after each of ``steps`` Adam steps, for each width.

    ``make_model(width)`` builds a ranker of that ``d_model`` (muP or not, as its config says).
    Returns ``{width: rms}`` of shape [A, Y + 2]: per step, the token embeddings (block-0 input),
    each block's output and the logits; row s is measured after s + 1 updates on ``batch`` (BCE loss
    on ``batch.label``), over the valid tokens only. Every width starts from the same seed.
    """
    if steps < 1:
        raise ValueError(f"coord_check: steps={steps} must be >= 1")
    out: dict[int, torch.Tensor] = {}
    for width in widths:
        torch.manual_seed(seed)
        model = make_model(width)
        model.train()
        # The training code's own groups (muP: hidden LR / m), without weight decay: Adam.
        groups = build_param_groups(
            model, model.param_kinds(), OptimConfig(lr=lr, weight_decay=0.0), hidden_lr_multiplier(model.cfg)
        )
        opt = torch.optim.Adam([{"params": g["params"], "lr": g["lr"]} for g in groups])
        rows = []
        for _ in range(steps):
            logits_B = model(batch)
            loss = F.binary_cross_entropy_with_logits(logits_B, batch.label)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            with torch.no_grad():
                logits_B, stats = model.forward_stats(batch)
                rows.append(_layer_rms(stats.hidden, logits_B, batch.hist_mask, model.tokens.n_context))
        out[width] = torch.stack(rows)
    return out


def _layer_rms(
    hidden: list[torch.Tensor], logits_B: torch.Tensor, hist_mask: torch.Tensor, n_context: int
) -> torch.Tensor:
    """RMS of each hidden state over valid tokens, then of the logits: [Y + 2]."""
    h0 = hidden[0]
    B, T = h0.shape[:2]
    valid_BT = torch.ones(B, T, dtype=torch.bool, device=h0.device)
    if hist_mask.shape[1]:
        valid_BT[:, n_context : n_context + hist_mask.shape[1]] = hist_mask
    w_BT1 = valid_BT.unsqueeze(-1).float()
    denom = w_BT1.sum() * h0.shape[-1]
    rms = [((h.float().square() * w_BT1).sum() / denom).sqrt() for h in hidden]
    rms.append(logits_B.float().square().mean().sqrt())
    return torch.stack(rms)
