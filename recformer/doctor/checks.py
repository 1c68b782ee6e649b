"""The checks: each reads one metric family of a run and returns its findings with the evidence.

The table of checks and what makes each fire is in the package docstring (``recformer.doctor``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from recformer import metric_names as mn
from recformer.doctor.runs import RunMetrics, Series

# -- thresholds (guides from DESIGN section 6; tune them on your data) ----------------------------
STARVATION_RATIO = 0.1
"""grad norm of block 0 / last block below this = the bottom layers are starved (Post-Norm)."""
IDLE_COS = 0.99
"""cosine(block input, block output) above this = the block barely changes the stream (idles)."""
RESID_GROWTH = 2.0
"""resid RMS of the last block / the first, with a rise at every block, at or above this = growth."""
RISE_TOLERANCE = 0.02
"""A step down of less than 2% between adjacent blocks still counts as rising (probe noise)."""
ENTROPY_COLLAPSE = 0.1
"""Normalised attention entropy below this = softmax close to one-hot."""
ENTROPY_UNIFORM = 0.98
"""Normalised attention entropy above this = attention averages every token."""
UPDATE_RATIO_LOW = 1e-5
"""||dW||/||W|| median below this (a decade under DESIGN's 1e-4 "not learning" guide) = frozen."""
UPDATE_RATIO_HIGH = 1e-1
"""||dW||/||W|| above this at any log step (a decade over DESIGN's 1e-2 guide; Adam at LR 1e-3 on
0.02-std weights already sits near 2e-2) = one step moved the block by a tenth of its size."""
WEIGHT_GROWTH = 0.10
"""Relative weight-norm growth over the second half of the run at or above this ..."""
RISING_FRACTION = 0.8
"""... with the norm rising at this fraction of the log steps = weight decay is not holding."""
ADAM_RECOVERED = 2.0
"""Adam's sqrt(v) counts as recovered from a spike once it is back under this x its level before."""


@dataclass
class Finding:
    check: str
    """Check name (table in the package docstring, ``recformer.doctor``)."""
    title: str
    """One line: what is wrong."""
    metric: str
    """The metric family the evidence comes from."""
    blocks: list[int] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    evidence: list[str] = field(default_factory=list)
    """Lines of values that support the finding."""
    advice: str = ""


def _fmt(x: float) -> str:
    return f"{x:.3g}"


def _median(s: Series) -> float:
    """The median of the logged values, NaN when every one is NaN (said by the caller, not
    numpy's All-NaN warning)."""
    v = s.values[~np.isnan(s.values)]
    return float(np.median(v)) if len(v) else float("nan")


def _span(s: Series) -> str:
    return f"steps {int(s.steps[0])}-{int(s.steps[-1])}"


# -- checks: each returns its findings, or None when the run has no data for it ----------------
def check_starvation(run: RunMetrics) -> list[Finding] | None:
    ratio = run.get(mn.GRAD_RATIO_BOTTOM_TOP)
    if ratio is None:
        return None
    late = ratio.tail(0.5)
    med = _median(late)
    if not np.isfinite(med):
        return None  # no finite ratio (a diverged run): nothing to judge; nonfinite_steps says why
    if med >= STARVATION_RATIO:
        return []
    grads = run.per_block(mn.GRAD_NORM)
    last = max(grads) if grads else 0
    evidence = [
        f"{mn.GRAD_RATIO_BOTTOM_TOP}: median {_fmt(med)} over {_span(late)} (alarm < {STARVATION_RATIO})"
    ]
    for i in sorted({0, last}) if grads else []:
        evidence.append(f"{mn.GRAD_NORM.format(i=i)}: median {_fmt(_median(grads[i].tail(0.5)))}")
    if grads and np.all(grads[0].tail(0.5).values == 0):
        evidence.append("block 0 receives no gradient at all: frozen (requires_grad=False) or detached")
    placement = (run.meta.get("ranker") or {}).get("norm_placement")
    return [
        Finding(
            "bottom_starvation",
            "bottom layers starved of gradient" + (f" (norm_placement={placement})" if placement else ""),
            mn.GRAD_RATIO_BOTTOM_TOP,
            blocks=[0],
            steps=[int(late.steps[0]), int(late.steps[-1])],
            evidence=evidence,
            advice="Post-Norm shrinks gradients on the way down (Xiong et al. 2020): use norm_placement "
            "pre/sandwich/reordered, or deepnorm with init=deepnorm, add warmup, lower the LR.",
        )
    ]


def check_idle(run: RunMetrics) -> list[Finding] | None:
    cos = run.per_block(mn.COS_ADJACENT)
    if not cos:
        return None
    n = max(cos) + 1
    deep = [i for i in cos if i >= n // 2]
    meds = {i: _median(cos[i].tail(1 / 3)) for i in deep}
    idle = [i for i, v in meds.items() if v > IDLE_COS]
    if not idle:
        return []
    s = cos[idle[0]].tail(1 / 3)
    return [
        Finding(
            "idle_deep_layers",
            f"{len(idle)} of the {len(deep)} upper blocks pass their input through almost unchanged",
            mn.COS_ADJACENT.format(i="*"),
            blocks=idle,
            steps=[int(s.steps[0]), int(s.steps[-1])],
            evidence=[
                f"{mn.COS_ADJACENT.format(i=i)}: median {meds[i]:.5f} over {_span(cos[i].tail(1 / 3))} "
                f"(alarm > {IDLE_COS})"
                for i in idle
            ],
            advice="Deep Pre-Norm blocks idle when the residual stream outgrows their updates: try "
            "layernorm_scaling, norm_placement sandwich/reordered, depth-scaled init, or fewer layers.",
        )
    ]


def check_residual_growth(run: RunMetrics) -> list[Finding] | None:
    rms = run.per_block(mn.RESID_RMS)
    if len(rms) < 2:
        return None
    blocks = sorted(rms)
    meds = np.array([_median(rms[i].tail(1 / 3)) for i in blocks])
    rising = bool(np.all(meds[1:] >= meds[:-1] * (1 - RISE_TOLERANCE)))
    growth = meds[-1] / max(meds[0], 1e-30)
    if not (rising and growth >= RESID_GROWTH):
        return []
    s = rms[blocks[-1]].tail(1 / 3)
    return [
        Finding(
            "residual_growth",
            f"residual-stream RMS grows {growth:.2f}x from block 0 to block {blocks[-1]}",
            mn.RESID_RMS.format(i="*"),
            blocks=blocks,
            steps=[int(s.steps[0]), int(s.steps[-1])],
            evidence=[
                f"{mn.RESID_RMS.format(i='*')} median per block over {_span(s)}: "
                + ", ".join(_fmt(v) for v in meds)
                + f" (alarm: rising and last/first >= {RESID_GROWTH})"
            ],
            advice="Variance that grows with depth (Curse of Depth, Sun et al. 2025): turn on "
            "layernorm_scaling, use sandwich/reordered placement or depth-scaled init (init=scaled/depth).",
        )
    ]


def check_attention(run: RunMetrics) -> list[Finding] | None:
    ent = run.per_block(mn.ATTN_ENTROPY)
    if not ent:
        return None
    logit = run.per_block(mn.ATTN_LOGIT_MAX)
    meds = {i: _median(s.tail(1 / 3)) for i, s in ent.items()}
    findings = []
    collapsed = [i for i, v in meds.items() if v < ENTROPY_COLLAPSE]
    uniform = [i for i, v in meds.items() if v > ENTROPY_UNIFORM]
    if collapsed:
        findings.append(_attention_collapse(ent, logit, meds, collapsed))
    if uniform:
        findings.append(_attention_uniform(ent, logit, meds, uniform))
    return findings


def _attention_collapse(
    ent: dict[int, Series], logit: dict[int, Series], meds: dict[int, float], collapsed: list[int]
) -> Finding:
    """Entropy near 0 in ``collapsed``, each with its max logit at the first and last log step."""
    evidence = []
    for i in collapsed:
        line = f"{mn.ATTN_ENTROPY.format(i=i)}: median {meds[i]:.4f} (alarm < {ENTROPY_COLLAPSE})"
        if i in logit:
            lg = logit[i]
            trend = "rising" if lg.values[-1] > lg.values[0] else "not rising"
            line += (
                f"; {mn.ATTN_LOGIT_MAX.format(i=i)} {_fmt(lg.values[0])} at step {int(lg.steps[0])} -> "
                f"{_fmt(lg.values[-1])} at step {int(lg.steps[-1])} ({trend})"
            )
        evidence.append(line)
    s = ent[collapsed[0]].tail(1 / 3)
    return Finding(
        "attention_collapse",
        f"attention entropy collapsed (softmax near one-hot) in {len(collapsed)} block(s)",
        mn.ATTN_ENTROPY.format(i="*"),
        blocks=collapsed,
        steps=[int(s.steps[0]), int(s.steps[-1])],
        evidence=evidence,
        advice="Attention logits grew until softmax saturated (Dehghani et al. 2023): turn on "
        "qk_norm (head or full), lower the LR, or use the muP 1/d_head attention scale.",
    )


def _attention_uniform(
    ent: dict[int, Series], logit: dict[int, Series], meds: dict[int, float], uniform: list[int]
) -> Finding:
    """Entropy near 1 in ``uniform``, each with its median max logit."""
    s = ent[uniform[0]].tail(1 / 3)
    evidence = []
    for i in uniform:
        line = f"{mn.ATTN_ENTROPY.format(i=i)}: median {meds[i]:.4f} (alarm > {ENTROPY_UNIFORM})"
        if i in logit:
            line += f"; {mn.ATTN_LOGIT_MAX.format(i=i)} median {_fmt(_median(logit[i].tail(1 / 3)))}"
        evidence.append(line)
    return Finding(
        "attention_uniform",
        f"attention averages every token (entropy near 1) in {len(uniform)} block(s)",
        mn.ATTN_ENTROPY.format(i="*"),
        blocks=uniform,
        steps=[int(s.steps[0]), int(s.steps[-1])],
        evidence=evidence,
        advice="Queries and keys carry no signal: check that q/k weights train (not zero or frozen), "
        "that qk_norm gains are not stuck near 0, and that the LR is not too low.",
    )


def check_update_ratio(run: RunMetrics) -> list[Finding] | None:
    ratios = run.per_block(mn.UPDATE_RATIO)
    if not ratios:
        return None
    findings = []
    meds = {i: _median(s.tail(1 / 3)) for i, s in ratios.items()}  # past warmup's small steps
    low = {i: m for i, m in meds.items() if m < UPDATE_RATIO_LOW}
    if low:
        findings.append(_update_ratio_low(ratios, low))
    high = {}
    for i, s in ratios.items():
        over = s.values > UPDATE_RATIO_HIGH
        if over.any():
            high[i] = (s.steps[over], s.values[over])
    if high:
        findings.append(_update_ratio_high(high))
    return findings


def _update_ratio_low(ratios: dict[int, Series], low: dict[int, float]) -> Finding:
    """Blocks whose median update ratio (``low``: block -> median) is below ``UPDATE_RATIO_LOW``."""
    first = ratios[min(low)]
    return Finding(
        "update_ratio_low",
        f"{len(low)} block(s) do not learn: updates are a vanishing fraction of the weights",
        mn.UPDATE_RATIO.format(i="*"),
        blocks=sorted(low),
        steps=[int(first.steps[0]), int(first.steps[-1])],
        evidence=[
            f"{mn.UPDATE_RATIO.format(i=i)}: median {_fmt(v)} over {_span(ratios[i])} "
            f"(alarm < {UPDATE_RATIO_LOW:g})"
            for i, v in sorted(low.items())
        ],
        advice="Check that the block is trainable and in an optimizer group with a non-zero LR "
        "(muP LR / width), that it gets gradient (see grad_norm), and the LR schedule.",
    )


def _update_ratio_high(high: dict[int, tuple[np.ndarray, np.ndarray]]) -> Finding:
    """Blocks with an update ratio over ``UPDATE_RATIO_HIGH`` (``high``: block -> (steps, values)
    of the log steps over it)."""
    all_steps = sorted({int(t) for st, _ in high.values() for t in st})
    evidence = []
    for i, (st, v) in sorted(high.items()):
        worst = int(np.argmax(v))
        evidence.append(
            f"{mn.UPDATE_RATIO.format(i=i)}: > {UPDATE_RATIO_HIGH:g} at {len(st)} log step(s), "
            f"max {_fmt(v[worst])} at step {int(st[worst])}"
        )
    return Finding(
        "update_ratio_high",
        f"{len(high)} block(s) take unstable steps: an update moved the weights by > {UPDATE_RATIO_HIGH:.0%}",
        mn.UPDATE_RATIO.format(i="*"),
        blocks=sorted(high),
        steps=all_steps,
        evidence=evidence,
        advice="Lower the LR or lengthen the warmup (optim.warmup_steps); under muP check "
        "base_d_model; large ratios at the start only mean the warmup is too short.",
    )


def _spike_episodes(spikes: Series, gap: int) -> list[tuple[int, int, int]]:
    """Runs of log steps with spikes, merged when closer than ``gap`` steps: (first, last, count)."""
    episodes: list[list[int]] = []
    for step, count in zip(spikes.steps, spikes.values):
        if count <= 0:
            continue
        if episodes and step - episodes[-1][1] <= gap:
            episodes[-1][1] = int(step)
            episodes[-1][2] += int(count)
        else:
            episodes.append([int(step), int(step), int(count)])
    return [tuple(e) for e in episodes]  # type: ignore[misc]


def _beta2(run: RunMetrics, group: str) -> float | None:
    for g in (run.meta.get("OptimizerHealth") or {}).get("groups", []):
        if g.get("name") == group and len(g.get("betas", [])) == 2:
            return float(g["betas"][1])
    betas = (run.meta.get("optim") or {}).get("betas")
    return float(betas[1]) if betas else None


def adam_recovery(v: Series, start: int, beta2: float | None) -> str | None:
    """How Adam's sqrt(v) of one group reacted to a spike that began at log step ``start``."""
    before = v.values[v.steps < start]
    after_mask = v.steps >= start
    if not len(before) or not after_mask.any():
        return None
    base = float(before[-1])
    st, val = v.steps[after_mask], v.values[after_mask]
    k = int(np.argmax(val))
    peak, peak_step = float(val[k]), int(st[k])
    expected = f", expected ~{1 / (1 - beta2):.0f} steps (1/(1-beta2), beta2={beta2:g})" if beta2 else ""
    if peak <= ADAM_RECOVERED * base:
        return f"no jump ({_fmt(base)} -> max {_fmt(peak)})"
    back = np.nonzero(val[k:] <= ADAM_RECOVERED * base)[0]
    if len(back):
        rec = int(st[k + back[0]])
        return (
            f"jumped {peak / max(base, 1e-30):.1f}x ({_fmt(base)} -> {_fmt(peak)} at step {peak_step}), "
            f"back under {ADAM_RECOVERED:g}x by step {rec}: {rec - peak_step} steps{expected}"
        )
    return (
        f"jumped {peak / max(base, 1e-30):.1f}x ({_fmt(base)} -> {_fmt(peak)} at step {peak_step}), "
        f"still {val[-1] / max(base, 1e-30):.1f}x at step {int(st[-1])}, the end of the run: "
        f"not recovered after {int(st[-1]) - peak_step} steps{expected}; updates of this group stay small "
        "until it does"
    )


def check_spikes(run: RunMetrics) -> list[Finding] | None:
    spikes = run.get(mn.LOSS_SPIKE)
    if spikes is None:
        return None
    gap = 2 * int(np.median(np.diff(spikes.steps))) if len(spikes.steps) > 1 else 1
    episodes = _spike_episodes(spikes, gap)
    if not episodes:
        return []
    z = run.get(mn.LOSS_Z_MAX)
    loss = run.get(mn.TRAIN_LOSS)
    evidence = []
    for first, last, count in episodes:
        interval = spikes.steps[spikes.steps < first]
        since = int(interval[-1]) + 1 if len(interval) else 1
        line = f"{count} spike(s) between steps {since} and {last}"
        if z is not None:
            zs = z.values[(z.steps >= first) & (z.steps <= last)]
            if len(zs):
                line += f", loss up to {float(zs.max()):.1f} std above its running mean"
        if loss is not None:
            around = loss.values[(loss.steps >= since) & (loss.steps <= last)]
            before = loss.values[loss.steps < since]
            if len(around) and len(before):
                line += f" ({mn.TRAIN_LOSS} {_fmt(before[-1])} -> {_fmt(float(around.max()))})"
        evidence.append(line)
        for group, v in run.matching(mn.ADAM_V).items():
            rec = adam_recovery(v, first, _beta2(run, group))
            if rec:
                evidence.append(f"  {mn.ADAM_V.format(group=group)}: {rec}")
    total = sum(c for _, _, c in episodes)
    return [
        Finding(
            "loss_spikes",
            f"{total} loss spike(s) in {len(episodes)} episode(s)",
            mn.LOSS_SPIKE,
            steps=[first for first, _, _ in episodes],
            evidence=evidence,
            advice="Spikes inflate Adam's second moments, which then shrink updates for ~1/(1-beta2) steps: "
            "lower the LR, clip gradients (optim.grad_clip), turn on qk_norm, use beta2 0.95 rather "
            "than 0.999, and check the batches of those steps for outliers.",
        )
    ]


def check_weight_norm(run: RunMetrics) -> list[Finding] | None:
    norms = run.per_block(mn.WEIGHT_NORM)
    if not norms:
        return None
    growing = {}
    for i, s in norms.items():
        late = s.tail(0.5)
        if len(late.values) < 3:
            continue
        growth = late.values[-1] / max(late.values[0], 1e-30) - 1
        rising = float(np.mean(np.diff(late.values) > 0))
        if growth >= WEIGHT_GROWTH and rising >= RISING_FRACTION:
            growing[i] = (late, growth, rising)
    if not growing:
        return []
    s0 = next(iter(growing.values()))[0]
    return [
        Finding(
            "weight_norm_runaway",
            f"weight norm grows steadily in {len(growing)} block(s)",
            mn.WEIGHT_NORM.format(i="*"),
            blocks=sorted(growing),
            steps=[int(s0.steps[0]), int(s0.steps[-1])],
            evidence=[
                f"{mn.WEIGHT_NORM.format(i=i)}: {_fmt(late.values[0])} at step {int(late.steps[0])} -> "
                f"{_fmt(late.values[-1])} at step {int(late.steps[-1])} (+{growth:.0%}, rising at "
                f"{rising:.0%} of log steps; alarm >= +{WEIGHT_GROWTH:.0%} and >= {RISING_FRACTION:.0%})"
                for i, (late, growth, rising) in sorted(growing.items())
            ],
            advice="Weight decay is not holding the norms: check optim.weight_decay (decoupled, on "
            "matrices), the LR, and that the growing matrices are in the decayed 'hidden' group.",
        )
    ]


def check_nonfinite(run: RunMetrics) -> list[Finding] | None:
    """Steps skipped for non-finite gradients or loss (the module's guard), and logged losses that
    were NaN or Inf, which a run can show with a zero count (a guard on the gradients alone lets a
    NaN loss with finite gradients through). Needs the health counter: a run without it gets no
    verdict here."""
    count = run.get(mn.NONFINITE_STEPS)
    if count is None:
        return None
    findings = []
    total = float(np.nanmax(count.values))
    if total > 0:
        rose = np.nonzero(np.diff(np.concatenate([[0.0], count.values])) > 0)[0]
        since = [int(count.steps[k - 1]) + 1 if k else 1 for k in rose]
        intervals = [f"{a}-{int(count.steps[k])}" for a, k in zip(since, rose)]
        findings.append(
            Finding(
                "nonfinite_steps",
                f"{int(total)} optimizer step(s) skipped for non-finite gradients or loss",
                mn.NONFINITE_STEPS,
                steps=[int(count.steps[k]) for k in rose],
                evidence=[
                    f"{mn.NONFINITE_STEPS}: reached {int(total)}; new ones in steps " + ", ".join(intervals)
                ],
                advice="NaN/Inf gradients or loss: look for extreme or NaN inputs or sample weights in "
                "those batches, lower the LR, turn on qk_norm, or keep the loss in float32 under bf16.",
            )
        )
    for name in (mn.TRAIN_LOSS, mn.VAL_LOSS):
        s = run.get(name)
        bad = ~np.isfinite(s.values) if s is not None else np.zeros(0, bool)
        if bad.any():
            steps = [int(x) for x in s.steps[bad]]
            findings.append(
                Finding(
                    "nonfinite_loss",
                    f"{name} was NaN or Inf at {len(steps)} logged step(s)",
                    name,
                    steps=steps,
                    evidence=[f"{name}: non-finite at steps " + ", ".join(map(str, steps[:20]))],
                    advice="A loss overflowed or met a NaN: look for extreme sample weights or inputs in "
                    f"those batches (the guard skips such a step and counts it in {mn.NONFINITE_STEPS}).",
                )
            )
    return findings


CHECKS = (
    ("bottom_starvation", "bottom-layer gradient starvation", check_starvation),
    ("idle_deep_layers", "idle deep layers", check_idle),
    ("residual_growth", "residual variance growth with depth", check_residual_growth),
    ("attention", "attention entropy collapse / over-averaging", check_attention),
    ("update_ratio", "update-to-weight ratio in band", check_update_ratio),
    ("loss_spikes", "loss spikes and Adam recovery", check_spikes),
    ("weight_norm", "weight-norm runaway", check_weight_norm),
    ("nonfinite_steps", "non-finite steps and losses", check_nonfinite),
)


@dataclass
class Diagnosis:
    run_dir: str
    sources: list[str]
    steps: int
    findings: list[Finding]
    passed: list[str]
    skipped: list[str]

    @property
    def healthy(self) -> bool:
        return not self.findings


def diagnose(run: RunMetrics, run_dir: Path) -> Diagnosis:
    findings, passed, skipped = [], [], []
    for _, description, check in CHECKS:
        result = check(run)
        if result is None:
            skipped.append(description)
        elif result:
            findings.extend(result)
        else:
            passed.append(description)
    return Diagnosis(str(run_dir), run.sources, run.n_steps, findings, passed, skipped)
