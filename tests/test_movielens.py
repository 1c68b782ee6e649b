"""`recformer data movielens / embed-items / summary` on the shipped MovieLens data.

References are slow per-row Python loops over ratings.csv, written independently of the vectorised
code: history, prior counts and the split are recomputed from the definitions in the module docstring.
"""

from __future__ import annotations

import bisect
import csv
import datetime as dt
import functools
import importlib.util
import logging
import shutil
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recformer.__main__ import main
from recformer.config import FeatureSpec
from recformer.datasets import movielens as ml
from recformer.datasets.embed_items import INSTALL_HINT, embed_items, load_encoder
from recformer.datasets.summary import summarize
from tests.conftest import required_list

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "data" / "ml-latest-small"
ITEMS = REPO / "data" / "ml-latest-small-items.parquet"
SOURCE_FILES = ("ratings.csv", "movies.csv", "tags.csv", "links.csv", "README.txt")


@functools.lru_cache(maxsize=4)
def _ratings(source: Path = SOURCE) -> list[tuple[int, int, float, int]]:
    with open(source / "ratings.csv") as fh:
        return [
            (int(r["userId"]), int(r["movieId"]), float(r["rating"]), int(r["timestamp"]))
            for r in csv.DictReader(fh)
        ]


def _movie_ids() -> list[int]:
    with open(SOURCE / "movies.csv") as fh:
        return sorted(int(r["movieId"]) for r in csv.DictReader(fh))


def _small_source(dst: Path, users: set[int], short_user: tuple[int, int] | None = None) -> Path:
    """A source folder with the ratings of ``users`` only; ``short_user=(src, new_id)`` adds a user
    made of ``src``'s first 7 ratings (fewer than 10, so all of it must land in train)."""
    dst.mkdir(parents=True)
    for name in SOURCE_FILES:
        if name != "ratings.csv":
            shutil.copyfile(SOURCE / name, dst / name)
    rows = [r for r in _ratings() if r[0] in users]
    if short_user is not None:
        src, new = short_user
        rows += [(new, m, r, t) for (_, m, r, t) in sorted(x for x in _ratings() if x[0] == src)[:7]]
    with open(dst / "ratings.csv", "w", newline="") as fh:
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(["userId", "movieId", "rating", "timestamp"])
        w.writerows([u, m, f"{r:.1f}", t] for u, m, r, t in rows)
    return dst


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _split(root: Path, name: str) -> pa.Table:
    return pa.concat_tables(pq.read_table(p) for p in sorted((root / name).glob("*.parquet")))


