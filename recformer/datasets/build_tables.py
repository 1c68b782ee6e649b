"""``recformer data build``, the side tables and stage 6: the item and user tables read and checked,
``items.parquet`` written; the dense normalisation and the vocabularies fitted on train only, and
``spec.yaml``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from recformer.data.schema import CHECKSUMS, required
from recformer.datasets.build_config import BuildConfig, BuildError, SideTable
from recformer.datasets.build_events import GAPS, HIST, EventColumns, need_columns, scan
from recformer.datasets.vocab import fit as fit_vocabularies

# polars is imported inside the functions that use it: a process that imports this module (the
# MovieLens builder does) must not hold polars' thread pool when it forks DataLoader workers
# (DESIGN section 7: polars in the parent deadlocks forked workers).


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


def fit_on_train(cfg: BuildConfig, cols: EventColumns, items: dict[str, Any] | None, staging: Path) -> list:
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
