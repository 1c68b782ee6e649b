"""Parameter groups (coverage, decay, muP), the LR schedule and decoupled weight decay."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from torch import nn

from recformer.config import OptimConfig
from recformer.optim import (
    DEFAULT_RULES,
    build_optimizer,
    build_param_groups,
    build_scheduler,
    describe_groups,
    lr_lambda,
    regroup_state,
)


class Toy(nn.Module):
    """Embedding, a norm, two hidden linears (with biases), a head: one of every kind."""

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, d)
        self.norm = nn.LayerNorm(d)
        self.up = nn.Linear(d, 2 * d)
        self.down = nn.Linear(2 * d, d, bias=False)
        self.head = nn.Linear(d, 1)

    def forward(self, ids):
        h = self.norm(self.emb(ids))
        return self.head(h + self.down(torch.relu(self.up(h)))).squeeze(-1)


KINDS = {
    "emb.weight": "embedding",
    "norm.weight": "vector",
    "norm.bias": "vector",
    "up.weight": "hidden",
    "up.bias": "vector",
    "down.weight": "hidden",
    "head.weight": "readout",
    "head.bias": "vector",
}


def _groups(model=None, kinds=KINDS, **kw):
    return {g["name"]: g for g in build_param_groups(model or Toy(), kinds, OptimConfig(lr=1e-3), **kw)}


def test_every_param_in_exactly_one_group():
    model = Toy()
    groups = build_param_groups(model, KINDS, OptimConfig())
    ids = [id(p) for g in groups for p in g["params"]]
    assert len(ids) == len(set(ids))
    assert set(ids) == {id(p) for p in model.parameters()}
    assert [g["name"] for g in groups] == ["hidden", "readout", "embedding", "vector"]
    assert sorted(n for g in groups for n in g["param_names"]) == sorted(KINDS)


def test_no_decay_on_norms_biases_embeddings():
    g = _groups()
    assert g["hidden"]["weight_decay"] == g["readout"]["weight_decay"] == 0.1
    assert g["embedding"]["weight_decay"] == g["vector"]["weight_decay"] == 0.0
    assert set(g["vector"]["param_names"]) == {"norm.weight", "norm.bias", "up.bias", "head.bias"}
    assert g["embedding"]["param_names"] == ["emb.weight"]


def _mup_lr_mult(mup: bool) -> float:
    """muP's hidden-LR factor at width multiplier m = 256 / 64 = 4."""
    from recformer.config import RankerConfig
    from recformer.model.mup import hidden_lr_multiplier

    return hidden_lr_multiplier(RankerConfig(d_model=256, base_d_model=64, mup=mup))


def test_mup_divides_hidden_lr_only():
    g = _groups(hidden_lr_mult=_mup_lr_mult(True))
    assert g["hidden"]["lr"] == pytest.approx(1e-3 / 4)
    for name in ("readout", "embedding", "vector"):
        assert g[name]["lr"] == pytest.approx(1e-3), name
    g = _groups(hidden_lr_mult=_mup_lr_mult(False))
    assert {x["lr"] for x in g.values()} == {1e-3}


def test_empty_rule_raises_with_its_name():
    kinds = {**KINDS, "head.weight": "hidden"}  # no readout left: allowed, the rule is optional
    assert "readout" not in _groups(kinds=kinds)
    strict = [replace(r, allow_empty=False) for r in DEFAULT_RULES]
    with pytest.raises(
        ValueError, match=r"\['readout', 'input', 'item_bias', 'table'\] matched no trainable parameter"
    ):
        _groups(kinds=kinds, rules=strict)
    no_emb = {**KINDS, "emb.weight": "hidden"}
    with pytest.raises(ValueError, match=r"\['embedding'\] matched no"):
        _groups(kinds=no_emb)


