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
"""

from __future__ import annotations

import argparse
import difflib
import glob
import json
import math
import resource
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from recformer.data import storage
from recformer.data.schema import CHECKSUMS, required
from recformer.datasets import outdir
from recformer.datasets.build_config import TIME_UNITS, BuildConfig, BuildError, SideTable, seconds
from recformer.datasets.ranges import range_problems
from recformer.datasets.vocab import fit as fit_vocabularies

# polars is imported inside the functions that use it: a process that imports this module (the
# MovieLens builder does) must not hold polars' thread pool when it forks DataLoader workers
# (DESIGN section 7: polars in the parent deadlocks forked workers).

SPLITS = ("train", "val", "test")
HIST = "hist_"
GAPS = "hist_gaps"
EID, BUCKET, SPLIT = "_eid", "_b", "_split"
"""Internal columns: input row number (the last tie-break), user bucket, split (0/1/2)."""
MAX_EXAMPLES = 3
FORMATS = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv"}
CSV_INFER_ROWS = 10_000


# ----------------------------------------------------------------------------------------------
# Reading
# ----------------------------------------------------------------------------------------------


def expand(location: str, what: str) -> tuple[list[str], str]:
    """The files behind a path, folder or glob (sorted), and their format; a URI stays as given."""
    if storage.is_uri(location):
        fmt = FORMATS.get(Path(location.split("?")[0].rstrip("/")).suffix.lower())
        if fmt is None:  # a prefix: polars lists it; Parquet is what object stores hold
            return [location.rstrip("/") + "/**/*.parquet"], "parquet"
        return [location], fmt
    p = Path(location)
    if p.is_dir():
        files = sorted(str(f) for f in p.rglob("*") if f.is_file() and f.suffix.lower() in FORMATS)
    elif any(ch in location for ch in "*?["):
        files = sorted(glob.glob(location, recursive=True))
    else:
        files = [location] if p.is_file() else []
    if not files:
        raise FileNotFoundError(f"{what} {location}: no CSV or Parquet file there")
    formats = {FORMATS.get(Path(f).suffix.lower()) for f in files}
    if None in formats or len(formats) != 1:
        kinds = sorted(Path(f).suffix or "(none)" for f in files)
        raise BuildError(
            f"{what} {location}: expected only .csv or only .parquet files, found {sorted(set(kinds))}"
        )
    return files, formats.pop()


def scan(locations: list[str], what: str):
    """One polars LazyFrame over every file of ``locations`` (all CSV or all Parquet)."""
    import polars as pl

    files, kinds = [], set()
    for loc in locations:
        f, kind = expand(loc, what)
        files += f
        kinds.add(kind)
    if len(kinds) != 1:
        raise BuildError(f"{what} {locations}: mixes CSV and Parquet files")
    if kinds.pop() == "csv":
        return pl.scan_csv(files, infer_schema_length=CSV_INFER_ROWS), files
    return pl.scan_parquet(files), files


def need_columns(schema: dict[str, Any], wanted: dict[str, str], what: str) -> None:
    """Each wanted column (setting -> name) is in ``schema``; a miss names the closest columns."""
    have = list(schema)
    for setting, name in wanted.items():
        if name not in schema:
            close = difflib.get_close_matches(name, have, n=3, cutoff=0.6)
            hint = f"; did you mean {close}?" if close else ""
            raise BuildError(f"{what}: {setting}={name!r} is not a column{hint} (columns: {have})")


# ----------------------------------------------------------------------------------------------
# Stage 1: check, and the typed event frame
# ----------------------------------------------------------------------------------------------


def _seconds(cfg: BuildConfig, dtype: Any):
    """An expression reading the time column as int64 seconds since the epoch, null where it does
    not parse."""
    import polars as pl

    col = pl.col(cfg.columns.time)
    if dtype.is_integer():
        return (col // TIME_UNITS[cfg.time.unit]).cast(pl.Int64)
    if dtype.is_float():
        return (col / TIME_UNITS[cfg.time.unit]).floor().cast(pl.Int64)
    if isinstance(dtype, pl.Datetime | pl.Date):
        return col.dt.epoch("s")
    if dtype == pl.String:
        parsed = col.str.to_datetime(format=cfg.time.format, strict=False)
        return parsed.dt.epoch("s")
    raise BuildError(
        f"columns.time={cfg.columns.time!r} has type {dtype}; expected integer, date-time or string"
    )


@dataclass
class EventColumns:
    """What the events carry, as the builder names them."""

    user: str
    item: str
    time: str
    label: str
    """The output label column (the mapped label, or ``label`` made from the rating)."""
    rating: str | None
    weight: str | None
    context: list[str]
    """Categorical, dense and vector columns carried to the output as they are."""
    history: list[str]
    dtypes: dict[str, Any] = field(default_factory=dict)
    vector_dims: dict[str, int] = field(default_factory=dict)
    """``features.embedding`` columns and their length: written as fixed-size float32 lists."""


def typed_events(cfg: BuildConfig, lf, what: str):
    """Check the events (stage 1): the typed LazyFrame, the columns' roles and the event count."""
    schema = lf.collect_schema()
    wanted = _wanted_columns(cfg, schema, what)
    ts = _seconds(cfg, schema[cfg.columns.time])
    rows = _refuse_problems(lf, _value_problems(cfg, schema, wanted, ts, what), what)
    exprs, cols = _typed_select(cfg, schema, ts)
    return lf.select(exprs).with_row_index(EID), cols, rows


