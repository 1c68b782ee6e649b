"""Attention against a hand-written reference (outputs and gradients), the probe statistics, QK-Norm."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from recformer.config import RankerConfig
from recformer.model import attention as attention_module
from recformer.model.attention import MATMUL_MAX_HEADS, MATMUL_MAX_TOKENS, Attention, matmul_attention

EPS = 1e-6


def _norm(t: torch.Tensor, g: torch.Tensor, kind: str) -> torch.Tensor:
    if kind == "rms":
        return t / torch.sqrt(t.pow(2).mean(-1, keepdim=True) + EPS) * g
    mu = t.mean(-1, keepdim=True)
    var = (t - mu).pow(2).mean(-1, keepdim=True)
    return (t - mu) / torch.sqrt(var + EPS) * g


def reference_attention(
    attn: Attention, x: torch.Tensor, valid: torch.Tensor, qk: str, kind: str, scale: float
):
    """Textbook multi-head attention written from the weights; returns (output, logits, probs)."""
    B, T, D = x.shape
    N = attn.n_heads
    H = D // N
    w_q, w_k, w_v = attn.qkv.weight.split(D, dim=0)
    q, k, v = x @ w_q.T, x @ w_k.T, x @ w_v.T
    if qk == "full":
        q, k = _norm(q, attn.qk_norm.q_norm.weight, kind), _norm(k, attn.qk_norm.k_norm.weight, kind)
    q, k, v = (t.reshape(B, T, N, H).permute(0, 2, 1, 3) for t in (q, k, v))
    if qk == "head":
        q, k = _norm(q, attn.qk_norm.q_norm.weight, kind), _norm(k, attn.qk_norm.k_norm.weight, kind)
    logits = torch.einsum("bnqh,bnkh->bnqk", q, k) * scale
    logits = logits.masked_fill(~valid[:, None, None, :], float("-inf"))
    p = torch.softmax(logits, dim=-1)
    o = torch.einsum("bnqk,bnkh->bnqh", p, v).permute(0, 2, 1, 3).reshape(B, T, D)
    return o @ attn.out.weight.T, logits, p


def _setup(qk: str, kind: str, mup: bool, seed: int = 0):
    torch.manual_seed(seed)
    cfg = RankerConfig(
        d_model=16, n_heads=4, qk_norm=qk, norm=kind, mup=mup, init="mup" if mup else "scaled", base_d_model=8
    )
    attn = Attention(cfg).double()
    with torch.no_grad():
        attn.qkv.weight.normal_(0, 0.5)
        attn.out.weight.normal_(0, 0.5)
        if attn.qk_norm is not None:  # non-trivial gains so a missing gain would show
            attn.qk_norm.q_norm.weight.uniform_(0.5, 1.5)
            attn.qk_norm.k_norm.weight.uniform_(0.5, 1.5)
    B, T = 3, 7
    x = torch.randn(B, T, 16, dtype=torch.float64, requires_grad=True)
    valid = torch.ones(B, T, dtype=torch.bool)
    valid[0, 2:5] = False  # padded keys in the middle of sample 0
    valid[2, 1:6] = False
    scale = 1 / (cfg.d_model // cfg.n_heads) if mup else 1 / math.sqrt(cfg.d_model // cfg.n_heads)
    return attn, x, valid, scale


@pytest.mark.parametrize("kernel", ["sdpa", "matmul"])
@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("mup", [False, True])
@pytest.mark.parametrize("kind", ["rms", "layer"])
@pytest.mark.parametrize("qk", ["none", "head", "full"])
def test_attention_matches_reference_outputs_and_gradients(
    qk: str, kind: str, mup: bool, fused: bool, kernel: str
):
    """Both ways of projecting q, k and v: three matmuls (CPU, eager, with QK-Norm) and the fused
    one (elsewhere); both attention kernels, SDPA and the per-head matmuls."""
    attn, x, valid, scale = _setup(qk, kind, mup)
    assert attn._separate_projections(x) == (qk != "none")  # CPU, eager: separate when QK-Norm is on
    if fused:
        attn._separate_projections = lambda x_BTD: False
    attn.kernel = kernel
    assert attn.scale == pytest.approx(scale)
    out = attn(x, valid[:, None, None, :])
    want, _, _ = reference_attention(attn, x, valid, qk, kind, scale)
    torch.testing.assert_close(out, want, rtol=1e-9, atol=1e-10)

    g = torch.randn_like(out)
    params = [x] + list(attn.parameters())
    grads = torch.autograd.grad((out * g).sum(), params)
    want_grads = torch.autograd.grad((want * g).sum(), params)
    for got, exp in zip(grads, want_grads):
        torch.testing.assert_close(got, exp, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("keep", [slice(0, 2), slice(-2, None), slice(1, 6, 2)])
@pytest.mark.parametrize("qk", ["head", "full"])
def test_separate_and_fused_projections_agree_on_the_kept_queries(qk: str, keep: slice) -> None:
    """With ``keep`` (the last block's queries) the three matmuls give the fused path's update and
    gradients, and both equal the rows ``keep`` selects of the full update."""
    attn, x, valid, _ = _setup(qk, "layer", mup=False, seed=2)
    attend = valid[:, None, None, :]
    g = torch.randn_like(x[:, keep])
    params = [x] + list(attn.parameters())
    got = {}
    for fused, kernel in itertools.product((False, True), ("sdpa", "matmul")):
        attn._separate_projections = lambda x_BTD, fused=fused: not fused
        attn.kernel = kernel
        out = attn(x, attend, keep)
        got[fused, kernel] = (out, torch.autograd.grad((out * g).sum(), params))
        torch.testing.assert_close(out, attn(x, attend)[:, keep], rtol=1e-9, atol=1e-10)
    first = got[False, "sdpa"]
    for out, grads in got.values():
        torch.testing.assert_close(out, first[0], rtol=1e-9, atol=1e-10)
        for a, b in zip(grads, first[1]):
            torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10)


def test_the_fused_projection_serves_compile_and_export(monkeypatch) -> None:
    """Under ``torch.compile`` or ``torch.export`` (and on GPU) q, k and v come from one matmul."""
    attn, x, _, _ = _setup("head", "layer", mup=False)
    assert attn._separate_projections(x)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert not attn._separate_projections(x)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: False)
    monkeypatch.setattr(torch.compiler, "is_exporting", lambda: True)
    assert not attn._separate_projections(x)


def test_auto_takes_the_matmuls_on_cpu_in_eager_fp32_at_small_shapes(monkeypatch) -> None:
    """``attention_kernel: auto``: per-head matmuls on CPU, eager, fp32, up to 64 tokens and 8
    heads; SDPA in float64, under autocast, beyond either bound, and under compile or export.
    ``sdpa`` and ``matmul`` hold everywhere."""
    attn = Attention(RankerConfig(d_model=16, n_heads=MATMUL_MAX_HEADS))
    x = torch.randn(2, MATMUL_MAX_TOKENS, 16)
    assert attn._use_matmuls(x)
    assert not attn._use_matmuls(x.double())
    assert not attn._use_matmuls(torch.randn(2, MATMUL_MAX_TOKENS + 1, 16))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not attn._use_matmuls(x)
    assert not Attention(RankerConfig(d_model=16, n_heads=2 * MATMUL_MAX_HEADS))._use_matmuls(x)
    attn.kernel = "sdpa"
    assert not attn._use_matmuls(x)
    attn.kernel = "auto"
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert not attn._use_matmuls(x)
    attn.kernel = "matmul"
    assert attn._use_matmuls(x)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: False)
    monkeypatch.setattr(torch.compiler, "is_exporting", lambda: True)
    assert attn._use_matmuls(x)
    attn.kernel = "auto"
    assert not attn._use_matmuls(x)


def test_a_bad_attention_kernel_is_named() -> None:
    expected = r"attention_kernel='flash'; expected 'auto', 'sdpa', 'matmul' or 'mixed'"
    with pytest.raises(ValueError, match=expected):
        RankerConfig(attention_kernel="flash")


def test_mixed_takes_the_matmuls_in_the_last_block_alone_and_computes_what_sdpa_does() -> None:
    """``attention_kernel: mixed``: SDPA where every token is updated, the per-head matmuls where
    only the kept tokens are (the last block), on any device or dtype; the same updates as SDPA."""
    torch.manual_seed(0)
    mixed = Attention(RankerConfig(d_model=16, n_heads=2, attention_kernel="mixed"))
    sdpa = Attention(RankerConfig(d_model=16, n_heads=2, attention_kernel="sdpa"))
    sdpa.load_state_dict(mixed.state_dict())
    x = torch.randn(3, 7, 16)
    attend = torch.ones(3, 1, 1, 7, dtype=torch.bool)
    attend[0, ..., 2:4] = False
    keep = slice(6, 7)
    assert not mixed._use_matmuls(x) and not mixed._use_matmuls(x.double())
    assert mixed._use_matmuls(x, keep) and mixed._use_matmuls(x.double(), keep)
    calls = []
    original = attention_module.matmul_attention
    with pytest.MonkeyPatch.context() as m:
        m.setattr(attention_module, "matmul_attention", lambda *a, **k: calls.append(1) or original(*a, **k))
        torch.testing.assert_close(mixed(x, attend), sdpa(x, attend))
        assert not calls
        torch.testing.assert_close(mixed(x, attend, keep), sdpa(x, attend, keep))
        assert calls == [1]


def test_matmul_attention_equals_sdpa_in_fp32_with_and_without_a_mask_and_drops_its_weights() -> None:
    """The training shapes in fp32: the last block's 2 queries over 56 keys, and every query; no
    mask (every key valid) as well. Under dropout a kept weight is scaled by 1 / (1 - p), as SDPA's
    math path does: with q = 0 (uniform weights) and v = 1, each output is the kept fraction of
    weights over (1 - p), 1 in expectation."""
    torch.manual_seed(0)
    k, v = torch.randn(64, 2, 56, 32), torch.randn(64, 2, 56, 32)
    attend = torch.rand(64, 1, 1, 56) > 0.3
    attend[..., -2:] = True
    for q in (torch.randn(64, 2, 2, 32), torch.randn(64, 2, 56, 32)):
        for mask in (attend, None):
            want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.2)
            got = matmul_attention(q, k, v, mask, 0.2)
            torch.testing.assert_close(got, want.transpose(1, 2).flatten(2), rtol=1e-5, atol=1e-6)
    out = matmul_attention(
        torch.zeros(64, 2, 56, 32), k, torch.ones(64, 2, 56, 32), None, 0.2, dropout_p=0.25
    )
    assert out.mean().item() == pytest.approx(1.0, abs=0.01)
    assert (out - 1).abs().max() > 0.05  # a mask per weight, not per output


@pytest.mark.parametrize(
    "mask",
    ["per head and query", "shared by the batch", "additive", "three dims"],
)
def test_matmul_attention_takes_every_mask_sdpa_takes(mask: str) -> None:
    """Masks other than the rankers' boolean [B, 1, 1, T]: a boolean per head and query, one row for
    the whole batch, an additive float mask, one of fewer dims (broadcast from the right)."""
    torch.manual_seed(1)
    q, k, v = torch.randn(4, 3, 5, 8), torch.randn(4, 3, 7, 8), torch.randn(4, 3, 7, 8)
    attend = {
        "per head and query": torch.rand(4, 3, 5, 7) > 0.4,
        "shared by the batch": torch.rand(1, 1, 1, 7) > 0.4,
        "additive": torch.randn(4, 1, 5, 7),
        "three dims": torch.rand(1, 5, 7) > 0.4,
    }[mask]
    if attend.dtype == torch.bool:
        attend[..., 0] = True  # every query has a key
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=attend, scale=0.3)
    got = matmul_attention(q, k, v, attend, 0.3)
    torch.testing.assert_close(got, want.transpose(1, 2).flatten(2), rtol=1e-5, atol=1e-6)


def test_forced_matmul_attention_keeps_its_softmax_in_fp32_under_bf16() -> None:
    """``attention_kernel: matmul`` with bf16 inputs: the softmax in fp32 as SDPA's, so its error
    against a float64 reference is no worse than SDPA's own."""
    torch.manual_seed(2)
    q, k, v = (torch.randn(16, 2, 56, 32, dtype=torch.float64) * 2 for _ in range(3))
    attend = torch.rand(16, 1, 1, 56) > 0.3
    attend[..., 0] = True
    exact = matmul_attention(q, k, v, attend, 32**-0.5)
    bf = [t.bfloat16() for t in (q, k, v)]
    ours = matmul_attention(*bf, attend, 32**-0.5).double()
    sdpa = torch.nn.functional.scaled_dot_product_attention(*bf, attn_mask=attend, scale=32**-0.5)
    sdpa = sdpa.transpose(1, 2).flatten(2).double()
    assert (ours - exact).abs().max() <= 1.5 * (sdpa - exact).abs().max()


@pytest.mark.parametrize("qk", ["none", "head"])
def test_explicit_path_equals_training_path_and_reports_logit_max_and_entropy(qk: str) -> None:
    attn, x, valid, scale = _setup(qk, "rms", mup=False, seed=1)
    attend = valid[:, None, None, :]
    fast = attn(x, attend)
    slow, stats = attn.explicit(x, attend)
    torch.testing.assert_close(slow, fast, rtol=1e-9, atol=1e-10)

    _, logits, p = reference_attention(attn, x, valid, qk, "rms", scale)
    q_valid = valid[:, None, :, None]
    want_max = logits.masked_fill(~q_valid, float("-inf")).amax(dim=(0, 2, 3))
    torch.testing.assert_close(stats.logit_max_N, want_max)
    # Entropy / log(valid keys) averaged over valid queries, by a per-sample loop.
    ent = torch.zeros(attn.n_heads, dtype=torch.float64)
    count = 0
    for b in range(x.shape[0]):
        keys = valid[b]
        for t in keys.nonzero().flatten():
            pk = p[b, :, t, keys]
            ent += -(pk * pk.log()).sum(-1) / math.log(int(keys.sum()))
            count += 1
    torch.testing.assert_close(stats.entropy_N, ent / count)


def test_entropy_is_one_for_uniform_attention() -> None:
    attn, x, valid, _ = _setup("none", "rms", mup=False)
    with torch.no_grad():
        attn.qkv.weight[:16].zero_()  # q = 0: every logit equal, softmax uniform over the valid keys
    _, stats = attn.explicit(x, valid[:, None, None, :])
    torch.testing.assert_close(stats.entropy_N, torch.ones(attn.n_heads, dtype=torch.float64))


@pytest.mark.parametrize("mode", ["head", "full"])
def test_qk_norm_bounds_logits_when_qk_weights_grow(mode: str) -> None:
    """Scale the q and k rows of the projection by 100: plain logits grow ~1e4x; QK-Norm's do not move."""

    def max_logit(qk: str, gain: float) -> float:
        torch.manual_seed(0)
        cfg = RankerConfig(d_model=32, n_heads=2, qk_norm=qk)
        attn = Attention(cfg)
        with torch.no_grad():
            attn.qkv.weight.normal_(0, 0.02)
            attn.qkv.weight[: 2 * cfg.d_model] *= gain
        x = torch.randn(4, 10, cfg.d_model)
        _, stats = attn.explicit(x, None)
        return float(stats.logit_max_N.max())

    plain_before, plain_after = max_logit("none", 1.0), max_logit("none", 100.0)
    qk_before, qk_after = max_logit(mode, 1.0), max_logit(mode, 100.0)
    assert plain_after / plain_before > 5000
    # Unit-RMS q, k with unit gains: |q . k| / sqrt(H) <= sqrt(H) = 4, at any weight scale.
    assert qk_after <= math.sqrt(16) + 1e-4
    assert qk_after == pytest.approx(qk_before, rel=1e-3)