def test_ranker_input_projections_decay_and_keep_the_base_lr_under_mup():
    """Projections of the dense / embedding / content inputs are dense matrices (decayed, DESIGN
    section 5) with a fixed fan-in (a muP input weight: LR constant in width); embedding tables and
    the CLS / slot vectors are not decayed."""
    from recformer.config import RankerConfig
    from recformer.model import build_model
    from tests.conftest import tiny_spec

    for arch, mup in (("transformer", True), ("din", False)):  # DIN has no muP: build_model refuses it
        cfg = RankerConfig(d_model=32, n_layers=2, n_heads=2, mup=mup, init="normal", base_d_model=8)
        model = build_model(arch, cfg, tiny_spec().dims())
        groups = {
            g["name"]: g
            for g in build_param_groups(
                model, model.param_kinds(), OptimConfig(lr=1e-3), hidden_lr_mult=0.25 if mup else 1.0,
                rules=model.optimizer_rules,
            )
        }  # fmt: skip
        assert sorted(groups["input"]["param_names"]) == [
            "tokens.content_proj.weight", "tokens.dense_proj.weight", "tokens.emb_proj.0.weight"
        ], arch  # fmt: skip
        assert groups["input"]["weight_decay"] == 0.1 and groups["input"]["lr"] == pytest.approx(1e-3)
        assert sorted(groups["embedding"]["param_names"]) == ["tokens.cls", "tokens.slot_emb"]
        assert groups["table"]["param_names"] == ["tokens.table.weight"]
        assert groups["embedding"]["weight_decay"] == groups["table"]["weight_decay"] == 0.0


def test_din_refuses_mup():
    from recformer.config import RankerConfig
    from recformer.model import build_model
    from tests.conftest import tiny_spec

    with pytest.raises(ValueError, match="arch='din' does not implement muP"):
        build_model("din", RankerConfig(d_model=32, n_layers=2, n_heads=2, mup=True), tiny_spec().dims())


def test_unknown_and_unmatched_params_raise():
    with pytest.raises(ValueError, match=r"no kind for these parameters: \['up.bias'\]"):
        _groups(kinds={k: v for k, v in KINDS.items() if k != "up.bias"})
    with pytest.raises(ValueError, match=r"does not have: \['ghost.weight'\]"):
        _groups(kinds={**KINDS, "ghost.weight": "hidden"})
    with pytest.raises(ValueError, match=r"unknown kinds \[\"up.bias='matrix'\"\]"):
        _groups(kinds={**KINDS, "up.bias": "matrix"})
    # A bias labelled hidden matches no default rule (hidden needs ndim >= 2): named, not decayed.
    with pytest.raises(
        ValueError, match=r"no optimizer group rule matches up.bias \(kind 'hidden', ndim 1\)\. Rules: hidden"
    ):
        _groups(kinds={**KINDS, "up.bias": "hidden"})


def test_frozen_params_skipped_and_describe():
    model = Toy()
    model.emb.weight.requires_grad_(False)
    kinds = {k: v for k, v in KINDS.items() if k != "emb.weight"}  # frozen: no kind needed
    lenient = [replace(r, allow_empty=True) for r in DEFAULT_RULES]
    groups = build_param_groups(model, kinds, OptimConfig(), rules=lenient)
    assert "embedding" not in [g["name"] for g in groups]
    lines = describe_groups(groups)
    assert len(lines) == len(groups)
    assert "hidden" in lines[0] and "2 tensors" in lines[0] and f"{16 * 32 * 2:,} params" in lines[0]


def test_schedule_values():
    cfg = OptimConfig(warmup_steps=10, schedule="cosine", min_lr_ratio=0.1)
    assert lr_lambda(0, cfg, 110) == 0.0
    assert lr_lambda(5, cfg, 110) == pytest.approx(0.5)
    assert lr_lambda(10, cfg, 110) == pytest.approx(1.0)
    assert lr_lambda(60, cfg, 110) == pytest.approx(0.55)  # halfway: min + (1 - min) / 2
    assert lr_lambda(35, cfg, 110) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 4)))
    assert lr_lambda(110, cfg, 110) == pytest.approx(0.1)
    assert lr_lambda(500, cfg, 110) == pytest.approx(0.1)
    lin = OptimConfig(warmup_steps=10, schedule="linear", min_lr_ratio=0.0)
    assert lr_lambda(35, lin, 110) == pytest.approx(0.75)
    const = OptimConfig(warmup_steps=10, schedule="constant")
    assert lr_lambda(5, const, 0) == pytest.approx(0.5) and lr_lambda(1000, const, 0) == 1.0