def _wanted_columns(cfg: BuildConfig, schema: Any, what: str) -> dict[str, str]:
    """Every column the mapping names (setting -> column), each checked present."""
    c, f = cfg.columns, cfg.features
    wanted = {f"columns.{k}": v for k, v in asdict(c).items() if v}
    for group in ("categorical", "dense", "embedding", "history"):
        for i, n in enumerate(getattr(f, group)):
            if n not in (c.label, c.rating):
                wanted[f"features.{group}[{i}]"] = n
    need_columns(schema, wanted, what)
    if c.rating is not None and "label" in schema:
        raise BuildError(
            f"{what}: has a column 'label'; with columns.rating the label is made under that name"
        )
    for n in f.history:
        if schema[n].is_float() and n != c.rating:
            raise BuildError(
                f"{what}: features.history column {n!r} is {schema[n]}; history attributes are "
                "categorical (integer, boolean or string)"
            )
    return wanted


def _value_problems(cfg: BuildConfig, schema: Any, wanted: dict[str, str], ts: Any, what: str) -> list:
    """(what is wrong, a filter selecting the rows it is wrong in) for every value check; a column
    of a type no value can fix is refused here."""
    import polars as pl

    c = cfg.columns
    problems = [
        (f"column {name!r} ({setting}) has null values", pl.col(name).is_null())
        for setting, name in wanted.items()
        if setting != "columns.time"
    ]
    problems.append((f"column {c.time!r} (columns.time) has values that are not times", ts.is_null()))
    numeric = [("columns.rating", c.rating), ("columns.weight", c.weight)]
    numeric += [(f"features.dense[{i}]", n) for i, n in enumerate(cfg.features.dense)]
    for setting, n in numeric:
        if n is not None and not schema[n].is_numeric():
            raise BuildError(f"{what}: {setting}={n!r} has type {schema[n]}; expected numbers")
    if c.label is not None:
        lab, dt = pl.col(c.label), schema[c.label]
        if dt.is_integer():
            problems.append(
                (f"column {c.label!r} (columns.label) has values outside {{0, 1}}", ~lab.is_in([0, 1]))
            )
        elif dt.is_float():
            bad = (lab < 0) | (lab > 1) | lab.is_nan()
            problems.append((f"column {c.label!r} (columns.label) has values outside [0, 1]", bad))
        elif dt != pl.Boolean:
            raise BuildError(
                f"{what}: columns.label={c.label!r} has type {dt}; expected 0/1, boolean or [0, 1] float"
            )
    elif schema[c.rating].is_float():
        problems.append((f"column {c.rating!r} (columns.rating) has NaN values", pl.col(c.rating).is_nan()))
    if c.weight is not None:
        w = pl.col(c.weight).cast(pl.Float64)
        problems.append(
            (
                f"column {c.weight!r} (columns.weight) has negative or non-finite values",
                ~(w >= 0) | ~w.is_finite(),
            )
        )
    for n in cfg.features.dense:
        problems.append(
            (f"column {n!r} (features.dense) has non-finite values", ~pl.col(n).cast(pl.Float64).is_finite())
        )
    return problems + range_problems(cfg, ts)


def _refuse_problems(lf, problems: list, what: str) -> int:
    """Count every problem in one streaming pass; refuse them all at once, each with its count
    and a few examples. Returns the number of events."""
    import polars as pl

    counts = lf.select(
        pl.len().alias("rows"),
        *(pr.fill_null(True).sum().alias(str(i)) for i, (_, pr) in enumerate(problems)),
    ).collect(engine="streaming")
    rows = int(counts["rows"][0])
    if rows == 0:
        raise BuildError(f"{what}: no events")
    found = []
    for i, (text, pr) in enumerate(problems):
        n = int(counts[str(i)][0])
        if n:
            col = text.split("'")[1]
            ex = lf.filter(pr.fill_null(True)).select(pl.col(col)).head(MAX_EXAMPLES).collect()[col].to_list()
            found.append(f"{text}: {n} of {rows} rows (e.g. {ex})")
    if found:
        raise BuildError(f"{what}:\n  " + "\n  ".join(found))
    return rows


