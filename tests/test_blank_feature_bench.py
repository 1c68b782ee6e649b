"""bench/blank_feature.py: one context categorical set to its unknown row, the others untouched."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from recformer.config import FeatureSpec
from tests.conftest import load_bench

ROOT = Path(__file__).resolve().parents[1]


def test_only_the_named_column_is_blanked(tiny_data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(ROOT / "bench"))  # its sibling request_gauc
    bf, rg = load_bench("blank_feature"), load_bench("request_gauc")
    spec = FeatureSpec.load(tiny_data / "spec.yaml")
    batch, _ = rg.load_rows(tiny_data, "val")
    j = [f.name for f in spec.categorical].index("device")
    assert batch.cat[:, j].ne(0).any()  # something to blank
    out = bf.blanked(batch, spec, "device")
    assert out.cat[:, j].eq(0).all()
    keep = [i for i in range(batch.cat.shape[1]) if i != j]
    assert torch.equal(out.cat[:, keep], batch.cat[:, keep])
    assert batch.cat[:, j].ne(0).any()  # the input batch is not changed
    with pytest.raises(SystemExit, match="no context categorical named 'user_id'"):
        bf.blanked(batch, spec, "user_id")
