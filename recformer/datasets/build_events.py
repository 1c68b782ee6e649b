"""``recformer data build``, reading and stage 1: the event files (CSV or Parquet, local or an
object store) read as one polars query, every value checked in one streaming pass (refused with
counts and examples before anything is written), and the typed event frame the stages carry."""

from __future__ import annotations

import difflib
import glob
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from recformer.data import storage
from recformer.datasets.build_config import TIME_UNITS, BuildConfig, BuildError
from recformer.datasets.ranges import range_problems

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
