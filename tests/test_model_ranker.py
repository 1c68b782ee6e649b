"""The Ranker end to end: padding invariance, empty histories, stats, item tables, compile parity."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from recformer.config import FeatureDims, RankerConfig
from recformer.model import Ranker
from tests._model_batches import random_batch, random_item_tables, tiny_dims


def _ranker(dims: FeatureDims | None = None, seed: int = 0, **kw) -> Ranker:
    """A tiny ranker whose head is NOT zero (a zero readout would make every logit equal)."""
    torch.manual_seed(seed)
    dims = dims or tiny_dims()
    cfg = RankerConfig(**{"d_model": 16, "n_heads": 2, "n_layers": 2, **kw})
    ranker = Ranker(cfg, dims)
    ranker.set_item_tables(*random_item_tables(dims, seed))
    with torch.no_grad():
        ranker.head.out.weight.normal_(0, 1.0)
    return ranker.eval()


def _scramble(batch, where: torch.Tensor, dims: FeatureDims, seed: int):
    """Random ids (and gaps, event categoricals) in the history slots where ``where`` is True."""
    g = torch.Generator().manual_seed(seed)
    item = torch.where(where, torch.randint(0, dims.item_rows, where.shape, generator=g), batch.hist_item)
    gap = torch.where(
        where, torch.randint(0, dims.time_gap_buckets, where.shape, generator=g), batch.hist_gap
    )
    cat = torch.where(
        where[..., None],
        torch.randint(0, dims.hist_cat_rows[0], batch.hist_cat.shape, generator=g),
        batch.hist_cat,
    )
    return dataclasses.replace(batch, hist_item=item, hist_gap=gap, hist_cat=cat)


@pytest.mark.parametrize("placement", ["pre", "post", "reordered"])
def test_padded_history_slots_change_no_output(placement: str) -> None:
    dims = tiny_dims()
    ranker = _ranker(dims, norm_placement=placement)
    batch = random_batch(dims, batch_size=8, empty_history=2)
    assert (~batch.hist_mask).any()
    logits, stats = ranker.forward_stats(batch)
    other = _scramble(batch, ~batch.hist_mask, dims, seed=1)
    logits2, stats2 = ranker.forward_stats(other)
    torch.testing.assert_close(logits2, logits, rtol=0, atol=1e-6)  # probe path
    torch.testing.assert_close(ranker(other), ranker(batch), rtol=0, atol=1e-6)  # training path (SDPA)
    valid = torch.ones(logits.shape[0], ranker.n_tokens, dtype=torch.bool)
    n_ctx = ranker.tokens.n_context
    valid[:, n_ctx : n_ctx + dims.max_len] = batch.hist_mask
    for h, h2 in zip(stats.hidden[1:], stats2.hidden[1:]):
        torch.testing.assert_close(h2[valid], h[valid], rtol=0, atol=1e-6)
    for key in ("resid_rms_Y", "attn_logit_max_YN", "attn_entropy_YN", "cos_adjacent_Y"):
        torch.testing.assert_close(getattr(stats2, key), getattr(stats, key), rtol=0, atol=1e-6)
    # The same change on real events must move the logits, or the test above proves nothing.
    changed = _scramble(batch, batch.hist_mask, dims, seed=2)
    assert (ranker(changed) - logits).abs().max() > 1e-4  # 100x the tolerance above


def test_empty_histories_give_finite_outputs_and_stats() -> None:
    dims = tiny_dims()
    ranker = _ranker(dims)
    batch = random_batch(dims, batch_size=4, empty_history=4)  # no sample has any event
    assert not batch.hist_mask.any()
    logits, stats = ranker.forward_stats(batch)
    assert torch.isfinite(logits).all()
    for key in ("resid_rms_Y", "attn_logit_max_YN", "attn_entropy_YN", "cos_adjacent_Y"):
        assert torch.isfinite(getattr(stats, key)).all(), key
    ranker.train()
    torch.nn.functional.binary_cross_entropy_with_logits(ranker(batch), batch.label).backward()
    assert all(torch.isfinite(p.grad).all() for p in ranker.parameters() if p.grad is not None)


def test_model_without_history_or_context_features() -> None:
    dims = FeatureDims(item_rows=10)  # only the target item: tokens are CLS and target
    ranker = _ranker(dims)
    batch = random_batch(dims, batch_size=3)
    assert ranker.n_tokens == 2
    logits, stats = ranker.forward_stats(batch)
    assert logits.shape == (3,) and torch.isfinite(logits).all()
    assert stats.attn_entropy_YN.shape == (2, 2)


def test_tokens_equal_per_field_lookups() -> None:
    """The one-bag lookup against a per-sample, per-field loop over the same table."""
    dims = tiny_dims()
    ranker = _ranker(dims, dense_tokens=2)
    tok = ranker.tokens
    batch = random_batch(dims, batch_size=3)
    x, valid = tok(batch)
    W, slot, D = tok.table.weight, tok.slot_emb, 16
    # Row offsets in table order: context fields, items, item features, event categoricals, gaps.
    sizes = [*dims.cat_rows, dims.item_rows, *dims.item_feat_rows, *dims.hist_cat_rows, dims.time_gap_buckets]
    start = [sum(sizes[:i]) for i in range(len(sizes))]
    n_cat, n_feat = len(dims.cat_rows), len(dims.item_feat_rows)
    s_item, s_feat = start[n_cat], start[n_cat + 1 : n_cat + 1 + n_feat]
    s_hcat, s_gap = start[n_cat + 1 + n_feat], start[-1]
    feats, content = tok.item_feats, tok.item_content.float()

    def item(i: int) -> torch.Tensor:
        v = W[s_item + i] + tok.content_proj(content[i])
        return v + sum(W[s_feat[f] + feats[i, f]] for f in range(n_feat))

    for b in range(3):
        want = [tok.cls]
        want += list(tok.dense_proj(batch.dense[b]).view(2, D))
        want += [tok.emb_proj[0](batch.emb[b])]
        want += [W[start[f] + batch.cat[b, f]] for f in range(n_cat)]
        for t in range(dims.max_len):
            i = int(batch.hist_item[b, t])
            want.append(item(i) + W[s_hcat + batch.hist_cat[b, t, 0]] + W[s_gap + batch.hist_gap[b, t]])
        want.append(item(int(batch.target_item[b])))
        torch.testing.assert_close(x[b], torch.stack(want) + slot)
    n_ctx = 1 + 2 + 1 + n_cat
    assert tok.n_context == n_ctx and valid[:, :n_ctx].all() and valid[:, -1].all()
    assert torch.equal(valid[:, n_ctx:-1], batch.hist_mask)


@pytest.mark.parametrize("read", ["cls", "target", "both"])
def test_head_reads_the_configured_tokens(read: str) -> None:
    ranker = _ranker(head=read)
    x = torch.randn(2, 9, 16)
    want = {"cls": x[:, [0]], "target": x[:, [8]], "both": x[:, [0, 8]]}[read]
    assert torch.equal(ranker.head.select(x), want)


def test_stats_have_the_documented_shapes_and_values() -> None:
    dims = tiny_dims()
    ranker = _ranker(dims, n_layers=3)
    batch = random_batch(dims, batch_size=6)
    logits, stats = ranker.forward_stats(batch)
    Y, N, T = 3, 2, ranker.n_tokens
    torch.testing.assert_close(logits, ranker(batch))
    assert logits.dtype == torch.float32 and logits.shape == (6,)
    assert len(stats.hidden) == Y + 1 and all(h.shape == (6, T, 16) for h in stats.hidden)
    assert stats.resid_rms_Y.shape == (Y,) and stats.cos_adjacent_Y.shape == (Y,)
    assert stats.attn_logit_max_YN.shape == (Y, N) and stats.attn_entropy_YN.shape == (Y, N)
    assert ((stats.attn_entropy_YN > 0) & (stats.attn_entropy_YN <= 1 + 1e-6)).all()
    valid = torch.ones(6, T, dtype=torch.bool)
    n_ctx = ranker.tokens.n_context
    valid[:, n_ctx : n_ctx + dims.max_len] = batch.hist_mask
    for i in range(Y):
        h_in, h_out = stats.hidden[i][valid], stats.hidden[i + 1][valid]
        torch.testing.assert_close(stats.resid_rms_Y[i], h_out.pow(2).mean().sqrt())
        cos = torch.nn.functional.cosine_similarity(h_in, h_out, dim=-1).mean()
        torch.testing.assert_close(stats.cos_adjacent_Y[i], cos)


def test_item_tables_are_persistent_compact_buffers_and_used() -> None:
    dims = tiny_dims()
    ranker = _ranker(dims)
    batch = random_batch(dims)
    state = ranker.state_dict()
    assert state["tokens.item_content"].dtype == torch.float16
    assert state["tokens.item_content"].shape == (dims.item_rows, dims.content_dim)
    assert state["tokens.item_feats"].shape == (dims.item_rows, len(dims.item_feat_rows))
    # A checkpoint is self-contained: a fresh ranker loading it scores identically.
    fresh = Ranker(ranker.cfg, dims).eval()
    fresh.load_state_dict(state)
    torch.testing.assert_close(fresh(batch), ranker(batch))
    # Content and item features reach the logits.
    before = ranker(batch)
    content, feats = random_item_tables(dims, seed=5)
    ranker.set_item_tables(content.double(), feats)
    assert (ranker(batch) - before).abs().max() > 1e-3


def test_set_item_tables_rejects_bad_shapes_and_rows() -> None:
    dims = tiny_dims()
    ranker = _ranker(dims)
    content, feats = random_item_tables(dims)
    with pytest.raises(ValueError, match="content_dim=8"):
        ranker.set_item_tables(content[:, :4], feats)
    with pytest.raises(ValueError, match="n_item_feats=2"):
        ranker.set_item_tables(content, feats[:, :1])
    bad = feats.clone()
    bad[3, 1] = dims.item_feat_rows[1]
    with pytest.raises(ValueError, match=r"item feature 1 has rows outside \[0, 3\)"):
        ranker.set_item_tables(content, bad)
    with pytest.raises(ValueError, match="float16"):
        ranker.set_item_tables(content * 1e6, feats)


def test_batch_that_does_not_match_the_dims_is_named() -> None:
    dims = tiny_dims()
    ranker = _ranker(dims)
    batch = random_batch(dataclasses.replace(dims, cat_rows=[7, 4, 3]))
    with pytest.raises(ValueError, match=r"Batch.cat has 3 columns .* FeatureDims.len\(cat_rows\)=2"):
        ranker(batch)


def test_dropout_only_in_training_mode() -> None:
    dims = tiny_dims()
    ranker = _ranker(dims, dropout=0.3)
    batch = random_batch(dims)
    torch.testing.assert_close(ranker(batch), ranker(batch))
    ranker.train()
    assert (ranker(batch) - ranker(batch)).abs().max() > 1e-4


def _compile_parity(backend: str, **kw) -> None:
    dims = tiny_dims()
    eager = _ranker(dims, qk_norm="head", mlp="swiglu", **kw)
    compiled = _ranker(dims, qk_norm="head", mlp="swiglu", **kw)
    compiled.load_state_dict(eager.state_dict())
    compiled.compile(fullgraph=True, backend=backend)  # fullgraph: any graph break raises
    assert list(compiled.state_dict()) == list(eager.state_dict())
    batch = random_batch(dims)
    eager.train()
    compiled.train()
    y_e, y_c = eager(batch), compiled(batch)
    torch.testing.assert_close(y_c, y_e, rtol=1e-5, atol=1e-5)
    y_e.sum().backward()
    y_c.sum().backward()
    for (name, p_e), p_c in zip(eager.named_parameters(), compiled.parameters()):
        torch.testing.assert_close(p_c.grad, p_e.grad, rtol=1e-4, atol=1e-6, msg=name)
    # The probe path still runs (eagerly) on the compiled ranker and agrees with it.
    y_s, stats = compiled.forward_stats(batch)
    torch.testing.assert_close(y_s, y_c, rtol=1e-5, atol=1e-5)
    assert len(stats.hidden) == 3


def test_compiled_and_eager_ranker_agree_and_share_state_dict_keys() -> None:
    _compile_parity("aot_eager")  # traces the full graph and AOT autograd; no C++ build


def test_token_specific_weights_compile_in_one_graph() -> None:
    _compile_parity("aot_eager", token_params="specific")


@pytest.mark.parametrize("cross_hidden", [[], [8]])
def test_the_parts_compile_in_one_graph_and_sum_to_the_logits(cross_hidden) -> None:
    """``forward_parts`` (what the training step runs under ``model.branch_loss``) compiles as
    ``forward`` does, with or without the DNN beside the cross layers, and its two parts sum to
    ``forward``'s logits."""
    dims = tiny_dims()
    ranker = _ranker(dims, cross_layers=1, cross_hidden=cross_hidden)
    with torch.no_grad():
        ranker.cross.out.weight.normal_()
    batch = random_batch(dims)
    parts = torch.compile(ranker.forward_parts, fullgraph=True, backend="aot_eager")
    head_B, wide_B = parts(batch)
    torch.testing.assert_close(head_B + wide_B, ranker(batch), rtol=1e-5, atol=1e-5)
    assert wide_B.abs().max() > 0


