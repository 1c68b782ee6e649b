"""``recformer lab coord-check``: the muP coordinate check (``recformer.model.coord_check``) as a lab
experiment: rankers of each width trained a few Adam steps on one batch of real data, under the
standard parametrization and under muP, and the activation RMS of every layer plotted against
width. Under muP the curves stay flat with width; under SP they grow (Yang et al. 2022, Fig. 5)."""

from __future__ import annotations

import csv
import dataclasses
from pathlib import Path

from recformer.config import RankerConfig


def run_coord_check(data: Path, widths: list[int], steps: int, lr: float, out: Path) -> list[Path]:
    from recformer.data.datamodule import RecDataModule
    from recformer.model.coord_check import coord_check
    from recformer.model.ranker import Ranker

    dm = RecDataModule(str(data), batch_size=256, num_workers=0, shuffle=False)
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader())).to("cpu")
    tables = dm.item_tables()
    base = RankerConfig(n_layers=2, dropout=0.0, base_d_model=widths[0])
    rows = []
    for mup in (False, True):

        def make(width: int, mup: bool = mup) -> Ranker:
            cfg = dataclasses.replace(base, d_model=width, n_heads=max(1, width // 16), mup=mup)
            model = Ranker(cfg, dm.feature_dims)
            model.set_item_tables(*tables)
            return model

        result = coord_check(make, batch, widths, steps=steps, lr=lr)
        for width, rms in result.items():
            for layer, value in enumerate(rms[-1].tolist()):  # after the last step
                rows.append({"param": "muP" if mup else "SP", "width": width, "layer": layer, "rms": value})
    out.mkdir(parents=True, exist_ok=True)
    table = out / "coord_check.csv"
    with table.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=["param", "width", "layer", "rms"])
        w.writeheader()
        w.writerows(rows)
    return [table, _plot(rows, widths, steps, out / "coord_check.png")]


def coord_table(table: Path, steps: int) -> str:
    """``coord_check.csv`` as the terminal shows it: per parametrization, a row per layer and a
    column per width, the activation RMS after the last step, and the largest width's RMS over the
    smallest's (about 1 under muP; growing with width under SP)."""
    with table.open() as fh:
        rows = [
            {**r, "width": int(r["width"]), "layer": int(r["layer"]), "rms": float(r["rms"])}
            for r in csv.DictReader(fh)
        ]
    widths = sorted({r["width"] for r in rows})
    n_layers = max(r["layer"] for r in rows) + 1
    names = _layer_names(n_layers)
    lines = [
        f"activation RMS after {steps} Adam steps, by width (d_model); ratio: the largest width's "
        "over the smallest's (muP keeps it near 1)"
    ]
    for param in ("SP", "muP"):
        rms = {(r["layer"], r["width"]): r["rms"] for r in rows if r["param"] == param}
        lines.append(f"{param:8s}" + "".join(f"{w:>10d}" for w in widths) + f"{'ratio':>10s}")
        for layer in range(n_layers):
            values = [rms[layer, w] for w in widths]
            ratio = values[-1] / values[0] if values[0] else float("inf")
            lines.append(f"  {names[layer]:6s}" + "".join(f"{v:10.3g}" for v in values) + f"{ratio:10.2f}")
    return "\n".join(lines)


def _layer_names(n_layers: int) -> list[str]:
    return ["tokens"] + [f"block {i}" for i in range(n_layers - 2)] + ["logits"]


def _plot(rows: list[dict], widths: list[int], steps: int, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n_layers = max(r["layer"] for r in rows) + 1
    names = _layer_names(n_layers)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, param in zip(axes, ("SP", "muP")):
        for layer in range(n_layers):
            rms = {r["width"]: r["rms"] for r in rows if r["param"] == param and r["layer"] == layer}
            ys = [rms[w] for w in widths]
            ax.plot(widths, ys, marker="o", label=names[layer])
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("width (d_model)")
        ax.set_title(f"{param}: activation RMS after {steps} Adam steps")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("activation RMS")
    axes[1].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
