"""The ranker as a LitServe API: raw requests in, a score per candidate out, batched across requests.

LitServe runs ``decode_request`` on each request in the inference worker, then ``batch``,
``predict`` and ``unbatch`` on the requests it collected (up to ``max_batch_size`` within
``batch_timeout``), then ``encode_response`` per request. An exception anywhere in that chain
fails *every* request of the batch (litserve/loops/simple_loops.py, ``BatchedLoop``), so a bad
request must never raise: ``decode_request`` turns it into a ``Rejected`` that travels through the
batch untouched and becomes its own 4xx response in ``encode_response`` (a ``JSONResponse``,
which FastAPI returns as is), while the other requests of the batch are scored.

No ``from __future__ import annotations`` here: LitServe reads ``decode_request``'s annotation
(``dict``) as the endpoint's body type, so FastAPI parses and checks the JSON in the API process.
"""

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import litserve as ls
import numpy as np
from fastapi.responses import JSONResponse

from recformer.serve.loop import WaitingBatchLoop
from recformer.serve.metrics import ServeMetrics

log = logging.getLogger(__name__)


@dataclass
class Rejected:
    """A request refused with ``status`` and a one-line ``detail``."""

    detail: str
    status: int = 400


class RankerAPI(ls.LitAPI):
    def __init__(
        self,
        artifact: Path,
        backend: str,
        threads: int,
        metrics: ServeMetrics,
        max_candidates: int,
        max_batch_size: int,
        batch_timeout: float,
        chunk_rows: int = 4096,
    ):
        # One request at a time: LitServe's single loop, which waits on its queue. Batches: ours,
        # which waits too, where LitServe's batched loop polls (recformer/serve/loop.py).
        loop = WaitingBatchLoop() if max_batch_size > 1 else "auto"
        super().__init__(
            max_batch_size=max_batch_size, batch_timeout=batch_timeout, api_path="/predict", loop=loop
        )
        self.artifact, self.backend, self.threads = Path(artifact), backend, threads
        self.metrics, self.max_candidates, self.chunk_rows = metrics, max_candidates, chunk_rows

    def setup(self, device: str) -> None:
        from recformer.serve.artifact import Artifact, load_scorer

        artifact = Artifact.open(self.artifact, self.backend)
        self.encoder = artifact.request_encoder(self.max_candidates)
        self.scorer = load_scorer(artifact, self.backend, self.threads, device)
        self.inputs = artifact.inputs
        # One request through every step before /health says ready: the loader's kernels compile
        # and the backend plans its graph on first use (0.1-0.2 s), which no client should wait for.
        (answer,) = self._score([self.encoder.parse(self.encoder.example())], count=False)
        if isinstance(answer, Rejected):
            raise RuntimeError(f"the warm-up request was refused: {answer.detail}")

    def decode_request(self, request: dict) -> Any:
        from recformer.data.requests import RequestError

        try:
            return self.encoder.parse(request)
        except RequestError as e:
            return Rejected(str(e))

    def batch(self, inputs: list) -> list:
        return inputs

    def predict(self, x: Any) -> Any:
        # max_batch_size=1 runs LitServe's single-request loop, which passes one input, not a list.
        if not isinstance(x, list):
            return self._score([x])[0]
        return self._score(x)

    def unbatch(self, output: list) -> list:
        return output

    def encode_response(self, output: Any) -> Any:
        if isinstance(output, Rejected):
            return JSONResponse({"detail": output.detail}, status_code=output.status)
        return output

    # -- scoring -------------------------------------------------------------------------------
    def _score(self, parsed: list, count: bool = True) -> list:
        """Per input: its response, or its ``Rejected``. The valid requests are encoded together;
        if a value only the encoder can judge (a dense value past float32 once normalised) fails
        that, each is encoded alone so only the bad one is refused."""
        from recformer.batch import DataError
        from recformer.data.requests import Parsed

        results: list[Any] = list(parsed)
        ok = [i for i, p in enumerate(parsed) if isinstance(p, Parsed)]
        if not ok:
            return results
        try:
            groups = [(ok, self.encoder.encode([parsed[i] for i in ok]))]
        except DataError:
            groups = []
            for i in ok:
                try:
                    groups.append(([i], self.encoder.encode([parsed[i]])))
                except DataError as e:
                    results[i] = Rejected(str(e))
        for members, encoded in groups:
            scores = self._model(encoded.batch)
            for j, i in enumerate(members):
                a, b = encoded.spans[j]
                unknown = {n: int(c) for n, c in zip(self.encoder.oov_names, encoded.unknown[j]) if c}
                results[i] = {"scores": scores[a:b].tolist(), "unknown_ids": unknown}
            if count:
                self.metrics.add_batch(len(members), len(scores), encoded.unknown.sum(axis=0))
        return results

    def _model(self, batch: Any) -> np.ndarray:
        """Scores of a batch's rows, ``chunk_rows`` at a time: a batch of many requests of many
        candidates stays within a bounded activation memory (attention is rows x tokens^2)."""
        batch = batch.to("cpu")  # ids widened to int64, as the exported graph takes them
        inputs = {name: getattr(batch, name).numpy() for name in self.inputs}
        n = len(batch)
        chunks = [
            self.scorer({k: v[a : a + self.chunk_rows] for k, v in inputs.items()})
            for a in range(0, n, self.chunk_rows)
        ]
        return np.concatenate(chunks) if chunks else np.zeros(0, np.float32)
