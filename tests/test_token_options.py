"""The ranker's token options (content as its own token, a token per dense feature, embedding
dropout, a per-item bias) and the embedding-row decay of the optimizer, against hand-written expectations."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from recformer.config import OptimConfig, RankerConfig
from recformer.model import Ranker, build_model
from recformer.module import RankerModule
from tests._model_batches import random_batch, random_item_tables, tiny_dims


def _ranker(**kw) -> tuple[Ranker, object]:
    dims = tiny_dims()
    torch.manual_seed(0)
    ranker = Ranker(RankerConfig(d_model=16, n_heads=2, **kw), dims).eval()
    ranker.set_item_tables(*random_item_tables(dims))
    return ranker, random_batch(dims, batch_size=6)


def _content(tok, rows_BS: torch.Tensor) -> torch.Tensor:
    w = tok.content_proj.weight
    return tok.content_proj(tok.item_content[rows_BS].to(w.dtype))


@pytest.mark.parametrize("mode, extra", [("add", 0), ("target", 1), ("all", 7)])
def test_content_tokens_sit_where_the_option_says(mode, extra):
    base, batch = _ranker()
    ranker, _ = _ranker(content_tokens=mode)
    tok, L = ranker.tokens, ranker.dims.max_len
    assert ranker.n_tokens == base.n_tokens + extra
    x_BTD, valid_BT = tok(batch)
    T = x_BTD.shape[1]
    assert ranker.n_tokens == T and valid_BT.shape == (6, T)
    if mode == "target":  # the target's content, one token before the target
        want = _content(tok, batch.target_item)
        torch.testing.assert_close(x_BTD[:, T - 2] - tok.slot_emb[T - 2], want)
        assert valid_BT[:, T - 2].all()
    if mode == "all":  # every event's content after the events, masked where the event is padding
        first = tok.n_context + L
        want = _content(tok, batch.hist_item)
        torch.testing.assert_close(x_BTD[:, first : first + L] - tok.slot_emb[first : first + L], want)
        assert torch.equal(valid_BT[:, first : first + L], batch.hist_mask)
    assert torch.isfinite(ranker(batch)).all()


def test_a_token_per_dense_feature_is_value_times_its_vector_plus_its_bias():
    ranker, batch = _ranker(dense_per_feature=True)
    tok = ranker.tokens
    x_BTD, _ = tok(batch)
    n = ranker.dims.n_dense
    assert tok.dense_tokens == n
    want = batch.dense[:, :, None] * tok.dense_weight + tok.dense_bias
    torch.testing.assert_close(x_BTD[:, 1 : 1 + n] - tok.slot_emb[1 : 1 + n], want)
    assert ranker.param_kinds()["tokens.dense_weight"] == "embedding"


def test_history_cat_dropout_makes_events_ratings_unknown_in_training_only():
    ranker, batch = _ranker(history_cat_dropout=0.5)
    tok = ranker.tokens
    assert tok.n_hist_cat and (batch.hist_cat > 0).any()
    x_BTD, _ = tok(batch)
    torch.testing.assert_close(tok(batch)[0], x_BTD)  # evaluation: every rating as logged
    unknown = dataclasses.replace(batch, hist_cat=torch.zeros_like(batch.hist_cat))
    ranker.train()
    tok.history_cat_dropout = 1.0 - 1e-7  # every event's rating dropped (P(any kept) ~ 1e-5)
    torch.testing.assert_close(tok(batch)[0], tok(unknown)[0])
    tok.history_cat_dropout = 0.5
    torch.manual_seed(0)
    dropped = (tok(batch)[0] - x_BTD).abs().amax(-1)[:, tok.n_context : tok.n_context + ranker.dims.max_len]
    real = batch.hist_cat[..., 0] > 0
    assert 0.3 < (dropped[real] > 0).float().mean() < 0.7  # about half the rated events changed
    assert (dropped[~real] == 0).all()  # an event without a rating has nothing to drop
    with pytest.raises(ValueError, match="history_cat_dropout=1.0 must be in"):
        RankerConfig(d_model=16, n_heads=2, history_cat_dropout=1.0)


def test_embedding_dropout_acts_in_training_only():
    ranker, batch = _ranker(embedding_dropout=0.5)
    with torch.no_grad():
        ranker.head.out.weight.normal_()
    e1, e2 = ranker(batch), ranker(batch)
    torch.testing.assert_close(e1, e2)
    ranker.train()
    assert not torch.allclose(ranker(batch), ranker(batch))


def test_embedding_decay_shrinks_the_touched_rows_only():
    dims = tiny_dims()
    m = RankerModule(
        ranker=RankerConfig(d_model=16, n_heads=2), optim=OptimConfig(embedding_decay=0.5), dims=dims
    )
    table = m.ranker.tokens.table.weight
    table.grad = torch.zeros_like(table)
    table.grad[[3, 7]] = 1.0
    before = table.detach().clone()
    opt = torch.optim.AdamW([{"params": [table], "lr": 0.1}])
    m._decay_touched_rows(opt)
    torch.testing.assert_close(table[[3, 7]], before[[3, 7]] * (1 - 0.1 * 0.5))
    untouched = torch.ones(len(table), dtype=torch.bool)
    untouched[[3, 7]] = False
    assert torch.equal(table[untouched], before[untouched])


def test_a_baseline_refuses_content_tokens_of_their_own():
    with pytest.raises(ValueError, match="set model.ranker.content_tokens=add"):
        build_model("deepfm", RankerConfig(d_model=16, n_heads=2, content_tokens="target"), tiny_dims())


def test_the_item_bias_starts_at_zero_and_adds_one_learned_logit_per_target_item():
    base, batch = _ranker()
    ranker, _ = _ranker(item_bias=True)
    torch.testing.assert_close(ranker(batch), base(batch))  # zero at init: the same model
    assert ranker.param_kinds()["item_bias.weight"] == "table"  # no weight decay; row decay applies
    with torch.no_grad():
        ranker.item_bias.weight[batch.target_item[0], 0] = 2.0
    with torch.no_grad():
        moved = ranker(batch) - base(batch)
    same = batch.target_item == batch.target_item[0]
    torch.testing.assert_close(moved, torch.where(same, 2.0, 0.0))


def test_deepfms_first_order_ids_add_a_learned_scalar_per_context_and_target_id():
    dims = tiny_dims()
    tables = random_item_tables(dims)
    models = []
    for first_order in ("fields", "ids"):
        torch.manual_seed(0)
        m = build_model("deepfm", RankerConfig(d_model=16, n_heads=2, first_order=first_order), dims).eval()
        m.set_item_tables(*tables)
        models.append(m)
    base, ranker = models
    batch = random_batch(dims, batch_size=6)
    torch.testing.assert_close(ranker(batch), base(batch))  # zero at init: the same model
    assert ranker.param_kinds()["first_ids.weight"] == "table"  # the embedding penalty applies
    rows_BJ = ranker.tokens.sample_id_rows(batch)
    n_cat = ranker.tokens.n_cat
    assert rows_BJ.shape[1] == n_cat + ranker.tokens.item_ids  # context ids, then the target's bag
    picked = [rows_BJ[0, 0].item(), rows_BJ[0, n_cat].item()]  # a context id and the target's id
    with torch.no_grad():
        ranker.first_ids.weight[picked, 0] = torch.tensor([2.0, -0.5])
        moved = ranker(batch) - base(batch)
    expected = 2.0 * (rows_BJ == picked[0]).sum(1) - 0.5 * (rows_BJ == picked[1]).sum(1)
    torch.testing.assert_close(moved, expected.float())
    with pytest.raises(ValueError, match="first_order='ids' is DeepFM's first-order term; arch='dcnv2'"):
        build_model("dcnv2", RankerConfig(d_model=16, n_heads=2, first_order="ids"), dims)


def test_the_fm_option_adds_every_pairwise_field_product_to_the_logit():
    base, batch = _ranker()
    ranker, _ = _ranker(fm=True)
    assert sum(p.numel() for p in ranker.parameters()) == sum(p.numel() for p in base.parameters())
    x_BTD, _ = ranker.tokens(batch)
    tok, L = ranker.tokens, ranker.dims.max_len
    # The fields by hand: context tokens but CLS, the history averaged over valid events, the target.
    m_BL = batch.hist_mask.float()
    n_B1 = m_BL.sum(1, keepdim=True).clamp_min(1)  # no events: the pooled field is zero
    pooled_BD = (x_BTD[:, tok.n_context : tok.n_context + L] * m_BL[..., None]).sum(1) / n_B1
    fields = [x_BTD[:, i] for i in range(1, tok.n_context)] + [pooled_BD, x_BTD[:, -1]]
    want_B = sum(
        (fields[i] * fields[j]).sum(-1) for i in range(len(fields)) for j in range(i + 1, len(fields))
    )
    with torch.no_grad():
        torch.testing.assert_close(ranker(batch) - base(batch), want_B)
        logits_B, _ = ranker.forward_stats(batch)
        torch.testing.assert_close(logits_B, ranker(batch))


def test_the_cross_network_starts_silent_and_adds_dcnv2_crosses_of_the_fields():
    base, batch = _ranker()
    ranker, _ = _ranker(cross_layers=2)
    with torch.no_grad():
        torch.testing.assert_close(ranker(batch), base(batch))  # zero output at init: the same model
        ranker.cross.out.weight.normal_()
        x_BTD, _ = ranker.tokens(batch)
        # By hand: the fields as the fm test builds them, then x_{l+1} = x0 * (W x_l + b) + x_l.
        from recformer.model import fm

        x0 = fm.fields(ranker.tokens, x_BTD, batch.hist_mask).flatten(1)
        assert x0.shape[1] == fm.n_fields(ranker.tokens) * 16
        x = x0
        for layer in ranker.cross.layers:
            x = x0 * (x @ layer.linear.weight.T + layer.linear.bias) + x
        torch.testing.assert_close(ranker(batch) - base(batch), (x @ ranker.cross.out.weight.T)[:, 0])
        logits_B, _ = ranker.forward_stats(batch)
        torch.testing.assert_close(logits_B, ranker(batch))
    kinds = ranker.param_kinds()
    assert kinds["cross.out.weight"] == "readout" and kinds["cross.layers.0.linear.weight"] == "hidden"
    assert kinds["cross.layers.1.linear.bias"] == "vector"


def test_cross_layers_must_not_be_negative():
    with pytest.raises(ValueError, match="cross_layers=-1 must be >= 0"):
        RankerConfig(d_model=16, n_heads=2, cross_layers=-1)


@pytest.mark.parametrize("cross_layers", [0, 1])
def test_head_fields_feeds_the_head_the_fields_crossed_or_not(cross_layers):
    ranker, batch = _ranker(head_fields=True, cross_layers=cross_layers)
    from recformer.model import fm

    n_fields = fm.n_fields(ranker.tokens)
    assert ranker.head.hidden.in_features == 2 * 16 + n_fields * 16
    assert cross_layers == 0 or ranker.cross.out is None  # the crossed fields feed the head only
    seen = {}
    ranker.head.hidden.register_forward_pre_hook(lambda m, inp: seen.update(x=inp[0]))
    with torch.no_grad():
        ranker(batch)
        x_BTD, _ = ranker.tokens(batch)
        v_BX = fm.fields(ranker.tokens, x_BTD, batch.hist_mask).flatten(1)
        want = v_BX if cross_layers == 0 else ranker.cross.cross(v_BX.view(6, n_fields, 16))
    torch.testing.assert_close(seen["x"][:, 2 * 16 :], want)


def test_head_product_feeds_the_head_the_cls_times_target_readout():
    ranker, batch = _ranker(head_product=True)
    assert ranker.head.hidden.in_features == 3 * 16
    seen = {}
    ranker.head.hidden.register_forward_pre_hook(lambda m, inp: seen.update(x=inp[0]))
    with torch.no_grad():
        ranker(batch)
    x = seen["x"]
    torch.testing.assert_close(x[:, 32:], x[:, :16] * x[:, 16:32])
    with pytest.raises(ValueError, match="head_product=True needs head='both'"):
        RankerConfig(d_model=16, n_heads=2, head="cls", head_product=True)


def test_cross_hidden_runs_dcnv2s_dnn_beside_the_cross_layers_into_their_logit():
    base, batch = _ranker()
    ranker, _ = _ranker(cross_layers=1, cross_hidden=[8, 4])
    tower = ranker.cross
    assert tower.out.in_features == tower.layers[0].linear.in_features + 4
    with torch.no_grad():
        torch.testing.assert_close(ranker(batch), base(batch))  # zero output at init: the same model
        assert all(m.bias.abs().max() == 0 for m in tower.dnn if isinstance(m, torch.nn.Linear))
        tower.out.weight.normal_()
        from recformer.model import fm

        x_BTD, _ = ranker.tokens(batch)
        x0 = fm.fields(ranker.tokens, x_BTD, batch.hist_mask).flatten(1)
        lin = tower.layers[0].linear
        crossed = x0 * (x0 @ lin.weight.T + lin.bias) + x0
        h = x0
        for layer in [m for m in tower.dnn if isinstance(m, torch.nn.Linear)]:
            h = torch.relu(h @ layer.weight.T + layer.bias)
        want_B = (torch.cat([crossed, h], 1) @ tower.out.weight.T)[:, 0]
        torch.testing.assert_close(ranker(batch) - base(batch), want_B)
        logits_B, _ = ranker.forward_stats(batch)
        torch.testing.assert_close(logits_B, ranker(batch))
    kinds = ranker.param_kinds()
    assert kinds["cross.dnn.0.weight"] == "hidden" and kinds["cross.dnn.3.bias"] == "vector"
    # FLOPs count the DNN's matrices once per sample, as the head's.
    from recformer.model import flops

    extra = sum(p.numel() for n, p in tower.named_parameters() if n.startswith("dnn.") and p.ndim == 2)
    plain, _ = _ranker(cross_layers=1)
    assert flops.total(ranker.flop_terms()) - flops.total(plain.flop_terms()) == pytest.approx(
        flops.total([flops.Matmul(extra + 4, 1)])
    )


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"cross_hidden": [8]}, r"cross_hidden=\[8\] .* needs cross_layers >= 1 \(got 0\)"),
        ({"cross_hidden": [8], "cross_layers": 1, "head_fields": True}, r"head_fields=false \(got True\)"),
        ({"cross_hidden": [8, 0], "cross_layers": 1}, r"cross_hidden=\[8, 0\]: every width must be >= 1"),
    ],
)
def test_cross_hidden_refuses_what_it_cannot_build(kw, match):
    with pytest.raises(ValueError, match=match):
        RankerConfig(d_model=16, n_heads=2, **kw)


@pytest.mark.parametrize("kernel", ["sdpa", "matmul"])
def test_attention_dropout_defaults_to_dropout_and_can_leave_the_weights_alone(kernel):
    """Both attention kernels get the weights' dropout rate, 0 here, while the branches drop."""
    from recformer.model import attention as attention_module

    assert RankerConfig(d_model=16, n_heads=2, dropout=0.2).attention_dropout_p == 0.2
    cfg = RankerConfig(d_model=16, n_heads=2, dropout=0.2, attention_dropout=0.0)
    assert cfg.attention_dropout_p == 0.0 and cfg.dropout == 0.2
    with pytest.raises(ValueError, match=r"attention_dropout=1.0 must be in \[0, 1\)"):
        RankerConfig(d_model=16, n_heads=2, attention_dropout=1.0)
    ranker, batch = _ranker(dropout=0.2, attention_dropout=0.0, attention_kernel=kernel)
    seen: list[float] = []
    real_sdpa, real_matmul = (
        torch.nn.functional.scaled_dot_product_attention,
        attention_module.matmul_attention,
    )

    def spy_sdpa(*args, **kwargs):
        seen.append(kwargs["dropout_p"])
        return real_sdpa(*args, **kwargs)

    def spy_matmul(*args, **kwargs):
        seen.append(args[5])
        return real_matmul(*args, **kwargs)

    attention = ranker.blocks[0].attn
    assert (attention.dropout, attention.attention_dropout) == (0.2, 0.0)
    with torch.no_grad():
        ranker.head.out.weight.normal_()  # the readout starts at zero: every logit the same
    ranker.train()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.nn.functional, "scaled_dot_product_attention", spy_sdpa)
        mp.setattr(attention_module, "matmul_attention", spy_matmul)
        out_a, out_b = ranker(batch), ranker(batch)
    assert len(seen) == 2 * len(ranker.blocks) and set(seen) == {0.0}  # no dropout on the weights
    assert (out_a - out_b).abs().max() > 1e-4  # the residual branches still drop


