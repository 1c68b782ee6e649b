"""``recformer data build``, stage 5: the rows of each user bucket (history of strictly earlier
events, priors, time features, the users table joined), written per split into the staging folder."""

from __future__ import annotations

import glob
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from recformer.data.schema import CHECKSUMS, required
from recformer.datasets.build_config import BuildConfig, BuildError
from recformer.datasets.build_events import BUCKET, EID, GAPS, HIST, SPLIT, SPLITS, EventColumns
from recformer.datasets.build_split import Counts, bucket_files, order_and_split, segment_starts

# polars is imported inside the functions that use it: a process that imports this module (the
# MovieLens builder does) must not hold polars' thread pool when it forks DataLoader workers
# (DESIGN section 7: polars in the parent deadlocks forked workers).


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


def write_rows(
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
