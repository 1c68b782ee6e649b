"""The compiled kernels (worker half and training-process half) against plain-Python references,
and the shared-slot worker path against the in-process loader."""

from __future__ import annotations

import dataclasses
import math
import multiprocessing
import os
import re
import signal
import time
from unittest import mock

import numpy as np
import pyarrow as pa
import pytest
import torch

from recformer.batch import DataError
from recformer.config import CategoricalField
from recformer.data import kernels, ring
from recformer.data.datamodule import RecDataLoader, RecDataModule
from tests.conftest import log_table, tiny_spec


def ragged(rng: np.random.Generator, rows: int, max_len: int) -> np.ndarray:
    lens = rng.integers(0, 2 * max_len + 1, rows)
    lens[:3] = [0, max_len, 2 * max_len]  # empty, exactly L, truncated
    return np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)


def reference(off, items, item_limit, cats, cat_limits, gaps, buckets, idx, L):
    """One row at a time, the rule in the kernel's docstring."""
    B, C = len(idx), len(cat_limits)
    out_item, out_cat = np.zeros((B, L), np.int64), np.zeros((B, L, C), np.int64)
    out_gap, out_mask = np.zeros((B, L), np.int64), np.zeros((B, L), bool)
    oov = np.zeros(1 + C, np.int64)
    for r, i in enumerate(idx):
        ev = list(range(off[i], off[i + 1]))[-L:] if L else []
        pad = L - len(ev)
        for t, s in enumerate(ev, start=pad):
            out_mask[r, t] = True
            ok = items[s] < item_limit
            out_item[r, t] = items[s] + 1 if ok else 0
            oov[0] += not ok
            for j in range(C):
                ok = cats[j, s] < cat_limits[j]
                out_cat[r, t, j] = cats[j, s] + 1 if ok else 0
                oov[1 + j] += not ok
            if buckets:
                out_gap[r, t] = min(math.floor(math.log2(1 + float(gaps[s]) / 60.0)), buckets - 1) + 1
    return out_item, out_cat, out_gap, out_mask, oov


def pad(off, items, item_limit, cats, cat_limits, gaps, buckets, idx, L, pos=None, n=None):
    """The decode-time mapping, the worker kernel (ragged events at batch rows ``pos``) then the
    training-process kernel (padding), as ``Decoder``, ``Window.gather`` and
    ``BatchLayout.to_batch`` run them."""
    C, B = len(cat_limits), len(idx)
    n = B if n is None else n
    pos = np.arange(B) if pos is None else pos
    item_rows, cat_rows = np.empty(len(items), np.int32), np.empty(cats.shape, cats.dtype)
    assert kernels.map_ids(items, item_limit, item_rows) == 0
    for j in range(C):
        assert kernels.map_ids(cats[j], cat_limits[j], cat_rows[j]) == 0
    gap_rows = np.empty(len(gaps), np.uint8)
    if buckets:
        assert kernels.map_gaps(gaps, 60.0, buckets, gap_rows) == (0, 0)
    lens = np.zeros(n, np.int64)
    lens[pos] = np.minimum(off[idx + 1] - off[idx], L)
    start = np.cumsum(lens) - lens
    E = int(lens.sum())
    ev = np.full(E, -1, np.int32), np.full(E * C, -1, cats.dtype), np.full(E, 255, np.uint8)
    oov = np.zeros(1 + C, np.int64)
    kernels.gather_events(off, item_rows, cat_rows, gap_rows, L, idx, pos, start, *ev, oov)
    out = (
        np.full((n, L), -1, np.int32),
        np.full((n, L, C), -1, cats.dtype),
        np.full((n, L), 255, np.uint8),
        np.zeros((n, L), bool),
    )
    kernels.pad_events(lens, *ev, *out)
    return (*out, oov)


