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
import os
import pickle
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from recformer.batch import DataError
from recformer.checkpoints import check_checkpoint_path, check_features, unreadable_checkpoint
from recformer.data import storage
from recformer.data.datamodule import RecDataModule
from recformer.metrics import StreamingEvaluator, delong_paired, exact_auc
from recformer.tracking import log_evaluation


def load_module(ckpt: str | Path, device: str = "cpu"):
    from recformer.module import RankerModule

    check_checkpoint_path(ckpt, "checkpoint")
    try:
        module = RankerModule.load_from_checkpoint(ckpt, map_location=device, weights_only=True)
    except (pickle.UnpicklingError, EOFError, OSError, RuntimeError) as e:
        # Only what says the file itself is not a checkpoint (another kind of file, empty,
        # truncated, pickled code); a device or state-dict error keeps its message and traceback.
        said = unreadable_checkpoint(ckpt, e)
        if said is None:
            raise
        raise said from None
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
    if other is not None:
        check_features(other.dims, module.dims, f"--compare {compare}", str(ckpt), ("compare", "ckpt"))
    dm = RecDataModule(
        str(data), eval_batch_size=batch_size, num_workers=num_workers, validate="footer", predict_split=split
    )
    check_features(dm.feature_dims, module.dims, f"the feature spec of {data}", f"checkpoint {ckpt}")
    dm.setup("predict")
    start = time.perf_counter()
    oov = np.zeros(len(dm.oov_fields), np.int64)
    with StreamingEvaluator(max_rows_in_memory=max_rows_in_memory) as ev:
        paired = _score(dm, module, other, ev, oov, device, split)
        result = ev.compute().to_dict()
    if other is not None:
        result["compare"] = {
            "checkpoint": str(compare),
            "arch": other.arch,
            **compare_aucs(*paired_arrays(paired)),
        }
    result.update(
        unknown_ids=dict(zip(dm.oov_fields, oov.tolist())),  # mapped to the OOV row, counted
        checkpoint=str(ckpt),
        data=str(data),
        split=split,
        arch=module.arch,
        seconds=round(time.perf_counter() - start, 2),
    )
    return result


def _score(
    dm: RecDataModule,
    module: Any,
    other: Any,
    ev: StreamingEvaluator,
    oov: np.ndarray,
    device: str,
    split: str,
) -> list[tuple[np.ndarray, ...]]:
    """Stream the split through ``module`` into ``ev`` (adding its unknown-id counts to ``oov``);
    with ``other``, also keep both models' scores, labels and weights for the paired test."""
    paired: list[tuple[np.ndarray, ...]] = []
    for batch in dm.predict_dataloader():
        oov += batch.oov.numpy()
        batch = batch.to(device)
        logits = module.ranker(batch).float()
        if other is not None:
            # Checked before this batch's rows join: the main metrics must stay exact as well.
            if ev.rows + len(batch) > ev.max_rows_in_memory:
                raise ValueError(
                    f"--compare keeps every score in memory; {split} has more than "
                    f"--max-rows-in-memory={ev.max_rows_in_memory} rows"
                )
            both = (logits, other.ranker(batch).float(), batch.label, batch.weight)
            paired.append(tuple(t.cpu().numpy() for t in both))
        ev.update(*(t.cpu().numpy() for t in (logits, batch.label, batch.weight, batch.group)))
    return paired


def paired_arrays(paired: list[tuple[np.ndarray, ...]]) -> tuple[np.ndarray, ...]:
    return tuple(np.concatenate(c) for c in zip(*paired))


def compare_aucs(a: np.ndarray, b: np.ndarray, y: np.ndarray, w: np.ndarray) -> dict[str, Any]:
    """Both models' AUCs on the same rows, weighted as the report's ``auc`` is, and the paired
    DeLong test of their difference where it applies. DeLong's test is for unweighted rows with
    0/1 labels: with sample weights it runs on the unweighted AUCs (reported beside, and said so
    in ``note``); with soft labels there is no test, only the two AUCs and the reason."""

    def auc(scores: np.ndarray) -> float:
        try:
            return exact_auc(scores, y, w)
        except ValueError:  # one label class: undefined, as the report's own auc
            return math.nan

    out: dict[str, Any] = {"auc_a": auc(a), "auc_b": auc(b)}
    try:
        test = delong_paired(a, b, y)
    except ValueError as e:  # soft labels, or too few of a class: the rest of the report stands
        out["note"] = f"no paired DeLong test: {e}"
        return out
    out.update({k: test[k] for k in ("diff", "lo", "hi", "se", "p_value", "log10_p_value")})
    if not (w == w[0]).all():
        out["auc_a_unweighted"], out["auc_b_unweighted"] = test["auc_a"], test["auc_b"]
        out["note"] = (
            "the paired DeLong test ignores sample weights: diff, its interval and p are of the "
            "unweighted AUCs (auc_a_unweighted - auc_b_unweighted)"
        )
    return out


def _p(compare: dict[str, Any]) -> str:
    """The paired test's p-value, from its log10 where the value itself is past a double's range."""
    p, log10_p = compare["p_value"], compare.get("log10_p_value")
    if p > 0 or log10_p is None or not math.isfinite(log10_p):
        return f"p = {p:.2g}"
    exponent = math.floor(log10_p)
    return f"p = {10 ** (log10_p - exponent):.2g}e{exponent}"


