"""DCN-V2's cross network (Wang et al., WWW 2021), shared by ``DCNv2Ranker`` (``model/baselines.py``)
and the Transformer's ``cross_layers`` option (``model/ranker.py``).

A cross layer is x_{l+1} = x_0 * (W x_l + b) + x_l over the concatenated field embeddings x_0: layer
l holds every feature cross up to degree l + 1 as an explicit product of field embeddings (user id x
target item, pooled history x target item, genre x user, ...), the crosses the factorisation
machine limits to degree 2 and a Transformer reaches only through softmax attention over tokens.

Shape suffixes: the legend in ``recformer/__init__.py``.
"""

from __future__ import annotations

import torch
from torch import nn


class CrossLayer(nn.Module):
    """x_{l+1} = x_0 * (W x_l + b) + x_l (DCN-V2's full-rank cross layer)."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.linear = nn.Linear(d, d)

    def forward(self, x0_BX: torch.Tensor, x_BX: torch.Tensor) -> torch.Tensor:
        return x0_BX * self.linear(x_BX) + x_BX

    @torch.no_grad()
    def reset(self) -> None:
        """Glorot weights (the Keras default of the paper's code) and a zero bias."""
        nn.init.xavier_normal_(self.linear.weight)
        self.linear.bias.zero_()


def dnn(d_in: int, widths: list[int], dropout: float = 0.0, act: type[nn.Module] = nn.ReLU) -> nn.Sequential:
    """DCN-V2's and DeepFM's deep network: Linear, activation, dropout per width."""
    layers: list[nn.Module] = []
    for w in widths:
        layers += [nn.Linear(d_in, w), act(), nn.Dropout(dropout)]
        d_in = w
    return nn.Sequential(*layers)


class CrossTower(nn.Module):
    """``n_layers`` cross layers over the flattened fields, then one logit (the parallel DCN-V2's
    cross half and its share of the output layer): added to another model's logit, it is DCN-V2's
    parallel structure with that model as the deep network. With ``hidden`` widths a ReLU DNN runs
    beside the cross layers over the same fields and the logit reads both (the whole parallel
    DCN-V2, sharing the other model's embedding tables)."""

    def __init__(
        self, d_in: int, n_layers: int, readout: bool = True, hidden: list[int] | None = None
    ) -> None:
        super().__init__()
        self.layers = nn.ModuleList(CrossLayer(d_in) for _ in range(n_layers))
        self.dnn = dnn(d_in, hidden) if hidden else None
        # The other model's output layer holds the bias. None: ``cross`` feeds another layer instead.
        d_out = d_in + (hidden[-1] if hidden else 0)
        self.out = nn.Linear(d_out, 1, bias=False) if readout else None

    def cross(self, v_BFD: torch.Tensor) -> torch.Tensor:
        """``v_BFD``: the fields [B, F, D] (``fm.fields``); returns the last layer's x [B, F * D]."""
        x0_BX = v_BFD.flatten(1)
        x_BX = x0_BX
        for layer in self.layers:
            x_BX = layer(x0_BX, x_BX)
        return x_BX

    def logit(self, v_BFD: torch.Tensor, crossed_BX: torch.Tensor) -> torch.Tensor:
        """Logits [B] from ``cross``'s output ``crossed_BX`` (and the DNN over the fields ``v_BFD``)."""
        if self.dnn is not None:
            crossed_BX = torch.cat([crossed_BX, self.dnn(v_BFD.flatten(1))], -1)
        return self.out(crossed_BX).squeeze(-1)

    def forward(self, v_BFD: torch.Tensor) -> torch.Tensor:
        """Logits [B] of the crossed fields."""
        return self.logit(v_BFD, self.cross(v_BFD))

    @torch.no_grad()
    def reset(self) -> None:
        """Cross layers as ``CrossLayer.reset``, the DNN's layers Glorot with zero biases (the
        Keras default of the paper's code); the output zero, so the tower starts silent and the
        sum starts at the other model's logit."""
        for layer in self.layers:
            layer.reset()
        for linear in [m for m in self.dnn or [] if isinstance(m, nn.Linear)]:
            nn.init.xavier_normal_(linear.weight)
            linear.bias.zero_()
        if self.out is not None:
            self.out.weight.zero_()
