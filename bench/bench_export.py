"""Scoring latency of a ranker: eager PyTorch, the torch.export program and ONNX Runtime, side by
side in one run, at batch sizes 1, 64 and 1024, on the rows of a real split.

    python bench/bench_export.py --ckpt RUN/checkpoints/best.ckpt --data data/movielens [--threads 2]

Each engine scores the same batches; the calls are interleaved engine after engine (machine noise
hits all alike), after warm-up calls. Reported per engine and batch size: p50 and p99 latency (ms)
and samples/s at the median, with the ratio to eager. Every engine runs on ``--threads`` threads
(torch.set_num_threads, ONNX Runtime's intra-op pool).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from recformer.data.datamodule import RecDataModule
from recformer.evaluate import load_module
from recformer.export import Scorer, export, inputs_of, load

BATCHES = (1, 64, 1024)
CALLS = {1: 300, 64: 100, 1024: 20}
WARMUP = 5


def _rows(data: Path, split: str, n: int) -> tuple[torch.Tensor, ...]:
    dm = RecDataModule(str(data), eval_batch_size=n, num_workers=0, predict_split=split)
    dm.setup("predict")
    return inputs_of(next(iter(dm.predict_dataloader())).to("cpu"))


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ckpt", type=Path, required=True)
    p.add_argument("--data", type=Path, default=Path("data/movielens"))
    p.add_argument("--split", default="test")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=None, help="JSON of the table")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    with tempfile.TemporaryDirectory() as tmp:
        artifact = Path(tmp) / "artifact"
        export(a.ckpt, a.data, artifact, ["torch-export", "onnx"], a.split)
        scorer = Scorer(load_module(a.ckpt).ranker).eval()

        def eager(*x: np.ndarray) -> np.ndarray:
            with torch.no_grad():
                return scorer(*(torch.from_numpy(t) for t in x)).numpy()

        engines = {
            "eager": eager,
            "torch.export": load(artifact, "torch-export"),
            "onnxruntime": _ort(artifact, a.threads),
        }
        rows = _rows(a.data, a.split, max(BATCHES))
        table = []
        for B in BATCHES:
            x = tuple(t[:B].numpy() for t in rows)
            for run in engines.values():
                for _ in range(WARMUP):
                    run(*x)
            times: dict[str, list[float]] = {name: [] for name in engines}
            for _ in range(CALLS[B]):
                for name, run in engines.items():
                    start = time.perf_counter()
                    run(*x)
                    times[name].append(time.perf_counter() - start)
            base = float(np.median(times["eager"]))
            for name, ts in times.items():
                p50, p99 = float(np.median(ts)), float(np.percentile(ts, 99))
                table.append(
                    {
                        "engine": name,
                        "batch": B,
                        "p50_ms": p50 * 1e3,
                        "p99_ms": p99 * 1e3,
                        "samples_per_s": B / p50,
                        "speed_vs_eager": base / p50,
                    }
                )
    print(f"threads {a.threads}; {a.ckpt}")
    print(f"{'engine':13s} {'batch':>5s} {'p50 ms':>8s} {'p99 ms':>8s} {'samples/s':>10s} {'x eager':>8s}")
    for r in table:
        print(
            f"{r['engine']:13s} {r['batch']:5d} {r['p50_ms']:8.2f} {r['p99_ms']:8.2f} "
            f"{r['samples_per_s']:10.0f} {r['speed_vs_eager']:8.2f}"
        )
    if a.out:
        a.out.write_text(json.dumps(table, indent=2))
    return {"rows": table}


def _ort(artifact: Path, threads: int):
    import onnxruntime as ort

    from recformer.export import FORMATS, INPUTS

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    session = ort.InferenceSession(
        str(artifact / FORMATS["onnx"]), options, providers=["CPUExecutionProvider"]
    )

    def run(*x: np.ndarray) -> np.ndarray:
        return session.run(["score"], dict(zip(INPUTS, x, strict=True)))[0]

    return run


if __name__ == "__main__":
    main()
