"""Where one model's AUC lead over another comes from: AUC by quartile of each dense feature, on
validation and test side by side.

    python bench/segment_auc.py                                  # transformer vs din, seeds 0-2
    python bench/segment_auc.py --models transformer deepfm --seeds 0

Each model's score of a row is the mean of its seeds' logits (quality.py's chosen runs, each
seed's kept checkpoint); the rows of a split are cut at the quartiles of each dense column of the
spec, and each cut's AUC is printed for both models with the difference. A lead on validation that
shrinks on test in some cuts and not others says which rows the split's drift moves.

Measured 2026-12-07 (the seventh table's runs, seeds 0-2): the Transformer's seed-mean AUC leads
DIN's by 0.0064 on validation (0.8197 against 0.8132) and 0.0013 on test (0.8174 against 0.8161).
On validation it leads in every quartile of every feature but the lightest users' (-0.0002). On
test it falls behind in the two middle quartiles of the user's prior positive rate (-0.0043,
-0.0075), where a user's level says least and the item's appeal to them most, and keeps its lead
on the users of the extreme rates (+0.0129, +0.0142); by release date it keeps it on the newest
movies (+0.0136) and falls behind on the other three quartiles (-0.0015, -0.0008, -0.0027).
The tenth table's runs (embedding L2 3e-4 for both) say the same: +0.0061 on validation (0.8193
against 0.8132), +0.0014 on test (0.8186 against 0.8171); on test -0.0099 and -0.0088 in the middle
quartiles of the user's prior positive rate (+0.0077 and +0.0051 on validation), +0.0152 and
+0.0185 at the extremes.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch
from request_gauc import load_rows, run_checkpoints, scores

from recformer.evaluate import load_module
from recformer.metrics.exact import exact_auc

ROOT = Path(__file__).resolve().parents[1]


def seed_mean_scores(runs: Path, model: str, seeds: list[int], batch) -> np.ndarray:
    """The mean over ``seeds`` of ``model``'s logits of every row of ``batch``."""
    ckpts = run_checkpoints(runs, [model], seeds)
    return np.mean([scores(load_module(ckpt), batch) for _, ckpt in ckpts], axis=0)


def auc(s: np.ndarray, y: np.ndarray) -> float:
    """AUC, or nan where the rows hold one class only."""
    return exact_auc(s, y) if 0 < y.mean() < 1 else float("nan")


def segments(split: str, names: list[str], dense: np.ndarray, y: np.ndarray, s: dict) -> list[str]:
    """Markdown rows: each dense column's quartile cuts with both models' AUC and the difference."""
    sa, sb = s.values()

    def row(label: str, m: np.ndarray) -> str:
        a, b = auc(sa[m], y[m]), auc(sb[m], y[m])
        return f"| {split} | {label} | {m.sum()} | {a:.4f} | {b:.4f} | {a - b:+.4f} |"

    rows = [row("all", np.ones(len(y), dtype=bool))]
    for j, name in enumerate(names):
        x = dense[:, j]
        edges = np.quantile(x, [0, 0.25, 0.5, 0.75, 1])
        for q, (lo, hi) in enumerate(zip(edges[:-1], edges[1:])):
            m = (x >= lo) & ((x < hi) if q < 3 else (x <= hi))
            rows.append(row(f"{name} Q{q + 1} [{lo:.2f}, {hi:.2f}]", m))
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, default=ROOT / "data" / "movielens")
    p.add_argument("--runs", type=Path, default=ROOT / "bench" / "out" / "quality" / "runs")
    p.add_argument("--models", nargs=2, default=["transformer", "din"], metavar=("A", "B"))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    a = p.parse_args()
    torch.set_num_threads(2)
    m1, m2 = a.models
    print(f"| split | rows (dense column quartile, standardised) | n | {m1} | {m2} | {m1} - {m2} |")
    print("| --- | --- | --- | --- | --- | --- |")
    for split in ("val", "test"):
        batch, dm = load_rows(a.data, split)
        names = [d.name for d in dm.spec.dense]
        s = {m: seed_mean_scores(a.runs, m, a.seeds, batch) for m in a.models}
        rows = segments(split, names, batch.dense.numpy(), batch.label.numpy(), s)
        print("\n".join(rows), flush=True)


if __name__ == "__main__":
    main()