@pytest.fixture(scope="module")
def full(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("ml-full")
    return out, ml.prepare(SOURCE, out, ITEMS, max_len=50)


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> tuple[Path, Path]:
    """Users 1-30 plus a 7-rating user 100001, with --max-len 5 so truncation is exercised."""
    root = tmp_path_factory.mktemp("ml-small")
    src = _small_source(root / "src", set(range(1, 31)), short_user=(3, 100001))
    out = root / "out"
    ml.prepare(src, out, ITEMS, max_len=5)
    return src, out


# ---------------------------------------------------------------------------------------------
# Determinism, layout, spec
# ---------------------------------------------------------------------------------------------


def test_two_runs_are_byte_identical(small, full, tmp_path):
    src, out = small
    ml.prepare(src, tmp_path / "again", ITEMS, max_len=5)
    assert _files(out) == _files(tmp_path / "again")
    full_out, _ = full
    ml.prepare(SOURCE, tmp_path / "full-again", ITEMS, max_len=50)
    first, second = _files(full_out), _files(tmp_path / "full-again")
    assert sorted(first) == sorted(second)
    assert [k for k in first if first[k] != second[k]] == []


def test_a_rerun_replaces_its_own_parts_and_refuses_files_it_did_not_write(small, tmp_path):
    src, out = small
    again = tmp_path / "again"
    shutil.copytree(out, again)
    ml.prepare(src, again, ITEMS, max_len=5)  # its own part files: replaced, byte-identical
    assert _files(again) == _files(out)
    # A bad input stops the command before it removes anything of the dataset there.
    with pytest.raises(FileNotFoundError):
        ml.prepare(src, again, tmp_path / "no-items.parquet", max_len=5)
    assert _files(again) == _files(out)
    # A val.parquet beside val/ is not read (val/ has files), so it is no reason to stop.
    (again / "val.parquet").write_bytes((out / "test" / "part-00000.parquet").read_bytes())
    planted = again / "train" / "date=1" / "old.parquet"
    planted.parent.mkdir()
    planted.write_bytes((out / "test" / "part-00000.parquet").read_bytes())
    before = _files(again)
    with pytest.raises(ValueError, match="remove them or use an empty --out") as e:
        ml.prepare(src, again, ITEMS, max_len=5)
    assert str(planted) in str(e.value) and "val.parquet" not in str(e.value)
    assert _files(again) == before  # nothing written, nothing removed


def test_layout_uneven_train_files_and_row_groups(full):
    out, stats = full
    sizes = [pq.ParquetFile(p).metadata.num_rows for p in sorted((out / "train").glob("*.parquet"))]
    assert len(sizes) == 3 and len(set(sizes)) == 3 and sum(sizes) == stats["train"]["rows"]
    for name in ("val", "test"):
        assert len(list((out / name).glob("*.parquet"))) == 1
    meta = pq.ParquetFile(out / "train" / "part-00000.parquet").metadata
    assert meta.num_row_groups > 1
    assert max(meta.row_group(i).num_rows for i in range(meta.num_row_groups)) == ml.ROW_GROUP_ROWS
    assert (out / "README.txt").read_bytes() == (SOURCE / "README.txt").read_bytes()
    total = sum(stats[s]["rows"] for s in ml.SPLITS)
    assert total == len(_ratings()) and stats["all"]["users"] == 610 and stats["all"]["items"] == 9742


def test_schema_types(full):
    out, _ = full
    schema = pq.read_schema(out / "train" / "part-00000.parquet")
    want = {
        "user_id": pa.int64(),
        "item_id": pa.int32(),
        "movie_id": pa.int32(),
        "timestamp": pa.int64(),
        "rating": pa.float32(),
        "label": pa.int8(),
        "hist_item_ids": required_list(pa.int32()),
        "hist_ratings": required_list(pa.int8()),
        "hist_gaps": required_list(pa.float32()),
        "hour": pa.int8(),
        "dow": pa.int8(),
    } | {c: pa.float32() for c in ml.DENSE_COLUMNS}
    assert {n: schema.field(n).type for n in schema.names} == want
    assert not any(f.nullable for f in schema)


def test_spec_loads_and_names_only_existing_columns(full):
    out, _ = full
    spec = FeatureSpec.load(out / "spec.yaml")
    for name in ml.SPLITS:
        names = pq.read_schema(next((out / name).glob("*.parquet"))).names
        assert [c for c in spec.columns() if c not in names] == []
        # ... and describes every column written: a role, or what an unused one holds.
        assert sorted(names) == sorted(spec.columns() + list(spec.unused))
    assert "label = rating >= 4" in spec.unused["rating"]
    side = pq.read_table(spec.side_table_path())
    assert side.num_rows == spec.item.vocab_size
    assert side.column(spec.item.side_id_column).to_pylist() == list(range(spec.item.vocab_size))
    assert side.schema.field(spec.item.content_column).type.list_size == spec.item.content_dim == 384
    # Every id stays inside its declared vocabulary (no value would silently fall into the OOV row).
    train = _split(out, "train")
    for f in spec.item.features:
        col = side.column(f.name).combine_chunks()
        v = (col.flatten() if f.max_values > 1 else col).to_numpy()
        assert v.min() >= 0 and v.max() < f.vocab_size
    for f in spec.categorical:
        if f.vocab_file is not None:  # raw ids, mapped through a vocabulary fit on train
            continue
        v = train.column(f.name).to_numpy()
        assert v.min() >= 0 and v.max() < f.vocab_size
    # user_id's bounded table: a row per user with at least MIN_USER_RATINGS train ratings.
    counts = Counter(train.column("user_id").to_pylist())
    vocab = pq.read_table(out / ml.USER_VOCAB).column(0).to_pylist()
    assert sorted(vocab) == sorted(u for u, c in counts.items() if c >= ml.MIN_USER_RATINGS)
    assert next(f for f in spec.categorical if f.name == "user_id").vocab_size == len(vocab)
    ratings = train.column("hist_ratings").combine_chunks().flatten().to_numpy()
    assert ratings.min() >= 1 and ratings.max() == 10 and spec.sequence.categorical[0].vocab_size == 11
    # Dense normalisation was fitted on train: re-deriving it gives the same figures.
    for f in spec.dense:
        x = train.column(f.name).to_numpy().astype(np.float64)
        x = np.sign(x) * np.log1p(np.abs(x)) if f.log1p else x
        assert f.mean == pytest.approx(x.mean(), rel=1e-9) and f.std == pytest.approx(x.std(), rel=1e-9)


# ---------------------------------------------------------------------------------------------
# Split and leakage
# ---------------------------------------------------------------------------------------------


def test_split_proportions_per_user(small):
    _, out = small
    count: dict[tuple[int, str], int] = defaultdict(int)
    for name in ml.SPLITS:
        for u in _split(out, name).column("user_id").to_pylist():
            count[u, name] += 1
    users = {u for u, _ in count}
    assert 100001 in users and len(users) == 31
    for u in users:
        n = sum(count[u, s] for s in ml.SPLITS)
        k = n // 10 if n >= 10 else 0
        assert (count[u, "val"], count[u, "test"], count[u, "train"]) == (k, k, n - 2 * k), u
    assert count[100001, "train"] == 7


def test_no_user_time_overlap_between_splits(full):
    out, _ = full
    last: dict[str, dict[int, int]] = {}
    first: dict[str, dict[int, int]] = {}
    for name in ml.SPLITS:
        t = _split(out, name)
        lo, hi = defaultdict(lambda: 2**62), defaultdict(int)
        for u, ts in zip(t.column("user_id").to_pylist(), t.column("timestamp").to_pylist()):
            lo[u], hi[u] = min(lo[u], ts), max(hi[u], ts)
        first[name], last[name] = lo, hi
    for u, t_max in last["train"].items():
        if u in first["val"]:
            assert first["val"][u] >= t_max and first["test"][u] >= last["val"][u], u


# ---------------------------------------------------------------------------------------------
# History and context against slow references
# ---------------------------------------------------------------------------------------------


def _reference_rows(source: Path, users: set[int], max_len: int) -> dict[tuple[int, int, int], dict]:
    """Per (user, movie, ts): history and priors computed one row at a time from the definitions."""
    ratings = _ratings(source)
    by_user: dict[int, list] = defaultdict(list)
    by_movie: dict[int, list[int]] = defaultdict(list)
    for u, m, r, t in ratings:
        by_user[u].append((t, m, r))
        by_movie[m].append(t)
    movie_ids = _movie_ids()
    item_of = {m: i for i, m in enumerate(movie_ids)}
    ref = {}
    for u in users:
        events = sorted(by_user[u], key=lambda e: (e[0], item_of[e[1]]))
        times = [e[0] for e in events]
        for t, m, _r in events:
            past = events[: bisect.bisect_left(times, t)]  # every event of an earlier second
            hist = past[-max_len:]
            ref[u, m, t] = {
                "hist_item_ids": [item_of[e[1]] for e in hist],
                "hist_ratings": [round(e[2] * 2) for e in hist],
                "hist_gaps": [float(t - e[0]) for e in hist],
                "user_n_prior": len(past),
                "user_pos_prior": sum(e[2] >= 4 for e in past),
                "item_n_prior": sum(x < t for x in by_movie[m]),
            }
    return ref


@pytest.mark.parametrize("which", ["small", "full"])
def test_history_and_priors_match_reference(which, small, full):
    source, out = small if which == "small" else (SOURCE, full[0])
    spec = FeatureSpec.load(out / "spec.yaml")
    users = {1, 3, 30} if which == "small" else {1, 414, 599}  # 414 / 599: long, bursty timelines
    ref = _reference_rows(source, users, spec.sequence.max_len)
    train_rate = float(_split(out, "train").column("label").to_numpy().mean())
    seen, truncated = 0, 0
    for name in ml.SPLITS:
        t = _split(out, name)
        for row in t.filter(pa.compute.is_in(t.column("user_id"), pa.array(sorted(users)))).to_pylist():
            key = (row["user_id"], row["movie_id"], row["timestamp"])
            if key not in ref:
                continue
            r, seen = ref[key], seen + 1
            assert row["hist_item_ids"] == r["hist_item_ids"], key
            assert row["hist_ratings"] == r["hist_ratings"], key
            np.testing.assert_allclose(row["hist_gaps"], r["hist_gaps"], rtol=1e-6, err_msg=str(key))
            assert all(g > 0 for g in row["hist_gaps"])  # strictly earlier, most recent last
            assert row["hist_gaps"] == sorted(row["hist_gaps"], reverse=True)
            assert row["user_n_prior"] == r["user_n_prior"] and row["item_n_prior"] == r["item_n_prior"]
            smooth = (r["user_pos_prior"] + 2 * train_rate) / (r["user_n_prior"] + 2)
            assert row["user_pos_rate_prior"] == pytest.approx(smooth, rel=1e-5)
            truncated += r["user_n_prior"] > spec.sequence.max_len
    assert seen == len(ref)
    assert truncated > 0  # the check covered truncation, not only short histories


def test_same_second_ratings_are_not_history(full):
    out, _ = full
    t = _split(out, "train")
    user, ts = t.column("user_id").to_numpy(), t.column("timestamp").to_numpy()
    n_prior = t.column("user_n_prior").to_numpy()
    # Two train rows of one user in the same second must see the same past.
    key = user.astype(np.int64) * 2**32 + ts
    _, inv, counts = np.unique(key, return_inverse=True, return_counts=True)
    tied = counts[inv] > 1
    assert tied.sum() > 1000  # MovieLens users rate in bursts: the case matters
    for k in np.unique(key[tied])[:200]:
        assert len(set(n_prior[key == k].tolist())) == 1


def test_item_text_uses_no_tag_written_after_the_items_first_evaluation_row(full):
    """Reference from the written logs: per movie, the earliest val/test timestamp; the item table
    keeps exactly the distinct tags written before it (every tag when no evaluation row rates it)."""
    out, _ = full
    first: dict[int, int] = {}
    for split in ("val", "test"):
        t = _split(out, split)
        for m, ts in zip(t.column("movie_id").to_pylist(), t.column("timestamp").to_pylist()):
            first[m] = min(ts, first.get(m, ts))
    expected: dict[int, set[str]] = {}
    tagged = set()
    with open(SOURCE / "tags.csv", newline="") as fh:
        for row in csv.DictReader(fh):
            m, ts = int(row["movieId"]), int(row["timestamp"])
            tagged.add(m)
            if m not in first or ts < first[m]:
                expected.setdefault(m, set()).add(row["tag"].strip())
    items = pq.read_table(out / "items.parquet")
    got = dict(zip(items.column("movie_id").to_pylist(), items.column("tags").to_pylist()))
    assert {m: set(t.split("|")) for m, t in got.items() if t} == expected
    assert len(tagged) - len(expected) > 1000  # most tagged movies were tagged only after that row


def test_calendar_and_release_columns(full):
    out, _ = full
    t = _split(out, "test").slice(0, 500).to_pylist()
    items = pq.read_table(out / "items.parquet", columns=["movie_id", "year", "year_bucket", "first_genre"])
    items = items.to_pylist()
    for row in t:
        when = dt.datetime.fromtimestamp(row["timestamp"], tz=dt.timezone.utc)
        assert (row["hour"], row["dow"]) == (when.hour, when.weekday())
        year = items[row["item_id"]]["year"]
        assert items[row["item_id"]]["movie_id"] == row["movie_id"]
        days = (when - dt.datetime(year, 1, 1, tzinfo=dt.timezone.utc)).total_seconds() / 86400
        assert row["days_since_release"] == pytest.approx(max(days, 0.0), rel=1e-6)
    unknown = [i for i in items if i["year"] == -1]
    assert len(unknown) == 12 and all(i["year_bucket"] == 0 for i in unknown)
    toy = items[0]
    assert (toy["movie_id"], toy["year"], toy["first_genre"]) == (1, 1995, ml.GENRES.index("Adventure"))
    assert toy["year_bucket"] == 1 + (1995 - 1900) // 5
    assert ml.title_year("Death Note: Desu nôto (2006–2007)") == 2006


# ---------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------


def test_missing_column_names_file_and_column(tmp_path, capsys):
    src = _small_source(tmp_path / "src", {1})
    text = (src / "ratings.csv").read_text().replace("timestamp", "time")
    (src / "ratings.csv").write_text(text)
    with pytest.raises(ValueError, match=r"ratings\.csv: missing column 'timestamp'"):
        ml.prepare(src, tmp_path / "out", ITEMS)
    assert main(["data", "movielens", "--source", str(src), "--out", str(tmp_path / "out")]) == 2
    assert "ratings.csv: missing column 'timestamp'" in capsys.readouterr().err


def test_missing_file_and_uncovered_movie(tmp_path):
    src = _small_source(tmp_path / "src", {1})
    (src / "tags.csv").unlink()
    with pytest.raises(FileNotFoundError, match=r"tags\.csv does not exist"):
        ml.prepare(src, tmp_path / "out", ITEMS)
    shutil.copyfile(SOURCE / "tags.csv", src / "tags.csv")
    partial = tmp_path / "partial.parquet"
    table = pq.read_table(ITEMS)
    pq.write_table(table.filter(pa.compute.not_equal(table.column("movie_id"), 1)), partial)
    with pytest.raises(ValueError, match=r"partial\.parquet: column 'movie_id' lacks 1 movies .*\[1\]"):
        ml.prepare(src, tmp_path / "out", partial)


# ---------------------------------------------------------------------------------------------
# summary
# ---------------------------------------------------------------------------------------------


def test_summary_matches_full_read(full, capsys):
    out, stats = full
    spec, splits = summarize(out)
    assert [s.name for s in splits] == list(ml.SPLITS)
    for s in splits:
        t = _split(out, s.name)
        assert s.rows == t.num_rows == stats[s.name]["rows"]
        assert s.files == (3 if s.name == "train" else 1)
        assert s.pos_rate == pytest.approx(t.column("label").to_numpy().mean())
        lengths = pa.compute.list_value_length(t.column("hist_item_ids")).to_numpy()
        if s.name == "train":  # empty histories exist, so the footer null count matters
            assert (lengths == 0).sum() > 0
        assert s.mean_len("hist_item_ids") == pytest.approx(lengths.mean())
    assert main(["data", "summary", str(out)]) == 0
    assert "positive rate" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------
# embed-items
# ---------------------------------------------------------------------------------------------


def test_committed_item_embeddings():
    t = pq.read_table(ITEMS)
    assert t.schema.field("content_emb").type == pa.list_(pa.float16(), 384)
    assert t.schema.field("movie_id").type == pa.int32()
    movies = _movie_ids()
    assert t.column("movie_id").to_pylist() == movies
    emb = t.column("content_emb").combine_chunks().flatten().to_numpy().astype(np.float32).reshape(-1, 384)
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, atol=2e-3)
    assert ITEMS.stat().st_size < 10 * 2**20
    # Text semantics, which random or shuffled vectors would not show: Toy Story is closer to
    # Toy Story 2 (3114) than to Jumanji (2), and closer to Jumanji than to Star Wars (260).
    row = {m: i for i, m in enumerate(movies)}
    cos = lambda a, b: float(emb[row[a]] @ emb[row[b]])
    assert cos(1, 3114) > cos(1, 2) > cos(1, 260)


