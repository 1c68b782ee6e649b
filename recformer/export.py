"""``recformer export``: a trained ranker as one artifact a serving stack can load without recformer.

    recformer export --ckpt RUN/checkpoints/best.ckpt --data data/movielens --out exported/ \\
        [--format torch-export onnx] [--split test]

The artifact folder holds:

- ``model.pt2`` (``torch.export``, load with ``torch.export.load(path).module()``) and/or
  ``model.onnx`` (ONNX, run with onnxruntime): the ranker in eval mode, its item side tables
  (content embeddings, item features) inside as constants, a dynamic batch axis ``batch``, named
  inputs (``INPUTS``: the model's fields of ``recformer.batch.FIELDS``) and one output, ``score``,
  the click probability;
- ``encodings/``: the data's ``spec.yaml`` and ``vocab/`` tables, the feature encodings the inputs
  are in: an id is its vocabulary row + 1 (row 0 is the shared OOV / padding row), dense features
  are normalised with the spec's train statistics, the history left-padded to ``L`` events;
- ``manifest.json``: the inputs (name, dtype, shape), the spec's columns, the model config, the
  checkpoint's SHA-256, the versions that made it, the parity of each format against the
  checkpoint on ``--split`` of ``--data`` (largest absolute score difference, over every row), and
  the encoder's constants and formulas (``encoder``, the time-gap unit among them);
- ``encodings/item_ids.parquet`` with ``--item-ids COLUMN``: each item id's raw id.

The graphs take encoded inputs, as the loader makes them (``recformer.data``); ``recformer serve``
takes raw requests and encodes them with the loader's own encoder, from this folder alone.
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from recformer.batch import FIELDS, Batch, DataError
from recformer.data.encode import manifest_entry
from recformer.version import version

FORMATS = {"torch-export": "model.pt2", "onnx": "model.onnx"}
"""Each format and its file in the artifact."""

INPUTS = tuple(f.name for f in FIELDS if f.name not in ("label", "weight", "group", "keys", "oov"))
"""The Batch fields the ranker reads: the exported graph's inputs, in this order."""

TOLERANCE = 1e-5
"""Largest absolute score difference (probability, fp32) an export may have from its checkpoint."""


class Scorer(nn.Module):
    """The ranker with named tensor inputs (``INPUTS``) and the click probability as its output."""

    def __init__(self, ranker: nn.Module) -> None:
        super().__init__()
        self.ranker = ranker

    def forward(
        self,
        target_item: torch.Tensor,
        cat: torch.Tensor,
        dense: torch.Tensor,
        emb: torch.Tensor,
        bag: torch.Tensor,
        hist_item: torch.Tensor,
        hist_cat: torch.Tensor,
        hist_gap: torch.Tensor,
        hist_mask: torch.Tensor,
    ) -> torch.Tensor:
        B, device = target_item.shape[0], target_item.device
        unused = torch.zeros(B, device=device)
        batch = Batch(
            label=unused,
            weight=unused,
            group=torch.zeros(B, dtype=torch.long, device=device),
            keys=torch.zeros(B, 0, dtype=torch.long, device=device),
            oov=torch.zeros(0, dtype=torch.long, device=device),
            target_item=target_item,
            cat=cat,
            dense=dense,
            emb=emb,
            bag=bag,
            hist_item=hist_item,
            hist_cat=hist_cat,
            hist_gap=hist_gap,
            hist_mask=hist_mask,
        )
        return torch.sigmoid(self.ranker(batch).float())


if tuple(inspect.signature(Scorer.forward).parameters)[1:] != INPUTS:  # a field added to FIELDS
    raise ImportError(f"recformer.export.Scorer.forward must take the model's inputs {INPUTS}")


def inputs_of(batch: Batch) -> tuple[torch.Tensor, ...]:
    return tuple(getattr(batch, name) for name in INPUTS)