def test_decay_steps_end_the_decay_before_the_run_does():
    cfg = OptimConfig(warmup_steps=10, schedule="cosine", min_lr_ratio=0.1, decay_steps=40)
    assert lr_lambda(5, cfg, 1000) == pytest.approx(0.5)  # the warmup is unchanged
    assert lr_lambda(30, cfg, 1000) == pytest.approx(0.55)  # halfway through the 40 steps
    assert lr_lambda(50, cfg, 1000) == pytest.approx(0.1) and lr_lambda(900, cfg, 1000) == pytest.approx(0.1)
    lin = OptimConfig(warmup_steps=0, schedule="linear", min_lr_ratio=0.0, decay_steps=100)
    assert lr_lambda(25, lin, 10_000) == pytest.approx(0.75)
    opt = build_optimizer(Toy(), KINDS, cfg)
    build_scheduler(opt, cfg, total_steps=float("inf"))  # the horizon is the config's: no cap needed
    with pytest.raises(ValueError, match=r"decay_steps=-1 must be >= 0 \(0 = the whole run\)"):
        OptimConfig(decay_steps=-1)


def test_scheduler_keeps_per_group_multipliers():
    cfg = OptimConfig(lr=1e-2, warmup_steps=4, schedule="cosine")
    opt = build_optimizer(Toy(), KINDS, cfg, hidden_lr_mult=0.5)
    sched = build_scheduler(opt, cfg, total_steps=20)
    for _ in range(4):
        opt.step()
        sched.step()
    lrs = {g["name"]: g["lr"] for g in opt.param_groups}
    assert lrs["hidden"] == pytest.approx(5e-3) and lrs["vector"] == pytest.approx(1e-2)
    with pytest.raises(ValueError, match=r"trains 4 steps, not more than model.optim.warmup_steps=4"):
        build_scheduler(opt, cfg, total_steps=4)
    with pytest.raises(ValueError, match="finite number of training steps"):
        build_scheduler(opt, cfg, total_steps=float("inf"))


