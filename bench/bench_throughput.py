"""Training throughput of every ranker on the shipped MovieLens data, side by side in one run.

    python bench/bench_throughput.py                            # the grid's models at their presets
    python bench/bench_throughput.py --chosen bench/out/quality/chosen.json   # at the chosen settings
    python bench/bench_throughput.py --archs transformer bst --steps 60

Each row is one model (a preset of ``configs/quality/grid.yaml``, with its chosen learning rate and
regulariser when ``--chosen`` is given), or the Transformer with one option changed (``--options``:
content tokens of their own, a token per dense feature, the FM crosses, the cross network, the
non-sequence tokens' own weights, the previous default shape, fewer history tokens in the blocks),
so each option's cost in tokens and time sits in the same table. Every model trains on the same
``--batch``-row batches of the train split, read once before timing; a step is what ``recformer
fit`` runs per batch: forward, the weighted BCE loss, backward, the gradient-norm clip and
non-finite check, touched-row embedding decay when set, the AdamW step. Steps run interleaved, one
timed step of each model in turn, so machine noise hits them alike; the table reports median
samples/s over the timed steps, the ratio to ``--reference`` (the Transformer), and the paired
ratio: the median over rounds of the reference's step time over the model's in the same round,
with its quartiles, on ``--threads`` torch threads. ``--compile`` adds each model under ``torch.compile``
(the module's own ``compile``; compiled during the warmup steps). On 2 CPU cores the default's
compiled step is slower: 0.90x the eager rate, paired quartiles 0.80-1.05 (``--archs transformer
--options --compile --steps 40``, 2026-12-07, a CI run beside it), as in a first run on a quiet
machine (2,126 against 2,372 samples/s): inductor's CPU code does not beat the eager kernels at
these shapes, so the CPU fits stay eager. Two runs can differ by about 5% in the ratio of
medians (2026-12-07: the Transformer 2.02x and 1.84x BST's rate in two 100-step runs minutes
apart); the paired ratio's quartiles say how far one run can be read.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import yaml

from recformer.config import FeatureSpec, OptimConfig, RankerConfig
from recformer.data.datamodule import RecDataModule
from recformer.module import RankerModule

ROOT = Path(__file__).resolve().parents[1]
OPTIONS = {
    "content=target": {"ranker": {"content_tokens": "target"}},
    "content=all": {"ranker": {"content_tokens": "all"}},
    "dense per feature": {"ranker": {"dense_per_feature": True}},
    "fm": {"ranker": {"fm": True}},
    "cross 1": {"ranker": {"cross_layers": 1}},
    "cross 1, branch loss": {"ranker": {"cross_layers": 1}, "branch_loss": 1.0},
    "cross 2": {"ranker": {"cross_layers": 2}},
    "token-specific": {"ranker": {"token_params": "specific"}},
    "4 heads, MLP 4x": {"ranker": {"n_heads": 4, "mlp_ratio": 4.0}},
    "dropout 0.2": {"ranker": {"dropout": 0.2}},
    "dropout 0.2, none on attention": {"ranker": {"dropout": 0.2, "attention_dropout": 0.0}},
    "dropout 0.2, none on attention, matmul attention": {
        "ranker": {"dropout": 0.2, "attention_dropout": 0.0, "attention_kernel": "matmul"}
    },
    "dropout 0.2 on the MLP branch, none on attention": {
        "ranker": {"dropout": 0.2, "attention_dropout": 0.0, "dropout_branches": "mlp"}
    },
    "no QK-Norm": {"ranker": {"qk_norm": "none"}},
    "no rating dropout": {"ranker": {"history_cat_dropout": 0.0}},
    "no QK-Norm, dropout 0.2, none on attention": {
        "ranker": {"qk_norm": "none", "dropout": 0.2, "attention_dropout": 0.0}
    },
    "dropout 0.2 per feature, none on attention": {
        "ranker": {"dropout": 0.2, "attention_dropout": 0.0, "dropout_mask": "feature"}
    },
    "history tokens 32, older mean": {"ranker": {"history_tokens": 32, "history_older": "mean"}},
    "history tokens 40, older mean": {"ranker": {"history_tokens": 40, "history_older": "mean"}},
    "history tokens 32, older dropped": {"ranker": {"history_tokens": 32, "history_older": "drop"}},
    "SDPA attention": {"ranker": {"attention_kernel": "sdpa"}},
    "matmul attention": {"ranker": {"attention_kernel": "matmul"}},
    "mixed attention": {"ranker": {"attention_kernel": "mixed"}},
    "ReLU MLP": {"ranker": {"mlp": "relu"}},
    "head reads the target": {"ranker": {"head": "target"}},
    "GELU, head reads both, SDPA": {"ranker": {"mlp": "gelu", "head": "both", "attention_kernel": "sdpa"}},
    "ReLU, head reads the target, mixed attention": {
        "ranker": {"mlp": "relu", "head": "target", "attention_kernel": "mixed"}
    },
    "ReLU, mixed attention": {"ranker": {"mlp": "relu", "attention_kernel": "mixed"}},
    # With the cross network the fields feed (the default has it; a test's small preset may not).
    "history fields by rating": {"ranker": {"cross_layers": 1, "history_pool": "rating"}},
    "no history field": {"ranker": {"cross_layers": 1, "history_pool": "none"}},
    "history field of item ids": {"ranker": {"cross_layers": 1, "history_pool": "items"}},
    "history mean and target fields, unit 16": {
        "ranker": {"cross_layers": 1, "history_pool": "mean_target", "history_unit_hidden": 16}
    },
    "cross DNN 400x3": {"ranker": {"cross_layers": 1, "cross_hidden": [400, 400, 400]}},
    "cross DNN 128x2": {"ranker": {"cross_layers": 1, "cross_hidden": [128, 128]}},
}
"""Options measured against the Transformer's own settings (name: the model settings they change,
``ranker`` for the ranker config): the token options, the FM crosses, the cross network (with its
own loss or not), the non-sequence tokens' own weights, the shape ``small.yaml`` had until
2026-12-02, dropout with and without its share on the attention weights (on the MLP branch alone,
``dropout_branches: mlp``; with one mask per sample and feature, ``dropout_mask: feature``; without
QK-Norm), a DNN beside the cross layers (DCN-V2's 3 x 400, and a smaller one), and either
attention kernel (SDPA's, or the per-head matmuls ``attention_kernel: auto`` takes on CPU, or SDPA
with the matmuls in the last block, ``mixed``), the MLP's activation, the tokens the head reads, and
the shape of the ninth table's default (GELU, the head on CLS and target, SDPA), the three speed
changes together, and the cross network's history fields (split by a gate of the rating, or none)."""


BF16 = " bf16-mixed"
"""The suffix of a model's row under ``--bf16``."""
COMPILED = " compiled"
"""The suffix of a model's row under ``--compile``: compiled when built, so the warmup steps take the
compilation and the timed steps do not."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--grid", type=Path, default=ROOT / "configs" / "quality" / "grid.yaml")
    p.add_argument("--chosen", type=Path, default=None, help="chosen.json of bench/quality.py --stage tune")
    p.add_argument("--archs", nargs="+", default=None, help="models of the grid (default: all)")
    p.add_argument("--options", nargs="*", default=list(OPTIONS), choices=list(OPTIONS))
    p.add_argument("--reference", default="transformer")
    p.add_argument(
        "--per-slot-content",
        action="store_true",
        help="also each model with its item bags summed and content projected per item slot (the GPU path)",
    )
    p.add_argument("--data", type=Path, default=ROOT / "data" / "movielens")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--steps", type=int, default=40, help="timed steps per model")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps per model first")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument(
        "--bf16",
        action="store_true",
        help="also every model under CPU bf16 autocast (--trainer.precision=bf16-mixed), beside fp32",
    )
    p.add_argument(
        "--compile",
        action="store_true",
        help="also every model under torch.compile (the module's own `compile`, as --model.compile=true)",
    )
    p.add_argument("--out", type=Path, default=None, help="JSON results")
    return p.parse_args(argv)


def _merge(into: dict, more: dict) -> dict:
    for k, v in more.items():
        into[k] = _merge(into.get(k, {}), v) if isinstance(v, dict) else v
    return into


def model_settings(config: Path, data_config: Path, setting: dict[str, object]) -> dict:
    """The ``model:`` section ``recformer fit --config config --config data_config --k=v ...`` sees."""
    model: dict = {}
    for path in (config, data_config):
        _merge(model, (yaml.safe_load((ROOT / path).read_text()) or {}).get("model", {}))
    for dotted, value in setting.items():
        *parents, leaf = dotted.split(".")[1:]  # "model.optim.lr" -> model["optim"]["lr"]
        node = model
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return model


def build(model: dict, dm: RecDataModule) -> tuple[RankerModule, torch.optim.Optimizer]:
    module = RankerModule(
        ranker=RankerConfig(**model.get("ranker", {})),
        optim=OptimConfig(**model.get("optim", {})),
        dims=dm.feature_dims,
        arch=model.get("arch", "transformer"),
        pairwise=model.get("pairwise", 0.0),
        listwise=model.get("listwise", 0.0),
        branch_loss=model.get("branch_loss", 0.0),
        compile=model.get("compile", False),
    )
    module.ranker.set_item_tables(*dm.item_tables())
    module.configure_model()  # what fit calls first: torch.compile under `compile`
    optimizer = module.make_optimizer()  # the module's own groups; no schedule: LR does not change cost
    return module.train(), optimizer


def step(module: RankerModule, optimizer: torch.optim.Optimizer, batch, bf16: bool = False) -> None:
    """One training step as ``recformer fit`` runs it (the module's ``train_loss``, then
    configure_gradient_clipping, then the optimizer); with ``bf16``, the loss under CPU bf16
    autocast, as ``--trainer.precision=bf16-mixed`` runs it on CPU."""
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        loss, _ = module.train_loss(batch)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    module.configure_gradient_clipping(optimizer)
    optimizer.step()


def variants(a: argparse.Namespace) -> dict[str, dict]:
    grid = yaml.safe_load(a.grid.read_text())
    chosen = json.loads(a.chosen.read_text()) if a.chosen else {}
    archs = a.archs or list(grid["models"])
    data_config = Path(grid["data_config"])
    out = {}
    for arch in archs:
        out[arch] = model_settings(Path(grid["models"][arch]["config"]), data_config, chosen.get(arch, {}))
    if a.reference in out:
        for name in a.options:
            model = json.loads(json.dumps(out[a.reference]))
            for key, value in OPTIONS[name].items():
                if isinstance(value, dict):
                    model.setdefault(key, {}).update(value)
                else:
                    model[key] = value
            out[f"{a.reference} {name}"] = model
    return out


def table(models: dict, seconds: dict[str, list[float]], reference: str, batch: int) -> dict[str, dict]:
    """Each model's row, printed and returned: median samples/s, its ratio to ``reference``'s
    median, and the paired ratio: the median over rounds of the reference's step time over the
    model's in the same round (the two steps run back to back, so a slow spell of the machine hits
    both), with its quartiles: how far one run's ratio can be trusted."""
    ref = seconds.get(reference)
    rows = {}
    head = f"{'model':32s} {'tokens':>6s} {'params':>9s} {'samples/s':>10s} {'vs ' + reference:>16s}"
    print(f"{head} {'paired (IQR)':>20s}")
    for name, (module, _) in models.items():
        med = statistics.median(seconds[name])
        n_params = sum(p.numel() for p in module.parameters())
        row = {"samples_per_s": batch / med, "tokens": module.ranker.n_tokens, "params": n_params}
        row["vs_reference"] = statistics.median(ref) / med if ref else float("nan")
        paired = [r / s for r, s in zip(ref, seconds[name], strict=True)] if ref else [float("nan")] * 2
        # "inclusive": quartiles within the rounds' range; the default ("exclusive") extrapolates
        # past it at a few rounds, to below zero when two rounds differ by 4x (a busy machine).
        q1, _, q3 = statistics.quantiles(paired, n=4, method="inclusive") if len(paired) > 1 else paired * 3
        row["vs_reference_paired"], row["vs_reference_iqr"] = statistics.median(paired), [q1, q3]
        rows[name] = row
        size = f"{name:32s} {module.ranker.n_tokens:6d} {n_params:9d} {batch / med:10.0f}"
        print(f"{size} {row['vs_reference']:15.2f}x {row['vs_reference_paired']:7.2f}x ({q1:.2f}-{q3:.2f})")
    return rows


