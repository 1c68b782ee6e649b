"""Levers of the Transformer's within-user ranking, each a variant of one model preset, measured on
validation only (the test split is not read):

    python bench/levers.py                          # every variant of configs/quality/levers.yaml
    python bench/levers.py --only base emb_lr30     # some of them
    python bench/levers.py --seeds 0 1 2            # several seeds each (paired by seed)

Each variant is ``recformer fit`` of the file's ``config`` with the variant's extra arguments, at
one torch thread, up to ``epochs`` epochs with early stopping on validation AUC (configs/trainer.yaml:
patience 4 validations since 2026-12-07, 2 before: every spec measured before then ran at 2),
validated every half epoch. A row gives the validation AUC and
GAUC of the kept checkpoint (best by their sum since 2026-12-06, by AUC before), the best GAUC of
the run (at whichever validation), the kept checkpoint's epoch and whether the run stopped at the
cap. Finished fits are
kept (``done.json``): a rerun adds what is missing. Results: ``<out>/levers.json``.

With ``--reference``, a run folder per seed (``{seed}`` in the path; for example the quality
table's runs of the default, which are these variants' fits without their extra arguments), each
variant's row also gives the change of the kept checkpoint's val AUC + GAUC against the reference's
at every seed and docs/levers.md's verdict (``RULE_FLOOR``): mean change above zero, no seed below
the floor.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import csv
import json
import statistics
from pathlib import Path

import cli_runs
import yaml

ROOT = Path(__file__).resolve().parents[1]
RULE_FLOOR = -0.002
"""The lowest change of val AUC + GAUC one seed may show for a lever to join the default
(docs/levers.md's rule, set 2026-12-03 before the first lever was measured)..."""
RULE_SEEDS = 3
"""... over this many seeds (0, 1, 2): with fewer, a verdict holds so far, but one seed below the
floor already fails."""


def reference_run(reference: str, seed: int) -> Path:
    """The reference's run folder for ``seed`` (``{seed}`` in ``reference``), checked to hold a
    ``metrics.csv``."""
    if "{seed}" not in reference:
        raise ValueError(f"--reference {reference!r}: expected a path with {{seed}} in it, one run per seed")
    ref = Path(reference.format(seed=seed))
    if not (ref / "metrics.csv").is_file():
        raise FileNotFoundError(f"--reference: {ref} holds no metrics.csv (seed {seed})")
    return ref


def run_variant(spec: dict, name: str, args: list[str], seed: int, out: Path) -> dict:
    """One fit of a variant; its validation scores (kept in ``done.json``; a cached run whose saved
    config no longer holds what the spec gives is set aside and run again)."""
    tag = f"{name}-seed{seed}"
    run_dir = out / "runs" / tag / "version_0"
    base = [f"--data.data_dir={spec['data_dir']}", f"--seed_everything={seed}"]
    base += [f"--trainer.max_epochs={spec['epochs']}", *spec.get("args", [])]
    configs = [spec["config"], spec["data_config"]]
    done = cli_runs.cached(run_dir, configs, base + args)
    if done is not None:
        return done
    run_dir, seconds = cli_runs.fit(configs, base + args, out / "runs", tag, threads=1)
    result = {"name": name, "seed": seed, "args": args, **scores(run_dir, spec["epochs"])}
    result["fit_seconds"] = round(seconds, 1)
    (run_dir / "done.json").write_text(json.dumps(result, indent=2))
    return result


def scores(run_dir: Path, cap: int) -> dict:
    """The kept checkpoint's validation AUC and GAUC (``cli_runs.validations``: best by val AUC +
    GAUC, or by val AUC in runs from before), the run's best GAUC, the kept checkpoint's epoch, and
    whether training reached the epoch cap (no early stop)."""
    rows = list(csv.DictReader((run_dir / "metrics.csv").open()))
    val, best = cli_runs.validations(run_dir)
    last_epoch = max(int(float(r["epoch"])) for r in rows if r.get("epoch"))
    return {
        "val_auc": float(best["val/auc"]),
        "val_gauc": float(best["val/gauc"]),
        "best_val_gauc": max(float(r["val/gauc"]) for r in val),
        "peak_epoch": int(float(best["epoch"])) + 1,
        "hit_cap": last_epoch + 1 >= cap and val.index(best) >= len(val) - 2,
        "validations": len(val),
        "run": str(run_dir),
    }


def verdict(rs: list[dict], reference: str) -> str:
    """The change of val AUC + GAUC of each seed's kept checkpoint against the run folder
    ``reference`` names for that seed (``{seed}`` in it), and the rule's verdict on them."""
    changes = []
    for r in rs:
        kept = cli_runs.validations(reference_run(reference, r["seed"]))[1]
        changes.append(r["val_auc"] + r["val_gauc"] - float(kept["val/auc"]) - float(kept["val/gauc"]))
    passes = statistics.mean(changes) > 0 and min(changes) >= RULE_FLOOR
    word = "passes" if passes else "fails"
    if len(changes) < RULE_SEEDS and min(changes) >= RULE_FLOOR:
        word += f" so far ({len(changes)} of the rule's {RULE_SEEDS} seeds)"
    return f"{' / '.join(f'{c:+.4f}' for c in changes)}: {word}"


def table(results: list[dict], names: list[str], reference: str | None = None) -> str:
    head = "| variant | seeds | val AUC | val GAUC (kept checkpoint) | best val GAUC | peak epoch | hit cap |"
    head += " change of AUC + GAUC per seed |" if reference else ""
    lines = [head, "|" + " --- |" * head.count(" |")]
    for name in names:
        rs = sorted((r for r in results if r["name"] == name), key=lambda r: r["seed"])
        if not rs:
            continue
        mean = lambda k: statistics.mean(r[k] for r in rs)  # noqa: B023
        lines.append(
            f"| {name} | {len(rs)} | {mean('val_auc'):.4f} | {mean('val_gauc'):.4f} | "
            f"{mean('best_val_gauc'):.4f} | {', '.join(str(r['peak_epoch']) for r in rs)} | "
            f"{sum(r['hit_cap'] for r in rs)}/{len(rs)} |"
            + (f" {verdict(rs, reference)} |" if reference else "")
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--spec", type=Path, default=ROOT / "configs" / "quality" / "levers.yaml")
    p.add_argument("--only", nargs="+", default=None, help="variant names (default: all)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--jobs", type=int, default=2, help="fits at a time, one torch thread each")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "levers")
    p.add_argument(
        "--reference",
        default=None,
        help="run folder of the reference per seed, {seed} in it: adds each variant's change and verdict",
    )
    a = p.parse_args()
    spec = yaml.safe_load(a.spec.read_text())
    variants: dict[str, list[str]] = {k: list(v or []) for k, v in spec["variants"].items()}
    unknown = sorted(set(a.only or []) - set(variants))
    if unknown:
        raise SystemExit(f"{a.spec}: no variants {unknown}; it has {sorted(variants)}")
    names = a.only or list(variants)
    for seed in a.seeds if a.reference else []:  # before any fit: a wrong path fails at once
        reference_run(a.reference, seed)
    a.out.mkdir(parents=True, exist_ok=True)
    calls = [(spec, n, variants[n], s, a.out) for s in a.seeds for n in names]
    with cf.ThreadPoolExecutor(max_workers=a.jobs) as pool:
        results = [f.result() for f in [pool.submit(run_variant, *c) for c in calls]]
    path = a.out / "levers.json"
    old = json.loads(path.read_text()) if path.is_file() else []
    merged = {(r["name"], r["seed"]): r for r in [*old, *results]}
    path.write_text(json.dumps(list(merged.values()), indent=2))
    print(table(list(merged.values()), names, a.reference))


if __name__ == "__main__":
    main()
