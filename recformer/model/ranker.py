"""The tokenized-feature Transformer ranker: tokens -> blocks -> head -> one click logit per sample.

Shape legend: ``B`` batch, ``T`` tokens, ``D`` model width, ``N`` heads, ``L`` number of blocks,
``K`` tokens the head reads (1 or 2), ``M`` head hidden width.

Two forward paths over the same modules:

- ``ranker(batch)``: the training path. No hooks, no host syncs, no branching on tensor values;
  ``ranker.compile()`` (in place, state-dict keys unchanged) captures it as one graph. The last
  block updates only the token(s) the head reads (its other outputs would be dead compute), which
  removes most of that block's matmuls: about (L - 1) / L of the model's block FLOPs remain.
- ``ranker(batch, return_stats=True)``: the probe path for the health callbacks. It runs eagerly
  even on a compiled ranker (``torch.compiler.disable``) and forms attention explicitly to read the
  logits. See ``Ranker.forward`` for the statistics it returns.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from recformer.batch import Batch
from recformer.config import FeatureDims, RankerConfig
from recformer.model.blocks import NORMALISED_STREAM, make_block
from recformer.model.embedding import FeatureTokenizer, matrix_params
from recformer.model.init import init_weights
from recformer.model.norms import make_norm

ParamKind = Literal["hidden", "input", "embedding", "vector", "readout"]


class Head(nn.Module):
    """MLP from the CLS and/or target token to one logit; ``out`` is the muP readout layer.

    Under muP the readout input is multiplied by 1/m (m = d_model / base_d_model), the "MuReadout"
    of Yang et al. 2022: the readout's fan-in grows with width while its Adam LR stays constant.
    """

    def __init__(self, cfg: RankerConfig) -> None:
        super().__init__()
        self.read = cfg.head
        n_in = 2 * cfg.d_model if cfg.head == "both" else cfg.d_model
        self.hidden = nn.Linear(n_in, cfg.head_hidden or 2 * cfg.d_model)
        self.out = nn.Linear(self.hidden.out_features, 1)
        self.readout_mult = 1.0 / cfg.width_mult if cfg.mup else 1.0

    def keep(self, n_tokens: int) -> slice:
        """Positions the head reads: CLS at 0, the target at T - 1 (see FeatureTokenizer)."""
        if self.read == "cls":
            return slice(0, 1)
        if self.read == "target":
            return slice(n_tokens - 1, n_tokens)
        return slice(0, n_tokens, n_tokens - 1)  # 0 and T - 1 (T >= 2: CLS and target always exist)

    def select(self, x_BTD: torch.Tensor) -> torch.Tensor:
        return x_BTD[:, self.keep(x_BTD.shape[1])]

    def forward(self, z_BKD: torch.Tensor) -> torch.Tensor:
        """``z_BKD``: the selected (and normalised) tokens; returns logits [B]."""
        h_BM = F.gelu(self.hidden(z_BKD.flatten(1)))
        if self.readout_mult != 1.0:
            h_BM = h_BM * self.readout_mult
        return self.out(h_BM).squeeze(-1)


class Ranker(nn.Module):
    """Pure ``nn.Module`` ranker built from a ``RankerConfig`` and the data's ``FeatureDims``."""

    def __init__(self, cfg: RankerConfig, dims: FeatureDims) -> None:
        super().__init__()
        self.cfg = cfg
        self.dims = dims
        self.tokens = FeatureTokenizer(cfg, dims)
        self.blocks = nn.ModuleList(make_block(cfg, layer) for layer in range(cfg.n_layers))
        # Post / DeepNorm blocks end in a norm already; the others leave the stream unnormalised.
        self.final_norm = (
            nn.Identity() if cfg.norm_placement in NORMALISED_STREAM else make_norm(cfg.norm, cfg.d_model)
        )
        self.head = Head(cfg)
        init_weights(self)

    @property
    def n_tokens(self) -> int:
        """Tokens per sample T (CLS + context + history + target)."""
        return self.tokens.n_tokens

    def set_item_tables(self, content: torch.Tensor | None, features: torch.Tensor | None) -> None:
        """Copy the item side table (content [item_rows, K] any float dtype, features [item_rows, I]
        int) into the persistent buffers; row 0 is the OOV row. See ``FeatureTokenizer``."""
        self.tokens.set_item_tables(content, features)

    def flops_per_sample(self) -> float:
        """Training FLOPs per sample of the training path (``Throughput``'s MFU): 6 per matrix
        parameter per token it is applied to (2 per multiply-add, backward twice the forward), and
        12 * Q * T * D per block for attention (q k^T and p v) over Q query and T key tokens. Every
        block but the last runs all T tokens; the last computes queries, the output projection and
        the MLP for the K tokens the head reads only (its keys and values still cover all T).
        The head runs once per sample; the tokenizer counts its own (``FeatureTokenizer``).
        Embedding lookups are no FLOPs."""
        T, D = self.n_tokens, self.cfg.d_model
        K = len(range(T)[self.head.keep(T)])
        flops = 0.0
        for i, block in enumerate(self.blocks):
            if i < len(self.blocks) - 1:
                flops += 6.0 * matrix_params(block) * T + 12.0 * T * T * D
            else:
                kv = 2 * D * D  # the k and v rows of the fused qkv projection
                flops += 6.0 * (kv * T + (matrix_params(block) - kv) * K) + 12.0 * K * T * D
        return flops + 6.0 * matrix_params(self.head) + self.tokens.flops_per_sample()

    def param_kinds(self) -> dict[str, ParamKind]:
        """muP / optimizer category of every parameter (Yang et al. 2022, Table 3 for Adam):

        - ``input``: projections of the dense, embedding and content inputs (fixed fan-in): init
          and Adam LR constant in width, weight decay as any dense matrix;
        - ``embedding``: tables and CLS / slot embeddings: init and Adam LR constant in width, no
          weight decay;
        - ``hidden``: matrices with both dimensions proportional to width: init std / sqrt(m),
          Adam LR / m;
        - ``vector``: norm gains and biases: constant;
        - ``readout``: the head's last weight: constant LR, its input is scaled by 1/m instead.
        """
        kinds: dict[str, ParamKind] = self.tokens.param_kinds("tokens.")
        for name, p in self.named_parameters():
            if name.startswith("tokens."):
                continue
            elif name == "head.out.weight":
                kinds[name] = "readout"
            elif p.ndim == 1:
                kinds[name] = "vector"
            elif p.ndim == 2:
                kinds[name] = "hidden"
            else:
                raise RuntimeError(f"param_kinds: no rule for parameter {name} of shape {tuple(p.shape)}")
        return kinds

    def __call__(
        self, batch: Batch, return_stats: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, dict[str, torch.Tensor | list[torch.Tensor]]]:
        # The probe path skips the compiled call that ``ranker.compile()`` installs, so it runs
        # eagerly even under ``compile(fullgraph=True)`` and never adds guards to the training graph.
        if return_stats:
            return self._forward_with_stats(batch)
        return super().__call__(batch)

    def forward(
        self, batch: Batch, return_stats: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, dict[str, torch.Tensor | list[torch.Tensor]]]:
        """Click logits, float32 [B]. With ``return_stats=True`` also a dict of detached tensors:

        - ``hidden``: list of L + 1 [B, T, D] residual streams: the block-0 input, then each output;
        - ``resid_rms`` [L]: RMS of each block's output over the valid tokens;
        - ``attn_logit_max`` [L, N]: max pre-softmax logit per head over valid queries and keys;
        - ``attn_entropy`` [L, N]: mean over valid queries of entropy / log(valid keys): 1 is uniform
          averaging, 0 is a one-hot softmax;
        - ``cos_adjacent`` [L]: mean cosine between the stream entering and leaving each block over
          valid tokens: near 1 means the block barely changes its input (idles).
        """
        if return_stats:
            return self._forward_with_stats(batch)
        x_BTD, valid_BT = self.tokens(batch)
        attend_B11T = None if valid_BT is None else valid_BT[:, None, None, :]
        for block in self.blocks[:-1]:
            x_BTD = block(x_BTD, attend_B11T)
        # The head reads 1-2 tokens, so the last block updates only those (queries, out projection
        # and MLP on K tokens instead of T); their keys and values still come from every token.
        z_BKD = self.blocks[-1](x_BTD, attend_B11T, self.head.keep(x_BTD.shape[1]))
        return self.head(self.final_norm(z_BKD)).float()

    @torch.compiler.disable
    def _forward_with_stats(
        self, batch: Batch
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor | list[torch.Tensor]]]:
        x_BTD, valid_BT = self.tokens(batch)
        attend_B11T = None if valid_BT is None else valid_BT[:, None, None, :]
        if valid_BT is None:
            valid_BT = torch.ones(x_BTD.shape[:2], dtype=torch.bool, device=x_BTD.device)
        w_BT = valid_BT.float()
        n_valid = w_BT.sum()

        hidden = [x_BTD.detach()]
        resid, logit_max, entropy, cos = [], [], [], []
        for block in self.blocks:
            block.attn.probe = {}
            try:
                y_BTD = block(x_BTD, attend_B11T)
                probe = block.attn.probe
            finally:
                block.attn.probe = None  # the training path must never see a probe dict
            with torch.no_grad():
                y32_BTD, x32_BTD = y_BTD.detach().float(), x_BTD.detach().float()
                resid.append(((y32_BTD.square().mean(-1) * w_BT).sum() / n_valid).sqrt())
                cos.append((F.cosine_similarity(x32_BTD, y32_BTD, dim=-1) * w_BT).sum() / n_valid)
            logit_max.append(probe["logit_max_N"].float())
            entropy.append(probe["entropy_N"].float())
            hidden.append(y_BTD.detach())
            x_BTD = y_BTD
        logits_B = self._read(x_BTD)
        stats: dict[str, torch.Tensor | list[torch.Tensor]] = {
            "hidden": hidden,
            "resid_rms": torch.stack(resid),
            "attn_logit_max": torch.stack(logit_max),
            "attn_entropy": torch.stack(entropy),
            "cos_adjacent": torch.stack(cos),
        }
        return logits_B, stats

    def _read(self, x_BTD: torch.Tensor) -> torch.Tensor:
        # Select first, then normalise: the final norm is per token, so only the read tokens need it.
        return self.head(self.final_norm(self.head.select(x_BTD))).float()

    def extra_repr(self) -> str:
        c = self.cfg
        return (
            f"T={self.n_tokens}, D={c.d_model}, L={c.n_layers}, N={c.n_heads}, placement={c.norm_placement}, "
            f"norm={c.norm}, qk_norm={c.qk_norm}, init={c.init}, mup={c.mup} (m={c.width_mult:.3g})"
        )
