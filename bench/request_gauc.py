"""Within-user order at one request: GAUC with each user's request side held fixed.

    python bench/request_gauc.py                                   # quality.py's chosen seed-0 runs
    python bench/request_gauc.py --runs-of transformer deepfm --seeds 0 1 2 --split test

GAUC as the project reports it (``recformer.metrics.exact.gauc``) ranks a user's rows across the
split's weeks: each row is scored with its own moment's request side, the user's history and priors
as they stood just before it. Those change inside the window by the user's earlier rows of the same
window, and within a finite group a row's label is negatively tied to the others' labels (a user
who liked the first rows of the window shows a higher prior rate on the later ones, which they like
less often on average): on MovieLens the user prior rate feature orders its own user's validation
rows at a GAUC of 0.374 while separating users at an AUC of 0.731. A model that reads the recent
history scores rows of one user apart by it, which lowers GAUC while it raises AUC.

A ranker at serving time orders the candidates of one request, which share one request side. This
script measures that order: each user's rows are scored with the request side (every context
categorical, the ``--request-dense`` dense columns, the per-row embeddings, the history) copied
from the user's first row of the split, so only the item side (target item, its features, the
other dense columns) differs between them; the per-user AUC, weighted by rows, is the request GAUC.
The first row is the earliest by the spec's time key, or the first in file order without one.

Measured 2026-12-03 (2 CPU cores; quality.py's chosen runs, each seed's kept checkpoint; means over
seeds 0-2, GAUC -> request GAUC): validation Transformer 0.6540 -> 0.6619, DIN 0.6567 -> 0.6681,
DeepFM 0.6713 -> 0.6735, DCN-V2 0.6780 -> 0.6797, BST 0.6283 -> 0.6503, popularity 0.6536 (reads no
request side); test Transformer 0.6583 -> 0.6632, DIN 0.6592 -> 0.6647, DeepFM 0.6729 -> 0.6786,
DCN-V2 0.6658 -> 0.6741, BST 0.6247 -> 0.6558, popularity 0.6434. The models that read each history
event gain the most, but at one request the Transformer still orders one user's items below DeepFM
and DCN-V2. docs/levers.md ("Within-user order at one request").
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import numpy as np
import torch

from recformer.metrics.exact import exact_auc, gauc

ROOT = Path(__file__).resolve().parents[1]
REQUEST_ROW_FIELDS = ("cat", "emb", "bag", "hist_item", "hist_cat", "hist_gap", "hist_mask")
"""Batch fields that are the request's (the user's context and history), not the candidate's."""


def load_rows(data: Path, split: str):
    """Every row of ``split`` as one Batch, in the loader's order."""
    from recformer.data.datamodule import RecDataModule

    dm = RecDataModule(str(data), eval_batch_size=4096, num_workers=0, validate="footer", predict_split=split)
    dm.setup("predict")
    batches = [b.to("cpu") for b in dm.predict_dataloader()]
    joined = {k: torch.cat([tensors(b)[k] for b in batches]) for k in tensors(batches[0]) if k != "oov"}
    return dataclasses.replace(batches[0], **joined), dm


def anchors(batch, time_key: int | None) -> np.ndarray:
    """Per row, the index of its user's first row (earliest time, then file order)."""
    g = batch.group.numpy()
    t = batch.keys[:, time_key].numpy() if time_key is not None else np.zeros(len(g))
    order = np.lexsort((np.arange(len(g)), t, g))  # by user, then time, then position
    first = np.empty(len(g), np.int64)
    starts = np.r_[True, g[order][1:] != g[order][:-1]]
    first[order] = order[np.maximum.accumulate(np.where(starts, np.arange(len(g)), 0))]
    return first


def at_request(batch, first: np.ndarray, dense_cols: list[int]):
    """``batch`` with every row's request side replaced by its user's first row's."""
    idx = torch.from_numpy(first)
    changes = {f: getattr(batch, f)[idx] for f in REQUEST_ROW_FIELDS if getattr(batch, f) is not None}
    dense = batch.dense.clone()
    dense[:, dense_cols] = batch.dense[idx][:, dense_cols]
    return dataclasses.replace(batch, dense=dense, **changes)


