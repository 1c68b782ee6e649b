"""``recformer data build``, stages 2-4: the events partitioned into user buckets, each bucket's
events ordered and split (counted before anything is written), and the item priors (each event's
count of its item's earlier events and positives, over all users)."""

from __future__ import annotations

import glob
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from recformer.datasets.build_config import BuildConfig, BuildError
from recformer.datasets.build_events import BUCKET, EID, MAX_EXAMPLES, SPLIT, SPLITS, EventColumns

# polars is imported inside the functions that use it: a process that imports this module (the
# MovieLens builder does) must not hold polars' thread pool when it forks DataLoader workers
# (DESIGN section 7: polars in the parent deadlocks forked workers).


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