def main(argv: list[str] | None = None) -> dict:
    a = parse_args(argv)
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    FeatureSpec.load(a.data / "spec.yaml")  # a clear error when the data is not there
    dm = RecDataModule(str(a.data), batch_size=a.batch, num_workers=0)
    dm.setup("fit")
    batches: list = []
    while len(batches) < a.warmup + a.steps:  # a small split is read again from its start
        for batch in dm.train_dataloader():
            batches.append(batch.to("cpu"))  # widens the ids, as fit does
            if len(batches) == a.warmup + a.steps:
                break
    settings = variants(a)
    models = {name: build(m, dm) for name, m in settings.items()}
    if a.per_slot_content:
        for name, m in settings.items():
            if " " in name or not hasattr(models[name][0].ranker, "tokens"):
                continue  # the options, and the models without a tokenizer
            module, optimizer = build(m, dm)
            module.ranker.tokens.once_per_item = False
            models[f"{name} per-slot content"] = (module, optimizer)
    if a.bf16:
        models.update({f"{name}{BF16}": build(m, dm) for name, m in settings.items()})
    if a.compile:
        compiled = {f"{name}{COMPILED}": {**m, "compile": True} for name, m in settings.items()}
        models.update({name: build(m, dm) for name, m in compiled.items()})
    seconds: dict[str, list[float]] = {name: [] for name in models}
    for i, batch in enumerate(batches):
        for name, (module, optimizer) in models.items():
            start = time.perf_counter()
            step(module, optimizer, batch, name.endswith(BF16))
            if i >= a.warmup:
                seconds[name].append(time.perf_counter() - start)
    rows = table(models, seconds, a.reference, a.batch)
    result = {"batch": a.batch, "steps": a.steps, "threads": a.threads, "models": rows}
    if a.out:
        a.out.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