def test_weight_decay_is_decoupled():
    cfg = OptimConfig(lr=0.05, weight_decay=0.2, betas=(0.9, 0.95))
    model = Toy()
    opt = build_optimizer(model, KINDS, cfg)
    assert opt.defaults["betas"] == (0.9, 0.95) and opt.defaults["foreach"] and not opt.defaults["fused"]
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.zeros_like(p)  # zero gradient: Adam's step is exactly 0, only decay acts
    opt.step()
    for n, p in model.named_parameters():
        shrink = 1 - 0.05 * 0.2 if KINDS[n] in ("hidden", "readout") else 1.0
        torch.testing.assert_close(p.detach(), before[n] * shrink, rtol=0, atol=1e-7, msg=n)
    # And it trains: a real gradient step lowers the loss.
    ids, target = torch.arange(10), torch.linspace(-1, 1, 10)
    losses = []
    for _ in range(20):
        opt.zero_grad()
        loss = ((model(ids) - target) ** 2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


def test_rowwise_adagrad_steps_the_tables_and_adamw_the_rest():
    from recformer.optim import TableAdagradAdamW

    torch.manual_seed(0)
    cfg = OptimConfig(lr=1e-2, table_optimizer="rowwise_adagrad", table_lr=0.1, weight_decay=0.0)
    kinds = {**KINDS, "emb.weight": "table"}
    model, twin = Toy(), Toy()
    twin.load_state_dict(model.state_dict())
    rules = [replace(r, allow_empty=True) for r in DEFAULT_RULES]  # the toy has no CLS / slot vectors
    opt = build_optimizer(model, kinds, cfg, rules=rules)
    assert isinstance(opt, TableAdagradAdamW)
    assert [g["name"] for g in opt.param_groups if g.get("rowwise_adagrad")] == ["table"]
    plain = torch.optim.AdamW(
        [p for n, p in twin.named_parameters() if n != "emb.weight"],
        lr=1e-2,
        betas=cfg.betas,
        weight_decay=0.0,
    )
    acc = torch.zeros(model.emb.num_embeddings)
    ids = torch.tensor([[1, 2, 2], [3, 1, 1]])  # rows 0 and 4.. never read
    for _ in range(3):
        before = model.emb.weight.detach().clone()
        for m, o in ((model, opt), (twin, plain)):
            o.zero_grad()
            m(ids).square().mean().backward()
        g = model.emb.weight.grad.clone()
        opt.step()
        plain.step()
        acc += g.square().mean(1)  # the reference: one accumulator per row
        want = before - 0.1 * g / (acc.sqrt() + 1e-8)[:, None]
        torch.testing.assert_close(model.emb.weight.detach(), want)
        untouched = g.abs().sum(1) == 0
        assert untouched.sum() > 0 and torch.equal(model.emb.weight[untouched], before[untouched])
        with torch.no_grad():  # the twin's table follows, so both see the same gradients next step
            twin.emb.weight.copy_(model.emb.weight)
        theirs = dict(twin.named_parameters())
        for n, p in model.named_parameters():  # every other parameter exactly as plain AdamW moves it
            torch.testing.assert_close(p, theirs[n], msg=n)
    state = opt.state_dict()  # the accumulators travel with the optimizer's checkpoint
    again = build_optimizer(Toy(), kinds, cfg, rules=rules)
    again.load_state_dict(state)
    table_state = [s for s in again.state.values() if "sum" in s]
    assert len(table_state) == 1 and torch.allclose(table_state[0]["sum"], acc)


def test_table_optimizer_settings_are_checked():
    with pytest.raises(ValueError, match="table_optimizer='sgd'"):
        OptimConfig(table_optimizer="sgd")
    with pytest.raises(ValueError, match="table_lr=0"):
        OptimConfig(table_lr=0)


def test_the_item_bias_has_a_group_and_a_rate_of_its_own():
    from recformer.config import RankerConfig
    from recformer.model.ranker import Ranker
    from tests._model_batches import tiny_dims

    ranker = Ranker(RankerConfig(d_model=16, n_heads=2, item_bias=True), tiny_dims())
    cfg = OptimConfig(lr=1e-3, item_bias_lr_mult=30, embedding_lr_mult=2)
    groups = {g["name"]: g for g in build_param_groups(ranker, ranker.param_kinds(), cfg)}
    assert groups["item_bias"]["param_names"] == ["item_bias.weight"]
    assert groups["item_bias"]["lr"] == pytest.approx(3e-2) and groups["item_bias"]["weight_decay"] == 0.0
    assert groups["table"]["lr"] == pytest.approx(2e-3) and groups["embedding"]["lr"] == pytest.approx(2e-3)
    assert groups["hidden"]["lr"] == pytest.approx(1e-3)
    plain = Ranker(RankerConfig(d_model=16, n_heads=2), tiny_dims())
    assert "item_bias" not in {g["name"] for g in build_param_groups(plain, plain.param_kinds(), cfg)}


def test_a_state_saved_under_the_old_grouping_is_regrouped_by_name():
    """Before the id tables had a group, "embedding" held them with the learned vectors: such a
    state resumes with every parameter's moments where the new groups put it."""
    model = Toy()
    old_kinds = {**KINDS}  # emb.weight in "embedding": the old layout
    rules = [replace(r, allow_empty=True) for r in DEFAULT_RULES]
    old = build_optimizer(model, old_kinds, OptimConfig(), rules=rules)
    model(torch.tensor([[1, 2]])).sum().backward()
    old.step()
    saved = old.state_dict()
    new_groups = build_param_groups(model, {**KINDS, "emb.weight": "table"}, OptimConfig(), rules=rules)
    state, sources = regroup_state(saved, new_groups)
    names = [n for g in state["param_groups"] for n in g["param_names"]]
    old_index = {n: i for g in saved["param_groups"] for n, i in zip(g["param_names"], g["params"])}
    new_index = {n: i for g in state["param_groups"] for n, i in zip(g["param_names"], g["params"])}
    for n in names:
        torch.testing.assert_close(
            state["state"][new_index[n]]["exp_avg"], saved["state"][old_index[n]]["exp_avg"]
        )
    assert [g["name"] for g in state["param_groups"]] == [g["name"] for g in new_groups]
    emb = [g["name"] for g in saved["param_groups"]].index("embedding")
    assert sources[[g["name"] for g in new_groups].index("table")] == emb
    again = build_optimizer(model, {**KINDS, "emb.weight": "table"}, OptimConfig(), rules=rules)
    again.load_state_dict(state)  # loads: same groups, same sizes
    assert regroup_state(again.state_dict(), new_groups) is None  # already in this layout
