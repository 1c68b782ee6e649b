"""What the server counts, shared by its processes, and the HTTP plumbing that counts it.

LitServe runs the HTTP side (uvicorn, forked) and the model (an inference worker, spawned) in
separate processes: request outcomes and latencies are seen on the HTTP side, unknown ids and
batch sizes in the worker. ``ServeMetrics`` keeps them in shared memory (``multiprocessing``
raw arrays, created before either process starts, under one spawn-context lock) so ``/metrics``,
served by the HTTP side, reports both.

``ServeMiddleware`` (plain ASGI, around the whole app) refuses a body over the size limit with
a one-line 413 before it is read, and times every ``/predict`` request from its arrival to the
end of its response.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from typing import Any

import numpy as np
from fastapi import HTTPException
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse

COUNTS = ("requests", "ok", "client_errors", "server_errors", "batches", "batched_requests", "candidates")
"""Counters: /predict requests by outcome (2xx, 4xx, 5xx); batches the worker scored, the requests
and candidate rows in them."""
QUANTILES = (0.5, 0.9, 0.99)


class ServeMetrics:
    """Counters and a window of the latest ``window`` latencies of answered requests (2xx)."""

    def __init__(self, oov_names: list[str], window: int = 4096):
        self.oov_names, self.window = list(oov_names), window
        self.lock = mp.get_context("spawn").Lock()  # a fork-context lock cannot reach a spawned worker
        self._counts = mp.RawArray("q", len(COUNTS))
        self._oov = mp.RawArray("q", len(self.oov_names))
        self._latency = mp.RawArray("d", window)

    def _arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return (
            np.frombuffer(self._counts, np.int64),
            np.frombuffer(self._oov, np.int64),
            np.frombuffer(self._latency, np.float64),
        )

    def add_request(self, status: int, seconds: float) -> None:
        """One /predict request answered with ``status`` after ``seconds`` (the HTTP side)."""
        counts, _, latency = self._arrays()
        kind = "ok" if status < 400 else "client_errors" if status < 500 else "server_errors"
        with self.lock:
            counts[COUNTS.index("requests")] += 1
            if kind == "ok":
                latency[counts[COUNTS.index("ok")] % self.window] = seconds
            counts[COUNTS.index(kind)] += 1

    def add_batch(self, requests: int, candidates: int, unknown: np.ndarray) -> None:
        """A batch the worker scored: its requests, candidate rows and unknown ids per field."""
        counts, oov, _ = self._arrays()
        with self.lock:
            counts[COUNTS.index("batches")] += 1
            counts[COUNTS.index("batched_requests")] += requests
            counts[COUNTS.index("candidates")] += candidates
            oov += np.asarray(unknown, np.int64)

    def snapshot(self) -> dict[str, Any]:
        counts, oov, latency = self._arrays()
        with self.lock:
            c = dict(zip(COUNTS, counts.tolist()))
            window = latency[: min(c["ok"], self.window)].copy()
            unknown = dict(zip(self.oov_names, oov.tolist()))
        ms = (
            {f"p{round(q * 100)}": float(np.quantile(window, q)) * 1e3 for q in QUANTILES}
            if len(window)
            else {}
        )
        return {
            "requests": {
                "total": c["requests"],
                **{k: c[k] for k in ("ok", "client_errors", "server_errors")},
            },
            "latency_ms": {
                "window": len(window),
                **ms,
                "max": float(window.max()) * 1e3 if len(window) else None,
            },
            "batches": {
                "count": c["batches"],
                "requests": c["batched_requests"],
                "candidates": c["candidates"],
                "mean_requests": c["batched_requests"] / c["batches"] if c["batches"] else None,
            },
            "unknown_ids": unknown,
        }

    def prometheus(self) -> str:
        """The snapshot in Prometheus' text format (counters, and a summary of latency in seconds)."""
        s = self.snapshot()
        lines = ["# TYPE recformer_requests_total counter"]
        lines += [
            f'recformer_requests_total{{outcome="{k}"}} {v}'
            for k, v in s["requests"].items()
            if k != "requests"
        ]
        lines += [
            "# TYPE recformer_batches_total counter",
            f"recformer_batches_total {s['batches']['count']}",
        ]
        lines += [
            "# TYPE recformer_candidates_total counter",
            f"recformer_candidates_total {s['batches']['candidates']}",
        ]
        lines += ["# TYPE recformer_unknown_ids_total counter"]
        lines += [f'recformer_unknown_ids_total{{field="{k}"}} {v}' for k, v in s["unknown_ids"].items()]
        lat = s["latency_ms"]
        lines += ["# TYPE recformer_latency_seconds summary"]
        lines += [
            f'recformer_latency_seconds{{quantile="{q}"}} {lat[f"p{round(q * 100)}"] / 1e3:.6f}'
            for q in QUANTILES
            if lat["window"]
        ]
        return "\n".join(lines) + "\n"


class ServeMiddleware:
    """Plain ASGI around the app: the body-size limit and the /predict counters."""

    def __init__(self, app: Any, metrics: ServeMetrics, max_body: int, path: str = "/predict"):
        self.app, self.metrics, self.max_body, self.path = app, metrics, max_body, path

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != self.path:
            await self.app(scope, receive, send)
            return
        start, status = time.perf_counter(), 500
        too_big = (
            f"body: over {self.max_body} bytes (recformer serve --max-body-bytes); send fewer candidates"
        )

        async def counted_send(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        received = 0

        async def limited_receive() -> dict:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_body:  # a chunked body with no length, or one that lied
                raise HTTPException(413, too_big)
            return message

        try:
            length = dict(scope.get("headers") or []).get(b"content-length")
            if length is not None and length.isdigit() and int(length) > self.max_body:
                await JSONResponse({"detail": too_big}, status_code=413)(scope, receive, counted_send)
                return
            await self.app(scope, limited_receive, counted_send)
        finally:
            self.metrics.add_request(status, time.perf_counter() - start)


async def invalid_body(request: Any, exc: RequestValidationError) -> JSONResponse:
    """FastAPI's 422 for a body that is not a JSON object, as a one-line 400."""
    first = exc.errors()[0] if exc.errors() else {}
    if first.get("type") == "json_invalid":
        where = first.get("loc", ("body", "?"))[-1]
        detail = (
            f"body: not valid JSON ({first.get('ctx', {}).get('error', 'decode error')} at character {where})"
        )
    else:
        detail = "body: expected a JSON object (Content-Type: application/json) with 'candidates'"
    return JSONResponse({"detail": detail}, status_code=400)


def metrics_route(metrics: ServeMetrics):
    """GET /metrics: JSON, or Prometheus' text format with ``?format=prometheus``."""

    async def route(format: str = "json") -> Any:  # noqa: A002 - the query parameter's name
        if format == "prometheus":
            return PlainTextResponse(metrics.prometheus())
        if format != "json":
            return JSONResponse({"detail": f"format: expected json or prometheus, got {format!r}"}, 400)
        return metrics.snapshot()

    return route