def _dynamic_shapes() -> tuple[dict[int, Any], ...]:
    batch = torch.export.Dim("batch", min=1, max=1 << 24)
    return tuple({0: batch} for _ in INPUTS)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def export_torch(scorer: Scorer, example: tuple[torch.Tensor, ...], path: Path) -> None:
    with torch.no_grad():
        program = torch.export.export(scorer, example, dynamic_shapes=_dynamic_shapes())
    torch.export.save(program, str(path))


def export_onnx(scorer: Scorer, example: tuple[torch.Tensor, ...], path: Path) -> None:
    try:
        import onnxscript  # noqa: F401 - torch.onnx's exporter needs it
    except ImportError as e:
        raise ValueError("--format onnx needs onnx and onnxscript: pip install 'recformer[export]'") from e
    with torch.no_grad():
        program = torch.onnx.export(
            scorer,
            example,
            dynamic_shapes=_dynamic_shapes(),
            input_names=list(INPUTS),
            output_names=["score"],
            dynamo=True,
            verbose=False,
        )
    program.save(str(path))


EXPORTERS = {"torch-export": export_torch, "onnx": export_onnx}


def load(artifact: Path, fmt: str) -> Any:
    """A callable of the exported model in ``artifact``: ``f(*inputs) -> scores`` (numpy float32)."""
    path = artifact / FORMATS[fmt]
    if fmt == "torch-export":
        module = torch.export.load(str(path)).module()

        def run_torch(*inputs: Any) -> np.ndarray:
            with torch.no_grad():
                return module(*(torch.as_tensor(x) for x in inputs)).numpy()

        return run_torch
    try:
        import onnxruntime as ort
    except ImportError as e:
        raise ValueError("scoring model.onnx needs onnxruntime: pip install 'recformer[export]'") from e
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])

    def run_onnx(*inputs: Any) -> np.ndarray:
        feeds = {name: np.asarray(x) for name, x in zip(INPUTS, inputs, strict=True)}
        return session.run(["score"], feeds)[0]

    return run_onnx


def export(
    ckpt: Path, data: Path, out: Path, formats: list[str], split: str = "test", batch_size: int = 1024
) -> dict[str, Any]:
    """Export ``ckpt`` into ``out`` in each of ``formats``, check each against the checkpoint on
    ``split`` of ``data``; the manifest (also written as ``out/manifest.json``)."""
    from recformer.data.datamodule import RecDataModule
    from recformer.evaluate import load_module

    module = load_module(ckpt)
    dm = RecDataModule(
        str(data), eval_batch_size=batch_size, num_workers=0, validate="footer", predict_split=split
    )
    check_encodings(dm.feature_dims, module.dims, data, ckpt)
    dm.setup("predict")
    batches = [b.to("cpu") for b in dm.predict_dataloader()]
    if not batches:
        raise DataError(f"{data}/{split}: no rows to check the export against")
    scorer = Scorer(module.ranker).eval()
    example = inputs_of(batches[0])
    out.mkdir(parents=True, exist_ok=True)
    manifest = _manifest(module, ckpt, example)
    with torch.no_grad():
        reference = [scorer(*inputs_of(b)).numpy() for b in batches]
    for fmt in formats:
        rows = (example, batches, reference)
        manifest["formats"][fmt] = _export_checked(scorer, rows, out, fmt, split, module.arch)
    # every column the inputs come from, and the normalisation statistics: the checkpoint's own
    manifest["spec"], manifest["encodings_from"] = write_encodings(ckpt, data, out / "encodings", module.dims)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2, default=str) + "\n")
    return manifest


def _manifest(module: Any, ckpt: Path, example: tuple[torch.Tensor, ...]) -> dict[str, Any]:
    return {
        "formats": {},
        "inputs": [
            {"name": n, "dtype": str(t.dtype).removeprefix("torch."), "shape": ["batch", *t.shape[1:]]}
            for n, t in zip(INPUTS, example, strict=True)
        ],
        "output": {"name": "score", "dtype": "float32", "shape": ["batch"], "is": "click probability"},
        "arch": module.arch,
        "model": dict(module.hparams),
        "checkpoint": {"file": str(ckpt), "sha256": sha256(ckpt)},
        "encodings": "encodings/ (spec.yaml, vocab/): ids as vocabulary row + 1 (0 = OOV), dense normalised",
        "versions": {"torch": torch.__version__, "recformer": version()},
        "encoder": manifest_entry(None),  # its constants (the time-gap unit), read by recformer serve
    }


