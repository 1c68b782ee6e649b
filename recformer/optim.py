"""AdamW parameter groups from explicit rules, muP learning-rate scaling, and the LR schedule.

Groups (DESIGN section 5): every trainable parameter is classified by the model itself
(``ranker.param_kinds()``: name -> "hidden" | "input" | "table" | "embedding" | "vector" |
"readout"), then placed by an ordered list of ``GroupRule``; the first rule that matches wins.
Coverage is checked both ways: a parameter that no rule matches raises, and so does a rule that
matches nothing (unless that rule is marked ``allow_empty``), so a renamed module can never
silently move a matrix out of weight decay.

muP (``recformer.model.mup``): the hidden group's LR is multiplied by ``hidden_lr_mult`` (1/m under
muP, 1 otherwise); every other group keeps the base LR. Input projections and embedding tables are
both muP "input weights" (constant LR); they differ in weight decay, which input projections get
like any dense matrix (DESIGN section 5) and tables do not. The readout keeps the base LR because
its 1/m factor lives in the forward pass (``mup.readout_multiplier``, like ``mup.MuReadout``'s
output multiplier): Tensor Programs V gives the two as equivalent parametrisations.

Id tables may be stepped by row-wise Adagrad instead of AdamW (``OptimConfig.table_optimizer``), the
sparse optimizer DLRM and TorchRec train their tables with, in the same optimizer object
(``TableAdagradAdamW``), so Lightning, the schedule, clipping and checkpoints see one optimizer.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from recformer.config import OptimConfig

PARAM_KINDS = ("hidden", "input", "table", "embedding", "vector", "readout")
"""The kinds a model's ``param_kinds()`` may assign to a parameter."""


@dataclass(frozen=True)
class GroupRule:
    """One parameter group: which parameters it takes, and how AdamW treats them."""

    name: str
    """Group name, logged and stored under the optimizer group's "name" key."""
    match: Callable[[str, str, int], bool]
    """Predicate on (parameter name, kind, ndim)."""
    matches_doc: str
    """What ``match`` accepts, in words (quoted in coverage errors)."""
    decay: bool
    """Apply ``OptimConfig.weight_decay`` (decoupled) to this group; otherwise 0."""
    width_scaled_lr: bool
    """Its LR takes the hidden matrices' width factor (``hidden_lr_mult``: muP's 1/m)."""
    allow_empty: bool = False
    """Allow this rule to match no parameter (optional parts, e.g. a model without a readout)."""
    lr_mult_from: str | None = None
    """The ``OptimConfig`` field whose value multiplies this group's LR (its own rate), or None."""


DEFAULT_RULES: tuple[GroupRule, ...] = (
    GroupRule(
        "hidden",
        lambda name, kind, ndim: kind == "hidden" and ndim >= 2,
        "kind 'hidden', ndim >= 2",
        decay=True,
        width_scaled_lr=True,
    ),
    GroupRule(
        "readout",
        lambda name, kind, ndim: kind == "readout" and ndim >= 2,
        "kind 'readout', ndim >= 2",
        decay=True,
        width_scaled_lr=False,  # the 1/m multiplier is in the forward pass (module docstring)
        allow_empty=True,
    ),
    GroupRule(
        "input",
        lambda name, kind, ndim: kind == "input" and ndim >= 2,
        "kind 'input', ndim >= 2 (projections of input features)",
        decay=True,  # a dense matrix, updated by every sample
        width_scaled_lr=False,  # fixed fan-in: a muP input weight
        allow_empty=True,  # a spec without dense, embedding or content inputs has none
    ),
    GroupRule(
        "item_bias",
        lambda name, kind, ndim: name == "item_bias.weight",
        "the per-item bias item_bias.weight (RankerConfig.item_bias)",
        decay=False,
        width_scaled_lr=False,
        lr_mult_from="item_bias_lr_mult",
        allow_empty=True,  # only with model.ranker.item_bias
    ),
    GroupRule(
        "table",
        lambda name, kind, ndim: kind == "table",
        "kind 'table' (id tables: a row has a gradient only where a batch read it)",
        decay=False,  # decay would pull rarely-seen rows to 0 between their few updates
        width_scaled_lr=False,
        lr_mult_from="embedding_lr_mult",
        allow_empty=True,  # a model may have no id table
    ),
    GroupRule(
        "embedding",
        lambda name, kind, ndim: kind == "embedding",
        "kind 'embedding' (learned CLS/slot vectors)",
        decay=False,  # decay would pull rarely-seen rows to 0 between their few updates
        width_scaled_lr=False,
        lr_mult_from="embedding_lr_mult",
    ),
    GroupRule(
        "vector",
        lambda name, kind, ndim: kind == "vector" and ndim <= 1,
        "kind 'vector', ndim <= 1",
        decay=False,  # decaying norm gains toward 0 fights the normalisation
        width_scaled_lr=False,
    ),
)
"""hidden matrices, readout, input projections, id tables, learned embedding vectors, vectors
(norm gains and biases)."""


