"""``recformer data build``: raw events to the contract, against a slow per-event reference."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from recformer.__main__ import main as recformer_main
from recformer.cli import cli_main
from recformer.config import FeatureSpec
from recformer.datasets.build import BuildError, build
from recformer.datasets.build_config import BuildConfig
from tests.test_module import fit_args

MAX_LEN = 4


def _events(seed: int = 0, users: int = 30, items: int = 40, rows: int = 900) -> pl.DataFrame:
    """Events with string users, integer items, times with same-second ties, a 0/1 label and
    context columns; no duplicate (user, item, time)."""
    rng = np.random.default_rng(seed)
    df = pl.DataFrame(
        {
            "uid": [f"u{u}" for u in rng.integers(0, users, rows)],
            "iid": rng.integers(0, items, rows).astype(np.int64),
            "ts": 1_600_000_000 + rng.integers(0, 40, rows) * 3600,  # few distinct times: many ties
            "click": (rng.random(rows) < 0.4).astype(np.int64),
            "device": rng.choice(["ios", "android", "web"], rows),
            "price": rng.gamma(2.0, 10.0, rows),
            "action": rng.integers(0, 3, rows),
        }
    )
    return df.unique(["uid", "iid", "ts"], keep="first", maintain_order=True)


def _mapping(tmp: Path, events: str, **extra) -> Path:
    raw = {
        "events": events,
        "columns": {"user": "uid", "item": "iid", "time": "ts", "label": "click"},
        "features": {
            "categorical": ["device"],
            "dense": ["price"],
            "log1p": ["price"],
            "history": ["click", "action"],
            "time": ["hour", "dow"],
            "priors": ["user", "item"],
            "user_id": {"min_count": 2},
        },
        "split": {"by": "user", "val": 0.1, "test": 0.1, "min_events": 10},
        "max_len": MAX_LEN,
    }
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(raw.get(key), dict):
            raw[key] = {**raw[key], **value}
        else:
            raw[key] = value
    path = tmp / "mapping.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _reference(df: pl.DataFrame, strength: float = 2.0) -> dict[tuple, dict]:
    """Per (user, item, time): split, history, gaps and priors by a loop over every event."""
    rows = sorted(df.iter_rows(named=True), key=lambda r: (r["uid"], r["ts"], r["iid"]))
    by_user: dict[str, list[dict]] = {}
    for r in rows:
        by_user.setdefault(r["uid"], []).append(r)
    split = {}
    for evs in by_user.values():
        n = len(evs)
        k = n // 10 if n >= 10 else 0
        for i, r in enumerate(evs):
            split[(r["uid"], r["iid"], r["ts"])] = 2 if i >= n - k else 1 if i >= n - 2 * k else 0
    train = [r["click"] for r in rows if split[(r["uid"], r["iid"], r["ts"])] == 0]
    rate = sum(train) / len(train)
    out = {}
    for uid, evs in by_user.items():
        for r in evs:
            past = [e for e in evs if e["ts"] < r["ts"]]
            item_past = [e for e in rows if e["iid"] == r["iid"] and e["ts"] < r["ts"]]
            kept = past[-MAX_LEN:]
            pos, ipos = sum(e["click"] for e in past), sum(e["click"] for e in item_past)
            out[(uid, r["iid"], r["ts"])] = {
                "split": split[(uid, r["iid"], r["ts"])],
                "hist_iid": [e["iid"] for e in kept],
                "hist_action": [e["action"] for e in kept],
                "hist_click": [e["click"] for e in kept],
                "hist_gaps": [float(r["ts"] - e["ts"]) for e in kept],
                "user_n_prior": len(past),
                "user_pos_rate_prior": (pos + strength * rate) / (len(past) + strength),
                "item_n_prior": len(item_past),
                "item_pos_rate_prior": (ipos + strength * rate) / (len(item_past) + strength),
                "hour": (r["ts"] // 3600) % 24,
            }
    return out


def _read(out: Path) -> dict[str, pl.DataFrame]:
    return {s: pl.read_parquet(sorted((out / s).glob("*.parquet"))) for s in ("train", "val", "test")}


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, pl.DataFrame]:
    tmp = tmp_path_factory.mktemp("build")
    df = _events()
    df.write_parquet(tmp / "events.parquet")
    out = tmp / "out"
    build(BuildConfig.load(_mapping(tmp, "events.parquet")), out, progress=False)
    return out, df


@pytest.mark.parametrize("bucket_rows", [None, 97])
def test_rows_match_the_per_event_reference(built, tmp_path, bucket_rows):
    """Every row's split, history (strictly earlier, last max_len, aligned attributes, gaps),
    priors and hour as a loop computes them; with 97 events per bucket (10 buckets, item priors
    across them) the same rows."""
    out, df = built
    if bucket_rows is not None:
        df.write_parquet(tmp_path / "events.parquet")
        out = tmp_path / "out"
        build(
            BuildConfig.load(_mapping(tmp_path, "events.parquet", bucket_rows=bucket_rows)),
            out,
            progress=False,
        )
        assert len(list((out / "train").glob("*.parquet"))) > 5
    ref = _reference(df)
    seen = 0
    for s, table in enumerate(_read(out).values()):
        for f in (out / ("train", "val", "test")[s]).glob("*.parquet"):
            ts = pq.read_table(f, columns=["ts"]).column(0).to_pylist()
            assert ts == sorted(ts)  # log order in each file
        for r in table.iter_rows(named=True):
            want = ref[(r["uid"], r["iid"], r["ts"])]
            assert want["split"] == s
            for col in (
                "hist_iid",
                "hist_action",
                "hist_click",
                "hist_gaps",
                "hour",
                "user_n_prior",
                "item_n_prior",
            ):
                assert r[col] == want[col], col
            for col in ("user_pos_rate_prior", "item_pos_rate_prior"):
                assert r[col] == pytest.approx(want[col], rel=1e-6), col
            seen += 1
    assert seen == df.height  # nothing dropped, nothing repeated


def test_spec_vocabularies_and_normalisation_fit_on_train(built):
    out, df = built
    spec = FeatureSpec.load(out / "spec.yaml")
    train = _read(out)["train"]
    assert spec.group == "uid" and spec.item.column == "iid" and spec.keys == ["iid", "ts"]  # uid is a string
    price = next(f for f in spec.dense if f.name == "price")
    x = np.log1p(train["price"].to_numpy())
    assert price.log1p and price.mean == pytest.approx(x.mean()) and price.std == pytest.approx(x.std())
    users = pq.read_table(out / "vocab/uid.parquet").to_pydict()
    counts = train.group_by("uid").len()
    assert sorted(users["value"]) == sorted(counts.filter(pl.col("len") >= 2)["uid"].to_list())
    items = pq.read_table(out / "vocab/item.parquet").column("value").to_pylist()
    in_train = set(train["iid"].to_list()) | {i for h in train["hist_iid"].to_list() for i in h}
    assert set(items) == in_train  # target and history items of train only
    report = json.loads((out / "build.json").read_text())
    assert report["counts"]["events"] == df.height and report["counts"]["duplicates"] == 0
    assert sum(report["counts"]["rows"].values()) == df.height


def test_fit_and_summary_run_on_the_output(built, tmp_path, capsys):
    out, _ = built
    assert recformer_main(["data", "summary", str(out)]) == 0
    assert "train" in capsys.readouterr().out
    cli = cli_main(fit_args(out, tmp_path, "--trainer.max_epochs=1"))
    assert cli.trainer.global_step > 0
    assert np.isfinite(float(cli.trainer.callback_metrics["val/auc"]))


def test_csv_glob_string_times_side_tables_and_time_split(tmp_path, capsys):
    """CSV files by glob, ISO time strings, an item table (category, content vector; items only
    it knows become cold items), a users table, and a global time cut."""
    df = _events(seed=1)
    times = df.with_columns(pl.from_epoch("ts", time_unit="s").dt.strftime("%Y-%m-%dT%H:%M:%S").alias("ts"))
    half = times.height // 2
    (tmp_path / "logs").mkdir()
    times[:half].write_csv(tmp_path / "logs" / "a.csv")
    times[half:].write_csv(tmp_path / "logs" / "b.csv")
    items = pl.DataFrame(
        {
            "iid": np.arange(45, dtype=np.int64),  # 5 items no event names
            "category": [f"c{i % 4}" for i in range(45)],
            "emb": [[float(i), 1.0, -1.0] for i in range(45)],
        }
    )
    items.write_parquet(tmp_path / "items.parquet")
    pl.DataFrame({"id": [f"u{u}" for u in range(25)], "band": [u % 3 for u in range(25)]}).write_csv(
        tmp_path / "users.csv"
    )
    cut = sorted(df["ts"].to_list())
    mapping = _mapping(
        tmp_path,
        "logs/*.csv",
        items={"path": "items.parquet", "id": "iid", "categorical": ["category"], "content": "emb"},
        users={"path": "users.csv", "id": "uid", "categorical": ["band"]},
        split={
            "by": "time",
            "val_start": int(cut[int(0.8 * len(cut))]),
            "test_start": int(cut[int(0.9 * len(cut))]),
        },
    )
    # users.id names the users table's column
    raw = yaml.safe_load(mapping.read_text())
    raw["users"]["id"] = "id"
    mapping.write_text(yaml.safe_dump(raw))
    out = tmp_path / "out"
    assert recformer_main(["data", "build", str(mapping), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "events whose user has no users-table row" in printed  # u25..u29
    spec = FeatureSpec.load(out / "spec.yaml")
    assert spec.item.content_dim == 3 and spec.item.cold_items >= 5
    tables = _read(out)
    assert (
        tables["train"]["ts"].max()
        < tables["val"]["ts"].min()
        <= tables["val"]["ts"].max()
        < tables["test"]["ts"].min()
    )
    assert tables["train"]["band"].null_count() > 0  # users without a row: OOV, counted above
    cli = cli_main(fit_args(out, tmp_path / "runs", "--trainer.max_epochs=1"))
    assert cli.trainer.global_step > 0


def _fails(tmp_path: Path, df: pl.DataFrame, capsys, **extra) -> str:
    df.write_parquet(tmp_path / "events.parquet")
    out = tmp_path / "out"
    rc = recformer_main(
        ["data", "build", str(_mapping(tmp_path, "events.parquet", **extra)), "--out", str(out)]
    )
    assert rc == 2
    assert not out.exists() and not (tmp_path / ".out.building").exists()  # nothing written
    return capsys.readouterr().err


def test_misspelled_column_is_named_with_the_closest(tmp_path, capsys):
    err = _fails(tmp_path, _events().rename({"click": "clicks"}), capsys)
    assert "columns.label='click' is not a column" in err and "did you mean ['clicks']" in err


def test_bad_labels_and_times_are_counted_with_examples(tmp_path, capsys):
    df = _events().with_columns(
        pl.when(pl.int_range(pl.len()) < 3).then(2).otherwise(pl.col("click")).alias("click"),
        pl.col("ts").cast(pl.String),
    )
    df = df.with_columns(
        pl.when(pl.int_range(pl.len()) == 5).then(pl.lit("soon")).otherwise(pl.col("ts")).alias("ts")
    )
    err = _fails(tmp_path, df, capsys)
    assert "column 'click' (columns.label) has values outside {0, 1}: 3 of" in err and "[2, 2, 2]" in err
    # the string times are epoch seconds as text, not ISO: every one fails to parse, 'soon' among them
    assert "column 'ts' (columns.time) has values that are not times:" in err


def test_duplicates_refused_or_dropped_with_a_count(tmp_path, capsys):
    df = _events()
    dup = pl.concat([df, df[:7].with_columns(pl.lit(1, pl.Int64).alias("click"))])
    err = _fails(tmp_path, dup, capsys)
    assert "7 events repeat an earlier event's (user, item, time)" in err and "duplicates: drop" in err
    out = tmp_path / "kept"
    report = build(
        BuildConfig.load(_mapping(tmp_path, "events.parquet", duplicates="drop")), out, progress=False
    )
    assert report["counts"]["duplicates"] == 7
    assert sum(report["counts"]["rows"].values()) == df.height
    got = pl.concat(_read(out).values())
    first = df[:7].join(got, on=["uid", "iid", "ts"])
    assert (first["click_right"] == 1).all()  # of a duplicate pair, the positive is kept


def test_empty_split_and_single_event_users(tmp_path, capsys):
    df = _events()
    err = _fails(tmp_path, df, capsys, split={"min_events": 10_000})
    assert "split ['val', 'test'] would be empty" in err and "min_events" in err
    lone = pl.concat(
        [
            df,
            pl.DataFrame(
                {
                    "uid": ["solo"],
                    "iid": [1],
                    "ts": [1_600_000_000],
                    "click": [1],
                    "device": ["ios"],
                    "price": [1.0],
                    "action": [0],
                }
            ),
        ],
        how="vertical_relaxed",
    )
    lone.write_parquet(tmp_path / "events.parquet")
    report = build(BuildConfig.load(_mapping(tmp_path, "events.parquet")), tmp_path / "o2", progress=False)
    assert report["counts"]["single_event_users"] == 1


def test_existing_output_is_kept_without_overwrite(built, tmp_path):
    out, _ = built
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    with pytest.raises(BuildError, match="exists and is not empty; pass --overwrite"):
        build(BuildConfig.load(_mapping(tmp_path, str(out.parent / "events.parquet"))), out, progress=False)
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"columns": {"user": "uid", "item": "iid", "time": "ts"}},
            "columns: give exactly one of label and rating",
        ),
        (
            {"columns": {"user": "uid", "item": "iid", "time": "ts", "rating": "click"}},
            "needs rating_threshold",
        ),
        ({"split": {"by": "time"}}, "by: time needs val_start and test_start"),
        ({"features": {"priors": ["session"]}}, "priors: ['session']; expected some of"),
        ({"colums": {}}, "unknown keys ['colums']"),
    ],
)
def test_mapping_errors_name_the_setting(tmp_path, change, message):
    path = _mapping(tmp_path, "events.parquet")
    raw = yaml.safe_load(path.read_text())
    raw.update(change)
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")):
        BuildConfig.load(path)


def test_parquet_vectors_become_embedding_tokens(tmp_path):
    df = _events().with_columns(pl.concat_list(pl.col("price"), pl.col("price") * 2).alias("qvec"))
    df.write_parquet(tmp_path / "events.parquet")
    out = tmp_path / "out"
    build(
        BuildConfig.load(_mapping(tmp_path, "events.parquet", features={"embedding": ["qvec"]})),
        out,
        progress=False,
    )
    spec = FeatureSpec.load(out / "spec.yaml")
    assert [(f.name, f.dim) for f in spec.embedding] == [("qvec", 2)]
    written = pq.read_schema(next((out / "train").glob("*.parquet"))).field("qvec").type
    assert written == pa.list_(pa.field("element", pa.float32(), nullable=False), 2)
    assert cli_main(fit_args(out, tmp_path / "runs", "--trainer.max_epochs=1")).trainer.global_step > 0


def test_the_shipped_example_builds_the_shipped_ratings(tmp_path):
    """configs/data/build-example.yaml on data/ml-latest-small/ratings.csv: the MovieLens split."""
    root = Path(__file__).resolve().parents[1]
    example = BuildConfig.load(root / "configs/data/build-example.yaml")
    report = build(example, tmp_path / "ml", progress=False)
    assert report["counts"]["rows"] == {"train": 81200, "val": 9818, "test": 9818}
    assert report["counts"]["events"] == 100836 and report["counts"]["duplicates"] == 0
    spec = FeatureSpec.load(tmp_path / "ml" / "spec.yaml")
    assert [f.name for f in spec.sequence.categorical] == ["hist_rating"]
    assert spec.sequence.categorical[0].vocab_size == 10  # 0.5 .. 5 stars


def test_nulls_in_every_named_column_are_counted(tmp_path, capsys):
    """Two categorical columns, nulls in the first: each named column is checked, not the last."""
    df = _events().with_columns(
        pl.when(pl.int_range(pl.len()) < 4).then(None).otherwise(pl.col("device")).alias("device")
    )
    err = _fails(tmp_path, df, capsys, features={"categorical": ["device", "action"], "history": ["click"]})
    assert "column 'device' (features.categorical[0]) has null values: 4 of" in err


def test_events_on_the_command_line_replace_the_mappings(built, tmp_path, monkeypatch):
    """--events paths are relative to the working directory; the mapping's are replaced."""
    _, df = built
    df[: df.height // 2].write_parquet(tmp_path / "half.parquet")
    (tmp_path / "elsewhere").mkdir()
    mapping = _mapping(tmp_path / "elsewhere", "nothing.parquet")
    monkeypatch.chdir(tmp_path)
    args = ["data", "build", str(mapping), "--events", "half.parquet", "--out", str(tmp_path / "o")]
    assert recformer_main(args) == 0
    report = json.loads((tmp_path / "o" / "build.json").read_text())
    assert report["counts"]["events"] == df.height // 2


def test_a_csv_column_changing_type_is_one_line_not_a_traceback(tmp_path, capsys):
    rows = ["uid,iid,ts,click"] + [f"u{i % 7},{i},{1_600_000_000 + i},{i % 2}" for i in range(20)]
    rows.append("u1,notanumber,1600000100,1")
    (tmp_path / "e.csv").write_text("\n".join(rows) + "\n")
    raw = {"events": "e.csv", "columns": {"user": "uid", "item": "iid", "time": "ts", "label": "click"}}
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(raw))
    import recformer.datasets.build_events as b

    old, b.CSV_INFER_ROWS = b.CSV_INFER_ROWS, 10  # polars types the column from its first 10 rows
    try:
        assert recformer_main(["data", "build", str(tmp_path / "m.yaml"), "--out", str(tmp_path / "o")]) == 2
    finally:
        b.CSV_INFER_ROWS = old
    err = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("data build:")]
    assert len(err) == 1 and "reading the events or a side table failed" in err[0]  # the stage lines aside
    assert "after the first 10 rows" in err[0]
    assert not (tmp_path / "o").exists() and not (tmp_path / ".o.building").exists()


