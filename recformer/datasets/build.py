"""``recformer data build``: a team's own event log to a data folder recformer trains on.

Input: event files (CSV or Parquet: files, folders, globs, URIs), optional user and item side
tables, and a short YAML mapping (``build_config.py``) saying which column is the user, the item,
the time, the label (or a rating and its threshold), the weight, and which columns are categorical,
dense, vectors, history attributes or item content. Output, as ``recformer data movielens`` writes::

    OUT/train/part-BBBBB.parquet   one file per user bucket (rows in log order: time, user, item)
    OUT/val/… OUT/test/…
    OUT/items.parquet              the item side table (when the mapping gives one)
    OUT/vocab/*.parquet            every vocabulary, fitted on the train split only
    OUT/spec.yaml                  the FeatureSpec naming every column
    OUT/build.json                 what was read, kept, dropped and written, with counts

How (memory stays flat as the log grows; ``bench/bench_build.py`` measures it):

0. *Out*: ``--out`` is checked first (``outdir.py``): never an input or a folder around one, and
   replaced only when an earlier build wrote every file in it.
1. *Check*: one streaming polars query over the events counts, per column, the nulls, the labels
   outside {0, 1} (or [0, 1]), the times that do not parse or fall outside ``limits``, the negative,
   non-finite or too large weights and the non-finite or float32-overflowing dense values
   (``ranges.py``). Any of them is an error naming the column, the count and examples; nothing is
   written.
2. *Partition*: a streaming polars sink writes the events, typed (time in int64 seconds), into
   ``ceil(rows / bucket_rows)`` buckets by a hash of the user id (a user's events share a bucket).
3. *Order and split*, per bucket: a user's events sorted by (time, item, a positive first, input
   order); events sharing (user, item, time) are duplicates (an error, or ``duplicates: drop`` keeps
   the first of each, counted). ``split.by: user``: with ``n`` events, the last ``floor(test n)``
   are test and the ``floor(val n)`` before them val (users with ``n < min_events``: all train);
   ``split.by: time``: global cuts. Duplicates, users with one event and empty splits are counted
   here, before anything is written to ``OUT``.
4. *Item priors* (``features.priors: [item]``): the events re-partitioned by item, each event's
   count of the item's earlier events (all users) and their positives.
5. *Rows*, per bucket: the history of each event is the user's events *strictly earlier* in time
   (same-second events are not history: they would leak the label's context), the last ``max_len``
   kept, most recent last, with the ``features.history`` attributes aligned and ``hist_gaps``
   (seconds before the event); user priors (events and positive rate strictly before, smoothed
   toward the train rate with ``prior_strength`` pseudo-events); hour and day of week (UTC, Monday
   = 0); the user side table joined. Written to a staging folder beside ``OUT``.
6. *Fit*: vocabularies (``recformer data vocab``'s code) and dense normalisation on train only;
   ``spec.yaml``; then the staging folder replaces ``OUT``.

The stages live in ``build_events.py`` (reading, 1), ``build_split.py`` (2-4), ``build_rows.py`` (5)
and ``build_tables.py`` (side tables, 6); this module runs them in order and is the command.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import shutil
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from recformer.data import storage
from recformer.datasets import build_events, outdir
from recformer.datasets.build_config import BuildConfig, BuildError, seconds
from recformer.datasets.build_events import (
    SPLITS,
    EventColumns,
    scan,
    typed_events,
)
from recformer.datasets.build_progress import BuildProgress
from recformer.datasets.build_rows import write_rows
from recformer.datasets.build_split import (
    Counts,
    bucket_of,
    first_pass,
    item_priors,
    partition,
    refuse_bad_counts,
)
from recformer.datasets.build_tables import embedding_dims, fit_on_train, side_frame, write_items


def build(
    cfg: BuildConfig, out: Path, overwrite: bool = False, progress: bool | None = None
) -> dict[str, Any]:
    """Build ``out`` from ``cfg`` (module docstring); returns build.json's content. ``progress``:
    a line per stage and a bar over the buckets on stderr (``BuildProgress``; None: the bar only
    when stderr is a terminal; False: neither)."""
    t0 = time.perf_counter()
    out = Path(out)
    locations = [cfg.resolve(e) for e in cfg.events]
    sides = [cfg.resolve(t.path) for t in (cfg.items, cfg.users) if t is not None]
    outdir.check(out, outdir.input_paths([*locations, *sides, *([cfg.path] if cfg.path else [])]), overwrite)
    what = f"events {locations[0]}" + (f" (+{len(locations) - 1} more)" if len(locations) > 1 else "")
    bar = BuildProgress(progress, stages=5 + ("item" in cfg.features.priors))
    lf, files = scan(locations, what)
    bar.stage(f"check: every value of {len(files)} event file(s) (one streaming pass)")
    events, cols, rows = typed_events(cfg, lf, what)
    cols.dtypes = dict(events.collect_schema())
    cols.vector_dims = embedding_dims(events, cfg.features.embedding, what)
    counts = Counts(events=rows, buckets=max(1, math.ceil(rows / cfg.bucket_rows)))
    staging = outdir.staging_of(out)
    shutil.rmtree(staging, ignore_errors=True)
    (staging / "_tmp").mkdir(parents=True)
    bar.start_bar(counts.buckets * (2 + ("item" in cfg.features.priors)), counts.buckets)
    try:
        fitted = _stages(cfg, events, cols, _cuts(cfg), counts, staging, bar, what)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    finally:
        bar.close()
    took = time.perf_counter() - t0
    report = {
        "events": files if len(files) <= 20 else files[:20] + [f"... {len(files) - 20} more"],
        "counts": asdict(counts),
        "vocabularies": {
            v.setting: {
                "size": v.size,
                "distinct": v.distinct,
                "coverage": round(v.coverage, 6),
                "cold": v.cold,
            }
            for v in fitted
        },
        "train_pos_rate": counts.pos_rate("train"),
        "seconds": round(took, 3),
        "events_per_second": round(rows / took, 1),
        "peak_rss_mib": round(peak_rss_mib(), 1),
        "mapping": asdict(cfg),
    }
    (staging / "build.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    outdir.replace(staging, out)
    return report


def _cuts(cfg: BuildConfig) -> tuple[int, int] | None:
    """``split.by: time``: the val and test starts in seconds."""
    if cfg.split.by != "time":
        return None
    split = cfg.split
    cuts = (seconds(split.val_start, "split.val_start"), seconds(split.test_start, "split.test_start"))
    if cuts[1] < cuts[0]:
        raise BuildError(
            f"split.test_start ({cfg.split.test_start}) is before split.val_start ({cfg.split.val_start})"
        )
    return cuts


def _stages(
    cfg: BuildConfig, events, cols: EventColumns, cuts, counts: Counts, staging: Path, bar, what: str
):
    """Stages 2-6 into ``staging``; returns the fitted vocabularies."""
    tmp, buckets = staging / "_tmp", counts.buckets
    bar.stage(f"partition: {counts.events:,} events into {buckets} user bucket(s)")
    partition(events, bucket_of(cols.user, buckets), tmp / "events")
    users_schema = None
    if cfg.users is not None:
        where = f"users table {cfg.resolve(cfg.users.path)}"
        users_lf, _ = side_frame(cfg, cfg.users, cols.dtypes[cols.user], where)
        users_schema = dict(users_lf.collect_schema())
        partition(users_lf, bucket_of(cfg.users.id, buckets), tmp / "users")
    bar.stage(f"order and split: {counts.events:,} events, bucket by bucket")
    first_pass(tmp, cols, cfg, cuts, buckets, counts, bar)
    refuse_bad_counts(counts, cfg, what)
    if "item" in cfg.features.priors:
        bar.stage(f"item priors: {counts.events - counts.duplicates:,} events by item")
        item_priors(tmp, cols, buckets, bar)
    items = write_items(cfg, cols.dtypes[cols.item], staging) if cfg.items is not None else None
    split = ", ".join(f"{s} {counts.rows[s]:,}" for s in SPLITS)
    bar.stage(f"rows: {sum(counts.rows.values()):,} with their histories ({split})")
    write_rows(cfg, cols, cuts, counts, staging, users_schema, bar)
    shutil.rmtree(tmp)
    bar.stage(f"vocabularies and dense statistics on the {counts.rows['train']:,} train rows")
    return fit_on_train(cfg, cols, items, staging)


def peak_rss_mib() -> float:
    """This process's peak resident memory (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