def _trainable_named_params(model: nn.Module, kinds: dict[str, str]) -> list[tuple[str, nn.Parameter]]:
    """Unique trainable parameters with their names, after checking ``kinds`` against the model."""
    # remove_duplicate=False: a tied parameter may be named in `kinds` under any of its aliases.
    all_names = {n for n, _ in model.named_parameters(remove_duplicate=False)}
    unique = list(model.named_parameters())
    missing = sorted(n for n, p in unique if p.requires_grad and n not in kinds)
    if missing:
        raise ValueError(
            f"param_kinds() gives no kind for these parameters: {missing}; "
            f"map each one to one of {PARAM_KINDS}"
        )
    stale = sorted(set(kinds) - all_names)
    if stale:
        raise ValueError(f"param_kinds() names parameters the model does not have: {stale}")
    bad = sorted(f"{n}={k!r}" for n, k in kinds.items() if k not in PARAM_KINDS)
    if bad:
        raise ValueError(f"param_kinds() gives unknown kinds {bad}; expected one of {PARAM_KINDS}")
    return [(n, p) for n, p in unique if p.requires_grad]


def build_param_groups(
    model: nn.Module,
    kinds: dict[str, str],
    cfg: OptimConfig,
    hidden_lr_mult: float = 1.0,
    rules: Sequence[GroupRule] | None = None,
) -> list[dict]:
    """AdamW parameter groups, one per rule that matched something, in rule order.

    Each group holds "params", "name", "lr" (cfg.lr, times ``hidden_lr_mult`` for the rules with
    ``width_scaled_lr`` and the ``cfg`` field a rule's ``lr_mult_from`` names),
    "weight_decay", "lr_mult" and "param_names" (for per-group logging).
    Frozen parameters are skipped.
    """
    if not (math.isfinite(hidden_lr_mult) and hidden_lr_mult > 0):
        raise ValueError(f"hidden_lr_mult={hidden_lr_mult} must be a finite number > 0 (muP: 1/m)")
    rules = tuple(DEFAULT_RULES if rules is None else rules)
    names = [r.name for r in rules]
    if len(set(names)) != len(names):
        raise ValueError(f"rule names must be unique, found {names}")
    members: dict[str, list[tuple[str, nn.Parameter]]] = {r.name: [] for r in rules}
    unmatched = []
    for pname, p in _trainable_named_params(model, kinds):
        kind = kinds[pname]
        rule = next((r for r in rules if r.match(pname, kind, p.ndim)), None)
        if rule is None:
            unmatched.append(f"{pname} (kind {kind!r}, ndim {p.ndim})")
        else:
            members[rule.name].append((pname, p))
    if unmatched:
        known = "; ".join(f"{r.name}: {r.matches_doc}" for r in rules)
        raise ValueError(
            f"no optimizer group rule matches {', '.join(unmatched)}. Rules: {known}. "
            "Fix the kind in the model's param_kinds() or pass rules that cover it"
        )
    empty = [r.name for r in rules if not members[r.name] and not r.allow_empty]
    if empty:
        raise ValueError(
            f"optimizer group rule(s) {empty} matched no trainable parameter; a rule that matches "
            "nothing usually means the model's param_kinds() changed. Mark the rule allow_empty=True "
            "if it is optional"
        )
    groups = []
    for r in rules:
        if not members[r.name]:
            continue
        mult = (hidden_lr_mult if r.width_scaled_lr else 1.0) * (
            getattr(cfg, r.lr_mult_from) if r.lr_mult_from else 1.0
        )
        groups.append(
            {
                "name": r.name,
                "params": [p for _, p in members[r.name]],
                "param_names": [n for n, _ in members[r.name]],
                "lr": cfg.lr * mult,
                "lr_mult": mult,
                "weight_decay": cfg.weight_decay if r.decay else 0.0,
            }
        )
    return groups


