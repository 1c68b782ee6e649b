"""How much within-user (GAUC) signal the MovieLens split holds for a collaborative model, and
how far the checkpoints of ``bench/quality.py`` are from it.

    python bench/gauc_headroom.py                              # the matrix factorisations (2 min)
    python bench/gauc_headroom.py --mix transformer-lr0.0003-embedding_decay0.0-seed0  # a run of quality.py

1. Logistic matrix factorisation on the train split's (user, item, label) triples alone:
   logit = b + b_user + b_item + <p_user, q_item> (Koren et al. 2009, with the log loss), rank
   ``--factors`` (0 = the biases alone), L2 on the rows a batch touches, Adam. Each epoch's
   validation GAUC is printed; the epoch with the best validation GAUC is scored on test. The item
   prior rate feature of the data (``item_pos_rate_prior``) is scored alike, as a floor.
2. The mean rating of the last k history events (``--history-ratings``, when the data has it) as
   a score: how much of it separates users (AUC) and how much orders one user's items (GAUC).
3. ``--mix RUN``: validation AUC and GAUC of the best checkpoint of ``RUN`` (a run folder under
   ``--runs``) with a multiple of another model's logit added (popularity, DeepFM): if a mix gains
   GAUC, that model knows within-user order the run does not. For the run and each other model,
   also how much its scores within a user follow the recent ratings (the correlation of the
   per-user-centred logit with the centred mean of the last 5 history ratings), and its GAUC with
   that part removed (the least-squares fit on the centred last-5 and last-50 means subtracted).

GAUC is per user, weighted by rows, over users with both labels (``recformer.metrics.exact.gauc``).

Measured 2026-12-02 (2 CPU cores, the shipped MovieLens split, quality.py's seed-0 runs):

- item prior feature: test GAUC 0.6353; biases alone: 0.6435; rank 32: 0.6483 (popularity 0.6438);
- user prior feature (2026-12-03): val AUC 0.7305, GAUC 0.3744; test 0.7196, 0.3818 (within a
  user it follows the labels of the user's earlier rows of the split: ``bench/request_gauc.py``);
- last-5 rating mean: val AUC 0.740, GAUC 0.497; last 50: 0.750, 0.441;
- within-user correlation of the logits with the last-5 mean: BST 0.367, Transformer 0.349,
  DIN 0.214, DeepFM 0.137, popularity 0.056; the Transformer's GAUC without that part: 0.6426 ->
  0.6521; with DeepFM's logit added: 0.6588, with popularity's (x2): 0.6459.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch

from recformer.config import FeatureSpec
from recformer.metrics.exact import exact_auc, gauc

ROOT = Path(__file__).resolve().parents[1]
PRIOR = "item_pos_rate_prior"
"""The item's positive rate before the row, a column ``recformer data movielens`` writes."""
USER_PRIOR = "user_pos_rate_prior"
"""The user's positive rate before the row (``recformer data movielens``): it separates users and,
within one user's rows of a split, follows the labels of that user's earlier rows of the split."""


def load(data: Path, split: str) -> dict[str, np.ndarray]:
    """The split's group (user), item and label columns as the spec names them, and the item
    prior when the data has it."""
    spec = FeatureSpec.load(data / "spec.yaml")
    if spec.group is None:
        raise SystemExit(f"{data / 'spec.yaml'}: GAUC needs a group column (group: user_id)")
    names = {"user_id": spec.group, "item_id": spec.item.column, "label": spec.label}
    for column in (PRIOR, USER_PRIOR):
        if column in pq.ParquetDataset(data / split).schema.names:
            names[column] = column
    t = pq.read_table(data / split, columns=list(names.values()))
    return {k: t[c].to_numpy() for k, c in names.items()}


