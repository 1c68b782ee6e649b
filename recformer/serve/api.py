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
from fastapi.responses import JSONResponse

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
    ):
        super().__init__(max_batch_size=max_batch_size, batch_timeout=batch_timeout, api_path="/predict")
        self.artifact, self.backend, self.threads = Path(artifact), backend, threads
        self.metrics, self.max_candidates = metrics, max_candidates

    def setup(self, device: str) -> None:
        from recformer.serve.artifact import Artifact, load_scorer

        artifact = Artifact.open(self.artifact, self.backend)
        self.encoder = artifact.request_encoder(self.max_candidates)
        self.scorer = load_scorer(artifact, self.backend, self.threads, device)
        self.inputs = artifact.inputs

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
    def _score(self, parsed: list) -> list:
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
            batch = encoded.batch.to("cpu")  # ids widened to int64, as the exported graph takes them
            scores = self.scorer({name: getattr(batch, name).numpy() for name in self.inputs})
            for j, i in enumerate(members):
                a, b = encoded.spans[j]
                unknown = {n: int(c) for n, c in zip(self.encoder.oov_names, encoded.unknown[j]) if c}
                results[i] = {"scores": scores[a:b].tolist(), "unknown_ids": unknown}
            self.metrics.add_batch(len(members), len(batch), encoded.unknown.sum(axis=0))
        return results