HELP = """Turn your own event log into a data folder recformer trains on.

Reads event files (CSV or Parquet: a file, a folder, a glob or an s3:// URI) and, if you have them,
an item table and a user table. A short YAML mapping says which column is the user, the item, the
time, the label (or a rating and its threshold) and which columns are features. Writes train/,
val/ and test/ Parquet files split per user or at a time, items.parquet, vocab/, spec.yaml and
build.json into --out. Bad input (a misspelled column, labels outside 0/1, times that do not
parse, duplicate events, an empty split) is refused with counts and examples before anything is
written. Every key of the mapping, commented: configs/data/build-example.yaml, which runs on the
shipped MovieLens ratings.
"""
"""What --help says: plain text, for a person at a terminal (the module docstring is for developers)."""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "build",
        help="raw events (CSV/Parquet, local or object store) + a YAML mapping -> a data folder",
        description=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("mapping", type=Path, help="the YAML mapping (configs/data/build-example.yaml)")
    p.add_argument("--out", type=Path, required=True, help="the data folder to write")
    p.add_argument("--events", nargs="+", default=None, help="event files to read instead of the mapping's")
    p.add_argument("--overwrite", action="store_true", help="replace --out when it holds files")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import polars as pl

    cfg = None
    try:
        cfg = BuildConfig.load(args.mapping)
        if args.events:
            # Paths given here are relative to the working directory, not to the mapping.
            cfg.events = [e if storage.is_uri(e) else str(Path(e).resolve()) for e in args.events]
        report = build(cfg, args.out, args.overwrite, progress=False if args.no_progress else None)
    except (FileNotFoundError, ValueError) as e:
        print(f"recformer data build: error: {e}", file=sys.stderr)
        return 2
    except pl.exceptions.PolarsError as e:  # a file polars cannot read or parse as typed
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(
            f"recformer data build: error: reading the events or a side table failed ({type(e).__name__}: "
            f"{first}); a CSV column whose values change type after the first "
            f"{build_events.CSV_INFER_ROWS} rows reads as the first rows' type: convert the file to "
            "Parquet, or fix the column",
            file=sys.stderr,
        )
        return 2
    except OSError as e:  # polars reading s3:// events: the store refusing or out of reach
        uris = [x for x in (cfg.events if cfg is not None else []) if storage.is_uri(x)]
        said = storage.failure(e, uris[0]) if uris else None
        if said is None:
            raise
        print(f"recformer data build: error: events {said}", file=sys.stderr)
        return 2
    print(summary_text(report, args.out))
    return 0


