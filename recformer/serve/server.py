"""``recformer serve EXPORT_DIR``: the exported ranker behind an HTTP server, on LitServe.

    recformer serve exported/ [--backend onnx|torch-export] [--port 8000] [--workers 1] [--threads N]
        [--max-batch 32] [--batch-timeout-ms 2] [--max-candidates 1000] [--chunk-rows N]
        [--max-body-bytes 1048576]

Routes: ``POST /predict`` (a request ranks one user's candidates: ``recformer.data.requests``;
the answer is ``{"scores": [...], "unknown_ids": {...}}``, a click probability per candidate in
their order, and the ids the encodings do not know, which went to the OOV row), ``GET /health``
(200 once every worker has loaded the model), ``GET /metrics`` (requests by outcome, latency
percentiles, batch sizes, unknown ids per field; ``?format=prometheus`` for a scraper), ``GET
/info`` (the model and what a request holds).

Requests that arrive together are scored together: LitServe's worker takes up to ``--max-batch``
requests that came within ``--batch-timeout-ms`` and the encoder makes them one batch of rows. A
bad request is a 4xx with one line (``{"detail": ...}``) and never fails the others of its batch.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

from recformer.serve.artifact import BACKENDS, Artifact, ArtifactError, check_device

log = logging.getLogger(__name__)


CHUNK_ROWS = {"cpu": 128, "cuda": 4096}
"""Rows per model call by default. CPU: the MovieLens small ranker took 0.16-0.17 ms a row in calls
of 50-100 rows, 0.18 at 200, 0.25 at 800, 0.28 at 3200 (onnxruntime, one thread; eager torch 0.18
to 0.43; ``bench/serve_chunks.py`` on 2 shared cores): activations of ~100 rows stay in cache.
GPU: big calls fill the device."""


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="recformer serve",
        description="The exported ranker (a folder written by recformer export) behind an HTTP server, on "
        "LitServe: POST /predict ranks one user's candidates from raw ids and values; GET /health, "
        "/metrics and /info. The request format: docs/serving.md.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("export_dir", type=Path, help="a folder written by recformer export")
    p.add_argument(
        "--backend", choices=list(BACKENDS), default="onnx", help="what runs the model (default: onnx)"
    )
    p.add_argument(
        "--host", default="127.0.0.1", choices=["127.0.0.1", "0.0.0.0", "::"], help="address to bind"
    )
    p.add_argument("--port", type=int, default=8000, help="port (1024-65535; default 8000)")
    p.add_argument("--workers", type=int, default=1, help="inference worker processes (default 1)")
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="CPU threads per worker for the model (default: the usable cores divided among the workers)",
    )
    p.add_argument(
        "--device",
        default="cpu",
        choices=["cpu", "cuda"],
        help="cuda: onnxruntime-gpu, one worker set per GPU",
    )
    p.add_argument("--max-batch", type=int, default=32, help="requests scored together at most (default 32)")
    p.add_argument(
        "--batch-timeout-ms",
        type=float,
        default=2.0,
        help="how long a worker waits for more requests to fill a batch (default 2 ms)",
    )
    p.add_argument(
        "--max-candidates", type=int, default=1000, help="candidates per request at most (default 1000)"
    )
    p.add_argument(
        "--chunk-rows",
        type=int,
        default=None,
        help="candidate rows per model call at most; a larger batch is scored in chunks (default: 128 on "
        "the CPU, where calls of ~100 rows run 1.7x faster a row than of 3200; 4096 on a GPU)",
    )
    p.add_argument(
        "--max-body-bytes", type=int, default=1 << 20, help="request body size at most (default 1 MiB)"
    )
    p.add_argument(
        "--timeout", type=float, default=30.0, help="seconds a request may wait for a worker (then 504)"
    )
    p.add_argument(
        "--log-level",
        default="warning",
        choices=["debug", "info", "warning", "error"],
        help="the server's log level (default: warning)",
    )
    return p


def check_args(a: argparse.Namespace) -> None:
    """Refuse settings LitServe would take badly (it asserts, or fails in a worker), by name."""
    if a.chunk_rows is None:
        a.chunk_rows = CHUNK_ROWS[a.device]
    for name in ("workers", "max_batch", "max_candidates", "max_body_bytes", "chunk_rows"):
        if getattr(a, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')}={getattr(a, name)} must be >= 1")
    if a.threads is not None and a.threads < 1:
        raise ValueError(f"--threads={a.threads} must be >= 1")
    if not 1024 <= a.port <= 65535:
        raise ValueError(f"--port={a.port} must be in 1024-65535 (LitServe binds no privileged port)")
    if not 0 <= a.batch_timeout_ms < a.timeout * 1000:
        raise ValueError(f"--batch-timeout-ms={a.batch_timeout_ms} must be >= 0 and under --timeout")


def build(a: argparse.Namespace, artifact: Artifact) -> tuple[Any, int]:
    """The LitServer for ``artifact`` with the routes and limits of the module docstring."""
    import litserve as ls
    from fastapi.exceptions import RequestValidationError

    from recformer.serve.api import RankerAPI
    from recformer.serve.metrics import ServeMetrics, ServeMiddleware, invalid_body, metrics_route

    encoder = artifact.request_encoder(a.max_candidates)  # checks the encodings before any worker starts
    metrics = ServeMetrics(encoder.oov_names)
    threads = a.threads or max(1, _cores() // a.workers)
    timeout_s = a.batch_timeout_ms / 1e3
    api = RankerAPI(
        artifact.path, a.backend, threads, metrics, a.max_candidates, a.max_batch, timeout_s, a.chunk_rows
    )
    info = artifact.describe(a.backend) | {"threads_per_worker": threads, "request": encoder.describe()}
    info |= {"example_request": encoder.example(), "max_batch_requests": a.max_batch}
    info |= {"batch_timeout_ms": a.batch_timeout_ms, "chunk_rows": a.chunk_rows}
    server = ls.LitServer(
        api,
        accelerator="cuda" if a.device == "cuda" else "cpu",
        workers_per_device=a.workers,
        timeout=a.timeout,
        model_metadata=info,
    )
    server.app.add_exception_handler(RequestValidationError, invalid_body)
    server.app.add_api_route("/metrics", metrics_route(metrics), methods=["GET"])
    server.app.add_middleware(ServeMiddleware, metrics=metrics, max_body=a.max_body_bytes)
    return server, threads


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    try:
        check_args(a)
        artifact = Artifact.open(a.export_dir, a.backend)
        check_device(a.backend, a.device)
        server, threads = build(a, artifact)
    except (ArtifactError, ValueError, FileNotFoundError) as e:  # DataError is a ValueError
        print(f"recformer serve: error: {e}", file=sys.stderr)
        return 2
    # SIGTERM (docker stop, kill) shuts down as Ctrl-C does: LitServe then stops its workers.
    signal.signal(signal.SIGTERM, _interrupt)
    print(
        f"recformer serve: {a.export_dir} ({a.backend}, {a.workers} worker(s) x {threads} thread(s), "
        f"batches of up to {a.max_batch} requests within {a.batch_timeout_ms:g} ms) on "
        f"http://{a.host}:{a.port}/predict",
        file=sys.stderr,
        flush=True,
    )
    server.run(host=a.host, port=a.port, log_level=a.log_level, generate_client_file=False)
    return 0


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt
