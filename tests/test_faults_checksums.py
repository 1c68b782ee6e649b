"""Parquet files without page checksums (``make faults``): named once at set-up with the command
that adds them, and after ``recformer data checksum`` the same bit flips that used to train
silently are refused."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from recformer.__main__ import main as recformer_main
from recformer.data.schema import CHECKSUMS
from tests._subprocess import run_recformer
from tests.test_faults import _flip_and_read, fit_args

pytestmark = pytest.mark.faults

NAMED = "Parquet file(s) carry no page checksums"


def _mixed_copy(src: Path, dst: Path) -> tuple[Path, list[Path]]:
    """``src`` data with every file rewritten with page checksums but the first train file and the
    item side table, which stay as a user's own tool wrote them (no checksums)."""
    shutil.copytree(src, dst)
    unchecked = [sorted((dst / "train").glob("*.parquet"))[0], dst / "items.parquet"]
    for p in dst.rglob("*.parquet"):
        if p not in unchecked:
            pq.write_table(pq.read_table(p), p, row_group_size=64, **CHECKSUMS)
    return dst, unchecked


def test_files_without_page_checksums_are_named_once_at_set_up(tiny_data, tmp_path):
    data, unchecked = _mixed_copy(tiny_data, tmp_path / "data")
    proc = run_recformer(fit_args(data, "--trainer.max_epochs=1"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (line,) = [x for x in proc.stderr.splitlines() if NAMED in x]  # once, though set-up runs per split
    assert line.startswith(f"2 {NAMED}") and all(str(p) in line for p in unchecked), line
    assert line.endswith(f"add checksums (the data stays as it is) with: recformer data checksum {data}")


def test_data_checksum_keeps_the_data_and_then_flipped_bits_are_refused(tiny_data, tmp_path, capsys):
    data, unchecked = _mixed_copy(tiny_data, tmp_path / "data")
    part = unchecked[0]
    before = pq.ParquetFile(part)
    table, schema = before.read(), before.schema_arrow
    groups = [before.metadata.row_group(i).num_rows for i in range(before.metadata.num_row_groups)]
    assert recformer_main(["data", "checksum", str(data)]) == 0
    out = capsys.readouterr().out
    assert f"2 of {len(list(data.rglob('*.parquet')))} Parquet file(s) under {data} rewritten" in out
    after = pq.ParquetFile(part, page_checksum_verification=True)
    assert after.read().equals(table) and after.schema_arrow == schema  # the same values and schema
    assert [after.metadata.row_group(i).num_rows for i in range(after.metadata.num_row_groups)] == groups
    assert not list(data.rglob(".*checksum-*"))  # no temporary file left
    # The 40 flips of test_without_checksums_flipped_bits_are_trained_on_silently, now refused.
    footer = after.metadata.serialized_size + 8
    rng = np.random.default_rng(0)
    offsets = rng.integers(4, part.stat().st_size - footer, 40)
    outcomes = [_flip_and_read(part, int(o), int(rng.integers(8))) for o in offsets]
    assert "changed" not in outcomes, outcomes
    assert outcomes.count("refused") >= 36, outcomes
    assert recformer_main(["data", "checksum", str(data)]) == 0  # a second run finds nothing to do
    assert "0 of" in capsys.readouterr().out


@pytest.mark.parametrize("where", ["s3://bucket/data", "missing"])
def test_data_checksum_of_a_uri_or_a_missing_folder_is_one_line(tmp_path, capsys, where):
    target = where if "://" in where else str(tmp_path / where)
    assert recformer_main(["data", "checksum", target]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"recformer data checksum: error: {target} is not a local folder"), line
