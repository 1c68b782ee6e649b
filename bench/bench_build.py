"""``recformer data build`` (polars, bucketed, streaming) against a plain pyarrow/numpy build of
the same rows, in rows/s and peak memory, at growing log sizes.

    python bench/bench_build.py                                   # 1M, 10M, 30M events
    python bench/bench_build.py --events 1000000 --json bench/out/build.json

Per size, side by side in one run:
- ``events``: a synthetic log written once per size in 1M-event chunks (constant memory): users
  ``events / 40`` with Zipf-skewed activity, 100k items with Zipf popularity, a year of second
  timestamps, a 0/1 label (30% positive), a device string, a price, an action id.
- ``polars``: ``recformer data build`` in a child process on the mapping below (user and item
  priors, hour and day, history of items + action + label, max_len 50, per-user 80/10/10 split,
  vocabularies and dense normalisation on train). Peak memory is the child's own (``build.json``).
- ``numpy``: a child process doing the same work with whole-array numpy and pyarrow, as the MovieLens
  builder did before ``data build`` existed: read every event into memory, lexsort, the histories by
  gather, priors by cumulative sums, the split, the three files, value counts of the vocabularies.
  Run under an address-space limit (``--numpy-limit-gib``) so it fails instead of swapping the
  machine; a size it cannot do in that limit is reported as such.

Both outputs are checked to hold the same number of rows and history events per split.

2026-12-01, 2 cores (``--events 1000000 10000000`` then ``--events 30000000``)::

    | events     | builder | seconds | events/s | peak memory MiB |
    | 1,000,000  | polars  |    13.3 |   74,947 |  1,391 |
    | 1,000,000  | numpy   |    10.4 |   96,096 |  1,270 |
    | 10,000,000 | polars  |   146.8 |   68,119 |  1,796 |
    | 10,000,000 | numpy   |   158.9 |   62,942 | 11,194 |
    | 30,000,000 | polars  |   508.1 |   59,039 |  1,862 |
    | 30,000,000 | numpy   | failed within a 16 GiB address-space limit (a 4.47 GiB history array) |

The 30M run was the second: the first found one duplicate (user, item, second) in the synthetic
events and refused to build, which is how ``duplicates: drop`` came into the mapping above.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

ROOT = Path(__file__).resolve().parents[1]
MAX_LEN = 50
MAPPING = {
    "columns": {"user": "user", "item": "item", "time": "ts", "label": "click"},
    "features": {
        "categorical": ["device"],
        "dense": ["price"],
        "log1p": ["price"],
        "history": ["click", "action"],
        "time": ["hour", "dow"],
        "priors": ["user", "item"],
        "user_id": {"min_count": 5},
    },
    "split": {"by": "user", "val": 0.1, "test": 0.1, "min_events": 10},
    "max_len": MAX_LEN,
    "duplicates": "drop",  # the generator repeats a (user, item, second) about once in 30M events
}


def make_events(n: int, path: Path, seed: int = 0, chunk: int = 1_000_000) -> None:
    """``n`` events in 1M-event row groups; the writer holds one chunk at a time."""
    rng = np.random.default_rng(seed)
    users, items = max(1, n // 40), 100_000
    writer = None
    devices = np.array(["ios", "android", "web"])
    for start in range(0, n, chunk):
        m = min(chunk, n - start)
        t = pa.table(
            {
                "user": (rng.zipf(1.5, m) * 7919 + rng.integers(0, users, m)) % users,
                "item": (rng.zipf(1.3, m) * 104729) % items,
                "ts": 1_650_000_000 + rng.integers(0, 365 * 86400, m),
                "click": (rng.random(m) < 0.3).astype(np.int8),
                "device": devices[rng.integers(0, 3, m)],
                "price": rng.gamma(2.0, 10.0, m).astype(np.float32),
                "action": rng.integers(0, 4, m).astype(np.int8),
            }
        )
        writer = writer or pq.ParquetWriter(path, t.schema, compression="zstd")
        writer.write_table(t, row_group_size=chunk)
    writer.close()


# ----------------------------------------------------------------------------------------------
# The numpy baseline (run in a child: ``--numpy-child``)
# ----------------------------------------------------------------------------------------------


def numpy_build(events: Path, out: Path) -> dict:
    t0 = time.perf_counter()
    t = pq.read_table(events)
    user, item, ts = (t.column(c).to_numpy() for c in ("user", "item", "ts"))
    label = t.column("click").to_numpy().astype(np.int8)
    order = np.lexsort((-label, item, ts, user))
    t = t.take(pa.array(order))
    user, item, ts, label = user[order], item[order], ts[order], label[order]
    keep = np.ones(len(user), bool)
    keep[1:] = (user[1:] != user[:-1]) | (ts[1:] != ts[:-1]) | (item[1:] != item[:-1])
    if not keep.all():
        t, user, item, ts, label = t.filter(pa.array(keep)), user[keep], item[keep], ts[keep], label[keep]
    n = len(user)
    idx = np.arange(n)
    new_user = np.r_[True, user[1:] != user[:-1]]
    new_tie = new_user | np.r_[True, ts[1:] != ts[:-1]]
    start = np.maximum.accumulate(np.where(new_user, idx, 0))
    tie = np.maximum.accumulate(np.where(new_tie, idx, 0))
    user_n = np.bincount(start, minlength=n)[start]
    rank = idx - start
    k = np.where(user_n >= 10, user_n // 10, 0)
    split = np.where(rank >= user_n - k, 2, np.where(rank >= user_n - 2 * k, 1, 0))
    rate = label[split == 0].mean()
    cum = np.r_[0, np.cumsum(label, dtype=np.int64)]
    un, up = tie - start, cum[tie] - cum[start]
    by_item = np.lexsort((ts, item))
    i_new = np.r_[True, item[by_item][1:] != item[by_item][:-1]]
    i_tie_new = i_new | np.r_[True, ts[by_item][1:] != ts[by_item][:-1]]
    i_start = np.maximum.accumulate(np.where(i_new, idx, 0))
    i_tie = np.maximum.accumulate(np.where(i_tie_new, idx, 0))
    icum = np.r_[0, np.cumsum(label[by_item], dtype=np.int64)]
    inn, ipos = np.empty(n, np.int64), np.empty(n, np.int64)
    inn[by_item], ipos[by_item] = i_tie - i_start, icum[i_tie] - icum[i_start]
    first = np.maximum(start, tie - MAX_LEN)
    lengths = tie - first
    offsets = np.r_[0, np.cumsum(lengths)]
    src = np.repeat(first - offsets[:-1], lengths) + np.arange(offsets[-1])
    row = np.repeat(idx, lengths)

    def lists(values: np.ndarray) -> pa.Array:
        return pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(values))

    action = t.column("action").to_numpy()
    cols = {
        "user_n_prior": un.astype(np.float32),
        "user_pos_rate_prior": ((up + 2 * rate) / (un + 2)).astype(np.float32),
        "item_n_prior": inn.astype(np.float32),
        "item_pos_rate_prior": ((ipos + 2 * rate) / (inn + 2)).astype(np.float32),
        "hour": ((ts // 3600) % 24).astype(np.int8),
        "dow": ((ts // 86400 + 3) % 7).astype(np.int8),
        "hist_item": lists(item[src]),
        "hist_click": lists(label[src]),
        "hist_action": lists(action[src]),
        "hist_gaps": lists((ts[row] - ts[src]).astype(np.float32)),
    }
    del src, row
    for name, values in cols.items():
        t = t.append_column(name, values if isinstance(values, pa.Array) else pa.array(values))
    log = np.lexsort((item, user, ts))
    counts = {}
    for s, name in enumerate(("train", "val", "test")):
        part = t.take(pa.array(log[split[log] == s]))
        (out / name).mkdir(parents=True, exist_ok=True)
        pq.write_table(part, out / name / "part-00000.parquet", row_group_size=4096, compression="zstd")
        counts[name] = [part.num_rows, int(offsets[1:][split == s].sum() - offsets[:-1][split == s].sum())]
    train = t.filter(pa.array(split == 0))
    for column in ("user", "device", "item"):
        pa.compute.value_counts(train.column(column))
    pa.compute.value_counts(pa.compute.list_flatten(train.column("hist_action")))
    took = time.perf_counter() - t0
    return {
        "seconds": took,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "rows": counts,
    }


# ----------------------------------------------------------------------------------------------
# Runs
# ----------------------------------------------------------------------------------------------


def run_polars(events: Path, work: Path) -> dict:
    mapping = work / "mapping.yaml"
    mapping.write_text(yaml.safe_dump({"events": str(events), **MAPPING}))
    out = work / "polars_out"
    cmd = [
        sys.executable,
        "-m",
        "recformer",
        "data",
        "build",
        str(mapping),
        "--out",
        str(out),
        "--overwrite",
        "--no-progress",
    ]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - t0
    if proc.returncode:
        return {"error": proc.stderr.strip().splitlines()[-1]}
    report = json.loads((out / "build.json").read_text())
    c = report["counts"]
    rows = {s: [c["rows"][s], c["history_events"][s]] for s in ("train", "val", "test")}
    return {"seconds": wall, "peak_rss_mib": report["peak_rss_mib"], "rows": rows}


def run_numpy(events: Path, work: Path, limit_gib: float) -> dict:
    out = work / "numpy_out"
    cmd = [sys.executable, __file__, "--numpy-child", str(events), str(out), str(limit_gib)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - t0
    if proc.returncode:
        last = (proc.stderr.strip().splitlines() or ["killed"])[-1]
        return {"error": f"failed within a {limit_gib:g} GiB address-space limit: {last[:120]}"}
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    got["seconds"] = wall
    return got


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--numpy-child":
        events, out, limit = Path(sys.argv[2]), Path(sys.argv[3]), float(sys.argv[4])
        cap = int(limit * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
        print(json.dumps(numpy_build(events, out)))
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--events", type=int, nargs="+", default=[1_000_000, 10_000_000, 30_000_000])
    p.add_argument("--work", type=Path, default=None, help="scratch folder (default: a temporary one)")
    p.add_argument("--numpy-limit-gib", type=float, default=16.0)
    p.add_argument("--skip-numpy-above", type=int, default=None, help="run the baseline only up to this size")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    work_root = args.work or Path(tempfile.mkdtemp(prefix="bench_build_"))
    results = []
    print("| events | builder | seconds | events/s | peak memory MiB | vs polars time | vs polars memory |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for n in args.events:
        work = work_root / f"n{n}"
        work.mkdir(parents=True, exist_ok=True)
        events = work / "events.parquet"
        if not events.is_file():
            make_events(n, events)
        got = {"polars": run_polars(events, work)}
        if args.skip_numpy_above is None or n <= args.skip_numpy_above:
            got["numpy"] = run_numpy(events, work, args.numpy_limit_gib)
        if "error" not in got["polars"] and "error" not in got.get("numpy", {"error": 1}):
            assert got["polars"]["rows"] == got["numpy"]["rows"], (
                got["polars"]["rows"],
                got["numpy"]["rows"],
            )
        base = got["polars"]
        for name, r in got.items():
            if "error" in r:
                print(f"| {n:,} | {name} | {r['error']} | | | | |")
                continue
            ratio = "" if name == "polars" or "error" in base else f"{r['seconds'] / base['seconds']:.2f}x"
            mem = (
                ""
                if name == "polars" or "error" in base
                else f"{r['peak_rss_mib'] / base['peak_rss_mib']:.2f}x"
            )
            print(
                f"| {n:,} | {name} | {r['seconds']:.1f} | {n / r['seconds']:,.0f} | {r['peak_rss_mib']:,.0f} "
                f"| {ratio} | {mem} |",
                flush=True,
            )
        results.append({"events": n, **got})
        for sub in ("polars_out", "numpy_out"):
            subprocess.run(["rm", "-rf", str(work / sub)])
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
