"""Multi-head self-attention with optional QK-Norm and a muP-aware logit scale.

Shape suffixes: the legend in ``recformer/__init__.py``.

Two paths share the projections (``_project``):

- ``forward`` (training): ``F.scaled_dot_product_attention`` with the boolean key-padding mask, or
  on CPU at the small shapes where it is faster (``RankerConfig.attention_kernel``), per head two
  batched matmuls around a softmax (``matmul_attention``). No hooks, no ``.item()``, no branching
  on tensor values, so ``ranker.compile()`` captures it in one graph.
- ``explicit`` (the stats path, always eager): the logits are formed as ``q k^T`` so that the max
  logit and the attention entropy can be read, which the fused kernel never materialises; they are
  returned with the update (``AttentionStats``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from recformer.config import RankerConfig
from recformer.model.dropout import branch_dropout
from recformer.model.mup import attention_scale
from recformer.model.norms import QKNorm
from recformer.model.token_params import TokenLayout, specific_weight, token_linear

MATMUL_MAX_TOKENS = 64
"""``attention_kernel: auto`` takes ``matmul_attention`` up to this many tokens (keys) ..."""
MATMUL_MAX_HEADS = 8
"""... and this many heads (``Attention._use_matmuls``; more were not measured)."""


def matmul_attention(
    q_BNQH: torch.Tensor,
    k_BNTH: torch.Tensor,
    v_BNTH: torch.Tensor,
    attend_B11T: torch.Tensor | None,
    scale: float,
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """Attention as SDPA computes it, per head from two batched matmuls; the heads' outputs [B, Q, D].

    Each head reads its [B, *, H] slices of q, k and v as strided views of the projections' [B, T,
    N, H] layout, which the batched matmuls take as they are; the backward stacks the heads'
    gradients back into that layout in one copy, and the heads' outputs are concatenated in
    another. ``attend_B11T`` is SDPA's ``attn_mask``: boolean (True: attend) or additive, shaped to
    broadcast against [B, N, Q, T]; it enters as an additive bias inside the logits' matmul
    (``baddbmm``), with the scale, so the [B, Q, T] logits are written once. bf16 or fp16 inputs
    are computed in fp32 (autocast off), as SDPA's CPU kernels accumulate them. Dropout on the
    weights as SDPA's math path applies it. A query with no valid key gets NaN (SDPA: zeros); the
    rankers' CLS and target are always valid."""
    dtype = q_BNQH.dtype
    work = torch.promote_types(dtype, torch.float32)  # bf16 / fp16 inputs: computed in fp32
    with torch.autocast(q_BNQH.device.type, enabled=False):
        q_BNQH, k_BNTH, v_BNTH = (t.to(work) for t in (q_BNQH, k_BNTH, v_BNTH))
        bias_BNQT = None if attend_B11T is None else _key_bias(attend_B11T, work)
        heads = []
        # unbind over the heads of [B, *, N, H] (the projections' own layout): its backward stacks
        # the heads' gradients into that layout in one copy, where indexing each head would
        # zero-fill and add a full-size gradient per head.
        per_head = (t.transpose(1, 2).unbind(2) for t in (q_BNQH, k_BNTH, v_BNTH))
        for n, (q_BQH, k_BTH, v_BTH) in enumerate(zip(*per_head)):
            k_BHT = k_BTH.transpose(1, 2)
            if bias_BNQT is None:
                logit_BQT = torch.bmm(q_BQH, k_BHT) * scale
            else:  # this head's mask, or the one every head shares
                bias_BQT = bias_BNQT[:, n if bias_BNQT.shape[1] > 1 else 0]
                logit_BQT = torch.baddbmm(bias_BQT, q_BQH, k_BHT, alpha=scale)
            p_BQT = torch.softmax(logit_BQT, dim=-1)
            if dropout_p > 0:
                p_BQT = F.dropout(p_BQT, dropout_p)
            heads.append(torch.bmm(p_BQT, v_BTH))
        return torch.cat(heads, dim=-1).to(dtype)