def factorise(data: Path, factors: int, l2: float, epochs: int, seed: int) -> dict[str, float]:
    """Train the factorisation; its best-validation-GAUC epoch, with that epoch's test scores."""
    splits = {s: load(data, s) for s in ("train", "val", "test")}
    # Raw or vocabulary ids alike: rows are each id's rank among the ids of every split.
    users = np.unique(np.concatenate([d["user_id"] for d in splits.values()]))
    items = np.unique(np.concatenate([d["item_id"] for d in splits.values()]))
    n_items = len(items)
    u = {s: torch.from_numpy(np.searchsorted(users, d["user_id"])) for s, d in splits.items()}
    i = {s: torch.from_numpy(np.searchsorted(items, d["item_id"])) for s, d in splits.items()}
    y = torch.from_numpy(splits["train"]["label"].astype(np.float32))
    torch.manual_seed(seed)
    k = max(factors, 1)
    bu, bi = torch.zeros(len(users), requires_grad=True), torch.zeros(n_items, requires_grad=True)
    pu = (0.01 * torch.randn(len(users), k)).requires_grad_(factors > 0)
    qi = (0.01 * torch.randn(n_items, k)).requires_grad_(factors > 0)
    b = torch.zeros((), requires_grad=True)
    params = [b, bu, bi] + ([pu, qi] if factors else [])
    opt = torch.optim.Adam(params, lr=3e-3)

    def score(uu: torch.Tensor, ii: torch.Tensor) -> torch.Tensor:
        s = b + bu[uu] + bi[ii]
        return s + (pu[uu] * qi[ii]).sum(-1) if factors else s

    def metrics(split: str) -> tuple[float, float]:
        with torch.no_grad():
            s = score(u[split], i[split]).numpy()
        d = splits[split]
        return exact_auc(s, d["label"]), gauc(d["user_id"], s, d["label"])[0]

    best = {"val_gauc": -1.0}
    for epoch in range(epochs):
        for batch in torch.randperm(len(y)).split(512):
            ub, ib = u["train"][batch], i["train"][batch]
            loss = torch.nn.functional.binary_cross_entropy_with_logits(score(ub, ib), y[batch])
            rows = [bu[ub], bi[ib]] + ([pu[ub], qi[ib]] if factors else [])
            loss = loss + l2 * sum(r.square().sum() for r in rows) / len(batch)
            opt.zero_grad()
            loss.backward()
            opt.step()
        val_auc, val_gauc = metrics("val")
        print(f"  factors {factors} epoch {epoch}: val AUC {val_auc:.4f} GAUC {val_gauc:.4f}", flush=True)
        if val_gauc > best["val_gauc"]:
            test_auc, test_gauc = metrics("test")
            best = {
                "epoch": epoch,
                "val_auc": val_auc,
                "val_gauc": val_gauc,
                "test_auc": test_auc,
                "test_gauc": test_gauc,
            }
    return best


