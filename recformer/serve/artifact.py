"""An export folder (``recformer export``) opened for serving: its manifest, the encodings a
request encoder needs, and the model as a scoring function of one backend.

Everything comes from the folder alone; a folder this recformer cannot serve as it was made is
refused at start-up with one line saying why (``ArtifactError``), before any worker starts.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from recformer.batch import FIELDS
from recformer.config import FeatureSpec
from recformer.data.encode import GAP_UNIT_S

BACKENDS = {"onnx": "onnxruntime on model.onnx", "torch-export": "PyTorch running model.pt2 op by op (eager)"}
"""Each backend (a format of ``recformer export``) and what runs the model."""


class ArtifactError(ValueError):
    """An export folder that cannot be served; the message says why and what to do."""


@dataclass
class Artifact:
    path: Path
    manifest: dict[str, Any]
    spec: FeatureSpec
    inputs: tuple[str, ...]
    """The model's inputs, in order: ``Batch`` fields, as the manifest lists them."""
    gap_unit_s: float
    item_ids_file: Path | None
    """``encodings/item_ids.parquet`` when requests carry raw item ids other than the spec's."""

    @classmethod
    def open(cls, path: Path, backend: str) -> Artifact:
        path = Path(path)
        manifest_path = path / "manifest.json"
        if not manifest_path.is_file():
            raise ArtifactError(f"{path} has no manifest.json: not a folder written by recformer export")
        try:
            manifest = json.loads(manifest_path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ArtifactError(f"{manifest_path}: not readable JSON ({e})") from None
        inputs = _inputs(manifest, manifest_path)
        fmt = manifest.get("formats", {}).get(backend)
        if fmt is None or not (path / fmt.get("file", "")).is_file():
            made = sorted(manifest.get("formats", {}))
            raise ArtifactError(
                f"{path} has no {backend} model (exported formats: {made}); serve it with --backend "
                f"{made[0] if made else 'onnx'} or export with --format {backend}"
            )
        spec = FeatureSpec.load(path / "encodings" / "spec.yaml")
        encoder = manifest.get("encoder", {})
        # Artifacts from before the manifest named the unit were bucketed in the one unit there was.
        gap_unit_s = float(encoder.get("time_gap_unit_s", GAP_UNIT_S))
        item_ids = encoder.get("item_ids")
        item_ids_file = path / item_ids if item_ids else None
        if item_ids_file is not None and not item_ids_file.is_file():
            raise ArtifactError(f"{manifest_path} names the item map {item_ids}, which {path} lacks")
        return cls(path, manifest, spec, inputs, gap_unit_s, item_ids_file)

    def model_file(self, backend: str) -> Path:
        return self.path / self.manifest["formats"][backend]["file"]

    def request_encoder(self, max_candidates: int):
        """The request encoder of this artifact's encodings (``recformer.data.requests``)."""
        from recformer.data.encode import read_item_ids
        from recformer.data.requests import RequestEncoder

        items = read_item_ids(self.item_ids_file, self.spec) if self.item_ids_file else None
        return RequestEncoder(self.spec, items, self.gap_unit_s, max_candidates)

    def describe(self, backend: str) -> dict[str, Any]:
        """What /info shows about the model."""
        m = self.manifest
        return {
            "artifact": str(self.path),
            "backend": f"{backend}: {BACKENDS[backend]}",
            "arch": m.get("arch"),
            "checkpoint_sha256": m.get("checkpoint", {}).get("sha256"),
            "parity": m.get("formats", {}).get(backend, {}).get("parity"),
            "item_ids": str(self.item_ids_file.relative_to(self.path)) if self.item_ids_file else None,
            "time_gap_unit_s": self.gap_unit_s,
        }


Scorer = Callable[[dict[str, np.ndarray]], np.ndarray]
"""The model as a function: the named inputs (``Artifact.inputs``, numpy) of a batch to its scores."""


def _inputs(manifest: dict[str, Any], where: Path) -> tuple[str, ...]:
    """The manifest's model inputs, each a ``Batch`` field in the dtype the loader widens it to."""
    fields = {f.name: f.device for f in FIELDS}
    inputs = manifest.get("inputs") or []
    for i in inputs:
        if fields.get(i.get("name")) != i.get("dtype"):
            raise ArtifactError(
                f"{where}: the model takes {i.get('name')!r} as {i.get('dtype')}, which this recformer's "
                "loader does not make; export the checkpoint again with this version"
            )
    if not inputs:
        raise ArtifactError(f"{where}: no model inputs listed; not a manifest of recformer export")
    return tuple(i["name"] for i in inputs)


def check_device(backend: str, device: str) -> None:
    """Refuse a device the backend cannot use here, before any worker starts: onnxruntime falls
    back to the CPU silently when its CUDA provider is missing."""
    if device == "cpu":
        return
    if backend == "torch-export":
        raise ArtifactError(
            "--backend torch-export serves on the CPU only (the program was traced on the CPU, its "
            "constants live there); serve on a GPU with --backend onnx"
        )
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        raise ArtifactError("--device cuda needs onnxruntime's CUDA provider: pip install onnxruntime-gpu")


def load_scorer(artifact: Artifact, backend: str, threads: int, device: str = "cpu") -> Scorer:
    """The exported model of ``backend`` on ``threads`` CPU threads (intra-op; one inter-op),
    or on ``device`` (``cuda:N``: onnxruntime's CUDA provider, onnxruntime-gpu installed)."""
    check_device(backend, device.partition(":")[0])
    path, names = artifact.model_file(backend), artifact.inputs
    if backend == "onnx":
        return _onnx_scorer(path, threads, device)
    import torch

    torch.set_num_threads(threads)  # intra-op; a graph run op by op has no inter-op parallelism to use
    module = torch.export.load(str(path)).module()

    def run(inputs: dict[str, np.ndarray]) -> np.ndarray:
        with torch.inference_mode():
            return module(*(torch.from_numpy(inputs[name]) for name in names)).numpy()

    return run


def _onnx_scorer(path: Path, threads: int, device: str) -> Scorer:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    providers: list[Any] = ["CPUExecutionProvider"]
    if device.startswith("cuda"):
        index = int(device.partition(":")[2] or 0)
        providers = [("CUDAExecutionProvider", {"device_id": index}), "CPUExecutionProvider"]
    session = ort.InferenceSession(str(path), options, providers=providers)

    def run(inputs: dict[str, np.ndarray]) -> np.ndarray:
        return session.run(["score"], inputs)[0]

    return run
