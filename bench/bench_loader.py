"""Loader throughput against a raw pyarrow scan of the same files, and peak memory against size.

    python bench/bench_loader.py --data /tmp/bench_synth            # makes the data if missing
    python bench/bench_loader.py --data /tmp/bench_synth --rows 5000000 --json bench/out/loader.json

Side by side in one run, over ``--repeats`` rounds of raw, w1, raw, w2, ..., raw:
- ``raw``: ``ParquetFile.read_row_group(columns=spec columns, use_threads=False)`` over every row
  group: the single-thread ceiling of reading these files on this machine (decode included, no
  batching, no tensors).
- ``loader wN``: ``RecDataModule.train_dataloader()`` with N forked workers: shuffled windows,
  decoding, batches cut into shared slots, padded ``Batch`` objects in the training process. Timed
  from its first batch; the time to the first batch (worker start, first read) is printed apart.
- ``vs raw``: each loader run against the mean of the raw scans just before and after it, then the
  median over rounds (``spread``: min-max per worker). This machine's speed drifts by +-15% within a
  minute; a ratio of medians taken minutes apart mostly measured the drift.
- ``worker us/row``: CPU (utime + stime, /proc) each worker spends per row it delivers, from the
  first batch on; ``raw``'s is the scan's CPU per row. Their ratio is the per-worker figure a
  machine with a core per worker would show, without the clock drift.
- ``raw xN par.``: N raw scans in N processes at once: what these cores read together.
- ``against N raw scans at once``: each wN run against N raw scans started together just before
  and after it (their mean): the per-worker figure against what N readers of these cores achieve
  (shared caches and memory bus), not N times one scan alone, which two cores never reach.
- ``wN on C cores`` (when N >= C): the most rows/s C fully busy cores can deliver at the measured CPU
  per row of the workers and the training process together, and what that is per worker.
- ``--unpadded N``: also N workers with a training process that frees each slot without padding its
  batch: what the workers deliver when the training process does nothing (an upper bound, not a
  loader).
- ``--stages B ...``: CPU per row of each stage in one process at batch sizes B: ``read``,
  ``decode`` (per row group), ``cut`` (a worker's batch into its slot form), ``pad`` (the training
  process's ``to_batch``), ``other``. The per-batch fixed costs show as the difference between
  batch sizes. ``--repeats 0 --memory-files`` runs it alone.
- ``--raw-variants R``: is ``raw`` the ceiling? Other plain pyarrow reads of the same rows
  (``memory_map``, ``iter_batches`` of 2048-8192 rows) in R shuffled rounds, as CPU per row against
  ``read_row_group``'s in the same round. 2026-11-30, 30 rounds: ``memory_map`` 0.978 (quartiles
  0.95-0.99), ``iter_batches`` 2048 0.997 (0.96-1.19), 4096 1.206, 8192 1.200: the raw scan is within
  2-5% of the fastest plain read, and the loader reads the same way. Since 2026-12-01 both verify
  the page checksums recformer's writers add (``RecDataModule.verify_checksums``); the variant
  ``no checksum check`` prices that: 12 rounds on 1M rows (files from ``recformer data synth``,
  checksums written): 0.899 of the verified read's CPU (quartiles 0.83-0.94), i.e. verification
  costs about a tenth of the read.
The target is >= 0.7 of the raw rows/s *per worker*. Each worker is one process on one core, and the
training process needs a share of a core too (``main us/row``): on a 2-core machine two workers run
on cores the training process also uses.

Memory: peak RSS of the training process plus its workers while streaming the first 1, 2, ... files
(the same spec), each in a fresh subprocess; flat means the loader holds windows, not the dataset.

Measured 2026-11-30 on the 2-core dev machine (the commit after 8ff8f94), 5M rows (64 events per
row on average, 31% at the 100 cap; files written by ``recformer data synth`` with every column
declared non-null), the defaults plus ``--unpadded 2 --stages 256 1024 4096``:

| reader | rows/s | vs raw | per worker (spread over rounds) | CPU us/row | training process us/row |
| --- | --- | --- | --- | --- | --- |
| raw | 957k | 1.00 | 1.00 | 1.04 | |
| loader w1 | 719k | 0.75 | 0.75 (0.72-0.76) | 1.39 | 0.155 |
| loader w2 | 1162k | 1.22 | 0.61 (0.59-0.63) | 1.54 | 0.128 |
| w2, training process idle | 1308k | 1.37 | 0.68 (0.66-0.71) | 1.50 | 0.013 |
| raw x2 in parallel | 1691k | 1.77 | | | |

| batch | read | decode | cut | pad | other | total (CPU us/row, one process) |
| --- | --- | --- | --- | --- | --- | --- |
| 256 | 1.040 | 0.134 | 0.200 | 0.183 | 0.051 | 1.608 |
| 1024 | 1.062 | 0.142 | 0.150 | 0.108 | 0.033 | 1.496 |
| 4096 | 1.036 | 0.136 | 0.126 | 0.081 | 0.027 | 1.406 |

0.75 of a worker's time is the read itself. Two workers on two cores run at the CPU bound (1.67 us
per row with the training process: at most 1.20M rows/s, 0.63 per worker); an earlier run of the
same code read 0.64 (1.21M rows/s). Even with a training process that does nothing, two workers
deliver 0.68 each: on two cores the 0.7 target is out of reach of anything the training process
does, and needs the workers' own CPU per row down, or a core per worker (``bench/loader_device.sh``,
not run yet: no device lent). Peak memory 1761 / 1765 / 1774 MB for 1 / 2 / 5M rows.

A later run the same day (7 rounds, ``--memory-files`` none; a slower stretch of the machine: raw
910k, worker 1.52 us/row): w1 0.73, w2 0.62 per worker; 2 raw scans at once read 1.83 of one scan,
and w2 against them is 0.66 per worker (0.65-0.70 over rounds): short of 0.7 by either measure.
Re-run in the next session (commit 13 after bf46f78, 7 rounds, the same command with memory runs):
raw 1011k rows/s, w1 0.74 (0.70-0.77), w2 0.62 (0.61-0.65) per worker, against 2 raw scans at once
0.68 (0.66-0.72); 2 raw scans at once read 1.78 of one; peak memory 1781 / 1802 / 1799 MB for 1 / 2
/ 5M rows. A training process with the workers' allocator settings (``keep_freed_memory``) spent the
same CPU per row (0.124 against 0.126 us, 4 alternated rounds): its padding is not allocation-bound.

Steps. The batch plan in one compiled pass (``kernels.cut_plan``) and per-size transit layouts: cut
0.180 -> 0.146 us/row at 1024-row batches, 0.31 -> 0.20 at 256; w1 0.73 -> 0.75-0.76, w2 0.61 ->
0.61-0.64 (alternated with the commit before, three runs each). The earlier same-day run: raw 952k,
w1 681k (0.73), w2 1158k (0.61). Before the window-deep worker ring (commit 6d60749): w1 0.74, w2
0.56 each (1.72-1.81 of the 2 cores busy with two workers; 1.92-1.99 after). Before the non-null log
schema and ``keep_freed_memory`` (commit 1506dec, the same data written with nullable columns): raw
737k rows/s (1.35 us/row), w1 541k (0.73), w2 841k (0.58 each), worker 1.85 us/row. The schema made
the read itself 20% cheaper (1.31 -> 1.05 us/row, the same rows in both layouts, alternated in one
run); with the same code, old against new files alternated in one run, one worker went from 441-587k
to 639-730k rows/s (CPU 1.69-2.03 -> 1.36-1.54 us/row). Earlier sessions: 1 worker 0.71, then 0.64;
before the compiled kernels 0.43.

Design measurements. The figures behind the loader's design choices, each cited from the code that
made the choice (2-core dev machine, 100-event cap, 64 events a row on average, 2026-11):

- ``ring.WorkerPool`` vs the DataLoader's own queues (1024-row batches): the DataLoader's machinery
  (an index and a batch message per batch, feeder threads, record_function, pickling) cost a worker
  ~0.13 us/row and the training process 0.36-0.55 us/row; with the pool the training process spends
  0.15-0.24 us/row, most of it padding. A tensor crossing the worker queue is moved to a fresh
  shared-memory segment, ~11 ms a segment, hence one byte buffer per batch (``data/packed.py``).
- Ring depth (``RecDataLoader._pool``): with prefetch_factor + 2 slots two workers kept 1.72-1.81
  cores busy; a ring a window deep 1.92-1.99 cores, 978k-1157k against 841k-1038k rows/s.
- ``keep_freed_memory``: with Arrow's and glibc's default trimming, page faults cost 4-10% of a
  worker's CPU (``clear_page_erms`` in ``perf``) and decoding a row group 0.31 instead of 0.09 us per
  row in a loop.
- Kernels (``data/kernels.py``): prefetching rows ahead took the item column from 0.25 to 0.10
  us/row (any look-ahead from 2 to 16 rows read alike); a worker's cut went from 0.6-0.7 us/row
  (padded rows, ids mapped per batch) to 0.19-0.24 (ragged, mapped at decode) to 0.15 at 1024-row
  and 0.20 at 256-row batches (``cut_plan``); padding on arrival costs the training process ~0.08
  us/row plus ~27 us a batch; copying whole records costs a tenth of writing each field to its
  column; concatenating a window's row groups would cost 0.1 us/row; one tensor constructor per
  field in ``to_batch`` took it from 122 to 78 us a batch.
- Non-null writer schemas (``schema.required``): a row group reads in 1.05 instead of 1.31 CPU us per
  row (three 64-event list columns a row).
- Page checksums (``schema.CHECKSUMS``, 2026-12-01): 28 of 40 random single-bit flips in zstd data
  pages (34 of 40 uncompressed) changed a value silently, a label 0 becoming 1, a dense 184.38
  becoming 9.5e-24; with CRCs written and verified all 40 were refused (``tests/test_faults.py``).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from recformer.config import FeatureSpec  # noqa: E402
from recformer.data.datamodule import RecDataModule  # noqa: E402
from recformer.data.dataset import keep_freed_memory  # noqa: E402


def ensure_data(path: Path, rows: int, max_len: int) -> None:
    if (path / "spec.yaml").is_file():
        return
    from recformer.datasets.synth import write_synth

    write_synth(path, rows, val_rows=0, test_rows=0, max_len=max_len, rows_per_file=1_000_000, progress=True)


def raw_scan(
    data: Path,
    limit: int,
    memory_map: bool = False,
    chunk: int | None = None,
    first_file: int = 0,
    verify: bool = True,
) -> tuple[int, float, float]:
    """Rows read, wall seconds and CPU seconds of a single-thread scan: ``read_row_group`` per row
    group (what the loader's workers call), or with ``chunk`` ``iter_batches`` of that many rows;
    files from ``first_file`` on, wrapping round. Page checksums are verified as the loader
    verifies them (``verify=False``: not)."""
    spec = FeatureSpec.load(data / "spec.yaml")
    cols = spec.columns()
    files = sorted((data / "train").glob("*.parquet"))
    files = files[first_file % len(files) :] + files[: first_file % len(files)]
    rows, t0, c0 = 0, time.perf_counter(), time.process_time()
    for f in files:
        pf = pq.ParquetFile(f, memory_map=memory_map, page_checksum_verification=verify)
        if chunk is None:
            tables = (
                pf.read_row_group(i, columns=cols, use_threads=False)
                for i in range(pf.metadata.num_row_groups)
            )
        else:
            tables = pf.iter_batches(batch_size=chunk, columns=cols, use_threads=False)
        for t in tables:
            rows += t.num_rows
            if rows >= limit:
                return rows, time.perf_counter() - t0, time.process_time() - c0
    return rows, time.perf_counter() - t0, time.process_time() - c0


RAW_VARIANTS = {
    "read_row_group": {},
    "memory_map": {"memory_map": True},
    "iter_batches 2048": {"chunk": 2048},
    "iter_batches 4096": {"chunk": 4096},
    "iter_batches 8192": {"chunk": 8192},
    "no checksum check": {"verify": False},
}


def raw_variants(data: Path, limit: int, rounds: int) -> dict:
    """Is ``raw`` (``read_row_group``, the loader's own read) the ceiling? Other plain pyarrow reads
    of the same rows, each round in a shuffled order on the same file, as CPU per row against
    ``read_row_group``'s in that round: the median of those ratios and their quartiles (this
    machine's speed drifts too much for a ratio of medians)."""
    rng = np.random.default_rng(0)
    names = list(RAW_VARIANTS)
    ratios: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        us = {}
        for k in rng.permutation(len(names)):
            n, _, c = raw_scan(data, limit, first_file=r, **RAW_VARIANTS[names[k]])
            us[names[k]] = c / n * 1e6
        for name in names:
            cpu[name].append(us[name])
            ratios[name].append(us[name] / us["read_row_group"])
    out = {}
    for name in names:
        q = np.quantile(ratios[name], [0.25, 0.5, 0.75])
        out[name] = {"cpu_us_row": statistics.median(cpu[name]), "ratio": q[1], "q1": q[0], "q3": q[2]}
    return out


def _call_into(out, fn, *args) -> None:
    out.put(fn(*args))


def _in_child(fn, *args):
    """``fn(*args)`` in a forked process of its own (for settings that are process-wide)."""
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    p = ctx.Process(target=_call_into, args=(out, fn, *args))
    p.start()
    result = out.get()
    p.join()
    return result


class _Rows(int):
    """What ``unpadded_scan``'s training process takes out of a slot: the batch's row count."""

    def __len__(self) -> int:
        return int(self)


def unpadded_scan(data: Path, workers: int, limit: int, batch_size: int) -> dict:
    """``loader_scan`` with a training process that frees each slot without padding its batch
    (no ``to_batch``): what the workers deliver when the training process does nothing. An upper
    bound for moving the padding out of the training process, not a loader; run it in a child
    (``_in_child``), since it patches the ring."""
    from recformer.data import ring

    def take(self, worker: int, slot: int, pin: bool) -> _Rows:
        rows = self.header(worker, slot)
        self.release(worker)
        return _Rows(rows)

    ring.SlotRing.take = take
    return loader_scan(data, workers, limit, batch_size)


def _raw_child(data: Path, limit: int, start, out) -> None:
    start.wait()
    n, s, _ = raw_scan(data, limit)
    out.put(n / s)


def raw_parallel(data: Path, limit: int, k: int) -> float:
    """Total rows/s of ``k`` raw scans started at once, each in its own process: what this
    machine's cores read together (the memory bus and caches are shared). The sum of each scan's
    own rate: a scan that finishes first leaves the other a moment alone and faster, so this errs
    towards a higher ceiling, never a lower one."""
    ctx = mp.get_context("fork")
    out, start = ctx.Queue(), ctx.Barrier(k)
    procs = [ctx.Process(target=_raw_child, args=(data, limit, start, out)) for _ in range(k)]
    for p in procs:
        p.start()
    rates = [out.get() for _ in procs]
    for p in procs:
        p.join()
    return sum(rates)


_TICK = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    """utime + stime of a process, from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def loader_scan(data: Path, workers: int, limit: int, batch_size: int) -> dict:
    """rows/s after the first batch, seconds to the first batch, and CPU microseconds per row of
    the workers (together) and of the training process over the same stretch.

    Throughput is timed from the first batch on: starting the workers (fork, numba's cached
    kernel, the first read) happens once per epoch and is reported apart."""
    dm = RecDataModule(
        str(data),
        batch_size=batch_size,
        num_workers=workers,
        validate="footer",
        prefetch_factor=4,
        pin_memory=False,
    )
    dm.setup("fit")
    rows, t0, mark = 0, time.perf_counter(), None
    batches = iter(dm.train_dataloader())
    for batch in batches:
        if mark is None:
            kids = [p.pid for p in mp.active_children()]
            mark = (time.perf_counter(), time.process_time(), sum(_cpu_s(p) for p in kids))
        else:
            rows += len(batch)
        if rows >= limit:
            break
    wall, main_s = time.perf_counter() - mark[0], time.process_time() - mark[1]
    worker_s = sum(_cpu_s(p) for p in kids) - mark[2]
    batches.close()
    return {
        "rows_s": rows / wall,
        "first_s": mark[0] - t0,
        "worker_us": worker_s / rows * 1e6,
        "main_us": main_s / rows * 1e6,
    }


class _Timed:
    """Adds the CPU seconds of each call of ``fn`` to ``clock[name]``."""

    def __init__(self, fn, clock: dict, name: str):
        self.fn, self.clock, self.name = fn, clock, name

    def __call__(self, *args, **kwargs):
        c = time.process_time()
        try:
            return self.fn(*args, **kwargs)
        finally:
            self.clock[self.name] += time.process_time() - c


class _TimedFile:
    """A ParquetFile whose ``read_row_group`` is timed."""

    def __init__(self, path: Path, clock: dict):
        self.read_row_group = _Timed(pq.ParquetFile(path).read_row_group, clock, "read")


def stage_split(data: Path, limit: int, batch_size: int) -> dict:
    """CPU microseconds per row of each stage of the loader, run in this one process (no workers,
    so no transfer and no contention): ``read`` (``read_row_group``), ``decode`` (checks, id and gap
    mapping, records), ``cut`` (a worker's gather of a shuffled batch into its transit form) and
    ``pad`` (the training process's ``to_batch``); ``other`` is the rest of the loop (windows,
    permutations). Both processes' settings apply: the worker's allocator (``keep_freed_memory``,
    process-wide: ``main`` runs each split in a forked process of its own) for all stages."""
    keep_freed_memory()
    dm = RecDataModule(str(data), batch_size=batch_size, num_workers=0, validate="footer", pin_memory=False)
    dm.setup("fit")
    stream = dm.train_dataloader().stream
    stream.warm_up()
    clock = dict.fromkeys(("read", "decode", "cut", "pad"), 0.0)
    stream._files = OrderedDict((i, _TimedFile(f, clock)) for i, f in enumerate(stream.index.files))
    stream.decoder.decode = _Timed(stream.decoder.decode, clock, "decode")
    cut = _Timed(lambda data, idx: data.gather(idx, packed=True, buffer=buf), clock, "cut")
    pad = _Timed(stream.decoder.layout.to_batch, clock, "pad")
    buf = np.empty(stream.batch_bytes(), np.uint8)
    rows, c0 = 0, time.process_time()
    for window, idx in stream.worker_batches(0, 1):
        pad(cut(window, idx))
        rows += len(idx)
        if rows >= limit:
            break
    total = time.process_time() - c0
    out = {k: v / rows * 1e6 for k, v in clock.items()}
    out["other"] = total / rows * 1e6 - sum(out.values())
    out["total"] = total / rows * 1e6
    return out


MEM_CHILD = """
import resource, sys
sys.path.insert(0, {root!r})
from recformer.data.datamodule import RecDataModule
dm = RecDataModule({data!r}, batch_size={bs}, num_workers={w}, validate="footer", pin_memory=False)
dm.setup("fit")
n = sum(len(b) for b in dm.train_dataloader())
self_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
child_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
print(n, self_kb, child_kb)
"""


def peak_memory(data: Path, n_files: int, workers: int, batch_size: int) -> dict:
    files = sorted((data / "train").glob("*.parquet"))[:n_files]
    with tempfile.TemporaryDirectory() as tmp:
        sub = Path(tmp)
        (sub / "train").mkdir()
        for f in files:
            os.symlink(f, sub / "train" / f.name)
        for name in ("spec.yaml", "items.parquet"):
            if (data / name).exists():
                os.symlink(data / name, sub / name)
        code = MEM_CHILD.format(root=str(ROOT), data=str(sub), bs=batch_size, w=workers)
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    n, self_kb, child_kb = (int(x) for x in out.stdout.split())
    # ru_maxrss of children is the largest single worker, not their sum: count it once per worker.
    total_mb = (self_kb + workers * child_kb) / 1024
    return {
        "files": n_files,
        "rows": n,
        "main_mb": self_kb / 1024,
        "worker_mb": child_kb / 1024,
        "total_mb": total_mb,
    }


def throughput(a: argparse.Namespace) -> dict:
    """The side-by-side rounds and their table (see the module docstring)."""
    # Rounds of raw, w1, raw, w2, raw, ...: each loader run is compared with the mean of the raw
    # scans just before and after it. This machine's speed drifts by +-15% within a minute, so a
    # ratio of medians taken minutes apart would mostly measure the drift.
    raws: list[float] = []
    raw_cpu: list[float] = []
    readers = [(f"w{w}", w, False) for w in a.workers] + [(f"w{w} unpadded", w, True) for w in a.unpadded]
    loaders: dict[str, list[dict]] = {name: [] for name, _, _ in readers}
    for r in range(a.repeats):
        for name, w, unpadded in readers:
            n, s, c = raw_scan(a.data, a.limit)
            raws.append(n / s)
            raw_cpu.append(c / n * 1e6)
            par = [raw_parallel(a.data, a.limit, w)] if w > 1 and not unpadded else []
            if unpadded:
                run = _in_child(unpadded_scan, a.data, w, a.limit, a.batch_size)
            else:
                run = loader_scan(a.data, w, a.limit, a.batch_size)
            if par:
                # N scans at once just before and after: these cores' ceiling for N readers.
                run["par_raw"] = (par[0] + raw_parallel(a.data, a.limit, w)) / 2
                run["vs_par_raw"] = run["rows_s"] / run["par_raw"]
            run["raw_before"], run["workers"] = raws[-1], w
            loaders[name].append(run)
            print(
                f"  round {r}: raw {raws[-1]:10,.0f} rows/s   loader {name} {run['rows_s']:10,.0f} rows/s"
                f"   first batch after {run['first_s']:.2f} s"
            )
    n, s, c = raw_scan(a.data, a.limit)
    raws.append(n / s)
    raw_cpu.append(c / n * 1e6)
    in_order = (loaders[name][r] for r in range(a.repeats) for name, _, _ in readers)
    for k, run in enumerate(in_order):
        run["raw_after"] = raws[k + 1]
        run["ratio"] = run["rows_s"] / ((run["raw_before"] + run["raw_after"]) / 2)
    med = statistics.median
    parallel = {
        w: med(x["par_raw"] for x in loaders[f"w{w}"]) for w in a.workers if w > 1 and f"w{w}" in loaders
    }

    raw_us = med(raw_cpu)
    print("\nthroughput (loaders timed from their first batch; ratios against the raw scans around each run)")
    print(
        f"{'reader':20s} {'rows/s':>10s} {'vs raw':>7s} {'per worker':>10s} {'spread':>11s} "
        f"{'worker us/row':>13s} {'main us/row':>11s} {'first batch s':>13s}"
    )
    print(f"{'raw':20s} {med(raws):10,.0f} {1:7.2f} {1:10.2f} {'':11s} {raw_us:13.3f}")
    summary = {"raw": {"rows_s": med(raws), "cpu_us_per_row": raw_us, "runs": raws}}
    for name, runs in loaders.items():
        w = runs[0]["workers"]
        ratios = [x["ratio"] for x in runs]
        row = {
            "rows_s": med(x["rows_s"] for x in runs),
            "ratio": med(ratios),
            "per_worker": med(ratios) / w,
            "ratio_min_max": [min(ratios), max(ratios)],
            "worker_us_per_row": med(x["worker_us"] for x in runs),  # each worker, per row it delivers
            "main_us_per_row": med(x["main_us"] for x in runs),
            "first_batch_s": med(x["first_s"] for x in runs),
            "runs": runs,
        }
        par = [x["vs_par_raw"] for x in runs if "vs_par_raw" in x]
        if par:
            row["vs_parallel_raw"] = {"median": med(par), "min_max": [min(par), max(par)]}
        summary[f"loader {name}"] = row
        print(
            f"{'loader ' + name:20s} {row['rows_s']:10,.0f} {row['ratio']:7.2f} {row['per_worker']:10.2f} "
            f"{min(ratios) / w:5.2f}-{max(ratios) / w:4.2f} {row['worker_us_per_row']:13.3f} "
            f"{row['main_us_per_row']:11.3f} {row['first_batch_s']:13.2f}"
        )
    for w, v in parallel.items():
        summary[f"raw x{w} in parallel"] = v
        name = f"raw x{w} par."
        print(f"{name:20s} {v:10,.0f} {v / med(raws):7.2f}   ({w} raw scans at once: these cores' ceiling)")
    for name, runs in loaders.items():
        vs = summary[f"loader {name}"].get("vs_parallel_raw")
        if vs:
            w = runs[0]["workers"]
            print(
                f"loader {name} against {w} raw scans at once (just before and after each run): "
                f"{vs['median']:.2f} per worker ({vs['min_max'][0]:.2f}-{vs['min_max'][1]:.2f} over rounds)"
            )
    w_us = summary["loader w1"]["worker_us_per_row"] if "w1" in loaders else 0.0
    if w_us > 0:  # /proc counts CPU in clock ticks: a tiny run may show none
        print(
            f"\nCPU per delivered row: one worker {w_us:.3f} us, the raw scan {raw_us:.3f} us: "
            f"{raw_us / w_us:.2f} of a worker's time is the read itself"
        )
    cores = os.cpu_count() or 1
    for name, runs in loaders.items():
        w = runs[0]["workers"]
        if w < cores:
            continue
        # Workers and the training process share every core: what the measured CPU per row allows.
        row = summary[f"loader {name}"]
        cpu_us = row["worker_us_per_row"] + row["main_us_per_row"]  # worker_us: all workers, per row
        if cpu_us <= 0:
            continue
        bound = cores / cpu_us * 1e6
        row["cpu_bound_rows_s"] = bound
        print(
            f"{name} on {cores} cores: at {cpu_us:.2f} CPU us per row (workers + training process) the cores "
            f"deliver at most {bound:,.0f} rows/s, {bound / med(raws) / w:.2f} of the raw scan per worker"
        )
    return summary


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, default=Path("/tmp/bench_synth"))
    p.add_argument("--rows", type=int, default=5_000_000, help="rows to generate if --data is missing")
    p.add_argument("--max-len", type=int, default=100)
    p.add_argument("--limit", type=int, default=1_000_000, help="rows read per timed pass")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=5, help="0: skip the throughput rounds")
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    p.add_argument(
        "--unpadded",
        type=int,
        nargs="*",
        default=[],
        metavar="WORKERS",
        help="also these worker counts with a training process that does no padding (an upper bound)",
    )
    p.add_argument("--memory-files", type=int, nargs="*", default=[1, 2, 5], help="none: no memory runs")
    p.add_argument(
        "--stages",
        type=int,
        nargs="*",
        default=None,
        metavar="BATCH_SIZE",
        help="also split one process's CPU per row by stage, at these batch sizes (default: --batch-size)",
    )
    p.add_argument(
        "--raw-variants",
        type=int,
        default=0,
        metavar="ROUNDS",
        help="also time other plain pyarrow reads against read_row_group over ROUNDS shuffled rounds",
    )
    p.add_argument("--json", type=Path, default=None)
    a = p.parse_args()
    ensure_data(a.data, a.rows, a.max_len)
    total = sum(pq.ParquetFile(f).metadata.num_rows for f in (a.data / "train").glob("*.parquet"))
    if a.repeats > 0 and a.limit > 0.9 * total:
        # The workers' CPU time is read from /proc when the pass ends: they must still be running.
        p.error(
            f"--limit={a.limit} must stay below 90% of the data's {total} train rows: a timed pass must "
            "end mid-epoch"
        )
    print(f"data: {a.data} ({total} train rows), timed passes of {a.limit} rows, {os.cpu_count()} cores")

    summary = throughput(a) if a.repeats > 0 else {}
    mem = [peak_memory(a.data, n, 2, a.batch_size) for n in a.memory_files]
    if mem:
        print("\npeak memory, 2 workers, full epoch")
        print(f"{'files':>5s} {'rows':>10s} {'main MB':>8s} {'worker MB':>10s} {'total MB':>9s}")
    for m in mem:
        print(
            f"{m['files']:5d} {m['rows']:10d} {m['main_mb']:8.0f} {m['worker_mb']:10.0f} {m['total_mb']:9.0f}"
        )
    stages = {}
    if a.stages is not None:
        print(
            "\nCPU us per row by stage, in one process (read, decode: a worker per row group; cut: a "
            "worker per batch; pad: the training process per batch)"
        )
        names = ("read", "decode", "cut", "pad", "other", "total")
        print(f"{'batch':>6s} " + " ".join(f"{n:>7s}" for n in names))
        for bs in a.stages or [a.batch_size]:
            stages[bs] = _in_child(stage_split, a.data, a.limit, bs)
            print(f"{bs:6d} " + " ".join(f"{stages[bs][n]:7.3f}" for n in names))
    variants = raw_variants(a.data, a.limit, a.raw_variants) if a.raw_variants else {}
    if variants:
        print(
            f"\nraw read variants: CPU per row against read_row_group's in the same round, "
            f"{a.raw_variants} rounds"
        )
        print(f"{'read':>18s} {'us/row':>7s} {'ratio':>6s} {'quartiles':>12s}")
    for name, v in variants.items():
        print(f"{name:>18s} {v['cpu_us_row']:7.3f} {v['ratio']:6.3f} {v['q1']:5.2f}-{v['q3']:.2f}")
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        out = {"throughput": summary, "memory": mem, "stages": stages, "raw_variants": variants}
        a.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
