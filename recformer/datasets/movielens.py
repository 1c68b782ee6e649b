"""``recformer data movielens``: MovieLens ratings to temporally split Parquet logs.

One output row is one rating seen as an impression: the user, the rated movie, ``label = rating >= 4``
and everything known about the user strictly before that second. Output layout::

    DIR/train/part-0000{0,1,2}.parquet   three files of different sizes (50/30/20 % of train rows)
    DIR/val/part-00000.parquet
    DIR/test/part-00000.parquet
    DIR/items.parquet                    item side table (features + content embedding)
    DIR/spec.yaml                        the FeatureSpec naming every column's role
    DIR/README.txt                       GroupLens' licence, which must travel with transformations

The log itself is ``recformer data build`` on the ratings (``log_mapping``: the rules below as a
mapping); this module adds what is MovieLens' own: the item table with its text and content, the
``movie_id`` and ``days_since_release`` columns, the three uneven train files, the bounded user
vocabulary and the spec. Since ``data build`` writes the log, the files differ from the earlier
numpy builder's in one place only: the list columns' element field is named ``element`` (Parquet's
LIST convention) where pyarrow's default ``item`` was; values, row order, row groups and pages are
byte-identical.

Rules (all deterministic: same input, byte-identical output):

- Items: every movie of movies.csv, ``item_id`` = rank of ``movieId`` in ascending order. Its text
  (embedded into ``content_emb`` by ``embed-items``) is the title, the genres and the tags written
  *before the movie's first val or test rating*: a tag written later would tell evaluation rows
  about the future (on MovieLens the count of all-time tags alone scores test AUC 0.59, against
  0.53 for the tags written before each row). Movies without evaluation ratings keep every tag.
- Per-user temporal split: a user's ratings sorted by (timestamp, item_id); with ``n`` ratings and
  ``k = floor(n / 10)``, the last ``k`` go to test, the ``k`` before them to val, the rest to train.
  Users with ``n < 10`` go entirely to train (``k`` would be 0).
- History: the user's ratings with a timestamp *strictly* before the row's (ratings made in the same
  second are not history: MovieLens users rate in bursts and a same-second neighbour would leak the
  label's context), ordered by (timestamp, item_id), most recent last, the last ``--max-len`` kept.
  Histories run over the user's whole timeline, so a test row sees the user's train and val ratings.
- Dense context, from the past only: ``user_n_prior`` (ratings strictly before), ``user_pos_rate_prior``
  (share of those >= 4, smoothed as ``(pos + 2 p) / (n + 2)`` with ``p`` the train positive rate),
  ``item_n_prior`` (ratings the item received strictly before, over all users),
  ``days_since_release`` (days since 1 January of the title's year, clamped at 0; -1 when the title
  has no year).
- ``hour`` / ``dow``: UTC hour 0-23 and day of week 0-6 with 0 = Monday.
- Rows within a file are ordered by (timestamp, user_id, item_id), as a log would be.
"""

from __future__ import annotations

import argparse
import csv
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

from recformer.config import CategoricalField, DenseField, FeatureSpec, ItemSpec, SequenceSpec
from recformer.data.schema import CHECKSUMS, required
from recformer.data.shards import refuse_foreign_parquet, remove_own_parts
from recformer.datasets.build import build
from recformer.datasets.build_config import BuildConfig, Columns, Features, Split
from recformer.datasets.build_events import EID, SPLIT, EventColumns
from recformer.datasets.build_split import order_and_split
from recformer.datasets.vocab import fit_column

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_SOURCE = "data/ml-latest-small"
DEFAULT_ITEMS = "data/ml-latest-small-items.parquet"

