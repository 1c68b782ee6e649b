"""``recformer evaluate --ckpt CKPT --data DIR``: exact offline metrics over Parquet of any size.

Streams the split through the checkpoint's model (no Trainer needed) into a ``StreamingEvaluator``:
exact AUC with its 95% DeLong interval, GAUC, logloss, NE, calibration and a calibration table, in
bounded memory (rows beyond ``--max-rows-in-memory`` spill to disk by group; see
``recformer.metrics.StreamingEvaluator``). Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from recformer.data.datamodule import RecDataModule
from recformer.data.schema import DataError
from recformer.metrics import StreamingEvaluator, delong_paired


def load_module(ckpt: str | Path, device: str = "cpu"):
    from recformer.module import RankerModule

    path = Path(ckpt)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    module = RankerModule.load_from_checkpoint(path, map_location=device, weights_only=True)
    return module.eval()


@torch.no_grad()
def evaluate(
    ckpt: str | Path,
    data: str | Path,
    split: str = "test",
    batch_size: int = 4096,
    num_workers: int = 1,
    device: str = "cpu",
    max_rows_in_memory: int = 20_000_000,
    compare: str | Path | None = None,
) -> dict[str, Any]:
    """Metrics of ``ckpt`` on ``split``; with ``compare``, also the paired DeLong test of
    AUC(ckpt) - AUC(compare) on the same rows (needs the rows in memory)."""
    module = load_module(ckpt, device)
    other = load_module(compare, device) if compare is not None else None
    if other is not None and other.dims != module.dims:
        raise DataError(f"{compare} was trained on other features than {ckpt}: {other.dims} vs {module.dims}")
    dm = RecDataModule(
        str(data), eval_batch_size=batch_size, num_workers=num_workers, validate="footer", predict_split=split
    )
    if dm.feature_dims != module.dims:
        raise DataError(
            f"the feature spec of {data} does not match the checkpoint's: data {dm.feature_dims} vs "
            f"checkpoint {module.dims}"
        )
    dm.setup("predict")
    start = time.perf_counter()
    paired: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    with StreamingEvaluator(max_rows_in_memory=max_rows_in_memory) as ev:
        for batch in dm.predict_dataloader():
            batch = batch.to(device)
            logits = module.net(batch).float()
            if other is not None:
                paired.append(
                    (logits.cpu().numpy(), other.net(batch).float().cpu().numpy(), batch.label.cpu().numpy())
                )
                if ev.rows > max_rows_in_memory:
                    raise ValueError(
                        f"--compare keeps every score in memory; {split} has more than "
                        f"--max-rows-in-memory={max_rows_in_memory} rows"
                    )
            ev.update(
                logits.cpu().numpy(),
                batch.label.cpu().numpy(),
                batch.weight.cpu().numpy(),
                batch.group.cpu().numpy(),
            )
        result = ev.compute().to_dict()
    if other is not None:
        a, b, y = (np.concatenate(c) for c in zip(*paired))
        result["compare"] = {"checkpoint": str(compare), "arch": other.arch, **delong_paired(a, b, y)}
    result.update(
        checkpoint=str(ckpt),
        data=str(data),
        split=split,
        arch=module.arch,
        seconds=round(time.perf_counter() - start, 2),
    )
    return result


def format_table(r: dict[str, Any]) -> str:
    def f(x: float) -> str:
        return "nan" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.4f}"

    ci = f"[{f(r['auc_lo'])}, {f(r['auc_hi'])}]" if r["auc_exact"] else "(binned: no CI)"
    lines = [
        f"split {r['split']} of {r['data']}: {r['rows']} rows, base rate {f(r['base_rate'])}",
        f"  AUC          {f(r['auc'])}  95% CI {ci}",
        f"  GAUC         {f(r['gauc'])}  over {r['gauc_groups']} groups",
        f"  logloss      {f(r['logloss'])}",
        f"  NE           {f(r['ne'])}",
        f"  calibration  {f(r['calibration'])}  (mean prediction / mean label)",
        "  calibration table (bin: mean prediction vs observed):",
    ]
    if "compare" in r:
        c = r["compare"]
        lines.append(
            f"  AUC minus that of {c['checkpoint']} ({c['arch']}): {c['diff']:+.4f} "
            f"95% CI [{c['lo']:+.4f}, {c['hi']:+.4f}], p = {c['p_value']:.2g} (paired DeLong)"
        )
    for row in r["calibration_table"]:
        pred, obs, n = row["mean_pred"], row["mean_label"], int(row["rows"])
        lines.append(f"    {int(row['bin']):>3}  {pred:.3f}  {obs:.3f}  ({n} rows)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="recformer evaluate", description=__doc__.splitlines()[0])
    p.add_argument("--ckpt", required=True, help="checkpoint (.ckpt) written by recformer fit")
    p.add_argument("--data", required=True, help="data directory with spec.yaml and the split folder")
    p.add_argument("--split", default="test")
    p.add_argument("--out", default=None, help="JSON output (default: <ckpt dir>/eval-<split>.json)")
    p.add_argument("--batch-size", type=int, default=4096)
    p.add_argument("--num-workers", type=int, default=1)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--max-rows-in-memory", type=int, default=20_000_000)
    p.add_argument(
        "--compare", default=None, help="a second checkpoint: paired DeLong test of the AUC difference"
    )
    a = p.parse_args(argv)
    try:
        r = evaluate(
            a.ckpt, a.data, a.split, a.batch_size, a.num_workers, a.device, a.max_rows_in_memory, a.compare
        )
    except (DataError, FileNotFoundError, ValueError) as e:
        print(f"recformer evaluate: {e}", file=sys.stderr)
        return 2
    out = Path(a.out) if a.out else Path(a.ckpt).parent / f"eval-{a.split}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(r, indent=2, default=float))
    print(format_table(r))
    print(f"wrote {out}")
    return 0