def tensors(batch) -> dict[str, torch.Tensor]:
    return {
        f.name: v for f in dataclasses.fields(batch) if isinstance(v := getattr(batch, f.name), torch.Tensor)
    }


@torch.no_grad()
def scores(module, batch, size: int = 4096, part: int | None = None) -> np.ndarray:
    """``module``'s logits of every row of ``batch``, ``size`` rows at a time; with ``part``, only
    that part of ``ranker.forward_parts`` (0: the head's logit, 1: the branch's)."""
    parts = tensors(batch)
    n = len(batch.label)
    chunks = [
        dataclasses.replace(batch, **{k: v[i : i + size] for k, v in parts.items()})
        for i in range(0, n, size)
    ]
    score = module.ranker if part is None else (lambda b: module.ranker.forward_parts(b)[part])
    return torch.cat([score(b) for b in chunks]).float().numpy()


def run_checkpoints(runs: Path, archs: list[str], seeds: list[int]) -> list[tuple[str, Path]]:
    """The kept checkpoint of quality.py's chosen run of each arch and seed."""
    from quality import name_of  # noqa: PLC0415 (bench/ is not a package: its sibling script)

    chosen = json.loads((runs.parent / "chosen.json").read_text())
    out = []
    for arch in archs:
        for seed in seeds:
            done = json.loads(
                (runs / name_of(arch, chosen[arch], seed) / "version_0" / "done.json").read_text()
            )
            out.append((f"{arch} seed {seed}", ROOT / done["checkpoint"]))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, default=ROOT / "data" / "movielens")
    p.add_argument("--split", default="val", choices=["val", "test"])
    p.add_argument("--runs", type=Path, default=ROOT / "bench" / "out" / "quality" / "runs")
    p.add_argument(
        "--runs-of",
        nargs="*",
        default=["transformer", "din", "deepfm", "dcnv2", "bst", "popularity"],
        help="quality.py's chosen runs of these archs (none: the --ckpt files only)",
    )
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--ckpt", type=Path, nargs="*", default=[], help="more checkpoints to score")
    p.add_argument("--request-dense", nargs="*", default=["user_n_prior", "user_pos_rate_prior"])
    p.add_argument("--time-key", default="timestamp", help="the spec's key column that orders rows")
    p.add_argument(
        "--parts",
        action="store_true",
        help="also the head's logit and the branch's alone, for checkpoints with a branch beside the blocks",
    )
    a = p.parse_args()
    torch.set_num_threads(2)
    batch, dm = load_rows(a.data, a.split)
    spec = dm.spec
    names = [d.name for d in spec.dense]
    unknown = sorted(set(a.request_dense) - set(names))
    if unknown:
        raise SystemExit(f"--request-dense {unknown}: not dense columns of {a.data / 'spec.yaml'} ({names})")
    time_key = spec.keys.index(a.time_key) if a.time_key in spec.keys else None
    fixed = at_request(batch, anchors(batch, time_key), [names.index(n) for n in a.request_dense])
    g, y = batch.group.numpy(), batch.label.numpy()
    print(f"{a.split}: {len(y):,} rows; request side: context, history, {a.request_dense}")
    print("| model | AUC | GAUC | request GAUC |\n| --- | --- | --- | --- |")
    runs = run_checkpoints(a.runs, a.runs_of, a.seeds) if a.runs_of else []
    from recformer.evaluate import load_module

    for name, ckpt in runs + [(str(c), c) for c in a.ckpt]:
        module = load_module(ckpt)  # once: it scores the rows as logged and at one request
        parts = [(name, None)]
        if a.parts and getattr(module.ranker, "has_branch", False):
            parts += [(f"{name}: head alone", 0), (f"{name}: branch alone", 1)]
        for label, part in parts:
            s, r = scores(module, batch, part=part), scores(module, fixed, part=part)
            print(
                f"| {label} | {exact_auc(s, y):.4f} | {gauc(g, s, y)[0]:.4f} | {gauc(g, r, y)[0]:.4f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
