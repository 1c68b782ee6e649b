"""Offline quality on the MovieLens temporal split: the Transformer against two baselines, 3 seeds.

    python bench/quality.py                       # transformer, din, popularity x seeds 0 1 2
    python bench/quality.py --archs transformer --seeds 0 --epochs 1

Every run goes through the same CLI a user runs (``recformer fit`` then ``recformer evaluate`` on
the best validation checkpoint), with configs/model/small.yaml and configs/data/movielens.yaml.
Prints a table of test AUC (with its DeLong 95% interval), GAUC and logloss per run, and the mean
and spread over seeds per architecture; writes everything as JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(cmd: list[str]) -> str:
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-4000:]}")
    return proc.stdout


def fit_and_evaluate(
    arch: str,
    seed: int,
    epochs: int,
    out: Path,
    extra: list[str],
    model: str = "configs/model/small.yaml",
    data: str = "configs/data/movielens.yaml",
    data_dir: str = "data/movielens",
    name: str | None = None,
) -> dict:
    """``recformer fit`` then ``recformer evaluate`` on the best validation checkpoint (test split)."""
    name = name or f"{arch}-seed{seed}"
    logs = out / "runs"
    loggers = out / f"{name}-loggers.yaml"
    loggers.write_text(
        "trainer:\n  logger:\n"
        "    - class_path: lightning.pytorch.loggers.CSVLogger\n"
        f"      init_args: {{save_dir: {logs}, name: {name}}}\n"
    )
    start = time.perf_counter()
    run(
        [
            sys.executable,
            "-m",
            "recformer",
            "fit",
            "--config",
            model,
            "--config",
            data,
            "--config",
            str(loggers),
            f"--data.data_dir={data_dir}",
            f"--seed_everything={seed}",
            f"--data.seed={seed}",
            f"--model.arch={arch}",
            f"--trainer.max_epochs={epochs}",
            "--trainer.enable_progress_bar=false",
            *extra,
        ]
    )
    fit_s = time.perf_counter() - start
    run_dir = max((logs / name).glob("version_*"), key=lambda p: p.stat().st_mtime)
    best = [p for p in (run_dir / "checkpoints").glob("*.ckpt") if p.name != "last.ckpt"]
    if len(best) != 1:
        raise RuntimeError(f"expected one best checkpoint in {run_dir / 'checkpoints'}, found {best}")
    result_path = run_dir / "eval-test.json"
    run(
        [
            sys.executable,
            "-m",
            "recformer",
            "evaluate",
            "--ckpt",
            str(best[0]),
            "--data",
            data_dir,
            "--out",
            str(result_path),
        ]
    )
    r = json.loads(result_path.read_text())
    return {
        "arch": arch,
        "seed": seed,
        "fit_seconds": round(fit_s, 1),
        "checkpoint": str(best[0]),
        **{
            k: r[k]
            for k in (
                "auc",
                "auc_lo",
                "auc_hi",
                "gauc",
                "gauc_groups",
                "logloss",
                "ne",
                "calibration",
                "rows",
            )
        },
    }


def paired_test(ckpt: str, other: str, data_dir: str, path: Path) -> dict:
    """Paired DeLong test of AUC(ckpt) - AUC(other) on the same test rows (``evaluate --compare``)."""
    run(
        [sys.executable, "-m", "recformer", "evaluate", "--ckpt", ckpt, "--compare", other]
        + ["--data", data_dir, "--out", str(path)]
    )
    return json.loads(path.read_text())["compare"]


def paired_tests(results: list[dict], out: Path, reference: str = "transformer") -> list[dict]:
    """Paired DeLong test of AUC(reference) - AUC(baseline) on the same test rows, per seed."""
    rows = []
    for r in results:
        if r["arch"] == reference:
            continue
        ref = next(x for x in results if x["arch"] == reference and x["seed"] == r["seed"])
        path = out / f"paired-{reference}-vs-{r['arch']}-seed{r['seed']}.json"
        c = paired_test(ref["checkpoint"], r["checkpoint"], "data/movielens", path)
        rows.append({"seed": r["seed"], "baseline": r["arch"], **c})
        print(
            f"{reference} - {r['arch']:11s} seed {r['seed']}: AUC diff {c['diff']:+.4f} "
            f"[{c['lo']:+.4f}, {c['hi']:+.4f}]  p = {c['p_value']:.2g}",
            flush=True,
        )
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--archs", nargs="+", default=["transformer", "din", "popularity"])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "quality")
    p.add_argument("--paired-only", action="store_true", help="only the paired tests, on results.json")
    p.add_argument("extra", nargs="*", help="more CLI overrides, after --")
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    if a.paired_only:
        results = json.loads((a.out / "results.json").read_text())
        (a.out / "paired.json").write_text(json.dumps(paired_tests(results, a.out), indent=2))
        return
    # Always rebuilt (deterministic, ~2 s): a folder left by older code would be measured instead.
    run([sys.executable, "-m", "recformer", "data", "movielens", "--out", "data/movielens"])
    results = []
    for seed in a.seeds:
        for arch in a.archs:
            r = fit_and_evaluate(arch, seed, a.epochs, a.out, a.extra)
            results.append(r)
            print(
                f"{arch:12s} seed {seed}: AUC {r['auc']:.4f} [{r['auc_lo']:.4f}, {r['auc_hi']:.4f}]  "
                f"GAUC {r['gauc']:.4f}  logloss {r['logloss']:.4f}  ({r['fit_seconds']:.0f} s)",
                flush=True,
            )
            (a.out / "results.json").write_text(json.dumps(results, indent=2))
    header = ["AUC mean", "sd", "CI half-width", "GAUC mean", "logloss"]
    print(f"\n{'arch':12s} " + " ".join(f"{h:>9s}" for h in header))
    for arch in a.archs:
        rs = [r for r in results if r["arch"] == arch]
        aucs = [r["auc"] for r in rs]
        sd = statistics.stdev(aucs) if len(aucs) > 1 else float("nan")
        half = statistics.mean((r["auc_hi"] - r["auc_lo"]) / 2 for r in rs)
        print(
            f"{arch:12s} {statistics.mean(aucs):9.4f} {sd:7.4f} {half:14.4f} "
            f"{statistics.mean(r['gauc'] for r in rs):10.4f} {statistics.mean(r['logloss'] for r in rs):8.4f}"
        )

    if "transformer" in a.archs and len(a.archs) > 1:
        print()
        (a.out / "paired.json").write_text(json.dumps(paired_tests(results, a.out), indent=2))


if __name__ == "__main__":
    main()