def _export_checked(
    scorer: Scorer, rows: tuple[Any, list, list], out: Path, fmt: str, split: str, arch: str
) -> dict[str, Any]:
    """Export ``scorer`` as ``fmt`` into ``out`` and score ``rows`` (the example, the batches, the
    checkpoint's scores of them) with the file; its manifest entry, or an error past TOLERANCE."""
    example, batches, reference = rows
    path = out / FORMATS[fmt]
    start = time.perf_counter()
    try:
        EXPORTERS[fmt](scorer, example, path)
    except ValueError:
        raise
    except Exception as e:  # noqa: BLE001 - a tracer's traceback is not an answer: one line, by name
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"model.arch={arch} cannot be exported to {fmt}: {first[:300]}") from None
    seconds = time.perf_counter() - start
    run = load(out, fmt)
    diff = max(float(np.abs(run(*inputs_of(b)) - ref).max()) for b, ref in zip(batches, reference))
    rows_n = sum(len(b) for b in batches)
    if not diff <= TOLERANCE:
        raise ValueError(
            f"{fmt}: the exported model's scores differ from the checkpoint's by up to {diff:.3g} on "
            f"{rows_n} rows of {split} (tolerance {TOLERANCE:g}); not an artifact to serve"
        )
    return {
        "file": path.name,
        "sha256": sha256(path),
        "export_seconds": round(seconds, 2),
        "parity": {"split": split, "rows": rows_n, "max_abs_score_diff": diff, "tolerance": TOLERANCE},
    }


def check_encodings(data_dims: Any, ckpt_dims: Any, data: Path, ckpt: Path) -> None:
    """Refuse ``data`` whose inputs the checkpoint's model does not read as it was trained to:
    other columns, sizes or vocabularies, or dense columns normalised otherwise, each named with
    the data's value and the checkpoint's. The artifact ships the checkpoint's encodings, so rows
    encoded as ``data`` encodes them would be checked against a model that never saw them."""
    wrong = data_dims.mismatch(ckpt_dims)
    changed = data_dims.encoding_changes(ckpt_dims)
    if wrong or changed:
        said = wrong or "dense columns normalised otherwise (" + "; ".join(changed) + ")"
        raise DataError(
            f"--data {data} encodes its inputs otherwise than checkpoint {ckpt} was trained on: {said}; "
            "an artifact carries the checkpoint's own encodings: export with the data it was trained on"
        )


def write_encodings(ckpt: Path, data: Path, enc: Path, dims: Any) -> tuple[dict[str, Any], str]:
    """``enc``: the feature spec the checkpoint was trained with (kept in its DataModule state; a
    checkpoint from before that: ``data``'s, which ``check_encodings`` compared with it) and every
    vocabulary file it names, copied from ``data`` at the same relative path. Every encoding the
    checkpoint records is checked against what ``enc`` now holds. Returns the spec and its source."""
    import yaml

    from recformer.checkpoints import checkpoint_entries
    from recformer.config import FeatureSpec
    from recformer.data.datamodule import SPEC_STATE, RecDataModule
    from recformer.data.vocab import encodings, vocab_files

    key = RecDataModule.__qualname__
    text = (checkpoint_entries(ckpt, key)[key] or {}).get(SPEC_STATE)
    source = (
        "checkpoint" if text is not None else f"data ({data}: checkpoint written before it kept its spec)"
    )
    shutil.rmtree(enc, ignore_errors=True)
    enc.mkdir()
    (enc / "spec.yaml").write_text(text if text is not None else (data / "spec.yaml").read_text())
    spec = FeatureSpec.load(enc / "spec.yaml")
    for rel in vocab_files(spec):
        target = (enc / rel).resolve()
        if not target.is_relative_to(enc.resolve()):
            raise DataError(f"vocab_file {rel} lies outside the data folder; encodings/ must hold every one")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(data / rel, target)
    got = encodings(spec)
    wrong = [
        f"{k}: artifact {got.get(k)} vs checkpoint {v}" for k, v in dims.encoding.items() if got.get(k) != v
    ]
    if wrong:
        raise DataError(f"{enc} does not encode as checkpoint {ckpt} was trained: {'; '.join(wrong)}")
    return yaml.safe_load(text if text is not None else (enc / "spec.yaml").read_text()), source