SOURCE_COLUMNS: dict[str, dict[str, pa.DataType]] = {
    "ratings.csv": {
        "userId": pa.int64(),
        "movieId": pa.int32(),
        "rating": pa.float32(),
        "timestamp": pa.int64(),
    },
    "movies.csv": {"movieId": pa.int32(), "title": pa.string(), "genres": pa.string()},
    "tags.csv": {"userId": pa.int64(), "movieId": pa.int32(), "tag": pa.string(), "timestamp": pa.int64()},
}
"""The files and columns read from the source folder, with the types they are parsed as."""

GENRES = [
    "(no genres listed)",
    "Action",
    "Adventure",
    "Animation",
    "Children",
    "Comedy",
    "Crime",
    "Documentary",
    "Drama",
    "Fantasy",
    "Film-Noir",
    "Horror",
    "IMAX",
    "Musical",
    "Mystery",
    "Romance",
    "Sci-Fi",
    "Thriller",
    "War",
    "Western",
]
"""Fixed genre vocabulary (MovieLens README): ``first_genre`` is the index of a movie's first genre."""

YEAR_BUCKET_FIRST, YEAR_BUCKET_WIDTH, YEAR_BUCKET_LAST = 1900, 5, 2024
N_YEAR_BUCKETS = 1 + (YEAR_BUCKET_LAST - YEAR_BUCKET_FIRST) // YEAR_BUCKET_WIDTH + 1
"""``year_bucket``: 0 = unknown year, then 5-year buckets 1900-1904 -> 1, ..., 2020-2024 -> 25; years
outside [1900, 2024] are clamped into the first / last bucket."""

TRAIN_FILE_FRACTIONS = (0.5, 0.3, 0.2)
"""Train rows per file: deliberately uneven so loaders are exercised on files of different sizes."""
ROW_GROUP_ROWS = 4096
SEQ_RATING_VOCAB = 11
"""``hist_ratings`` holds rating * 2, i.e. 1..10 (0.5 stars .. 5 stars); id 0 is never written."""
PRIOR_STRENGTH = 2.0
"""Pseudo-count of the smoothed prior positive rate: a user with no past is at the train rate."""
DENSE_COLUMNS = {
    "user_n_prior": True,
    "user_pos_rate_prior": False,
    "item_n_prior": True,
    "item_pos_rate_prior": False,
    "days_since_release": True,
}
"""Dense columns and whether they get log1p (counts and day spans are heavy-tailed; a rate is not)."""

SPLITS = ("train", "val", "test")
_TITLE_YEAR = re.compile(r"\((\d{4})(?:\s*[-\u2013]\s*\d{4})?\)\s*$")


# ----------------------------------------------------------------------------------------------
# Reading the source
# ----------------------------------------------------------------------------------------------


def repo_path(rel: str | Path) -> Path:
    """``rel`` as given when it exists from the working directory, else relative to the repository."""
    rel = Path(rel)
    if rel.exists() or rel.is_absolute() or not (REPO_ROOT / rel).exists():
        return rel
    return REPO_ROOT / rel


def read_source_csv(source: Path, name: str) -> pa.Table:
    """Read one MovieLens CSV with typed columns; errors name the file and the column."""
    path = Path(source) / name
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} does not exist: the MovieLens source folder must hold {name} (see --source)"
        )
    wanted = SOURCE_COLUMNS[name]
    with open(path, newline="", encoding="utf-8") as fh:
        header = next(csv.reader(fh), [])
    for col in wanted:
        if col not in header:
            raise ValueError(
                f"{path}: missing column {col!r}; expected columns {list(wanted)}, found {header}"
            )
    try:
        table = pa_csv.read_csv(
            path, convert_options=pa_csv.ConvertOptions(column_types=wanted, include_columns=list(wanted))
        )
    except pa.ArrowInvalid as e:
        raise ValueError(f"{path}: cannot parse with column types {wanted}: {e}") from None
    for col in wanted:
        if table.column(col).null_count:
            raise ValueError(f"{path}: column {col!r} has {table.column(col).null_count} empty values")
    return table


