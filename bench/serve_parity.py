"""Parity of a running ``recformer serve`` with ``recformer predict``: every row of a split sent as
raw requests, scored by the server, against the checkpoint's own scores for the same rows.

    python bench/serve_parity.py --ckpt RUN/checkpoints/best.ckpt --artifact exported/ \\
        --data data/movielens [--split test] [--backend onnx] [--concurrency 16]

1. ``recformer predict`` scores ``--split`` with the checkpoint (eager PyTorch on the loader's
   tensors), unless ``--predictions FILE`` gives that file already;
2. ``recformer serve ARTIFACT`` starts on a free loopback port;
3. each row becomes part of a raw request (``recformer.serve.replay``: raw item ids through the
   artifact's map, dense values as logged, event timestamps; a user's consecutive rows with one
   history are one request with several candidates), ``--concurrency`` requests in flight;
4. the largest |server score - predict score| over every row, joined on the spec's keys, against
   the export's tolerance (``recformer.export.TOLERANCE``). Exit 1 if over it or a row is missing.

Prints one line and writes the figures as JSON (``--out``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import numpy as np
import pyarrow.parquet as pq

from recformer.config import FeatureSpec
from recformer.data.encode import read_item_ids
from recformer.export import TOLERANCE
from recformer.serve.artifact import Artifact
from recformer.serve.launch import running_server
from recformer.serve.replay import log_requests


async def post_all(url: str, requests: list[dict], concurrency: int, timeout: float = 120.0) -> list[dict]:
    """Each request's JSON answer (status and body), ``concurrency`` in flight."""
    gate = asyncio.Semaphore(concurrency)
    client_timeout = aiohttp.ClientTimeout(total=timeout)

    async def one(session: aiohttp.ClientSession, body: dict) -> dict:
        async with gate, session.post(f"{url}/predict", json=body) as r:
            return {"status": r.status, "body": await r.json()}

    async with aiohttp.ClientSession(timeout=client_timeout) as session:
        return await asyncio.gather(*(one(session, r) for r in requests))


def predict(ckpt: Path, data: Path, split: str, out: Path) -> None:
    """``recformer predict`` of ``ckpt`` on ``split`` of ``data`` into ``out`` (a subprocess: a
    fresh Lightning, as a user runs it)."""
    cmd = [
        sys.executable,
        "-m",
        "recformer",
        "predict",
        f"--data.data_dir={data}",
        f"--data.predict_split={split}",
    ]
    cmd += [
        "--data.num_workers=0",
        f"--ckpt_path={ckpt}",
        f"--output={out}",
        "--trainer.enable_progress_bar=false",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"recformer predict failed ({done.returncode}): {done.stderr[-2000:]}")


def split_table(data: Path, split: str):
    return pq.read_table(sorted((data / split).glob("*.parquet")))


def server_scores(
    url: str, artifact: Path, backend: str, data: Path, split: str, concurrency: int
) -> tuple[np.ndarray, dict]:
    """Every row of the split scored through the server at ``url``: scores in row order, and how
    the rows were sent."""
    art = Artifact.open(artifact, backend)
    items = read_item_ids(art.item_ids_file, art.spec) if art.item_ids_file else None
    table = split_table(data, split)
    pairs = list(log_requests(table, art.spec, items))
    start = time.perf_counter()
    answers = asyncio.run(post_all(url, [r for r, _ in pairs], concurrency))
    seconds = time.perf_counter() - start
    scores = np.full(table.num_rows, np.nan)
    for (_, rows), answer in zip(pairs, answers):
        if answer["status"] != 200:
            raise RuntimeError(f"rows {rows[:3]}...: HTTP {answer['status']}: {answer['body']}")
        scores[rows] = answer["body"]["scores"]
    sent = {"requests": len(pairs), "rows": table.num_rows, "seconds": round(seconds, 2)}
    return scores, sent


def predict_scores(predictions: Path, data: Path, split: str) -> np.ndarray:
    """``recformer predict``'s scores in the split's row order, joined on the spec's keys."""
    spec = FeatureSpec.load(data / "spec.yaml")
    table, pred = split_table(data, split), pq.read_table(predictions)
    key = lambda t: list(zip(*(t.column(k).to_pylist() for k in spec.keys)))
    by_key = dict(zip(key(pred), pred.column("score").to_numpy()))
    if len(by_key) != pred.num_rows:
        raise RuntimeError(f"the spec's keys {spec.keys} do not tell the rows of {predictions} apart")
    return np.array([by_key.get(k, np.nan) for k in key(table)])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ckpt", type=Path, required=True, help="the checkpoint the artifact was exported from")
    p.add_argument("--artifact", type=Path, required=True, help="a recformer export folder")
    p.add_argument("--data", type=Path, required=True)
    p.add_argument("--split", default="test")
    p.add_argument("--backend", default="onnx", choices=["onnx", "torch-export"])
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--threads", type=int, default=1, help="the server's threads per worker")
    p.add_argument("--predictions", type=Path, help="recformer predict's file for --split (else run it)")
    p.add_argument("--out", type=Path, default=Path("bench/out/serve_parity.json"))
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        predictions = a.predictions or Path(tmp) / "predictions.parquet"
        if a.predictions is None:
            predict(a.ckpt, a.data, a.split, predictions)
        want = predict_scores(predictions, a.data, a.split)
        args = ("--backend", a.backend, "--threads", str(a.threads), "--log-level", "error")
        with running_server(a.artifact, *args, log=Path(tmp) / "serve.log") as served:
            got, sent = server_scores(served.url, a.artifact, a.backend, a.data, a.split, a.concurrency)
    diff = np.abs(got - want)
    worst = float(np.nanmax(diff)) if np.isfinite(diff).any() else float("nan")
    missing = int(np.isnan(diff).sum())
    result = {
        "split": a.split,
        "backend": a.backend,
        **sent,
        "max_abs_score_diff": worst,
        "tolerance": TOLERANCE,
    }
    result["rows_missing"] = missing
    print(
        f"{a.backend}: {sent['rows']} {a.split} rows in {sent['requests']} raw requests: max |server - "
        f"predict| {worst:.3g} (tolerance {TOLERANCE:g}){f', {missing} rows missing' if missing else ''}"
    )
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if missing == 0 and worst <= TOLERANCE else 1


if __name__ == "__main__":
    sys.exit(main())
