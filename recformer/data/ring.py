"""Batches from DataLoader workers through reusable shared-memory slots instead of the queue's pipe.

A worker's batch normally travels pickled: the worker copies it into a pickle, writes it through a
pipe in 64 KiB pieces, and the training process reads and unpickles it. For a 0.9 MB batch that was
about a quarter of a worker's time on the 2-core dev machine, and every batch was written into a
fresh buffer (new pages, a page fault per 4 KiB). With a ``SlotRing`` each worker owns ``slots``
fixed buffers in one anonymous shared mapping: it gathers a batch (in transit form, history still
ragged) straight into a free slot and sends only a ``SlotBatch`` (worker, slot, layout) through the
queue; the training process pads it out of the slot into a fresh Batch (pinned when the DataLoader
pins: ``BatchLayout.to_batch``) and frees the slot.

A worker waits on its semaphore for a free slot. The training process frees a slot as soon as it
takes the batch (or the pin-memory thread pins it), so a worker only waits when it is more than
``slots`` batches ahead, which is the back-pressure the prefetch depth asks for anyway.

The mapping is inherited, not named: it only exists for workers started by ``fork`` (Linux's
default). Under ``spawn``/``forkserver`` the stream is pickled into the workers without its ring
and batches take the pipe (``PackedBatch``); the two paths give identical batches (tested).
"""

from __future__ import annotations

import itertools
import mmap
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from recformer.data.batch import Batch, PackedBatch
from recformer.data.decode import BatchLayout

_PAGE = 4096
_RINGS: dict[int, SlotRing] = {}
"""Rings alive in this (training) process, by id, for ``SlotBatch`` messages to find their slots."""
_ids = itertools.count()


class SlotRing:
    def __init__(self, ctx: Any, workers: int, slots: int, slot_bytes: int, layout: BatchLayout):
        """``ctx``: the DataLoader's multiprocessing context (must start workers by fork);
        ``layout``: the stream's, to turn the slots' batches into Batches."""
        if ctx.get_start_method() != "fork":
            raise ValueError(f"SlotRing needs fork-started workers, not {ctx.get_start_method()!r}")
        self.id = next(_ids)
        self.workers, self.slots, self.layout = workers, slots, layout
        self.slot_bytes = -(-slot_bytes // _PAGE) * _PAGE
        self._map = mmap.mmap(-1, self.slot_bytes * slots * workers)  # MAP_SHARED | MAP_ANONYMOUS
        self._mem = np.frombuffer(self._map, dtype=np.uint8)
        self._free = [ctx.Semaphore(slots) for _ in range(workers)]
        self._stop = ctx.Event()
        self._next = [0] * workers
        self._parent = os.getpid()
        _RINGS[self.id] = self

    def stop(self) -> None:
        """Tell workers waiting for a slot to exit (the epoch's iterator is being torn down)."""
        self._stop.set()

    def close(self) -> None:
        """Stop serving slots in this process (in-flight messages then raise)."""
        _RINGS.pop(self.id, None)

    def slot(self, worker: int, slot: int) -> np.ndarray:
        start = (worker * self.slots + slot) * self.slot_bytes
        return self._mem[start : start + self.slot_bytes]

    # -- worker side ---------------------------------------------------------------------------
    def acquire(self, worker: int) -> tuple[int, np.ndarray]:
        """The worker's next slot, once the training process has freed it."""
        while not self._free[worker].acquire(timeout=0.1):
            # The epoch was abandoned, or the training process is gone: exit quietly, without
            # making the DataLoader's shutdown wait out its join timeout.
            if self._stop.is_set() or os.getppid() != self._parent:
                raise SystemExit(0)
        k = self._next[worker]
        self._next[worker] = (k + 1) % self.slots
        return k, self.slot(worker, k)

    # -- training-process side -----------------------------------------------------------------
    def release(self, worker: int) -> None:
        self._free[worker].release()


@dataclass
class SlotBatch:
    """The queue message for a batch that waits in a ring slot."""

    ring: int
    worker: int
    slot: int
    layout: tuple
    nbytes: int

    def take(self, pin: bool = False) -> Batch:
        """The batch, padded out of its slot into a fresh (pinned) buffer; the slot is freed."""
        ring = _RINGS.get(self.ring)
        if ring is None:
            raise RuntimeError(f"batch from ring {self.ring}, which this process has closed")
        packed = PackedBatch(ring.slot(self.worker, self.slot)[: self.nbytes], self.layout)
        try:
            return ring.layout.to_batch(packed, pin)
        finally:
            ring.release(self.worker)

    def pin_memory(self) -> Batch:
        # Called by the DataLoader's pin-memory thread: padded straight into pinned memory.
        return self.take(pin=True)
