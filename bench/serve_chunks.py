"""Model time per candidate row against rows per model call, for ``recformer serve --chunk-rows``.

    python bench/serve_chunks.py --artifact exported/ --data data/movielens [--threads 1]

32 MovieLens test requests of 100 candidates each (3200 rows, ``bench/serve_load.py``'s requests)
are encoded once, then scored by each backend in calls of 50 to 3200 rows; best of 3 passes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from recformer.serve.artifact import Artifact, load_scorer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_load import ITEM_FEATURES, request_bodies  # noqa: E402 - a sibling script, not a package

CHUNKS = (50, 100, 200, 400, 800, 1600, 3200)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--artifact", type=Path, required=True)
    p.add_argument("--data", type=Path, required=True)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args(argv)
    art = Artifact.open(a.artifact, "onnx")
    enc = art.request_encoder(1000)
    bodies = request_bodies(a.artifact, a.data, 32, 100, list(ITEM_FEATURES))
    batch = enc([json.loads(b) for b in bodies]).batch.to("cpu")
    inputs = {name: getattr(batch, name).numpy() for name in art.inputs}
    rows = len(batch)
    print("| backend | " + " | ".join(f"{c} rows" for c in CHUNKS) + " |  (ms a row)")
    for backend in ("onnx", "torch-export"):
        score = load_scorer(art, backend, a.threads)
        cells = []
        for chunk in CHUNKS:
            score({k: v[:chunk] for k, v in inputs.items()})  # warm: the backend plans this shape
            best = np.inf
            for _ in range(3):
                start = time.perf_counter()
                for at in range(0, rows, chunk):
                    score({k: v[at : at + chunk] for k, v in inputs.items()})
                best = min(best, time.perf_counter() - start)
            cells.append(f"{best / rows * 1e3:.3f}")
        print(f"| {backend} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