def test_attention_dropout_alone_drops_only_the_weights():
    ranker, batch = _ranker(attention_dropout=0.3)
    attention = ranker.blocks[0].attn
    assert (attention.dropout, attention.attention_dropout) == (0.0, 0.3)
    with torch.no_grad():
        ranker.head.out.weight.normal_()
    ranker.train()
    assert (ranker(batch) - ranker(batch)).abs().max() > 1e-4


def test_feature_dropout_shares_one_mask_per_sample_and_feature_across_tokens():
    from recformer.model.dropout import branch_dropout

    torch.manual_seed(0)
    y = torch.ones(2000, 7, 16)
    out = branch_dropout(y, 0.25, True, "feature")
    assert torch.equal(out, out[:, :1].expand_as(out))  # one draw per (sample, feature)
    torch.testing.assert_close(out.unique(), torch.tensor([0.0, 1 / 0.75]))  # kept: scaled by 1 / (1 - p)
    assert abs((out[:, 0] == 0).float().mean().item() - 0.25) < 0.01
    element = branch_dropout(y, 0.25, True, "element")
    assert not torch.equal(element, element[:, :1].expand_as(element))  # the usual mask differs per token
    assert branch_dropout(y, 0.25, False, "feature") is y and branch_dropout(y, 0.0, True, "feature") is y
    with pytest.raises(ValueError, match="dropout_mask='token'; expected 'element' or 'feature'"):
        RankerConfig(d_model=16, n_heads=2, dropout_mask="token")
    with pytest.raises(ValueError, match="dropout_branches='attention'; expected 'both' or 'mlp'"):
        RankerConfig(d_model=16, n_heads=2, dropout_branches="attention")


