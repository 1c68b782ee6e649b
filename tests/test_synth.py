"""`recformer data synth`: streamed synthetic logs from a seeded latent model.

The latent checks rebuild the generator's own world (``SynthWorld``) from the same arguments and
ask whether the written labels and content embeddings actually follow it, so random labels or random
content vectors fail them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from recformer.__main__ import main
from recformer.config import FeatureSpec
from recformer.datasets import synth
from recformer.datasets.synth import SynthParams, SynthWorld, write_synth
from tests.conftest import required_list

SMALL = dict(
    rows=3000,
    val_rows=600,
    test_rows=400,
    users=400,
    items=2000,
    max_len=12,
    factors=8,
    content_dim=16,
    rows_per_file=1000,
    row_group_size=256,
)


def _files(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def _read(d: Path, split: str) -> pa.Table:
    return pa.concat_tables(pq.read_table(p) for p in sorted((d / split).glob("part-*.parquet")))


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("synth")
    write_synth(out, seed=3, **SMALL)
    return out


def test_same_seed_gives_identical_bytes_other_seed_differs(small: Path, tmp_path: Path) -> None:
    write_synth(tmp_path / "again", seed=3, **SMALL)
    write_synth(tmp_path / "other", seed=4, **SMALL)
    first, again, other = _files(small), _files(tmp_path / "again"), _files(tmp_path / "other")
    assert sorted(first) == sorted(again) == sorted(other)
    assert "train/part-00002.parquet" in first and "items.parquet" in first and "spec.yaml" in first
    assert first == again
    for name in ("train/part-00000.parquet", "val/part-00000.parquet", "items.parquet"):
        assert first[name] != other[name], name


def test_files_and_row_groups_follow_the_arguments(tmp_path: Path) -> None:
    # More rows than one generation chunk, so chunks straddle files and row groups.
    rows = synth.CHUNK_ROWS + 5000
    kw = dict(users=200, items=100, max_len=3, factors=4, content_dim=4, val_rows=0, test_rows=700)
    s = write_synth(tmp_path / "a", rows, rows_per_file=8000, row_group_size=3000, **kw)
    assert [p.name for p in s.files["train"]] == [f"part-{i:05d}.parquet" for i in range(3)]
    expected_files = [8000, 8000, rows - 16000]
    for path, n in zip(s.files["train"], expected_files):
        md = pq.ParquetFile(path).metadata
        groups = [md.row_group(i).num_rows for i in range(md.num_row_groups)]
        assert groups == [3000] * (n // 3000) + ([n % 3000] if n % 3000 else []), path
    assert not (tmp_path / "a" / "val").exists() and "val" not in s.rows
    assert pq.ParquetFile(s.files["test"][0]).metadata.num_rows == 700

    # The rows do not depend on how they are cut into files and row groups.
    b = write_synth(tmp_path / "b", rows, rows_per_file=10**6, row_group_size=16384, **kw)
    assert len(b.files["train"]) == 1
    assert _read(tmp_path / "a", "train").equals(_read(tmp_path / "b", "train"))

    # A rerun with fewer files removes the earlier run's extra part files.
    write_synth(tmp_path / "a", rows, rows_per_file=10**6, **kw)
    assert [p.name for p in sorted((tmp_path / "a" / "train").glob("*.parquet"))] == ["part-00000.parquet"]


def test_spec_loads_and_names_every_column_with_its_type(small: Path) -> None:
    spec = FeatureSpec.load(small / "spec.yaml")
    assert spec.group == "user_id" and spec.keys == ["user_id", "item_id", "timestamp"]
    assert spec.sequence.max_len == SMALL["max_len"] and spec.item.vocab_size == SMALL["items"]
    expected = {
        "user_id": pa.int64(),
        "item_id": pa.int32(),
        "timestamp": pa.int64(),
        "label": pa.int8(),
        "hour": pa.int8(),
        "device": pa.int8(),
        "user_segment": pa.int8(),
        "user_activity": pa.float32(),
        "item_age": pa.float32(),
        "hist_item_ids": required_list(pa.int32()),
        "hist_actions": required_list(pa.int8()),
        "hist_gaps": required_list(pa.float32()),
    }
    assert sorted(spec.columns()) == sorted(expected)
    train = _read(small, "train")
    for split in ("train", "val", "test"):
        for path in sorted((small / split).glob("*.parquet")):
            schema = pq.read_schema(path)
            for col, typ in expected.items():
                field = schema.field(col)
                assert field.type == typ and not field.nullable, (path, col)
    for f in spec.categorical:  # every categorical id is within its vocabulary, and all are used
        values = train.column(f.name).to_numpy()
        assert values.min() >= 0 and values.max() < f.vocab_size, f.name
        assert len(np.unique(values)) > 1, f.name

    # Dense statistics: of log1p(value) over the train rows.
    for f in spec.dense:
        x = np.log1p(train.column(f.name).to_numpy().astype(np.float64))
        assert (
            f.log1p
            and f.mean == pytest.approx(x.mean(), rel=1e-6)
            and f.std == pytest.approx(x.std(), rel=1e-6)
        )

    items = pq.read_table(spec.side_table_path())
    assert items.column("item_id").to_numpy().tolist() == list(range(SMALL["items"]))
    emb_type = items.schema.field(spec.item.content_column).type
    assert pa.types.is_fixed_size_list(emb_type) and emb_type.value_type == pa.float16()
    assert emb_type.list_size == spec.item.content_dim == SMALL["content_dim"]
    (cluster,) = spec.item.features
    assert items.schema.field(cluster.name).type == pa.int16()
    clusters = items.column(cluster.name).to_numpy()
    assert clusters.min() == 0 and clusters.max() == cluster.vocab_size - 1


def test_history_lists_are_aligned_ordered_and_bounded(small: Path) -> None:
    spans = {}
    for split in ("train", "val", "test"):
        t = _read(small, split)
        lengths = [
            pc.list_value_length(t.column(c)).to_numpy()
            for c in ("hist_item_ids", "hist_actions", "hist_gaps")
        ]
        assert (lengths[0] == lengths[1]).all() and (lengths[0] == lengths[2]).all()
        assert lengths[0].max() == SMALL["max_len"] and lengths[0].min() == 0  # varies from empty to full
        assert len(np.unique(lengths[0])) > SMALL["max_len"] // 2
        items = pc.list_flatten(t.column("hist_item_ids")).to_numpy()
        actions = pc.list_flatten(t.column("hist_actions")).to_numpy()
        assert items.min() >= 0 and items.max() < SMALL["items"]
        assert set(np.unique(actions)) == {0, 1, 2}
        # Gaps in seconds before the impression, most recent event last: non-increasing in a row.
        gaps = t.column("hist_gaps").combine_chunks()
        g, off = gaps.values.to_numpy(), gaps.offsets.to_numpy()
        assert (g >= 0).all()
        step = np.diff(g)
        inside = np.ones(len(step), dtype=bool)
        inside[off[1:-1][off[1:-1] > 0] - 1] = False  # differences across two rows do not count
        assert (step[inside] <= 0).all()
        ts = t.column("timestamp").to_numpy()
        assert (np.diff(ts) >= 0).all()
        spans[split] = (ts.min(), ts.max())
    assert spans["train"][1] <= spans["val"][0] and spans["val"][1] <= spans["test"][0]


def test_positive_rate_is_calibrated(small: Path) -> None:
    for split in ("train", "val", "test"):
        rate = _read(small, split).column("label").to_numpy().mean()
        assert 0.3 <= rate <= 0.5, (split, rate)


def test_labels_and_content_follow_the_latent_model(small: Path) -> None:
    world = SynthWorld(SynthParams(seed=3, **SMALL))
    t = _read(small, "train")
    label = t.column("label").to_numpy()
    affinity = world.affinity(t.column("user_id").to_numpy(), t.column("item_id").to_numpy())
    order = np.argsort(affinity)
    decile = len(order) // 10
    low, high = label[order[:decile]].mean(), label[order[-decile:]].mean()
    assert high - low > 0.3, (low, high)

    # Histories reveal taste: events from the user's favourite cluster are over-represented.
    users = np.repeat(
        t.column("user_id").to_numpy(), pc.list_value_length(t.column("hist_item_ids")).to_numpy()
    )
    hist_clusters = world.cluster[pc.list_flatten(t.column("hist_item_ids")).to_numpy()]
    assert world.n_clusters >= 8
    favourite = (world.top_clusters[users, 0] == hist_clusters).mean()
    assert favourite > 2 / world.n_clusters, favourite

    # Content embeddings carry the item factors: a least-squares readout recovers most of v.
    items = pq.read_table(small / "items.parquet")
    content = np.stack(items.column("content_emb").to_numpy(zero_copy_only=False)).astype(np.float64)
    x = np.hstack([content, np.ones((len(content), 1))])
    coef, *_ = np.linalg.lstsq(x, world.v, rcond=None)
    r2 = 1 - ((x @ coef - world.v) ** 2).sum() / ((world.v - world.v.mean(0)) ** 2).sum()
    assert r2 > 0.6, r2


def test_peak_memory_does_not_grow_with_rows(tmp_path: Path) -> None:
    # 4 and 16 generation chunks (memory settles after the first few: the writer thread, allocator
    # pools); holding the dataset would add ~70 MB of history lists.
    code = (
        "import json, resource, sys\n"
        "from recformer.datasets.synth import write_synth\n"
        "write_synth(sys.argv[1], int(sys.argv[2]), users=1000, items=1000, max_len=60, val_rows=0, "
        "test_rows=0)\n"
        "print(json.dumps([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, 'torch' in sys.modules]))\n"
    )
    peak = []
    for chunks in (4, 16):
        run = subprocess.run(
            [sys.executable, "-c", code, str(tmp_path / str(chunks)), str(chunks * synth.CHUNK_ROWS)],
            capture_output=True,
            text=True,
            check=True,
        )
        max_rss, torch_loaded = json.loads(run.stdout.strip().splitlines()[-1])
        assert not torch_loaded  # `recformer data synth` must not pay for the torch import
        peak.append(max_rss / 1024)  # KiB -> MiB on Linux
    assert peak[1] - peak[0] < 25, peak


def test_compression_changes_the_codec_not_the_rows(small: Path, tmp_path: Path) -> None:
    write_synth(tmp_path / "lz4", seed=3, compression="lz4", **SMALL)
    for split in ("train", "val", "test"):
        assert _read(tmp_path / "lz4", split).equals(_read(small, split)), split
        for path in sorted((tmp_path / "lz4" / split).glob("part-*.parquet")):
            md = pq.ParquetFile(path).metadata
            codecs = {
                md.row_group(g).column(c).compression
                for g in range(md.num_row_groups)
                for c in range(md.num_columns)
            }
            assert codecs <= {"LZ4", "LZ4_RAW"}, (path, codecs)
    assert (tmp_path / "lz4" / "spec.yaml").read_bytes() == (small / "spec.yaml").read_bytes()


@pytest.mark.parametrize(
    "override, flag",
    [
        (dict(rows=0), "--rows"),
        (dict(max_len=0), "--max-len"),
        (dict(order=5), "--order"),
        (dict(noise=-1.0), "--noise"),
        (dict(items=1), "--items"),
        (dict(val_rows=-1), "--val-rows"),
        (dict(row_group_size=0), "--row-group-size"),
        (dict(compression="gzip"), "--compression"),
    ],
)
def test_bad_arguments_name_the_flag(override: dict, flag: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=flag):
        write_synth(tmp_path, **{**SMALL, **override})


def test_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["data", "synth", "--out", str(tmp_path / "d"), "--rows", "500", "--users", "50", "--items", "40"]
    args += ["--max-len", "5", "--factors", "4", "--order", "4", "--content-dim", "8", "--seed", "7"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "train  rows        500" in out and "rows/s" in out and "bytes/row" in out
    assert FeatureSpec.load(tmp_path / "d" / "spec.yaml").item.content_dim == 8
    assert pq.read_metadata(tmp_path / "d" / "val" / "part-00000.parquet").num_rows == 50

    assert main(["data", "synth", "--out", str(tmp_path / "e"), "--rows", "10", "--order", "0"]) == 2
    assert "--order=0" in capsys.readouterr().err


def test_stale_part_files_go_and_foreign_parquet_is_refused_untouched(tmp_path: Path) -> None:
    out = tmp_path / "d"
    kw = dict(rows=500, val_rows=50, test_rows=50, users=50, items=40, max_len=5, factors=4, content_dim=8)
    write_synth(out, seed=1, **kw)
    # A previous run's own part file is removed (a bigger run wrote more files) ...
    (out / "train" / "part-00007.parquet").write_bytes((out / "train" / "part-00000.parquet").read_bytes())
    (out / "train" / "notes.txt").write_text("not read by the loader, kept")
    s = write_synth(out, seed=2, **kw)
    assert sorted(p.name for p in (out / "train").iterdir()) == ["notes.txt", "part-00000.parquet"]
    assert s.files["train"] == [out / "train" / "part-00000.parquet"]
    # ... but Parquet files synth did not write, which the loader would read, stop it before any write.
    # A test.parquet is read only for a split without files: here the run writes no test rows.
    foreign = [out / "train" / "date=1" / "old.parquet", out / "val" / "extra.parquet", out / "test.parquet"]
    for f in foreign:
        f.parent.mkdir(exist_ok=True)
        f.write_bytes((out / "test" / "part-00000.parquet").read_bytes())
    before = _files(out)
    with pytest.raises(ValueError, match="remove them or use an empty --out") as e:
        write_synth(out, seed=3, **{**kw, "test_rows": 0})
    assert all(str(f) in str(e.value) for f in foreign)
    assert "part-00000" not in str(e.value) and "notes.txt" not in str(e.value)
    assert _files(out) == before  # nothing written, nothing deleted
    # With test rows written, test.parquet is never read: no reason to stop for it.
    for f in foreign[:2]:
        f.unlink()
    write_synth(out, seed=3, **kw)
    assert (out / "test.parquet").is_file()
