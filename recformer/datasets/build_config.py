"""The mapping ``recformer data build`` reads: which column of a team's event log is what.

A short YAML file (every key below; ``configs/data/build-example.yaml`` is a commented one)::

    events: logs/events/*.parquet        # a file, a folder, a glob, a list of them, or a URI
    columns: {user: uid, item: iid, time: ts, label: clicked}
    # or a rating made a label:  columns: {..., rating: stars}  with  rating_threshold: 4
    time: {unit: s}                      # integer times: s | ms | us | ns
                                         # strings: {format: "%Y-%m-%d %H:%M:%S"} (none: ISO 8601)
    features:
      categorical: [device, country]     # context columns, one token each (vocabulary fit on train)
      dense: [price]                     # normalised on train
      log1p: [price]                     # of the dense ones: log1p first (counts, prices)
      embedding: [query_emb]             # per-row float vectors
      history: [clicked, action]         # event columns carried, aligned, in the history (the
                                         # label or rating among them: the user's past feedback)
      time: [hour, dow]                  # UTC hour and day of week of the event
      priors: [user, item]               # counts and positive rates strictly before the event
      user_id: {min_count: 5}            # the user id as a token; rarer users share the OOV row
    items: {path: items.parquet, id: iid, categorical: [category], content: emb}
    users: {path: users.csv, id: uid, categorical: [age_band], dense: [tenure_days]}
    split: {by: user, val: 0.1, test: 0.1, min_events: 10}   # or {by: time, val_start: ..., test_start: ...}
    max_len: 50
    duplicates: error                    # or drop: one row per (user, item, time) kept, counted
    limits: {time_min: 1970-01-01, time_max: 2100-01-01, weight_max: 1000000}  # values outside: refused

Everything is checked when the file loads, with the key named; the columns themselves are checked
against the data by the builder (``build.py``) before anything is written.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from recformer.config import _coerce

TIME_UNITS = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}
"""Integer time units and how many of them make a second."""
TIME_FEATURES = ("hour", "dow")
PRIORS = ("user", "item")


class BuildError(ValueError):
    """Bad input: the message names the file or setting, the column, the count and examples."""


def _strict(cls: type, raw: Any, where: str) -> Any:
    """``cls`` from a mapping (``config._coerce``: unknown keys named), with a missing key or a
    refused value named by its setting (``columns: ...``)."""
    try:
        return _coerce(cls, raw)
    except (TypeError, ValueError) as e:  # TypeError: a required key missing
        raise ValueError(f"{where}: {e}") from None


def seconds(value: str | int, setting: str) -> int:
    """``value`` (seconds since 1970, or an ISO date or date-time) in seconds since 1970; an error
    naming ``setting`` when it is neither."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    import polars as pl

    try:  # polars cannot infer a format from one value that is no date at all
        got = pl.Series([str(value)]).str.to_datetime(strict=False).dt.epoch("s")[0]
    except pl.exceptions.PolarsError:
        got = None
    if got is None:
        raise ValueError(f"{setting}={value!r} is not seconds or an ISO date")
    return int(got)