@torch.no_grad()
def logits_of(ckpt: Path, data: Path, split: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A checkpoint's logits on ``split`` with its labels and groups, in the split's row order."""
    from recformer.data.datamodule import RecDataModule
    from recformer.evaluate import load_module

    module = load_module(ckpt)
    dm = RecDataModule(str(data), eval_batch_size=4096, num_workers=0, validate="footer", predict_split=split)
    dm.setup("predict")
    out = [
        (module.ranker(b.to("cpu")).float().numpy(), b.label.numpy(), b.group.numpy())
        for b in dm.predict_dataloader()
    ]
    return tuple(np.concatenate(col) for col in zip(*out))


def recent_means(data: Path, split: str, column: str, ks: tuple[int, ...]) -> dict[int, np.ndarray] | None:
    """Per row, the mean of the last k values of the list column ``column`` (0 for an empty
    history); None when the split has no such column."""
    if column not in pq.ParquetDataset(data / split).schema.names:
        return None
    lists = pq.read_table(data / split, columns=[column])[column].combine_chunks()
    offsets, values = lists.offsets.to_numpy(), lists.flatten().to_numpy().astype(np.float64)
    csum = np.concatenate([[0.0], np.cumsum(values)])
    out = {}
    for k in ks:
        lo = np.maximum(offsets[1:] - k, offsets[:-1])
        n = offsets[1:] - lo
        out[k] = np.where(n > 0, (csum[offsets[1:]] - csum[lo]) / np.maximum(n, 1), 0.0)
    return out


def centred(x: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """``x`` minus its group's mean."""
    _, inv = np.unique(groups, return_inverse=True)
    return x - (np.bincount(inv, x) / np.bincount(inv))[inv]


def recency_part(s: np.ndarray, g: np.ndarray, y: np.ndarray, recent: dict[int, np.ndarray]) -> str:
    """How much of a model's within-user scores follows the recent ratings, and its GAUC without it."""
    cs = centred(s, g)
    X = np.stack([centred(recent[5], g), centred(recent[50], g)], 1)
    coef, *_ = np.linalg.lstsq(X, cs, rcond=None)
    corr = np.corrcoef(cs, X[:, 0])[0, 1]
    without = gauc(g, cs - X @ coef, y)[0]
    return f"within-user corr with the last-5 mean {corr:.3f}; GAUC without that part {without:.4f}"


def best_checkpoint(run: Path) -> Path:
    (ckpt,) = [p for p in (run / "version_0" / "checkpoints").glob("epoch*.ckpt")]
    return ckpt


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, default=ROOT / "data" / "movielens")
    p.add_argument("--factors", type=int, nargs="+", default=[0, 32])
    p.add_argument("--l2", type=float, default=3e-4)
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--runs", type=Path, default=ROOT / "bench" / "out" / "quality" / "runs")
    p.add_argument("--mix", default=None, help="a run folder name under --runs")
    p.add_argument("--split", default="val", choices=["val", "test"], help="the split --mix scores")
    p.add_argument(
        "--with",
        dest="others",
        nargs="+",
        default=["popularity-lr0.001-embedding_decay1.0-seed0", "deepfm-lr0.001-embedding_decay0.0-seed0"],
    )
    p.add_argument("--history-ratings", default="hist_ratings", help="list column of history ratings")
    a = p.parse_args()
    torch.set_num_threads(2)
    if a.mix:
        s, y, g = logits_of(best_checkpoint(a.runs / a.mix), a.data, a.split)
        rows = load(a.data, a.split)
        if not (np.array_equal(rows["label"], y) and np.array_equal(rows["user_id"], g)):
            raise SystemExit(f"{a.data / a.split}: the loader's row order is not the files' order")
        recent = recent_means(a.data, a.split, a.history_ratings, (5, 50))
        print(f"{a.mix}: {a.split} AUC {exact_auc(s, y):.4f} GAUC {gauc(g, s, y)[0]:.4f}")
        if recent:
            print(f"  {recency_part(s, g, y, recent)}")
        for other in a.others:
            o, _, _ = logits_of(best_checkpoint(a.runs / other), a.data, a.split)
            print(f"{other}: {a.split} AUC {exact_auc(o, y):.4f} GAUC {gauc(g, o, y)[0]:.4f}")
            if recent:
                print(f"  {recency_part(o, g, y, recent)}")
            for w in (0.5, 1.0, 2.0):
                m = s + w * o
                auc, g_auc = exact_auc(m, y), gauc(g, m, y)[0]
                print(f"  run + {w:g} x its logit: {a.split} AUC {auc:.4f} GAUC {g_auc:.4f}")
        return
    evaluated = {split: load(a.data, split) for split in ("val", "test")}
    for split, d in evaluated.items():
        recent = recent_means(a.data, split, a.history_ratings, (1, 5, 50))
        for k, r in (recent or {}).items():
            print(
                f"mean of the last {k} history ratings: {split} AUC {exact_auc(r, d['label']):.4f} "
                f"GAUC {gauc(d['user_id'], r, d['label'])[0]:.4f}"
            )
    for name, d in evaluated.items():
        for column, what in ((PRIOR, "item"), (USER_PRIOR, "user")):
            if column in d:
                auc, g = exact_auc(d[column], d["label"]), gauc(d["user_id"], d[column], d["label"])[0]
                print(f"{what} prior rate feature: {name} AUC {auc:.4f} GAUC {g:.4f}")
    for k in a.factors:
        best = factorise(a.data, k, a.l2, a.epochs, a.seed)
        print(
            f"factors {k}: chosen epoch {best['epoch']} (best val GAUC {best['val_gauc']:.4f}, val AUC "
            f"{best['val_auc']:.4f}): test AUC {best['test_auc']:.4f} GAUC {best['test_gauc']:.4f}"
        )


if __name__ == "__main__":
    main()
