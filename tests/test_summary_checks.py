"""`recformer data summary` checks a dataset as the loader does: the same schema errors, exit 2,
naming the file and column; an empty split folder is listed, not dropped."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recformer.__main__ import main
from recformer.batch import DataError
from recformer.data.datamodule import RecDataModule
from recformer.datasets.summary import summarize
from tests.conftest import write_tiny_data


@pytest.fixture
def data(tmp_path) -> Path:
    return write_tiny_data(tmp_path / "d", train_files=(100, 60), val_rows=40, test_rows=30, row_group=32)


def rewrite(path: Path, edit) -> None:
    pq.write_table(edit(pq.read_table(path)), path, row_group_size=32)


def summary_error(data: Path, capsys) -> str:
    assert main(["data", "summary", str(data)]) == 2
    out, err = capsys.readouterr()
    assert out == ""  # no table of a dataset the loader refuses
    return err


def loader_error(data: Path) -> str:
    with pytest.raises(DataError) as e:
        RecDataModule(str(data), batch_size=16, num_workers=0).setup()
    return str(e.value)


@pytest.mark.parametrize("labels", [("0", "1"), ("no", "yes")])
def test_string_label_is_refused_as_the_loader_refuses_it(data, capsys, labels):
    p = data / "val" / "part-00000.parquet"

    def as_strings(t: pa.Table) -> pa.Table:
        strings = pa.array([labels[int(y)] for y in t["label"].to_pylist()])
        return t.set_column(t.schema.get_field_index("label"), "label", strings)

    rewrite(p, as_strings)
    err = summary_error(data, capsys)
    assert f"{p}: column 'label' has type string, expected int, bool or float in [0, 1]" in err
    assert loader_error(data) in err  # the loader's own sentence, not a second check's


def test_missing_column_names_every_file_its_columns_and_exits_2(data, capsys):
    bad = [data / "train" / "part-00001.parquet", data / "val" / "part-00000.parquet"]
    for p in bad:
        rewrite(p, lambda t: t.drop_columns(["age"]))
    err = summary_error(data, capsys)
    for p in bad:
        assert f"{p}: column(s) ['age'] named by the feature spec" in err
    assert "are missing; the file has [" in err and "'hour'" in err
    assert str(data / "train" / "part-00000.parquet") not in err  # a good file is not named
    assert loader_error(data) in err


def test_empty_split_folder_is_listed_not_dropped(data, capsys):
    for p in (data / "val").glob("*.parquet"):
        p.unlink()
    _, splits = summarize(data)
    assert [(s.name, s.files) for s in splits] == [("train", 2), ("val", 0), ("test", 1)]
    assert main(["data", "summary", str(data)]) == 0
    lines = capsys.readouterr().out.splitlines()
    val = [line for line in lines if line.startswith("val")]
    assert val == [f"val    empty: no Parquet files under {data / 'val'} (the loader finds no val split)"]
    assert any(line.startswith("test   files 1") for line in lines)