def title_year(title: str) -> int:
    """Release year from a MovieLens title ``"Name (1995)"`` (first year of a range); -1 when absent."""
    m = _TITLE_YEAR.search(title)
    return int(m.group(1)) if m else -1


def year_bucket(year_N: np.ndarray) -> np.ndarray:
    known = year_N >= 0
    clamped = np.clip(year_N, YEAR_BUCKET_FIRST, YEAR_BUCKET_LAST)
    return np.where(known, 1 + (clamped - YEAR_BUCKET_FIRST) // YEAR_BUCKET_WIDTH, 0).astype(np.int8)


def item_text(title: str, genres: str, tags: str) -> str:
    """The text embedded for an item: ``"title. genre, genre. tag, tag"`` (empty parts left out)."""
    parts = [title.strip()]
    if genres and genres != GENRES[0]:
        parts.append(genres.replace("|", ", "))
    if tags:
        parts.append(tags.replace("|", ", "))
    return ". ".join(parts)


def evaluation_start(ratings: pa.Table) -> dict[int, int]:
    """Per movieId, the timestamp of its first val or test rating under the per-user split
    (``recformer data build``'s rule, ``order_and_split``); movies no evaluation row rates are
    absent. Item text keeps only the tags written before it (``build_items``)."""
    import polars as pl

    events = pl.from_arrow(ratings.select(["userId", "movieId", "timestamp"])).with_columns(
        pl.lit(0, pl.Int8).alias("label"), pl.int_range(pl.len()).alias(EID)
    )
    # Items follow movieId order (their ranks), so (user, ts, movieId) is the log's (user, ts, item).
    cols = EventColumns("userId", "movieId", "timestamp", "label", None, None, [], [])
    ordered, _ = order_and_split(events, cols, log_mapping(["(ratings.csv)"], 1), None)
    first = ordered.filter(pl.col(SPLIT) > 0).group_by("movieId").agg(pl.col("timestamp").min())
    return dict(zip(first["movieId"].to_list(), first["timestamp"].to_list()))


def build_items(
    movies: pa.Table, tags: pa.Table, source: Path, tags_before: dict[int, int] | None = None
) -> pa.Table:
    """The item side table without content embeddings, one row per movie, ``item_id`` = row index.
    ``tags_before``: per movieId, keep only its tags with an earlier timestamp (``evaluation_start``)."""
    movie_id = movies.column("movieId").to_numpy()
    if len(np.unique(movie_id)) != len(movie_id):
        raise ValueError(f"{Path(source) / 'movies.csv'}: column 'movieId' has duplicate values")
    order = np.argsort(movie_id, kind="stable")
    movie_id = movie_id[order]
    titles = [movies.column("title")[int(i)].as_py() for i in order]
    genres = [movies.column("genres")[int(i)].as_py() for i in order]
    genre_id = {g: i for i, g in enumerate(GENRES)}
    for mid, g in zip(movie_id, genres):
        unknown = [x for x in g.split("|") if x not in genre_id]
        if unknown:
            raise ValueError(
                f"{Path(source) / 'movies.csv'}: column 'genres' of movieId {mid} has {unknown}, "
                f"outside the fixed vocabulary {GENRES}"
            )
    # Tags: distinct strings per movie, sorted case-insensitively so the text is deterministic.
    by_movie: dict[int, set[str]] = {}
    cutoff = tags_before or {}
    columns = (tags.column(c).to_pylist() for c in ("movieId", "tag", "timestamp"))
    for mid, tag, ts in zip(*columns):
        if mid not in cutoff or ts < cutoff[mid]:
            by_movie.setdefault(mid, set()).add(tag.strip())
    tag_text = ["|".join(sorted(by_movie.get(int(m), ()), key=lambda t: (t.lower(), t))) for m in movie_id]
    year = np.array([title_year(t) for t in titles], dtype=np.int16)
    return pa.table(
        {
            "item_id": pa.array(np.arange(len(movie_id), dtype=np.int32)),
            "movie_id": pa.array(movie_id.astype(np.int32)),
            "title": pa.array(titles, pa.string()),
            "year": pa.array(year),
            "genres": pa.array(genres, pa.string()),
            "tags": pa.array(tag_text, pa.string()),
            "year_bucket": pa.array(year_bucket(year.astype(np.int64))),
            "first_genre": pa.array(np.array([genre_id[g.split("|")[0]] for g in genres], dtype=np.int8)),
            "genre_ids": pa.array([[genre_id[x] for x in g.split("|")] for g in genres], pa.list_(pa.int8())),
        }
    )


def _lookup(sorted_keys: np.ndarray, wanted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Position of each wanted key in an ascending key array, and whether it is really there."""
    pos = np.searchsorted(sorted_keys, wanted)
    if len(sorted_keys) == 0:
        return pos, np.zeros(len(wanted), dtype=bool)
    return pos, (pos < len(sorted_keys)) & (sorted_keys[np.minimum(pos, len(sorted_keys) - 1)] == wanted)


def attach_content(items: pa.Table, items_path: Path) -> pa.Table:
    """Add ``content_emb`` from the committed embedding table, keyed by movie_id."""
    if not items_path.is_file():
        raise FileNotFoundError(
            f"{items_path} does not exist: it holds the item content embeddings "
            "(make it with `recformer data embed-items`, or pass --items)"
        )
    emb = pq.read_table(items_path, page_checksum_verification=True)
    for col in ("movie_id", "content_emb"):
        if col not in emb.column_names:
            raise ValueError(f"{items_path}: missing column {col!r}; found {emb.column_names}")
    emb_type = emb.schema.field("content_emb").type
    if not (pa.types.is_fixed_size_list(emb_type) or pa.types.is_list(emb_type)):
        raise ValueError(f"{items_path}: column 'content_emb' must be a list of floats, found {emb_type}")
    have = emb.column("movie_id").to_numpy()
    if np.any(np.diff(have) <= 0):
        raise ValueError(f"{items_path}: column 'movie_id' must be sorted ascending and unique")
    want = items.column("movie_id").to_numpy()
    pos, ok = _lookup(have, want)
    if not ok.all():
        missing = want[~ok]
        raise ValueError(
            f"{items_path}: column 'movie_id' lacks {len(missing)} movies of movies.csv "
            f"(first: {missing[:5].tolist()}); re-run `recformer data embed-items`"
        )
    content = emb.column("content_emb").combine_chunks().take(pa.array(pos))
    return items.append_column("content_emb", content)


def content_dim(items: pa.Table) -> int:
    t = items.schema.field("content_emb").type
    if pa.types.is_fixed_size_list(t):
        return t.list_size
    lengths = pc.list_value_length(items.column("content_emb")).to_numpy()
    if len(np.unique(lengths)) != 1:
        raise ValueError(
            f"column 'content_emb' has rows of different lengths {np.unique(lengths)[:5].tolist()}"
        )
    return int(lengths[0])


# ----------------------------------------------------------------------------------------------
# The log
# ----------------------------------------------------------------------------------------------


def _release_seconds(year_I: np.ndarray) -> np.ndarray:
    """Unix seconds of 1 January of each year (UTC); 0 where the year is unknown (masked by callers)."""
    y = np.where(year_I >= 0, year_I, 1970).astype(np.int64)
    return (y - 1970).astype("datetime64[Y]").astype("datetime64[s]").astype(np.int64)


def log_mapping(events: list[str], max_len: int) -> BuildConfig:
    """The module docstring's rules as a ``recformer data build`` mapping over the events table
    ``events_table`` writes: label = rating >= 4, the history's items and ratings (x2, 1..10),
    hour and day, user and item priors, the per-user 10 % / 10 % split of users with 10 ratings."""
    return BuildConfig(
        events=events,
        columns=Columns(user="user_id", item="item_id", time="timestamp", rating="rating"),
        rating_threshold=4.0,
        features=Features(history=["ratings"], time=["hour", "dow"], priors=["user", "item"]),
        split=Split(by="user", val=0.1, test=0.1, min_events=10),
        max_len=max_len,
        prior_strength=PRIOR_STRENGTH,
        row_group_rows=ROW_GROUP_ROWS,
        bucket_rows=2**62,  # one bucket: the whole log in one file per split, as before
    )


def events_table(ratings: pa.Table, items: pa.Table, source: Path) -> pa.Table:
    """The ratings as ``data build`` events: ``item_id`` the movie's rank, ``ratings`` = rating x 2
    (the history's rating ids 1..10); checked against movies.csv and the rating range."""
    movie_of_item = items.column("movie_id").to_numpy()
    raw_movie = ratings.column("movieId").to_numpy()
    item, known = _lookup(movie_of_item, raw_movie)
    if not known.all():
        raise ValueError(
            f"{Path(source) / 'ratings.csv'}: column 'movieId' has {int((~known).sum())} ratings of movies "
            f"absent from movies.csv (first: {raw_movie[~known][:5].tolist()})"
        )
    rating = ratings.column("rating").to_numpy()
    if np.any((rating < 0.5) | (rating > 5.0)):
        raise ValueError(f"{Path(source) / 'ratings.csv'}: column 'rating' must lie in [0.5, 5.0]")
    return pa.table(
        {
            "user_id": ratings.column("userId"),
            "item_id": pa.array(item.astype(np.int32)),
            "timestamp": ratings.column("timestamp"),
            "rating": ratings.column("rating"),
            "ratings": pa.array(np.rint(rating * 2).astype(np.int8)),
        }
    )


LOG_COLUMNS = (
    "user_id", "item_id", "movie_id", "timestamp", "rating", "label", "hist_item_ids", "hist_ratings",
    "hist_gaps", "hour", "dow", "user_n_prior", "user_pos_rate_prior", "item_n_prior",
    "item_pos_rate_prior", "days_since_release",
)  # fmt: skip
"""The written columns, in order."""


def build_log(
    ratings: pa.Table, items: pa.Table, max_len: int, source: Path, work: Path
) -> dict[str, pa.Table]:
    """Each split's rows: ``recformer data build`` on the ratings (in ``work``), then the MovieLens
    columns it does not know: ``movie_id`` and ``days_since_release`` from the item table."""
    pq.write_table(events_table(ratings, items, source), work / "events.parquet")
    build(log_mapping([str(work / "events.parquet")], max_len), work / "log", progress=False)
    year = items.column("year").to_numpy().astype(np.int64)
    movie = items.column("movie_id")
    tables = {}
    for name in SPLITS:
        t = pq.read_table(sorted((work / "log" / name).glob("*.parquet")))
        t = t.rename_columns([{"hist_item_id": "hist_item_ids"}.get(c, c) for c in t.column_names])
        item = t.column("item_id").to_numpy()
        ts = t.column("timestamp").to_numpy()
        days = np.maximum((ts - _release_seconds(year[item])) / 86400.0, 0.0)
        t = t.append_column("movie_id", movie.take(pa.array(item)))
        t = t.append_column(
            "days_since_release", pa.array(np.where(year[item] >= 0, days, -1.0).astype(np.float32))
        )
        tables[name] = t.select(list(LOG_COLUMNS))
    return tables


def dense_fields(train: pa.Table) -> list[DenseField]:
    """Normalisation of each dense column, fitted on the train split only."""
    out = []
    for name, log1p in DENSE_COLUMNS.items():
        x = train.column(name).to_numpy().astype(np.float64)
        if log1p:
            x = np.sign(x) * np.log1p(np.abs(x))
        std = float(x.std())
        # A constant column carries nothing; std 1 leaves it at 0 after centring instead of failing.
        out.append(DenseField(name=name, mean=float(x.mean()), std=std if std > 0 else 1.0, log1p=log1p))
    return out


def genre_slots(items: pa.Table) -> int:
    """Genres an item token sums (``genre_ids``' ``max_values``): as many as the movie with the most
    has (10 in latest-small), so no genre is left out and set-up has nothing to warn of. A
    fixed 4 (which 96% of the movies fit) dropped 443 genres of the other 4%, with a warning at
    every fit and evaluation on the shipped data."""
    return max(1, int(pc.max(pc.list_value_length(items.column("genre_ids"))).as_py() or 1))


MIN_USER_RATINGS = 5
"""Train ratings a user needs for a ``user_id`` embedding row of its own; users with fewer share the
OOV row (a bounded table: ``recformer data vocab``'s frequency cut-off)."""
USER_VOCAB = "vocab/user_id.parquet"


def make_spec(
    n_items: int, emb_dim: int, max_len: int, train: pa.Table, n_users: int, max_genres: int
) -> FeatureSpec:
    """The spec of the written logs; ``n_users``: the rows of the fitted ``user_id`` vocabulary;
    ``max_genres``: ``genre_slots`` of the item table."""
    return FeatureSpec(
        label="label",
        group="user_id",
        keys=["user_id", "item_id", "timestamp"],
        item=ItemSpec(
            column="item_id",
            vocab_size=n_items,
            side_table="items.parquet",
            side_id_column="item_id",
            content_column="content_emb",
            content_dim=emb_dim,
            features=[
                CategoricalField(name="year_bucket", vocab_size=N_YEAR_BUCKETS),
                CategoricalField(name="genre_ids", vocab_size=len(GENRES), max_values=max_genres),
            ],
        ),
        categorical=[
            CategoricalField(name="user_id", vocab_file=USER_VOCAB, vocab_size=n_users),
            CategoricalField(name="hour", vocab_size=24),
            CategoricalField(name="dow", vocab_size=7),
        ],
        dense=dense_fields(train),
        sequence=SequenceSpec(
            item_column="hist_item_ids",
            max_len=max_len,
            categorical=[CategoricalField(name="hist_ratings", vocab_size=SEQ_RATING_VOCAB)],
            time_gap_column="hist_gaps",
        ),
        unused={
            "movie_id": "MovieLens movieId of the rated movie (item_id is its rank among all movieIds)",
            "rating": "the rating itself, 0.5-5; label = rating >= 4, so it must never be a feature",
        },
    )


# ----------------------------------------------------------------------------------------------
# Writing
# ----------------------------------------------------------------------------------------------


def _write(table: pa.Table, path: Path) -> None:
    table = table.cast(required(table.schema))
    pq.write_table(table, path, row_group_size=ROW_GROUP_ROWS, compression="zstd", **CHECKSUMS)


def write_splits(tables: dict[str, pa.Table], out: Path) -> dict[str, list[Path]]:
    written: dict[str, list[Path]] = {}
    for name, table in tables.items():
        d = out / name
        d.mkdir(parents=True, exist_ok=True)
        remove_own_parts(out, [name])
        fractions = TRAIN_FILE_FRACTIONS if name == "train" else (1.0,)
        if table.num_rows < len(fractions):
            raise ValueError(
                f"split {name!r} has {table.num_rows} rows, fewer than its {len(fractions)} files"
            )
        cuts = np.rint(np.cumsum((0.0,) + fractions) * table.num_rows).astype(int)
        written[name] = []
        for i, (a, b) in enumerate(zip(cuts[:-1], cuts[1:])):
            path = d / f"part-{i:05d}.parquet"
            _write(table.slice(a, b - a), path)
            written[name].append(path)
    return written


def prepare(source: Path, out: Path, items_path: Path, max_len: int = 50) -> dict[str, dict[str, float]]:
    """Build the whole dataset folder; returns per-split figures (rows, positive rate, mean history)."""
    if max_len <= 0:
        raise ValueError(f"--max-len={max_len} must be > 0")
    source, out = Path(source), Path(out)
    ratings, movies, tags = (read_source_csv(source, f) for f in ("ratings.csv", "movies.csv", "tags.csv"))
    licence = source / "README.txt"
    if not licence.is_file():
        raise FileNotFoundError(f"{licence} does not exist: GroupLens' licence must travel with the data")
    refuse_foreign_parquet(out, SPLITS, written=SPLITS)  # before any work: a bad input must not cost the data
    items = attach_content(build_items(movies, tags, source, evaluation_start(ratings)), Path(items_path))
    with tempfile.TemporaryDirectory(prefix="movielens-") as work:
        tables = build_log(ratings, items, max_len, source, Path(work))
    out.mkdir(parents=True, exist_ok=True)
    write_splits(tables, out)
    _write(items, out / "items.parquet")
    n_users = fit_column(
        sorted((out / "train").glob("*.parquet")), "user_id", out / USER_VOCAB, MIN_USER_RATINGS
    )
    spec = make_spec(
        items.num_rows, content_dim(items), max_len, tables["train"], n_users, genre_slots(items)
    )
    spec.save(out / "spec.yaml")
    shutil.copyfile(licence, out / "README.txt")
    stats = {}
    for name, t in tables.items():
        hist = pc.list_value_length(t.column("hist_item_ids")).to_numpy()
        stats[name] = {
            "rows": t.num_rows,
            "pos_rate": float(t.column("label").to_numpy().mean()) if t.num_rows else float("nan"),
            "users": len(np.unique(t.column("user_id").to_numpy())),
            "mean_hist": float(hist.mean()) if t.num_rows else float("nan"),
        }
    users = np.unique(np.concatenate([t.column("user_id").to_numpy() for t in tables.values()]))
    stats["all"] = {"users": len(users), "items": items.num_rows}
    return stats


# ----------------------------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------------------------


HELP = """MovieLens ratings to temporally split Parquet logs, ready to train on.

One row per rating, seen as an impression: label = rating >= 4, with the user's strictly earlier
ratings as history, the user's and the item's priors and the hour and day of week. The last tenth
of each user's ratings is test and the tenth before it val (users with fewer than 10 ratings: all
train). Writes train/, val/, test/, items.parquet (every movie, with its text embedding), vocab/,
spec.yaml and GroupLens' README.txt, whose licence travels with the data. The same input always
gives the same files.
"""
"""What --help says: plain text, for a person at a terminal (the module docstring is for developers)."""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "movielens",
        help="MovieLens CSVs -> temporally split Parquet logs, item table and spec.yaml",
        description=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", type=Path, required=True, help="output folder (train/ val/ test/ items spec)")
    p.add_argument("--source", default=DEFAULT_SOURCE, help="folder with ratings.csv, movies.csv, tags.csv")
    p.add_argument("--items", default=DEFAULT_ITEMS, help="content-embedding table (movie_id, content_emb)")
    p.add_argument("--max-len", type=int, default=50, help="history events kept per row (most recent)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    try:
        stats = prepare(repo_path(args.source), args.out, repo_path(args.items), args.max_len)
    except (FileNotFoundError, ValueError) as e:
        print(f"recformer data movielens: error: {e}", file=sys.stderr)
        return 2
    for name in SPLITS:
        s = stats[name]
        print(
            f"{name:5s}  rows {s['rows']:>7d}  positive rate {s['pos_rate']:.3f}  users {s['users']:>4d}  "
            f"mean history {s['mean_hist']:.1f}"
        )
    a = stats["all"]
    took = time.perf_counter() - t0
    print(f"users {a['users']}  items {a['items']}  max_len {args.max_len}  -> {args.out} ({took:.1f} s)")
    return 0
