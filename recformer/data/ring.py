"""Forked workers that hand batches over through reusable shared-memory slots (``SlotRing``), read
by the training process in the DataLoader's order (``WorkerPool``).

A DataLoader worker's batch normally travels pickled through a pipe, and every batch costs a few
queue messages each way (an index out, the batch back, through feeder threads). With forked
workers neither is needed: each worker owns ``slots`` fixed buffers in one anonymous shared mapping
and writes each batch, in transit form (``BatchLayout.transit``: history still ragged), straight
into its next slot, then posts the slot on its ``filled`` semaphore. The training process takes the
workers' slots in the DataLoader's in-order round robin, pads each batch out of its slot into a
fresh Batch (pinned when the loader pins: ``BatchLayout.to_batch``) and frees the slot on the
worker's ``free`` semaphore. A worker waits only when it is ``slots`` batches ahead, which is the
back-pressure the prefetch depth asks for anyway.

The DataLoader's own machinery (an index and a batch message per batch through queues with feeder
threads, record_function, pickling) cost the training process as much as a worker's whole cut of a
batch (``bench/bench_loader.py``, "Design measurements"); with the pool it mostly pads.

The mapping is inherited, not named: it only exists for workers started by ``fork`` (Linux's
default). Under ``spawn``/``forkserver`` the DataLoader's own workers pickle each batch through the
pipe (``PackedBatch``); the two paths give identical batches (tested).

A fork can leave the child stuck before it runs a line of Python: CPython before 3.11.8 re-takes
the runtime's thread-state lock in the child before resetting it (python/cpython#112275), and in a
DDP process the process group's threads take that lock whenever they free a collective's tensors
(they enter Python to drop the last reference). A fork at that instant, at an epoch's start right
after the last step's all-reduce, leaves the child waiting on it forever, and the rank, then every
rank, with it (about once in a thousand forks of a 2-rank CPU fit, tests/ddp_data_script.py). Each
worker therefore marks in the ring that it started; one that has not within ``_START_S`` of its
fork is stopped, checked again and, still unstarted, killed and forked again (``_restart``).
"""

from __future__ import annotations

import itertools
import logging
import mmap
import multiprocessing as mp
import os
import random
import signal
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch._utils import ExceptionWrapper
from torch.utils.data._utils import worker as worker_state
from torch.utils.data._utils.worker import _generate_state

from recformer.batch import Batch, DataError
from recformer.data.packed import PackedBatch

if TYPE_CHECKING:
    from recformer.data.dataset import ParquetStream
    from recformer.data.decode import BatchLayout

log = logging.getLogger(__name__)

_PAGE = 4096
_RINGS: dict[int, SlotRing] = {}
"""Rings alive in this (training) process, by id."""
_ids = itertools.count()

_END, _ERROR = -1, -2
"""Slot headers that are not a batch: the worker has no more batches; the worker failed."""

_POLL_S = 0.1
"""How often a waiting side checks that the other is still there."""

_START_S, _START_TRIES = 5.0, 5
"""A forked worker that has not started ``_START_S`` seconds after its fork is taken for stuck in
the fork (a started one marks it before anything else; that takes milliseconds) and forked again,
up to ``_START_TRIES`` forks in all."""