def test_embed_items_without_extra_names_install_command(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "sentence_transformers", None)
    with pytest.raises(ImportError, match=INSTALL_HINT.replace("[", r"\[").replace(".", r"\.")):
        load_encoder()


HAS_EMBED = importlib.util.find_spec("sentence_transformers") is not None


@pytest.mark.skipif(not HAS_EMBED, reason="needs the `embed` extra: pip install -e '.[embed]'")
def test_embed_items_reproduces_committed_rows(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    keep = {"1", "2", "260", "3114", "60756"}
    for name in ("movies.csv", "tags.csv"):
        lines = (SOURCE / name).read_text().splitlines(keepends=True)
        col = 0 if name == "movies.csv" else 1
        (src / name).write_text(lines[0] + "".join(ln for ln in lines[1:] if ln.split(",")[col] in keep))
    shutil.copyfile(
        SOURCE / "ratings.csv", src / "ratings.csv"
    )  # every user: the split decides the tag cutoff
    got = embed_items(src, tmp_path / "items.parquet")
    committed = pq.read_table(ITEMS)
    ids = committed.column("movie_id").to_pylist()
    assert got.column("movie_id").to_pylist() == sorted(int(k) for k in keep)
    for i, m in enumerate(got.column("movie_id").to_pylist()):
        a = np.asarray(got.column("content_emb")[i].values, dtype=np.float32)
        b = np.asarray(committed.column("content_emb")[ids.index(m)].values, dtype=np.float32)
        assert float(a @ b) > 0.999, m


def test_the_shipped_data_loads_without_a_warning(full, caplog):
    """genre_ids keeps as many genres as the movie with the most (issue 30: max_values=4 left 443
    genres out, with a warning at every fit and evaluation on the data the project ships)."""
    from recformer.data.datamodule import RecDataModule

    out, _ = full
    spec = FeatureSpec.load(out / "spec.yaml")
    genres = next(f for f in spec.item.features if f.name == "genre_ids")
    side = pq.read_table(out / "items.parquet", columns=["genre_ids"]).column(0)
    assert genres.max_values == max(len(g) for g in side.to_pylist()) == 10
    with caplog.at_level(logging.WARNING):
        dm = RecDataModule(str(out), num_workers=0, validate="full")
        dm.setup("fit")
        dm.item_tables()
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