@pytest.mark.parametrize("branches", ["both", "mlp"])
def test_the_blocks_drop_their_updates_with_the_configured_mask(monkeypatch, branches):
    """The attention and MLP outputs (or, with ``dropout_branches: mlp``, the MLP's alone) go through
    ``branch_dropout`` with the config's mask, and with it alone the ranker is stochastic in
    training and exact in eval."""
    import recformer.model.attention as attention_module
    import recformer.model.blocks as blocks_module

    seen: dict[str, list[tuple[float, str]]] = {"attention": [], "mlp": []}
    for module, branch in ((attention_module, "attention"), (blocks_module, "mlp")):
        real = module.branch_dropout
        monkeypatch.setattr(
            module,
            "branch_dropout",
            lambda y, p, t, m, real=real, branch=branch: seen[branch].append((p, m)) or real(y, p, t, m),
        )
    ranker, batch = _ranker(
        dropout=0.2, attention_dropout=0.0, dropout_mask="feature", dropout_branches=branches
    )
    with torch.no_grad():
        ranker.head.out.weight.normal_()
    ranker.train()
    assert (ranker(batch) - ranker(batch)).abs().max() > 1e-4
    calls = 2 * ranker.cfg.n_layers  # two forwards
    assert seen["mlp"] == [(0.2, "feature")] * calls
    assert seen["attention"] == [(0.2 if branches == "both" else 0.0, "feature")] * calls
    ranker.eval()
    torch.testing.assert_close(ranker(batch), ranker(batch))