def _names(value: Any, setting: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{setting}: expected a list of column names, found {value!r}")
    return list(value)


@dataclass
class Columns:
    """Which event column is which."""

    user: str
    """The user id (integer or string): the history's owner and the GAUC group."""
    item: str
    """The item id (integer or string), for the target and the history."""
    time: str
    """When the event happened: integer (see ``time.unit``), a date-time, or a string (``time.format``)."""
    label: str | None = None
    """A 0/1 (or boolean, or [0, 1] float) label; give this or ``rating``."""
    rating: str | None = None
    """A numeric rating made a label with ``rating_threshold`` (label = rating >= threshold)."""
    weight: str | None = None
    """An optional per-event loss weight (float >= 0)."""

    def __post_init__(self) -> None:
        if (self.label is None) == (self.rating is None):
            raise ValueError("give exactly one of label and rating")
        named = [c for c in (self.user, self.item, self.time, self.label, self.rating, self.weight) if c]
        dup = sorted({c for c in named if named.count(c) > 1})
        if dup:
            raise ValueError(f"these columns have two roles: {dup}")


@dataclass
class TimeFormat:
    """How the time column reads as seconds since the epoch (UTC)."""

    unit: Literal["s", "ms", "us", "ns"] = "s"
    """Unit of an integer time column."""
    format: str | None = None
    """strftime format of a string time column; none: ISO 8601 is recognised."""

    def __post_init__(self) -> None:
        if self.unit not in TIME_UNITS:
            raise ValueError(f"unit={self.unit!r}; expected one of {list(TIME_UNITS)}")


@dataclass
class UserId:
    """The user id as a context token, with a bounded table."""

    min_count: int = 5
    """Train events a user needs for a row of its own; the rest share the OOV row."""

    def __post_init__(self) -> None:
        if self.min_count < 1:
            raise ValueError(f"min_count={self.min_count} must be >= 1")


@dataclass
class Features:
    """Which columns become which tokens."""

    categorical: list[str] = field(default_factory=list)
    """Context columns, one token each (a vocabulary fit on train)."""
    dense: list[str] = field(default_factory=list)
    """Numeric columns, normalised with train's mean and std."""
    log1p: list[str] = field(default_factory=list)
    """Of the dense columns: ``sign(x) log1p(|x|)`` before normalising (counts, prices)."""
    embedding: list[str] = field(default_factory=list)
    """Per-row float-vector columns, one projected token each."""
    history: list[str] = field(default_factory=list)
    """Event columns carried in the history, aligned with its items (the label or rating too)."""
    time: list[str] = field(default_factory=list)
    """Calendar features of the event: ``hour`` (UTC) and ``dow`` (Monday = 0)."""
    priors: list[str] = field(default_factory=list)
    """``user`` and / or ``item``: events and smoothed positive rate strictly before the event."""
    user_id: UserId | None = None
    """The user id as a token (none: the user is known by its history only)."""

    def __post_init__(self) -> None:
        for name in ("categorical", "dense", "log1p", "embedding", "history", "time", "priors"):
            setattr(self, name, _names(getattr(self, name), name))
        if self.user_id is not None:
            self.user_id = _strict(UserId, self.user_id or {}, "user_id")
        stray = sorted(set(self.log1p) - set(self.dense))
        if stray:
            raise ValueError(f"log1p: {stray} are not dense columns")
        bad = sorted(set(self.time) - set(TIME_FEATURES))
        if bad:
            raise ValueError(f"time: {bad}; expected some of {list(TIME_FEATURES)}")
        bad = sorted(set(self.priors) - set(PRIORS))
        if bad:
            raise ValueError(f"priors: {bad}; expected some of {list(PRIORS)}")


@dataclass
class SideTable:
    """A table keyed by the user or the item id."""

    path: str
    """A file, folder, glob or URI (CSV or Parquet)."""
    id: str
    """Its id column (the same values as the event log's user or item column)."""
    categorical: list[str] = field(default_factory=list)
    """Categorical columns: item side features (the item token), or user context tokens."""
    dense: list[str] = field(default_factory=list)
    """Users only: numeric columns, normalised on train."""
    content: str | None = None
    """Items only: a float-vector column, the item's content embedding (one token per item)."""

    def __post_init__(self) -> None:
        self.categorical = _names(self.categorical, "categorical")
        self.dense = _names(self.dense, "dense")


@dataclass
class Split:
    """Which events are validation and test."""

    by: Literal["user", "time"] = "user"
    """``user``: each user's last events (by time); ``time``: a global time cut."""
    val: float = 0.1
    """``by: user``: share of a user's events (its most recent before the test ones) for validation."""
    test: float = 0.1
    """``by: user``: share of a user's events (its most recent) for test."""
    min_events: int = 10
    """``by: user``: users with fewer events are train only."""
    val_start: str | int | None = None
    """``by: time``: events at or after this time (seconds, or an ISO date) are validation."""
    test_start: str | int | None = None
    """``by: time``: events at or after this time are test."""

    def __post_init__(self) -> None:
        if self.by not in ("user", "time"):
            raise ValueError(f"by={self.by!r}; expected user or time")
        if self.by == "user":
            if not (0 <= self.val < 1 and 0 < self.test < 1 and self.val + self.test < 1):
                raise ValueError(
                    f"val={self.val}, test={self.test}: expected shares with 0 < test, val + test < 1"
                )
            if self.min_events < 1:
                raise ValueError(f"min_events={self.min_events} must be >= 1")
        elif self.val_start is None or self.test_start is None:
            raise ValueError("by: time needs val_start and test_start")


@dataclass
class Limits:
    """Ranges outside which a value is a mistake rather than data: the build refuses such values,
    with the column, the count and examples (``ranges.py``)."""

    time_min: str | int = "1970-01-01"
    """Earliest event time (ISO date or seconds since 1970); a time of -5 is an export bug."""
    time_max: str | int = "2100-01-01"
    """Events at or after it are refused: milliseconds read as seconds land in the year 50000."""
    weight_max: float = 1.0e6
    """Largest per-event weight; 3e38 would make the weighted loss inf, one row would outweigh a log."""

    def __post_init__(self) -> None:
        try:  # YAML reads 1.0e6 (no sign in the exponent) as a string
            self.weight_max = float(self.weight_max)
        except (TypeError, ValueError):
            raise ValueError(f"weight_max={self.weight_max!r}: expected a number") from None
        lo, hi = seconds(self.time_min, "time_min"), seconds(self.time_max, "time_max")
        if not lo < hi:
            raise ValueError(f"time_min={self.time_min!r} must be before time_max={self.time_max!r}")
        if not 0 < self.weight_max <= 3.4e38:
            raise ValueError(f"weight_max={self.weight_max} must be > 0 and a float32 (<= 3.4e38)")


@dataclass
class BuildConfig:
    """The whole mapping (module docstring)."""

    events: list[str]
    """Event files: paths, folders, globs or URIs (CSV or Parquet)."""
    columns: Columns
    """Which event column is the user, item, time, label or rating, weight."""
    rating_threshold: float | None = None
    """With ``columns.rating``: label = rating >= this."""
    time: TimeFormat = field(default_factory=TimeFormat)
    """How the time column reads as seconds."""
    features: Features = field(default_factory=Features)
    """Which columns become which tokens."""
    items: SideTable | None = None
    """The item side table (categorical features, a content vector)."""
    users: SideTable | None = None
    """The users table (categorical and dense columns joined to each event)."""
    split: Split = field(default_factory=Split)
    """Per-user shares or a global time cut."""
    max_len: int = 50
    """History events kept per row (the most recent strictly earlier ones)."""
    duplicates: Literal["error", "drop"] = "error"
    """Events sharing user, item and time: an error, or ``drop`` (one kept, a positive first; counted)."""
    min_count: int = 1
    """Train occurrences a categorical value needs for a row of its own."""
    prior_strength: float = 2.0
    """Pseudo-count of the smoothed prior positive rates (toward the train positive rate)."""
    bucket_rows: int = 1_000_000
    """Events per user bucket: the unit of work, and what bounds the builder's memory."""
    row_group_rows: int = 4096
    """Rows per Parquet row group written (the loader's unit of reading and shuffling)."""
    limits: Limits = field(default_factory=Limits)
    """Event times and weights outside these are refused."""
    path: str | None = None
    """Where the mapping was loaded from (event paths are relative to it)."""

    def __post_init__(self) -> None:
        self.events = _names(self.events, "events")
        if not self.events:
            raise ValueError("events: give at least one file, folder, glob or URI")
        self.columns = _strict(Columns, self.columns, "columns")
        self.time = _strict(TimeFormat, self.time or {}, "time")
        self.features = _strict(Features, self.features or {}, "features")
        self.split = _strict(Split, self.split or {}, "split")
        self.limits = _strict(Limits, self.limits or {}, "limits")
        self.items = _strict(SideTable, self.items, "items") if self.items is not None else None
        self.users = _strict(SideTable, self.users, "users") if self.users is not None else None
        if self.users is not None and self.users.content is not None:
            raise ValueError("users.content: content embeddings are an item feature")
        if self.columns.rating is not None and self.rating_threshold is None:
            raise ValueError(
                f"columns.rating={self.columns.rating!r} needs rating_threshold (label = rating >= it)"
            )
        if self.columns.label is not None and self.rating_threshold is not None:
            raise ValueError("rating_threshold is for columns.rating; columns.label is already a label")
        if self.max_len < 1:
            raise ValueError(f"max_len={self.max_len} must be >= 1")
        if self.duplicates not in ("error", "drop"):
            raise ValueError(f"duplicates={self.duplicates!r}; expected error or drop")
        for name in ("min_count", "bucket_rows", "row_group_rows"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")
        if not self.prior_strength > 0:
            raise ValueError(f"prior_strength={self.prior_strength} must be > 0")
        self._check_roles()

    def _check_roles(self) -> None:
        """Every output column has one role."""
        c, f = self.columns, self.features
        roles: dict[str, list[str]] = {}
        for role, names in (
            ("columns", [x for x in (c.user, c.item, c.time, c.label, c.rating, c.weight) if x]),
            ("features.categorical", f.categorical),
            ("features.dense", f.dense),
            ("features.embedding", f.embedding),
            ("users.categorical", self.users.categorical if self.users else []),
            ("users.dense", self.users.dense if self.users else []),
        ):
            for n in names:
                roles.setdefault(n, []).append(role)
        twice = {n: r for n, r in roles.items() if len(r) > 1}
        if twice:
            raise ValueError(f"columns with two roles: {twice}")
        if c.item in f.history or c.user in f.history:
            raise ValueError("features.history: the item is always in the history, the user never")

    @classmethod
    def load(cls, path: str | Path) -> BuildConfig:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"build mapping {path} does not exist")
        try:
            raw = yaml.safe_load(path.read_text())
        except yaml.YAMLError as e:
            raise ValueError(f"build mapping {path}: not a plain YAML mapping: {e}") from None
        try:
            cfg = _strict(cls, raw, "mapping")
        except ValueError as e:
            raise ValueError(f"build mapping {path}: {e}") from None
        cfg.path = str(path)
        return cfg

    def resolve(self, location: str) -> str:
        """A relative local path in the mapping, relative to the mapping's folder; URIs as they are."""
        if "://" in location or Path(location).is_absolute() or self.path is None:
            return location
        return str(Path(self.path).parent / location)