def summary_text(report: dict[str, Any], out: Path) -> str:
    c = report["counts"]
    lines = [
        f"events read {c['events']:,} in {c['buckets']} user bucket(s); users {c['users']:,}, "
        f"of them {c['single_event_users']:,} with one event (empty histories)"
    ]
    if c["duplicates"]:
        lines.append(
            f"duplicate (user, item, time) events dropped: {c['duplicates']:,} "
            f"(e.g. {c['duplicate_examples']})"
        )
    for s in SPLITS:
        rows = c["rows"][s]
        rate = c["positives"][s] / rows if rows else float("nan")
        hist = c["history_events"][s] / rows if rows else float("nan")
        lines.append(
            f"{s:5s}  rows {rows:>10,}  positive rate {rate:.3f}  users {c['users_in'][s]:>8,}  "
            f"mean history {hist:.1f}"
        )
    if c["users_without_side_row"]:
        lines.append(
            f"events whose user has no users-table row (side features OOV): {c['users_without_side_row']:,}"
        )
    for setting, v in report["vocabularies"].items():
        cold = f", then {v['cold']} cold item(s)" if v["cold"] else ""
        lines.append(
            f"vocabulary {setting}: {v['size']:,} of {v['distinct']:,} values "
            f"({v['coverage']:.1%} of train occurrences){cold}"
        )
    lines.append(
        f"-> {out} in {report['seconds']:.1f} s ({report['events_per_second']:,.0f} events/s, "
        f"peak memory {report['peak_rss_mib']:,.0f} MiB)"
    )
    return "\n".join(lines)