class SlotRing:
    """Per worker, ``slots`` fixed buffers in one shared anonymous mapping, used in turn, with a
    ``free`` semaphore (the worker waits on it) and a ``filled`` one (the training process waits on
    it), and a small header per slot saying what the worker left in it."""

    def __init__(self, ctx: Any, workers: int, slots: int, slot_bytes: int, layout: BatchLayout | None):
        """``ctx``: a multiprocessing context that starts workers by fork; ``layout``: the stream's,
        to turn the slots' batches into Batches."""
        if ctx.get_start_method() != "fork":
            raise ValueError(f"SlotRing needs fork-started workers, not {ctx.get_start_method()!r}")
        self.id = next(_ids)
        self.workers, self.slots, self.layout = workers, slots, layout
        self.slot_bytes = -(-slot_bytes // _PAGE) * _PAGE
        self._map = mmap.mmap(-1, self.slot_bytes * slots * workers)  # MAP_SHARED | MAP_ANONYMOUS
        self._mem = np.frombuffer(self._map, dtype=np.uint8)
        self._head_map = mmap.mmap(-1, 16 * slots * workers + 8 + 8 * workers)
        words = np.frombuffer(self._head_map, dtype=np.int64)
        n = 2 * slots * workers
        self._head = words[:n].reshape(workers, slots, 2)
        """Per slot: (rows, history events) of the batch in it, or (_END / _ERROR, 0)."""
        self._started = words[n + 1 :]
        """Per worker: nonzero once its process runs ``_work`` (see ``WorkerPool._restart``)."""
        self._stop = words[n : n + 1]
        """Nonzero once the epoch is abandoned: a plain shared word, not a multiprocessing Event,
        whose lock a worker killed while holding it would leave taken."""
        self._free = [ctx.Semaphore(slots) for _ in range(workers)]
        self._filled = [ctx.Semaphore(0) for _ in range(workers)]
        self._next = [0] * workers
        self._parent = os.getpid()
        _RINGS[self.id] = self

    def stop(self) -> None:
        """Tell the workers to exit at their next slot (the epoch's iterator is being torn down)."""
        self._stop[0] = 1

    def stopped(self) -> bool:
        return bool(self._stop[0])

    def close(self) -> None:
        _RINGS.pop(self.id, None)

    def slot(self, worker: int, slot: int) -> np.ndarray:
        start = (worker * self.slots + slot) * self.slot_bytes
        return self._mem[start : start + self.slot_bytes]

    # -- worker side ---------------------------------------------------------------------------
    def announce(self, worker: int) -> None:
        """Mark the worker's process as started (its first act)."""
        self._started[worker] = 1

    def started(self, worker: int) -> bool:
        return bool(self._started[worker])

    def acquire(self, worker: int) -> tuple[int, np.ndarray]:
        """The worker's next slot, once the training process has freed it. Raises SystemExit
        when the epoch was abandoned or the training process is gone (the worker exits quietly)."""
        while self.stopped() or not self._free[worker].acquire(timeout=_POLL_S):
            if self.stopped() or os.getppid() != self._parent:
                raise SystemExit(0)
        k = self._next[worker]
        self._next[worker] = (k + 1) % self.slots
        return k, self.slot(worker, k)

    def publish(self, worker: int, slot: int, rows: int, events: int = 0) -> None:
        """Hand slot ``slot`` (holding ``rows`` rows, or ``_END`` / ``_ERROR``) to the training process."""
        self._head[worker, slot] = rows, events
        self._filled[worker].release()

    # -- training-process side -----------------------------------------------------------------
    def wait(self, worker: int, timeout: float) -> bool:
        """Whether the worker's next slot was filled within ``timeout`` seconds."""
        return self._filled[worker].acquire(timeout=timeout)

    def take(self, worker: int, slot: int, pin: bool) -> Batch:
        """The batch in a filled slot, padded into a fresh (pinned) buffer; frees the slot."""
        rows, events = (int(v) for v in self._head[worker, slot])
        layout, nbytes = self.layout.transit_plan(rows, events)
        try:
            return self.layout.to_batch(PackedBatch(self.slot(worker, slot)[:nbytes], layout), pin)
        finally:
            self.release(worker)

    def header(self, worker: int, slot: int) -> int:
        return int(self._head[worker, slot, 0])

    def release(self, worker: int) -> None:
        self._free[worker].release()


def _work(
    ring: SlotRing,
    stream: ParquetStream,
    worker: int,
    base_seed: int,
    errors: Any,
    init_fn: Callable[[int], None] | None,
) -> None:
    """A worker process: this worker's batches of the stream, each into the next free slot."""
    ring.announce(worker)
    # Handlers inherited from the training process (Lightning's SIGTERM handler, Python's
    # KeyboardInterrupt) are not the worker's: the training process stops it (``close``), and
    # Ctrl-C reaches the training process, which does.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(1)
    # Seeded and described as the DataLoader does its workers (the stream itself needs no RNG:
    # its shuffles are seeded by (seed, epoch, rank, worker, window)).
    seed = base_seed + worker
    random.seed(seed)
    torch.manual_seed(seed)
    np.random.seed(_generate_state(base_seed, worker))
    worker_state._worker_info = worker_state.WorkerInfo(
        id=worker, num_workers=ring.workers, seed=seed, dataset=stream
    )
    slot = None  # a slot taken and not yet handed over
    try:
        if init_fn is not None:
            init_fn(worker)
        for data, idx in stream.worker_batches(worker, ring.workers):
            slot, buffer = ring.acquire(worker)
            out = data.gather(idx, packed=True, buffer=buffer)
            shapes = {name: shape for name, _, shape, _ in out.layout}
            ring.publish(worker, slot, shapes["rec"][0], shapes["ev_item"][0])
            slot = None
        slot, _ = ring.acquire(worker)
        ring.publish(worker, slot, _END)
    except SystemExit:
        pass
    except BaseException as e:
        error = ExceptionWrapper(where=f"in DataLoader worker process {worker}")
        # A data check's message names the file, column and row group: it travels as it is, so
        # that the training process raises that sentence, not the wrapper's copy of a traceback.
        check = str(e) if isinstance(e, DataError) else None
        if slot is None:
            slot, _ = ring.acquire(worker)
        ring.publish(worker, slot, _ERROR)
        errors.put((worker, error, check))  # after the header: the training process reads it only then


class WorkerTraceback(Exception):
    """Where a worker raised the error the training process re-raises, with its traceback."""


class WorkerPool:
    """One epoch of a stream from ``workers`` forked processes, yielded as Batches in the
    DataLoader's in-order round robin (which skips workers that have finished), so that a batch's
    position is the one ``shards.round_robin_resume`` computes for the DataLoader."""

    def __init__(
        self,
        stream: ParquetStream,
        workers: int,
        slots: int,
        layout: BatchLayout,
        pin: bool = False,
        init_fn: Callable[[int], None] | None = None,
        timeout: float = 0.0,
        generator: torch.Generator | None = None,
    ):
        self.ctx = mp.get_context("fork")
        # One draw from the training process's RNG per epoch, as a DataLoader iterator makes: the
        # model's RNG stream (dropout, ...) then does not depend on which worker path ran.
        base_seed = int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())
        self.stream, self.workers, self.pin, self.timeout = stream, workers, pin, timeout
        stream.warm_up()  # kernels loaded here once, inherited by every worker
        self.ring = SlotRing(self.ctx, workers, slots, stream.batch_bytes(), layout)
        self._errors = self.ctx.SimpleQueue()
        self._reported: dict[int, tuple[ExceptionWrapper, str | None]] = {}
        self._closed = False
        self._args = (stream, base_seed, self._errors, init_fn)
        self._procs = [self._process(w) for w in range(workers)]
        self._forked = [0.0] * workers
        """When each worker's process was last forked (``time.monotonic``)."""
        self._forks = [0] * workers

    def _process(self, worker: int) -> mp.process.BaseProcess:
        stream, base_seed, errors, init_fn = self._args
        return self.ctx.Process(
            target=_work, args=(self.ring, stream, worker, base_seed, errors, init_fn), daemon=True
        )

    def _start(self, worker: int) -> None:
        self._forked[worker] = time.monotonic()
        self._forks[worker] += 1
        self._procs[worker].start()

    def __iter__(self) -> Iterator[Batch]:
        ring = self.ring
        try:
            for w in range(self.workers):
                self._start(w)
            active, taken, i = list(range(self.workers)), [0] * self.workers, 0
            while active:
                w = active[i]
                self._wait(w)
                slot = taken[w] % ring.slots
                taken[w] += 1
                head = ring.header(w, slot)
                if head == _ERROR:
                    self._reraise(w)
                if head == _END:
                    ring.release(w)
                    active.pop(i)
                    i = i % len(active) if active else 0
                    continue
                batch = ring.take(w, slot, self.pin)
                i = (i + 1) % len(active)
                yield batch
        finally:
            self.close()

    def _wait(self, worker: int) -> None:
        start = time.monotonic()
        while not self.ring.wait(worker, _POLL_S):
            p = self._procs[worker]
            alive = p.is_alive()
            if alive and not self.ring.started(worker) and time.monotonic() - self._forked[worker] > _START_S:
                self._restart(worker)
                continue
            if not alive:
                if self.ring.wait(worker, 0):  # it filled the slot, then exited (after its last)
                    return
                raise RuntimeError(
                    f"DataLoader worker process {worker} (pid {p.pid}) exited unexpectedly with exit code "
                    f"{p.exitcode}; if it was killed (negative code), the machine may be out of memory"
                )
            if self.timeout and time.monotonic() - start > self.timeout:
                raise RuntimeError(
                    f"DataLoader timed out after {self.timeout} s waiting for worker process {worker}"
                )

    def _restart(self, worker: int) -> None:
        """Fork ``worker`` again when its process is stuck in the fork (see the module's docstring).
        It is stopped first, so that one slow to start cannot begin between the check and the kill;
        one that has not started has not touched the ring, so its new process takes its place."""
        p = self._procs[worker]
        os.kill(p.pid, signal.SIGSTOP)
        # Until it has stopped (or exited); WNOWAIT leaves its status to multiprocessing.
        os.waitid(os.P_PID, p.pid, os.WSTOPPED | os.WEXITED | os.WNOWAIT)
        if self.ring.started(worker):
            os.kill(p.pid, signal.SIGCONT)
            return
        p.kill()
        p.join()
        if self._forks[worker] >= _START_TRIES:
            raise RuntimeError(
                f"DataLoader worker process {worker} did not start in {_START_TRIES} forks, each given "
                f"{_START_S:g} s; CPython before 3.11.8 can leave a forked child stuck when another "
                "thread enters Python at the fork (python/cpython#112275): upgrade Python, or set "
                "data.num_workers=0"
            )
        log.warning(
            "DataLoader worker process %d (pid %s) had not started %.1f s after its fork; forked it "
            "again (CPython before 3.11.8 can leave a forked child stuck: python/cpython#112275)",
            worker,
            p.pid,
            time.monotonic() - self._forked[worker],
        )
        self._procs[worker] = self._process(worker)
        self._start(worker)

    def _reraise(self, worker: int) -> None:
        """Raise the error ``worker`` reported (it sends it right after the header that says so;
        other failing workers' errors may come first)."""
        while worker not in self._reported:
            if not self._errors.empty():
                w, error, check = self._errors.get()
                self._reported[w] = (error, check)
            elif not self._procs[worker].is_alive() and self._errors.empty():
                raise RuntimeError(f"DataLoader worker process {worker} failed and exited before saying why")
            else:
                time.sleep(0.01)
        error, check = self._reported[worker]
        if check is None:
            error.reraise()
        # The worker's traceback as the cause (shown with RECFORMER_TRACEBACK=1); the message is
        # the check's own sentence.
        raise DataError(check) from WorkerTraceback(f"{error.where}:\n{error.exc_msg}")

    def close(self) -> None:
        """Stop the workers (each exits at its next slot, at once when it is waiting for one) and
        free the ring. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self.ring.stop()
        for p in self._procs:
            if p.pid is not None and p.exitcode is None:
                p.join(timeout=2 * _POLL_S)
                if p.is_alive():  # still reading a window: nothing it writes matters any more
                    p.kill()
                    p.join()
        self.ring.close()