def item_ids_of(data: Path, column: str) -> Any:
    """The raw item id of each item id, from ``column`` of ``data``'s item side table (checked)."""
    from recformer.config import FeatureSpec
    from recformer.data.encode import item_raw_ids

    return item_raw_ids(FeatureSpec.load(data / "spec.yaml"), column)


def add_item_ids(out: Path, raw_items: Any, manifest: dict[str, Any]) -> None:
    """Write the item raw-id map into the artifact (``encodings/item_ids.parquet``) and name it in
    its manifest: what ``recformer serve`` maps request item ids through."""
    from recformer.data.encode import ITEM_IDS, manifest_entry, write_item_ids

    write_item_ids(raw_items, out / "encodings" / ITEM_IDS)
    manifest["encoder"] = manifest_entry(ITEM_IDS)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2, default=str) + "\n")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="recformer export",
        description="A trained ranker as one folder a serving stack loads without recformer: the model "
        "(torch.export and/or ONNX), the feature encodings it was trained with and a manifest. Every "
        "export is checked against the checkpoint on every row of --split and refused if a score "
        "differs by more than 1e-5. recformer serve runs the folder.",
    )
    p.add_argument("--ckpt", required=True, type=Path, help="checkpoint (.ckpt) written by recformer fit")
    p.add_argument(
        "--data",
        required=True,
        type=Path,
        help="the data the model was trained on: its encodings, and the rows to check the export on",
    )
    p.add_argument("--out", required=True, type=Path, help="the artifact folder")
    p.add_argument(
        "--format",
        nargs="+",
        default=["torch-export", "onnx"],
        choices=list(FORMATS),
        help="what to write: torch-export (model.pt2, for torch.export.load) and/or onnx (model.onnx, "
        "for onnxruntime); default: both",
    )
    p.add_argument("--split", default="test", help="split of --data the export is checked on (default: test)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing artifact folder")
    p.add_argument(
        "--item-ids",
        metavar="COLUMN",
        help="column of the item side table holding the raw item ids requests carry, when the logs' "
        "item ids are not those (MovieLens: movie_id); recformer serve maps request items through it",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    a = _parser().parse_args(argv)
    if a.out.exists() and any(a.out.iterdir()) and not a.overwrite:
        print(
            f"recformer export: --out {a.out} is not empty; pass --overwrite or choose another folder",
            file=sys.stderr,
        )
        return 2
    if not (a.data / "spec.yaml").is_file():
        print(
            f"recformer export: --data {a.data} has no spec.yaml (expected a recformer data folder)",
            file=sys.stderr,
        )
        return 2
    try:
        raw_items = item_ids_of(a.data, a.item_ids) if a.item_ids else None  # checked before the export
        manifest = export(a.ckpt, a.data, a.out, a.format, a.split)
        if raw_items is not None:
            add_item_ids(a.out, raw_items, manifest)
    except (DataError, FileNotFoundError, ValueError) as e:
        print(f"recformer export: {e}", file=sys.stderr)
        return 2
    for fmt, m in manifest["formats"].items():
        par = m["parity"]
        print(
            f"{fmt:13s} {a.out / m['file']}  max |score diff| {par['max_abs_score_diff']:.2e} on "
            f"{par['rows']} {par['split']} rows (tolerance {par['tolerance']:g})"
        )
    print(f"wrote {a.out / 'manifest.json'}")
    return 0
