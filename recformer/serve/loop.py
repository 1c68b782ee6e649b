"""LitServe's batched loop, waiting for a batch's first request instead of polling for it.

LitServe 0.2's ``collate_requests`` (litserve/loops/base.py) polls the worker's request queue (a
``multiprocessing`` manager queue: one IPC round trip a call) every millisecond of every batch
window, whether or not a request is there, and with ``batch_timeout=0`` calls ``get_nowait`` in a
loop that never sleeps. Measured on the MovieLens server with one worker and that loop: 0.21 CPU
seconds a second while idle at a 2 ms window, 0.99 at 0 (a whole core), CPU the model needs on a
small machine; with this one, 0.004-0.008 (``bench/serve_load.py`` reports it as it starts).

Here the loop blocks until a batch's first request arrives, then takes more until the batch is
full or ``batch_timeout`` has passed since that first request (the "queue delay" of other servers'
dynamic batching); with ``batch_timeout=0`` it takes what is already queued. Requests that waited
past LitServe's ``timeout`` are answered 504, as LitServe does.
"""

from __future__ import annotations

import time
from queue import Empty, Queue
from typing import Any

from litserve.loops.base import _SENTINEL_VALUE, _StopLoopError
from litserve.loops.simple_loops import BatchedLoop
from litserve.utils import LitAPIStatus, LoopResponseType

IDLE_WAIT_S = 1.0
"""How long one blocking wait for a first request lasts before the loop goes round (and can see
a shutdown that arrives without a sentinel)."""


class WaitingBatchLoop(BatchedLoop):
    def get_batch_requests(self, lit_api: Any, request_queue: Queue, transport: Any) -> tuple[list, list]:
        """(payloads, timed-out uids) of the next batch, as ``collate_requests`` returns them."""
        payloads: list = []
        timed_out: list = []
        try:
            item = request_queue.get(timeout=IDLE_WAIT_S)
        except Empty:
            return payloads, timed_out
        deadline = time.monotonic() + lit_api.batch_timeout
        while True:
            self._admit(item, lit_api, transport, payloads, timed_out)
            if len(payloads) + len(timed_out) >= lit_api.max_batch_size:
                break
            remaining = deadline - time.monotonic()
            try:
                item = request_queue.get(timeout=remaining) if remaining > 0 else request_queue.get_nowait()
            except Empty:
                break
        return payloads, timed_out

    def _admit(self, item: Any, lit_api: Any, transport: Any, payloads: list, timed_out: list) -> None:
        if item == _SENTINEL_VALUE:
            raise _StopLoopError()
        response_queue_id, uid, timestamp, x_enc = item
        # LitServe's own bookkeeping for this request (sent only when workers may restart).
        self.put_response(transport, response_queue_id, uid, (), LitAPIStatus.START, LoopResponseType.REGULAR)
        timeout = lit_api.request_timeout
        if timeout not in (None, False, -1) and time.monotonic() - timestamp > timeout:
            timed_out.append((response_queue_id, uid))
        else:
            payloads.append((response_queue_id, uid, x_enc))