@pytest.mark.parametrize("mask", ["element", "feature"])
def test_residual_dropout_compiles_in_one_graph_in_training(mask) -> None:
    dims = tiny_dims()
    ranker = _ranker(dims, dropout=0.2, attention_dropout=0.0, dropout_mask=mask).train()
    head_B, _ = torch.compile(ranker.forward_parts, fullgraph=True, backend="aot_eager")(random_batch(dims))
    head_B.sum().backward()
    assert ranker.blocks[0].mlp.down.weight.grad is not None


@pytest.mark.slow
def test_compiled_inductor_ranker_agrees_with_eager() -> None:
    _compile_parity("inductor")


@pytest.mark.parametrize(
    "change",
    [
        {},
        {"item_feat_values": [1, 3]},  # a multi-valued feature: padding rows
        {"hist_cat_rows": [], "time_gap_buckets": 0},  # an event's bag is its item's alone
        {"cat_rows": []},
        {"max_len": 0, "hist_cat_rows": [], "time_gap_buckets": 0},
        {"content_dim": 0},
    ],
    ids=["every-kind", "multi-valued", "no-event-ids", "no-context", "no-history", "no-content"],
)
def test_once_per_item_path_equals_per_slot(change):
    """The CPU path summing each distinct item's id and feature rows and projecting its content
    once (``FeatureTokenizer.once_per_item``) gives the per-slot path's outputs and gradients, every
    parameter's, to float rounding."""
    dims = dataclasses.replace(tiny_dims(), **change)
    torch.manual_seed(0)
    a = Ranker(RankerConfig(d_model=16, n_layers=1, n_heads=2), dims)
    a.set_item_tables(*random_item_tables(dims, 0))
    with torch.no_grad():  # off the zero-initialised head, so gradients reach the tokens
        for p in a.parameters():
            p.add_(0.05 * torch.randn_like(p))
    b = Ranker(RankerConfig(d_model=16, n_layers=1, n_heads=2), dims)
    b.load_state_dict(a.state_dict())
    b.tokens.once_per_item = False
    batch = random_batch(dims, 32, seed=1)
    items = torch.cat([batch.hist_item.flatten(), batch.target_item])
    assert len(torch.unique(items)) < items.numel()  # items repeat
    out_a, out_b = a(batch), b(batch)
    torch.testing.assert_close(out_a, out_b, rtol=1e-5, atol=1e-6)
    out_a.sum().backward()
    out_b.sum().backward()
    assert a.tokens.table.weight.grad.abs().sum() > 0
    for (name, p_a), p_b in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(p_a.grad, p_b.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_target_pooled_history_is_dins_interest_and_ignores_padding() -> None:
    """``history_pool: target``: the cross network's history field is DIN's weighted sum of the
    valid events (the DIN baseline's own pooling), it differs by target, padded slots change
    nothing, and the whole forward compiles in one graph."""
    from recformer.model import fm

    dims = tiny_dims()
    ranker = _ranker(dims, cross_layers=1, history_pool="target")
    with torch.no_grad():
        ranker.cross.out.weight.normal_()
        ranker.history_pool[-1].weight.normal_(0, 1.0)
    batch = random_batch(dims, batch_size=8, empty_history=2)
    x_BTD, _ = ranker.tokens(batch)
    v_BFD = fm.fields(ranker.tokens, x_BTD, batch.hist_mask, ranker.history_pool)
    n, L = ranker.tokens.n_context, dims.max_len
    hist_BLD, tgt_BD = x_BTD[:, n : n + L], x_BTD[:, -1]
    pair = torch.cat([hist_BLD, tgt_BD[:, None].expand_as(hist_BLD)], -1)
    want = []
    for b in range(8):  # one sample at a time, the valid events only
        ok = batch.hist_mask[b]
        h, t = hist_BLD[b, ok], tgt_BD[b].expand(int(ok.sum()), -1)
        w = ranker.history_pool(torch.cat([h, t, h - t, h * t], -1)).squeeze(-1)
        want.append((w[:, None] * h).sum(0))
    torch.testing.assert_close(v_BFD[:, n - 1], torch.stack(want), rtol=1e-5, atol=1e-6)
    assert pair.shape[-1] == 2 * ranker.cfg.d_model
    assert v_BFD[:, n - 1].abs().sum() > 0
    other = _scramble(batch, ~batch.hist_mask, dims, seed=1)
    torch.testing.assert_close(ranker(other), ranker(batch), rtol=0, atol=1e-6)
    compiled = torch.compile(ranker.forward_parts, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(sum(compiled(batch)), ranker(batch), rtol=1e-5, atol=1e-5)
    from recformer.model import flops

    mean = _ranker(dims, cross_layers=1)
    D = ranker.cfg.d_model
    unit = 4 * D * 2 * D + 2 * D  # the attention unit's matrices, once per history slot
    extra = flops.total(ranker.flop_terms()) - flops.total(mean.flop_terms())
    assert extra == pytest.approx(6.0 * unit * dims.max_len)


def test_no_history_field_leaves_the_history_to_the_blocks() -> None:
    """``history_pool: none``: the cross network's fields are the context (but CLS) and the target,
    its weights one field narrower; the events still change the logit, through the blocks."""
    from recformer.model import fm

    dims = tiny_dims()
    ranker = _ranker(dims, cross_layers=1, history_pool="none")
    with torch.no_grad():
        ranker.cross.out.weight.normal_()
    n, D = ranker.tokens.n_context, ranker.cfg.d_model
    assert ranker.cross.layers[0].linear.in_features == n * D  # n - 1 context fields and the target
    assert _ranker(dims, cross_layers=1).cross.layers[0].linear.in_features == (n + 1) * D
    batch = random_batch(dims, batch_size=8)
    x_BTD, _ = ranker.tokens(batch)
    v_BFD = fm.fields(ranker.tokens, x_BTD, batch.hist_mask, None, history=False)
    torch.testing.assert_close(v_BFD, torch.cat([x_BTD[:, 1:n], x_BTD[:, -1:]], 1))
    _, wide_B = ranker.forward_parts(batch)
    other = _scramble(batch, batch.hist_mask, dims, seed=1)
    torch.testing.assert_close(ranker.forward_parts(other)[1], wide_B)  # the branch reads no event
    assert not torch.allclose(ranker(other), ranker(batch))


def test_rating_gated_means_split_the_history_by_a_learned_gate_of_its_rating() -> None:
    """``history_pool: rating``: two history fields, the valid events' means weighted by the
    sigmoid of their rating's gate logit and by its complement; at init (logits 0) both are the
    plain mean; padded slots change nothing; the gate is a table the optimizer trains."""
    from recformer.model import fm

    dims = tiny_dims()
    ranker = _ranker(dims, cross_layers=1, history_pool="rating")
    n, L, D = ranker.tokens.n_context, dims.max_len, ranker.cfg.d_model
    assert ranker.cross.layers[0].linear.in_features == (n + 2) * D
    assert ranker.param_kinds()["history_gate.weight"] == "table"
    batch = random_batch(dims, batch_size=8, empty_history=2)
    x_BTD, _ = ranker.tokens(batch)
    hist_BLD, mask_BL = x_BTD[:, n : n + L], batch.hist_mask
    plain_BD = fm.masked_mean(hist_BLD, mask_BL)
    v_BFD = fm.fields(ranker.tokens, x_BTD, mask_BL, None, True, ranker._gate(batch))
    torch.testing.assert_close(v_BFD[:, n - 1], plain_BD)
    torch.testing.assert_close(v_BFD[:, n], plain_BD)
    with torch.no_grad():
        ranker.history_gate.weight.normal_(0, 2.0)
        ranker.cross.out.weight.normal_()
    gate_BL = ranker._gate(batch)
    v_BFD = fm.fields(ranker.tokens, x_BTD, mask_BL, None, True, gate_BL)
    for b in range(8):  # one sample at a time, the valid events only
        ok = mask_BL[b]
        w, h = gate_BL[b, ok], hist_BLD[b, ok]
        want = [(w[:, None] * h).sum(0) / w.sum(), ((1 - w)[:, None] * h).sum(0) / (1 - w).sum()]
        if not ok.any():
            want = [torch.zeros(D), torch.zeros(D)]
        torch.testing.assert_close(v_BFD[b, n - 1 : n + 1], torch.stack(want), rtol=1e-5, atol=1e-6)
    other = _scramble(batch, ~batch.hist_mask, dims, seed=1)
    torch.testing.assert_close(ranker(other), ranker(batch), rtol=0, atol=1e-6)
    ranker(batch).sum().backward()
    assert ranker.history_gate.weight.grad.abs().sum() > 0
    # The rating dropout hides ratings from the gate in training (the OOV row), never in evaluation.
    dropping = _ranker(dims, cross_layers=1, history_pool="rating", history_cat_dropout=0.5)
    with torch.no_grad():
        dropping.history_gate.weight.copy_(torch.arange(len(dropping.history_gate.weight))[:, None] + 1.0)
    unknown = torch.sigmoid(dropping.history_gate.weight[0, 0])
    rated = batch.hist_cat[..., 0] > 0
    torch.manual_seed(0)
    assert (dropping.train()._gate(batch)[rated] == unknown).float().mean() > 0.2
    assert not (dropping.eval()._gate(batch)[rated] == unknown).any()


def test_mean_and_target_pooled_history_are_two_fields_from_a_unit_of_its_width() -> None:
    """``history_pool: mean_target``: the cross network reads the history's mean, then DIN's
    target-weighted sum (the ``target`` field) from a unit ``history_unit_hidden`` wide; the unit
    is trained and counted in the FLOPs; padded slots change nothing."""
    from recformer.model import flops, fm

    dims = tiny_dims()
    ranker = _ranker(dims, cross_layers=1, history_pool="mean_target", history_unit_hidden=8)
    n, L, D = ranker.tokens.n_context, dims.max_len, ranker.cfg.d_model
    assert ranker.cross.layers[0].linear.in_features == (n + 2) * D
    assert [m.out_features for m in ranker.history_pool if isinstance(m, torch.nn.Linear)] == [8, 1]
    with torch.no_grad():
        ranker.cross.out.weight.normal_()
        ranker.history_pool[-1].weight.normal_(0, 1.0)
    batch = random_batch(dims, batch_size=8, empty_history=2)
    x_BTD, _ = ranker.tokens(batch)
    hist_BLD, mask_BL = x_BTD[:, n : n + L], batch.hist_mask
    v_BFD = fm.fields(ranker.tokens, x_BTD, mask_BL, ranker.history_pool, with_mean=True)
    torch.testing.assert_close(v_BFD[:, n - 1], fm.masked_mean(hist_BLD, mask_BL))
    want_BD = fm.target_pool(ranker.history_pool, hist_BLD, x_BTD[:, -1], mask_BL)
    torch.testing.assert_close(v_BFD[:, n], want_BD)
    assert want_BD[mask_BL.any(1)].abs().sum() > 0
    torch.testing.assert_close(v_BFD[:, n + 1], x_BTD[:, -1])
    other = _scramble(batch, ~batch.hist_mask, dims, seed=1)
    torch.testing.assert_close(ranker(other), ranker(batch), rtol=0, atol=1e-6)
    ranker(batch).sum().backward()
    assert all(p.grad.abs().sum() > 0 for p in ranker.history_pool.parameters())
    mean = _ranker(dims, cross_layers=1)
    extra = flops.total(ranker.flop_terms()) - flops.total(mean.flop_terms())
    wider = flops.matrix_params(ranker.cross) - flops.matrix_params(mean.cross)  # one field more
    assert wider > 0
    assert extra == pytest.approx(6.0 * ((4 * D * 8 + 8) * L + wider))  # the unit once per slot


def test_item_pooled_history_is_the_mean_of_the_events_item_id_rows() -> None:
    """``history_pool: items``: the history field is the mean of the valid events' item-id rows of
    the tokens' table (no rating, gap, side features or content), so an event's rating does not
    reach the cross network; the rows get its gradient; padded slots change nothing."""
    from recformer.model import fm
    from recformer.model.embedding import item_id_rows

    dims = tiny_dims()
    ranker = _ranker(dims, cross_layers=1, history_pool="items")
    n, D = ranker.tokens.n_context, ranker.cfg.d_model
    assert ranker.cross.layers[0].linear.in_features == (n + 1) * D  # as wide as the mean's
    with torch.no_grad():
        ranker.cross.out.weight.normal_()
    batch = random_batch(dims, batch_size=8, empty_history=2)
    x_BTD, _ = ranker.tokens(batch)
    table = ranker.tokens.table.weight
    rows_BL = item_id_rows(batch.hist_item, dims) + ranker.tokens.item_offset
    events_BLD = ranker.tokens.item_id_embeddings(batch.hist_item)
    torch.testing.assert_close(events_BLD, table[rows_BL])
    v_BFD = fm.fields(ranker.tokens, x_BTD, batch.hist_mask, events_BLD=events_BLD)
    torch.testing.assert_close(v_BFD[:, n - 1], fm.masked_mean(table[rows_BL], batch.hist_mask))
    _, wide_B = ranker.forward_parts(batch)
    rerated = dataclasses.replace(batch, hist_cat=(batch.hist_cat + 1) % dims.hist_cat_rows[0])
    torch.testing.assert_close(ranker.forward_parts(rerated)[1], wide_B)  # the branch reads no rating
    assert not torch.allclose(ranker(rerated), ranker(batch))  # the blocks do
    other = _scramble(batch, ~batch.hist_mask, dims, seed=1)
    torch.testing.assert_close(ranker(other), ranker(batch), rtol=0, atol=1e-6)
    wide_B.sum().backward()
    assert table.grad[rows_BL[batch.hist_mask]].abs().sum() > 0


def test_target_pooling_needs_a_field_branch_and_a_history() -> None:
    with pytest.raises(ValueError, match="history_pool='target' pools the history for the fields"):
        RankerConfig(history_pool="target")
    with pytest.raises(ValueError, match=r"history_pool='sum'; expected one of \('mean', 'target', "):
        RankerConfig(history_pool="sum", fm=True)
    with pytest.raises(ValueError, match=r"history_unit_hidden=-1 must be >= 0 \(0 = 2 \* d_model\)"):
        RankerConfig(history_pool="mean_target", fm=True, history_unit_hidden=-1)
    for pool in ("target", "mean_target", "items"):
        with pytest.raises(ValueError, match=f"history_pool='{pool}' needs a history"):
            Ranker(RankerConfig(d_model=16, n_heads=2, fm=True, history_pool=pool), tiny_dims(max_len=0))
    for pool in ("mean_target", "rating", "items", "none"):
        with pytest.raises(ValueError, match=f"history_pool='{pool}' pools the history for the fields"):
            RankerConfig(history_pool=pool)
    no_cats = dataclasses.replace(tiny_dims(), hist_cat_rows=[])
    with pytest.raises(ValueError, match="history_pool='rating' needs an event categorical"):
        Ranker(RankerConfig(d_model=16, n_heads=2, cross_layers=1, history_pool="rating"), no_cats)


@pytest.mark.parametrize("content", ["add", "all"])
def test_history_tokens_keep_the_recent_events_for_the_blocks(content: str) -> None:
    """``history_tokens``: the blocks see the last K event slots (and with ``content_tokens: all``
    their content tokens) and nothing older; the cross network's pooled history still reads every
    event; the probe path, the token-specific layout and compile agree with it."""
    dims = tiny_dims(max_len=6)
    full = _ranker(dims, cross_layers=1, content_tokens=content)
    ranker = _ranker(dims, cross_layers=1, content_tokens=content, history_tokens=3)
    with torch.no_grad():
        ranker.cross.out.weight.normal_()
    per_event = 2 if content == "all" else 1
    assert ranker.n_tokens == full.n_tokens - 3 * per_event
    batch = random_batch(dims, batch_size=8, empty_history=1)
    older = torch.zeros_like(batch.hist_mask)
    older[:, :3] = True
    assert (batch.hist_mask & older).any()  # some samples have events in the dropped slots
    head, branch = ranker.forward_parts(batch)
    head2, branch2 = ranker.forward_parts(_scramble(batch, older & batch.hist_mask, dims, seed=1))
    torch.testing.assert_close(head2, head, rtol=0, atol=1e-6)  # the blocks never read them
    assert (branch2 - branch).abs().max() > 1e-4  # the pooled history field does
    recent = _scramble(batch, ~older & batch.hist_mask, dims, seed=2)
    assert (ranker.forward_parts(recent)[0] - head).abs().max() > 1e-4
    logits, stats = ranker.forward_stats(batch)
    torch.testing.assert_close(logits, ranker(batch), rtol=1e-5, atol=1e-6)
    assert stats.hidden[0].shape[1] == ranker.n_tokens
    compiled = torch.compile(ranker.forward_parts, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(sum(compiled(batch)), ranker(batch), rtol=1e-5, atol=1e-5)
    from recformer.model import flops

    fewer = flops.total(full.flop_terms()) - flops.total(ranker.flop_terms())
    assert fewer > 0
    specific = _ranker(dims, history_tokens=3, token_params="specific", content_tokens=content)
    assert specific.blocks[0].attn.layout.n_tokens == specific.n_tokens
    assert torch.isfinite(specific(batch)).all()


def test_history_tokens_at_or_over_the_history_length_keep_every_event() -> None:
    dims = tiny_dims(max_len=6)
    for kept in (6, 10):
        assert _ranker(dims, history_tokens=kept).n_tokens == _ranker(dims).n_tokens
    with pytest.raises(ValueError, match="history_tokens=-1 must be >= 0"):
        RankerConfig(history_tokens=-1)


@pytest.mark.parametrize("content", ["add", "all"])
def test_older_history_mean_is_one_token_of_the_valid_older_events(content: str) -> None:
    """``history_older: mean``: the events before the last ``history_tokens`` reach the blocks as
    one token after the context, their tokens' mean over the valid ones, masked for a sample
    without any; padded slots still change nothing."""
    dims = tiny_dims(max_len=6)
    ranker = _ranker(dims, content_tokens=content, history_tokens=3, history_older="mean")
    dropped = _ranker(dims, content_tokens=content, history_tokens=3)
    assert ranker.n_tokens == dropped.n_tokens + 1
    batch = random_batch(dims, batch_size=8, empty_history=1)
    x_BTD, attend_B11T, all_BTD = ranker._tokens(batch)
    n = ranker.tokens.n_context
    older_BL = batch.hist_mask[:, :3]
    olds = [all_BTD[:, n : n + 3]] + ([all_BTD[:, n + 6 : n + 9]] if content == "all" else [])
    masks = [older_BL] * len(olds)
    for b in range(8):
        rows = torch.cat([o[b][m[b]] for o, m in zip(olds, masks)])
        want = rows.mean(0) if len(rows) else torch.zeros(ranker.cfg.d_model)
        torch.testing.assert_close(x_BTD[b, n], want, rtol=1e-5, atol=1e-6)
    assert torch.equal(attend_B11T[:, 0, 0, n], older_BL.any(1))
    assert not older_BL[0].any() and older_BL.any()  # a sample without older events, others with
    padded = _scramble(batch, ~batch.hist_mask, dims, seed=1)
    torch.testing.assert_close(ranker(padded), ranker(batch), rtol=0, atol=1e-6)
    older = torch.zeros_like(batch.hist_mask)
    older[:, :3] = True
    moved = ranker(_scramble(batch, older & batch.hist_mask, dims, seed=2))
    assert (moved - ranker(batch)).abs().max() > 1e-4  # the older events reach the head now
    torch.testing.assert_close(ranker.forward_stats(batch)[0], ranker(batch), rtol=1e-5, atol=1e-6)
    compiled = torch.compile(ranker.forward, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(batch), ranker(batch), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="history_older='sum'; expected 'drop' or 'mean'"):
        RankerConfig(history_older="sum")


@pytest.mark.parametrize("n_heads", [2, 4])
def test_the_matmul_attention_kernel_trains_as_sdpa_does(n_heads: int) -> None:
    """The default's kernel on CPU (``attention_kernel: auto`` takes the per-head matmuls in fp32)
    gives SDPA's logits and gradients, padding and the last block's kept queries included."""
    torch.manual_seed(0)
    batch = random_batch(tiny_dims(), batch_size=8)
    got = {}
    for kernel in ("sdpa", "auto"):
        ranker = _ranker(n_heads=n_heads, n_layers=2, attention_kernel=kernel).train()
        assert ranker.blocks[0].attn._use_matmuls(torch.zeros(1, ranker.n_tokens, 16)) == (kernel == "auto")
        logit = ranker(batch)
        got[kernel] = (logit, torch.autograd.grad(logit.square().sum(), list(ranker.parameters())))
    torch.testing.assert_close(got["auto"][0], got["sdpa"][0], rtol=1e-5, atol=1e-6)
    for a, b in zip(got["auto"][1], got["sdpa"][1]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
