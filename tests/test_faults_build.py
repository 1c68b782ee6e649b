"""Fault injection for ``recformer data build`` (``make faults``): an ``--out`` that overlaps the
inputs or holds a user's files, one that cannot be written, and values that parse but cannot be
right. Each is refused in one line, before anything is written, and the user's files stay whole."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from recformer.__main__ import main as recformer_main
from tests.test_build import _events, _mapping
from tests.test_faults import read_only

pytestmark = pytest.mark.faults
__all__ = ["read_only"]  # a fixture: a read-only tmpfs

MARKER = ".recformer-build"
"""The file a build leaves in its folder, listing what it wrote (``recformer.datasets.outdir``)."""


def _contents(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def _build(mapping: Path, out: Path, capsys, *extra: str) -> tuple[int, str]:
    rc = recformer_main(["data", "build", str(mapping), "--out", str(out), "--no-progress", *extra])
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return rc, err


def _one_line(err: str) -> str:
    (line,) = [x for x in err.splitlines() if x.startswith("recformer data build: error:")]
    return line


# -- an --out that overlaps what the build reads ---------------------------------------------------


@pytest.mark.parametrize(
    ("events", "out", "said"),
    [
        ("proj/raw/ev.csv", "proj", "holds the input"),  # the events under --out (issue 28's case)
        ("proj/ev.csv", "proj", "holds the input"),  # the events directly in --out
        ("proj/raw", "proj/raw/built", "lies inside the input"),  # --out inside the events folder
        ("proj/raw/ev.csv", "proj/raw/ev.csv", "is a file"),  # --out the events file itself
    ],
)
def test_overwrite_never_removes_the_inputs(tmp_path, capsys, events, out, said):
    (tmp_path / "proj" / "raw").mkdir(parents=True)
    csv = tmp_path / ("proj/raw/ev.csv" if "raw" in events else "proj/ev.csv")
    _events().write_csv(csv)
    before = _contents(tmp_path / "proj")
    mapping = _mapping(tmp_path, str(tmp_path / events))
    rc, err = _build(mapping, tmp_path / out, capsys, "--overwrite")
    assert rc == 2 and said in _one_line(err), err
    assert _contents(tmp_path / "proj") == before  # every input byte still there


def test_an_out_holding_the_mapping_or_a_side_table_is_refused(tmp_path, capsys):
    _events().write_parquet(tmp_path / "events.parquet")
    (tmp_path / "side").mkdir()
    side = pl.DataFrame({"iid": list(range(40)), "category": [i % 3 for i in range(40)]})
    side.write_parquet(tmp_path / "side" / "items.parquet")
    items = {"path": str(tmp_path / "side" / "items.parquet"), "id": "iid", "categorical": ["category"]}
    mapping = _mapping(tmp_path, str(tmp_path / "events.parquet"), items=items)
    rc, err = _build(mapping, tmp_path / "side", capsys, "--overwrite")
    assert rc == 2 and f"holds the input {tmp_path / 'side' / 'items.parquet'}" in _one_line(err)
    rc, err = _build(mapping, tmp_path, capsys, "--overwrite")  # the folder of the mapping and events
    assert rc == 2 and "holds the input" in _one_line(err)
    assert (tmp_path / "side" / "items.parquet").is_file() and mapping.is_file()


# -- --overwrite replaces only what a build wrote ---------------------------------------------------


def test_overwrite_refuses_a_folder_a_build_did_not_write(tmp_path, capsys):
    _events().write_parquet(tmp_path / "events.parquet")
    out = tmp_path / "mine"
    (out / "notes").mkdir(parents=True)
    (out / "notes" / "todo.txt").write_text("a user's file")
    rc, err = _build(_mapping(tmp_path, str(tmp_path / "events.parquet")), out, capsys, "--overwrite")
    line = _one_line(err)
    assert rc == 2 and "holds 1 file(s) no earlier build wrote (notes/todo.txt)" in line, line
    assert (out / "notes" / "todo.txt").read_text() == "a user's file"


def test_overwrite_replaces_a_build_but_not_a_file_added_to_it(tmp_path, capsys):
    _events().write_parquet(tmp_path / "events.parquet")
    mapping, out = _mapping(tmp_path, str(tmp_path / "events.parquet")), tmp_path / "built"
    assert _build(mapping, out, capsys)[0] == 0
    assert (out / MARKER).is_file() and (out / "spec.yaml").is_file()
    assert _build(mapping, out, capsys, "--overwrite")[0] == 0  # its own build: replaced
    assert not list(tmp_path.glob(".built.*"))  # no staging or replaced folder left beside it
    (out / "train" / "extra.parquet").write_bytes(b"a user's own file")
    rc, err = _build(mapping, out, capsys, "--overwrite")
    assert rc == 2 and "(train/extra.parquet)" in _one_line(err)
    assert (out / "train" / "extra.parquet").read_bytes() == b"a user's own file"


# -- an --out that cannot be written ----------------------------------------------------------------


def test_out_under_an_unwritable_parent_is_one_line(tmp_path, read_only, capsys):
    _events().write_parquet(tmp_path / "events.parquet")
    rc, err = _build(_mapping(tmp_path, str(tmp_path / "events.parquet")), read_only / "a" / "b", capsys)
    assert rc == 2
    said = f"--out {read_only / 'a' / 'b'}: cannot write in {read_only} (Read-only file system)"
    assert _one_line(err).endswith(said)


def test_out_that_is_a_file_or_under_one_is_one_line(tmp_path, capsys):
    _events().write_parquet(tmp_path / "events.parquet")
    mapping = _mapping(tmp_path, str(tmp_path / "events.parquet"))
    (tmp_path / "f.txt").write_text("keep")
    rc, err = _build(mapping, tmp_path / "f.txt", capsys, "--overwrite")
    assert rc == 2 and "is a file; expected a folder" in _one_line(err)
    rc, err = _build(mapping, tmp_path / "f.txt" / "sub", capsys)
    assert rc == 2 and f"{tmp_path / 'f.txt'} is a file, so no folder can be made under it" in _one_line(err)
    assert (tmp_path / "f.txt").read_text() == "keep"


# -- values that parse but cannot be right ----------------------------------------------------------


def _with(rows: dict[int, dict[str, object]], **columns: object) -> pl.DataFrame:
    """``_events()`` with a weight column and the given cells (row -> column -> value) replaced."""
    df = _events().with_columns(pl.lit(1.0).alias("w"), *(pl.lit(v).alias(k) for k, v in columns.items()))
    for row, cells in rows.items():
        df = df.with_columns(
            pl.when(pl.int_range(pl.len()) == row).then(pl.lit(v)).otherwise(pl.col(k)).alias(k)
            for k, v in cells.items()
        )
    return df


def test_a_negative_time_a_huge_weight_and_a_float32_overflow_are_refused_by_column(tmp_path, capsys):
    df = _with({3: {"ts": -5}, 4: {"w": 3.0e38}, 5: {"w": 2.0e7}, 6: {"price": 1.0e39}})
    df.write_parquet(tmp_path / "events.parquet")
    mapping = _mapping(tmp_path, str(tmp_path / "events.parquet"), columns={"weight": "w"})
    rc, err = _build(mapping, tmp_path / "out", capsys)
    assert rc == 2 and not (tmp_path / "out").exists()
    assert "column 'ts' (columns.time) has times outside [limits.time_min, limits.time_max)" in err
    assert ": 1 of" in err.split("column 'ts'")[1] and "(e.g. [-5])" in err
    assert "column 'w' (columns.weight) has weights above limits.weight_max=1e+06: 2 of" in err
    assert "[3e+38, 20000000.0]" in err
    assert "column 'price' (features.dense) has values beyond float32" in err and "[1e+39]" in err


def test_limits_in_the_mapping_widen_the_range(tmp_path, capsys):
    _with({3: {"ts": -5}, 4: {"w": 2.0e7}}).write_parquet(tmp_path / "events.parquet")
    limits = {"time_min": -3600, "weight_max": 1.0e8}
    mapping = _mapping(tmp_path, str(tmp_path / "events.parquet"), columns={"weight": "w"}, limits=limits)
    assert _build(mapping, tmp_path / "out", capsys)[0] == 0


@pytest.mark.parametrize(
    ("limits", "said"),
    [
        ("{weight_max: big}", "limits: weight_max='big': expected a number"),
        ("{time_min: 2030-01-01, time_max: 2020-01-01}", "must be before time_max"),
        ("{time_max: soon}", "limits: time_max='soon' is not seconds or an ISO date"),
    ],
)
def test_a_bad_limit_is_one_line_naming_it(tmp_path, capsys, limits, said):
    _events().write_parquet(tmp_path / "events.parquet")
    mapping = _mapping(tmp_path, str(tmp_path / "events.parquet"))
    mapping.write_text(mapping.read_text() + f"limits: {limits}\n")
    rc, err = _build(mapping, tmp_path / "out", capsys)
    assert rc == 2 and said in _one_line(err), err


def test_a_limit_written_as_yaml_reads_it_is_a_number(tmp_path, capsys):
    """``1.0e6`` (no sign in the exponent) is a string to YAML 1.1; it is the number it looks like."""
    _with({4: {"w": 2.0e6}}).write_parquet(tmp_path / "events.parquet")
    mapping = _mapping(tmp_path, str(tmp_path / "events.parquet"), columns={"weight": "w"})
    mapping.write_text(mapping.read_text() + "limits: {weight_max: 1.0e6}\n")
    rc, err = _build(mapping, tmp_path / "out", capsys)
    assert rc == 2 and "has weights above limits.weight_max=1e+06: 1 of" in err, err