def test_a_build_says_each_stage_and_its_rows_as_it_goes(tmp_path, capsys, monkeypatch):
    """A line per stage on stderr, terminal or not (issue 30: a 1M-event build was 50 s of
    nothing), with the rows each works on, and in a log (no terminal) which bucket a long stage is
    at; the summary follows; --no-progress: the summary alone."""
    from recformer.datasets import build_progress

    monkeypatch.setattr(build_progress, "QUIET_S", 0.0)  # a bucket line each time, not every 10 s
    _events().write_parquet(tmp_path / "events.parquet")
    mapping = str(_mapping(tmp_path, "events.parquet", bucket_rows=300))
    assert recformer_main(["data", "build", mapping, "--out", str(tmp_path / "o")]) == 0
    got = capsys.readouterr()
    lines = [line for line in got.err.splitlines() if line.startswith("data build:")]
    said = [re.sub(r"^data build: +[\d.]+ s  ", "", line) for line in lines]
    stages = [line for line in said if not line.startswith(" ")]
    buckets = [
        f"    {name}: bucket {b} of 3"
        for name in ("order and split", "item priors", "rows")
        for b in (1, 2, 3)
    ]
    assert [line for line in said if line.startswith(" ")] == buckets
    report = json.loads((tmp_path / "o" / "build.json").read_text())["counts"]
    rows = report["rows"]
    assert stages == [
        "1/6 check: every value of 1 event file(s) (one streaming pass)",
        f"2/6 partition: {report['events']} events into 3 user bucket(s)",
        f"3/6 order and split: {report['events']} events, bucket by bucket",
        f"4/6 item priors: {report['events'] - report['duplicates']} events by item",
        f"5/6 rows: {sum(rows.values())} with their histories (train {rows['train']}, val {rows['val']}, "
        f"test {rows['test']})",
        f"6/6 vocabularies and dense statistics on the {rows['train']} train rows",
    ]
    seconds = [float(line.split()[2]) for line in lines]
    assert seconds == sorted(seconds) and f"events read {report['events']}" in got.out
    args = ["data", "build", mapping, "--out", str(tmp_path / "o"), "--overwrite", "--no-progress"]
    assert recformer_main(args) == 0
    quiet = capsys.readouterr()
    assert "data build:" not in quiet.err and f"events read {report['events']}" in quiet.out