def test_element_dropout_on_cpu_draws_8_bits_an_element(monkeypatch):
    """On CPU, eager, ``element`` is ``_bits_dropout``: the Bernoulli(1 - p) mask of ``F.dropout``
    (to 2**-9), scaled to keep the mean, fixed by the seed, in the input's dtype, and its gradient is
    the same mask."""
    from recformer.model import dropout

    monkeypatch.setattr(dropout.F, "dropout", lambda *a, **k: pytest.fail("F.dropout on the CPU path"))
    y = torch.ones(400, 50, 64, requires_grad=True)
    torch.manual_seed(3)
    out = dropout.branch_dropout(y, 0.2, True, "element")
    kept = round(0.8 * 2**8)  # 205: p runs as 51 / 256 = 0.1992
    torch.testing.assert_close(out.unique(), torch.tensor([0.0, 2**8 / kept]))
    assert abs((out == 0).float().mean().item() - 51 / 256) < 0.0015  # 1.28M draws: sd 0.00035
    assert abs(out.mean().item() - 1.0) < 0.005
    assert not torch.equal(out[:, 0], out[:, 1])  # every element its own draw
    torch.manual_seed(3)
    torch.testing.assert_close(dropout.branch_dropout(y, 0.2, True, "element"), out)
    out.sum().backward()
    torch.testing.assert_close(y.grad, out.detach())  # d(y * m) / dy = m
    half = dropout.branch_dropout(torch.ones(8, 5, 16, dtype=torch.bfloat16), 0.5, True, "element")
    assert half.dtype == torch.bfloat16 and set(half.unique().tolist()) <= {0.0, 2.0}
    assert dropout.branch_dropout(torch.ones(3, 4, 8), 1e-3, True, "element").eq(1).all()  # p under 2**-9