def _typed_select(cfg: BuildConfig, schema: Any, ts: Any) -> tuple[list, EventColumns]:
    """The columns the buckets carry, typed: time in int64 seconds, the label int8 (or a [0, 1]
    float32), the rating, weight and dense values float32, booleans int8."""
    import polars as pl

    c, f = cfg.columns, cfg.features
    label = c.label or "label"
    out = [pl.col(c.user), pl.col(c.item), ts.alias(c.time)]
    if c.label is not None:
        exact = schema[c.label] == pl.Boolean or schema[c.label].is_integer()
        out.append(pl.col(c.label).cast(pl.Int8 if exact else pl.Float32))
    else:
        out += [
            pl.col(c.rating).cast(pl.Float32),
            (pl.col(c.rating) >= cfg.rating_threshold).cast(pl.Int8).alias(label),
        ]
    if c.weight is not None:
        out.append(pl.col(c.weight).cast(pl.Float32))
    context = [*f.categorical, *f.dense, *f.embedding]
    out += [pl.col(n).cast(pl.Float32) if n in f.dense else pl.col(n) for n in context]
    history = [n for n in f.history if n not in {c.label, c.rating} and n not in context]
    out += [pl.col(n).cast(pl.Int8) if schema[n] == pl.Boolean else pl.col(n) for n in history]
    return out, EventColumns(c.user, c.item, c.time, label, c.rating, c.weight, context, list(f.history))


# ----------------------------------------------------------------------------------------------
# Stages 2-3: buckets, order and split
# ----------------------------------------------------------------------------------------------


def bucket_of(user: str, buckets: int):
    import polars as pl

    return (pl.col(user).hash(seed=0) % buckets).cast(pl.Int32).alias(BUCKET)


def partition(lf, key, folder: Path) -> None:
    """Stream ``lf`` into ``folder/<key>=<value>/*.parquet`` (polars' streaming engine)."""
    import polars as pl

    lf.with_columns(key).sink_parquet(
        pl.PartitionBy(str(folder), key=key.meta.output_name(), include_key=False),
        engine="streaming",
        mkdir=True,
    )


def bucket_files(folder: Path, key: str, value: int) -> list[str]:
    return sorted(glob.glob(str(folder / f"{key}={value}" / "*.parquet")))


def order_and_split(df, cols: EventColumns, cfg: BuildConfig, cuts: tuple[int, int] | None):
    """A bucket's events in (user, time, item, positive first, input order) order, duplicates
    removed, and each event's split (``_split``: 0 train, 1 val, 2 test); also the duplicates (the
    later rows of each (user, time, item): a positive sorts first, so it is the one kept)."""
    import polars as pl

    u, t, i = cols.user, cols.time, cols.item
    df = df.sort([u, t, i, cols.label, EID], descending=[False, False, False, True, False])
    first = pl.struct(u, t, i).is_first_distinct()
    dups, df = df.filter(~first), df.filter(first)
    s = cfg.split
    if s.by == "time":
        assert cuts is not None
        split = pl.when(pl.col(t) >= cuts[1]).then(2).when(pl.col(t) >= cuts[0]).then(1).otherwise(0)
    else:
        n = pl.len().over(u)
        rank = pl.int_range(pl.len()).over(u)
        # Shares as integer parts per million: floor(0.1 * n) in floats can round below n // 10.
        k_test = pl.when(n >= s.min_events).then(n * round(s.test * 1e6) // 1_000_000).otherwise(0)
        k_val = pl.when(n >= s.min_events).then(n * round(s.val * 1e6) // 1_000_000).otherwise(0)
        split = pl.when(rank >= n - k_test).then(2).when(rank >= n - k_test - k_val).then(1).otherwise(0)
    return df.with_columns(split.cast(pl.Int8).alias(SPLIT)), dups


@dataclass
class Counts:
    """What the builder saw, for the summary and build.json."""

    events: int = 0
    duplicates: int = 0
    duplicate_examples: list[str] = field(default_factory=list)
    users: int = 0
    single_event_users: int = 0
    rows: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SPLITS, 0))
    positives: dict[str, float] = field(default_factory=lambda: dict.fromkeys(SPLITS, 0.0))
    users_in: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SPLITS, 0))
    history_events: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SPLITS, 0))
    users_without_side_row: int = 0
    buckets: int = 0

    def pos_rate(self, split: str) -> float:
        return self.positives[split] / self.rows[split] if self.rows[split] else float("nan")