def describe_groups(groups: Sequence[dict]) -> list[str]:
    """One log line per group: tensors, elements, LR, weight decay."""
    lines = []
    for i, g in enumerate(groups):
        numel = sum(p.numel() for p in g["params"])
        lines.append(
            f"optimizer group {g.get('name', i)!s:<10} {len(g['params']):>4} tensors {numel:>12,} params"
            f"  lr {g['lr']:.3e}  weight_decay {g['weight_decay']:g}"
            + ("  (row-wise Adagrad)" if g.get("rowwise_adagrad") else "")
        )
    return lines


def _fused_supported() -> Sequence[str]:
    try:
        from torch.utils._foreach_utils import _get_fused_kernels_supported_devices
    except ImportError:  # older torch: CUDA only
        return ("cuda",)
    return _get_fused_kernels_supported_devices()


def build_optimizer(
    model: nn.Module,
    kinds: dict[str, str],
    cfg: OptimConfig,
    hidden_lr_mult: float = 1.0,
    fused: bool | None = None,
    rules: Sequence[GroupRule] | None = None,
) -> torch.optim.AdamW:
    """AdamW over ``build_param_groups``; decoupled weight decay per group (Loshchilov & Hutter 2019).

    ``fused=None`` picks the fused kernel when every parameter is on CUDA (one kernel launch per
    step instead of a handful per tensor list), the multi-tensor ``foreach`` path otherwise.
    """
    groups = build_param_groups(model, kinds, cfg, hidden_lr_mult, rules)
    if cfg.table_optimizer == "rowwise_adagrad":
        for g in groups:
            if g["name"] == "table":
                g["rowwise_adagrad"] = True
                g["lr"] = cfg.table_lr
                g["lr_mult"] = cfg.table_lr / cfg.lr
    params = [p for g in groups for p in g["params"]]
    on_cuda = bool(params) and all(p.is_cuda for p in params)
    if fused is None:
        fused = on_cuda and "cuda" in _fused_supported()
    elif fused:
        devices = sorted({p.device.type for p in params})
        unsupported = [d for d in devices if d not in _fused_supported()]
        if unsupported:
            raise ValueError(
                f"fused=True but fused AdamW does not support devices {unsupported}; use fused=None"
            )
    cls = TableAdagradAdamW if cfg.table_optimizer == "rowwise_adagrad" else torch.optim.AdamW
    return cls(
        groups,
        lr=cfg.lr,
        betas=tuple(cfg.betas),
        eps=cfg.eps,
        weight_decay=cfg.weight_decay,  # default only; every group sets its own
        fused=fused,
        foreach=None if fused else True,
    )


class TableAdagradAdamW(torch.optim.AdamW):
    """AdamW over every group but those marked ``rowwise_adagrad``, which row-wise Adagrad steps.

    Row-wise Adagrad (as FBGEMM's ``EXACT_ROWWISE_ADAGRAD``, which DLRM and TorchRec train their
    tables with): one accumulator per table row, ``G_r += mean_d(g_rd^2)``, and ``w_r -= lr * g_r /
    (sqrt(G_r) + eps)``. A row no batch read has a zero gradient and does not move (no momentum
    carries it); a row read rarely keeps a large step, one read every step a shrinking one. Under
    AdamW every row moves about one learning rate per step it is read (and a few more on its
    momentum), the same for an item seen twice an epoch as for one seen every step.
    """

    def __init__(self, params, eps_rowwise: float = 1e-8, **kwargs) -> None:
        super().__init__(params, **kwargs)
        self.eps_rowwise = eps_rowwise

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:  # Lightning passes forward + backward as the closure
            with torch.enable_grad():
                loss = closure()
        groups = self.param_groups
        self.param_groups = [g for g in groups if not g.get("rowwise_adagrad")]
        try:
            super().step()
        finally:
            self.param_groups = groups
        for g in groups:
            if g.get("rowwise_adagrad"):
                self._rowwise_adagrad(g)
        return loss

    def _rowwise_adagrad(self, group: dict) -> None:
        for p in group["params"]:
            if p.grad is None:
                continue
            grad = p.grad.float()
            state = self.state[p]
            if "sum" not in state:
                state["sum"] = torch.zeros(p.shape[0], dtype=torch.float32, device=p.device)
                # A step count as Adam's states have: AdamW's __setstate__ reads one in every state.
                state["step"] = torch.zeros((), dtype=torch.float32)
            state["step"] += 1
            state["sum"].add_(grad.square().mean(dim=1))
            std_V1 = state["sum"].sqrt().add_(self.eps_rowwise).unsqueeze(1)
            p.add_((grad / std_V1).to(p.dtype), alpha=-group["lr"])


