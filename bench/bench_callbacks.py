"""Overhead of the health callbacks: training steps/s with them at their default cadence vs without.

    python bench/bench_callbacks.py                      # CPU, ~2-4 minutes on 2 cores
    python bench/bench_callbacks.py --steps 300 --repeats 7 --json /tmp/bench_callbacks.json

"Default cadence" is what ``configs/trainer.yaml`` sets: the callbacks listed there under
``recformer.callbacks.*`` are built from their YAML entries, and the trainer logs every
``log_every_n_steps`` steps (10 there). Both arms run the same Trainer (same model, data, seed,
CSVLogger, loader), the "off" arm without those callbacks. Arms alternate, repeat after repeat, so
machine noise hits both alike; each fit is timed from the start of step ``--warmup`` to the end of
training (start-up, the first steps and the probe batch read are not counted). The table gives the
median steps/s per arm and the slowdown of "on" relative to "off" (target: at most 3 % on CPU), and,
as a figure that machine noise cannot blur, the share of the "on" arm's wall time spent inside the
callbacks' own per-step hooks.
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import tempfile
import time
from pathlib import Path

import lightning.pytorch as pl
import torch
import yaml
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import CSVLogger

from recformer.config import OptimConfig, RankerConfig
from recformer.data.datamodule import RecDataModule
from recformer.datasets.synth import write_synth
from recformer.module import RankerModule

ROOT = Path(__file__).resolve().parents[1]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=150, help="training steps per fit")
    p.add_argument("--warmup", type=int, default=20, help="steps before the clock starts")
    p.add_argument("--repeats", type=int, default=5, help="fits per arm (alternating)")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--max-len", type=int, default=32, help="history length of the synthetic data")
    p.add_argument("--workers", type=int, default=1, help="DataLoader workers (the DataModule default)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    args = p.parse_args(argv)
    if args.warmup >= args.steps:
        p.error(f"--warmup={args.warmup} must be below --steps={args.steps}")
    return args


def default_health_callbacks() -> tuple[list[Callback], int]:
    """The recformer callbacks of configs/trainer.yaml, as configured there, and its log cadence."""
    cfg = yaml.safe_load((ROOT / "configs" / "trainer.yaml").read_text())["trainer"]
    out = []
    for entry in cfg["callbacks"]:
        module, _, name = entry["class_path"].rpartition(".")
        if module.startswith("recformer.callbacks.") and not module.endswith("predictions"):
            out.append(getattr(importlib.import_module(module), name)(**(entry.get("init_args") or {})))
    return out, int(cfg["log_every_n_steps"])


class StepClock(Callback):
    def __init__(self, warmup: int) -> None:
        self.warmup = warmup
        self.t0 = self.t1 = 0.0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.warmup:
            self.t0 = time.perf_counter()

    def on_train_end(self, trainer, pl_module):
        self.t1 = time.perf_counter()


HOOKS = ("on_train_batch_start", "on_before_optimizer_step", "on_train_batch_end")
"""The per-step hooks; the sink's ``on_train_batch_end`` includes every source's ``gather``."""


def time_hooks(callbacks: list[Callback], clock: StepClock) -> dict[str, float]:
    """Wrap the callbacks' per-step hooks to add up their own wall time once the clock runs."""
    spent = {"s": 0.0}

    def timer(hook):
        def timed(*a, **k):
            t = time.perf_counter()
            try:
                return hook(*a, **k)
            finally:
                if clock.t0:
                    spent["s"] += time.perf_counter() - t

        return timed

    for cb in callbacks:
        for name in HOOKS:
            if getattr(type(cb), name) is getattr(Callback, name):
                continue  # not overridden: Lightning's no-op

            setattr(cb, name, timer(getattr(cb, name)))
    return spent


def fit_once(args: argparse.Namespace, data: Path, out: Path, with_health: bool) -> tuple[float, float]:
    """Steps/s of one fit, and the fraction of the timed wall time spent inside the health hooks."""
    torch.manual_seed(0)
    dm = RecDataModule(str(data), batch_size=args.batch, num_workers=args.workers, validate="footer")
    module = RankerModule(
        ranker=RankerConfig(d_model=args.d_model, n_layers=args.layers, n_heads=args.heads),
        optim=OptimConfig(warmup_steps=args.warmup),
        dims=dm.feature_dims,
    )
    health, every = default_health_callbacks()
    clock = StepClock(args.warmup)
    spent = time_hooks(health, clock) if with_health else {"s": 0.0}
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=args.steps,
        log_every_n_steps=every,
        logger=CSVLogger(out, name="", version=""),
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        limit_val_batches=0,
        callbacks=[*(health if with_health else []), clock],
    )
    trainer.fit(module, dm)
    elapsed = clock.t1 - clock.t0
    return (args.steps - args.warmup) / elapsed, spent["s"] / elapsed


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        rows = args.batch * (args.steps + 10)
        write_synth(
            data,
            rows,
            val_rows=1024,
            test_rows=256,
            users=2000,
            items=5000,
            max_len=args.max_len,
            content_dim=16,
            row_group_size=4096,
        )
        rates: dict[str, list[float]] = {"off": [], "on": []}
        in_hooks: list[float] = []
        for r in range(args.repeats):
            order = ("off", "on") if r % 2 == 0 else ("on", "off")
            for arm in order:
                rate, share = fit_once(args, data, Path(tmp) / f"{arm}{r}", with_health=arm == "on")
                rates[arm].append(rate)
                if arm == "on":
                    in_hooks.append(share)
                print(f"repeat {r} {arm:>3}: {rate:.2f} steps/s", flush=True)
    med = {arm: statistics.median(v) for arm, v in rates.items()}
    slowdown = 1.0 - med["on"] / med["off"]
    print()
    print(f"{'callbacks':<10} {'median steps/s':>15} {'min':>8} {'max':>8}")
    for arm in ("off", "on"):
        print(f"{arm:<10} {med[arm]:>15.2f} {min(rates[arm]):>8.2f} {max(rates[arm]):>8.2f}")
    print(f"\nslowdown with callbacks at default cadence: {slowdown:+.2%} (target <= 3% on CPU)")
    hooks_share = statistics.median(in_hooks)
    print(f"time inside the health hooks: {hooks_share:.2%} of the timed training wall time (median)")
    result = {
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "steps_per_s": rates,
        "median": med,
        "slowdown": slowdown,
        "in_hooks_share": hooks_share,
        "torch_threads": torch.get_num_threads(),
    }
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