def first_pass(
    tmp: Path, cols: EventColumns, cfg: BuildConfig, cuts, buckets: int, counts: Counts, bar
) -> None:
    """Stage 3 over every bucket on the id columns alone: counts, duplicates, the train rate; with
    item priors, the ordered events written narrow for stage 4."""
    import polars as pl

    narrow = [cols.user, cols.item, cols.time, cols.label, EID]
    for b in range(buckets):
        files = bucket_files(tmp / "events", BUCKET, b)
        bar.update(1)
        if not files:
            continue
        df, dups = order_and_split(pl.read_parquet(files, columns=narrow), cols, cfg, cuts)
        counts.duplicates += dups.height
        if dups.height and len(counts.duplicate_examples) < MAX_EXAMPLES:
            for r in dups.head(MAX_EXAMPLES).iter_rows(named=True):
                counts.duplicate_examples.append(
                    f"{cols.user}={r[cols.user]} {cols.item}={r[cols.item]} {cols.time}={r[cols.time]}"
                )
        per_user = df.group_by(cols.user).agg(pl.len().alias("n"))
        counts.users += per_user.height
        counts.single_event_users += int((per_user["n"] == 1).sum())
        stats = df.group_by(SPLIT).agg(
            pl.len().alias("rows"),
            pl.col(cols.label).cast(pl.Float64).sum().alias("pos"),
            pl.col(cols.user).n_unique().alias("users"),
        )
        for s, rows, pos, users in stats.iter_rows():
            name = SPLITS[s]
            counts.rows[name] += rows
            counts.positives[name] += pos
            counts.users_in[name] += users
        if "item" in cfg.features.priors:
            (tmp / "narrow").mkdir(exist_ok=True)
            df.select(cols.item, cols.time, cols.label, EID, pl.lit(b, pl.Int32).alias(BUCKET)).write_parquet(
                tmp / "narrow" / f"{b:05d}.parquet"
            )


def refuse_bad_counts(counts: Counts, cfg: BuildConfig, what: str) -> None:
    """The stage-3 errors: duplicates under ``duplicates: error``, an empty split."""
    if counts.duplicates and cfg.duplicates == "error":
        raise BuildError(
            f"{what}: {counts.duplicates} events repeat an earlier event's (user, item, time) "
            f"(e.g. {counts.duplicate_examples}); set duplicates: drop to keep one of each (counted)"
        )
    empty = [s for s in SPLITS if not counts.rows[s]]
    if empty:
        hint = (
            "users need split.min_events events for val and test rows"
            if cfg.split.by == "user"
            else "check split.val_start and split.test_start against the events' times"
        )
        raise BuildError(f"{what}: split {empty} would be empty ({counts.rows}); {hint}")


# ----------------------------------------------------------------------------------------------
# Stage 4: item priors
# ----------------------------------------------------------------------------------------------


def item_priors(tmp: Path, cols: EventColumns, buckets: int, bar) -> None:
    """Per event, the item's events strictly earlier in time (all users) and their positives,
    written by user bucket for stage 5 to join on the event id."""
    import polars as pl

    lf = pl.scan_parquet(str(tmp / "narrow" / "*.parquet"))
    partition(lf, (pl.col(cols.item).hash(seed=1) % buckets).cast(pl.Int32).alias("_ib"), tmp / "by_item")
    for j in range(buckets):
        files = bucket_files(tmp / "by_item", "_ib", j)
        bar.update(1)
        if not files:
            continue
        df = pl.read_parquet(files).sort([cols.item, cols.time, EID])
        start, tie = segment_starts(df, [cols.item], [cols.item, cols.time])
        pos_cum = np.concatenate([[0.0], np.cumsum(df[cols.label].cast(pl.Float64).to_numpy())])
        out = df.select(EID, BUCKET).with_columns(
            _item_n=pl.Series(tie - start), _item_pos=pl.Series(pos_cum[tie] - pos_cum[start])
        )
        partition(out.lazy(), pl.col(BUCKET), tmp / "priors" / f"{j:05d}")


def segment_starts(df, group: list[str], tie: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """For rows sorted by ``tie`` (which starts with ``group``): each row's index of its group's
    first row and of its tie's first row; ``tie - group`` counts the group's strictly earlier rows."""
    import polars as pl

    idx = pl.col("_row")  # a column, not an int_range: inside over() a range restarts per group
    got = (
        df.select(*tie)
        .with_row_index("_row")
        .select(idx.min().over(group).alias("g"), idx.min().over(tie).alias("t"))
    )
    return got["g"].to_numpy().astype(np.int64), got["t"].to_numpy().astype(np.int64)


# ----------------------------------------------------------------------------------------------
# Stage 5: the rows
# ----------------------------------------------------------------------------------------------


def _list_column(offsets: np.ndarray, values: pa.Array) -> pa.Array:
    """A list column from offsets and values; its element field named ``element`` (Parquet's LIST
    convention, as every log writer here names it)."""
    element = pa.field("element", values.type, nullable=False)
    if offsets[-1] < 2**31:
        return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), values, type=pa.list_(element))
    return pa.LargeListArray.from_arrays(pa.array(offsets), values, type=pa.large_list(element))