def regroup_state(saved: dict, groups: Sequence[dict]) -> tuple[dict, list[int]] | None:
    """An optimizer state dict saved under another grouping of the same parameters, rearranged into
    ``groups`` (``build_param_groups``' order) by parameter name; and for each new group, the index
    of the saved group its hyperparameters come from (for the scheduler's per-group lists). None
    when nothing needs to change, or when the saved groups name no parameters (too old to map).

    A checkpoint written before the id tables had a group of their own ("embedding" then held the
    tables, the CLS and slot vectors) resumes with its moments and step counts intact."""
    old_groups = saved["param_groups"]
    if not all("param_names" in g for g in old_groups):
        return None
    layout = lambda gs: [(g.get("name"), list(g["param_names"])) for g in gs]
    if layout(old_groups) == layout(groups):
        return None
    where = {n: (gi, idx) for gi, g in enumerate(old_groups) for n, idx in zip(g["param_names"], g["params"])}
    missing = sorted(n for g in groups for n in g["param_names"] if n not in where)
    if missing:
        raise ValueError(
            f"the checkpoint's optimizer state has no entry for parameters {missing}; resume cannot "
            "continue its optimizer, start a new run from its weights instead"
        )
    new_groups, state, sources, i = [], {}, [], 0
    for g in groups:
        source = where[g["param_names"][0]][0]
        params = []
        for n in g["param_names"]:
            if where[n][1] in saved["state"]:
                state[i] = saved["state"][where[n][1]]
            params.append(i)
            i += 1
        keep = {k: v for k, v in old_groups[source].items() if k not in ("params", "param_names", "name")}
        new_groups.append(
            {**keep, "name": g["name"], "param_names": list(g["param_names"]), "params": params}
        )
        sources.append(source)
    return {"state": state, "param_groups": new_groups}, sources


def lr_lambda(step: int, cfg: OptimConfig, total_steps: int) -> float:
    """LR multiplier at ``step``: linear warmup 0 -> 1 over ``cfg.warmup_steps``, then cosine or
    linear decay to ``cfg.min_lr_ratio`` over ``cfg.decay_steps`` (0: until ``total_steps``), held
    there after; or constant 1."""
    if step < cfg.warmup_steps:
        return step / cfg.warmup_steps
    if cfg.schedule == "constant":
        return 1.0
    decay = cfg.decay_steps or total_steps - cfg.warmup_steps
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, decay))
    if cfg.schedule == "cosine":
        return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))
    if cfg.schedule == "linear":
        return 1.0 - (1.0 - cfg.min_lr_ratio) * progress
    raise ValueError(f"schedule={cfg.schedule!r} is not one of 'cosine', 'linear', 'constant'")


def build_scheduler(
    optimizer: torch.optim.Optimizer, cfg: OptimConfig, total_steps: int | float
) -> torch.optim.lr_scheduler.LambdaLR:
    """LambdaLR over ``lr_lambda``. LambdaLR multiplies each group's *initial* LR, so the per-group
    muP multipliers survive the schedule. Step it once per optimizer step."""
    if cfg.schedule not in ("cosine", "linear", "constant"):
        raise ValueError(f"schedule={cfg.schedule!r} is not one of 'cosine', 'linear', 'constant'")
    if cfg.schedule != "constant":
        if not math.isfinite(total_steps) and not cfg.decay_steps:
            raise ValueError(
                f"schedule={cfg.schedule!r} needs a finite number of training steps; set trainer.max_steps "
                "(or max_epochs with a sized dataset), or model.optim.decay_steps, or use schedule='constant'"
            )
        if total_steps <= cfg.warmup_steps:
            raise ValueError(
                f"the run trains {total_steps} steps, not more than model.optim.warmup_steps="
                f"{cfg.warmup_steps}, so the {cfg.schedule} schedule would never leave its warmup; lower "
                "--model.optim.warmup_steps or train longer (--trainer.max_steps / --trainer.max_epochs)"
            )
    fn = functools.partial(
        lr_lambda, cfg=cfg, total_steps=int(total_steps) if math.isfinite(total_steps) else 0
    )
    return torch.optim.lr_scheduler.LambdaLR(optimizer, fn)
