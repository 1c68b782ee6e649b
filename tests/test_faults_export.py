"""``recformer export`` given other data than the checkpoint's (``make faults``): the artifact's
``encodings/`` are the checkpoint's own, and data that encodes otherwise is refused by column."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import yaml

from recformer.__main__ import main as recformer_main
from tests._subprocess import run_recformer
from tests.conftest import write_tiny_data
from tests.test_faults import fit_args, runs

pytestmark = pytest.mark.faults

DEVICES = ["ios", "android", "web"]


def _with_spec(src: Path, dst: Path, change) -> Path:
    """A copy of the data folder ``src`` whose spec.yaml ``change`` (a function of the mapping) edits."""
    shutil.copytree(src, dst)
    spec = yaml.safe_load((dst / "spec.yaml").read_text())
    change(spec)
    (dst / "spec.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return dst


def _dense(spec: dict, name: str) -> dict:
    return next(d for d in spec["dense"] if d["name"] == name)


def _device_from_a_file(spec: dict) -> None:
    device = next(c for c in spec["categorical"] if c["name"] == "device")
    device.pop("vocab")
    device.update(vocab_file="vocab/device.parquet", vocab_size=len(DEVICES))


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, Path]:
    """Tiny data whose ``device`` vocabulary is a file, and a checkpoint of a default fit on it."""
    root = tmp_path_factory.mktemp("export")
    raw = write_tiny_data(root / "raw")
    data = _with_spec(raw, root / "data", _device_from_a_file)
    (data / "vocab").mkdir()
    pq.write_table(pa.table({"value": DEVICES}), data / "vocab" / "device.parquet")
    proc = run_recformer(fit_args(data, "--trainer.max_epochs=1"), cwd=root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return data, runs(root)[0] / "checkpoints" / "last.ckpt"


def _export(ckpt: Path, data: Path, out: Path) -> int:
    return recformer_main(
        ["export", "--ckpt", str(ckpt), "--data", str(data), "--out", str(out), "--format", "torch-export"]
    )


def test_data_with_other_statistics_is_refused_naming_the_column(trained, tmp_path, capsys):
    data, ckpt = trained
    other = _with_spec(data, tmp_path / "other", lambda s: _dense(s, "activity").update(mean=3.0, std=4.0))
    assert _export(ckpt, other, tmp_path / "artifact") == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"recformer export: --data {other} encodes its inputs otherwise than checkpoint")
    assert "activity: data mean=3 std=4 log1p=True vs checkpoint mean=1 std=2 log1p=True" in line, line
    assert not (tmp_path / "artifact" / "manifest.json").exists()


def test_the_artifact_carries_the_checkpoints_own_encodings(trained, tmp_path, capsys):
    """Statistics that agree to the 6 digits the checkpoint compares pass the check; the artifact
    still carries the checkpoint's (the spec it was trained with, byte for byte), not the data's."""
    data, ckpt = trained
    close = _with_spec(data, tmp_path / "close", lambda s: _dense(s, "activity").update(mean=1.0000001))
    out = tmp_path / "artifact"
    assert _export(ckpt, close, out) == 0, capsys.readouterr().err
    assert (out / "encodings" / "spec.yaml").read_text() == (data / "spec.yaml").read_text()
    assert (out / "encodings" / "vocab" / "device.parquet").read_bytes() == (
        data / "vocab" / "device.parquet"
    ).read_bytes()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["encodings_from"] == "checkpoint" and _dense(manifest["spec"], "activity")["mean"] == 1.0

    # A checkpoint from before the spec was kept in it: the data's encodings, after the same check.
    old = torch.load(ckpt, map_location="cpu", weights_only=True)
    del old["RecDataModule"]["spec"]
    torch.save(old, tmp_path / "old.ckpt")
    assert _export(tmp_path / "old.ckpt", data, tmp_path / "old") == 0, capsys.readouterr().err
    manifest = json.loads((tmp_path / "old" / "manifest.json").read_text())
    assert manifest["encodings_from"].startswith(f"data ({data}")


def test_data_with_another_vocabulary_order_is_refused_naming_the_column(trained, tmp_path, capsys):
    data, ckpt = trained
    other = _with_spec(data, tmp_path / "other", lambda s: None)
    pq.write_table(pa.table({"value": DEVICES[::-1]}), other / "vocab" / "device.parquet")
    assert _export(ckpt, other, tmp_path / "artifact") == 2
    line = capsys.readouterr().err.strip()
    assert "other string vocabularies" in line and "device: data vocab " in line, line