def history(df, cols: EventColumns, start: np.ndarray, tie: np.ndarray, max_len: int) -> dict[str, pa.Array]:
    """The history list columns of rows sorted by (user, time, …): rows ``[max(start, tie - L), tie)``."""
    import polars as pl

    n = df.height
    first = np.maximum(start, tie - max_len)
    lengths = tie - first
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    src = np.repeat(first - offsets[:-1], lengths) + np.arange(offsets[-1])
    row = np.repeat(np.arange(n), lengths)
    src_s = pl.Series(src)
    out = {HIST + cols.item: _list_column(offsets, df[cols.item].gather(src_s).to_arrow())}
    for name in cols.history:
        values = df[name].gather(src_s)
        if values.dtype.is_float():  # the rating: its values as text, a categorical vocabulary
            values = values.cast(pl.String)
        out[HIST + name] = _list_column(offsets, values.to_arrow())
    ts = df[cols.time].to_numpy()
    out[GAPS] = _list_column(offsets, pa.array((ts[row] - ts[src]).astype(np.float32)))
    return out


def bucket_rows(
    tmp: Path, b: int, cols: EventColumns, cfg: BuildConfig, cuts, train_rate: float, users_side
) -> dict[str, pa.Table]:
    """Stage 5 for one bucket: its rows of each split, every output column."""
    import polars as pl

    df = pl.read_parquet(bucket_files(tmp / "events", BUCKET, b))
    df, _ = order_and_split(df, cols, cfg, cuts)
    f, strength = cfg.features, cfg.prior_strength
    start, tie = segment_starts(df, [cols.user], [cols.user, cols.time])
    extra: dict[str, Any] = {}
    if "user" in f.priors:
        pos_cum = np.concatenate([[0.0], np.cumsum(df[cols.label].cast(pl.Float64).to_numpy())])
        n, pos = tie - start, pos_cum[tie] - pos_cum[start]
        extra["user_n_prior"] = n.astype(np.float32)
        extra["user_pos_rate_prior"] = ((pos + strength * train_rate) / (n + strength)).astype(np.float32)
    if "item" in f.priors:
        priors = pl.read_parquet(sorted(glob.glob(str(tmp / "priors" / "*" / f"{BUCKET}={b}" / "*.parquet"))))
        got = df.select(EID).join(priors, on=EID, how="left", maintain_order="left")
        n, pos = got["_item_n"].to_numpy(), got["_item_pos"].to_numpy()
        extra["item_n_prior"] = n.astype(np.float32)
        extra["item_pos_rate_prior"] = ((pos + strength * train_rate) / (n + strength)).astype(np.float32)
    ts = df[cols.time].to_numpy()
    if "hour" in f.time:
        extra["hour"] = ((ts // 3600) % 24).astype(np.int8)
    if "dow" in f.time:
        extra["dow"] = ((ts // 86400 + 3) % 7).astype(np.int8)  # 1970-01-01 was a Thursday (Monday = 0)
    hist = history(df, cols, start, tie, cfg.max_len)
    base = [cols.user, cols.item, cols.time, *([cols.rating] if cols.rating else []), cols.label]
    base += [cols.weight] if cols.weight else []
    table = df.select(*base, *cols.context).to_arrow()
    for name, dim in cols.vector_dims.items():
        i = table.schema.get_field_index(name)
        table = table.set_column(i, name, table.column(name).cast(pa.list_(pa.float32(), dim)))
    if users_side is not None:
        table = _join_users(df, users_side, table, cols)
    for name, values in {**extra, **hist}.items():
        table = table.append_column(name, values if isinstance(values, pa.Array) else pa.array(values))
    # Log order within each file: time, user, item.
    order = _log_order(df, cols)
    split = df[SPLIT].to_numpy()[order]
    table = table.take(pa.array(order))
    return {name: table.filter(pa.array(split == s)) for s, name in enumerate(SPLITS)}


def _log_order(df, cols: EventColumns) -> np.ndarray:
    import polars as pl

    return (
        df.select(pl.int_range(pl.len()).alias("r"), cols.time, cols.user, cols.item)
        .sort([cols.time, cols.user, cols.item])["r"]
        .to_numpy()
    )


def _join_users(df, users_side, table: pa.Table, cols: EventColumns) -> pa.Table:
    joined = df.select(cols.user).join(users_side, on=cols.user, how="left", maintain_order="left")
    for name in users_side.columns:
        if name != cols.user:
            table = table.append_column(name, joined[name].to_arrow())
    return table


# ----------------------------------------------------------------------------------------------
# Side tables
# ----------------------------------------------------------------------------------------------


def side_frame(cfg: BuildConfig, side: SideTable, key_dtype: Any, what: str):
    """A side table's id and named columns, ids cast to the events' id type and checked unique."""
    import polars as pl

    lf, _ = scan([cfg.resolve(side.path)], what)
    schema = lf.collect_schema()
    need_columns(schema, {"id": side.id}, what)
    for setting in ("categorical", "dense"):
        for c in getattr(side, setting):
            need_columns(schema, {setting: c}, what)
    if side.content:
        need_columns(schema, {"content": side.content}, what)
    try:
        key = pl.col(side.id).cast(key_dtype, strict=True)
        cols = [
            key,
            *(pl.col(c) for c in side.categorical),
            *(pl.col(c).cast(pl.Float32) for c in side.dense),
        ]
        cols += [pl.col(side.content).cast(pl.List(pl.Float32))] if side.content else []
        lf = lf.select(cols)
        stats = lf.select(
            pl.len().alias("rows"),
            pl.col(side.id).n_unique().alias("ids"),
            pl.col(side.id).null_count().alias("nulls"),
        ).collect(engine="streaming")
    except pl.exceptions.PolarsError as e:
        raise BuildError(
            f"{what}: id column {side.id!r} does not read as the events' id type {key_dtype}: {e}"
        ) from None
    rows, ids, nulls = (int(stats[k][0]) for k in ("rows", "ids", "nulls"))
    if nulls:
        raise BuildError(f"{what}: id column {side.id!r} has {nulls} null values")
    if ids != rows:
        raise BuildError(
            f"{what}: id column {side.id!r} has {rows - ids} repeated ids ({rows} rows, {ids} ids)"
        )
    if side.dense:  # every dense column counted in one streaming pass
        bad = lf.select(*((~pl.col(c).is_finite()).fill_null(True).sum().alias(c) for c in side.dense))
        for c, n in zip(side.dense, bad.collect(engine="streaming").row(0)):
            if n:
                raise BuildError(f"{what}: dense column {c!r} has {n} null or non-finite values")
    return lf, rows


def write_items(cfg: BuildConfig, item_dtype: Any, out: Path) -> dict[str, Any]:
    """``OUT/items.parquet`` from the item side table; returns what the spec says of it."""
    import polars as pl

    side = cfg.items
    assert side is not None
    what = f"items table {cfg.resolve(side.path)}"
    if side.dense:
        raise BuildError(
            f"{what}: items.dense: the item token takes categorical side features and content only"
        )
    lf, rows = side_frame(cfg, side, item_dtype, what)
    dim = 0
    if side.content:
        lens = lf.select(
            pl.col(side.content).list.len().min().alias("lo"),
            pl.col(side.content).list.len().max().alias("hi"),
            pl.col(side.content).null_count().alias("nulls"),
        ).collect(engine="streaming")
        lo, hi, nulls = (int(lens[k][0] or 0) for k in ("lo", "hi", "nulls"))
        if nulls or lo != hi or lo == 0:
            raise BuildError(
                f"{what}: content column {side.content!r} must hold one vector of the same length per item "
                f"(found lengths {lo}..{hi}, {nulls} nulls)"
            )
        dim = lo
    table = lf.sort(side.id).collect(engine="streaming").to_arrow()
    if side.content:
        i = table.schema.get_field_index(side.content)
        table = table.set_column(
            i, side.content, table.column(side.content).cast(pa.list_(pa.float32(), dim))
        )
    pq.write_table(table.cast(required(table.schema)), out / "items.parquet", compression="zstd", **CHECKSUMS)
    spec: dict[str, Any] = {"side_table": "items.parquet", "side_id_column": side.id}
    if side.content:
        spec.update(content_column=side.content, content_dim=dim)
    spec["features"] = [{"name": c, "vocab_file": f"vocab/item.{c}.parquet"} for c in side.categorical]
    return {"spec": spec, "rows": rows}


# ----------------------------------------------------------------------------------------------
# Stage 6: fit on train, the spec
# ----------------------------------------------------------------------------------------------

PRIOR_LOG1P = {
    "user_n_prior": True,
    "user_pos_rate_prior": False,
    "item_n_prior": True,
    "item_pos_rate_prior": False,
}


def dense_stats(train: list[Path], names: list[str], log1p: set[str]) -> list[dict[str, Any]]:
    """Mean and std of each dense column over the train split (after log1p where asked), streamed."""
    import polars as pl

    if not names:
        return []

    def f(n: str):
        x = pl.col(n).cast(pl.Float64)
        return x.sign() * x.abs().log1p() if n in log1p else x

    got = (
        pl.scan_parquet([str(p) for p in train])
        .select(
            *(f(n).mean().alias(f"m{i}") for i, n in enumerate(names)),
            *(f(n).std(ddof=0).alias(f"s{i}") for i, n in enumerate(names)),
        )
        .collect(engine="streaming")
    )
    out = []
    for i, n in enumerate(names):
        std = float(got[f"s{i}"][0] or 0.0)
        # A constant column carries nothing; std 1 leaves it at 0 after centring instead of failing.
        out.append(
            {"name": n, "mean": float(got[f"m{i}"][0]), "std": std if std > 0 else 1.0, "log1p": n in log1p}
        )
    return out


def spec_dict(
    cfg: BuildConfig,
    cols: EventColumns,
    dtypes: dict[str, Any],
    items: dict[str, Any] | None,
    embedding_dims: dict[str, int],
) -> dict[str, Any]:
    """spec.yaml before the vocabularies are fitted (``vocab.fit`` sets their sizes)."""
    f = cfg.features
    item: dict[str, Any] = {"column": cols.item, "vocab_file": "vocab/item.parquet"}
    item.update(items["spec"] if items else {})
    categorical: list[dict[str, Any]] = []
    if f.user_id is not None:
        categorical.append({"name": cols.user, "vocab_file": f"vocab/{cols.user}.parquet"})
    categorical += [{"name": n, "vocab_file": f"vocab/{n}.parquet"} for n in f.categorical]
    categorical += [
        {"name": n, "vocab_file": f"vocab/{n}.parquet"} for n in (cfg.users.categorical if cfg.users else [])
    ]
    categorical += [{"name": "hour", "vocab_size": 24}] * ("hour" in f.time) + [
        {"name": "dow", "vocab_size": 7}
    ] * ("dow" in f.time)
    keys = [n for n in (cols.user, cols.item, cols.time) if dtypes[n].is_integer()]
    sequence = {
        "item_column": HIST + cols.item,
        "max_len": cfg.max_len,
        "categorical": [{"name": HIST + n, "vocab_file": f"vocab/{HIST}{n}.parquet"} for n in cols.history],
        "time_gap_column": GAPS,
    }
    unused = {}
    if cols.rating:
        unused[cols.rating] = (
            f"the rating; label = rating >= {cfg.rating_threshold}, so it must never be a feature"
        )
    return {
        "label": cols.label,
        "weight": cols.weight,
        "group": cols.user,
        "keys": keys,
        "item": item,
        "categorical": categorical,
        "dense": [],
        "embedding": [{"name": n, "dim": d} for n, d in embedding_dims.items()],
        "sequence": sequence,
        "unused": unused,
    }


def embedding_dims(lf, names: list[str], what: str) -> dict[str, int]:
    """Each vector column's length, every column in one streaming pass; one length per column."""
    import polars as pl

    if not names:
        return {}
    lens = [pl.col(n).list.len() for n in names]
    lo_hi = [x.min().alias(f"lo{i}") for i, x in enumerate(lens)] + [
        x.max().alias(f"hi{i}") for i, x in enumerate(lens)
    ]
    got = lf.select(*lo_hi).collect(engine="streaming").row(0)
    dims = {}
    for i, n in enumerate(names):
        lo, hi = int(got[i] or 0), int(got[len(names) + i] or 0)
        if lo != hi or lo == 0:
            raise BuildError(
                f"{what}: features.embedding column {n!r} must hold vectors of one length (found {lo}..{hi})"
            )
        dims[n] = lo
    return dims


# ----------------------------------------------------------------------------------------------
# The whole build
# ----------------------------------------------------------------------------------------------


def write_bucket(
    tables: dict[str, pa.Table], staging: Path, b: int, cfg: BuildConfig, counts: Counts, hist_col: str
) -> None:
    import pyarrow.compute as pc

    for name, t in tables.items():
        if not t.num_rows:
            continue
        (staging / name).mkdir(parents=True, exist_ok=True)
        pq.write_table(
            t.cast(_required_where_full(t)),
            staging / name / f"part-{b:05d}.parquet",
            row_group_size=cfg.row_group_rows,
            compression="zstd",
            **CHECKSUMS,
        )
        counts.history_events[name] += int(pc.sum(pc.list_value_length(t.column(hist_col))).as_py() or 0)


def build(
    cfg: BuildConfig, out: Path, overwrite: bool = False, progress: bool | None = None
) -> dict[str, Any]:
    """Build ``out`` from ``cfg`` (module docstring); returns build.json's content. ``progress``:
    a progress bar on stderr (None: when stderr is a terminal)."""
    from tqdm.auto import tqdm

    t0 = time.perf_counter()
    out = Path(out)
    locations = [cfg.resolve(e) for e in cfg.events]
    sides = [cfg.resolve(t.path) for t in (cfg.items, cfg.users) if t is not None]
    outdir.check(out, outdir.input_paths([*locations, *sides, *([cfg.path] if cfg.path else [])]), overwrite)
    what = f"events {locations[0]}" + (f" (+{len(locations) - 1} more)" if len(locations) > 1 else "")
    lf, files = scan(locations, what)
    events, cols, rows = typed_events(cfg, lf, what)
    cols.dtypes = dict(events.collect_schema())
    cols.vector_dims = embedding_dims(events, cfg.features.embedding, what)
    counts = Counts(events=rows, buckets=max(1, math.ceil(rows / cfg.bucket_rows)))
    staging = outdir.staging_of(out)
    shutil.rmtree(staging, ignore_errors=True)
    (staging / "_tmp").mkdir(parents=True)
    steps = 2 + counts.buckets * (2 + ("item" in cfg.features.priors))
    disable = None if progress is None else not progress
    bar = tqdm(total=steps, desc="data build", unit="step", disable=disable, file=sys.stderr)
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
    bar.set_postfix_str("partition")
    partition(events, bucket_of(cols.user, buckets), tmp / "events")
    users_schema = None
    if cfg.users is not None:
        where = f"users table {cfg.resolve(cfg.users.path)}"
        users_lf, _ = side_frame(cfg, cfg.users, cols.dtypes[cols.user], where)
        users_schema = dict(users_lf.collect_schema())
        partition(users_lf, bucket_of(cfg.users.id, buckets), tmp / "users")
    bar.update(1)
    bar.set_postfix_str("order and split")
    first_pass(tmp, cols, cfg, cuts, buckets, counts, bar)
    refuse_bad_counts(counts, cfg, what)
    if "item" in cfg.features.priors:
        bar.set_postfix_str("item priors")
        item_priors(tmp, cols, buckets, bar)
    items = write_items(cfg, cols.dtypes[cols.item], staging) if cfg.items is not None else None
    bar.set_postfix_str("rows")
    _write_rows(cfg, cols, cuts, counts, staging, users_schema, bar)
    shutil.rmtree(tmp)
    bar.set_postfix_str("vocabularies")
    fitted = _fit_on_train(cfg, cols, items, staging)
    bar.update(1)
    return fitted


def _write_rows(
    cfg: BuildConfig, cols: EventColumns, cuts, counts: Counts, staging: Path, users_schema, bar
) -> None:
    """Stage 5 over every bucket; events whose user the users table lacks are counted (an error
    when it has dense columns, which have no value for them)."""
    import polars as pl

    tmp = staging / "_tmp"
    for b in range(counts.buckets):
        bar.update(1)
        if not bucket_files(tmp / "events", BUCKET, b):
            continue
        users_side = None
        if cfg.users is not None:
            files = bucket_files(tmp / "users", BUCKET, b)
            users_side = pl.read_parquet(files) if files else pl.DataFrame(schema=users_schema)
            users_side = users_side.rename({cfg.users.id: cols.user})
        tables = bucket_rows(tmp, b, cols, cfg, cuts, counts.pos_rate("train"), users_side)
        if users_side is not None:
            counts.users_without_side_row += _missing_side_rows(tables, cfg)
        write_bucket(tables, staging, b, cfg, counts, HIST + cols.item)
    if cfg.users is not None and cfg.users.dense and counts.users_without_side_row:
        raise BuildError(
            f"users table {cfg.resolve(cfg.users.path)}: {counts.users_without_side_row} events' users "
            f"have no row, and its dense columns {cfg.users.dense} have no value for them"
        )


def _fit_on_train(cfg: BuildConfig, cols: EventColumns, items: dict[str, Any] | None, staging: Path) -> list:
    """Stage 6: the dense normalisation and the vocabularies, from the train split; spec.yaml."""
    raw = spec_dict(cfg, cols, cols.dtypes, items, cols.vector_dims)
    train = sorted((staging / "train").glob("*.parquet"))
    dense = [*cfg.features.dense, *(cfg.users.dense if cfg.users else [])]
    priors = [n for n in PRIOR_LOG1P if n.split("_")[0] in cfg.features.priors]
    log1p = set(cfg.features.log1p) | {n for n in priors if PRIOR_LOG1P[n]}
    raw["dense"] = dense_stats(train, dense + priors, log1p)
    (staging / "spec.yaml").write_text(yaml.safe_dump(raw, sort_keys=False, width=100))
    min_counts = {cols.user: cfg.features.user_id.min_count} if cfg.features.user_id else {}
    return fit_vocabularies(staging, cfg.min_count, refit=True, min_counts=min_counts)


def _required_where_full(t: pa.Table) -> pa.Schema:
    """``schema.required`` for every column without nulls; the users table's columns keep their
    nulls (users it has no row for: OOV in the loader, counted in the summary)."""
    strict = required(t.schema)
    return pa.schema(
        [strict.field(i) if t.column(i).null_count == 0 else t.schema.field(i) for i in range(t.num_columns)]
    )


def _missing_side_rows(tables: dict[str, pa.Table], cfg: BuildConfig) -> int:
    """Events whose user the users table lacks (its columns null there)."""
    side = cfg.users
    assert side is not None
    probe = (side.categorical or side.dense)[0] if (side.categorical or side.dense) else None
    if probe is None:
        return 0
    return sum(t.column(probe).null_count for t in tables.values())


def peak_rss_mib() -> float:
    """This process's peak resident memory (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# ----------------------------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------------------------


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "build",
        help="raw events (CSV/Parquet, local or object store) + a YAML mapping -> a data folder",
        description=__doc__,
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
            f"{first}); a CSV column whose values change type after the first {CSV_INFER_ROWS} rows "
            "reads as the first rows' type: convert the file to Parquet, or fix the column",
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