def test_element_dropout_keeps_f_dropout_where_its_kernels_are_fused(monkeypatch):
    """Under ``torch.compile`` (and on GPU) the element mask is ``F.dropout``'s."""
    from recformer.model import dropout

    calls = []
    real = dropout.F.dropout
    monkeypatch.setattr(dropout.F, "dropout", lambda *a, **k: calls.append(a[1]) or real(*a, **k))
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    dropout.branch_dropout(torch.ones(4, 3, 8), 0.2, True, "element")
    assert calls == [0.2]


def test_categorical_dropout_makes_the_named_fields_unknown_in_training_only():
    dims = dataclasses.replace(tiny_dims(), columns={"categorical": ["user_id", "hour"]})
    torch.manual_seed(0)
    ranker = Ranker(RankerConfig(d_model=16, n_heads=2, categorical_dropout={"user_id": 0.5}), dims)
    ranker.set_item_tables(*random_item_tables(dims))
    batch = random_batch(dims, batch_size=400)
    tok = ranker.tokens.eval()
    x_BTD, _ = tok(batch)
    torch.testing.assert_close(tok(batch)[0], x_BTD)  # evaluation: every value as logged
    tok.train()
    user, hour = 1 + tok.dense_tokens + len(tok.emb_dims), 2 + tok.dense_tokens + len(tok.emb_dims)
    changed_BT = (tok(batch)[0] - x_BTD).abs().amax(-1) > 0
    assert 0.4 < changed_BT[:, user].float().mean() < 0.6  # about half the rows lost their user
    assert not changed_BT[:, hour].any() and not changed_BT[:, user + 2 :].any()  # nothing else moved
    unknown = dataclasses.replace(batch, cat=batch.cat * torch.tensor([0, 1]))
    tok.cat_dropout.fill_(1.0 - 1e-7)  # every row's user dropped
    torch.testing.assert_close(tok(batch)[0], tok(unknown)[0])
    with pytest.raises(ValueError, match=r"categorical_dropout\['user_id'\]=1.0 must be in"):
        RankerConfig(d_model=16, n_heads=2, categorical_dropout={"user_id": 1.0})
    with pytest.raises(ValueError, match=r"names \['users'\].*those are \['user_id', 'hour'\]"):
        Ranker(RankerConfig(d_model=16, n_heads=2, categorical_dropout={"users": 0.2}), dims)


@pytest.mark.parametrize("mode", ["add", "target"])
def test_history_content_off_leaves_the_events_content_out_and_keeps_the_targets(mode):
    with_content, batch = _ranker(content_tokens=mode)
    without, _ = _ranker(content_tokens=mode, history_content=False)  # the same weights (seed 0)
    tok, L = with_content.tokens, with_content.dims.max_len
    x_BTD, valid_BT = tok(batch)
    y_BTD, valid_without_BT = without.tokens(batch)
    assert torch.equal(valid_BT, valid_without_BT) and without.n_tokens == with_content.n_tokens
    events = slice(tok.n_context, tok.n_context + L)
    want = x_BTD[:, events] - _content(tok, batch.hist_item)
    torch.testing.assert_close(y_BTD[:, events], want)  # each event: its token less its content
    torch.testing.assert_close(y_BTD[:, L + tok.n_context :], x_BTD[:, L + tok.n_context :])  # the target's
    with pytest.raises(ValueError, match="history_content=false .* content_tokens='all'"):
        RankerConfig(d_model=16, n_heads=2, content_tokens="all", history_content=False)