@pytest.mark.parametrize("n_cats", [0, 1, 3])
@pytest.mark.parametrize("item_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("with_gaps", [True, False])
def test_event_kernels_match_reference(n_cats, item_dtype, with_gaps):
    rng = np.random.default_rng(n_cats)
    L, rows, limit = 7, 60, 40
    off = ragged(rng, rows, L)
    n = int(off[-1])
    items = rng.integers(0, limit + 10, n).astype(item_dtype)  # some >= limit: OOV
    cat_limits = np.array([3, 5, 2][:n_cats], np.int64)
    cats = np.zeros((n_cats, n), np.int16)
    for j, c in enumerate(cat_limits):
        cats[j] = rng.integers(0, c + 2, n)
    gaps = rng.exponential(3600.0, n).astype(np.float32) if with_gaps else np.zeros(0, np.float32)
    buckets = 9 if with_gaps else 0
    idx = rng.permutation(rows)[:45]
    got = pad(off, items, limit, cats, cat_limits, gaps, buckets, idx, L)
    want = reference(off, items, limit, cats, cat_limits, gaps, buckets, idx, L)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    assert got[-1][0] > 0 and (n_cats == 0 or got[-1][1:].sum() > 0)  # the OOV paths ran


def test_gap_buckets_are_exact_at_the_edges():
    """Bucket b holds gaps with floor(log2(1 + g / 60)) == b - 1: 60 * (2**k - 1) seconds is the
    first gap of bucket k + 1, and the float32 just below it is still in bucket k."""
    edges = np.array([60.0 * (2**k - 1) for k in range(1, 12)], np.float32)
    below = np.nextafter(edges, np.float32(0))
    gaps = np.concatenate([[0.0], edges, below]).astype(np.float32)
    off = np.arange(len(gaps) + 1, dtype=np.int64)
    items = np.zeros(len(gaps), np.int32)
    cats = np.zeros((0, len(gaps)), np.int16)
    rows = np.arange(len(gaps))
    out = pad(off, items, 10, cats, np.zeros(0, np.int64), gaps, 64, rows, 1)[2]
    k = np.arange(1, 12)
    assert out[0, 0] == 1
    np.testing.assert_array_equal(out[1:12, 0], k + 1)
    np.testing.assert_array_equal(out[12:, 0], k)
    np.testing.assert_array_equal(kernels.bucket_gaps(gaps, 60.0, 64), out[:, 0])


def test_count_oov_counts_only_kept_events():
    off = np.array([0, 5, 6], np.int64)
    items = np.array([0, 0, 2, 3, 4, 0], np.int32)  # rows; row 0 keeps its last 3 events (L = 3)
    cats = np.array([[0, 1, 1, 0, 1, 1]], np.int16)
    oov = np.zeros(2, np.int64)
    kernels.count_oov(off, items, cats, 3, oov)
    assert oov.tolist() == [1, 1]


def test_id_mapping_rejects_negative_ids_and_narrows():
    out = np.empty(4, np.int8)
    assert kernels.map_ids(np.array([0, 126, 127, 5000], np.int64), 127, out) == 0
    assert out.tolist() == [1, 127, 0, 0]  # 127 and 5000 are OOV at vocab 127
    assert kernels.map_ids(np.array([3, -2, 1], np.int32), 10, np.empty(3, np.int16)) == -2


def test_unsigned_ids_map_like_signed_ones():
    """uint64 against the int64 limit: numba compares them as floats, exact for these."""
    out = np.full(4, -9, np.int16)
    assert kernels.map_ids(np.array([2**63 + 5, 3, 2**64 - 1, 9], np.uint64), 10, out) == 0
    assert out.tolist() == [0, 4, 0, 10]


def test_a_record_batch_without_rows_decodes_to_an_empty_window():
    t = log_table(20, 0, seed=4)
    empty = pa.RecordBatch.from_arrays([c.combine_chunks().slice(0, 0) for c in t.columns], schema=t.schema)
    d = decode_table(tiny_spec(), empty)
    assert len(d) == 0 and len(d.gather(np.arange(0))) == 0


def test_gap_mapping_counts_bad_gaps():
    gaps = np.array([0.0, -1.0, np.nan, np.inf, 59.0], np.float32)
    out = np.empty(len(gaps), np.uint8)
    assert kernels.map_gaps(gaps, 60.0, 8, out) == (2, 1)
    assert out[[0, 4]].tolist() == [1, 1]


def test_records_go_whole_to_their_positions_then_into_field_columns():
    rng = np.random.default_rng(0)
    rows = rng.integers(0, 2**32, (20, 5), dtype=np.uint64).astype(np.uint32)
    rows[:, 3:] = rng.integers(0, 2, (20, 2))  # words 3-4: the OOV flags
    idx, pos = np.array([3, 17, 0, 3], np.int64), np.array([2, 0, 3, 1], np.int64)
    rec = np.zeros((4, 5), np.uint32)
    oov = np.zeros(2, np.int64)
    kernels.gather_records(rows, idx, pos, 3, rec, oov)
    np.testing.assert_array_equal(rec[pos], rows[idx])
    np.testing.assert_array_equal(oov, rows[idx, 3:].sum(axis=0))
    # field 0: words 0-1 of a record -> words 0..7 of out; field 1: word 2 -> words 8..11
    out = np.zeros(12, np.uint32)
    src_off, dst_off, width = (np.array(v, np.int64) for v in ([0, 2], [0, 8], [2, 1]))
    kernels.scatter_records(rec, src_off, dst_off, width, out)
    np.testing.assert_array_equal(out[:8].reshape(4, 2), rec[:, :2])
    np.testing.assert_array_equal(out[8:], rec[:, 2])


def test_events_go_to_the_rows_at_their_positions():
    off = np.array([0, 2, 3], np.int64)
    items = np.array([4, 5, 6], np.int32)  # ids: rows 5, 6, 7
    cats = np.zeros((0, 3), np.int16)
    idx, pos = np.array([1, 0]), np.array([2, 0])  # window rows 1, 0 -> batch rows 2, 0
    item, _, _, mask, _ = pad(off, items, 10, cats, np.zeros(0, np.int64), np.zeros(0), 0, idx, 2, pos, n=3)
    assert item.tolist() == [[5, 6], [0, 0], [0, 7]]  # batch row 1 has no events
    assert mask.tolist() == [[True, True], [False, False], [False, True]]


@pytest.mark.parametrize("sizes", [[50], [7, 0, 30, 13], [0, 20]])
def test_cut_plan_matches_numpy(sizes):
    rng = np.random.default_rng(len(sizes))
    starts = np.cumsum([0, *sizes])
    kept = rng.integers(0, 6, starts[-1]).astype(np.int32)
    idx = rng.permutation(starts[-1])[:25]
    B, P = len(idx), len(sizes)
    lens, (first, rows, pos) = np.empty(B, np.int32), np.empty((3, B), np.int64)
    bounds = np.empty(P + 1, np.int64)
    events = kernels.cut_plan(idx, starts, kept, rows, pos, bounds, lens, first)
    assert events == kept[idx].sum()
    assert lens.tolist() == kept[idx].tolist()
    assert first.tolist() == (np.cumsum(kept[idx]) - kept[idx]).tolist()
    part = np.searchsorted(starts, idx, side="right") - 1
    for p in range(P):
        at = np.flatnonzero(part == p)  # batch rows of part p, in batch order
        assert pos[bounds[p] : bounds[p + 1]].tolist() == at.tolist()
        assert rows[bounds[p] : bounds[p + 1]].tolist() == (idx[at] - starts[p]).tolist()
    for bad, r in (([3, starts[-1], 1], 1), ([-1], 0)):
        assert kernels.cut_plan(np.array(bad), starts, kept, rows, pos, bounds, lens, first) == -1 - r


def test_transit_plan_is_the_planned_transit_layout():
    from recformer.data.packed import PackedBatch

    lay = decode_table(tiny_spec(), log_table(4, 0, seed=1)).layout
    for n in (1, 5, 32):
        for events in (0, 1, 3, 7, 32 * lay.max_len):
            assert lay.transit_plan(n, events) == PackedBatch.plan(lay.transit(n, events))


def test_a_window_of_parts_gathers_like_one_part(tiny_data):
    from recformer.data.decode import Window

    dm = module(tiny_data, 0)
    dm.setup("fit")
    stream = dm._stream("train", train=True)
    whole = stream._group(stream.index.groups[0])
    idx = np.random.default_rng(0).permutation(len(whole))[:40]
    cuts = [0, 7, 30, len(whole)]
    window = Window([whole.slice(a, b) for a, b in zip(cuts, cuts[1:])])
    assert len(window) == len(whole)
    assert_same_batches([window.gather(idx)], [whole.gather(idx)])


# -- the worker path ---------------------------------------------------------------------------


def all_batches(loader) -> list:
    return [dataclasses.replace(b) for b in loader]


def assert_same_batches(got: list, want: list) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        for f in dataclasses.fields(w):
            a, b = getattr(g, f.name), getattr(w, f.name)
            assert a.dtype == b.dtype and torch.equal(a, b), f.name


def module(tiny_data, workers: int) -> RecDataModule:
    return RecDataModule(
        str(tiny_data), batch_size=32, num_workers=workers, shuffle_window=96, validate="footer"
    )


def pipe_batches(tiny_data, monkeypatch) -> list:
    """The same forked workers run by the DataLoader itself: batches pickled through the pipe."""
    with monkeypatch.context() as m:
        m.setattr(RecDataLoader, "_pool", lambda self, layout, pin: None)
        return all_batches(module(tiny_data, 2).train_dataloader())


def test_forked_workers_ship_through_slots_and_batches_stay_intact(tiny_data, monkeypatch):
    """Every batch comes through a slot, and batches kept by the caller are not overwritten when
    their slots are reused (17 batches through 2 workers x 6 slots)."""
    want = pipe_batches(tiny_data, monkeypatch)
    taken = []
    take = ring.SlotRing.take
    monkeypatch.setattr(
        ring.SlotRing, "take", lambda self, w, slot, pin: taken.append(slot) or take(self, w, slot, pin)
    )
    dm = module(tiny_data, 2)
    got = all_batches(dm.train_dataloader())
    assert len(taken) == len(got) == 17
    assert set(taken) == set(range(dm.prefetch_factor + 2))  # every slot used, then reused
    assert_same_batches(got, want)
    assert not ring._RINGS  # closed at the end of the epoch


def test_forked_workers_leave_the_training_rng_as_the_dataloader_does(tiny_data, monkeypatch):
    """A DataLoader iterator draws its workers' base seed from the training process's RNG; the pool
    makes the same draw, so dropout and the rest of a run see the same random stream either way."""

    def rng_after_an_epoch() -> float:
        torch.manual_seed(0)
        all_batches(module(tiny_data, 2).train_dataloader())
        return torch.rand(1).item()

    with monkeypatch.context() as m:
        m.setattr(RecDataLoader, "_pool", lambda self, layout, pin: None)
        want = rng_after_an_epoch()
    assert rng_after_an_epoch() == want


def test_spawned_workers_use_the_pipe_and_agree(tiny_data):
    want = all_batches(module(tiny_data, 2).train_dataloader())  # forked: through the slots
    stream = module(tiny_data, 2)._stream("train", train=True)
    loader = RecDataLoader(stream, num_workers=2, multiprocessing_context="spawn")
    assert loader._pool(None, False) is None
    assert_same_batches(all_batches(loader), want)


def _has_jemalloc() -> bool:
    try:
        pa.jemalloc_memory_pool()
    except NotImplementedError:
        return False
    return True


@pytest.mark.parametrize("path", ["slots", "pipe"])
def test_workers_keep_freed_memory_and_the_training_process_is_left_alone(
    tiny_data, tmp_path, monkeypatch, path
):
    """Loader workers read through Arrow's jemalloc pool (purging off: ``keep_freed_memory``); the
    training process's allocators are not touched."""
    from recformer.data.dataset import ParquetStream

    read = ParquetStream._read

    def spy(self, pieces):
        (tmp_path / f"{os.getpid()}.pool").write_text(pa.default_memory_pool().backend_name)
        return read(self, pieces)

    monkeypatch.setattr(ParquetStream, "_read", spy)
    if path == "pipe":
        monkeypatch.setattr(RecDataLoader, "_pool", lambda self, layout, pin: None)
    before = pa.default_memory_pool().backend_name
    assert len(all_batches(module(tiny_data, 2).train_dataloader())) == 17
    seen = {f.stem: f.read_text() for f in tmp_path.glob("*.pool")}
    assert len(seen) == 2 and str(os.getpid()) not in seen
    assert set(seen.values()) == {"jemalloc" if _has_jemalloc() else before}
    assert pa.default_memory_pool().backend_name == before


def test_an_abandoned_epoch_stops_its_workers_and_frees_its_ring(tiny_data):
    loader = module(tiny_data, 2).train_dataloader()
    it = iter(loader)
    next(it), next(it)
    assert len(ring._RINGS) == 1
    workers = multiprocessing.active_children()
    assert len(workers) == 2
    it.close()
    assert not ring._RINGS
    assert not any(p.is_alive() for p in workers)
    assert len(all_batches(loader)) == 17  # the next epoch runs normally


def test_abandoning_an_epoch_stops_a_busy_worker_at_once(tiny_data, monkeypatch):
    """A worker deep in a read when the epoch is abandoned is killed, even when it inherited a
    SIGTERM handler that ignores the signal (as Lightning installs in the training process)."""
    from recformer.data.dataset import ParquetStream

    batches = ParquetStream.worker_batches

    def slow(self, wid, nw):
        for k, b in enumerate(batches(self, wid, nw)):
            if wid == 1 and k == 1:
                time.sleep(60)
            yield b

    monkeypatch.setattr(ParquetStream, "worker_batches", slow)
    previous = signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        it = iter(module(tiny_data, 2).train_dataloader())
        next(it), next(it), next(it)  # worker 0, worker 1, worker 0; worker 1 is now asleep
        workers = multiprocessing.active_children()
        start = time.monotonic()
        it.close()
        assert time.monotonic() - start < 3
        assert not any(p.is_alive() for p in workers)
    finally:
        signal.signal(signal.SIGTERM, previous)


def stuck_in_fork(tmp_path, monkeypatch, worker: int, times: int) -> None:
    """The first ``times`` processes of ``worker`` hang before they mark the ring started, as a
    child stuck in CPython's fork (python/cpython#112275) does; a file counts them across forks."""
    announce = ring.SlotRing.announce

    def hang_first(self, w):
        if w == worker:
            count = tmp_path / "forks"
            n = int(count.read_text()) if count.exists() else 0
            count.write_text(str(n + 1))
            if n < times:
                time.sleep(600)
        announce(self, w)

    monkeypatch.setattr(ring.SlotRing, "announce", hang_first)
    monkeypatch.setattr(ring, "_START_S", 0.5)


def test_a_worker_stuck_in_its_fork_is_forked_again_and_the_epoch_is_unchanged(
    tiny_data, tmp_path, monkeypatch, caplog
):
    want = all_batches(module(tiny_data, 2).train_dataloader())
    stuck_in_fork(tmp_path, monkeypatch, worker=1, times=2)
    start = time.monotonic()
    with caplog.at_level("WARNING", logger="recformer.data.ring"):
        got = all_batches(module(tiny_data, 2).train_dataloader())
    assert time.monotonic() - start < 20
    assert_same_batches(got, want)
    assert (tmp_path / "forks").read_text() == "3"
    said = [r.getMessage() for r in caplog.records if r.name == "recformer.data.ring"]
    assert [m.split(" (pid")[0] for m in said] == ["DataLoader worker process 1"] * 2
    assert "python/cpython#112275" in said[0]
    assert not multiprocessing.active_children() and not ring._RINGS


def test_a_worker_that_never_starts_is_an_error_not_a_hang(tiny_data, tmp_path, monkeypatch):
    stuck_in_fork(tmp_path, monkeypatch, worker=0, times=99)
    monkeypatch.setattr(ring, "_START_TRIES", 2)
    with pytest.raises(RuntimeError, match=r"worker process 0 did not start in 2 forks.*cpython#112275"):
        all_batches(module(tiny_data, 1).train_dataloader())
    assert (tmp_path / "forks").read_text() == "2"
    assert not multiprocessing.active_children() and not ring._RINGS


def test_a_worker_that_started_is_never_killed_for_a_slow_start(tiny_data, monkeypatch):
    """The restart stops the process before it looks: one that started in the meantime goes on."""
    loader = module(tiny_data, 1).train_dataloader()
    pool = loader._pool(loader.stream.decoder.layout, False)
    try:
        pool._start(0)
        deadline = time.monotonic() + 30
        while not pool.ring.started(0) and time.monotonic() < deadline:
            time.sleep(0.01)
        p = pool._procs[0]
        pool._restart(0)
        assert pool._procs[0] is p and p.is_alive() and pool._forks == [1]
        with open(f"/proc/{p.pid}/stat") as fh:
            assert fh.read().rsplit(")", 1)[1].split()[0] != "T"  # running again, not stopped
    finally:
        pool.close()


@pytest.mark.parametrize("where", ["reading", "gathering"])
def test_an_error_in_a_forked_worker_reaches_the_training_process(tiny_data, monkeypatch, where):
    """Raised while reading the next window, or while writing a batch into a slot already taken:
    the training process gets every batch before it, then the error with the worker's message."""
    from recformer.data.dataset import ParquetStream

    batches = ParquetStream.worker_batches
    error = DataError("part-7.parquet row group 3: column 'label' has nulls")

    def failing(self, wid, nw):
        for k, (data, idx) in enumerate(batches(self, wid, nw)):
            if wid == 1 and k == 2:
                if where == "reading":
                    raise error
                data = mock.Mock(gather=mock.Mock(side_effect=error))
            yield data, idx

    monkeypatch.setattr(ParquetStream, "worker_batches", failing)
    got = []
    with pytest.raises(DataError) as info:
        for b in module(tiny_data, 2).train_dataloader():
            got.append(b)
    assert len(got) == 5  # worker 0's 0, 1, 2 and worker 1's 0, 1: everything before the error
    assert not ring._RINGS
    # The check's own sentence (the CLI prints it as one line); where it came from as its cause.
    assert str(info.value) == str(error)
    assert re.search(r"(?s)worker process 1.*Traceback", str(info.value.__cause__))


def test_another_error_in_a_forked_worker_keeps_the_workers_traceback(tiny_data, monkeypatch):
    from recformer.data.dataset import ParquetStream

    def failing(self, wid, nw):
        raise KeyError("not a data check")
        yield

    monkeypatch.setattr(ParquetStream, "worker_batches", failing)
    with pytest.raises(KeyError, match=r"(?s)Caught KeyError in DataLoader worker process \d.*Traceback"):
        next(iter(module(tiny_data, 1).train_dataloader()))


def test_a_data_check_from_a_spawned_worker_reads_as_its_own_sentence(tiny_data, monkeypatch):
    """The DataLoader's own workers (spawn) re-raise a DataError with the worker's traceback as
    its text; the loader raises the check's sentence instead (simulated in-process: spawning
    re-imports torch for seconds)."""
    from torch._utils import ExceptionWrapper

    from recformer.data.dataset import ParquetStream

    message = "a.parquet (row group 2): column 'label' has 1 null value(s)\nsecond line"
    try:
        raise DataError(message)
    except DataError:
        wrapped = ExceptionWrapper(where="in DataLoader worker process 0")

    def failing(self):
        wrapped.reraise()
        yield

    monkeypatch.setattr(ParquetStream, "__iter__", failing)
    with pytest.raises(DataError) as info:
        next(iter(module(tiny_data, 0).train_dataloader()))
    assert str(info.value) == message
    assert "Original Traceback" in str(info.value.__cause__)


def test_forked_workers_deliver_evaluation_batches_like_the_pipe(tiny_data, monkeypatch):
    """Evaluation batches (slices of the window, not shuffled rows) in the same order."""
    with monkeypatch.context() as m:
        m.setattr(RecDataLoader, "_pool", lambda self, layout, pin: None)
        want = all_batches(module(tiny_data, 2).val_dataloader())
    assert_same_batches(all_batches(module(tiny_data, 2).val_dataloader()), want)


def test_a_killed_forked_worker_is_reported(tiny_data, monkeypatch):
    from recformer.data.dataset import ParquetStream

    batches = ParquetStream.worker_batches

    def killed(self, wid, nw):
        for k, b in enumerate(batches(self, wid, nw)):
            if wid == 0 and k == 1:
                os.kill(os.getpid(), signal.SIGKILL)
            yield b

    monkeypatch.setattr(ParquetStream, "worker_batches", killed)
    with pytest.raises(
        RuntimeError, match=r"worker process 0 \(pid \d+\) exited unexpectedly with exit code -9"
    ):
        list(module(tiny_data, 2).train_dataloader())
    assert not ring._RINGS


# -- decoding edge cases -----------------------------------------------------------------------


def decode_table(spec, table):
    from recformer.data.decode import Decoder
    from recformer.data.schema import Where

    return Decoder(spec).decode(table, Where("t.parquet", 0))


def with_list_type(table, name: str, value_type):
    col = table.column(name).combine_chunks()
    return table.set_column(table.schema.get_field_index(name), name, col.cast(pa.list_(value_type)))


def test_narrow_event_ids_with_a_large_vocabulary_decode():
    """uint8 storage, vocab 1000: the OOV clip must not overflow the stored dtype."""
    spec = tiny_spec()
    spec.sequence.categorical[0] = CategoricalField(name="hist_actions", vocab_size=1000)
    table = with_list_type(log_table(40, 0, seed=1), "hist_actions", pa.uint8())
    batch = decode_table(spec, table).gather(np.arange(40))
    assert batch.hist_cat.dtype == torch.int16  # 1001 rows
    for i, acts in enumerate(table.column("hist_actions").to_pylist()):
        kept = acts[-spec.sequence.max_len :]
        assert batch.hist_cat[i, len(batch.hist_cat[i]) - len(kept) :, 0].tolist() == [a + 1 for a in kept]


def test_float16_gaps_decode_like_float32():
    spec, table = tiny_spec(), log_table(40, 0, seed=2)
    half = with_list_type(table, "hist_gaps", pa.float16())
    as_f32 = with_list_type(half, "hist_gaps", pa.float32())
    a, b = (decode_table(spec, t).gather(np.arange(40)) for t in (half, as_f32))
    assert torch.equal(a.hist_gap, b.hist_gap)


def test_pinned_batches_are_views_of_one_tensor(monkeypatch):
    """With ``pin``, every field must be a view of the one pinned tensor (a GPU copy records its
    event on that allocation); without, fields may be separate tensors over numpy views. No CUDA
    here: torch.empty ignores pin_memory, which leaves the structure to check."""
    d = decode_table(tiny_spec(), log_table(40, 0, seed=5))
    packed = d.gather(np.arange(17), packed=True)
    real_empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, pin_memory=False, **k: real_empty(*a, **k))
    pinned, plain = d.layout.to_batch(packed, pin=True), d.layout.to_batch(packed)
    storages = {t.untyped_storage().data_ptr() for t in pinned.tensors().values() if t.numel()}
    assert len(storages) == 1
    assert_same_batches([pinned], [plain])


def test_gather_refuses_rows_outside_the_window():
    d = decode_table(tiny_spec(), log_table(20, 0, seed=3)).slice(0, 10)
    for bad in ([10], [-1]):
        with pytest.raises(IndexError, match="outside a window of 10 rows"):
            d.gather(np.array(bad))


def test_a_worker_waiting_for_a_slot_exits_when_the_ring_stops():
    ctx = multiprocessing.get_context("fork")
    slots = ring.SlotRing(ctx, workers=1, slots=1, slot_bytes=64, layout=None)
    slots.acquire(0)  # the only slot is taken: the child's acquire waits

    child = ctx.Process(target=slots.acquire, args=(0,))
    child.start()
    time.sleep(0.3)
    assert child.is_alive()
    slots.stop()
    child.join(timeout=2)
    assert child.exitcode == 0
    slots.close()