def format_table(r: dict[str, Any]) -> str:
    def f(x: float) -> str:
        return "nan" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.4f}"

    ci = f"[{f(r['auc_lo'])}, {f(r['auc_hi'])}]" if r["auc_exact"] else "(binned: no CI)"
    lines = [
        f"split {r['split']} of {r['data']}: {r['rows']} rows, base rate {f(r['base_rate'])}",
        f"  AUC          {f(r['auc'])}  95% CI {ci}",
        f"  GAUC         {f(r['gauc'])}  over {r['gauc_groups']} groups ({r['gauc_groups_excluded']} "
        f"single-class groups left out: {f(r['gauc_excluded_share'])} of the weight)",
        f"  logloss      {f(r['logloss'])}",
        f"  NE           {f(r['ne'])}",
        f"  calibration  {f(r['calibration'])}  (mean prediction / mean label)",
    ]
    unknown = {k: n for k, n in r.get("unknown_ids", {}).items() if n}
    said = ", ".join(f"{k} {n}" for k, n in unknown.items()) if unknown else "none"
    lines.append(f"  unknown ids  {said}  (mapped to the OOV row, not dropped)")
    if "compare" in r:  # with the metrics, before the calibration table
        c = r["compare"]
        if "diff" in c:
            lines.append(
                f"  compare      AUC minus that of {c['checkpoint']} ({c['arch']}): {c['diff']:+.4f} "
                f"95% CI [{c['lo']:+.4f}, {c['hi']:+.4f}], {_p(c)} (paired DeLong)"
            )
        else:
            lines.append(f"  compare      AUC of {c['checkpoint']} ({c['arch']}): {f(c['auc_b'])}")
        if "note" in c:
            lines.append(f"               ({c['note']})")
    lines.append("  calibration table (bin: mean prediction vs observed):")
    for row in r["calibration_table"]:
        pred, obs, n = row["mean_pred"], row["mean_label"], int(row["rows"])
        lines.append(f"    {int(row['bin']):>3}  {pred:.3f}  {obs:.3f}  ({n} rows)")
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="recformer evaluate",
        description="Exact offline metrics of a checkpoint on a split of a data folder: AUC with its 95% "
        "DeLong interval, GAUC, logloss, NE, calibration and a calibration table; printed, written "
        "as JSON and logged to the checkpoint's W&B run. --compare adds the paired DeLong test of "
        "the AUC difference against a second checkpoint on the same rows.",
    )
    p.add_argument("--ckpt", required=True, help="checkpoint (.ckpt) written by recformer fit")
    p.add_argument("--data", required=True, help="data directory with spec.yaml and the split folder")
    p.add_argument("--split", default="test", help="split folder under --data (default: test)")
    p.add_argument(
        "--out", default=None, help="JSON output (default: <ckpt dir>/eval-<split>-<ckpt name>.json)"
    )
    p.add_argument("--batch-size", type=int, default=4096, help="rows per batch (default: 4096)")
    p.add_argument("--num-workers", type=int, default=1, help="loader worker processes (default: 1)")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    p.add_argument("--device", default=device, help=f"torch device (default here: {device})")
    p.add_argument(
        "--max-rows-in-memory",
        type=int,
        default=20_000_000,
        help="rows whose scores are held for the exact AUC; past it AUC is binned and GAUC spills to "
        "disk, and --compare stops with an error (default: 20000000)",
    )
    p.add_argument(
        "--compare", default=None, help="a second checkpoint: paired DeLong test of the AUC difference"
    )
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out file")
    p.add_argument(
        "--no-wandb",
        action="store_true",
        help="do not log the results to the W&B run of the checkpoint's run folder (its wandb.json)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    p = _parser()
    a = p.parse_args(argv)
    for flag, value, least in (("--batch-size", a.batch_size, 1), ("--num-workers", a.num_workers, 0)):
        if value < least:
            p.error(f"{flag}={value}; expected an integer >= {least}")
    if not storage.is_uri(a.data) and not Path(a.data).is_dir():
        print(
            f"recformer evaluate: --data {a.data} is not a folder (expected spec.yaml and split folders)",
            file=sys.stderr,
        )
        return 2
    out = Path(a.out) if a.out else Path(a.ckpt).parent / f"eval-{a.split}-{Path(a.ckpt).stem}.json"
    refused = output_refused(out, a.overwrite)
    if refused:  # before the evaluation, not after it
        print(f"recformer evaluate: {refused}", file=sys.stderr)
        return 2
    try:
        r = evaluate(
            a.ckpt, a.data, a.split, a.batch_size, a.num_workers, a.device, a.max_rows_in_memory, a.compare
        )
    except (DataError, FileNotFoundError, ValueError) as e:
        print(f"recformer evaluate: {e}", file=sys.stderr)
        return 2
    print(format_table(r))  # the result first: a failed write must not cost it
    if not a.no_wandb:
        run_id = log_evaluation(Path(a.ckpt), a.split, r)
        if run_id:
            print(f"logged to W&B run {run_id}")
    try:
        write_json_atomic(out, r)
    except OSError as e:
        print(f"recformer evaluate: could not write {out} ({e.strerror}); the results:", file=sys.stderr)
        print(json.dumps(r, indent=2, default=float))
        return 2
    print(f"wrote {out}")
    return 0


def output_refused(out: Path, overwrite: bool) -> str | None:
    """Why ``out`` cannot be written (a folder, an existing file without ``overwrite``, a folder that
    cannot be made or written), or None."""
    if out.is_dir():
        return f"--out {out} is a folder; expected a file path"
    if out.exists() and not overwrite:
        return f"--out {out} exists; pass --overwrite to replace it, or choose another path"
    folder = out.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        return f"cannot make the folder of --out {out}: {e.strerror}"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"cannot write --out {out}: the folder {folder} is not writable"
    return None


def write_json_atomic(path: Path, value: dict[str, Any]) -> None:
    """``value`` as JSON at ``path``, written beside it first and renamed (never a half file)."""
    tmp = path.with_name(f".{path.name}.partial-{os.getpid()}")
    try:
        tmp.write_text(json.dumps(value, indent=2, default=float))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
