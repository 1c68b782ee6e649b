"""bench/data_variant.py: a dataset folder with one input left out loads with one input fewer."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from recformer.config import FeatureSpec
from tests.conftest import load_bench

dv = load_bench("data_variant")


def test_time_gaps_and_user_id_left_out(tiny_data: Path, tmp_path: Path) -> None:
    spec = FeatureSpec.load(tiny_data / "spec.yaml")
    assert spec.sequence.time_gap_column and "device" in [f.name for f in spec.categorical]
    nogap = FeatureSpec.load(dv.make_variant(tiny_data, "time_gaps", tmp_path / "nogap") / "spec.yaml")
    assert nogap.sequence.time_gap_column is None
    assert spec.sequence.time_gap_column in nogap.unused
    assert [f.name for f in nogap.categorical] == [f.name for f in spec.categorical]
    assert (tmp_path / "nogap" / "train").resolve() == (tiny_data / "train").resolve()
    # Any context categorical (the CLI offers user_id; the tiny data has none)
    nodev = FeatureSpec.load(dv.make_variant(tiny_data, "device", tmp_path / "nodev") / "spec.yaml")
    assert [f.name for f in nodev.categorical] == ["hour"] and "device" in nodev.unused
    assert nodev.group == spec.group and nodev.sequence == spec.sequence


def test_nothing_to_drop_is_named(tiny_data: Path, tmp_path: Path) -> None:
    spec = yaml.safe_load((tiny_data / "spec.yaml").read_text())
    with pytest.raises(ValueError, match=r"spec\.yaml: no categorical named 'nobody'"):
        dv.variant_spec(spec, "nobody", tiny_data)
    spec["sequence"]["time_gap_column"] = None
    with pytest.raises(ValueError, match="time_gap_column is not set"):
        dv.variant_spec(spec, "time_gaps", tiny_data)
