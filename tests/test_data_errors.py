"""Every bad input is reported before the first batch, naming the file, column (and row group)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import torch
import yaml

from recformer.__main__ import main
from recformer.batch import DataError
from recformer.config import FeatureSpec
from recformer.data.datamodule import RecDataModule
from recformer.data.schema import required
from tests.conftest import log_table, write_tiny_data


@pytest.fixture
def data(tmp_path) -> Path:
    return write_tiny_data(tmp_path / "d", train_files=(100, 60), val_rows=40, test_rows=30, row_group=32)


def replace_file(path: Path, table: pa.Table) -> None:
    pq.write_table(table, path, row_group_size=32)


def set_col(table: pa.Table, name: str, arr) -> pa.Table:
    return table.set_column(table.schema.get_field_index(name), name, arr)


def setup_error(data: Path, match: str) -> str:
    dm = RecDataModule(str(data), batch_size=16, num_workers=0)
    with pytest.raises(DataError, match=match) as e:
        dm.setup("fit")
    return str(e.value)


def target(data: Path) -> tuple[Path, pa.Table]:
    p = data / "train" / "part-00001.parquet"
    return p, pq.read_table(p)


def test_missing_column_names_file_and_column(data):
    p, t = target(data)
    replace_file(p, t.drop_columns(["age"]))
    msg = setup_error(data, "age")
    assert str(p) in msg and "missing" in msg


def test_wrong_type(data):
    p, t = target(data)
    replace_file(p, set_col(t, "hour", pa.array([str(x) for x in t["hour"].to_pylist()])))
    msg = setup_error(data, "'hour'")
    assert str(p) in msg and "expected integer" in msg


def test_a_key_column_string_in_one_file_only_is_refused_naming_both(data):
    # A string key travels as its row's position, an integer one as itself: one kind per split.
    p, t = target(data)
    replace_file(p, set_col(t, "user_id", pa.array([f"u{x}" for x in t["user_id"].to_pylist()])))
    msg = setup_error(data, "key column 'user_id' is")
    assert str(p) in msg and "string" in msg and "one kind" in msg


def test_null_label(data):
    p, t = target(data)
    y = t["label"].to_pylist()
    y[40] = None
    replace_file(p, set_col(t, "label", pa.array(y, pa.int8())))
    msg = setup_error(data, "null")
    assert str(p) in msg and "'label'" in msg and "row group 1" in msg


def test_label_outside_unit_interval(data):
    p, t = target(data)
    replace_file(p, set_col(t, "label", pa.array(np.where(np.arange(t.num_rows) == 3, 2, 0).astype(np.int8))))
    msg = setup_error(data, r"outside \[0, 1\]")
    assert str(p) in msg and "'label'" in msg


def test_negative_ids(data):
    p, t = target(data)
    ids = t["item_id"].to_numpy().copy()
    ids[5] = -3
    replace_file(p, set_col(t, "item_id", pa.array(ids)))
    msg = setup_error(data, "negative")
    assert str(p) in msg and "'item_id'" in msg


def set_history_event(data, column: str, value_type, value, newest: bool = False) -> tuple:
    """Set the oldest (or newest) event of the first (or last) non-empty history row of
    ``column`` in the target file to ``value``; returns the file and that row."""
    p, t = target(data)
    rows = t[column].to_pylist()
    nonempty = [i for i, x in enumerate(rows) if x]
    row = nonempty[-1] if newest else nonempty[0]
    rows[row][-1 if newest else 0] = value
    replace_file(p, set_col(t, column, pa.array(rows, pa.list_(value_type))))
    return p, row


def test_negative_ids_inside_history(data):
    p, _ = set_history_event(data, "hist_items", pa.int32(), -1)
    assert str(p) in setup_error(data, "'hist_items'.*negative")


def test_negative_event_categorical_inside_history(data):
    p, _ = set_history_event(data, "hist_actions", pa.int8(), -2, newest=True)
    assert str(p) in setup_error(data, "'hist_actions'.*negative")


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_time_gap(data, bad):
    # The oldest event: checked even when a batch would not keep it.
    p, row = set_history_event(data, "hist_gaps", pa.float32(), bad)
    msg = setup_error(data, "'hist_gaps' has NaN or Inf")
    assert str(p) in msg and f"first at batch row {row}" in msg


def test_nan_in_dense(data):
    p, t = target(data)
    x = t["age"].to_numpy().copy()
    x[7] = np.nan
    replace_file(p, set_col(t, "age", pa.array(x)))
    msg = setup_error(data, "NaN or Inf")
    assert str(p) in msg and "'age'" in msg


def test_inf_in_embedding(data):
    p, t = target(data)
    v = t["query_vec"].to_pylist()
    v[2][1] = float("inf")
    replace_file(p, set_col(t, "query_vec", pa.array(v, pa.list_(pa.float32(), 4))))
    msg = setup_error(data, "NaN or Inf")
    assert str(p) in msg and "'query_vec'" in msg


def test_null_inside_an_embedding_is_called_null(data):
    p, t = target(data)
    v = t["query_vec"].to_pylist()
    v[2][1] = None
    replace_file(p, set_col(t, "query_vec", pa.array(v, pa.list_(pa.float32(), 4))))
    msg = setup_error(data, r"'query_vec' holds 1 null element\(s\)")
    assert str(p) in msg and "row group 0" in msg


@pytest.mark.parametrize("column", ["age", "weight"])
def test_finite_float64_beyond_float32_is_refused(data, column):
    # Finite in the file, Inf once cast to the batch's float32: refused, not passed on as Inf.
    p, t = target(data)
    x = t[column].to_numpy().astype(np.float64)
    x[5] = 1e39
    replace_file(p, set_col(t, column, pa.array(x)))
    msg = setup_error(data, f"'{column}'.*beyond float32's range")
    assert str(p) in msg and "first at batch row 5: 1e+39" in msg


def test_float64_embedding_beyond_float32_is_refused(data):
    p, t = target(data)
    v = t["query_vec"].to_pylist()
    v[3][2] = 1e39
    replace_file(p, set_col(t, "query_vec", pa.array(v, pa.list_(pa.float64(), 4))))
    msg = setup_error(data, "'query_vec' has values beyond float32's range")
    assert str(p) in msg and "batch row 3" in msg


def test_embedding_of_wrong_length(data):
    p, t = target(data)
    v = t["query_vec"].to_pylist()
    v[4] = v[4][:3]
    replace_file(p, set_col(t, "query_vec", pa.array(v, pa.list_(pa.float32()))))
    msg = setup_error(data, "dim=4")
    assert str(p) in msg and "'query_vec'" in msg


def test_misaligned_list_columns(data):
    p, t = target(data)
    a = t["hist_actions"].to_pylist()
    a[10] = a[10] + [1]
    replace_file(p, set_col(t, "hist_actions", pa.array(a, pa.list_(pa.int8()))))
    msg = setup_error(data, "differ in length")
    assert str(p) in msg and "'hist_items'" in msg and "'hist_actions'" in msg


def test_negative_time_gap(data):
    p, _ = set_history_event(data, "hist_gaps", pa.float32(), -5.0)
    assert str(p) in setup_error(data, "'hist_gaps'.*negative")


def test_truncated_file(data):
    p, _ = target(data)
    raw = p.read_bytes()
    p.write_bytes(raw[: len(raw) // 2])
    msg = setup_error(data, "not a readable Parquet file")
    assert str(p) in msg


def test_corrupt_page_is_reported_with_row_group(data):
    # A footer that parses but a column chunk that does not: found by the full value check.
    p, t = target(data)
    raw = bytearray(p.read_bytes())
    meta = pq.ParquetFile(p).metadata
    chunk = meta.row_group(1).column(t.schema.get_field_index("age"))
    start = chunk.data_page_offset
    raw[start : start + 40] = bytes(40)
    p.write_bytes(bytes(raw))
    msg = setup_error(data, "row group 1")
    assert str(p) in msg


def test_empty_dataset(data):
    for f in (data / "val").glob("*.parquet"):
        replace_file(f, pq.read_table(f).slice(0, 0))
    assert "no rows" in setup_error(data, "val split")


def test_no_files(data):
    shutil.rmtree(data / "train")
    msg = setup_error(data, "no Parquet files")
    assert str(data / "train") in msg


def test_missing_validation_split_only_disables_validation(data):
    shutil.rmtree(data / "val")
    dm = RecDataModule(str(data), batch_size=16, num_workers=0)
    dm.setup("fit")
    assert "val" not in dm.splits and dm.val_dataloader() == []
    with pytest.raises(DataError, match="no Parquet files"):
        dm.setup("validate")


def test_spec_names_a_column_the_data_lacks(data):
    spec = FeatureSpec.load(data / "spec.yaml")
    spec.dense[1].name = "not_there"
    spec.save(data / "spec.yaml")
    assert "not_there" in setup_error(data, "missing")


def test_unknown_spec_key_is_named(data):
    text = (data / "spec.yaml").read_text().replace("label: label", "label: label\nlabels: oops")
    (data / "spec.yaml").write_text(text)
    with pytest.raises(ValueError, match="labels"):
        RecDataModule(str(data))


def test_a_column_listed_unused_and_given_a_role_is_refused(data):
    text = (data / "spec.yaml").read_text().replace("unused: {}", "unused:\n  age: also a dense feature")
    (data / "spec.yaml").write_text(text)
    with pytest.raises(ValueError, match=r"unused and also gives them a role: \['age'\]"):
        RecDataModule(str(data))


def test_side_table_id_outside_vocab(data):
    t = pq.read_table(data / "items.parquet")
    pq.write_table(set_col(t, "item_id", pc.add(t["item_id"], 10)), data / "items.parquet")
    with pytest.raises(DataError, match="items.parquet.*vocab_size"):
        RecDataModule(str(data)).item_tables()


def test_side_table_content_beyond_float16_is_refused(data):
    # The content table is float16: 1e5 would become Inf in every batch holding that item.
    spec = FeatureSpec.load(data / "spec.yaml")
    col = spec.item.content_column
    t = pq.read_table(data / "items.parquet")
    v = t[col].to_pylist()
    v[3][0] = 1e5
    pq.write_table(set_col(t, col, pa.array(v, pa.list_(pa.float32()))), data / "items.parquet")
    with pytest.raises(DataError, match=f"items.parquet.*'{col}' has values beyond float16's range"):
        RecDataModule(str(data)).item_tables()


def test_unknown_ids_go_to_oov_and_are_counted(data):
    p, t = target(data)
    ids = t["item_id"].to_numpy().copy()
    ids[:5] = 10_000  # beyond vocab_size
    dev = t["device"].to_pylist()
    dev[:3] = ["fridge"] * 3
    t = set_col(set_col(t, "item_id", pa.array(ids)), "device", pa.array(dev))
    replace_file(p, t)
    dm = RecDataModule(str(data), batch_size=512, num_workers=0, shuffle=False)
    dm.setup("fit")
    assert dm.oov_report["train"]["item_id"] == 5
    assert dm.oov_report["train"]["device"] == 3
    batches = list(dm.train_dataloader())
    total_rows = sum(len(b) for b in batches)
    assert total_rows == 160  # nothing dropped
    oov = sum(b.oov for b in batches)
    assert oov[dm.oov_fields.index("item_id")] == 5 and oov[dm.oov_fields.index("device")] == 3
    rows = [b for b in batches][0]
    unknown = rows.keys[:, 0] >= 100  # rows of part-00001 start at row_id 100
    assert (rows.target_item[unknown][:5] == 0).all()


def test_footer_mode_still_checks_values_when_reading(data):
    p, t = target(data)
    replace_file(p, set_col(t, "label", pa.array(np.full(t.num_rows, 3, np.int8))))
    dm = RecDataModule(str(data), batch_size=16, num_workers=0, validate="footer")
    dm.setup("fit")  # schemas are fine
    with pytest.raises(DataError, match=r"outside \[0, 1\]"):
        list(dm.train_dataloader())


def test_log_table_fixture_is_valid():
    # Guards the fixture the error tests mutate: a clean table decodes.
    t = log_table(10, 0, seed=1)
    assert t.num_rows == 10 and "hist_items" in t.column_names


def test_required_schema_reads_like_the_nullable_one(data):
    """``schema.required`` (what the log writers declare) changes how a file is stored, not what
    it holds: the same rows written with every column and list element declared non-null give the
    same batches; the element names, list kinds and sizes and the schema metadata are kept."""
    p, t = target(data)
    dm = RecDataModule(str(data), batch_size=16, num_workers=0, shuffle=False)
    dm.setup("fit")
    want = list(dm.train_dataloader())
    strict = required(t.schema.with_metadata({"origin": "test"}))
    assert not any(f.nullable for f in strict)
    assert strict.metadata == {b"origin": b"test"}
    assert strict.field("query_vec").type == pa.list_(pa.field("item", pa.float32(), nullable=False), 4)
    assert not strict.field("hist_items").type.value_field.nullable
    replace_file(p, t.cast(strict))
    assert not pq.read_schema(p).field("hist_items").nullable
    dm = RecDataModule(str(data), batch_size=16, num_workers=0, shuffle=False)
    dm.setup("fit")
    got = list(dm.train_dataloader())
    assert len(got) == len(want)
    for a, b in zip(got, want):
        for name in a.__dataclass_fields__:
            x, y = getattr(a, name), getattr(b, name)
            assert torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y, name
    nested = pa.schema([("v", pa.large_list(pa.list_(pa.int8())))])
    inner = required(nested).field("v").type
    assert pa.types.is_large_list(inner) and not inner.value_field.nullable
    assert not inner.value_type.value_field.nullable


def test_required_schema_refuses_a_table_with_nulls(tmp_path):
    # What the writers rely on: a null they did not mean to write stops the write (a top-level one
    # at the cast, naming the column; one inside a list at the write) instead of landing in a column
    # that says it has none.
    t = pa.table({"label": pa.array([1, None], pa.int8())})
    with pytest.raises(ValueError, match="label"):
        t.cast(required(t.schema))
    t = pa.table({"hist": pa.array([[1], [2, None]], pa.list_(pa.int32()))})
    with pytest.raises(pa.ArrowInvalid, match="non-nullable but contains nulls"):
        pq.write_table(t.cast(required(t.schema)), tmp_path / "x.parquet")


def with_uint64_row_ids(data: Path, files) -> None:
    for p in files:
        t = pq.read_table(p)
        ids = np.asarray(t["row_id"], dtype=np.uint64) + np.uint64(2**63)
        replace_file(p, set_col(t, "row_id", pa.array(ids, pa.uint64())))


def test_uint64_keys_keep_their_bits_past_2_63(data):
    """64-bit hashed ids stored as uint64: the keys cross as the same bits, not wrapped values."""
    with_uint64_row_ids(data, sorted(data.rglob("*/part-*.parquet")))
    dm = RecDataModule(str(data), batch_size=16, num_workers=0)
    dm.setup("test")
    assert dm.unsigned_keys["test"] == {"row_id"}
    got = np.concatenate([b.keys[:, 0].numpy() for b in dm.test_dataloader()]).view(np.uint64)
    want = np.asarray(pq.read_table(data / "test")["row_id"], dtype=np.uint64)
    assert got.tolist() == want.tolist() and int(want.min()) >= 2**63


def test_uint64_key_in_one_file_only_is_refused_naming_both(data):
    p, _ = target(data)
    with_uint64_row_ids(data, [p])
    msg = setup_error(data, r"key column 'row_id' is (uint64|signed) in .* but (signed|uint64) in")
    assert str(p) in msg and "part-0000" in msg.replace(str(p), "") and "train files" in msg


def summary_error(data: Path, capsys) -> str:
    assert main(["data", "summary", str(data)]) == 2
    return capsys.readouterr().err


def test_summary_names_a_truncated_file(data, capsys):
    p, _ = target(data)
    p.write_bytes(p.read_bytes()[:3000])
    err = summary_error(data, capsys)
    assert str(p) in err and "truncated or corrupt" in err


@pytest.mark.parametrize(("value", "match"), [(None, "null"), (7, r"outside \[0, 1\]")])
def test_summary_refuses_bad_labels_naming_the_row_group(data, capsys, value, match):
    p, t = target(data)
    labels = t["label"].to_pylist()
    labels[40] = value  # the second row group of 32
    replace_file(p, set_col(t, "label", pa.array(labels, t.schema.field("label").type)))
    err = summary_error(data, capsys)
    assert f"{p} (row group 1)" in err and "'label'" in err
    assert re.search(match, err)


@pytest.mark.parametrize("setting", ["batch_size", "eval_batch_size"])
def test_a_batch_size_of_zero_is_refused_naming_the_setting(data, setting):
    with pytest.raises(ValueError, match=rf"data\.{setting}=0; expected a positive number"):
        RecDataModule(str(data), **{setting: 0})


def test_a_misspelled_spec_key_is_named_with_the_known_ones(data):
    spec = data / "spec.yaml"
    spec.write_text(spec.read_text().replace("categorical:", "categoricl:", 1))
    with pytest.raises(
        ValueError, match=r"spec.yaml: unknown keys \['categoricl'\]; known keys are \[.*'categorical'"
    ):
        FeatureSpec.load(spec)
    spec.write_text(
        spec.read_text()
        .replace("categoricl:", "categorical:", 1)
        .replace("  vocab_size: 24", "  vocab_sise: 24")
    )
    with pytest.raises(ValueError, match=r"CategoricalField: unknown keys \['vocab_sise'\]"):
        FeatureSpec.load(spec)


def _string_side_feature(data: Path, values) -> Path:
    """The side table's ``cluster`` feature as strings of a vocabulary (as a user writes a year
    or a genre), with the spec saying so."""
    raw = yaml.safe_load((data / "spec.yaml").read_text())
    raw["item"]["features"] = [{"name": "cluster", "vocab": ["c0", "c1", "c2", "c3", "c4"]}]
    (data / "spec.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    t = pq.read_table(data / "items.parquet")
    pq.write_table(set_col(t, "cluster", values(t["cluster"].to_numpy())), data / "items.parquet")
    return data


def test_a_string_vocabulary_on_a_side_table_feature_reads_like_the_others(data, capsys):
    _string_side_feature(data, lambda c: pa.array([f"c{v}" if v != 4 else "new" for v in c]))
    _, feats = RecDataModule(str(data)).item_tables()
    cluster = np.arange(50) % 5
    expected = np.where(cluster == 4, 0, cluster + 1)  # "new" is not in the vocabulary: OOV row 0
    assert feats[1:, 0].tolist() == expected.tolist()  # row i + 1 holds item i
    assert main(["data", "summary", str(data)]) == 0
    assert "side table" in capsys.readouterr().out


def test_a_side_table_feature_of_the_wrong_type_is_refused_by_loader_and_summary(data, capsys):
    _string_side_feature(data, lambda c: pa.array(c.astype(np.int16)))  # ints where strings are due
    with pytest.raises(DataError, match=r"items.parquet: column 'cluster' has type int16, expected string"):
        RecDataModule(str(data)).item_tables()
    assert main(["data", "summary", str(data)]) == 2
    assert "items.parquet: column 'cluster' has type int16, expected string" in capsys.readouterr().err