def _key_bias(attend: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """SDPA's ``attn_mask`` as an additive [B | 1, N | 1, Q | 1, T] bias: 0 / -inf for a boolean one."""
    if attend.dtype == torch.bool:
        bias = torch.zeros(attend.shape, dtype=dtype, device=attend.device).masked_fill(
            ~attend, float("-inf")
        )
    else:
        bias = attend.to(dtype)
    while bias.dim() < 4:  # SDPA broadcasts a mask of fewer dims from the right
        bias = bias[None]
    return bias


@dataclass
class AttentionStats:
    """What the explicit path reads off the logits, per head (detached)."""

    logit_max_N: torch.Tensor
    """Max pre-softmax logit over valid queries and valid keys of the batch."""
    entropy_N: torch.Tensor
    """Mean over valid queries of the softmax entropy / log(number of valid keys): 1 = uniform over
    the keys, 0 = one-hot."""


class Attention(nn.Module):
    """Bidirectional multi-head attention over the valid tokens; returns the residual-branch update.

    One fused ``qkv`` projection (rows: q, then k, then v) and one output projection ``out``, both
    without bias (the norms carry the offsets; fewer kernels on the hot path). With a ``layout``
    (``token_params: specific``) the non-sequence tokens use their own ``qkv_specific`` and
    ``out_specific`` (``model/token_params.py``).
    """

    def __init__(self, cfg: RankerConfig, layout: TokenLayout | None = None) -> None:
        super().__init__()
        self.d_model, self.n_heads, self.d_head = cfg.d_model, cfg.n_heads, cfg.d_head
        self.layout = layout
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.out = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.qkv_specific = specific_weight(layout, self.qkv)
        self.out_specific = specific_weight(layout, self.out)
        self.qk_norm = (
            None if cfg.qk_norm == "none" else QKNorm(cfg.qk_norm, cfg.norm, cfg.d_model, cfg.d_head)
        )
        self.scale = attention_scale(cfg)
        self.dropout = cfg.dropout if cfg.dropout_branches == "both" else 0.0  # on the output (the branch)
        self.dropout_mask = cfg.dropout_mask
        self.attention_dropout = cfg.attention_dropout_p  # on the weights
        self.kernel = cfg.attention_kernel

    def forward(
        self, x_BTD: torch.Tensor, attend_B11T: torch.Tensor | None, keep: slice | None = None
    ) -> torch.Tensor:
        """Update for every token, or only for the query tokens ``keep`` selects (then [B, Q, D]).

        ``attend_B11T`` is True where a key may be attended to (None = every token is valid). With
        ``keep``, keys and values still come from all T tokens but queries only from the kept ones.
        """
        q_BNQH, k_BNTH, v_BNTH = self._project(x_BTD, keep)
        dropout_p = self.attention_dropout if self.training else 0.0
        if self._use_matmuls(x_BTD, keep):
            o_BQD = matmul_attention(q_BNQH, k_BNTH, v_BNTH, attend_B11T, self.scale, dropout_p)
            return self._project_out(o_BQD, keep)
        o_BNQH = F.scaled_dot_product_attention(
            q_BNQH, k_BNTH, v_BNTH, attn_mask=attend_B11T, dropout_p=dropout_p, scale=self.scale
        )
        return self._output(o_BNQH, keep)

    def _use_matmuls(self, x_BTD: torch.Tensor, keep: slice | None = None) -> bool:
        """Whether ``forward`` takes ``matmul_attention`` rather than SDPA (``attention_kernel``).

        ``mixed`` takes the matmuls where the block updates only the ``keep`` tokens (the last).

        ``auto`` takes the matmuls on CPU, eager, in fp32, at up to ``MATMUL_MAX_TOKENS`` tokens and
        ``MATMUL_MAX_HEADS`` heads, where SDPA's fused CPU kernel was level or slower forward and
        backward and the default's whole training step ran 1.08x as fast with the matmuls; beyond
        them SDPA won (``bench/bench_attention.py``'s header, 2026-12-07, 2 threads). Elsewhere
        (GPU, bf16 autocast, compile, export) SDPA, whose kernels and fusions win there."""
        if self.kernel == "mixed":
            return keep is not None
        if self.kernel != "auto":
            return self.kernel == "matmul"
        if x_BTD.device.type != "cpu" or x_BTD.dtype != torch.float32 or torch.is_autocast_enabled("cpu"):
            return False
        if x_BTD.shape[1] > MATMUL_MAX_TOKENS or self.n_heads > MATMUL_MAX_HEADS:
            return False
        return not (torch.compiler.is_compiling() or torch.compiler.is_exporting())

    def explicit(
        self, x_BTD: torch.Tensor, attend_B11T: torch.Tensor | None
    ) -> tuple[torch.Tensor, AttentionStats]:
        """``forward``'s update of every token, with the logits materialised, and their statistics."""
        q_BNTH, k_BNTH, v_BNTH = self._project(x_BTD, None)
        o_BNTH, stats = self._explicit(q_BNTH, k_BNTH, v_BNTH, attend_B11T)
        return self._output(o_BNTH, None), stats

    def _project(
        self, x_BTD: torch.Tensor, keep: slice | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries (of the ``keep`` rows, or all), keys and values, QK-normalised, as [B, N, *, H]."""
        if self._separate_projections(x_BTD):
            q_BQNH, k_BTNH, v_BTNH = self._project_separately(x_BTD, keep)
        else:
            q_BQNH, k_BTNH, v_BTNH = self._project_fused(x_BTD, keep)
        return tuple(t.transpose(1, 2) for t in (q_BQNH, k_BTNH, v_BTNH))

    def _separate_projections(self, x_BTD: torch.Tensor) -> bool:
        """Whether q, k and v come from three matmuls (the rows of ``qkv``) rather than one.

        With QK-Norm, on CPU, eager: the norm's kernel needs contiguous rows, so a q or k sliced out
        of the fused [B, T, 3D] output is copied before the norm, and again in its backward, and the
        three gradients are stacked into one [B, T, 3D] for the fused matmul's backward. Three
        matmuls give contiguous q, k and v and take their gradients as they come: the default's
        training step runs 1.04x as fast on 2 CPU threads (``bench/bench_throughput.py``,
        2026-12-06); without QK-Norm (BST) the fused matmul is as fast. Elsewhere (GPU, compile,
        export) the fused one, whose copies a compiled graph fuses."""
        if self.qk_norm is None or self.qkv_specific is not None or x_BTD.device.type != "cpu":
            return False
        return not (torch.compiler.is_compiling() or torch.compiler.is_exporting())

    def _project_separately(
        self, x_BTD: torch.Tensor, keep: slice | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v as [B, *, N, H] from the q, k and v rows of ``qkv`` one at a time, QK-normalised."""
        B, T, D = x_BTD.shape
        N, H = self.n_heads, self.d_head
        w_q, w_k, w_v = self.qkv.weight.split(D, dim=0)
        q_BQD = F.linear(x_BTD if keep is None else x_BTD[:, keep], w_q)
        k_BTD, v_BTD = F.linear(x_BTD, w_k), F.linear(x_BTD, w_v)
        if self.qk_norm.mode == "full":  # QK-Norm over the full width (OLMo 2)
            q_BQD, k_BTD = self.qk_norm.q_norm(q_BQD), self.qk_norm.k_norm(k_BTD)
            return q_BQD.view(B, -1, N, H), k_BTD.view(B, T, N, H), v_BTD.view(B, T, N, H)
        q_BQNH = self.qk_norm.q_norm(q_BQD.view(B, -1, N, H))  # QK-Norm per head
        return q_BQNH, self.qk_norm.k_norm(k_BTD.view(B, T, N, H)), v_BTD.view(B, T, N, H)

    def _project_fused(
        self, x_BTD: torch.Tensor, keep: slice | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v as [B, *, N, H] from one fused matmul (two with ``keep``), QK-normalised."""
        B, T, D = x_BTD.shape
        N, H = self.n_heads, self.d_head
        full_qk = self.qk_norm is not None and self.qk_norm.mode == "full"
        if keep is None:
            qkv_BTX = token_linear(x_BTD, self.qkv.weight, self.qkv_specific, self.layout)  # one fused matmul
            if full_qk:
                q_BQD, k_BTD, v_BTD = qkv_BTX.split(D, dim=-1)
            else:
                q_BQNH, k_BTNH, v_BTNH = qkv_BTX.view(B, T, 3, N, H).unbind(dim=2)
        else:
            # Only the kept tokens need queries: project them alone, keys and values for all.
            w_q, w_kv = self.qkv.weight.split([D, 2 * D], dim=0)
            s_q, s_kv = (None, None) if self.qkv_specific is None else self.qkv_specific.split([D, 2 * D], 1)
            q_BQD = token_linear(x_BTD[:, keep], w_q, s_q, self.layout, keep)
            kv_BTX = token_linear(x_BTD, w_kv, s_kv, self.layout)
            if full_qk:
                k_BTD, v_BTD = kv_BTX.split(D, dim=-1)
            else:
                q_BQNH = q_BQD.view(B, -1, N, H)
                k_BTNH, v_BTNH = kv_BTX.view(B, T, 2, N, H).unbind(dim=2)
        if full_qk:
            q_BQD = self.qk_norm.q_norm(q_BQD)  # QK-Norm over the full width (OLMo 2)
            k_BTD = self.qk_norm.k_norm(k_BTD)
            return q_BQD.view(B, -1, N, H), k_BTD.view(B, T, N, H), v_BTD.view(B, T, N, H)
        if self.qk_norm is not None:
            q_BQNH = self.qk_norm.q_norm(q_BQNH)  # QK-Norm per head: bounds the logits
            k_BTNH = self.qk_norm.k_norm(k_BTNH)
        return q_BQNH, k_BTNH, v_BTNH

    def _output(self, o_BNQH: torch.Tensor, keep: slice | None) -> torch.Tensor:
        B, _, Q, _ = o_BNQH.shape
        return self._project_out(o_BNQH.transpose(1, 2).reshape(B, Q, self.d_model), keep)

    def _project_out(self, o_BQD: torch.Tensor, keep: slice | None) -> torch.Tensor:
        """The heads' outputs, concatenated as [B, Q, D], through ``out``; the branch's dropout."""
        y_BQD = token_linear(o_BQD, self.out.weight, self.out_specific, self.layout, keep)
        return branch_dropout(y_BQD, self.dropout, self.training, self.dropout_mask)

    def _explicit(
        self,
        q_BNTH: torch.Tensor,
        k_BNTH: torch.Tensor,
        v_BNTH: torch.Tensor,
        attend_B11T: torch.Tensor | None,
    ) -> tuple[torch.Tensor, AttentionStats]:
        """Attention with materialised logits, and their statistics (``AttentionStats``)."""
        B, _, T, _ = q_BNTH.shape
        logit_BNTT = (q_BNTH @ k_BNTH.transpose(-2, -1)) * self.scale
        if attend_B11T is None:
            attend_B11T = torch.ones(B, 1, 1, T, dtype=torch.bool, device=q_BNTH.device)
        logit_BNTT = logit_BNTT.masked_fill(~attend_B11T, float("-inf"))
        # Softmax in at least fp32 (bf16 logits under autocast), like the fused kernel.
        p_BNTT = torch.softmax(logit_BNTT, dim=-1, dtype=torch.promote_types(logit_BNTT.dtype, torch.float32))
        p_drop = (
            F.dropout(p_BNTT, self.attention_dropout, self.training) if self.attention_dropout > 0 else p_BNTT
        )
        o_BNTH = p_drop.to(v_BNTH.dtype) @ v_BNTH

        with torch.no_grad():
            query_B1T1 = attend_B11T.transpose(-1, -2)
            logit_max_N = logit_BNTT.masked_fill(~query_B1T1, float("-inf")).amax(dim=(0, 2, 3))
            # 0 * log 0 = 0 for the masked keys (p is exactly 0 there).
            plogp_BNTT = torch.where(p_BNTT > 0, p_BNTT * p_BNTT.clamp_min(1e-30).log(), 0.0)
            ent_BNT = -plogp_BNTT.sum(dim=-1)
            # CLS and target are always valid, so every sample has >= 2 keys and log(n) > 0.
            log_keys_B11 = attend_B11T.sum(dim=-1).float().clamp_min(2.0).log()
            query_B1T = query_B1T1.squeeze(-1).float()
            entropy_N = (ent_BNT / log_keys_B11 * query_B1T).sum(dim=(0, 2)) / query_B1T.sum()
        return o_BNTH, AttentionStats(logit_max_N, entropy_N)
